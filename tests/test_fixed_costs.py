"""Fixed costs of a short run (issue 53): dp-accounting's PLD accountant and calibration, SciPy's
statistics and matplotlib load only when a run uses them; the accountant computes each epsilon once
and the answers are the uncached computation's, to the last bit; the command does not spend its exit
collecting garbage. What is checked is which modules get imported and which values come out, never a time."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gsd_cli.privacy import accountant
from gsd_cli.privacy.accountant import (
    RDP_ORDERS, confirmed_epsilon, dpsgd_step_event, epsilon_of, gep_step_event, rdp_curve, second_epsilon, training_event,
)

#: loaded by a run only when it uses them: --accountant pld, a calibration without a cached sigma, curves.png
LAZY = ("dp_accounting.pld", "dp_accounting.mechanism_calibration", "scipy.optimize", "scipy.signal", "scipy.stats", "matplotlib")


def _run(code: str, timeout: int = 300) -> dict:
    """``code`` in a fresh interpreter; its last line of output, as JSON."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _uncached_rdp(event, delta: float) -> tuple[float, list[float]]:
    """dp-accounting's RdpAccountant, composed afresh: epsilon and the RDP curve."""
    from dp_accounting.rdp import RdpAccountant

    acc = RdpAccountant(orders=list(RDP_ORDERS))
    with np.errstate(over="ignore"):
        acc.compose(event)
        return float(acc.get_epsilon(delta)), [float(r) for r in acc.rdp]


@pytest.mark.parametrize("q, step", [(0.125, dpsgd_step_event(1.399113481280198)), (0.02, dpsgd_step_event(0.9)),
                                     (1.0, dpsgd_step_event(2.0)), (0.05, gep_step_event(1.2, 0.8))])
def test_each_epochs_epsilon_is_the_uncached_computation(monkeypatch, q, step):
    """A run's epsilons (each epoch's ``epsilon_spent``, its total, the ledger's RDP curve) come from one
    step's curve times the step count, remembered: the same floats as dp-accounting composing each afresh."""
    from gsd_cli.privacy.budget.compose import event_curve

    monkeypatch.setattr(accountant, "_EPSILONS", {})
    for delta in (1e-5, 1e-3):
        for steps in (1, 8, 16, 48, 80):  # the epochs of a run, then again from memory
            event = training_event(step, q, steps)
            want, curve = _uncached_rdp(event, delta)
            assert epsilon_of(event, delta) == want
            assert epsilon_of(event, delta) == want
            assert event_curve(event) == curve
            assert [float(r) for r in rdp_curve(event)] == curve
    assert sum(k[0] == "rdp-step" for k in accountant._EPSILONS) == 1  # one step's curve computed, for all of them


def test_a_composed_event_of_another_shape_is_composed_as_it_is(monkeypatch):
    from dp_accounting import dp_event as ev

    monkeypatch.setattr(accountant, "_EPSILONS", {})
    event = ev.ComposedDpEvent([training_event(dpsgd_step_event(1.0), 0.01, 100), training_event(dpsgd_step_event(2.0), 0.02, 50)])
    want, curve = _uncached_rdp(event, 1e-5)
    assert epsilon_of(event, 1e-5) == want and [float(r) for r in rdp_curve(event)] == curve


def test_the_second_computation_is_remembered_and_every_epsilon_still_confirmed(monkeypatch):
    """The second, independent epsilon (Opacus's RDP) is a pure function of (q, z, T, delta): computed once,
    the same value; the confirmation itself runs at every call (a disagreement is still refused)."""
    monkeypatch.setattr(accountant, "_EPSILONS", {})
    fresh = accountant._second_epsilon.__wrapped__(0.03, 1.1, 200, 1e-5)
    assert second_epsilon(0.03, 1.1, 200, 1e-5) == fresh == second_epsilon(0.03, 1.1, 200, 1e-5)
    event = training_event(dpsgd_step_event(1.1), 0.03, 200)
    assert confirmed_epsilon(event, 1e-5) == epsilon_of(event, 1e-5)
    monkeypatch.setattr(accountant, "epsilon_of", lambda *a, **k: 10 * fresh)  # a wrong epsilon: refused every time
    for _ in range(2):
        with pytest.raises(Exception, match="second computation"):
            confirmed_epsilon(event, 1e-5)


