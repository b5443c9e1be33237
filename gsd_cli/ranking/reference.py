"""The in-run noise references of a ranking, and whether a candidate is closer than them.

``gsd train --auto-select`` (:mod:`gsd_cli.advice.decide`) ranks its candidates beside noise references
(:func:`reference_sources`) and uses a candidate only when it is closer than them with confidence
(:func:`closer_than_reference`): a bar measured in the same run, at the same model, k, m and metric,
which needs no calibration on any benchmark.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..data.reference import REFERENCE, NoiseSource, is_reference, reference_sources  # noqa: F401 (re-exported)
from ..defaults import ADVICE

#: one-sided significance level of "closer than the reference" (:data:`gsd_cli.defaults.ADVICE`)
ALPHA = ADVICE.alpha
#: repeats of the auto-select ranking by default (the paired test needs at least 2)
REPEATS = ADVICE.rank_repeats


@dataclass(frozen=True)
class ReferenceTest:
    """The result of :func:`closer_than_reference` for one candidate: whether it is closer than the in-run noise
    references with confidence (``closer``), the phrase that says how, and the figures (its distance, the closest
    reference's, the repeats, the p-value or, under DP, the released margin and its threshold)."""

    closer: bool
    phrase: str
    figures: dict = field(default_factory=dict)


def split_references(ranking):
    """Move the reference rows of ``ranking`` to ``ranking.references`` (the table and the winner are the
    candidates'; each repeat's distances keep the references' too) and renumber the rest; returns it."""
    ranking.references = [r for r in ranking.results if is_reference(r.public)]
    ranking.results = [r for r in ranking.results if not is_reference(r.public)]
    for i, r in enumerate(ranking.results):
        r.rank, r.winner = i + 1, i == 0
    return ranking


def closer_than_noise(ranking) -> dict[str, tuple[bool, str]]:
    """For each candidate of a ranking that still holds its reference rows: whether it is closer than
    noise (:func:`closer_than_reference`) and the phrase that says how."""
    out = {}
    for r in ranking:
        if not is_reference(r.public):
            t = closer_than_reference(ranking, r.public)
            out[r.public] = (t.closer, t.phrase)
    return out


def reference_line(ranking) -> str:
    """One line on the in-run references of ``ranking`` (kept apart from its candidates: ``ranking.references``)."""
    refs = sorted((r for r in ranking.references if row_distance(r) is not None), key=lambda r: row_distance(r))
    if not refs:
        return f"in-run noise references: {len(ranking.references)}, nothing released about them"
    return (f"in-run noise references ({len(refs)}: Gaussian noise, grey and colour, on several grids): the closest, "
            f"{refs[0].public}, at {row_distance(refs[0]):.4f}; a candidate must be closer with confidence to be used")


def _per_repeat(ranking) -> dict[str, list[float]] | None:
    """Each candidate's distance per repeat (a repeat ranking), else None."""
    runs = getattr(ranking, "runs", None)
    if not runs:
        return None
    out: dict[str, list[float]] = {}
    for run in runs:
        for r in run:
            out.setdefault(r.public, []).append(float(r.distance))
    return out


def closer_than_reference(ranking, name: str) -> ReferenceTest:
    """Whether candidate ``name`` beats the references in ``ranking`` (module docstring: in each draw,
    the closest reference is the bar), a phrase saying how, and the figures (distances, p-value)."""
    rows = {r.public: r for r in ranking}
    if getattr(ranking, "dp", False) or ranking.privacy:  # a private selection: its released winner and margin only
        return _closer_by_release(ranking, name, rows)
    refs = [n for n in rows if is_reference(n)]
    if not refs:
        raise ValueError("internal: the ranking has no in-run reference")
    d = row_distance(rows[name])
    ref_name = min(refs, key=lambda n: row_distance(rows[n]) if row_distance(rows[n]) is not None else math.inf)
    ref = row_distance(rows[ref_name])
    figures = {"distance": d, "reference": ref, "closest_reference": ref_name}
    reps = _per_repeat(ranking)
    if reps is None or len(reps.get(name, [])) < 2:
        figures["repeats"] = 1
        return ReferenceTest(False, f"{name}'s distance {d:.4f} against the closest noise reference's {ref:.4f} from one draw: no "
                             "confidence without repeats (--rank-repeats 3)", figures)
    bar = np.min(np.stack([np.asarray(reps[n]) for n in refs]), axis=0)  # the closest reference in each draw
    diffs = bar - np.asarray(reps[name])
    p = one_sided_p(diffs)
    figures.update(repeats=len(diffs), p_value=p, mean_margin=float(diffs.mean()))
    beats = p < ALPHA
    how = (f"{name} {d:.4f} against the closest noise reference's {ref:.4f} ({ref_name}) over {len(diffs)} repeats "
           f"(one-sided paired t-test on the per-draw margin to the closest reference, p = {p:.3g}{' <' if beats else ' >='} {ALPHA:g})")
    return ReferenceTest(bool(beats), how, figures)


def margin_threshold(scale: float, alpha: float = ALPHA) -> float:
    """t with P(Laplace(scale) > t) = alpha: a released margin above t is above 0 with confidence 1 - alpha
    (for a true margin <= 0, P(margin + noise > t) <= 1/2 exp(-t / scale) = alpha)."""
    return float(scale) * math.log(1.0 / (2.0 * alpha))


def _closer_by_release(ranking, name: str, rows: dict) -> ReferenceTest:
    """Under DP: ``name`` is the selection's winner, not a reference, and its released margin over the best
    reference beyond the gap between two draws of one kind of noise (energy, in C^2 units:
    :func:`gsd_cli.distance.dpselect.reference_margin`, Laplace-noised) is above :func:`margin_threshold`
    of its noise scale. Reads DP releases only (post-processing)."""
    from ..distance.dpselect import released_margin

    figures = {"distance": row_distance(rows[name]) if name in rows else None}
    winner = ranking.winner.public
    if is_reference(winner) or name != winner:
        return ReferenceTest(False, f"the private selection chose {winner}" if is_reference(winner) else
                             f"the private selection did not choose {name}", figures)
    released = released_margin(ranking)
    margin, scale = released.margin, released.laplace_scale
    if margin is None or scale is None:
        return ReferenceTest(False, f"the private selection released no margin of {name} over the noise references", figures)
    t = margin_threshold(scale)
    beats = margin > t
    figures.update(margin=margin, margin_scale=scale, threshold=t)
    return ReferenceTest(bool(beats), f"the private selection chose {name}; its released energy margin over the best noise reference, "
                         f"beyond the gap between two draws of noise, {margin:.3g} C^2, is {'above' if beats else 'not above'} {t:.3g} "
                         f"(Laplace scale {scale:.3g}: one-sided alpha {ALPHA:g})", figures)


def row_distance(row) -> float | None:
    """A ranking row's distance as a float (None where nothing was released about it)."""
    d = getattr(row, "distance", None)
    return None if d is None else float(d)


def one_sided_p(diffs: np.ndarray) -> float:
    """p-value of "mean(diffs) > 0" by a one-sided one-sample t-test; all-equal diffs: 0 if positive, 1 otherwise."""
    from scipy import stats

    if np.allclose(diffs, diffs[0]):
        return 0.0 if diffs[0] > 0 else 1.0
    p = float(stats.ttest_1samp(diffs, 0.0, alternative="greater").pvalue)
    return 1.0 if math.isnan(p) else p


def can_still_pass(observed, draws: int, alpha: float = ALPHA, low: float = -1.0, high: float = 1.0) -> bool:
    """Whether :func:`one_sided_p` over ``draws`` values can still fall below ``alpha`` once the values not drawn yet
    are known, given the ``observed`` ones and that every value lies in [``low``, ``high``] (a probe's gain, a
    difference of two accuracies, in [-1, 1]; a margin between two GSDs, each in [0, 1], too). False: the test is
    decided, it fails whatever the remaining draws give, so drawing them cannot change a decision that rests on it.

    The exact supremum of the t statistic over the completions: for a fixed sum of the remaining values their mean is
    fixed and their spread is least when they are equal, so the best completion puts every remaining value at one c;
    with S and Q the sum and the sum of squares of the observed values and m values to come, t(c) is
    (S + m c) / sqrt(SS(c)) up to a constant, SS quadratic in c, and its one stationary point is c = Q / S (set the
    derivative to zero: the terms in c^2 cancel). So the supremum is at c = Q / S or at an end of [low, high]. The
    test passes when t > t_{1-alpha, draws-1}. :func:`one_sided_p`'s rule for equal values (p = 0 when they are all
    positive) is checked apart. Undecided by a hair (within 1e-9 relative) counts as undecided."""
    from scipy import stats

    x = np.asarray(observed, dtype=np.float64)
    k, n = len(x), int(draws)
    m = n - k
    if m < 0:
        raise ValueError(f"{k} values observed of {n} draws")
    if n < 2:  # one draw: no test, never passes (closer_than_reference, ProbeResult.test)
        return False
    if k == 0:
        return True
    if m == 0:
        return bool(one_sided_p(x) < alpha)
    if np.allclose(x, x[0]) and x[0] > 0 and low <= x[0] <= high:  # the rest equal to the first: p = 0
        return True
    S, Q = float(x.sum()), float((x * x).sum())

    def t(c: float) -> float:
        total = S + m * c
        ss = Q + m * c * c - total * total / n
        if total <= 0:
            return -math.inf
        if ss <= 0:
            return math.inf
        return total / n / math.sqrt(ss / (n * (n - 1)))

    points = [low, high] + ([Q / S] if S != 0 and low <= Q / S <= high else [])
    best = max(t(c) for c in points)
    crit = float(stats.t.ppf(1.0 - alpha, n - 1))
    return not best < crit * (1.0 - 1e-9)
