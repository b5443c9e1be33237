"""Rankings with error bars: R independent repeats, intervals, win fractions and ties.

One batch of m examples gives one distance per candidate, and candidates whose distances are close
swap places from one draw to the next. :func:`rank_repeats` runs the ranking R times, each repeat
with its own draw of the examples, the random labels and the initial weights w0, and summarises each
candidate over the repeats:

* **mean** distance (candidates are ranked by it), its **sd** (sample standard deviation, ddof=1)
  and a **95% t-interval for the mean**: mean +- t_{0.975, R-1} * sd / sqrt(R) (Student's t over the
  R repeats, :func:`t_interval`);
* the **win fraction**: the fraction of repeats in which the candidate had the smallest distance;
* **ties with the winner**. Within a repeat every candidate is compared with the same private
  subspace, so candidate c and the winner w (lowest mean) are compared by a *paired* test on the
  per-repeat differences d_c(r) - d_w(r): one-sided paired t-test, H0 "c is not farther than w",
  against "c is farther" (:func:`paired_tie_test`). The R-1 p-values of the non-winners are
  Holm-adjusted (family-wise error 5%: the probability that any candidate which is really as close
  as the winner is declared farther is at most 5%), and a candidate whose adjusted p-value is not
  below 0.05 is marked **tied** with the winner. With R=1 no test is possible and nothing is marked.

Seeds: repeat 0 uses ``seed`` itself, so R=1 is exactly the plain :func:`gsd_cli.ranking.rank`;
repeat r > 0 uses :func:`repeat_seed` ``(seed, r)``, for its examples, its random labels and its w0
(under DP the private examples, labels and draw come from a secret generator instead, never from a
seed: see :mod:`gsd_cli.distance.dpgsd`).

Under DP (``dp=True``) the user chooses what repeats cost (``dp_repeats``):

* ``shared``: the private subspace is drawn **once** by the epsilon-DP mechanism (at repeat 0's
  examples, labels and w0) and every repeat compares with it; the repeats vary the public side only
  (public examples and random labels; w0 stays, because a distance between subspaces taken at two
  different w0 means nothing). Total budget: epsilon (post-processing). The intervals then describe
  the public side's sampling, given the one private draw. A distance whose one release fixes every
  candidate's number (the DP energy distance) shows the same distances in every shared repeat: the
  tie test is then not run, and the output says why (:data:`NO_TIE_TEST`). The DP selection releases
  a choice, not distances: repeats are refused (``--top k`` gives a short list).
* ``fresh``: every repeat draws new private examples and labels (secretly), w0 and a new DP sample, so R
  epsilon-DP releases about the same data: total epsilon R * epsilon by basic composition of pure DP
  (delta = 0; :func:`total_epsilon` checks it with dp-accounting).

Cost: the private side of a repeat shares the resolved sources, the model's parameter selection and
the engine that ``auto`` chose in repeat 0; every subspace goes through one in-memory cache
(``memo``, a dict you may pass again to a later call), keyed by everything it depends on, so a
subspace computed before with the same settings (a repeat of an earlier call, the shared DP private
sample, a public side that an earlier non-DP call computed) is reused, not recomputed.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import numpy as np

from .. import data as gdata
from ..distance import distance_flag, is_private
from ..errors import GSDError
from .config import MAX_REPEATS, RankConfig, check_settings  # noqa: F401 (MAX_REPEATS re-exported)
from .pipeline import rank_once
from .results import DP_REPEATS, LEVEL, TIE_ALPHA, TIE_TEST, Ranking, RepeatRanking, RepeatResult


def repeat_seed(seed: int, r: int) -> int:
    """The seed of repeat ``r``: ``seed`` itself for r = 0 (so one repeat is the plain ranking),
    otherwise a 32-bit integer derived from ``(seed, r)`` by numpy's SeedSequence (distinct streams)."""
    if r < 0:
        raise GSDError(f"repeat index must be >= 0 (got {r})")
    if r == 0:
        return int(seed)
    ss = np.random.SeedSequence([int(seed) % 2**64, int(r), 0x67736452])  # "gsdR"
    return int(ss.generate_state(1, np.uint32)[0])


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float, float]:
    """``(mean, sd, low, high)``: Student's t interval for the mean of ``values`` at ``level``.

    sd is the sample standard deviation (ddof=1); the interval is mean +- t_{(1+level)/2, n-1} sd/sqrt(n).
    With one value sd and the interval are NaN (nothing to estimate a spread from)."""
    from scipy import stats

    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n == 0:
        raise GSDError("t_interval needs at least one value")
    mean = float(x.mean())
    if n == 1:
        return mean, math.nan, math.nan, math.nan
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half


