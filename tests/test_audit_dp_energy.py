"""`gsd audit --method dp-energy`: the Laplace mechanism of `gsd rank --dp`'s default ranking audited
by a distinguishing test, its exact privacy loss computed independently (and checked against the
sensitivity theorem on random pairs), injected bugs flagged, and the CLI."""

import json

import numpy as np
import pytest
import torch

from gsd_cli.audit import audit
from gsd_cli.audit.dpenergy import audit_dp_energy, energy_neighbours, exact_energy_loss
from gsd_cli.errors import GSDError


@pytest.mark.parametrize("eps,clip", [(0.5, 1.0), (2.0, 1.0), (1.0, 3.0)])
def test_the_audited_pair_loses_exactly_epsilon(eps, clip):
    """Replacing C e2 by C e1 moves the two energies by C^2 each: L1 2 C^2, the sensitivity, so the
    pair's privacy loss is epsilon itself (the audit's pair is the worst case)."""
    D, D2, W = energy_neighbours(clip)
    assert exact_energy_loss(D, D2, W, eps, clip, 1.0) == pytest.approx(eps, rel=1e-9)


def test_no_replace_one_pair_loses_more_than_epsilon():
    """The sensitivity theorem (L1 <= 2 C^2 Lambda), checked by the independent loss on random row pairs
    of random lengths (some clipped) and random public candidates in p = 5, with Lambda from numpy."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(200):
        K, k, p = rng.integers(1, 4), rng.integers(1, 3), 5
        W = [torch.from_numpy(np.linalg.qr(rng.normal(size=(p, k)))[0]) for _ in range(K)]
        lam = float(np.linalg.eigvalsh(sum(w.numpy() @ w.numpy().T for w in W)).max())
        rows = rng.normal(size=(2, p)) * rng.uniform(0.1, 3.0, size=(2, 1))
        D, D2 = torch.from_numpy(rows[:1]), torch.from_numpy(rows[1:])
        loss = exact_energy_loss(D, D2, W, 1.0, 1.0, lam, n=20001)
        assert loss <= 1.0 + 1e-6
        worst = max(worst, loss)
    assert worst > 0.5  # the check is not vacuous: some pairs come near the bound


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_the_mechanism_audit_stays_below_the_claim(eps):
    r = audit_dp_energy(eps, draws=2000, insecure_seed=3)
    assert r.consistent and r.details["exact_loss"] == pytest.approx(eps)
    assert r.epsilon_lower_bound > 0.4 * eps  # and sees a good part of the loss


@pytest.mark.parametrize("bug", ["half-scale", "public-seed"])
def test_the_mechanism_audit_flags_injected_bugs(bug):
    r = audit_dp_energy(1.0, draws=2000, insecure_seed=3, bug=bug)
    assert not r.consistent
    assert r.details["best_test"]["statistic"] == ("replay" if bug == "public-seed" else "T")


def test_both_audits_through_the_dispatcher_and_bad_bugs():
    r = audit("dp-energy", 2.0, canaries=500, trials=5, insecure_seed=2)
    assert r.method == "dp-energy" and r.consistent
    assert r.details["pipeline"]["method"] == "dp-energy (pipeline)"
    assert r.details["pipeline"]["details"]["equal_to_replay_under_D"] == 0
    flagged = audit("dp-energy", 1.0, canaries=1000, trials=5, insecure_seed=2, bug="half-scale")
    assert not flagged.consistent and flagged.details["best_audit"] == "dp-energy"
    with pytest.raises(GSDError, match="unknown DP energy bug"):
        audit("dp-energy", 1.0, canaries=100, trials=5, bug="nope")


def test_cli(tmp_path):
    from typer.testing import CliRunner

    from gsd_cli.cli import app
    from gsd_cli.cli.app import main

    out = tmp_path / "a.json"
    res = CliRunner().invoke(app, ["audit", "--method", "dp-energy", "--epsilon", "2", "--canaries", "400", "--trials", "5",
                                   "--insecure-seed", "4", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "Laplace mechanism audit" in res.output and "exact privacy loss" in res.output
    data = json.loads(out.read_text())
    assert data["method"] == "dp-energy" and data["consistent"] and data["details"]["exact_loss"] == pytest.approx(2.0)
    assert main(["audit", "--method", "dp-energy", "--canaries", "3"]) == 2


def test_auto_trials_are_the_fewest_that_flag_a_replayed_pipeline():
    from gsd_cli.audit.pipeline import AUTO_TRIALS_MAX, AUTO_TRIALS_MIN, replay_power, trials_to_flag

    for eps in (0.5, 1.0, 2.0):
        n, enough = trials_to_flag(eps, 0.975)
        assert enough and replay_power(n, 0.975) > eps
        assert n == AUTO_TRIALS_MIN or replay_power(n - 1, 0.975) <= eps
    assert trials_to_flag(8.0, 0.975) == (AUTO_TRIALS_MAX, False)


def test_the_default_trials_flag_a_replayed_pipeline_at_epsilon_2():
    """With the default (auto) trials the pipeline audit flags the reseeded generator at the CLI's
    default claim, epsilon 2; with 15 trials (the old default) it could not (its bound was 1.08)."""
    r = audit("dp-energy", 2.0, canaries=200, insecure_seed=5, bug="pipeline-public-seed")
    assert r.details["pipeline_trials_auto"] and r.details["pipeline_can_flag_replay"]
    assert not r.consistent and r.details["best_audit"] == "dp-energy (pipeline)"


def test_cli_says_when_the_pipeline_audit_cannot_flag_a_replay(capsys):
    from gsd_cli.cli.app import main

    assert main(["audit", "--method", "dp-energy", "--epsilon", "4", "--canaries", "200", "--trials", "5"]) == 0
    err = capsys.readouterr().err
    assert "cannot flag even a fully replayed pipeline at epsilon 4" in err and "--epsilon 1" in err
