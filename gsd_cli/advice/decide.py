"""Which method, with which public set, or none, and why: the advice's rules (``gsd train --auto-select``).

Two questions decide it, neither calibrated on any benchmark:

1. **Is the candidate closer than noise?** Every auto-select ranking carries an in-run reference:
   :func:`reference_source`, uniform noise of the ranking model's input shape, ranked like a candidate
   (random labels, the same private draw in each repeat). A candidate *beats the reference* when it is
   closer with confidence: over R >= 2 repeats, a one-sided paired t-test on the per-repeat differences
   (reference minus candidate, the same private draw within a repeat) at :data:`ALPHA`; a single
   non-private draw cannot say so with confidence (the advice asks for repeats). Under DP
   (``--select-epsilon``), the reference is one more candidate of the private selection, and a candidate
   beats it when the DP winner is a real candidate (post-processing of the DP release).
   Whatever the model, k, m, metric or privacy setting, this test is applied: no setting has no rule.

2. **Can the method use it?** GEP uses the public set's gradient subspace (random labels: any public set
   of images); the second phase pretrains on the public set's *own labels*, so a set with fewer classes
   than the private task, or fewer than :data:`PER_CLASS` examples per private class, cannot prepare the
   model however close its gradients. Eligibility is a property of the public sets (sizes and label spaces
   are public), set before any benchmark run (docs/validity.md, held-out benchmark).

3. **Does the method gain from it?** (non-private selections, with the run's settings) The feature
   probe (:mod:`gsd_cli.advice.probe`): stage 1 of the second phase as ``gsd train`` runs it, then a
   linear probe of the private examples on the pretrained features against the untrained model's,
   paired over 3 draws. GSD compares gradient subspaces at the untrained model and did not predict the
   second phase's accuracy on the held-out benchmark's realistic tasks; the probe scores what the
   second phase uses, its labels and size included (:func:`_advise_by_probe`).

``--method auto`` with the probe: the second phase with the eligible candidate that beats the reference
and whose probe gain is above 0 with confidence, the largest such gain; else DP-SGD without public data,
saying why (GEP is not tried: :data:`NO_GEP`). Without the probe (under DP): the second phase with the
closest eligible candidate that beats the reference; else GEP with the closest candidate that beats it;
else DP-SGD without public data, saying why. An explicit
public method keeps its method and takes its closest usable candidate that beats the reference; with
none, :class:`Decision` ``refused`` (the CLI exits 2 unless ``--no-fallback``).

The decision reads the ranking (a release the user already has: non-private, or DP and
post-processed), the public sets' sizes and label counts, and the private task's declared class count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..defaults import ADVICE
from ..ranking.reference import (  # noqa: F401 (re-exported: the advice's vocabulary)
    ALPHA, REFERENCE, REPEATS, NoiseSource, ReferenceTest, closer_than_reference, is_reference,
    reference_line, reference_sources, row_distance,
)

#: the second phase needs at least this many public examples per private class (and as many classes)
PER_CLASS = ADVICE.per_class
#: the order --method auto tries the public methods in
ORDER = ("second-phase", "gep")
FALLBACK = "dpsgd"


@dataclass(frozen=True)
class Decision:
    """What auto-select trains: ``method`` with ``public`` (None: no public data), and why.
    ``refused``: an explicit public method has no usable candidate (the CLI exits 2 unless forced)."""

    method: str
    public: str | None
    fell_back: bool
    message: str
    refused: bool = False
    distance: float | None = None
    reference: float | None = None
    evidence: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Candidate:
    """What the advice knows of a public candidate: public facts only."""

    name: str
    examples: int | None
    classes: int | None  # its own label count (None or < 2: no usable labels)


def describe(source) -> Candidate:
    """A public source's size and own label count."""
    try:
        n = len(source)
    except TypeError:
        n = None
    classes = getattr(source, "num_classes", None)
    if getattr(source, "multilabel", False):
        classes = None
    return Candidate(getattr(source, "name", str(source)), n, classes)


