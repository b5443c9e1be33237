"""`gsd audit --method dp-probe` (issue 52 item 1; issue 60 item 3): the DP feature probe run end to end
(fit, score, selection) at M models, each part tested against its own claim on a worst-case add-one pair
with its exact loss computed independently; the correct mechanism passes, and the three mutants (halved fit
noise in noise_std, the probe's z halved at dp_probe_at's call site, permute-and-flip at twice its epsilon)
are flagged, as flags and as changes to the real functions; the CLI exits 1 on a PRIVACY BUG."""

import json
import math

import numpy as np
import pytest
from scipy import stats

import gsd_cli.privacy.probe_mechanism as pm
import gsd_cli.privacy.selection as sel
from gsd_cli.audit import METHODS, audit
from gsd_cli.audit.bound import AuditResult
from gsd_cli.audit.dpprobe import (MUTANTS, audit_dp_probe, canary_shift_by_hand, exact_selection_loss, mutant,
                                   probe_neighbours, selection_neighbours)
from gsd_cli.audit.dpselect import pf_law
from gsd_cli.errors import GSDError

#: the tests' fast configuration: 2 models, 1,000 runs per neighbour and part (about 3 s on the 2-core CPU)
FAST = {"draws": 1000, "models": 2}


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
    """||v(x)|| = sqrt(7)/2 for features along an axis (the fit pair's canary), and no other feature vector
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
        fit = audit_dp_probe(2.0, 1e-5, draws=10, models=models, insecure_seed=0).details["parts"]["fit"]
        assert fit["canary_shift"] == pytest.approx(canary_shift_by_hand(models), rel=1e-12)
        assert canary_shift_by_hand(models) == pytest.approx(math.sqrt(7 * models) / 2)


def test_the_fit_pair_puts_its_canary_in_the_fit_half():
    D, D2 = probe_neighbours(2)
    from gsd_cli.audit.dpprobe import SALT

    assert pm.split_parts(D2["identities"], SALT)[-1] and D2["parts"][-1]
    assert D2["identities"][:-1] == D["identities"] and len(D2["labels"]) == len(D["labels"]) + 1
    assert all(np.array_equal(a, b[:-1]) for a, b in zip(D["features"], D2["features"]))


@pytest.mark.parametrize("eps,models,bug", [(2.0, 4, None), (0.5, 2, None), (8.0, 3, None), (2.0, 4, "half-scale")])
def test_every_run_of_the_selection_pair_scores_as_designed(monkeypatch, eps, models, bug):
    """The selection pair's counts are what its docstring says in every run, whatever the fit noise (also
    halved): the ridge probes always predict the sign. Read where permute-and-flip receives them."""
    plan = pm.plan_dp_probe(eps, 1e-5, models)
    D, D2, design = selection_neighbours(models, plan.epsilon_pf, plan.z)
    assert not D2["parts"][-1] and D["parts"].sum() == 2 * design["fit_per_class"] and not D["parts"][2 * design["fit_per_class"]:].any()
    assert 1 <= design["lead_under_D"] < 2
    seen = []
    real = sel.permute_and_flip
    monkeypatch.setattr(sel, "permute_and_flip", lambda u, e, s, rng: (seen.append(np.array(u)), real(u, e, s, rng))[1])
    rng = np.random.default_rng(1)
    with mutant(bug):
        for data in (D, D2):
            for _ in range(100):
                pm.run_dp_probe(plan, data["features"], data["labels"], data["parts"], 2, rng=rng)
    assert np.allclose(seen[:100], design["u_D"], rtol=0, atol=1e-9) and np.allclose(seen[100:], design["u_D'"], rtol=0, atol=1e-9)
    # the losers' coins are below e^-30: the pair is the two-model one the docstring computes
    assert all(math.exp(plan.epsilon_pf / 2 * (u - max(design["u_D"]))) < 1e-13 for u in design["u_D"][2:])


def test_the_selection_claim_holds_on_monotone_pairs_and_the_pair_reaches_it():
    """Permute-and-flip at epsilon / (2 Delta) is epsilon / 2-DP when every count moves the same way by 0 or 1
    (the docstring's proof), checked against its exact law on random monotone pairs; not so when counts move
    both ways (so the part needs the monotone property); the audit's pair loses exactly epsilon_pf / 2, and
    epsilon_pf with permute-and-flip at twice its epsilon."""
    rng = np.random.default_rng(5)
    worst, both_ways = 0.0, 0.0
    for _ in range(300):
        K, eps = int(rng.integers(2, 6)), float(rng.uniform(0.1, 4))
        u = rng.integers(0, 6, size=K) + rng.uniform(0, 1, size=K) * (rng.random() < 0.5)
        e = rng.integers(0, 2, size=K)
        worst = max(worst, exact_selection_loss(u, u + e, eps) / (eps / 2))
        both_ways = max(both_ways, exact_selection_loss(u, u + rng.integers(-1, 2, size=K), eps) / (eps / 2))
    assert worst <= 1 + 1e-9 and both_ways > 1.5
    for eps, models in ((2.0, 4), (0.5, 2), (8.0, 3), (30.0, 2)):
        plan = pm.plan_dp_probe(eps, 1e-5, models)
        _, _, design = selection_neighbours(models, plan.epsilon_pf, plan.z)
        assert exact_selection_loss(design["u_D"], design["u_D'"], plan.epsilon_pf) == pytest.approx(plan.epsilon_pf / 2, rel=1e-9)
        assert exact_selection_loss(design["u_D"], design["u_D'"], 2 * plan.epsilon_pf) == pytest.approx(plan.epsilon_pf, rel=1e-9)
    # pf_law itself, by hand: two candidates g apart, the trailing one wins e^(-c g) / 2
    assert pf_law(np.array([1.7, 0.0]), 0.5)[1] == pytest.approx(math.exp(-0.85) / 2)


@pytest.mark.parametrize("eps,models", [(0.5, 2), (2.0, 4), (8.0, 3)])
def test_exact_fit_loss_is_the_gaussian_trade_off_below_the_claim(eps, models):
    """The fit pair's exact (epsilon, delta) is that of N(0, sigma^2) against N(||V||, sigma^2), sigma = z sqrt(2):
    checked by numerical integration; below the fit part's claim (below the whole claim); with the noise
    halved above it."""
    r = audit_dp_probe(eps, 1e-5, draws=10, models=models, insecure_seed=0)
    d, fit = r.details, r.details["parts"]["fit"]
    z, eps_pf = pm.calibrate(eps, 1e-5, models)
    assert d["noise_multiplier"] == z and d["epsilon_pf"] == eps_pf and d["models"] == models
    assert fit["claim"] == pytest.approx(pm.selection_epsilon(models, z, 0.0, 1e-5))
    assert d["claim_whole_mechanism"] == pytest.approx(pm.selection_epsilon(models, z, eps_pf, 1e-5))
    assert d["parts"]["selection"]["claim"] == eps_pf / 2
    mu = math.sqrt(7 * models) / 2 / (z * math.sqrt(2))
    assert fit["exact_loss"] == pytest.approx(_gaussian_pair_epsilon(mu, 1e-5), rel=1e-4)
    assert fit["exact_loss"] < fit["claim"] < d["claim_whole_mechanism"] <= eps
    assert _gaussian_pair_epsilon(2 * mu, 1e-5) > fit["claim"]


def test_the_correct_mechanism_passes_at_a_users_number_of_models():
    r = audit_dp_probe(2.0, 1e-5, draws=1000, insecure_seed=3)  # M = 4, the default
    fit, select = r.details["parts"]["fit"], r.details["parts"]["selection"]
    assert r.method == "dp-probe" and r.consistent and r.details["models"] == 4
    assert fit["epsilon_lower_bound"] <= fit["claim"] and select["epsilon_lower_bound"] <= select["claim"]
    assert fit["epsilon_lower_bound"] > 0.4 and select["epsilon_lower_bound"] > 0.15  # each sees part of its pair's loss
    assert not fit["gdp"]["noise_below_claim"] and fit["replay_equal_under_D"] == 0
    assert sum(select["frequencies_D"]) == 1000 and select["frequencies_D"][2:] == [0, 0]


#: where each mutant shows: the part whose claim it breaks
PART = {"half-scale": "fit", "half-z": "fit", "double-pf-epsilon": "selection"}


@pytest.mark.parametrize("bug", sorted(MUTANTS))
def test_each_mutant_is_flagged_by_its_part(bug):
    r = audit_dp_probe(2.0, 1e-5, insecure_seed=3, bug=bug, **FAST)
    parts = r.details["parts"]
    other = "selection" if PART[bug] == "fit" else "fit"
    assert not r.consistent and r.details["reported_part"] == PART[bug] and r.details["mutant"] == MUTANTS[bug]
    assert parts[PART[bug]]["epsilon_lower_bound"] > 1.2 * parts[PART[bug]]["claim"]
    assert parts[other]["epsilon_lower_bound"] <= parts[other]["claim"]
    # the mutant is gone after the audit: the mechanism's code is as it was
    assert pm.noise_std(1.0) == math.sqrt(2) and sel.permute_and_flip.__module__ == "gsd_cli.privacy.selection"
    assert pm.dp_probe_at.__module__ == "gsd_cli.privacy.probe_mechanism"


def _patch_noise_std(monkeypatch):
    monkeypatch.setattr(pm, "noise_std", lambda z: float(z) * math.sqrt(2.0) / 2)


def _patch_call_site_z(monkeypatch):
    real = pm.dp_probe_at
    monkeypatch.setattr(pm, "dp_probe_at", lambda *a, z, **k: real(*a, z=z / 2, **k))


def _patch_pf_epsilon(monkeypatch):
    real = sel.permute_and_flip
    monkeypatch.setattr(sel, "permute_and_flip", lambda u, epsilon, s, rng: real(u, 2 * epsilon, s, rng))


@pytest.mark.parametrize("patch,part", [(_patch_noise_std, "fit"), (_patch_call_site_z, "fit"), (_patch_pf_epsilon, "selection")],
                         ids=["noise_std-halved", "call-site-z-halved", "pf-epsilon-doubled"])
def test_the_audit_sees_the_mutants_in_the_real_code(monkeypatch, patch, part):
    """The same three mutants written into the mechanism's functions (not the audit's flags) are flagged:
    the audit runs the code a user runs."""
    patch(monkeypatch)
    r = audit_dp_probe(2.0, 1e-5, insecure_seed=3, **FAST)
    assert not r.consistent and r.details["reported_part"] == part and r.details["bug"] is None


def test_noise_from_a_public_seed_is_flagged():
    r = audit_dp_probe(2.0, 1e-5, draws=100, models=2, insecure_seed=3, bug="public-seed")
    fit = r.details["parts"]["fit"]
    assert not r.consistent and fit["best_test"]["statistic"] == "replay"
    assert fit["replay_equal_under_D"] == 100 and fit["replay_equal_under_D'"] == 0


def test_power_of_the_default_and_test_counts():
    """The docstring's power argument from the exact figures, at the default (M = 4, 5,000 draws) and the tests'
    (M = 2, 1,000): the Gaussian-DP fit's lower bound on mu (at 1 - 0.05 / 4: 2.24 standard errors below its
    estimate) with halved noise converts above the claim even 4 (the tests: 2) standard errors low, and at the default a
    false alarm needs the estimate 4 standard errors high; the selection part at twice its epsilon is above its
    claim even with 3 standard errors against it on each side."""
    from gsd_cli.audit.bound import gdp_epsilon

    z_gdp = stats.norm.ppf(1 - 0.05 / 4)
    for models, n in ((4, 5000), (2, 1000)):
        plan = pm.plan_dp_probe(2.0, 1e-5, models)
        claim = pm.selection_epsilon(models, plan.z, 0.0, 1e-5)
        mu = math.sqrt(7 * models) / 2 / (plan.z * math.sqrt(2))
        se = math.sqrt(2 / n + (2 * mu) ** 2 / (4 * n))
        low = 2 if n == 1000 else 4  # flagged unless the estimate with the noise halved is this many standard errors low
        assert gdp_epsilon(2 * mu - (z_gdp + low) * se, 1e-5) > claim
        mu_at_claim = next(m for m in np.arange(mu, 1.0, 1e-4) if gdp_epsilon(m, 1e-5) > claim)
        assert (mu_at_claim - mu) / math.sqrt(2 / n) + z_gdp > (4.0 if n == 5000 else 3.0)
        g = selection_neighbours(models, plan.epsilon_pf, plan.z)[2]["lead_under_D"]
        p_d, p_d2 = math.exp(-plan.epsilon_pf * g) / 2, math.exp(-plan.epsilon_pf * (g - 1)) / 2  # at twice the epsilon
        lo, hi = p_d2 - 3 * math.sqrt(p_d2 * (1 - p_d2) / n), p_d + 3 * math.sqrt(p_d * (1 - p_d) / n)
        assert math.log(lo / hi) > plan.epsilon_pf / 2


def test_bad_arguments_and_a_mechanism_that_hides_its_releases(monkeypatch):
    with pytest.raises(GSDError, match="unknown DP probe bug"):
        audit_dp_probe(2.0, draws=100, bug="nope")
    with pytest.raises(GSDError, match="at least 10"):
        audit_dp_probe(2.0, draws=3)
    with pytest.raises(GSDError, match="cannot certify"):
        audit_dp_probe(1e-3, draws=100)
    for m in (1, 9, True, 2.5):
        with pytest.raises(GSDError, match="2 to 8 models"):
            audit_dp_probe(2.0, draws=100, models=m)
    real = pm.dp_probe_at
    monkeypatch.setattr(pm, "dp_probe_at", lambda *a, observe=None, **k: real(*a, **k))
    with pytest.raises(GSDError, match="fit releases, not one per model"):
        audit_dp_probe(2.0, draws=10, models=2, insecure_seed=0)


def test_run_dp_probe_is_dp_probe_at_at_the_plans_numbers():
    """The planned call (what the audit runs) is dp_probe_at at the plan's z and epsilon_pf, and dp_probe is the
    plan then the run: same winner from the same generator state, the same accounting."""
    rng = np.random.default_rng(0)
    feats = [rng.normal(size=(60, 3)) for _ in range(3)]
    y, parts = rng.integers(0, 2, 60), rng.random(60) < 0.5
    plan = pm.plan_dp_probe(2.0, 1e-5, 3)
    assert (plan.z, plan.epsilon_pf) == pm.calibrate(2.0, 1e-5, 3) and plan.curve == tuple(pm.selection_curve(3, plan.z, plan.epsilon_pf))
    for seed in range(5):
        a = pm.run_dp_probe(plan, feats, y, parts, 2, rng=np.random.default_rng(seed))
        b = pm.dp_probe_at(feats, y, parts, 2, z=plan.z, epsilon_pf=plan.epsilon_pf, rng=np.random.default_rng(seed))
        c = pm.dp_probe(feats, y, parts, 2, epsilon=2.0, delta=1e-5, rng=np.random.default_rng(seed))
        assert a == b == c.winner and (c.z, c.epsilon, c.curve) == (plan.z, plan.epsilon, plan.curve)
    with pytest.raises(GSDError, match="planned for 3 models"):
        pm.run_dp_probe(plan, feats[:2], y, parts, 2, rng=rng)


def test_the_dispatcher_and_the_cli(tmp_path):
    from typer.testing import CliRunner

    from gsd_cli.cli import app
    from gsd_cli.cli.app import main

    assert "dp-probe" in METHODS
    r = audit("dp-probe", 2.0, 1e-5, canaries=50, insecure_seed=2, models=3)
    assert r.method == "dp-probe" and r.details["draws_per_neighbour"] == 50 and r.details["models"] == 3
    out = tmp_path / "a.json"
    res = CliRunner().invoke(app, ["audit", "--method", "dp-probe", "--epsilon", "2", "--canaries", "1000", "--models", "2",
                                   "--insecure-seed", "4", "--json", str(out)])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())  # rich wraps its lines at the terminal's width
    for text in ("dp-probe", "claimed", "empirical", "draws per", "1000", "M = 2 models", "whole claim 2.000", "run end to end",
                 "fit part (canary in the fit half): claim 1.000", "exact loss of the pair 0.8503",
                 "selection part (canary in the score half): claim 0.500", "the audit found nothing"):
        assert text in said, text
    data = json.loads(out.read_text())
    assert data["method"] == "dp-probe" and data["consistent"] and data["details"]["epsilon_requested"] == 2.0
    assert data["details"]["parts"]["fit"]["exact_loss"] == pytest.approx(0.8503, abs=1e-3)
    assert data["details"]["parts"]["selection"]["exact_loss"] == pytest.approx(0.5, rel=1e-9)
    assert main(["audit", "--method", "dp-probe", "--canaries", "3"]) == 2
    assert main(["audit", "--method", "dp-probe", "--canaries", "100", "--models", "9"]) == 2
    assert main(["audit", "--method", "dp-probe", "--canaries", "300000"]) == 2


def test_the_cli_exits_1_on_a_mutant_and_0_on_the_correct_mechanism(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from gsd_cli.cli import app

    args = ["audit", "--method", "dp-probe", "--canaries", "1000", "--models", "2", "--insecure-seed", "4"]
    _patch_pf_epsilon(monkeypatch)
    out = tmp_path / "bug.json"
    res = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert res.exit_code == 1, res.output
    said = " ".join(res.output.split())
    assert "PRIVACY BUG" in said and "ABOVE ITS CLAIM" in said and "the table shows the selection part" in said
    assert not json.loads(out.read_text())["consistent"]  # written before the exit
    monkeypatch.undo()
    assert CliRunner().invoke(app, args).exit_code == 0


@pytest.mark.parametrize("method", ["dpsgd", "dpgsd", "dp-select", "dp-energy"])
def test_every_methods_privacy_bug_verdict_exits_1(monkeypatch, method):
    """One verdict for every --method: a lower bound above the claim prints PRIVACY BUG and exits 1 (as gsd rank
    --catalog's failed check); a bound below it exits 0."""
    from typer.testing import CliRunner

    import gsd_cli.cli.audit as cli_audit
    from gsd_cli.cli import app

    for bound, code in ((3.0, 1), (1.0, 0)):
        monkeypatch.setattr(cli_audit, "_run_audit", lambda o, b=bound: AuditResult(o.method, 2.0, 1e-5, b, 100, 100, 60))
        res = CliRunner().invoke(app, ["audit", "--method", method, "--canaries", "100"])
        assert res.exit_code == code, res.output
        assert ("PRIVACY BUG" in res.output) == (code == 1)


def test_models_is_said_to_be_unused_by_another_method(monkeypatch):
    from typer.testing import CliRunner

    import gsd_cli.cli.audit as cli_audit
    from gsd_cli.cli import app

    monkeypatch.setattr(cli_audit, "_run_audit", lambda o: AuditResult(o.method, 2.0, 1e-5, 0.5, 100, 100, 60))
    res = CliRunner().invoke(app, ["audit", "--method", "dpsgd", "--canaries", "100", "--models", "3"])
    assert res.exit_code == 0 and "--models is not used by --method dpsgd" in " ".join(res.output.split())