def paired_tie_test(candidate: Sequence[float], winner: Sequence[float]) -> float:
    """One-sided p-value of the paired t-test of H0 "mean(candidate - winner) <= 0" against
    "candidate is farther than the winner", over repeats (same index = same private draw).

    All differences equal (sd 0): p = 0 when they are positive, 1 otherwise. NaN with one repeat."""
    from scipy import stats

    c, w = np.asarray(candidate, np.float64), np.asarray(winner, np.float64)
    if c.shape != w.shape:
        raise GSDError("paired_tie_test needs the same number of repeats for both candidates")
    if len(c) < 2:
        return math.nan
    diff = c - w
    if np.all(diff == diff[0]):
        return 0.0 if diff[0] > 0 else 1.0
    return float(stats.ttest_rel(c, w, alternative="greater").pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given; NaN stays NaN)."""
    p = np.asarray(pvalues, np.float64)
    out = np.full(len(p), np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    order = ok[np.argsort(p[ok], kind="stable")]
    n, running = len(order), 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (n - i) * p[j]))
        out[j] = running
    return out.tolist()


def total_epsilon(epsilon: float, repeats: int, dp_repeats: str) -> float:
    """Total epsilon (delta = 0) of a repeated DP ranking: epsilon for ``shared`` (one release, the
    repeats are post-processing) or R * epsilon for ``fresh`` (R pure epsilon-DP releases, basic
    composition; dp-accounting's PLD accountant composes pure-DP releases to the same value, see
    the tests)."""
    if dp_repeats not in DP_REPEATS:
        raise GSDError(f"--dp-repeats must be one of {', '.join(DP_REPEATS)} (got {dp_repeats!r})")
    return float(epsilon) * (1 if dp_repeats == "shared" else int(repeats))
def rank_repeats(
    private: str | gdata.ImageSource = gdata.DEFAULT_PRIVATE,
    publics: Sequence[str | gdata.ImageSource] = gdata.DEFAULT_PUBLIC,
    config: RankConfig | None = None,
    *,
    progress=None,
    memo: dict | None = None,
    cache=None,
    executor=None,
    **options,
) -> RepeatRanking:
    """Rank public candidates over ``config.repeats`` independent repeats, with error bars.

    ``config``: a :class:`gsd_cli.ranking.RankConfig`; or the flat keyword ``options`` of 0.1
    (``repeats`` 5 by default there, ``seed``, ``dp``, ``epsilon``, ``dp_repeats``, ``k``, ``examples``,
    ``model``...), which also override a given ``config``.

    Repeat r runs :func:`gsd_cli.ranking.pipeline.rank_once` with seed :func:`repeat_seed` ``(seed, r)``
    (repeat 0: ``seed`` itself, so its ranking is exactly the plain one), which draws that repeat's
    examples, random labels and initial weights w0.

    Returns a :class:`RepeatRanking`: per candidate the mean distance (the ranking key), sd, 95%
    t-interval for the mean (:func:`t_interval`), win fraction, each repeat's distance, and ``tied``
    (one-sided paired t-test of the per-repeat differences to the winner, Holm-adjusted over the
    candidates, alpha 0.05; never set with one repeat, where no test is possible). ``runs`` holds the
    R plain rankings.

    With a DP distance, ``dp_repeats="shared"`` draws the private DP subspace once (repeat 0's
    examples, labels and w0) and varies the public examples and labels only: total epsilon =
    ``epsilon``. ``"fresh"`` repeats the whole ranking, DP draw included: total epsilon =
    ``repeats * epsilon`` (basic composition of pure DP). ``privacy`` states both and the total.

    ``memo`` (a dict): subspaces computed with the same settings are reused, in this call and in
    later calls given the same dict (which then keeps every subspace: p x k floats each). Without
    one, only the shared private DP sample is kept between repeats.
    """
    t0 = time.perf_counter()
    if config is None:
        config = RankConfig.from_options(**{"repeats": 5, **options})
    elif options:
        config = config.replace(**options)
    repeats, seed, pv = config.repeats, config.seed, config.privacy
    check_settings(config)  # k, examples, repeats (not with the DP selection), epsilon
    if pv.dp_repeats not in DP_REPEATS:
        raise GSDError(f"--dp-repeats must be one of {', '.join(DP_REPEATS)} (got {pv.dp_repeats!r})")
    if not publics:
        raise GSDError("give at least one public candidate (--public NAME ...)")
    # resolved once: every repeat reads the same source objects (and the cache keys on them)
    priv_source = gdata.resolve(private)
    pub_sources = [gdata.resolve(p) for p in publics]
    own = memo is None
    memo = {} if own else memo
    dp = is_private(config.distance_name)
    shared = dp and pv.dp_repeats == "shared"
    # the DP energy distance's one release fixes every distance: shared repeats show it R times, and a
    # tie test on R copies of the same numbers would mean nothing, so it is not run (and the output says so)
    fixed = shared and distance_flag(config.distance_name, "fixed_release")
    engine = config.gradients.engine
    seeds = [repeat_seed(seed, r) for r in range(int(repeats))]
    runs: list[Ranking] = []
    for r, s in enumerate(seeds):
        prog = tagged(progress, r, int(repeats))
        cfg_r = config.replace(repeats=1, seed=seed if shared else s, engine=engine)
        run = rank_once(priv_source, pub_sources, cfg_r, public_seed=s if shared else None, progress=prog, memo=memo,
                        cache=cache, executor=executor)
        if engine == "auto":  # timed once, in repeat 0; every later repeat uses the same engine
            engine = run.engine
        runs.append(run)
        if own:  # memory stays flat: within one call only the shared private DP sample (first entry) recurs
            keep = next(iter(memo.items())) if shared and memo else None
            memo.clear()
            if keep is not None:
                memo[keep[0]] = keep[1]
    return summarise(runs, seeds, pv.dp_repeats if dp else None, seconds=None if dp else time.perf_counter() - t0,
                     tie_test=None if fixed else TIE_TEST)


def tagged(progress, r: int, repeats: int):
    """Draw ``r``'s progress callback: each name tagged ``[r+1/repeats]`` (a set read again in each draw gets lines of
    its own); ``progress`` itself for one draw, None for none."""
    if progress is None or repeats < 2:
        return progress
    tag = f"[{r + 1}/{repeats}] "
    return lambda name, done, total: progress(tag + name, done, total)


#: what a repeated ranking says when its repeats share one release that fixes every distance
NO_TIE_TEST = ("not run: the repeats share one DP release, which fixes every candidate's distance, so every repeat "
               "shows the same numbers and a tie test on them would mean nothing (--dp-repeats fresh draws a release "
               "per repeat, at R x epsilon)")


def summarise(runs: Sequence[Ranking], seeds: Sequence[int], dp_repeats: str | None = None, *, seconds: float | None = 0.0,
              tie_test: str | None = TIE_TEST) -> RepeatRanking:
    """Summarise plain rankings of the same candidates (one per repeat) into a :class:`RepeatRanking`.
    ``tie_test=None``: no tie test (every p-value None, nothing tied) and the ranking says why
    (:data:`NO_TIE_TEST`)."""
    if not runs:
        raise GSDError("nothing to summarise: no repeats")
    first = runs[0]
    names = sorted(x.public for x in first)
    R = len(runs)
    D = np.array([[{x.public: x.distance for x in run}[n] for n in names] for run in runs])  # R x C
    wins = np.bincount(D.argmin(axis=1), minlength=len(names)) / R
    stats = [t_interval(D[:, j]) for j in range(len(names))]
    order = sorted(range(len(names)), key=lambda j: (stats[j][0], names[j]))
    w = order[0]
    raw = [paired_tie_test(D[:, j], D[:, w]) for j in order[1:]] if tie_test is not None else [math.nan] * (len(order) - 1)
    adj = [math.nan] + holm(raw)
    by_name = {n: [{x.public: x for x in run}[n] for run in runs] for n in names}
    rows = []
    for rank_i, j in enumerate(order, 1):
        n = names[j]
        mean, sd, lo, hi = stats[j]
        per = by_name[n]
        angles = np.mean([x.principal_angles_deg for x in per], axis=0) if len({len(x.principal_angles_deg) for x in per}) == 1 else per[0].principal_angles_deg
        p = adj[rank_i - 1]
        rows.append(RepeatResult(
            public=n, distance=mean, rank=rank_i, examples=per[0].examples,
            principal_angles_deg=[round(float(a), 4) for a in angles], seconds=round(sum(x.seconds for x in per), 3),
            winner=rank_i == 1, mean=mean, sd=sd, ci_low=lo, ci_high=hi, win_fraction=float(wins[j]),
            tied=rank_i > 1 and not math.isnan(p) and p >= TIE_ALPHA,
            p_value=None if math.isnan(p) else p, distances=[float(v) for v in D[:, j]],
        ))
    privacy = None
    if first.privacy is not None:
        eps = first.privacy["epsilon"]
        mode = dp_repeats or "fresh"
        privacy = dict(first.privacy)
        privacy.update(
            repeats=R, dp_repeats=mode, releases=1 if mode == "shared" else R,
            epsilon_per_release=eps, total_epsilon=total_epsilon(eps, R, mode),
            composition="one release, the repeats are post-processing" if mode == "shared"
            else f"{R} releases, basic composition of pure DP: total epsilon = {R} x {eps:g}",
        )
    warnings = list(dict.fromkeys(w for run in runs for w in run.warnings))
    base = {f: getattr(first, f) for f in (
        "private", "model", "k", "examples", "labels", "row_norm", "params", "num_params", "device", "engine",
        "private_examples", "uniform_baseline", "sketch", "weights", "peft", "dp", "subspace_method", "metric")}
    return RepeatRanking(
        **base, seed=seeds[0], results=rows, seconds=None if seconds is None else round(seconds, 3), privacy=privacy, warnings=warnings,
        repeats=R, repeat_seeds=[int(s) for s in seeds], dp_repeats=dp_repeats, runs=list(runs),
        tie_test=tie_test or NO_TIE_TEST,
    )