#: the contestant without a candidate when the run starts from scratch (:func:`gsd_cli.advice.probe.start_of`)
UNTRAINED = "the untrained model"


def without(start: str) -> str:
    """How the fallback trains, in words: without public data (from scratch), or from the base alone with no candidate
    (``start``: :func:`gsd_cli.advice.probe.start_of`)."""
    return "without public data" if start == UNTRAINED else f"from {start}, with no candidate"


def second_phase_usable(c: Candidate, private_classes: int) -> str | None:
    """None when the second phase can pretrain on ``c`` for a ``private_classes``-class task, else why not."""
    if c.classes is None or c.classes < 2:
        return f"{c.name} has no labels of its own to pretrain on"
    if c.classes < private_classes:
        return f"{c.name} has {c.classes} classes, fewer than the private task's {private_classes}"
    need = PER_CLASS * private_classes
    if c.examples is not None and c.examples < need:
        return f"{c.name} has {c.examples} examples, fewer than {PER_CLASS} per private class ({need})"
    return None


def split_usable(named: dict, facts: dict[str, Candidate], private_classes: int) -> tuple[dict, dict]:
    """``(usable, why_not)``: the candidates of ``named`` (name -> source, in order) the second phase can
    pretrain on for a ``private_classes``-class task (:func:`second_phase_usable` of their public ``facts``), and
    why each other one cannot. The one rule the probe, the DP probe and ``--warm-cache`` share."""
    why = {n: second_phase_usable(facts[n], private_classes) for n in named}
    return {n: c for n, c in named.items() if why[n] is None}, {n: w for n, w in why.items() if w is not None}


def advise(ranking, method: str = "auto", *, candidates: dict[str, Candidate], private_classes: int, probe=None) -> Decision:
    """The decision (module docstring) for ``method`` (``auto``, ``gep`` or ``second-phase``) from an
    auto-select ``ranking`` that includes the reference rows (:func:`reference_sources`). ``candidates``: each real
    candidate's public facts (:func:`describe`); ``private_classes``: the private task's class count.
    ``probe``: the feature probe (:class:`gsd_cli.advice.probe.ProbeResult`; the non-private advice), which
    decides ``auto`` and ``second-phase`` (:func:`_advise_by_probe`)."""
    order = [r.public for r in ranking if not is_reference(r.public)]
    if not order and probe is None:  # a private selection that chose a noise reference: nothing released about the candidates
        why = f"the private selection chose {ranking.winner.public}" if len(ranking.results) else "no candidates"
        if method == "auto":
            return Decision(FALLBACK, None, True, f"--method auto: training DP-SGD without public data: {why}", evidence={})
        return Decision(method, None, False, f"--method {method}: no candidate is closer than noise ({why}); train with "
                        "--method dpsgd, or add --no-fallback to train with the closest anyway", refused=True, evidence={})
    tested = {n: closer_than_reference(ranking, n) for n in order}
    rows = {r.public: r for r in ranking}
    ref = min((row_distance(r) for r in ranking if is_reference(r.public) and row_distance(r) is not None), default=None)
    evidence = {n: {**t.figures, "beats_reference": t.closer,
                    "second_phase": second_phase_usable(candidates[n], private_classes) if n in candidates else "unknown"}
                for n, t in tested.items()}

    if probe is not None and method in ("auto", "second-phase"):
        unranked = [n for n in getattr(ranking, "not_ranked", None) or () if n in candidates]  # gate="helping" (gsd_cli.advice.select)
        stopped = {n: v for n, v in (getattr(ranking, "stopped", None) or {}).items() if n in candidates}
        for n, st in stopped.items():  # their test decided to fail after st["draws"] draws: not closer than noise
            evidence[n] = {"ranked": False, "stopped": st, "beats_reference": False,
                           "second_phase": second_phase_usable(candidates[n], private_classes)}
        return _advise_by_probe(method, order, tested, rows, ref, evidence, probe, candidates, private_classes, unranked, stopped)

    def pick(m: str) -> str | None:
        for n in order:  # closest first
            if tested[n].closer and (m != "second-phase" or second_phase_usable(candidates[n], private_classes) is None):
                return n
        return None

    def why_none(m: str) -> str:
        close = [n for n in order if tested[n].closer]
        if not close:
            return f"no candidate is closer than noise ({tested[order[0]].phrase})" if order else "no candidates"
        if m == "second-phase":
            return "; ".join(second_phase_usable(candidates[n], private_classes) or "" for n in close)
        return ""

    if method == "auto":
        for m in ORDER:
            n = pick(m)
            if n is not None:
                use = ("pretrains on its own labels: " if m == "second-phase" else "uses its gradient subspace: ")
                return Decision(m, n, False,
                                f"--method auto: {m} with {n} ({m} {use}{tested[n].phrase})",
                                distance=row_distance(rows[n]), reference=ref, evidence=evidence)
        reasons = why_none("gep")
        sp = why_none("second-phase")
        return Decision(FALLBACK, None, True,
                        f"--method auto: training DP-SGD without public data: {reasons or sp}", reference=ref,
                        evidence=evidence)
    if method not in ORDER:
        return Decision(method, None, False, f"--method {method} uses no public data", reference=ref, evidence=evidence)
    n = pick(method)
    if n is not None:
        return Decision(method, n, order[0] != n, f"--method {method} with {n}: {tested[n].phrase}"
                        + (f" (the closest, {order[0]}, cannot be used by {method})" if order[0] != n else ""),
                        distance=row_distance(rows[n]), reference=ref, evidence=evidence)
    return Decision(method, order[0] if order else None, False,
                    f"--method {method}: no candidate it can use is closer than noise ({why_none(method)}); "
                    "train with --method dpsgd, or add --no-fallback to train with the closest anyway",
                    refused=True, distance=row_distance(rows[order[0]]) if order else None, reference=ref,
                    evidence=evidence)


