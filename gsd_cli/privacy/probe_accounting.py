"""The accounting of the DP feature probe (:mod:`gsd_cli.privacy.probe_mechanism`, whose docstring holds
the theorem): its RDP curve at gsd's orders, M alpha / (2 z^2) + min(epsilon_pf, alpha epsilon_pf^2 / 2),
that curve's (epsilon, delta) by dp-accounting's conversion, and the calibration of the noise multiplier
z to a target (epsilon, delta)."""

from __future__ import annotations

import math

import numpy as np

from ..errors import GSDError


def _orders() -> tuple[float, ...]:
    from .budget.compose import ORDERS
    return ORDERS


def _check_models(models) -> int:
    if isinstance(models, bool) or not isinstance(models, (int, np.integer)) or models < 1:
        raise GSDError(f"the probe's number of models must be a whole number >= 1 (got {models})")
    return int(models)


def _check_positive(name: str, value, allow_zero: bool = False, allow_inf: bool = False) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and not math.isnan(value)
    ok = ok and (value >= 0 if allow_zero else value > 0) and (allow_inf or math.isfinite(value))
    if not ok:
        raise GSDError(f"the probe's {name} must be a {'non-negative' if allow_zero else 'positive'} number (got {value})")
    return float(value)


def _check_delta(delta) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)) or not 0 < delta < 1:
        raise GSDError(f"the probe's delta must be a number with 0 < delta < 1 (got {delta})")
    return float(delta)


def selection_curve(models: int, z: float, epsilon_pf: float) -> list[float]:
    """rho(alpha) = models * alpha / (2 z^2) + min(epsilon_pf, alpha epsilon_pf^2 / 2) at gsd's
    orders (the theorem of the module docstring). z = inf: the selection alone."""
    m = _check_models(models)
    z = _check_positive("noise multiplier z", z, allow_inf=True)
    e = _check_positive("epsilon_pf", epsilon_pf, allow_zero=True)
    from .budget.compose import pure_dp_curve

    orders = _orders()
    pure = pure_dp_curve(e) if e > 0 else [0.0] * len(orders)
    return [m * a / (2.0 * z * z) + p for a, p in zip(orders, pure)]


def selection_epsilon(models: int, z: float, epsilon_pf: float, delta: float) -> float:
    """The curve of :func:`selection_curve` converted to epsilon at ``delta`` by dp-accounting's
    ``compute_epsilon`` at gsd's orders (as :mod:`gsd_cli.privacy.budget.compose` does)."""
    delta = _check_delta(delta)
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    return float(compute_epsilon(list(_orders()), selection_curve(models, z, epsilon_pf), delta)[0])


def calibrate(epsilon: float, delta: float, models: int, pf_share: float = 0.5) -> tuple[float, float]:
    """(z, epsilon_pf): epsilon_pf = pf_share * epsilon and the smallest z (bisection) whose
    :func:`selection_epsilon` is <= ``epsilon``, within 1e-3 relative of it. Refuses an epsilon that
    no z reaches (the selection alone costs at least its floor; module docstring)."""
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    m = _check_models(models)
    if isinstance(pf_share, bool) or not isinstance(pf_share, (int, float)) or not 0 < pf_share < 1:
        raise GSDError(f"the probe's pf_share must be a number with 0 < pf_share < 1 (got {pf_share})")
    eps_pf = float(pf_share) * epsilon

    def eps(z: float) -> float:
        return selection_epsilon(m, z, eps_pf, delta)

    floor = eps(math.inf)
    if floor >= epsilon:
        raise GSDError(f"the DP probe cannot certify epsilon {epsilon:g} at delta {delta:g}: its selection alone "
                       f"(epsilon_pf = {eps_pf:g}) converts to {floor:.4g} at gsd's RDP orders; give a larger epsilon")
    hi = 1.0
    while eps(hi) > epsilon:
        hi *= 2.0
        if hi > 1e100:  # pragma: no cover - the curve tends to the floor, below epsilon
            raise GSDError(f"the DP probe found no noise multiplier for epsilon {epsilon:g} at delta {delta:g}")
    lo = hi / 2.0
    while lo > 1e-6 and eps(lo) <= epsilon:
        hi, lo = lo, lo / 2.0
    for _ in range(200):  # invariant: eps(hi) <= epsilon < eps(lo)
        if eps(hi) >= epsilon * (1 - 1e-4) or (hi - lo) <= 1e-12 * hi:
            break
        mid = 0.5 * (lo + hi)
        if eps(mid) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi, eps_pf


