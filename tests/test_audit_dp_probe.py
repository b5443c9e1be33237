"""`gsd audit --method dp-probe` (issue 52, item 1): the DP feature probe's Gaussian releases audited
by a distinguishing test on a worst-case add-one pair, its exact trade-off computed independently, the
real mechanism below its claim, halved noise and noise from a public seed flagged, and the CLI."""

import json
import math

import numpy as np
import pytest
from scipy import stats

import gsd_cli.privacy.probe_mechanism as pm
from gsd_cli.audit import METHODS, audit
from gsd_cli.audit.dpprobe import TrialsGenerator, audit_dp_probe, canary_shift_by_hand, probe_neighbours
from gsd_cli.errors import GSDError


def _gaussian_pair_epsilon(mu: float, delta: float) -> float:
    """epsilon(delta) of N(0, 1) against N(mu, 1), apart from the module: delta(eps) = the integral of
    max(0, p_D'(x) - e^eps p_D(x)) on a grid (no closed form), inverted by bisection."""
    x = np.linspace(-30.0, 30.0 + mu, 600_001)
    p0, p1 = stats.norm.pdf(x), stats.norm.pdf(x - mu)

    def dlt(eps):
        return float(np.trapezoid(np.maximum(0.0, p1 - math.exp(eps) * p0), x))

    lo, hi = 0.0, 50.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if dlt(mid) > delta else (lo, mid)
    return hi


def test_the_canary_makes_the_largest_change_a_normalised_example_can():
    """||v(x)|| = sqrt(7)/2 for features along an axis (the audit's canary), and no other feature vector
    (random directions and scales, zero, several dimensions) moves the mechanism's statistic more."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for d in (1, 2, 5):
        phis = np.vstack([rng.normal(size=(300, d)) * rng.uniform(1e-3, 1e3, size=(300, 1)), np.zeros((1, d)), np.eye(d)])
        for y in (0, 1):
            for phi in phis:
                v = pm.fit_statistics(pm.normalise(phi[None]), pm.one_hot(np.array([y]), 2))
                worst = max(worst, float(np.linalg.norm(v)))
    assert worst == pytest.approx(math.sqrt(7) / 2, rel=1e-12)
    for models in (2, 3):
        r = audit_dp_probe(2.0, 1e-5, draws=10, models=models, insecure_seed=0)
        assert r.details["canary_shift"] == pytest.approx(canary_shift_by_hand(models), rel=1e-12)
        assert canary_shift_by_hand(models) == pytest.approx(math.sqrt(7 * models) / 2)


def test_the_pair_goes_through_the_partition_with_the_canary_in_the_fit_part():
    D, D2 = probe_neighbours(2)
    from gsd_cli.audit.dpprobe import SALT

    assert pm.split_parts(D2["identities"], SALT)[-1]
    assert D2["identities"][:-1] == D["identities"] and len(D2["labels"]) == len(D["labels"]) + 1
    assert all(np.array_equal(a, b[:-1]) for a, b in zip(D["features"], D2["features"]))


@pytest.mark.parametrize("eps,models", [(0.5, 2), (2.0, 2), (8.0, 3)])
def test_exact_loss_is_the_gaussian_trade_off_below_the_claim(eps, models):
    """The pair's exact (epsilon, delta) is that of N(0, sigma^2) against N(||V||, sigma^2), sigma = z sqrt(2):
    checked by numerical integration; it is below the Gaussian part's claim (which is below the whole
    claim), and with the noise halved it is above that claim, so a halved noise is refutable."""
    r = audit_dp_probe(eps, 1e-5, draws=10, models=models, insecure_seed=0)
    d = r.details
    z, eps_pf = pm.calibrate(eps, 1e-5, models)
    assert d["noise_multiplier"] == z and d["epsilon_pf"] == eps_pf
    assert r.claimed_epsilon == pytest.approx(pm.selection_epsilon(models, z, 0.0, 1e-5))
    assert d["claim_whole_mechanism"] == pytest.approx(pm.selection_epsilon(models, z, eps_pf, 1e-5))
    mu = math.sqrt(7 * models) / 2 / (z * math.sqrt(2))
    assert d["exact_loss"] == pytest.approx(_gaussian_pair_epsilon(mu, 1e-5), rel=1e-4)
    assert d["exact_loss"] < r.claimed_epsilon < d["claim_whole_mechanism"] <= eps
    half = audit_dp_probe(eps, 1e-5, draws=10, models=models, insecure_seed=0, bug="half-scale")
    assert half.details["exact_loss_as_run"] == pytest.approx(_gaussian_pair_epsilon(2 * mu, 1e-5), rel=1e-4)
    assert half.details["exact_loss_as_run"] > half.claimed_epsilon


def test_the_real_mechanism_stays_below_the_claim():
    r = audit_dp_probe(2.0, 1e-5, draws=20_000, insecure_seed=3)
    assert r.method == "dp-probe" and r.consistent
    assert r.epsilon_lower_bound > 0.6  # and sees most of the pair's exact loss (0.85)
    assert not r.details["gdp"]["noise_below_claim"] and r.details["replay_equal_under_D"] == 0


@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_halved_noise_is_flagged(eps):
    r = audit_dp_probe(eps, 1e-5, draws=20_000, insecure_seed=3, bug="half-scale")
    assert not r.consistent and r.epsilon_lower_bound > 1.5 * r.claimed_epsilon
    assert r.details["gdp"]["noise_below_claim"]


def test_halved_noise_in_the_mechanisms_own_noise_function_is_flagged(monkeypatch):
    """The audit draws through the mechanism's code: a halved noise_std (what a wrong sensitivity in the
    module would do) is caught without the audit's own bug switch."""
    monkeypatch.setattr(pm, "noise_std", lambda z: float(z) * math.sqrt(2.0) / 2)
    r = audit_dp_probe(2.0, 1e-5, draws=20_000, insecure_seed=3)
    assert not r.consistent and r.details["gdp"]["noise_below_claim"]


