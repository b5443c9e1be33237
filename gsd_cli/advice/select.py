"""Which public set and which method ``gsd train --auto-select`` trains with, or none: the advice as one call per mode.

:func:`plan` is the non-private advice (the GSD ranking with its noise references and the feature probe) and the DP
selection on GSD (``--select-epsilon`` with another method); :func:`dp_plan` is the DP feature probe's. Both rank
the candidates first (:func:`auto_select`, :func:`advised_selection`), then train with the one the advice keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from ..ranking import Ranking, rank
from ..train.config import TrainConfig
from ..train.splits import private_parts
from .decide import Decision

#: ``gsd train --auto-select``'s ranking model: paper 004's probe network at 224. At the training model's own side
#: (``probe@73`` for 28 and 32 pixel models: about a ninth of the pixels) the held-out benchmark's decisions got
#: worse (docs/validity.md, "The ranking's resolution"), so the advice keeps 224 and saves its cost by caching the
#: public subspaces across runs instead
RANK_MODEL = "probe"

def candidate_sources(candidates: Sequence, catalog=None) -> list:
    """The candidates as sources, one rule for every selection: a catalogue's names resolved by the catalogue, other
    names by :func:`gsd_cli.data.resolve`; a source object as given."""
    from ..data import resolve

    if catalog is not None:
        return [catalog.resolve(c) for c in candidates]
    return [resolve(c) if isinstance(c, str) else c for c in candidates]


def auto_select(private: str, candidates: Sequence[str], *, private_test: str | None = None, catalog=None, **rank_options) -> Ranking:
    """Rank ``candidates`` by GSD to the private *training* part (the test part is never looked at)
    with :func:`gsd_cli.ranking.rank` and its options (``dp=True, epsilon=...`` for the DP selection,
    :mod:`gsd_cli.distance.dpselect`, booked in the privacy ledger). The winner is ``ranking.results[0]``
    (under DP: the DP winner and its released DP energy distance; :func:`gsd_cli.distance.dpselect.released_winner`
    gives both with the noise scale of the score). ``catalog``
    (a :class:`gsd_cli.ranking.catalog.Catalog`) resolves the names it defines."""
    train_part, _ = private_parts(private, private_test, catalog)
    pubs = candidate_sources(candidates, catalog)
    return rank(train_part, pubs, **rank_options)


def advised_selection(private: str, candidates: Sequence[str], method: str = "auto", *, private_test: str | None = None,
                      catalog=None, repeats: int | None = None, references: bool = True, train_settings=None,
                      probe_repeats: int | None = None, notify=None, gate: str = "all", **rank_options):
    """``gsd train --auto-select``'s ranking and decision: ``(ranking, decision)``.

    The ranking (:func:`auto_select`) carries the in-run noise references
    (:func:`gsd_cli.advice.decide.reference_sources`, at the ranking model's input shape, from the public
    ``seed``) and ``repeats`` draws (default :data:`gsd_cli.advice.decide.REPEATS`; one under DP, where each
    fresh draw would spend the selection's epsilon again); :func:`gsd_cli.advice.decide.advise` decides from it,
    the candidates' sizes and label counts, and the private task's declared class count. With
    ``train_settings`` (the run's :class:`gsd_cli.train.TrainConfig`: its model and stage-1 settings), a
    non-private selection for ``auto`` or ``second-phase`` also runs the feature probe
    (:func:`gsd_cli.advice.probe.probe_second_phase`, ``probe_repeats`` draws, default
    :data:`gsd_cli.advice.probe.DRAWS`), which then decides which candidate the second phase takes, or
    none (the decision's ``evidence["probe"]``). ``references=False``
    (``--no-fallback`` under DP, where the references would compete in the private selection): no
    references, no decision (``None``). ``notify(line)`` gets the probe's plan (:func:`probe_plan`, public
    settings only) before it starts: with many repeats it runs for minutes.

    ``gate="helping"`` (``gsd train --auto-select``'s, for ``--method auto`` with the probe): the probe runs
    first, on every candidate the second phase can use; then the candidates whose pretrained features help are
    ranked (with the references) one at a time, the largest gain first, until one is closer than noise: the
    advice takes the largest confident gain among those closer than noise, so this is the same decision as
    ``gate="all"`` (each candidate's probe draws and ranking rows do not depend on the other candidates; an
    exact tie of mean gains aside), without the subspaces of candidates that would not be chosen. The
    ranking's ``not_ranked`` names the others; the decision's evidence keeps their probe figures. Draws stop where
    the test is decided (issue 53): the probe's (:func:`gsd_cli.advice.probe.probe_second_phase`), and each helpful
    candidate's ranking draws (:func:`gsd_cli.advice.gate.draws_until_decided`; ``ranking.stopped``). ``"all"`` ranks every candidate, then probes those
    the advice could choose (:func:`choosable`)."""
    from ..models.spec import resolve_model
    from ..ranking.reference import closer_than_reference, split_references
    from .decide import REFERENCE, REPEATS, advise, describe, is_reference, reference_sources

    if any(is_reference(getattr(c, "name", c)) for c in candidates):
        from ..errors import GSDError

        raise GSDError(f"{REFERENCE} is gsd's own in-run reference; name your candidates otherwise")
    if gate not in ("all", "helping"):
        raise ValueError(f"gate must be 'all' or 'helping' (got {gate!r})")
    dp = bool(rank_options.get("dp"))
    if repeats is None:
        repeats = 1 if dp else REPEATS
    train_part, test_part = private_parts(private, private_test, catalog)
    if dp:  # the model's shape must not be read off the private labels (it sizes the references and the ranking model)
        from ..data import require_declared_classes, with_classes

        require_declared_classes(with_classes(train_part, rank_options["classes"]) if rank_options.get("classes") is not None
                                 else train_part)
    pubs = candidate_sources(candidates, catalog)
    # before the probe trains stage 1 on any candidate (issue 60): the ranking's own check came after it
    from ..train.overlap import refuse_private_candidates

    refuse_private_candidates([train_part, test_part], pubs, dp=dp, examples=int(rank_options.get("examples", 2000)),
                              seed=int(rank_options.get("seed", 0)))
    spec = resolve_model(rank_options.get("model", "probe"))
    references = reference_sources(spec.input_size, spec.channels, int(rank_options.get("examples", 2000)),
                                   train_part.num_classes, int(rank_options.get("seed", 0)), draws=2 if dp else 1,
                                   shapes=_shapes(pubs) if dp else ()) if references else []  # under DP (one draw): more noise
    options = dict(rank_options)
    if repeats != 1:
        options["repeats"] = repeats
    from ..timing import stage

    facts = {getattr(p, "name", str(p)): describe(p) for p in pubs}
    classes = int(train_part.num_classes)
    probing = train_settings is not None and not dp and method in ("auto", "second-phase") and not train_part.multilabel
    examples = int(rank_options.get("examples", 2000))

    def run_probe(sources):
        from .probe import DRAWS as PROBE_REPEATS, ProbeResult, probe_second_phase, start_of

        if notify is not None:  # public: not which candidates are probed
            notify(probe_plan(probe_repeats or PROBE_REPEATS, len(pubs), examples, train_settings, usable_only=gate == "helping"))
        if not sources:
            return ProbeResult([], {}, examples=min(examples, len(train_part)), model=str(train_settings.model),
                               start=start_of(train_settings))
        return probe_second_phase(train_part, sources, train_settings, examples=examples, repeats=probe_repeats or PROBE_REPEATS,
                                  seed=int(rank_options.get("seed", 0)), device=rank_options.get("device"),
                                  progress=rank_options.get("progress"))

    if gate == "helping" and probing and method == "auto" and references:
        from .decide import ALPHA, split_usable
        from .gate import draws_until_decided, unranked

        # the probe first, on every candidate the second phase can use; then the ranking of those it finds helpful
        # alone (with the references): the advice chooses among them (gsd_cli.advice.decide._advise_by_probe)
        by_name = dict(zip(facts, pubs))
        probe = run_probe(list(split_usable(by_name, facts, classes)[0].values()))
        helping = sorted((n for n in facts if n in probe.gains and probe.test(n, ALPHA)[0]),
                         key=lambda n: -probe.mean_gain(n))  # stable: ties keep the given order
        ranking, tried, ranked, stopped, memo = None, [], [], {}, {}  # memo: the private sides and references, computed once
        for name in helping:  # the largest gain first, until one is closer than noise: the advice's choice
            tried.append(name)
            decided = draws_until_decided(rank, train_part, by_name[name], references, repeats, memo, options)
            if decided is not None:  # not closer than noise whatever its remaining draws give: none of them drawn
                stopped[name] = decided
                continue
            ranked.append(name)
            with stage("rankings"):  # every draw is in the memo: this is the repeat ranking of those draws
                ranking = rank(train_part, [*(by_name[n] for n in ranked), *references], memo=memo, **options)
            if closer_than_reference(ranking, name).closer:
                break
        if ranking is None:  # nothing could be chosen: no full ranking
            ranking = unranked(train_part, options, repeats)
        ranking.not_ranked = sorted(set(facts) - set(tried))
        ranking.stopped = stopped
        decision = advise(ranking, method, candidates=facts, private_classes=classes, probe=probe)
        return split_references(ranking), decision
    with stage("rankings"):
        ranking = rank(train_part, [*pubs, *references], **options)
    if not references:  # --no-fallback under DP: the winner among the candidates alone, no advice
        return ranking, None
    # only the candidates the advice could choose are probed: closer than noise and usable by the second phase
    # (the probe decides among those alone, gsd_cli.advice.decide._advise_by_probe, so the decision is the same)
    probe = run_probe(choosable(ranking, pubs, facts, classes)) if probing else None
    decision = advise(ranking, method, candidates=facts, private_classes=classes, probe=probe)
    return split_references(ranking), decision  # the table and the winner are the candidates'; the references apart


def dp_advised_selection(private: str, candidates: Sequence[str], method: str = "auto", *, settings, epsilon: float, delta: float,
                         private_test: str | None = None, catalog=None, seed: int = 0, device=None, insecure_seed: int | None = None,
                         progress=None, classes=None):
    """``gsd train --auto-select --select-epsilon``'s private advice for ``auto`` and ``second-phase``: the DP
    feature probe (:mod:`gsd_cli.advice.dp_probe`) on the private *training* part, booked in the privacy
    ledger (before it draws) at (``epsilon``, ``delta``), the selection's own share of the run's total
    (:func:`gsd_cli.advice.dp_probe.split_budget`). Returns ``(decision, selection)``: the decision and the
    selection's public record (for the run's summary); None for a multi-label task (declared: public), which the
    DP probe does not score (the DP selection on GSD decides there). ``classes``: the run's ``--classes``."""
    from ..data import require_declared_classes, with_classes
    from ..privacy.budget import book_selection
    from .dp_probe import dp_probe_advice

    train_part, test_part = private_parts(private, private_test, catalog)
    if classes is not None:  # --classes: the training's label space
        train_part = with_classes(train_part, classes)
    # issue 60: before anything is trained, booked, cached or printed. The class count decides which candidates are
    # usable, hence M and the noise: it must be declared, never read off the private labels; and no candidate may be
    # the private set (stage 1 trains on it without noise, voiding the probe's premise that its features are public)
    require_declared_classes(train_part)
    pubs = candidate_sources(candidates, catalog)
    from ..train.overlap import refuse_private_candidates

    refuse_private_candidates([train_part, test_part], pubs, dp=True)
    if train_part.multilabel:
        return None

    def book(eps, dlt, curve, mechanism):
        book_selection(train_part, eps, dlt, curve, mechanism, dp=insecure_seed is None)

    return dp_probe_advice(train_part, pubs, settings, method, epsilon=epsilon, delta=delta, seed=seed, device=device,
                           insecure_seed=insecure_seed, book=book, progress=progress)


def choosable(ranking, sources: list, facts: dict, private_classes: int) -> list:
    """The candidate ``sources`` the probe-based advice could choose: closer than the in-run noise
    references with confidence (:func:`gsd_cli.ranking.reference.closer_than_reference`) and usable by
    the second phase (:func:`gsd_cli.advice.decide.second_phase_usable`: the private task's classes, 100
    examples per class). Probing any other candidate cannot change the decision."""
    from ..ranking.reference import closer_than_reference
    from .decide import second_phase_usable

    names = {r.public for r in ranking}
    out = []
    for src in sources:
        name = getattr(src, "name", str(src))
        if name in names and closer_than_reference(ranking, name).closer and second_phase_usable(facts[name], private_classes) is None:
            out.append(src)
    return out


def probe_plan(repeats: int, candidates: int, examples: int, settings, usable_only: bool = False):
    """The feature probe's plan, one line of public settings (a :class:`gsd_cli.train.size.Info`): its
    draws and, at most, the stage-1 trainings they run (only the candidates the advice could choose are
    probed, :func:`choosable`, a private fact not in the line; with ``usable_only``, every candidate the
    second phase can use, a public fact; a stage 1 trained before with the same settings is read from
    :mod:`gsd_cli.train.second_phase.stage1_cache`)."""
    from ..train.second_phase.stage1_fit import LR_FACTORS, STAGE1_CAP
    from ..train.size import Info

    runs = repeats * candidates
    which = "the second phase can use" if usable_only else "the advice could choose"
    mode = getattr(settings, "probe_stage1", None) or "quick"
    lrs = 1 if mode == "quick" or settings.public_lr is not None or not getattr(settings, "public_val", 0.1) else len(LR_FACTORS)
    count = settings.public_examples if settings.public_examples is not None else f"{STAGE1_CAP:,}"
    return Info(f"plan: the feature probe: {repeats} draws, each a linear probe of up to {examples} private examples and, for "
                f"each candidate {which} (of {candidates}), stage 1 of the second phase (--probe-stage1 {mode}: {lrs} learning "
                f"rate(s) x at most {settings.public_epochs} epoch(s), stopping early, on up to {count} public examples): at most "
                f"{runs} stage-1 training(s) (--probe-repeats)")


def _shapes(sources) -> list[tuple[int, int, int]]:
    """(height, width, channels) of each public candidate's first image (public data): noise of these
    shapes joins a private selection's references (:func:`gsd_cli.data.reference.reference_sources`)."""
    out = []
    for src in sources:
        if not hasattr(src, "images") or len(src) == 0:
            continue
        img = np.asarray(src.images([0])[0])
        shape = (int(img.shape[0]), int(img.shape[1]), 1 if img.ndim == 2 else int(img.shape[2]))
        if shape not in out:
            out.append(shape)
    return out


def forced_note(private: str, public: str, method: str, decision, *, private_test: str | None = None, catalog=None,
                classes=None, advice: str | None = None) -> str | None:
    """The warning of ``gsd train --auto-select --no-fallback``, which trains ``method`` with ``public`` (the
    closest candidate) whatever the advice (:mod:`gsd_cli.advice.decide`); None when the advice made the same
    choice. ``decision`` None (under ``--select-epsilon`` ``--no-fallback`` ranks without the noise references,
    so there is no advice): said, and for the second phase whether it can use the candidate at all (its own
    label count and size against the private task's declared classes: public facts). ``classes``: the
    run's ``--classes``; ``advice``: how the line names the advice (default its message; a non-private
    selection's advice holds statistics of the private data and is shown on a ``private:`` line instead)."""
    from .. import data as gdata
    from .decide import describe, second_phase_usable

    reasons = []
    if decision is None:
        reasons.append("without the advice (under --select-epsilon, --no-fallback ranks without the in-run noise "
                       "references, so nothing shows the candidate is closer than noise)")
    elif decision.refused or decision.public != public or decision.method != method:
        reasons.append(f"against the advice ({decision.message if advice is None else advice})")
    if method == "second-phase":
        train_part, _ = private_parts(private, private_test, catalog)
        if classes is not None:
            train_part = gdata.with_classes(train_part, classes)
        source = catalog.resolve(public) if catalog is not None else gdata.resolve(public)
        why = second_phase_usable(describe(source), int(train_part.num_classes))
        if why and (decision is None or advice is not None or why not in decision.message):
            reasons.append(f"the second phase pretrains on the public set's own labels, and {why}")
    if not reasons:
        return None
    return f"--no-fallback: training {method} with {public} " + "; ".join(reasons)


@dataclass(frozen=True)
class Plan:
    """What ``gsd train --auto-select`` trains, from :func:`plan`: ``config`` (the run's settings with the method,
    public set and distance decided), the ``ranking`` (references apart), the advice's ``decision`` (None: none, as
    under ``--select-epsilon --no-fallback``), the ``selection`` record the training books and summarises
    (``Ranking.to_dict()`` with ``advice`` and, under DP, ``dp_winner``), ``error`` (the run must stop: an explicit
    method the advice refused) and ``warning`` (``--no-fallback`` trains against, or without, the advice).
    ``public``: whether the selection is a DP release (its figures may be shown on public lines). The DP feature
    probe (:func:`dp_plan`) has no ranking (None) and states the split of the run's total epsilon (``budget``)."""

    config: TrainConfig
    ranking: Ranking | None
    decision: Decision | None
    selection: dict
    public: bool
    error: str | None = None
    warning: str | None = None
    budget: str | None = None


def refusal(decision, public: bool) -> str:
    """The error of a refused explicit method: the advice's message when the selection is public (DP), else one
    that names no private figure (they were told on the ``private:`` line of the advice)."""
    if public:
        return decision.message
    return (f"--method {decision.method}: no candidate it can use passed the advice (the figures are on the private: line "
            "above); train with --method dpsgd, or add --no-fallback to train with the closest anyway")


def plan(config, private: str, candidates: Sequence[str], *, fallback: bool = True, select_epsilon: float | None = None,
         rank_repeats: int | None = None, probe_repeats: int = 3, private_test: str | None = None, catalog=None, classes=None,
         notify=None, **rank_options) -> Plan:
    """``gsd train --auto-select``'s ranking and decision for ``config`` (a :class:`gsd_cli.train.TrainConfig`):
    :func:`advised_selection` (the feature probe first, ``gate="helping"``, when it follows the advice), then the
    decision applied: with ``fallback`` the advice's method and public set (an explicit method it refuses: ``error``),
    without it the closest candidate whatever the advice (``warning`` says so where they differ). ``select_epsilon``:
    the DP selection on GSD at that epsilon (``rank_options`` gets ``dp``, ``epsilon``); the DP feature probe is
    :func:`dp_advised_selection`. ``rank_options``: :func:`gsd_cli.ranking.rank`'s (model, k, examples, seed, device,
    cache, progress...). The returned ``config`` is checked when it trains (:func:`gsd_cli.train.config.validate`)."""
    from .decide import is_reference

    dp = select_epsilon is not None
    if dp:
        rank_options.update(dp=True, epsilon=select_epsilon, insecure_seed=config.private_seed)
    if classes is not None:
        rank_options.update(classes=classes)
    ranking, decision = advised_selection(private, candidates, config.method, private_test=private_test, catalog=catalog,
                                          repeats=rank_repeats, references=fallback or not dp,
                                          train_settings=config if probe_repeats else None, probe_repeats=probe_repeats or None,
                                          notify=notify, gate="helping" if fallback else "all", **rank_options)
    selection = ranking.to_dict()
    if dp:  # the DP winner and its released score: what a decision may read (DP releases only)
        from ..distance.dpselect import released_winner

        winner = released_winner(ranking)
        selection["dp_winner"] = winner.to_dict() if winner is not None else None
    if decision is not None:
        selection["advice"] = decision.to_dict()
    if fallback:
        if decision.refused:
            return Plan(config, ranking, decision, selection, dp, error=refusal(decision, dp))
        config = replace(config, method=decision.method, public=decision.public,
                         public_distance=decision.distance if decision.public is not None else None)
        return Plan(config, ranking, decision, selection, dp)
    # --no-fallback: the closest candidate whatever the advice, said in a warning when the advice differs
    closest = next((r for r in ranking if not is_reference(r.public)), None)
    method = config.method
    if method == "auto":
        method = decision.method if decision is not None and decision.public is not None else "gep"
    config = replace(config, method=method, public=closest.public, public_distance=closest.distance)
    note = forced_note(private, closest.public, method, decision, private_test=private_test, catalog=catalog, classes=classes,
                       advice=None if dp else "on the private: line above")
    return Plan(config, ranking, decision, selection, dp, warning=note)


def dp_plan(config: TrainConfig, private: str, candidates: Sequence[str], *, select_epsilon: float, total: tuple[float, float],
            fallback: bool = True, private_test: str | None = None, catalog=None, device=None, progress=None,
            classes=None) -> Plan | None:
    """``gsd train --auto-select --select-epsilon`` with the DP feature probe (:func:`dp_advised_selection`): the run's
    ``total`` (epsilon, delta) split between the selection and the training
    (:func:`gsd_cli.advice.dp_probe.split_budget`), the probe booked and drawn, its decision applied (an explicit
    method it refuses: ``error`` with ``fallback``, else the second phase with the first candidate it can use and a
    ``warning``). Nothing to choose, or the advice declines to spend (:mod:`gsd_cli.advice.decline`; public facts):
    nothing spent, the training gets the whole total. None for a multi-label task (the DP selection on GSD decides)."""
    from .dp_probe import split_budget

    train_epsilon, train_delta, selection_delta = split_budget(total[0], total[1], select_epsilon)
    from .decline import declined_plan

    if (declined := declined_plan(config, total, fallback)) is not None:  # public facts: nothing read or booked
        return Plan(**declined)
    advised = dp_advised_selection(private, candidates, config.method, settings=config, epsilon=select_epsilon, delta=selection_delta,
                                   private_test=private_test, catalog=catalog, seed=config.seed, device=device,
                                   insecure_seed=config.private_seed, progress=progress, classes=classes)
    if advised is None:
        return None
    decision, record = advised
    record = {**record, "advice": decision.to_dict(), "total": {"epsilon": total[0], "delta": total[1]}}
    spent = record.get("privacy") is not None
    if not spent:  # nothing to choose (public facts): nothing spent, the training gets the whole total
        train_epsilon, train_delta = total
        record["reads_private"] = False
    config = replace(config, epsilon=train_epsilon, delta=train_delta)
    budget = (f"privacy: the run's total is epsilon {total[0]:g}, delta {total[1]:.3g} (basic composition): the selection "
              + (f"{select_epsilon:g}, delta {selection_delta:.3g}" if spent else "nothing (no candidate to choose)")
              + f"; the training {config.epsilon:g}, delta {config.delta:.3g}")
    if decision.refused and fallback:
        return Plan(config, None, decision, record, True, error=decision.message, budget=budget)
    warning = None
    if decision.refused:  # --no-fallback: the second phase with the first candidate (it can use), against the advice
        forced = decision.public or (candidates[0] if isinstance(candidates[0], str) else candidates[0].name)
        warning = f"--no-fallback: training second-phase with {forced} against the advice ({decision.message})"
        config = replace(config, method="second-phase", public=forced, public_distance=None)
    else:
        config = replace(config, method=decision.method, public=decision.public, public_distance=None)
    return Plan(config, None, decision, record, True, warning=warning, budget=budget)