#: why --method auto does not try GEP when the probe decides (the selection tasks of the held-out benchmark)
NO_GEP = ("--method auto does not try GEP: with gsd's pick it did not beat tuned DP-SGD alone on the held-out benchmark's "
          "selection tasks (docs/evidence/validity-log.md, round 1); --method gep uses it")


def _advise_by_probe(method: str, order: list[str], tested: dict, rows: dict, ref, evidence: dict, probe, candidates: dict,
                     private_classes: int, unranked: list[str], stopped: dict | None = None) -> Decision:
    """``auto`` and ``second-phase`` with the feature probe (:mod:`gsd_cli.advice.probe`): among the candidates
    that are closer than noise (:func:`closer_than_reference`) and that the second phase can use
    (:func:`second_phase_usable`), those whose pretrained features beat the untrained model's with
    confidence; the one with the largest gain. None: ``auto`` trains DP-SGD alone, ``second-phase`` is refused.
    ``unranked``: the candidates probed but not ranked (the probe found no gain from them, or the second phase cannot
    use them: ``gate="helping"``, :func:`gsd_cli.advice.select.advised_selection`); ``stopped``: those whose draws
    stopped when their test against the references was decided to fail (never chosen)."""
    stopped = stopped or {}
    evidence["probe"] = probe.to_dict()  # the per-draw figures, beside each candidate's
    verdict = {n: probe.test(n, ALPHA) for n in [*order, *unranked, *stopped] if n in probe.gains}  # (helps, p)
    for n in unranked:
        evidence[n] = {"ranked": False, "second_phase": second_phase_usable(candidates[n], private_classes)}
    for n, (helps, p) in verdict.items():
        evidence[n].update(probe_gain=probe.mean_gain(n), probe_p=p, probe_helps=helps)
    close = [n for n in order if tested[n].closer]
    usable = [n for n in close if n in verdict and second_phase_usable(candidates[n], private_classes) is None]
    helps = [n for n in usable if verdict[n][0]]
    if (unranked or stopped) and not helps:  # the probe ran first: say what it found, then what the ranking of the helpful ones did
        return _no_candidate_by_probe(method, order, tested, rows, ref, evidence, probe, verdict, candidates, private_classes, stopped)
    if helps:
        best = max(helps, key=probe.mean_gain)
        return Decision("second-phase", best, False,
                        f"--method {method}: second-phase with {best} (the second phase pretrains on its own labels: "
                        f"{probe.phrase(best, ALPHA)}; {tested[best].phrase})",
                        distance=row_distance(rows[best]), reference=ref, evidence=evidence)
    if not close:
        why = f"no candidate is closer than noise ({tested[order[0]].phrase})"
    elif not usable:
        far = [n for n in order if n not in close]
        why = "; ".join(second_phase_usable(candidates[n], private_classes) or f"{n}: not probed" for n in close) + (
            f"; not closer than noise: {', '.join(far)}" if far else "")
    else:
        top = max(usable, key=probe.mean_gain)
        why = f"no candidate's pretrained features beat those of {probe.start} with confidence (the best, {top}: {probe.phrase(top, ALPHA)})"
    if method == "auto":
        return Decision(FALLBACK, None, True, f"--method auto: training DP-SGD {without(probe.start)}: {why}; {NO_GEP}",
                        reference=ref, evidence=evidence)
    return Decision(method, order[0], False,
                    f"--method {method}: no candidate the second phase can use helps it ({why}); train with --method dpsgd, "
                    "or add --no-fallback to train with the closest anyway", refused=True,
                    distance=row_distance(rows[order[0]]), reference=ref, evidence=evidence)


