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
from .store import PRIVATE_NOTE, BudgetExceeded, BudgetLedger, say


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


def ready_ledger(location: str | os.PathLike | None = None) -> BudgetLedger | None:
    """The check a DP command makes before any work: the ledger it will book into is usable, or a new
    one can be made where it is asked for (:class:`~gsd_cli.privacy.budget.location.LedgerError`
    otherwise, exit 2). Nothing is created here: a new ledger is made by the first booking (and said
    so), so a run refused before it books leaves none. None within :func:`unbooked`."""
    if _booking_off():
        return None
    led = BudgetLedger(location, create="check")
    try:
        led.check_key()  # an existing ledger's key is at hand (a new ledger makes its own)
    finally:
        led.close()  # a server's connections: a booking opens its own
    return led


def booked_line(booking: dict, name: str, led: BudgetLedger, epsilon: float | None = None) -> str:
    """``booked epsilon E on DATASET in LEDGER``: the public line a DP run prints once it is booked. E
    is the booked epsilon (public: a function of the settings and of DP releases); DATASET the name
    it was given; neither depends on the data's examples."""
    eps = booking["epsilon"] if epsilon is None else epsilon
    return f"booked epsilon {eps:.4g} on {name} in {led.shown}"


def left_line(booking: dict) -> str:
    """What is left of the budgets the booking counts against (``no budget set``, or ``L left``, and
    which data set's budget that is when it is another's): a **private** line, since which budgeted
    sets a run counts against is a function of which examples its data holds (neighbouring sets D and
    D + {x} differ here when a set holding x has a budget)."""
    charged = booking.get("charged") or []
    if not charged:
        return "no privacy budget applies to this data (gsd budget set)"
    tight = min(charged, key=lambda c: c["remaining"]["epsilon"])
    return f"{tight['remaining']['epsilon']:.4g} epsilon left" + (
        " of its budget" if tight["self"] else f" of the budget of {tight['name']}, which shares examples with it")


def _book(private, announce: bool = True, announce_epsilon: float | None = None, ledger_location=None, **kw) -> dict:
    led = BudgetLedger(ledger_location)
    try:
        data = data_identity(private)
        b = led.book(data, **kw)
    finally:
        led.close()
    if announce and not b.get("again"):
        say(booked_line(b, data.name, led, announce_epsilon))
        say(left_line(b), private=True)
    return b


#: what a DP ranking's booking is called, and its mechanism, per DP distance
_DP_DISTANCES = {
    "dp-gsd": ("DP-GSD ranking", "DP-GSD"),
    "dp-energy": ("DP energy ranking", "DP energy distance (Laplace)"),
    "dp-select": ("DP selection", "DP selection (permute-and-flip winner, or peeling exponential mechanism for --top k; "
                                  "Laplace scores of the chosen; with in-run noise references, the Laplace margin over them)"),
}


def book_dpgsd(private, epsilon: float, *, releases: int = 1, mechanism: str = "sequential", dp: bool = True,
               what: str = "DP-GSD ranking", distance: str = "dp-gsd", ledger_location=None) -> dict | None:
    """Book ``releases`` epsilon-DP draws of a DP ranking of ``private`` (a source or spec) before they
    happen: basic (releases x epsilon, delta 0) and the Rényi curve :func:`pure_dp_curve`.
    ``distance``: ``dp-gsd`` (DP-GSD's Bingham draw, ``mechanism`` sequential or matrix), or another
    DP distance (``dp-energy``, ``dp-select``: their own mechanisms; ``mechanism`` does not apply). DP-GSD's
    ``matrix`` (Gibbs) mechanism has no proven guarantee: booked at its nominal epsilon, marked, with
    no curve (a data set with a budget refuses it)."""
    if _booking_off():
        return None
    if distance == "dp-gsd":
        exact, label = mechanism != "matrix", f"DP-GSD {mechanism}"
    else:  # its own mechanism, with its own proof: DP-GSD's --mechanism does not apply
        exact, label = True, _DP_DISTANCES.get(distance, (distance, distance))[1]
    return _book(private, ledger_location=ledger_location, what=what,
                 mechanism=f"{label}, {releases} release(s) x epsilon {float(epsilon):g}",
                 epsilon=float(epsilon) * int(releases), delta=0.0, rdp=pure_dp_curve(epsilon, releases) if exact else None,
                 dp=dp, guarantee=exact)


