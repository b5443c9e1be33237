"""The ledger as a first-class part (issue 44, "The ledger"): every unusable ledger is one line
"ledger PATH is unusable: why; what to do", exit 2, before any work, and a file that is not a ledger
is never changed; a locked ledger is waited for (--ledger-timeout) with a message, then one line;
`budget show` never creates; a DP run says that it created a new ledger and what it booked; budget
bounds (at most 100, below what is spent only with --force)."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from gsd_cli.cli import main
from gsd_cli.privacy import budget as B


@pytest.fixture
def private(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.uniform(size=(40, 12, 12)) * 255).astype(np.uint8)
    path = tmp_path / "private.npz"
    np.savez(path, x=x, y=rng.integers(0, 2, 40), classes=np.array(["a", "b"]))
    return path


def _fingerprint(path):
    st = os.stat(path)
    if not os.path.isfile(path):
        return (st.st_mode, st.st_mtime_ns)
    return (st.st_mode, st.st_mtime_ns, st.st_size, hashlib.sha256(open(path, "rb").read()).hexdigest())


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    text = " ".join(err.split())
    assert "Traceback" not in err and "internal error" not in text, err
    return text if len(lines) <= 2 else pytest.fail(f"more than one message: {err}")  # rich may wrap one message


def _unusable_cases(tmp_path, private, monkeypatch):
    rng = np.random.default_rng(1)
    random = tmp_path / "random.bin"
    random.write_bytes(rng.bytes(4096))
    good = tmp_path / "good.sqlite"
    B.BudgetLedger(good)
    truncated = tmp_path / "truncated.sqlite"
    B.BudgetLedger(truncated).set_budget(B.DataIdentity("a" * 64, "s", "arrays", examples=tuple(f"{i:032x}" for i in range(3000))), 1, 1e-5)
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    other_db = tmp_path / "other-app.sqlite"
    con = sqlite3.connect(other_db)
    con.execute("CREATE TABLE patients (name TEXT)")
    con.commit()
    con.close()
    empty = tmp_path / "empty.sqlite"
    empty.touch()
    readonly = tmp_path / "readonly.sqlite"
    B.BudgetLedger(readonly)
    readonly.chmod(0o444)
    ro_folder = tmp_path / "ro"
    ro_folder.mkdir()
    B.BudgetLedger(ro_folder / "l.sqlite")
    ro_folder.chmod(0o555)
    return {
        "random bytes": (str(random), "not a SQLite database"),
        "truncated": (str(truncated), "truncated"),
        "the private npz": (str(private), "not a SQLite database"),
        "another program's database": (str(other_db), "not a gsd ledger (no gsd_meta table)"),
        "an empty file": (str(empty), "an empty file"),
        "read-only ledger": (str(readonly), "read-only"),
        "ledger in a read-only folder": (str(ro_folder / "l.sqlite"), "read-only"),
        "new ledger in a read-only folder": (str(ro_folder / "new.sqlite"), "read-only"),
        "a folder": (str(tmp_path), "it is a folder"),
        "/dev/null": ("/dev/null", "not a regular file"),
        "refused": ("postgresql://gsd:secret@127.0.0.1:1/ledger", "cannot be reached"),
        "unknown database": ("nosuchdb://x", "knows no database 'nosuchdb'"),
        "bad URL": ("postgresql://[bad", "not a valid URL"),
    }


def test_every_unusable_ledger_is_one_line_exit_2_before_any_work(tmp_path, private, monkeypatch, capsys):
    cases = _unusable_cases(tmp_path, private, monkeypatch)
    outs = tmp_path / "outs"  # the run folder's parent (the run lock may create and remove the run folder in it): not a case
    outs.mkdir()
    try:
        before = {what: _fingerprint(loc) for what, (loc, _) in cases.items() if "://" not in loc and os.path.exists(loc)}
        for what, (loc, why) in cases.items():
            capsys.readouterr()
            t0 = time.perf_counter()
            # a private set that does not exist: the ledger is checked first, so its error is the one shown
            code = main(["--ledger", loc, "budget", "set", "--private", "npz:/no/such/private.npz", "--epsilon", "1", "--delta", "1e-5"])
            seconds = time.perf_counter() - t0
            text = _one_line(capsys.readouterr().err)
            shown = loc.replace("secret", "***")
            assert code == 2 and f"ledger {shown} is unusable: " in text and why in text and "; " in text.split("unusable: ", 1)[1], (what, text)
            assert "secret" not in text and seconds < 15, (what, seconds)
        # a DP run stops on it before any work (no data read, no run folder), and so does gsd rank --dp
        for loc, _ in (cases["the private npz"], cases["/dev/null"], cases["refused"]):
            assert main(["--ledger", loc, "train", "--private", "npz:/no/such/private.npz", "--method", "dpsgd", "--out", str(outs / "run"),
                         "-q"]) == 2
            text = _one_line(capsys.readouterr().err)
            assert "is unusable" in text and "no/such" not in text.split("is unusable")[0] and not (outs / "run").exists()
            assert main(["--ledger", loc, "rank", "--private", "npz:/no/such/private.npz", "--public", "npz:/no/such/public.npz",
                         "--dp", "--epsilon", "1"]) == 2
            text = _one_line(capsys.readouterr().err)
            assert "is unusable" in text and "no/such" not in text.split("is unusable")[0] and not (outs / "run").exists()
        # show reads only, and says the same of a file that is not a ledger
        assert main(["budget", "show", "--ledger", str(private)]) == 2 and "is unusable" in capsys.readouterr().err
        after = {what: _fingerprint(loc) for what, (loc, _) in cases.items() if "://" not in loc and os.path.exists(loc)}
        assert after == before, "no file was changed"
        assert not (tmp_path / "ro" / "new.sqlite").exists()
    finally:
        (tmp_path / "ro").chmod(0o755)
        (tmp_path / "readonly.sqlite").chmod(0o644)


def test_a_newer_ledger_and_a_bad_timeout_are_refused(tmp_path, capsys):
    path = tmp_path / "l.sqlite"
    B.BudgetLedger(path)
    con = sqlite3.connect(path)
    con.execute("UPDATE gsd_meta SET value = '99' WHERE key = 'schema'")
    con.commit()
    con.close()
    assert main(["budget", "show", "--ledger", str(path)]) == 2
    assert "written by a newer gsd" in " ".join(capsys.readouterr().err.split())
    for bad in ("-1", "nan", "inf"):
        assert main(["--ledger-timeout", bad, "budget", "show", "--ledger", str(tmp_path / "x.sqlite")]) == 2
        assert "--ledger-timeout must be" in " ".join(capsys.readouterr().err.split())
    os.environ.pop(B.TIMEOUT_ENV, None)


_HOLDER = textwrap.dedent("""
    import sqlite3, sys, time
    con = sqlite3.connect(sys.argv[1], isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    open(sys.argv[2], "w").close()
    time.sleep(float(sys.argv[3]))
    con.execute("ROLLBACK")
""")


def _hold(path, flag, seconds):
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path), str(flag), str(seconds)])
    deadline = time.time() + 60
    while not flag.exists() and time.time() < deadline:
        time.sleep(0.02)
    return proc


def test_a_locked_ledger_is_waited_for_then_one_line(tmp_path, private, monkeypatch, capsys):
    monkeypatch.delenv(B.TIMEOUT_ENV, raising=False)
    path = tmp_path / "l.sqlite"
    B.BudgetLedger(path)
    args = ["budget", "set", "--private", f"npz:{private}", "--epsilon", "1", "--delta", "1e-5", "--ledger", str(path)]
    proc = _hold(path, tmp_path / "held", 30)
    try:
        t0 = time.perf_counter()
        assert main([*args, "--ledger-timeout", "1"]) == 2
        seconds = time.perf_counter() - t0
        err = " ".join(capsys.readouterr().err.split())
        assert "is locked by another process; waiting up to 1 s (--ledger-timeout)" in err
        assert f"error: ledger {path} is locked by another process (waited 1 s)" in err and "--ledger-timeout" in err
        assert 1 <= seconds < 15
    finally:
        proc.kill()
        proc.wait()
    # released while it waits: the command goes on
    proc = _hold(path, tmp_path / "held2", 1.0)
    try:
        assert main([*args, "--ledger-timeout", "30"]) == 0
        assert "waiting up to 30 s" in " ".join(capsys.readouterr().err.split())
    finally:
        proc.wait()
    assert B.BudgetLedger(path).status()[0]["budget"]["epsilon"] == 1.0
    # the global option reaches a library booking through $GSD_LEDGER_TIMEOUT
    monkeypatch.setenv(B.TIMEOUT_ENV, "0.5")
    assert B.BudgetLedger(path).timeout == 0.5


def test_show_never_creates_and_a_dp_run_says_what_it_created_and_booked(tmp_path, private, capsys, monkeypatch):
    missing = tmp_path / "missing" / "dir" / "l.sqlite"
    assert main(["budget", "show", "--ledger", str(missing)]) == 0
    assert "no ledger at" in " ".join(capsys.readouterr().out.split())
    assert main(["budget", "show", "--ledger", str(missing), "--json", "--private", f"npz:{private}"]) == 0
    assert '"exists": false' in capsys.readouterr().out
    assert not (tmp_path / "missing").exists(), "show created nothing"
    # a DP ranking on a new ledger: it says it created it, and books in one line
    new = tmp_path / "new" / "ledger.sqlite"
    pub = tmp_path / "pub.npz"
    rng = np.random.default_rng(3)
    np.savez(pub, x=(rng.uniform(size=(30, 12, 12)) * 255).astype(np.uint8), y=rng.integers(0, 2, 30))
    rank = ["--ledger", str(new), "rank", "--private", f"npz:{private}", "--public", f"npz:{pub}", "--dp", "--epsilon", "0.5",
            "--metric", "dp-energy", "--model", "fmnist-cnn", "-k", "2", "-m", "16"]
    assert main(rank) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert f"created the privacy ledger {new}" in err
    assert err.count("booked epsilon") == 1 and f"booked epsilon 0.5 on npz:{private} in {new} private: no privacy budget applies" in err
    # with a budget: what is left, and no private figure (no example count, no size)
    assert main(["--ledger", str(new), "budget", "set", "--private", f"npz:{private}", "--epsilon", "2", "--delta", "1e-5"]) == 0
    capsys.readouterr()
    assert main(rank) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "created the privacy ledger" not in err and f"booked epsilon 0.5 on npz:{private} in {new} private: 1 epsilon left" in err
    booking = err.split("booked epsilon", 1)[1].split("private:")[0]
    booking = booking.replace(f"npz:{private}", "DATASET").replace(str(new), "LEDGER")  # the paths may hold any digits
    assert booking.strip() == "0.5 on DATASET in LEDGER", booking  # no example count (40), no size


def test_budget_set_bounds_and_lowering_below_what_is_spent(tmp_path, private, capsys):
    led = str(tmp_path / "l.sqlite")
    spec = f"npz:{private}"
    for bad in ("1e308", "100.5", "inf", "nan", "0", "-1"):
        assert main(["budget", "set", "--private", spec, "--epsilon", bad, "--delta", "1e-5", "--ledger", led]) == 2, bad
        assert "Traceback" not in capsys.readouterr().err and not os.path.exists(led)  # refused before a ledger is made
    assert main(["budget", "set", "--private", spec, "--epsilon", "100", "--delta", "1e-5", "--ledger", led]) == 0
    B.book_dpgsd(spec, 1.0, ledger_location=led)
    B.book_dpgsd(spec, 1.0, ledger_location=led)
    capsys.readouterr()
    assert main(["budget", "set", "--private", spec, "--epsilon", "1.5", "--delta", "1e-5", "--ledger", led]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "already spent epsilon 2 (basic)" in err and "--force" in err
    assert main(["budget", "set", "--private", spec, "--epsilon", "1.5", "--delta", "1e-5", "--ledger", led, "--force"]) == 0
    out, err = capsys.readouterr()
    assert "every DP run on this data is refused" in " ".join(err.split())
    with pytest.raises(B.BudgetExceeded):
        B.book_dpgsd(spec, 0.01, ledger_location=led)
    assert main(["budget", "show", "--ledger", led]) == 0
    assert "spent more than this budget" in " ".join(capsys.readouterr().out.split())
    # raising it back needs --raise (the budget was fixed before the runs)
    assert main(["budget", "set", "--private", spec, "--epsilon", "3", "--delta", "1e-5", "--ledger", led]) == 2
    assert "--raise" in capsys.readouterr().err


def test_a_locked_postgresql_ledger_is_waited_for_then_one_line(pg_server, tmp_path, capsys):
    import sqlalchemy as sa

    url = pg_server.get_uri()
    data = B.DataIdentity("b" * 64, "s", "arrays", examples=("1" * 32, "2" * 32))
    B.BudgetLedger(url).set_budget(data, 1.0, 1e-5)
    assert "created the privacy ledger" in capsys.readouterr().err
    engine = sa.create_engine("postgresql+psycopg://" + url.split("://", 1)[1])
    with engine.begin() as con:  # another session holds the table
        con.execute(sa.text("LOCK TABLE gsd_bookings IN EXCLUSIVE MODE"))
        t0 = time.perf_counter()
        with pytest.raises(B.LedgerError, match=r"is locked by another process \(waited 1 s\)"):
            B.BudgetLedger(url, timeout=1).book(data, what="t", mechanism="m", epsilon=0.1, delta=0.0, rdp=B.pure_dp_curve(0.1))
        assert time.perf_counter() - t0 < 15
        assert "waiting up to 1 s" in capsys.readouterr().err
    engine.dispose()
    led = B.BudgetLedger(url, timeout=1)
    led.book(data, what="t", mechanism="m", epsilon=0.1, delta=0.0, rdp=B.pure_dp_curve(0.1))
    assert led.status()[0]["spent"]["runs"] == 1
    led.close()
