"""What a release costs the ledger and how runs compose: RDP curves at :data:`ORDERS`, the basic and
Rényi filters (:func:`composed`, :func:`admits`); see :mod:`gsd_cli.privacy.budget` for the theorems."""

from __future__ import annotations

import math
from typing import Iterable, Sequence

#: delta at which a data set without a budget has its Rényi figure shown, when no run declared one.
SHOWN_DELTA = 1e-5


def _orders() -> tuple[float, ...]:
    from ..accountant import RDP_ORDERS

    return tuple(float(a) for a in RDP_ORDERS)


#: RDP orders at which every booking's curve is kept (the trainers' accountant's grid).
ORDERS: tuple[float, ...] = _orders()


def event_curve(event) -> list[float]:
    """The RDP curve of a dp-accounting event at :data:`ORDERS` (dp-accounting's ``RdpAccountant``, by
    :func:`gsd_cli.privacy.accountant.rdp_curve`: a training run's curve is the one its epsilon came from,
    not computed a second time)."""
    from ..accountant import rdp_curve  # at RDP_ORDERS, whose floats ORDERS are

    return [float(r) for r in rdp_curve(event)]


def pure_dp_curve(epsilon: float, releases: int = 1) -> list[float]:
    """RDP curve of ``releases`` epsilon-DP releases: releases * min(epsilon, alpha epsilon^2 / 2)
    (Mironov 2017: epsilon-DP is (infinity, epsilon)-RDP and D_alpha grows with alpha; Bun and Steinke 2016, Prop. 3.3:
    epsilon-DP is (epsilon^2/2)-zCDP; RDP curves of composed releases add, Mironov 2017, Prop. 1)."""
    e = float(epsilon)
    return [int(releases) * min(e, a * e * e / 2) for a in ORDERS]


def _eps(curve: Sequence[float], delta: float) -> float:
    from ..lazy_dpa import rdp

    compute_epsilon = rdp().compute_epsilon

    if delta <= 0:
        return math.inf
    return float(compute_epsilon(list(ORDERS), list(curve), delta)[0])


def composed(bookings: Iterable[dict], delta_budget: float | None) -> dict:
    """The spent figures of ``bookings`` (dicts with ``epsilon``, ``delta``, ``rdp`` (a list or None),
    ``guarantee``): basic sums; the Rényi filter's epsilon at ``delta_budget / (2 |ORDERS|)``; the
    same curves at ``delta_budget`` (composition fixed in advance). See the module docstring."""
    bookings = list(bookings)
    basic_eps = math.fsum(b["epsilon"] for b in bookings)
    basic_delta = math.fsum(b["delta"] for b in bookings)
    curves = [b.get("rdp") for b in bookings]
    have_curves = all(c is not None for c in curves)
    shown_delta = delta_budget if delta_budget else (max([b["delta"] for b in bookings if b["delta"] > 0] or [SHOWN_DELTA]))
    total = [math.fsum(c[i] for c in curves) for i in range(len(ORDERS))] if have_curves else None
    renyi_filter = renyi_fixed = None
    if total is not None:
        renyi_filter = _eps(total, shown_delta / (2 * len(ORDERS)))
        renyi_fixed = _eps(total, shown_delta)
    return {
        "runs": len(bookings),
        "basic_epsilon": basic_eps, "basic_delta": basic_delta,
        "renyi_epsilon": renyi_filter, "renyi_epsilon_fixed": renyi_fixed, "delta": shown_delta,
        "guarantee": all(b.get("guarantee", True) for b in bookings),
        "rdp": total,
    }


def admits(bookings: Sequence[dict], new: dict, epsilon_budget: float, delta_budget: float) -> tuple[bool, dict]:
    """Whether the filter admits ``new`` after ``bookings`` under the budget, and the figures after it.
    Basic composition is a valid privacy filter (Rogers, Roth, Ullman, Vadhan 2016, Theorem 5.1); for
    each fixed order alpha the Rényi filter is (Feldman and Zrnic 2021, Theorem 3.1); admitting when
    any of them admits costs a union bound over them, hence delta_B / 2 and delta_B / (2 |ORDERS|)
    (the argument: :mod:`gsd_cli.privacy.budget`). Admitted when
    basic (sum eps <= eps_B and sum delta <= delta_B / 2) or Rényi (the summed curves at
    delta_B / (2 |ORDERS|) give at most eps_B); a release without a proven guarantee is never admitted."""
    after = composed([*bookings, new], delta_budget)
    if not after["guarantee"]:
        return False, after
    tol = 1e-12 * max(1.0, epsilon_budget)
    basic = after["basic_epsilon"] <= epsilon_budget + tol and after["basic_delta"] <= delta_budget / 2 * (1 + 1e-12)
    renyi = after["renyi_epsilon"] is not None and after["renyi_epsilon"] <= epsilon_budget + tol
    after["admitted_by"] = "basic" if basic else ("renyi" if renyi else None)
    return basic or renyi, after


def remaining(spent: dict, budget: dict) -> dict:
    """What is left, by each filter: epsilon_B minus its spent figure (basic: and delta_B/2 minus the
    summed deltas)."""
    basic_ok = spent["basic_delta"] <= budget["delta"] / 2
    basic = budget["epsilon"] - spent["basic_epsilon"] if basic_ok else 0.0
    renyi = budget["epsilon"] - spent["renyi_epsilon"] if spent["renyi_epsilon"] is not None else 0.0
    if not spent["guarantee"]:
        basic = renyi = 0.0
    return {"basic_epsilon": max(0.0, basic), "basic_delta": max(0.0, budget["delta"] / 2 - spent["basic_delta"]),
            "renyi_epsilon": max(0.0, renyi), "epsilon": max(0.0, basic, renyi)}
