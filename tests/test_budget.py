"""The privacy budget per private data set (`gsd budget`, gsd_cli.privacy.budget): one ledger entry
per data set whatever its path, refusal past the budget before anything is trained, concurrent
bookings from real processes, and the Rényi filter against dp-accounting's RDP accountant."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.privacy import budget as B


@pytest.fixture
def two_paths(tmp_path):
    """One small private set (4 classes, 120 examples of 16x16) at two paths under two names."""
    rng = np.random.default_rng(0)
    base = rng.uniform(size=(4, 16, 16))
    y = rng.integers(0, 4, 120)
    x = np.clip(base[y] + 0.1 * rng.normal(size=(120, 16, 16)), 0, 1)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = tmp_path / "a" / "xrays.npz"
    np.savez(first, x=(x * 255).astype(np.uint8), y=y, classes=np.array(["a", "b", "c", "d"]))
    second = tmp_path / "b" / "copy-of-xrays.npz"
    shutil.copy(first, second)
    return f"npz:{first}", f"npz:{second}"


def _train(private, out, *extra):
    return main(["train", "--private", private, "--method", "dpsgd", "--epsilon", "2", "--epochs", "1", "--batch-size", "30",
                 "--physical-batch", "64", "--out", str(out), "-q", *extra])


def test_two_paths_book_one_entry_and_a_run_past_the_budget_is_refused(two_paths, tmp_path, capsys):
    first, second = two_paths
    assert _train(first, tmp_path / "r1") == 0
    assert _train(second, tmp_path / "r2") == 0  # the same data under another path and name
    capsys.readouterr()
    status = B.BudgetLedger().status()
    assert len(status) == 1, "the same content under two paths is one data set"
    runs = status[0]["runs"]
    assert len(runs) == 2 and all(r["what"] == "training (dpsgd)" and r["dp"] for r in runs)
    assert status[0]["budget"] is None and status[0]["spent"]["basic_epsilon"] == pytest.approx(sum(r["epsilon"] for r in runs))
    assert all(0 < r["epsilon"] <= 2.0 for r in runs)
    # a budget that the two runs fit, with too little left for a third
    spent = status[0]["spent"]
    assert spent["renyi_epsilon_fixed"] < spent["renyi_epsilon"] < spent["basic_epsilon"]
    assert main(["budget", "set", "--private", second, "--epsilon", f"{spent['renyi_epsilon'] + 0.3:.6f}", "--delta", "1e-5"]) == 0
    capsys.readouterr()
    code = _train(first, tmp_path / "r3")
    err = capsys.readouterr().err
    errors = [line for line in err.strip().splitlines() if line.startswith("private: error")]  # a refusal by a budget is private
    assert code == 2 and len(errors) == 1 and "budget" in errors[0] and "left" in errors[0] and "Traceback" not in err
    assert "size" in errors[0] and "stays booked" in errors[0]  # the size estimate was booked before it was drawn
    assert not (tmp_path / "r3").exists(), "nothing trained, no run folder"
    runs = B.BudgetLedger().status()[0]["runs"]  # the two runs, and the refused run's size estimate (spent, so booked)
    assert [r["what"] for r in runs] == ["training (dpsgd)"] * 2 + ["training (dpsgd): size estimate"]
    assert runs[2]["epsilon"] == pytest.approx(0.04)  # 2% of --epsilon 2
    # shown as a table, as JSON and as publishable totals
    assert main(["budget", "show", "--private", first, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["datasets"]) == 1 and len(doc["datasets"][0]["runs"]) == 3 and "PRIVATE" in doc["note"]
    assert doc["datasets"][0]["runs"][0]["command"].startswith(f"gsd train --private {first}")
    assert main(["budget", "show", "--publishable", "--json"]) == 0
    pub = capsys.readouterr().out
    assert "command" not in pub and "time" not in pub and "xrays" in pub and json.loads(pub)["publishable"] is True
    assert main(["budget", "show"]) == 0
    out, err = capsys.readouterr()
    assert "Rényi filter" in out and "basic" in out and "private" in err


def test_renyi_filter_of_k_identical_dpsgd_runs_is_dp_accountings_composition(tmp_path):
    import dp_accounting as dpa

    from gsd_cli.privacy import calibrate_noise, dpsgd_step_event, epsilon_of, training_event

    q, steps, delta = 0.02, 300, 1e-5
    z = calibrate_noise(dpsgd_step_event, 1.0, delta, q, steps, cache=False)
    event = training_event(dpsgd_step_event(z), q, steps)
    eps = epsilon_of(event, delta)
    data = B.DataIdentity("d" * 64, "test-set", "arrays")
    led = B.BudgetLedger(tmp_path / "l.sqlite")
    k = 4
    for _ in range(k):
        B.book_training(data, event, epsilon=eps, delta=delta, method="dpsgd", mechanism="DP-SGD", ledger_location=led.location)
    led.set_budget(data, 100.0, delta)
    spent = led.status()[0]["spent"]
    acc = dpa.rdp.RdpAccountant(orders=list(B.ORDERS))  # independent: dp-accounting composes the k runs itself
    acc.compose(event, k)
    assert spent["renyi_epsilon_fixed"] == pytest.approx(acc.get_epsilon(delta), rel=1e-9)
    assert spent["renyi_epsilon"] == pytest.approx(acc.get_epsilon(delta / (2 * len(B.ORDERS))), rel=1e-9)
    assert spent["basic_epsilon"] == pytest.approx(k * eps) and spent["basic_delta"] == pytest.approx(k * delta)
    assert spent["renyi_epsilon_fixed"] < spent["renyi_epsilon"] < k * eps  # RDP beats basic composition here
    # pure DP enters as min(eps, alpha eps^2 / 2) per release
    curve = B.pure_dp_curve(0.5, releases=3)
    assert curve == pytest.approx([3 * min(0.5, a * 0.125) for a in B.ORDERS])


def test_filter_admits_by_either_composition_and_refuses_past_both(tmp_path):
    data = B.DataIdentity("e" * 64, "pure", "arrays")
    led = B.BudgetLedger(tmp_path / "l.sqlite")
    led.set_budget(data, 1.0, 1e-6)
    for _ in range(4):  # basic: 4 x 0.25 = 1.0 exactly, pure DP (delta 0)
        led.book(data, what="DP-GSD", mechanism="m", epsilon=0.25, delta=0.0, rdp=B.pure_dp_curve(0.25))
    with pytest.raises(B.BudgetExceeded, match="budget exceeded"):
        led.book(data, what="DP-GSD", mechanism="m", epsilon=0.01, delta=0.0, rdp=B.pure_dp_curve(0.01))
    # raising a budget that runs were booked under is refused unless asked for, and then recorded
    with pytest.raises(GSDError, match="--raise"):
        led.set_budget(data, 2.0, 1e-6)
    with pytest.raises(GSDError, match="--force"):  # below what is spent: refused unless forced
        led.set_budget(data, 0.5, 1e-6)
    low = led.set_budget(data, 0.5, 1e-6, force=True)
    assert low["budget"]["raised"] == 0 and low["overspent"] and low["remaining"]["epsilon"] == 0
    assert led.set_budget(data, 2.0, 1e-6, allow_raise=True)["budget"]["raised"] == 1
    # a release without a proven guarantee never fits a budget
    other = B.DataIdentity("f" * 64, "other", "arrays")
    led.set_budget(other, 10.0, 1e-5)
    with pytest.raises(B.BudgetExceeded, match="no proven"):
        led.book(other, what="DP-GSD", mechanism="matrix", epsilon=0.1, delta=0.0, rdp=None, guarantee=False)
    # the same booking id is booked once (a resumed run)
    a = led.book(other, what="t", mechanism="m", epsilon=1.0, delta=0.0, rdp=B.pure_dp_curve(1.0), booking_id="run-1")
    b = led.book(other, what="t", mechanism="m", epsilon=1.0, delta=0.0, rdp=B.pure_dp_curve(1.0), booking_id="run-1")
    assert a["id"] == b["id"] and len(led.status_of(other)[0]["runs"]) == 1
    # an id is one run's: the same id on another data set is a clean refusal, never another set's booking
    with pytest.raises(GSDError, match="another data set"):
        led.book(data, what="t", mechanism="m", epsilon=1.0, delta=0.0, rdp=B.pure_dp_curve(1.0), booking_id="run-1")


_BOOKER = textwrap.dedent("""
    import os, sys, time
    from gsd_cli.privacy import budget as B
    from gsd_cli.privacy.budget import store
    led = B.BudgetLedger(sys.argv[1])
    data = B.DataIdentity("c" * 64, "shared-set", "arrays")
    check = store.admits
    def slow(*a, **k):  # a wide window between reading the spent total and booking: the lock must cover it
        time.sleep(0.02)
        return check(*a, **k)
    store.admits = slow
    open(sys.argv[2] + "." + sys.argv[3], "w").close()  # this interpreter is up (dp-accounting imported)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.002)
    ok = 0
    for _ in range(10):
        try:
            led.book(data, what="DP-GSD", mechanism="m", epsilon=0.1, delta=0.0, rdp=B.pure_dp_curve(0.1))
            ok += 1
        except B.BudgetExceeded:
            pass
    print(ok)
