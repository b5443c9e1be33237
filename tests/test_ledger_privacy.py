"""Issue 50: the ledger is no membership oracle, and the budget's own messages are private.

* A reader of the ledger file without its key cannot tell an image in a private set from one that is
  not (the review's attack: hash the candidate image every way gsd ever did, and look it up).
* ``gsd budget show --private`` needs the key; the ledger and its key file are 0600.
* A ledger of schema 2 (unkeyed identities) is re-keyed in place, its free pages rewritten.
* Neighbouring private sets D and D + {x}, with and without a budget on {x}: every public line and
  file of ``gsd train`` and ``gsd rank --dp`` agrees (the booking's "left" and a refusal are private).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat

import numpy as np
import pytest

from gsd_cli.cli import common, main
from gsd_cli.data.base import content_key, example_identity
from gsd_cli.privacy import budget as B
from gsd_cli.privacy.budget import schema

CLASSES = np.array([str(i) for i in range(10)])


def _images(n, seed, size=28):
    return np.random.default_rng(seed).integers(0, 256, size=(n, size, size), dtype=np.uint8)


def _npz(path, x):
    np.savez(path, x=x, y=(np.arange(len(x)) % 10).astype(np.int64), classes=CLASSES)
    return f"npz:{path}"


def _book(led, spec, eps=1.0):
    return led.book(B.data_identity(spec), what="DP-GSD ranking", mechanism="m", epsilon=eps, delta=0.0, rdp=B.pure_dp_curve(eps))


def _unkeyed_guesses(img: np.ndarray, tmp_path) -> set[str]:
    """Every digest of one image an attacker can compute without the key: gsd's example identity (and
    its full SHA-256), the overlap check's content key, the digest of the one-image data set, a SHA-256
    of the raw bytes: any of them found in the ledger would tell that the image is there."""
    f = img.astype(np.float32) / 255.0
    full = hashlib.sha256(b"gsd-example-1\n" + repr(tuple(img.shape)).encode() + img.tobytes()).hexdigest()
    one = B.data_identity(_npz(tmp_path / "guess.npz", img[None]))
    return {example_identity(f), full, content_key(f), content_key(f).split(":")[1], one.digest,
            hashlib.sha256(img.tobytes()).hexdigest()}


def _ledger_text(path) -> str:
    """Everything the ledger holds, as a reader without the key sees it: every value of every table and the raw file."""
    con = sqlite3.connect(path)
    try:
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        values = [str(v) for t in tables for row in con.execute(f"SELECT * FROM {t}") for v in row]
    finally:
        con.close()
    return "\n".join(values) + "\n" + open(path, "rb").read().hex() + "\n" + open(path, "rb").read().decode("latin-1")


def _found(text: str, guesses: set[str]) -> bool:
    return any(g[:16] in text or g[:16].encode().hex() in text for g in guesses)


def test_a_reader_of_the_ledger_without_the_key_cannot_tell_members(tmp_path, capsys):
    """The review's test, kept: members and non-members of a booked private set look alike to a script
    that holds the ledger file (before: every member's SHA-256 was a row of gsd_examples)."""
    x = _images(30, 0)
    private = _npz(tmp_path / "private.npz", x[:20])
    one = _npz(tmp_path / "one.npz", x[:1])  # a one-image set, booked too
    ledger = tmp_path / "ledger.sqlite"
    pub = _npz(tmp_path / "pub.npz", _images(30, 9))
    assert main(["--ledger", str(ledger), "rank", "--dp", "--epsilon", "1", "--private", private, "--public", pub, "-q",
                 "--model", "fmnist-cnn", "--params", "fc*", "--no-cache", "-k", "2", "-m", "16"]) == 0
    led = B.BudgetLedger(ledger)
    _book(led, one)
    assert len(led.status()) == 2
    text = _ledger_text(ledger)
    members = [_unkeyed_guesses(img, tmp_path) for img in x[:20]]
    others = [_unkeyed_guesses(img, tmp_path) for img in x[20:]]
    assert [_found(text, g) for g in members] == [False] * 20  # the attacker's answer for a member ...
    assert [_found(text, g) for g in others] == [False] * 10  # ... is the same as for a non-member
    # the ledger does hold one identity per example, keyed: with the key (and only with it) a member is found
    con = sqlite3.connect(ledger)
    stored = {r[0] for r in con.execute("SELECT example FROM gsd_examples")}
    con.close()
    key = led.key
    assert key.keyed(example_identity(x[0] / 255.0)) in stored and key.keyed(example_identity(x[25] / 255.0)) not in stored
    assert stat.S_IMODE(os.stat(ledger).st_mode) == 0o600 and stat.S_IMODE(os.stat(key.path).st_mode) == 0o600
    assert not str(key.path).startswith(str(tmp_path)), "the key is kept apart from the ledger's folder"
    assert key.path.read_text().strip() not in text, "the key is not in the ledger"


def test_budget_show_private_needs_the_key(tmp_path, capsys):
    x = _images(10, 1)
    one = _npz(tmp_path / "one.npz", x[:1])
    ledger = str(tmp_path / "ledger.sqlite")
    led = B.BudgetLedger(ledger)
    _book(led, _npz(tmp_path / "private.npz", x))
    key = led.key.path
    moved = tmp_path / "elsewhere" / "k.key"
    moved.parent.mkdir()
    key.rename(moved)
    capsys.readouterr()
    assert main(["budget", "show", "--ledger", ledger, "--private", one]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "key" in err[0] and "--ledger-key" in err[0], err
    # a DP run cannot book without it either: stopped before any work
    assert main(["--ledger", ledger, "rank", "--dp", "--epsilon", "1", "--private", one, "-q"]) == 2
    assert "--ledger-key" in capsys.readouterr().err
    # with the key: the set that holds the image answers, its count only on a private: line
    assert main(["budget", "show", "--ledger", ledger, "--ledger-key", str(moved), "--private", one]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any("10 distinct examples" in line for line in out)
    assert all(line.startswith(common.PRIVATE_LABEL) for line in out if "distinct examples" in line or "10" in line.split()), out
    # another ledger's key is refused by name
    other = B.BudgetLedger(tmp_path / "other.sqlite")
    _book(other, one)
    assert main(["budget", "show", "--ledger", ledger, "--ledger-key", str(other.key.path), "--private", one]) == 2
    assert "not the key of the ledger" in capsys.readouterr().err


def _schema2_ledger(path, data: B.DataIdentity, budget: float) -> None:
    """A ledger as gsd 0.4 wrote it (schema 2): unkeyed example identities and set digest, one booking."""
    con = sqlite3.connect(path, isolation_level=None)
    for sql in schema.tables(True):
        con.execute(sql)
    for k, v in (("schema", "2"), ("orders", json.dumps(B.ORDERS)), ("note", B.PRIVATE_NOTE)):
        con.execute("INSERT INTO gsd_meta (key, value) VALUES (?, ?)", (k, v))
    t = "2026-01-01T00:00:00+00:00"
    con.execute("INSERT INTO gsd_datasets (digest, name, how, epsilon, delta, created, updated, raised, sid, examples) "
                "VALUES (?, ?, 'examples', ?, 1e-5, ?, ?, 0, 1, ?)", (data.digest, data.name, budget, t, t, len(data.examples)))
    con.executemany("INSERT INTO gsd_examples (sid, example) VALUES (1, ?)", [(e,) for e in data.examples])
    con.execute("INSERT INTO gsd_bookings VALUES ('old-1', ?, ?, ?, 'DP-GSD ranking', 'gsd rank --dp', 'm', 1.0, 0.0, ?, 1, 1)",
                (data.digest, data.name, t, json.dumps(B.pure_dp_curve(1.0))))
    con.close()
    os.chmod(path, 0o644)


def test_a_schema_2_ledger_is_rekeyed_in_place(tmp_path, capsys):
    x = _images(12, 2)
    spec = _npz(tmp_path / "private.npz", x)
    data = B.data_identity(spec)
    path = tmp_path / "old.sqlite"
    _schema2_ledger(path, data, budget=1.5)
    assert data.examples[0] in _ledger_text(path)
    led = B.BudgetLedger(path)
    assert "upgraded the privacy ledger" in capsys.readouterr().err
    text = _ledger_text(path)
    assert not _found(text, {*data.examples, data.digest}), "no unkeyed identity is left, not even in free pages"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    s = led.status_of(data)
    assert len(s) == 1 and s[0]["budget"]["epsilon"] == 1.5 and len(s[0]["runs"]) == 1 and s[0]["examples"] == 12
    # the same people, as before: a copy with one pixel changed is charged to the old budget and refused past it
    x2 = x.copy()
    x2[0, 0, 0] ^= 1
    with pytest.raises(B.BudgetExceeded, match="shares examples"):
        _book(B.BudgetLedger(path), _npz(tmp_path / "pixel.npz", x2), eps=1.0)
    assert _book(B.BudgetLedger(path), spec, eps=0.5)["charged"][0]["remaining"]["epsilon"] == pytest.approx(0.0)
    # opened again: nothing to upgrade, the same key
    capsys.readouterr()
    assert B.BudgetLedger(path).key.path == led.key.path and "upgraded" not in capsys.readouterr().err


# --- neighbouring private sets, with and without a budget on {x} -----------------------------------------

TRAIN = ["--model", "fmnist-cnn", "--params", "fc*", "--epochs", "1", "--batch-size", "10", "--expected-size", "40",
         "--clip-engine", "materialise", "--physical-batch", "64", "--method", "dpsgd", "--epsilon", "2", "-q"]


def _public_lines(lines):
    from test_console_privacy import _public

    return _public(lines)


@pytest.mark.parametrize("budget_on_x", [False, True])
def test_neighbours_print_the_same_public_lines_with_a_budget_on_the_target(tmp_path, capsys, monkeypatch, budget_on_x):
    """D and D + {x} trained and ranked under DP, in a ledger where {x} alone has a budget (or none
    has): before, one said "no budget set" and the other "8.077 left (of the budget of X, which shares
    examples with it)". Every line that is not private: and summary.json agree but for the mechanisms'
    random values."""
    from test_console_privacy import _released, _wide

    _wide(monkeypatch)
    base = _images(40, 4)
    x = base[:1]
    test = _npz(tmp_path / "test.npz", _images(20, 5))
    pub = _npz(tmp_path / "pub.npz", _images(30, 6))
    private = tmp_path / "private.npz"
    got = []
    for d in (base[1:], base):  # D, then D + {x}
        ledger = tmp_path / "ledger.sqlite"
        ledger.unlink(missing_ok=True)
        monkeypatch.setenv("GSD_LEDGER", str(ledger))
        if budget_on_x:
            assert main(["budget", "set", "--private", _npz(tmp_path / "x.npz", x), "--epsilon", "50", "--delta", "1e-4"]) == 0
        capsys.readouterr()
        _npz(private, d)
        run = tmp_path / "run"
        if run.exists():
            import shutil

            shutil.rmtree(run)
        code = main(["train", "--private", f"npz:{private}", "--private-test", test, *TRAIN, "--out", str(run)])
        cap = capsys.readouterr()
        summary = json.loads((run / "summary.json").read_text())
        for k in ("created", "seconds"):
            summary.pop(k, None)
        rcode = main(["rank", "--dp", "--epsilon", "1", "--private", f"npz:{private}", "--public", pub, "-q",
                      "--model", "fmnist-cnn", "--params", "fc*", "--no-cache", "-k", "2", "-m", "16"])
        rcap = capsys.readouterr()
        got.append((code, rcode, cap, rcap, summary))
    (c1, r1, t1, k1, s1), (c2, r2, t2, k2, s2) = got
    assert (c1, r1) == (c2, r2) == (0, 0)
    assert _public_lines(t1.err.splitlines()) == _public_lines(t2.err.splitlines())
    assert _public_lines(t1.out.splitlines()) == _public_lines(t2.out.splitlines())
    assert _released(k1.out.splitlines()) == _released(k2.out.splitlines())
    assert _public_lines(k1.err.splitlines()) == _public_lines(k2.err.splitlines())
    assert s1.keys() == s2.keys()
    for line in (t1.err + t2.err + k1.err + k2.err).splitlines():
        if "left" in line or "budget" in line and "x.npz" in line:
            assert line.startswith(common.PRIVATE_LABEL), line
    if budget_on_x:  # the difference is there, on the private lines: D + {x} is charged to the budget of {x}
        assert "of the budget of npz:" in t2.err and "of the budget of npz:" not in t1.err


def test_a_refusal_by_the_budget_of_x_is_a_private_line(tmp_path, capsys, monkeypatch):
    """At a budget on {x} smaller than the run, D trains and D + {x} is refused: the refusal, which names
    the set {x}, is a private: line, and the exit status is a private output (docs/budget.md)."""
    base = _images(40, 7)
    test = _npz(tmp_path / "test.npz", _images(20, 8))
    assert main(["budget", "set", "--private", _npz(tmp_path / "x.npz", base[:1]), "--epsilon", "1", "--delta", "1e-4"]) == 0
    codes = []
    for d in (base[1:], base):
        _npz(tmp_path / "private.npz", d)
        capsys.readouterr()
        codes.append(main(["train", "--private", f"npz:{tmp_path / 'private.npz'}", "--private-test", test, *TRAIN,
                           "--out", str(tmp_path / f"run{len(codes)}")]))
        err = capsys.readouterr().err.splitlines()
        assert not [line for line in err if "x.npz" in line and not line.startswith(common.PRIVATE_LABEL)], err
    assert codes == [0, 2]