def book_selection(private, epsilon: float, delta: float, curve, mechanism: str, *, what: str = "DP feature probe", dp: bool = True,
                   ledger_location=None) -> dict | None:
    """Book a DP selection of the public data (``gsd train --auto-select --select-epsilon``'s DP feature
    probe, :mod:`gsd_cli.advice.dp_probe`) on ``private`` before it draws anything: (``epsilon``,
    ``delta``) and its RDP ``curve`` at :data:`ORDERS`. Drawn with ``--insecure-seed``: booked, marked not DP."""
    if _booking_off():
        return None
    return _book(private, ledger_location=ledger_location, what=what, mechanism=mechanism, epsilon=float(epsilon),
                 delta=float(delta), rdp=[float(x) for x in curve], dp=dp)


def book_training(private, event, *, epsilon: float, delta: float, method: str, mechanism: str, dp: bool = True,
                  booking_id: str | None = None, pure_epsilon: float = 0.0, what: str | None = None, ledger_location=None,
                  announce_epsilon: float | None = None, absorbs: str | None = None) -> dict | None:
    """Book a private training on ``private`` (its training part; the whole data set is charged) before
    its first step: ``event`` is its dp-accounting event (all its steps), ``epsilon`` what the run is
    accounted at ``delta`` in all. ``pure_epsilon``: a pure-DP release of the same run composed with
    the training and booked with it (a DP estimate of the set's size), added to the curve as
    :func:`pure_dp_curve`. ``booking_id``: the same id for a resumed run (booked once).
    ``announce_epsilon``: the epsilon the booked line states (default ``epsilon``); ``absorbs``: the
    booking of the same run's size estimate, which this one joins (:meth:`BudgetLedger.book`)."""
    if _booking_off():
        return None
    curve = event_curve(event)
    if pure_epsilon:
        curve = [a + b for a, b in zip(curve, pure_dp_curve(pure_epsilon))]
    return _book(private, ledger_location=ledger_location, announce_epsilon=announce_epsilon,
                 what=what or f"training ({method})", mechanism=mechanism, epsilon=epsilon, delta=delta,
                 rdp=curve, dp=dp, booking_id=booking_id, absorbs=absorbs)


def book_size_estimate(config, private, meta: dict | None = None, *, ledger_location=None) -> dict | None:
    """``gsd train``'s hook before it draws the DP estimate of the private set's size
    (:mod:`gsd_cli.train.size`; process 0), so that no run spends the estimate without booking it and
    no admission turns on an estimate that was not booked:

    * admission decided before the draw: when basic composition admits the whole run at its full
      ``--epsilon`` and ``--delta`` under every budget it counts against (or there is none), the
      training, whose accounted epsilon is at most that, will be admitted too (basic composition is
      monotone), so nothing is booked here and the estimate is booked with the training (one booking);
    * else (only the Rényi filter may admit it, which depends on the curve that the estimate selects)
      the estimate, epsilon_N-DP (the Laplace mechanism), is booked **before** it is drawn (refused:
      nothing is drawn); a training refused afterwards leaves it booked, and that refusal is a
      function of a booked release (post-processing).

    None (nothing booked) in the first case, when the size is declared (``--expected-size``,
    ``--sampling-rate``) or when the run resumes with its own estimate (``meta``: the checkpoint's)."""
    from ..size_budget import size_epsilon

    if _booking_off() or meta is not None or config.expected_size is not None or config.sampling_rate is not None:
        return None
    eps_n = size_epsilon(config.epsilon, config.size_epsilon)
    led = BudgetLedger(ledger_location, create="check")
    try:
        if led.fits_basic(data_identity(private), config.epsilon, config.delta):
            return None
    finally:
        led.close()
    return _book(private, announce=False, ledger_location=ledger_location, what=f"training ({config.method}): size estimate",
                 mechanism=f"Laplace estimate of the private set's size (sensitivity 1), epsilon {eps_n:g}",
                 epsilon=eps_n, delta=0.0, rdp=pure_dp_curve(eps_n), dp=config.private_seed is None)


#: how a training after a non-private selection of its public data is booked (``what``; not DP: gsd budget show)
NON_PRIVATE_SELECTION = "after a non-private selection"