""")


def _race(location, folder):
    """Two processes book 10 x epsilon 0.1 each at once on a data set with room for 15: all land that fit."""
    led = B.BudgetLedger(location)
    led.set_budget(B.DataIdentity("c" * 64, "shared-set", "arrays"), 1.5, 1e-5)  # room for 15 bookings of 0.1 (basic)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    go = folder / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _BOOKER, str(location), str(go), str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for i in range(2)]
    deadline = time.time() + 120
    while not all((folder / f"go.{i}").exists() for i in range(2)) and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.01)
    go.touch()  # both start booking at once
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    landed = [int(o[0].strip()) for o in outs]
    runs = led.status_of(B.DataIdentity("c" * 64, "x", "arrays"))[0]["runs"]
    led.close()
    assert sum(landed) == len(runs) == 15, (landed, len(runs))  # none lost, none past the budget
    assert min(landed) > 0, "both processes booked"


def test_concurrent_bookings_from_two_processes_all_land_within_the_budget(tmp_path):
    _race(tmp_path / "ledger.sqlite", tmp_path)


def test_dp_rank_books_one_release_shared_and_r_fresh(tiny):
    from gsd_cli.ranking import rank

    opts = dict(dp=True, epsilon=0.5, k=2, examples=24, model="fmnist-cnn", insecure_seed=1, distance="dp-energy")
    rank(tiny["private"], [tiny["public"]], **opts)
    rank(tiny["private"], [tiny["public"]], repeats=2, dp_repeats="shared", **opts)
    rank(tiny["private"], [tiny["public"]], repeats=2, dp_repeats="fresh", **opts)
    runs = B.BudgetLedger().status()[0]["runs"]
    assert [r["epsilon"] for r in runs] == [0.5, 0.5, 0.5, 0.5]  # 1 + 1 (shared) + 2 (fresh) draws
    assert all(r["what"] == "DP energy ranking" and r["delta"] == 0 and not r["dp"] for r in runs)  # seeded: booked, marked
    assert all(r["mechanism"].startswith("DP energy distance (Laplace)") and r["guarantee"] for r in runs)
    rank(tiny["private"], [tiny["public"]], k=2, examples=24, model="fmnist-cnn")  # not DP: nothing to book
    assert len(B.BudgetLedger().status()[0]["runs"]) == 4


def test_ledger_location_and_its_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GSD_LEDGER", str(tmp_path / "x" / "l.sqlite"))
    assert B.default_location() == str(tmp_path / "x" / "l.sqlite")
    monkeypatch.delenv("GSD_LEDGER")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert B.default_location() == str(tmp_path / "xdg" / "gsd" / B.FILE_NAME)
    other = tmp_path / "given.sqlite"
    assert main(["--ledger", str(other), "budget", "show"]) == 0 and not other.exists()  # show never creates a ledger
    assert "no ledger at" in " ".join(capsys.readouterr().out.split())
    assert main(["budget", "set", "--private", "npz:/nonexistent-gsd.npz", "--epsilon", "1", "--delta", "1e-5", "--ledger", str(other)]) == 2
    assert main(["budget", "set", "--private", "digits", "--epsilon", "-1", "--delta", "1e-5", "--ledger", str(other)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "epsilon must be a positive number" in err


def test_a_shared_postgresql_ledger(pg_server, tmp_path):
    url = pg_server.get_uri()
    led, other = B.BudgetLedger(url), B.BudgetLedger(url)  # two users of the server
    data = B.DataIdentity("9" * 64, "hospital", "files")
    led.set_budget(data, 1.0, 1e-6)
    led.book(data, what="DP-GSD", mechanism="m", epsilon=0.6, delta=0.0, rdp=B.pure_dp_curve(0.6))
    with pytest.raises(B.BudgetExceeded):
        other.book(data, what="DP-GSD", mechanism="m", epsilon=0.6, delta=0.0, rdp=B.pure_dp_curve(0.6))
    s = other.status_of(data)
    assert len(s) == 1 and len(s[0]["runs"]) == 1 and s[0]["spent"]["basic_epsilon"] == pytest.approx(0.6)
    assert s[0]["runs"][0]["rdp"] == pytest.approx(B.pure_dp_curve(0.6))
    led.close()
    other.close()
    _race(url, tmp_path)  # two processes at once on the shared server (LOCK TABLE)


def test_audit_on_real_data_and_the_opacus_hook_book(npz_pair, tmp_path):
    from gsd_cli.integrations.opacus import gep_epsilon

    assert main(["audit", "--method", "dpsgd", "--model", "fmnist-cnn", "--private", f"npz:{npz_pair['priv']}", "--canaries", "200",
                 "--examples", "16", "--insecure-seed", "2"]) == 0
    runs = B.BudgetLedger().status()[0]["runs"]
    assert [(r["what"], r["dp"]) for r in runs] == [("audit of dpsgd", False)] and 0 < runs[0]["epsilon"] <= 2.0
    assert main(["audit", "--method", "dpsgd", "--canaries", "200"]) == 0  # synthetic data: nothing to book
    assert len(B.BudgetLedger().status()) == 1
    data = B.DataIdentity("a" * 64, "opacus-set", "arrays")
    b = B.book_opacus(data, 1.2, 0.01, 200, 1e-5)
    assert b["epsilon"] == pytest.approx(gep_epsilon(1.2, 0.01, 200, 1e-5)) and b["what"] == "training (opacus gep)"
    B.BudgetLedger().set_budget(data, b["epsilon"] * 1.5, 2e-5)  # the run fits (basic: delta 1e-5 <= 2e-5 / 2); a second does not
    with pytest.raises(B.BudgetExceeded):
        B.book_opacus(data, 1.2, 0.01, 200, 1e-5)


def test_a_run_that_dies_stays_booked_and_its_resume_is_not_booked_again(two_paths, tmp_path, interrupt):
    from gsd_cli.train import TrainConfig, train

    cfg = TrainConfig(private=two_paths[0], method="dpsgd", epsilon=2.0, epochs=2, batch_size=30, physical_batch=64)
    with pytest.raises(interrupt.error):
        train(cfg, tmp_path / "run", progress=interrupt("epoch", 1))
    assert len(B.BudgetLedger().status()[0]["runs"]) == 1  # booked before its first step: dying does not unbook it
    train(cfg, tmp_path / "run", resume=True)
    runs = B.BudgetLedger().status()[0]["runs"]
    assert len(runs) == 1 and runs[0]["epsilon"] <= 2.0


def test_two_runs_with_the_same_insecure_seed_are_two_bookings(two_paths, tmp_path):
    """--insecure-seed runs are booked (their outputs depend on the private data): each run once, even
    with the same seed on the same data or on another data set (the id has a per-run nonce)."""
    from gsd_cli.train import TrainConfig, train

    d = np.load(two_paths[0][len("npz:"):])
    other = tmp_path / "other.npz"  # another data set: other contents
    np.savez(other, x=255 - d["x"], y=d["y"], classes=d["classes"])
    for name, private in (("a", two_paths[0]), ("b", two_paths[0]), ("c", f"npz:{other}")):
        cfg = TrainConfig(private=private, method="dpsgd", epsilon=2.0, epochs=1, batch_size=30, physical_batch=64,
                          insecure_seed=0)
        train(cfg, tmp_path / f"run-{name}")
    runs = sorted(len(s["runs"]) for s in B.BudgetLedger().status())
    assert runs == [1, 2], runs


def test_unbooked_data_is_not_booked(tiny):
    from gsd_cli.ranking import rank

    with B.unbooked("synthetic neighbours of an audit"):
        rank(tiny["private"], [tiny["public"]], dp=True, epsilon=0.5, k=2, examples=24, model="fmnist-cnn")
    assert B.BudgetLedger().status() == []
    rank(tiny["private"], [tiny["public"]], dp=True, epsilon=0.5, k=2, examples=24, model="fmnist-cnn")
    assert len(B.BudgetLedger().status()[0]["runs"]) == 1