def test_the_events_and_rdp_load_without_pld_or_calibration_and_the_rest_on_use():
    """dp-accounting without its ``__init__`` until a name of it is used: then the very same package."""
    r = _run(
        "import json, sys\n"
        "from gsd_cli.privacy import lazy_dpa\n"
        "from gsd_cli.privacy.accountant import confirmed_epsilon, dpsgd_step_event, epsilon_of, training_event\n"
        f"LAZY = {LAZY!r}\n"
        "e = training_event(dpsgd_step_event(1.1), 0.05, 100)\n"
        "rdp = confirmed_epsilon(e, 1e-5)\n"
        "seen = {'rdp': [m for m in LAZY if m in sys.modules], 'light': lazy_dpa.is_light()}\n"
        "pld = epsilon_of(e, 1e-5, 'pld')\n"
        "seen['pld'] = [m for m in LAZY if m in sys.modules]\n"
        "import dp_accounting\n"
        "seen['same'] = dp_accounting.GaussianDpEvent is lazy_dpa.events().GaussianDpEvent and callable(dp_accounting.calibrate_dp_mechanism)\n"
        "seen['full'] = not lazy_dpa.is_light()\n"
        "seen['values'] = [rdp, pld]\n"
        "print(json.dumps(seen))"
    )
    assert r["rdp"] == [] and r["light"]
    assert "dp_accounting.pld" in r["pld"] and "dp_accounting.mechanism_calibration" not in r["pld"] and "matplotlib" not in r["pld"]
    assert r["same"] and r["full"]
    assert 0 < r["values"][1] <= r["values"][0]  # PLD is tighter than RDP


def test_a_short_dpsgd_run_loads_pld_calibration_scipy_stats_and_matplotlib_only_when_used(tiny, tmp_path):
    """A warm `gsd train --method dpsgd` (its sigma cached by a first run) with the RDP accountant: when
    curves.png is drawn, none of LAZY is loaded; then matplotlib alone. The curves are still drawn, and
    each epoch's epsilon is the uncached computation's."""
    args = ["train", "--private", tiny["private"], "--method", "dpsgd", "--epochs", "2", "--batch-size", "40", "--expected-size", "120", "-q"]
    spy = (
        "import json, sys\n"
        "import gsd_cli.train.curves as curves\n"
        f"LAZY = {LAZY!r}\n"
        "seen = {}\n"
        "real = curves.plot_curves\n"
        "def spy(*a, **k):\n"
        "    seen['at_plot'] = [m for m in LAZY if m in sys.modules]\n"
        "    return real(*a, **k)\n"
        "curves.plot_curves = spy\n"
        "from gsd_cli.cli import main\n"
        "assert main(ARGS) == 0\n"
        "seen['after'] = [m for m in LAZY if m in sys.modules]\n"
        "print(json.dumps(seen))"
    )
    from gsd_cli.cli import main

    assert main(args + ["--out", str(tmp_path / "cold")]) == 0  # here: calibrates sigma and caches it (the tests' cache folder)
    r = _run(spy.replace("ARGS", repr(args + ["--out", str(tmp_path / "warm")])))
    assert r["at_plot"] == [], r
    assert r["after"] == ["matplotlib"], r
    run = tmp_path / "warm"
    assert (run / "curves.png").stat().st_size > 1000
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len(rows) == 2
    for row in rows:
        event = training_event(dpsgd_step_event(summary["sigma"]), summary["sampling_rate"], row["step"])
        assert row["epsilon_spent"] == _uncached_rdp(event, summary["delta"])[0]
    assert rows[-1]["epsilon_spent"] == summary["epsilon"]


def test_the_command_freezes_its_objects_at_exit_and_a_library_call_does_not():
    """`gsd` (main() on its own command line) leaves its objects out of the shutdown's garbage
    collections (gc.freeze at exit); main(argv) called by a program changes nothing in that program."""
    r = _run(
        "import atexit, contextlib, gc, io, json, sys\n"
        "from gsd_cli.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--version']) == 0\n"
        "atexit._run_exitfuncs()\n"
        "library = gc.get_freeze_count()\n"
        "sys.argv = ['gsd', '--version']\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main() == 0\n"
        "atexit._run_exitfuncs()\n"
        "print(json.dumps({'library': library, 'command': gc.get_freeze_count()}))"
    )
    assert r["library"] == 0 and r["command"] > 0


def test_midranks_are_scipys_rankdata():
    """The macro AUC's mid-ranks without importing scipy.stats: SciPy's floats, ties, signed zeros,
    infinities and NaN included."""
    from scipy.stats import rankdata

    from gsd_cli.train.evaluate import midranks, roc_auc

    rng = np.random.default_rng(0)
    cases = [rng.standard_normal(n).astype(dt) for n in (1, 2, 7, 500) for dt in (np.float32, np.float64)]
    cases += [np.round(rng.standard_normal(300) * 2) / 2, np.array([0.0, -0.0, np.inf, -np.inf, 1.0, 1.0]),
              np.array([1.0, np.nan, 2.0]), np.ones(5)]
    for x in cases:
        want = rankdata(x, method="average")
        got = midranks(x)
        assert got.dtype == want.dtype and np.array_equal(got, want, equal_nan=True), x
    s = rng.uniform(size=400).round(2)
    pos = rng.uniform(size=400) < 0.3
    u = rankdata(s, method="average")[pos].sum() - pos.sum() * (pos.sum() + 1) / 2.0
    assert roc_auc(pos, s) == float(u / (pos.sum() * (~pos).sum()))