def book_training_run(config, private, event, epsilon: float, mechanism: str, secret, out=None, resume: bool = False,
                      pure_epsilon: float = 0.0, size_booking: dict | None = None, selection_dp: bool = True) -> dict:
    """``gsd train``'s hook (:func:`gsd_cli.train.train`, process 0, after the noise is calibrated and
    before the first step): :func:`book_training` under an id derived from the run's secret seed, so a
    resumed run is booked once. A run with ``--insecure-seed`` is not DP but is booked all the same
    (the safe side: its outputs still depend on the private data). ``epsilon``: the run's total,
    ``pure_epsilon`` its size estimate's part; ``size_booking``: that estimate's own booking
    (:func:`book_size_estimate`), which this one joins when admitted (one booking per run). ``selection_dp``
    False: its public data was chosen by a non-private ranking of the private data (``--auto-select`` without
    ``--select-epsilon``), so the run as a whole is not DP: booked all the same (its epsilon counts), marked not DP
    and named :data:`NON_PRIVATE_SELECTION`. Refused:
    the new run's folder, still empty, is removed, and the message says that the size estimate stays
    booked."""
    booked_apart = size_booking is not None and pure_epsilon > 0
    try:
        return book_training(private, event, epsilon=epsilon - pure_epsilon if booked_apart else epsilon, delta=config.delta,
                             method=config.method, mechanism=mechanism, dp=config.private_seed is None and selection_dp,
                             what=None if selection_dp else f"training ({config.method}) {NON_PRIVATE_SELECTION}",
                             booking_id=booking_id_of_secret(secret), pure_epsilon=0.0 if booked_apart else pure_epsilon,
                             announce_epsilon=epsilon, absorbs=size_booking["id"] if booked_apart else None)
    except BudgetExceeded as e:
        if out is not None and not resume:
            try:
                Path(out).rmdir()  # only when empty
            except OSError:
                pass
        if booked_apart:
            raise BudgetExceeded(f"{e}; the DP estimate of the set's size (epsilon {pure_epsilon:.4g}), drawn before, stays booked") from None
        raise


def audit_booking(config, insecure_seed: int | None = None):
    """``gsd audit --private``'s hook: a function ``book(event, epsilon)`` that books the audited
    training (:func:`gsd_cli.audit.audit_training` calls it before its first step) on
    ``config.private``: its real examples train beside the canaries under the accounted mechanism,
    so the audit is a DP release about them. With ``insecure_seed``: booked, marked not DP."""

    def book(event, epsilon: float) -> dict:
        return book_training(config.private, event, epsilon=epsilon, delta=config.delta, method=config.method, what=f"audit of {config.method}",
                             mechanism=f"privacy audit: {config.method} beside canaries", dp=insecure_seed is None)

    ready_ledger()  # before any work: the ledger it will book into is usable
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


def book_ranking(private, privacy, repeats: int = 1, *, distance: str = "dp-gsd", ledger_location=None) -> dict:
    """Book a DP ranking of ``private`` before its private draw: ``privacy`` is the ranking's
    :class:`gsd_cli.ranking.config.PrivacySettings`, ``distance`` its DP distance (``dp-gsd`` or
    ``dp-energy``, :attr:`gsd_cli.ranking.config.RankConfig.distance_name`); with ``repeats`` R > 1,
    ``shared`` repeats draw once (one release) and ``fresh`` ones R times (R releases). Drawn with
    ``insecure_seed``: booked, marked not DP."""
    releases = int(repeats) if (repeats > 1 and privacy.dp_repeats == "fresh") else 1
    what = _DP_DISTANCES.get(distance, (f"DP ranking ({distance})",))[0]
    if distance == "dp-select":  # which selection mechanism this run uses (gsd_cli.distance.dpselect)
        top = int(getattr(privacy, "top", 1) or 1)
        what = "DP selection: " + ("permute-and-flip winner" if top == 1 else f"top {top} by peeling exponential mechanism") \
            + " and Laplace scores of the chosen"
    return book_dpgsd(private, float(privacy.epsilon), releases=releases, mechanism=privacy.mechanism, what=what, distance=distance,
                      dp=privacy.insecure_seed is None, ledger_location=ledger_location)


def publishable(status: list[dict]) -> list[dict]:
    """Only the totals of :meth:`BudgetLedger.status` (no runs, commands, times or curves, no example
    count and no names of the data sets that share examples)."""
    out = []
    for s in status:
        sp = s["spent"]
        out.append({"name": s["name"], "budget": s["budget"], "runs": sp["runs"],
                    "spent": {k: sp[k] for k in ("runs", "basic_epsilon", "basic_delta", "renyi_epsilon", "renyi_epsilon_fixed", "delta", "guarantee")},
                    **({"remaining": s["remaining"], "overspent": s["overspent"]} if "remaining" in s else {})})
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
