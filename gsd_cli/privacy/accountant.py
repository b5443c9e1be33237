"""What a private trainer spends: dp-accounting events, epsilon, noise calibration, a ledger.

Neighbouring relation: **add or remove one example**, the relation under which Poisson subsampling
amplifies (dp-accounting's ``PoissonSampledDpEvent`` requires it). DP-GSD is proven under the same
relation (see :mod:`gsd_cli.distance.dpgsd`, "Neighbouring relation"), so a DP selection and a training
compose: their epsilons and deltas add (:class:`Ledger`).

Every trainer step releases, for one Poisson subsample of the private set (rate q), one or more sums
of clipped vectors, each with Gaussian noise. A part with L2 sensitivity S and noise standard
deviation sigma_i has noise multiplier z_i = sigma_i / S.

GEP (paper 000, Theorem 3.1 and its proof in Appendix D) releases two parts of the *same*
subsample: the embedding (sensitivity S1, noise sigma1 = z1 S1) and the residual (S2, sigma2 = z2 S2).
Scaling each part by its noise (w / sigma1, r / sigma2) gives one vector with unit-variance noise whose
sensitivity is sqrt(z1^-2 + z2^-2): the pair *is* one Gaussian mechanism with effective multiplier

    z_eff = (z1^-2 + z2^-2)^(-1/2)          (= sigma / sqrt(2) when z1 = z2 = sigma, the paper's choice),

and with subsampling it is one Poisson-subsampled Gaussian with z_eff per step, which is how it is
accounted here (the paper's proof composes the two halves *before* subsampling, lambda/sigma^2 per
call; the authors' code instead doubles the RDP of a subsampled Gaussian, which under-counts: see
DESIGN.md, "GEP"). The residual-free variant (B-GEP) releases the embedding alone: z_eff = z1.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GSDError
from . import lazy_dpa
from .orders import RDP_ORDERS
from .second_computation import _opacus_rdp, _second_epsilon, second_epsilon  # noqa: F401 (re-exported)

# dp-accounting is imported on first use, and then without its PLD accountant and calibration
# (lazy_dpa): a run with the RDP accountant and a cached sigma does not pay for them (issue 53)
if TYPE_CHECKING:
    from dp_accounting import dp_event as ev

# dp-accounting logs through absl when an RDP order fails to converge and is (correctly) skipped
logging.getLogger("absl").setLevel(logging.ERROR)

ACCOUNTANTS = ("rdp", "pld")



def dpsgd_step_event(z: float) -> ev.DpEvent:
    """One DP-SGD release: the clipped sum (sensitivity C) plus N(0, (z C)^2 I)."""
    return lazy_dpa.events().GaussianDpEvent(float(z))


def gep_step_event(z_embedding: float, z_residual: float | None) -> ev.DpEvent:
    """One GEP release (paper 000, Algorithm 1 lines 6-7): embedding with multiplier ``z_embedding``
    and residual with ``z_residual`` on the same subsample; ``None`` = residual not released (B-GEP)."""
    ev = lazy_dpa.events()
    if z_residual is None:
        return ev.GaussianDpEvent(float(z_embedding))
    return ev.ComposedDpEvent([ev.GaussianDpEvent(float(z_embedding)), ev.GaussianDpEvent(float(z_residual))])


def effective_noise_multiplier(step: ev.DpEvent) -> float:
    """The multiplier of the single Gaussian equivalent to Gaussian releases of the same data:
    (sum_i z_i^-2)^(-1/2) (see the module docstring)."""
    ev = lazy_dpa.events()
    if isinstance(step, ev.GaussianDpEvent):
        return float(step.noise_multiplier)
    if isinstance(step, ev.ComposedDpEvent):
        zs = [effective_noise_multiplier(e) for e in step.events]
        if any(z == 0 for z in zs):
            return 0.0
        return sum(z**-2 for z in zs) ** -0.5
    if isinstance(step, ev.SelfComposedDpEvent):
        return effective_noise_multiplier(step.event) * step.count**-0.5
    raise GSDError(f"not a Gaussian release: {step}")


def training_event(step: ev.DpEvent, sampling_rate: float, steps: int) -> ev.DpEvent:
    """``steps`` Poisson-subsampled (rate q) applications of the per-step release ``step``.

    The per-step release is replaced by its equivalent single Gaussian *inside* the subsampling
    (all parts see the same subsample), never subsampled part by part."""
    if not 0 < sampling_rate <= 1:
        raise GSDError(f"the sampling rate must be in (0, 1] (got {sampling_rate}); lower --batch-size or use more data")
    z = effective_noise_multiplier(step)
    ev = lazy_dpa.events()
    return ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(float(sampling_rate), ev.GaussianDpEvent(z)), int(steps))


def _accountant(kind: str):
    if kind == "rdp":
        return lazy_dpa.rdp().RdpAccountant(orders=list(RDP_ORDERS))
    if kind == "pld":  # imported here, when --accountant pld asks for it (scipy.signal and scipy.stats: 0.3-0.7 s)
        return lazy_dpa.pld().PLDAccountant()
    raise GSDError(f"unknown --accountant {kind!r}; use one of {', '.join(ACCOUNTANTS)}")


#: the accountant's memo in this process: (repr of the event, delta, accountant) -> epsilon (the accountant
#: is deterministic, and a trainer asks for the same epsilon up to three times: calibration check, the run's
#: total, the last epoch's), and ("rdp-step", q, z) -> one step's RDP curve (:func:`rdp_curve`)
_EPSILONS: dict[tuple, object] = {}


def _remember(key: tuple, value):
    if len(_EPSILONS) >= 1024:
        _EPSILONS.clear()
    _EPSILONS[key] = value
    return value


def rdp_curve(event: ev.DpEvent):
    """dp-accounting's RDP curve of ``event`` at :data:`RDP_ORDERS`: ``RdpAccountant.compose(event).rdp``.

    A run of T steps (:func:`training_event`'s shape) is T times one step's curve, as the accountant composes
    it (``count * curve``: RDP adds under composition), the same floats; the step's curve is computed once per
    (q, z) in this process, so each epoch's ``epsilon_spent``, the run's total and the ledger's curve cost a
    product, not a fresh series at 158 orders (0.04-0.13 s each on the 2-core CPU)."""
    import numpy as np

    parts = _subsampled_gaussian(event)
    if parts is None:
        acc = _accountant("rdp")
        with np.errstate(over="ignore"):
            acc.compose(event)
        return acc.rdp
    q, z, steps = parts
    key = ("rdp-step", q, z)
    step = _EPSILONS.get(key)
    if step is None:
        ev = lazy_dpa.events()
        acc = _accountant("rdp")
        with np.errstate(over="ignore"):  # an order whose RDP overflows is infinite, and skipped: a bound still
            acc.compose(ev.PoissonSampledDpEvent(q, ev.GaussianDpEvent(z)))
        step = _remember(key, acc.rdp)
        step.flags.writeable = False
    with np.errstate(over="ignore"):
        return steps * step


def epsilon_of(event: ev.DpEvent, delta: float, accountant: str = "rdp") -> float:
    """Epsilon of ``event`` at ``delta`` by dp-accounting's RDP or PLD accountant (remembered in this
    process: an event's ``repr`` holds its every field, floats exactly). RDP: dp-accounting's conversion
    (``compute_epsilon``, what ``RdpAccountant.get_epsilon`` returns) of :func:`rdp_curve`."""
    check_delta(delta)
    key = (repr(event), float(delta), accountant)
    if key not in _EPSILONS:  # (an unknown accountant is never stored: _accountant refuses it)
        import numpy as np

        with np.errstate(over="ignore"):  # an order whose RDP overflows is infinite, and skipped: a bound still
            if accountant == "rdp":
                value = float(lazy_dpa.rdp().compute_epsilon(np.array(list(RDP_ORDERS)), rdp_curve(event), delta)[0])
            else:
                acc = _accountant(accountant)
                acc.compose(event)
                value = float(acc.get_epsilon(delta))
        _remember(key, value)
    return _EPSILONS[key]


#: relative agreement required between dp-accounting's RDP epsilon and the second computation's: the same
#: orders, slightly different RDP-to-(epsilon, delta) conversions (1e-6 apart at delta 1e-5, 1.6e-4 at 1e-3,
#: measured); what this catches is off by orders of magnitude (an underflow, an overflow)
CONFIRM_RTOL = 1e-2


def _subsampled_gaussian(event: ev.DpEvent) -> tuple[float, float, int] | None:
    """(q, z, T) of ``training_event``'s shape (T self-composed Poisson-subsampled Gaussians), else None."""
    ev = lazy_dpa.events()
    count = 1
    if isinstance(event, ev.SelfComposedDpEvent):
        event, count = event.event, int(event.count)
    if isinstance(event, ev.PoissonSampledDpEvent) and isinstance(event.event, ev.GaussianDpEvent):
        return float(event.sampling_probability), float(event.event.noise_multiplier), count
    return None


def never_sampled_delta(sampling_rate: float, steps: int) -> float:
    """1 - (1 - q)^T, the probability that one example is in at least one of T Poisson subsamples.

    Under add/remove-one, the run on D + {x} has the same output distribution as the run on D on the
    event that x is never sampled, so the two differ in total variation by at most this: every such
    run is (0, 1 - (1 - q)^T)-DP whatever its noise. Computed as -expm1(T log1p(-q)), exact for tiny q."""
    if sampling_rate >= 1:
        return 1.0
    return float(-math.expm1(steps * math.log1p(-sampling_rate)))


def confirm_epsilon(event: ev.DpEvent, delta: float, epsilon: float, accountant: str = "rdp") -> float:
    """``epsilon`` (dp-accounting's, for ``event`` at ``delta``) when a second computation confirms it;
    otherwise a :class:`GSDError`: an epsilon that is not computed faithfully is never reported or booked.

    For a run of T Poisson-subsampled Gaussians (rate q, multiplier z), it is confirmed when it is finite
    and non-negative and either (i) the run is (0, delta)-DP outright (:func:`never_sampled_delta` <= delta:
    any epsilon >= 0 is then true), or (ii) Opacus's RDP accountant (:func:`second_epsilon`) gives a
    finite epsilon that equals it (``rdp``, relative tolerance :data:`CONFIRM_RTOL`) or bounds it from
    above (``pld``, which is tighter than any RDP bound), and (iii) an epsilon of 0 is never confirmed by (ii):
    only (i) proves it. Below q of about 1e-154, q^2 T underflows in both accountants' floats (a run of
    T = 1 / q steps was booked at epsilon 0.0): (i) fails there, and (ii) refuses the 0."""
    what = ("the accountant cannot compute this run's epsilon faithfully; use a sampling rate and a step count "
            "a run can use (--sampling-rate or --expected-size, --epochs)")
    eps = float(epsilon)
    if not math.isfinite(eps) or eps < 0:
        raise GSDError(f"{what}: it gave epsilon {eps}")
    parts = _subsampled_gaussian(event)
    if parts is None:
        return eps  # not a training run's shape (the audits' single releases): dp-accounting's value stands
    q, z, steps = parts
    if never_sampled_delta(q, steps) <= delta:
        return eps
    try:
        second = second_epsilon(q, z, steps, delta)
    except (OverflowError, ValueError, ZeroDivisionError, FloatingPointError) as e:
        raise GSDError(f"{what}: the second computation failed ({type(e).__name__})") from None
    if not math.isfinite(second):
        raise GSDError(f"{what}: the second computation (Opacus's RDP) gave {second}")
    if eps == 0.0:
        raise GSDError(f"{what}: it gave epsilon 0 for q = {q:.3g} over {steps} steps, whose examples are sampled "
                       f"with probability {never_sampled_delta(q, steps):.3g} > delta (the second computation gave {second:.4g})")
    tol = CONFIRM_RTOL * max(1.0, second)
    agrees = abs(eps - second) <= tol if accountant == "rdp" else eps <= second + tol
    if not agrees:
        raise GSDError(f"{what}: dp-accounting's {accountant.upper()} gave epsilon {eps:.6g}, a second computation "
                       f"(Opacus's RDP) {second:.6g} for q = {q:.3g}, sigma {z:.4g}, {steps} steps")
    return eps


def confirmed_epsilon(event: ev.DpEvent, delta: float, accountant: str = "rdp") -> float:
    """:func:`epsilon_of` confirmed by :func:`confirm_epsilon`: what a run reports and books."""
    return confirm_epsilon(event, delta, epsilon_of(event, delta, accountant), accountant)


def check_epsilon(epsilon: float, what: str = "--epsilon") -> None:
    if epsilon is None or not math.isfinite(epsilon) or epsilon <= 0:
        raise GSDError(f"{what} must be a positive number (got {epsilon})")


def check_delta(delta: float) -> None:
    if delta is None or not math.isfinite(delta) or not 0 < delta < 1:
        raise GSDError(f"--delta must be in (0, 1), typically below 1/n (got {delta})")


def calibrate_noise(
    make_step,
    target_epsilon: float,
    delta: float,
    sampling_rate: float,
    steps: int,
    accountant: str = "rdp",
    cache: bool | str | Path = True,
) -> float:
    """The smallest noise multiplier sigma for which ``steps`` Poisson-subsampled releases
    ``make_step(sigma)`` are (target_epsilon, delta)-DP, by dp-accounting's
    ``calibrate_dp_mechanism`` (Brent's method). The returned sigma is checked: its epsilon is never
    above the target (it is raised by 0.01% steps if rounding put it a hair above).

    ``cache``: ``True`` keeps the answer on disk (:mod:`gsd_cli.privacy.calibration_cache`, under the
    cache folder), a path keeps it there, ``False`` does not; a cached sigma is used only after one
    accountant evaluation confirms its epsilon is at most (and within 0.1% of) the target."""
    check_epsilon(target_epsilon)
    check_delta(delta)
    if steps < 1:
        raise GSDError(f"training needs at least one step (got {steps}); raise --epochs")
    if accountant not in ACCOUNTANTS:
        _accountant(accountant)  # the error naming the accountants

    def event(sigma: float) -> ev.DpEvent:
        return training_event(make_step(sigma), sampling_rate, steps)

    store, key = None, None
    if cache is not False:
        from .calibration_cache import CalibrationCache

        store = CalibrationCache(None if cache is True else cache)
        key = calibration_key(make_step, target_epsilon, delta, sampling_rate, steps, accountant)
        hit = store.get(key, lambda s: confirmed_epsilon(event(s), delta, accountant), target_epsilon)
        if hit is not None:
            return hit

    dpa = lazy_dpa.full()  # calibrate_dp_mechanism (scipy.optimize): only when no cached sigma is confirmed
    if accountant == "pld":
        # PLD is tighter than RDP (its sigma is smaller) but needs a bracket away from tiny sigmas,
        # whose privacy-loss distributions do not fit in memory: search below the RDP answer.
        upper = calibrate_noise(make_step, target_epsilon, delta, sampling_rate, steps, "rdp", cache)
        bracket = dpa.ExplicitBracketInterval(upper / 4, upper)
        tol = 1e-5 * upper
    else:
        bracket, tol = dpa.LowerEndpointAndGuess(1e-3, 1.0), 1e-7
    import numpy as np

    with np.errstate(over="ignore"):  # tiny sigmas' RDP overflows at large orders: infinite, skipped
        sigma = dpa.calibrate_dp_mechanism(
            lambda: _accountant(accountant), event, float(target_epsilon), float(delta), bracket, tol=tol,
        )
    sigma = float(sigma)
    while (eps := epsilon_of(event(sigma), delta, accountant)) > target_epsilon:
        sigma *= 1.0001
    confirm_epsilon(event(sigma), delta, eps, accountant)  # a second computation, or a refusal (never booked)
    if store is not None:
        store.put(key, sigma, eps)
    return sigma


#: version of the calibration procedure (bracket, tolerance, the final check): part of the cache key
CALIBRATION_VERSION = 1


def calibration_key(make_step, target_epsilon, delta, sampling_rate, steps, accountant) -> dict:
    """Every input of :func:`calibrate_noise`, floats exactly (``repr``): the per-step event is
    written at sigma 1 and 2, which fixes it for the mechanisms here (each multiplier linear in sigma)."""
    from .calibration_cache import dp_accounting_version

    return {
        "target_epsilon": repr(float(target_epsilon)), "delta": repr(float(delta)),
        "sampling_rate": repr(float(sampling_rate)), "steps": int(steps), "accountant": accountant,
        "step_at_1": repr(make_step(1.0)), "step_at_2": repr(make_step(2.0)),
        "rdp_orders": hashlib.sha256(repr(RDP_ORDERS).encode()).hexdigest()[:16], "calibration": CALIBRATION_VERSION, "dp_accounting": dp_accounting_version(),
    }


def selection_kind(privacy: dict) -> str:
    """What a DP ranking's ``privacy`` block released by: the DP selection (``gsd rank --dp``'s default and
    ``--auto-select --select-epsilon``'s), the DP energy distance (``--metric dp-energy``) or DP-GSD."""
    if privacy.get("release") == "selection":
        return "DP selection"
    return "DP energy distance" if privacy.get("mechanism") == "laplace-energy" else "DP-GSD"


@dataclass(frozen=True)
class Charge:
    """One private release a run spends its budget on (:class:`Ledger`): what it is, its (epsilon, delta) and how
    it was spent (the mechanism and its parts)."""

    name: str
    epsilon: float
    delta: float
    detail: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "epsilon": self.epsilon, "delta": self.delta, "detail": self.detail}


