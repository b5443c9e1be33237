"""The trainers' accountant, checked against independent computations (Opacus's RDP accountant, the
exact privacy-loss distribution of a two-part Gaussian release by Monte Carlo, a brute-force sweep)."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event as ev
from scipy.stats import norm

from gsd_cli.errors import GSDError
from gsd_cli.privacy import (
    Ledger,
    calibrate_noise,
    dpsgd_step_event,
    effective_noise_multiplier,
    epsilon_of,
    gep_step_event,
    training_event,
)
from gsd_cli.privacy.accountant import RDP_ORDERS


def _opacus_epsilon(q, sigma, steps, delta):
    from opacus.accountants.analysis import rdp as ordp

    orders = list(RDP_ORDERS)
    rdp = ordp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    return float(ordp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])


@pytest.mark.parametrize("q,sigma,steps", [(0.01, 1.1, 1000), (0.125, 1.6, 160), (0.02, 2.08 / math.sqrt(2), 10_000)])
def test_dpsgd_epsilon_agrees_with_opacus_rdp(q, sigma, steps):
    ours = epsilon_of(training_event(dpsgd_step_event(sigma), q, steps), 1e-5, "rdp")
    assert ours == pytest.approx(_opacus_epsilon(q, sigma, steps, 1e-5), abs=1e-3)


def test_gep_is_one_gaussian_with_sigma_over_sqrt2():
    # DESIGN.md's example: q=0.02, T=1e4, sigma=2.08, delta=1e-5 -> 7.91 (RDP), 7.33 (PLD)
    q, sigma, steps, delta = 0.02, 2.08, 10_000, 1e-5
    gep = training_event(gep_step_event(sigma, sigma), q, steps)
    eps_rdp = epsilon_of(gep, delta, "rdp")
    assert eps_rdp == pytest.approx(_opacus_epsilon(q, sigma / math.sqrt(2), steps, delta), abs=1e-3)
    assert eps_rdp == pytest.approx(7.91, abs=0.01)
    assert epsilon_of(gep, delta, "pld") == pytest.approx(7.33, abs=0.02)
    # the same as dp-accounting's own treatment of the nested event (composition inside the subsampling)
    nested = ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(q, gep_step_event(sigma, sigma)), steps)
    assert epsilon_of(nested, delta, "rdp") == pytest.approx(eps_rdp, rel=1e-9)
    # the authors' code (two separately subsampled releases, i.e. doubled RDP) under-counts: 7.29
    separate = ev.ComposedDpEvent([training_event(dpsgd_step_event(sigma), q, steps)] * 2)
    assert epsilon_of(separate, delta, "rdp") == pytest.approx(7.29, abs=0.01)
    assert epsilon_of(separate, delta, "rdp") < eps_rdp - 0.5


def test_bgep_is_the_embedding_alone():
    assert effective_noise_multiplier(gep_step_event(3.0, None)) == 3.0


def _analytic_gaussian_delta(eps, mu):
    """delta(eps) of the Gaussian mechanism whose privacy loss is N(mu^2/2, mu^2) (Balle & Wang 2018)."""
    return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu)


@pytest.mark.parametrize("z1,z2,s1,s2", [(1.5, 1.5, 5.0, 2.0), (1.0, 3.0, 10.0, 1.0)])
def test_two_part_release_equals_one_gaussian_by_monte_carlo(z1, z2, s1, s2):
    """Theorem 3.1's pair (embedding sensitivity S1, noise z1 S1; residual S2, noise z2 S2) has the
    privacy-loss distribution of one Gaussian with multiplier (z1^-2 + z2^-2)^-1/2: sampled directly
    from the two-dimensional worst case (one example moves both parts by their full sensitivity)."""
    rng = np.random.default_rng(0)
    n = 2_000_000
    o1 = s1 + z1 * s1 * rng.standard_normal(n)  # output under D (example present)
    o2 = s2 + z2 * s2 * rng.standard_normal(n)
    # log N(o; S, sigma^2) - log N(o; 0, sigma^2), summed over the two parts
    loss = (2 * o1 * s1 - s1**2) / (2 * (z1 * s1) ** 2) + (2 * o2 * s2 - s2**2) / (2 * (z2 * s2) ** 2)
    z = effective_noise_multiplier(gep_step_event(z1, z2))
    assert z == pytest.approx((z1**-2 + z2**-2) ** -0.5)
    for eps in (0.5, 1.0, 2.0):
        mc = np.mean(np.clip(1 - np.exp(eps - loss), 0, None))
        assert mc == pytest.approx(_analytic_gaussian_delta(eps, 1 / z), rel=0.03, abs=2e-5)


@pytest.mark.parametrize("make", [dpsgd_step_event, lambda s: gep_step_event(s, s)])
def test_calibration_round_trip(make):
    q, steps, delta, target = 0.1, 200, 1e-5, 2.0
    sigma = calibrate_noise(make, target, delta, q, steps)
    eps = epsilon_of(training_event(make(sigma), q, steps), delta)
    assert eps <= target
    assert eps >= 0.995 * target  # not far below: the smallest sigma that fits
    # brute force: 1% less noise does not fit
    assert epsilon_of(training_event(make(sigma * 0.99), q, steps), delta) > target


def test_calibration_pld_is_tighter_than_rdp():
    q, steps, delta = 0.1, 200, 1e-5
    s_rdp = calibrate_noise(dpsgd_step_event, 2.0, delta, q, steps, "rdp")
    s_pld = calibrate_noise(dpsgd_step_event, 2.0, delta, q, steps, "pld")
    assert s_pld < s_rdp
    assert epsilon_of(training_event(dpsgd_step_event(s_pld), q, steps), delta, "pld") <= 2.0


@pytest.mark.parametrize("eps,delta", [(0, 1e-5), (-1, 1e-5), (float("nan"), 1e-5), (1, 0), (1, 1), (1, -0.1)])
def test_bad_budgets(eps, delta):
    with pytest.raises(GSDError):
        calibrate_noise(dpsgd_step_event, eps, delta, 0.1, 10)


def test_ledger_adds_up():
    led = Ledger()
    led.add("selection", 1.0, 0.0)
    led.add("training", 2.0, 1e-5)
    d = led.to_dict()
    assert d["total_epsilon"] == 3.0 and d["total_delta"] == 1e-5 and len(d["entries"]) == 2