def test_the_counting_tests_alone_flag_halved_noise():
    """Without the Gaussian-DP fit's assumption: the threshold tests (Clopper-Pearson, the definition of
    (epsilon, delta)-DP) flag halved noise from a few hundred thousand draws per neighbour."""
    r = audit_dp_probe(2.0, 1e-5, draws=300_000, insecure_seed=3, bug="half-scale")
    c = r.details["best_counting_test"]
    assert c["statistic"] == "projection"
    assert math.log((c["p_lower"] - 1e-5) / c["p_upper"]) > r.claimed_epsilon


def test_noise_from_a_public_seed_is_flagged():
    r = audit_dp_probe(2.0, 1e-5, draws=1000, insecure_seed=3, bug="public-seed")
    assert not r.consistent and r.details["best_test"]["statistic"] == "replay"
    assert r.details["replay_equal_under_D"] == 1000 and r.details["replay_equal_under_D'"] == 0


def test_power_of_the_default_and_test_counts():
    """The docstring's power argument, from the exact figures: the Gaussian-DP fit's lower bound on mu at
    97.5% sits about 2.24 standard errors sqrt(2 / N) below the truth; with the noise halved it still
    converts to far above the claim at N = 20,000 (the tests) and 10^6 (the default), and the correct
    mechanism's truth is many standard errors below the claim."""
    from gsd_cli.audit.bound import gdp_epsilon

    z, _ = pm.calibrate(2.0, 1e-5, 2)
    claim = pm.selection_epsilon(2, z, 0.0, 1e-5)
    mu = math.sqrt(7 * 2) / 2 / (z * math.sqrt(2))
    for n in (20_000, 1_000_000):
        se = math.sqrt(2 / n + (2 * mu) ** 2 / (4 * n))
        assert gdp_epsilon(2 * mu - 4 * se, 1e-5) > claim + 0.5  # even 4 se low, halved noise is flagged
        mu_at_claim = next(m for m in np.arange(mu, 1.0, 1e-4) if gdp_epsilon(m, 1e-5) > claim)
        assert (mu_at_claim - mu) / math.sqrt(2 / n) > 3.5  # a false alarm needs a 3.5+ se error


def test_bad_arguments_and_a_mechanism_that_ignores_its_generator(monkeypatch):
    with pytest.raises(GSDError, match="unknown DP probe bug"):
        audit_dp_probe(2.0, draws=100, bug="nope")
    with pytest.raises(GSDError, match="at least 10"):
        audit_dp_probe(2.0, draws=3)
    with pytest.raises(GSDError, match="cannot certify"):
        audit_dp_probe(1e-3, draws=100)
    with pytest.raises(GSDError, match="only normal"):
        TrialsGenerator(np.random.default_rng(0), 3).laplace(0.0, 1.0)
    fixed = np.random.default_rng(0)
    monkeypatch.setattr(pm, "noisy_fit_statistics", lambda f, y, z, rng: pm.fit_statistics(f, y) + fixed.normal(0, z, 1))
    with pytest.raises(GSDError, match="not drawn from the generator"):
        audit_dp_probe(2.0, draws=100, insecure_seed=0)


def test_the_dispatcher_and_the_cli(tmp_path):
    from typer.testing import CliRunner

    from gsd_cli.cli import app
    from gsd_cli.cli.app import main

    assert "dp-probe" in METHODS
    r = audit("dp-probe", 2.0, 1e-5, canaries=5000, insecure_seed=2)
    assert r.method == "dp-probe" and r.consistent and r.details["draws_per_neighbour"] == 5000
    out = tmp_path / "a.json"
    res = CliRunner().invoke(app, ["audit", "--method", "dp-probe", "--epsilon", "2", "--canaries", "20000", "--insecure-seed", "4",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    for text in ("dp-probe", "claimed", "empirical", "draws per", "20000", "exact privacy loss of the audited pair",
                 "whole claim 2.000", "the audit found nothing"):
        assert text in res.output, text
    data = json.loads(out.read_text())
    assert data["method"] == "dp-probe" and data["consistent"] and data["delta"] == 1e-5
    assert data["details"]["exact_loss"] == pytest.approx(0.8503, abs=1e-3)
    assert data["claimed_epsilon"] == pytest.approx(1.0, abs=1e-3) and data["details"]["epsilon_requested"] == 2.0
    assert main(["audit", "--method", "dp-probe", "--canaries", "3"]) == 2