@dataclass
class Ledger:
    """Every private release of a pipeline, and their total by basic composition
    (epsilons add, deltas add; valid for any mix of pure and approximate DP guarantees under one
    neighbouring relation)."""

    entries: list[Charge] = field(default_factory=list)

    def add(self, name: str, epsilon: float, delta: float, detail: str = "") -> None:
        self.entries.append(Charge(name, float(epsilon), float(delta), detail))

    def add_selection(self, privacy: dict) -> None:
        """Book a DP-GSD ranking's ``privacy`` block at its **total**: ``total_epsilon`` when the
        ranking had repeats (R x epsilon for fresh private draws, epsilon when they shared one), else
        ``epsilon``; delta 0 (pure DP). A release without a proven guarantee (the matrix mechanism's
        Gibbs sampler) is refused: it cannot be booked, since no epsilon is true of it. (One drawn
        with ``--insecure-seed`` is booked; the run that books it is then marked not DP.)"""
        dp_probe = privacy.get("release") == "dp-probe"  # the DP feature probe: (epsilon, delta)-DP, gsd_cli.advice.dp_probe
        if not privacy.get("exact") or (privacy.get("delta") not in (0, 0.0) and not dp_probe):
            raise GSDError(
                f"the selection's DP-GSD mechanism ({privacy.get('mechanism')}) has no proven guarantee, so its "
                "budget cannot be booked; select with --mechanism sequential"
            )
        eps = privacy.get("total_epsilon", privacy.get("epsilon"))
        if eps is None or not float(eps) > 0:
            raise GSDError(f"the selection's privacy block has no epsilon to book (got {eps!r})")
        releases = privacy.get("releases", 1)
        detail = f"{privacy.get('mechanism', '')}; {releases} release(s)" + (
            f" x epsilon {privacy['epsilon']:g}" if releases != 1 else "")
        parts = [(what, privacy.get(key)) for what, key in (("choice", "epsilon_select"), ("scores", "epsilon_score"),
                                                             ("margin over noise", "epsilon_margin")) if privacy.get(key)]
        if privacy.get("release") == "selection" and parts:  # the DP selection's parts, as its mechanism spent them
            detail += ": " + " + ".join(f"{what} {e:g}" for what, e in parts) + f" = epsilon {sum(e for _, e in parts):g}"
        if dp_probe:
            self.add("public-data selection (DP feature probe)", float(eps), float(privacy["delta"]), privacy.get("guarantee", ""))
            return
        self.add(f"public-data selection ({selection_kind(privacy)})", float(eps), 0.0, detail)

    @property
    def epsilon(self) -> float:
        return sum(e.epsilon for e in self.entries)

    @property
    def delta(self) -> float:
        return sum(e.delta for e in self.entries)

    def to_dict(self) -> dict:
        return {
            "entries": [e.to_dict() for e in self.entries],
            "total_epsilon": self.epsilon,
            "total_delta": self.delta,
            "composition": "basic (epsilons and deltas add)",
        }