def _no_candidate_by_probe(method: str, order: list[str], tested: dict, rows: dict, ref, evidence: dict, probe, verdict: dict,
                           candidates: dict, private_classes: int, stopped: dict | None = None) -> Decision:
    """:func:`_advise_by_probe` without a choice when the probe ran first (``gate="helping"``): ``order`` holds only
    the candidates whose pretrained features help (none of them closer than noise), ``verdict`` every probed one,
    ``stopped`` the helpful ones whose test against the references was decided before their last draw."""
    if order or stopped:  # some help, none is closer than noise
        why = (f"no candidate whose pretrained features beat those of {probe.start} is closer than noise "
               f"({tested[order[0]].phrase if order else stopped_phrase(*next(iter(stopped.items())))})")
    elif verdict:
        top = max(verdict, key=probe.mean_gain)
        why = f"no candidate's pretrained features beat those of {probe.start} with confidence (the best, {top}: {probe.phrase(top, ALPHA)})"
    else:
        why = "; ".join(second_phase_usable(c, private_classes) or f"{n}: not probed" for n, c in candidates.items()) or "no candidates"
    if method == "auto":
        return Decision(FALLBACK, None, True, f"--method auto: training DP-SGD {without(probe.start)}: {why}; {NO_GEP}",
                        reference=ref, evidence=evidence)
    return Decision(method, order[0] if order else None, False,
                    f"--method {method}: no candidate the second phase can use helps it ({why}); train with --method dpsgd, "
                    "or add --no-fallback to train with the closest anyway", refused=True,
                    distance=row_distance(rows[order[0]]) if order else None, reference=ref, evidence=evidence)


def stopped_phrase(name: str, st: dict) -> str:
    """How a candidate's draws stopped (``Ranking.stopped``, :func:`gsd_cli.advice.gate.draws_until_decided`)."""
    margins = ", ".join(f"{m:+.4f}" for m in st["margins"])
    return (f"{name}'s margin to the closest noise reference in {st['draws']} of {st['of']} draws: {margins}; no remaining "
            f"draw could make the one-sided paired t-test pass at {ALPHA:g}, so they were not drawn")
