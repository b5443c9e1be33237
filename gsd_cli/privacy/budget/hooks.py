"""The booking hooks the releases call (DP-GSD, gsd train, the Opacus adapter), and the reports of
``gsd budget show``."""

from __future__ import annotations

import contextvars
import hashlib
import os
from contextlib import contextmanager
from pathlib import Path

from ...errors import GSDError
from .compose import ORDERS, event_curve, pure_dp_curve
from .identity import data_identity
from .store import PRIVATE_NOTE, BudgetExceeded, BudgetLedger


_UNBOOKED: contextvars.ContextVar[str | None] = contextvars.ContextVar("gsd_unbooked", default=None)


@contextmanager
def unbooked(reason: str):
    """Within this block the booking hooks book nothing (they return None): for DP runs on data that is
    not private, e.g. the synthetic neighbours of an audit. ``reason`` says which data and why."""
    if not reason or not str(reason).strip():
        raise GSDError("unbooked() needs the reason the data is not private")
    token = _UNBOOKED.set(str(reason))
    try:
        yield
    finally:
        _UNBOOKED.reset(token)


def _booking_off() -> bool:
    return _UNBOOKED.get() is not None


def ledger(location: str | os.PathLike | None = None) -> BudgetLedger:
    """The ledger at ``location`` (default :func:`default_location`)."""
    return BudgetLedger(location)


def book_dpgsd(private, epsilon: float, *, releases: int = 1, mechanism: str = "sequential", dp: bool = True,
               what: str = "DP-GSD ranking", ledger_location=None) -> dict | None:
    """Book ``releases`` epsilon-DP DP-GSD draws of ``private`` (a source or spec) before they happen:
    basic (releases x epsilon, delta 0) and the Rényi curve :func:`pure_dp_curve`. The ``matrix``
    (Gibbs) mechanism has no proven guarantee: booked at its nominal epsilon, marked, with no curve
    (a data set with a budget refuses it)."""
    if _booking_off():
        return None
    exact = mechanism != "matrix"
    return BudgetLedger(ledger_location).book(
        data_identity(private), what=what, mechanism=f"DP-GSD {mechanism}, {releases} release(s) x epsilon {float(epsilon):g}",
        epsilon=float(epsilon) * int(releases), delta=0.0, rdp=pure_dp_curve(epsilon, releases) if exact else None,
        dp=dp, guarantee=exact)


def book_training(private, event, *, epsilon: float, delta: float, method: str, mechanism: str, dp: bool = True,
                  booking_id: str | None = None, pure_epsilon: float = 0.0, what: str | None = None, ledger_location=None) -> dict | None:
    """Book a private training on ``private`` (its training part; the whole data set is charged) before
    its first step: ``event`` is its dp-accounting event (all its steps), ``epsilon`` what the run is
    accounted at ``delta`` in all. ``pure_epsilon``: a pure-DP release of the same run composed with
    the training (a DP estimate of the set's size), added to the curve as :func:`pure_dp_curve`.
    ``booking_id``: the same id for a resumed run (booked once)."""
    if _booking_off():
        return None
    curve = event_curve(event)
    if pure_epsilon:
        curve = [a + b for a, b in zip(curve, pure_dp_curve(pure_epsilon))]
    return BudgetLedger(ledger_location).book(
        data_identity(private), what=what or f"training ({method})", mechanism=mechanism, epsilon=epsilon, delta=delta,
        rdp=curve, dp=dp, booking_id=booking_id)


def book_training_run(config, private, event, epsilon: float, mechanism: str, secret, out=None, resume: bool = False,
                      pure_epsilon: float = 0.0) -> dict:
    """``gsd train``'s hook (:func:`gsd_cli.train.train`, process 0, after the noise is calibrated and
    before the first step): :func:`book_training` under an id derived from the run's secret seed, so a
    resumed run is booked once. A run with ``--insecure-seed`` is not DP but is booked all the same
    (the safe side: its outputs still depend on the private data). Refused: the new run's folder,
    still empty, is removed."""
    try:
        return book_training(private, event, epsilon=epsilon, delta=config.delta, method=config.method, mechanism=mechanism,
                             dp=config.private_seed is None, booking_id=booking_id_of_secret(secret), pure_epsilon=pure_epsilon)
    except BudgetExceeded:
        if out is not None and not resume:
            try:
                Path(out).rmdir()  # only when empty
            except OSError:
                pass
        raise


