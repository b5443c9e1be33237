"""Privacy at the edges (issue 44): every calibrated sigma and booked epsilon is confirmed by a second
computation, and an absurd step plan is refused before any work or booking."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.privacy import (
    calibrate_noise, confirm_epsilon, confirmed_epsilon, dpsgd_step_event, epsilon_of, gep_step_event, never_sampled_delta,
    second_epsilon, training_event,
)
from gsd_cli.train import TrainConfig
from gsd_cli.train.config import validate
from gsd_cli.train.size import check_plan

def _brute_never_sampled(q: float, steps: int) -> float:
    p_out = 1.0
    for _ in range(steps):
        p_out *= 1 - q
    return 1 - p_out


@pytest.mark.parametrize("q,steps", [(0.1, 7), (0.02, 50), (1e-3, 200)])
def test_never_sampled_delta_against_a_loop(q, steps):
    assert never_sampled_delta(q, steps) == pytest.approx(_brute_never_sampled(q, steps), rel=1e-12)
    assert never_sampled_delta(1e-300, 10) == pytest.approx(1e-299, rel=1e-9)  # no cancellation for tiny q


@pytest.mark.parametrize("q,z,steps", [(0.0625, 1.569, 80), (0.02, 2.08, 10_000), (0.5, 5.0, 10), (1.0, 3.0, 1)])
def test_rdp_epsilon_is_confirmed_by_the_second_computation(q, z, steps):
    event = training_event(dpsgd_step_event(z), q, steps)
    eps = epsilon_of(event, 1e-5)
    assert second_epsilon(q, z, steps, 1e-5) == pytest.approx(eps, rel=1e-5)
    assert confirmed_epsilon(event, 1e-5) == eps
    pld = epsilon_of(event, 1e-5, "pld")
    assert pld <= eps and confirm_epsilon(event, 1e-5, pld, "pld") == pld  # PLD is below the RDP bound


def test_a_wrong_epsilon_is_refused():
    event = training_event(dpsgd_step_event(1.1), 0.05, 400)
    eps = epsilon_of(event, 1e-5)
    for wrong in (eps * 0.95, eps * 1.05, float("inf"), float("nan"), -1.0):
        with pytest.raises(GSDError, match="faithfully"):
            confirm_epsilon(event, 1e-5, wrong, "rdp")
    with pytest.raises(GSDError, match="faithfully"):  # a PLD epsilon above the RDP bound cannot be right
        confirm_epsilon(event, 1e-5, eps * 1.1, "pld")


def test_epsilon_zero_only_where_the_run_is_0_delta_private():
    # 20 steps at q = 1e-300: each example is ever sampled with probability 2e-299 << delta, so
    # (0, delta)-DP holds whatever the noise, and 0 is a true epsilon (Opacus's RDP bound says 7).
    tiny = training_event(dpsgd_step_event(0.032), 1e-300, 20)
    assert confirmed_epsilon(tiny, 1e-5) == 0.0
    # T = 1 / q steps of q = 1e-300 (what --sampling-rate 1e-300 planned for one epoch): every example is
    # sampled with probability 1 - 1/e, but q^2 T underflows and dp-accounting says 0.0: refused.
    huge = training_event(dpsgd_step_event(1.0), 1e-300, 10**300)
    assert epsilon_of(huge, 1e-5) == 0.0
    with pytest.raises(GSDError, match="epsilon 0"):
        confirmed_epsilon(huge, 1e-5)
    with pytest.raises(GSDError, match="faithfully"):  # at sigma 0.032 the two accountants disagree (26.8 against 30.3)
        confirmed_epsilon(training_event(dpsgd_step_event(0.032), 1e-300, 10**300), 1e-5)
    with pytest.raises(GSDError, match="faithfully"):
        calibrate_noise(dpsgd_step_event, 2.0, 1e-5, 1e-300, 10**300, cache=False)


def test_gep_events_are_confirmed_through_their_effective_multiplier():
    event = training_event(gep_step_event(2.0, 2.0), 0.05, 300)  # one Gaussian of sigma / sqrt(2)
    assert second_epsilon(0.05, 2.0 / math.sqrt(2), 300, 1e-5) == pytest.approx(epsilon_of(event, 1e-5), rel=1e-5)
    assert confirmed_epsilon(event, 1e-5) == epsilon_of(event, 1e-5)


def test_the_calibrated_sigma_is_confirmed(tmp_path):
    sigma = calibrate_noise(dpsgd_step_event, 2.0, 1e-5, 0.0625, 80, cache=tmp_path)
    eps = epsilon_of(training_event(dpsgd_step_event(sigma), 0.0625, 80), 1e-5)
    assert eps <= 2.0 and second_epsilon(0.0625, sigma, 80, 1e-5) == pytest.approx(eps, rel=1e-4)
    assert calibrate_noise(dpsgd_step_event, 2.0, 1e-5, 0.0625, 80, cache=tmp_path) == sigma  # the cached value, confirmed


def test_plan_check():
    assert check_plan(20, 16, 100_000, "--expected-size") == 320
    with pytest.raises(GSDError, match="--max-steps"):
        check_plan(20, 4_000_000, 100_000, "--expected-size")
    assert check_plan(20, 4_000_000, 80_000_000, "--expected-size") == 80_000_000  # allowed by --max-steps
    with pytest.raises(GSDError, match="--max-steps"):
        validate(TrainConfig(method="dpsgd", sampling_rate=1e-300))
    with pytest.raises(GSDError, match="--max-steps"):
        validate(TrainConfig(method="dpsgd", expected_size=10**9))
    with pytest.raises(GSDError, match="--max-steps must"):
        validate(TrainConfig(method="dpsgd", max_steps=0))
    validate(TrainConfig(method="dpsgd", expected_size=10**9, batch_size=250, epochs=1, max_steps=4_000_000))


def _ledger_rows(path: Path) -> int:
    if not path.exists():
        return 0
    with sqlite3.connect(path) as con:
        names = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
        return sum(con.execute(f"select count(*) from {n}").fetchone()[0] for n in names)


@pytest.mark.parametrize("args", [["--sampling-rate", "1e-300"], ["--expected-size", "1000000000"]])
def test_absurd_plans_are_refused_before_any_work_or_booking(tmp_path, monkeypatch, capsys, args):
    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("GSD_LEDGER", str(ledger))
    x = (np.random.default_rng(0).uniform(size=(48, 28, 28)) * 255).astype(np.uint8)
    np.savez(tmp_path / "p.npz", x=x, y=np.arange(48) % 4, classes=np.array(list("abcd")))
    code = main(["train", "--private", f"npz:{tmp_path / 'p.npz'}", "--method", "dpsgd", *args, "--out", str(tmp_path / "run")])
    output = capsys.readouterr()
    assert code == 2, output
    assert "--max-steps" in output.err and "Traceback" not in output.err + output.out
    assert not (tmp_path / "run").exists() and _ledger_rows(ledger) == 0


def test_a_run_prints_its_plan_before_training(tmp_path, capsys):
    x = (np.random.default_rng(0).uniform(size=(64, 28, 28)) * 255).astype(np.uint8)
    np.savez(tmp_path / "p.npz", x=x, y=np.arange(64) % 4, classes=np.array(list("abcd")))
    code = main(["train", "--private", f"npz:{tmp_path / 'p.npz'}", "--method", "dpsgd", "--expected-size", "64",
                            "--batch-size", "16", "--epochs", "1", "--delta", "1e-3", "--out", str(tmp_path / "run")])
    output = capsys.readouterr()
    assert code == 0, output
    line = next(ln for ln in output.err.splitlines() if ln.startswith("plan:"))
    assert "4 steps (1 epochs x 4)" in line and "q = 0.25" in line and "about" in line


def test_the_second_epsilon_is_opacus_code_without_the_opacus_package_import():
    """second_epsilon runs Opacus's rdp.py from its file (no package __init__: 1.1-1.4 s a run); the same
    numbers as the package's own module, and no `opacus` package in sys.modules afterwards."""
    import subprocess
    import sys

    code = ("import sys; from gsd_cli.privacy.accountant import second_epsilon; "
            "e = second_epsilon(0.05, 1.1, 300, 1e-5); print(e, 'opacus' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    from opacus.accountants.analysis import rdp

    from gsd_cli.privacy.accountant import RDP_ORDERS

    orders = list(RDP_ORDERS)
    want, _ = rdp.get_privacy_spent(orders=orders, rdp=rdp.compute_rdp(q=0.05, noise_multiplier=1.1, steps=300, orders=orders), delta=1e-5)
    assert float(out[0]) == float(want) and out[1] == "False"