def audit_booking(config, insecure_seed: int | None = None):
    """``gsd audit --private``'s hook: a function ``book(event, epsilon)`` that books the audited
    training (:func:`gsd_cli.audit.audit_training` calls it before its first step) on
    ``config.private``: its real examples train beside the canaries under the accounted mechanism,
    so the audit is a DP release about them. With ``insecure_seed``: booked, marked not DP."""

    def book(event, epsilon: float) -> dict:
        return book_training(config.private, event, epsilon=epsilon, delta=config.delta, method=config.method, what=f"audit of {config.method}",
                             mechanism=f"privacy audit: {config.method} beside canaries", dp=insecure_seed is None)

    return book


def book_opacus(private, noise_multiplier: float, sample_rate: float, steps: int, delta: float, *, method: str = "gep",
                residual: bool = True, accountant: str = "rdp", dp: bool = True, ledger_location=None) -> dict:
    """Opt-in hook for a training script that uses gsd's Opacus adapter (:mod:`gsd_cli.integrations.opacus`) or Opacus
    itself: book its planned run (``steps`` Poisson-subsampled steps at rate ``sample_rate`` and
    multiplier ``noise_multiplier``; ``method`` ``"gep"`` as :func:`gsd_cli.integrations.opacus.gep_event`, or
    ``"dpsgd"``) on ``private`` **before** training, so that a run past the budget is refused
    (:class:`BudgetExceeded`) before any step."""
    from ..accountant import dpsgd_step_event, epsilon_of, gep_step_event, training_event

    if method == "gep":
        step = gep_step_event(noise_multiplier, noise_multiplier if residual else None)
    elif method == "dpsgd":
        step = dpsgd_step_event(noise_multiplier)
    else:
        raise GSDError(f"book_opacus: method must be 'gep' or 'dpsgd' (got {method!r})")
    event = training_event(step, sample_rate, steps)
    eps = epsilon_of(event, delta, accountant)
    return book_training(private, event, epsilon=eps, delta=delta, method=f"opacus {method}",
                         mechanism=f"Opacus {method}: {steps} Poisson-subsampled steps, q={sample_rate:g}, sigma={noise_multiplier:g}",
                         dp=dp, ledger_location=ledger_location)


def booking_id_of_secret(secret: int | str, what: str = "train") -> str:
    """A booking id derived one-way from a run's secret seed (SHA-256): the same run (resumed) gets the
    same id, and the id says nothing about the seed."""
    return hashlib.sha256(f"gsd-booking:{what}:{secret}".encode()).hexdigest()[:32]


def book_ranking(private, privacy, repeats: int = 1, *, ledger_location=None) -> dict:
    """Book a DP-GSD ranking of ``private`` before its private draw: ``privacy`` is the ranking's
    :class:`gsd_cli.ranking.config.PrivacySettings`; with ``repeats`` R > 1, ``shared`` repeats draw
    once (one release) and ``fresh`` ones R times (R releases). Drawn with ``insecure_seed``: booked,
    marked not DP."""
    releases = int(repeats) if (repeats > 1 and privacy.dp_repeats == "fresh") else 1
    return book_dpgsd(private, float(privacy.epsilon), releases=releases, mechanism=privacy.mechanism,
                      dp=privacy.insecure_seed is None, ledger_location=ledger_location)


def publishable(status: list[dict]) -> list[dict]:
    """Only the totals of :meth:`BudgetLedger.status` (no runs, commands, times or curves)."""
    out = []
    for s in status:
        sp = s["spent"]
        out.append({"name": s["name"], "budget": s["budget"], "runs": sp["runs"],
                    "spent": {k: sp[k] for k in ("basic_epsilon", "basic_delta", "renyi_epsilon", "renyi_epsilon_fixed", "delta", "guarantee")},
                    **({"remaining": s["remaining"]} if "remaining" in s else {})})
    return out


def status_json(status: list[dict], *, publishable_only: bool = False, location: str = "") -> dict:
    """The JSON of ``gsd budget show``: the data sets, how spending composes, whether it is private."""
    sets = publishable(status) if publishable_only else [{**s, "spent": {k: v for k, v in s["spent"].items() if k != "rdp"},
                                                         "runs": [{k: v for k, v in r.items() if k != "rdp"} for r in s["runs"]]}
                                                        for s in status]
    return {
        "publishable": publishable_only,
        **({} if publishable_only else {"note": PRIVATE_NOTE, "ledger": location}),
        "composition": ("privacy filter: a run is admitted when basic composition (Rogers et al. 2016, Thm 5.1; "
                        "delta_B/2) or the Rényi filter (Feldman and Zrnic 2021, Thm 3.1, over the RDP orders with "
                        "delta_B/(2 x orders)) keeps the data set within its budget"),
        "orders": len(ORDERS),
        "datasets": sets,
    }
