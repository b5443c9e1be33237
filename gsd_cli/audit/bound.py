"""The statistics of an audit: the one-run bound of Steinke, Nasr and Jagielski (2023) and
Clopper-Pearson bounds for a two-hypothesis distinguishing test.

**One-run audit** (T. Steinke, M. Nasr, M. Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023, arXiv:2305.08846). m canaries are each included independently with probability 1/2,
the mechanism runs once, and the auditor guesses "in" for the k+ highest scores, "out" for the k-
lowest, and abstains on the rest: r = k+ + k- guesses, W of them correct. Their Theorem 5.2 (the
(epsilon, delta) form of the main Theorem 3.1): if the mechanism is (epsilon, delta)-DP then for
every v,

    P[W >= v] <= beta(v) + 2 m delta * alpha(v),    W' ~ Binomial(r, e^eps / (1 + e^eps)),
    beta(v)  = P[W' >= v],
    alpha(v) = max_{i = 1..v} (1 / i) * P[v - i <= W' < v].

(For delta = 0 this is Theorem 3.1: W is stochastically dominated by W', the number of correct
answers of r independent randomized responses with epsilon.) The right-hand side is a p-value for
the hypothesis "the mechanism is (epsilon, delta)-DP" given v observed correct guesses; it grows with
epsilon, and the empirical lower bound is the largest epsilon that the audit rejects at level
1 - confidence (bisection on epsilon). :func:`one_run_p_value` and :func:`one_run_epsilon` implement
it from the statement above, with scipy's binomial law.

The number of guesses must be fixed before the scores are seen. :func:`audit_epsilon` tries a small
fixed grid of guess counts and splits the error probability between them (Bonferroni), so the best
of them is still a valid 95% bound.

**Distinguishing test** (for DP-GSD): N draws under each of two neighbouring inputs D, D' and a
rejection region S. Pure epsilon-DP implies P_D[S] <= e^eps P_D'[S] and the same with D and D'
swapped; with Clopper-Pearson bounds on both probabilities (confidence split over the tests),
epsilon >= log(lower(P_D[S]) / upper(P_D'[S])) holds at the stated confidence.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats

from ..errors import GSDError


def rr_accuracy(epsilon: float) -> float:
    """e^eps / (1 + e^eps): the accuracy of epsilon-DP randomized response (computed stably)."""
    return float(1.0 / (1.0 + math.exp(-epsilon)))


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Theorem 5.2 of Steinke, Nasr, Jagielski (2023): an upper bound on P[W >= v] for an
    (epsilon, delta)-DP mechanism audited with ``m`` canaries and ``r`` guesses (see the module
    docstring), capped at 1: the p-value of ``v`` correct guesses."""
    if not 0 <= v <= r <= m:
        raise GSDError(f"need 0 <= correct ({v}) <= guesses ({r}) <= canaries ({m})")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise GSDError(f"need epsilon >= 0 and 0 <= delta <= 1 (got {epsilon}, {delta})")
    if v == 0:
        return 1.0
    p = rr_accuracy(epsilon)
    beta = float(stats.binom.sf(v - 1, r, p))  # P[W' >= v]
    alpha = 0.0
    if delta > 0:
        # P[v - i <= W' < v] for i = 1..v: cumulative sums of the pmf below v
        below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, p))  # index i-1 -> P[v-i <= W' <= v-1]
        alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(1.0, beta + 2 * m * delta * alpha)


def one_run_epsilon(m: int, r: int, v: int, delta: float, confidence: float = 0.95, eps_max: float = 100.0) -> float:
    """The largest epsilon that ``v`` correct out of ``r`` guesses (``m`` canaries) rejects at
    ``confidence``: sup{eps : p-value(eps) < 1 - confidence}, by bisection (0 when none)."""
    level = 1.0 - confidence
    if one_run_p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < level:
        lo, hi = hi, 2 * hi
        if hi > eps_max:
            return eps_max
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, delta) < level:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-6:
            break
    return lo


@dataclass
class AuditResult:
    """What an audit found: the empirical lower bound beside the claim."""

    method: str
    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    canaries: int
    guesses: int
    correct: int
    confidence: float = 0.95
    details: dict | None = None

    @property
    def consistent(self) -> bool:
        """The audit does not contradict the claim (it can never prove it)."""
        return self.epsilon_lower_bound <= self.claimed_epsilon

    def to_dict(self) -> dict:
        return {**asdict(self), "consistent": self.consistent}


def guess_grid(m: int) -> list[int]:
    """The guess counts tried (per side: top-k "in", bottom-k "out"), fixed before any score."""
    ks = sorted({k for k in (m // 100, m // 40, m // 16, m // 6, m // 2) if k >= 1})
    return ks or [max(1, m // 2)]


def audit_epsilon(scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = 0.95,
                  grid: list[int] | None = None) -> tuple[float, int, int]:
    """One-run bound from canary ``scores`` (higher = more likely "in") and the truth ``included``:
    for each k of the grid, guess the k highest "in" and the k lowest "out"; the error probability
    1 - confidence is split evenly over the grid. Returns (epsilon lower bound, guesses, correct) of
    the best k."""
    scores = np.asarray(scores, dtype=float)
    included = np.asarray(included, dtype=bool)
    m = scores.shape[0]
    grid = grid or guess_grid(m)
    level = (1.0 - confidence) / len(grid)
    order = np.argsort(-scores, kind="stable")
    best = (0.0, 2 * grid[0], 0)
    for k in grid:
        k = min(k, m // 2)
        if k < 1:
            continue
        correct = int(included[order[:k]].sum() + (~included[order[m - k:]]).sum())
        eps = one_run_epsilon(m, 2 * k, correct, delta, 1.0 - level)
        if eps > best[0] or best[2] == 0:
            best = (eps, 2 * k, correct)
    return best


def clopper_pearson(successes: int, trials: int, level: float) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval of a binomial proportion at confidence 1 - ``level``."""
    lo = 0.0 if successes == 0 else float(stats.beta.ppf(level / 2, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(stats.beta.ppf(1 - level / 2, successes + 1, trials - successes))
    return lo, hi


def distinguishing_epsilon(stat_d: np.ndarray, stat_d2: np.ndarray, thresholds, confidence: float = 0.95) -> tuple[float, dict]:
    """Pure-DP lower bound from draws of a statistic under D (``stat_d``) and its neighbour D'
    (``stat_d2``): for each threshold t (fixed in advance) and both regions {s > t} and {s <= t},
    log(CP-lower(P_D[S]) / CP-upper(P_D'[S])) and the same with D and D' swapped; the confidence is
    split over the 4 |thresholds| tests (Bonferroni; one-sided bounds from two-sided intervals at
    twice the level). Returns the best bound and how it was reached."""
    a, b = np.asarray(stat_d), np.asarray(stat_d2)
    thresholds = list(thresholds)
    level = 2 * (1.0 - confidence) / (4 * len(thresholds))
    best, how = 0.0, {}
    for t in thresholds:
        for region in ("above", "below"):
            ka = int((a > t).sum()) if region == "above" else int((a <= t).sum())
            kb = int((b > t).sum()) if region == "above" else int((b <= t).sum())
            for (k1, n1), (k2, n2), name in (((ka, len(a)), (kb, len(b)), "D over D'"), ((kb, len(b)), (ka, len(a)), "D' over D")):
                lo = clopper_pearson(k1, n1, level)[0]
                hi = clopper_pearson(k2, n2, level)[1]
                if lo > 0 and hi > 0:
                    e = math.log(lo / hi)
                    if e > best:
                        best, how = e, {"threshold": float(t), "region": region, "test": name, "p_lower": lo, "p_upper": hi,
                                        "correct": k1 + (n2 - k2), "trials": n1 + n2}
    return best, how


def best_of_tests(tests, confidence: float = 0.95) -> tuple[float, dict]:
    """The best :func:`distinguishing_epsilon` over several statistics, ``tests`` = ``[(name, stat_d, stat_d2,
    thresholds)]``, the confidence split over every threshold of every statistic (Bonferroni: each statistic's
    share is its number of thresholds). Returns the bound and how it was reached (``statistic`` named)."""
    share = sum(len(t[3]) for t in tests)
    best, how = 0.0, {}
    for name, sa, sb, ts in tests:
        e, h = distinguishing_epsilon(sa, sb, ts, 1 - (1 - confidence) * len(ts) / share)
        if e > best:
            best, how = e, {"statistic": name, **h}
    return best, how


# --- Gaussian DP (Dong, Roth, Su 2019; the auditing method of Nasr et al. 2023) -----------------------

def gdp_delta(epsilon: float, mu: float) -> float:
    """delta(epsilon) of a mu-GDP mechanism: Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)
    (Dong, Roth, Su 2019, Corollary 2.13); a Gaussian mechanism of sensitivity s and noise std sigma
    is (s / sigma)-GDP, exactly."""
    from scipy.stats import norm

    if mu <= 0:
        return 0.0
    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2))


def gdp_epsilon(mu: float, delta: float) -> float:
    """The smallest epsilon with gdp_delta(epsilon, mu) <= delta (0 when mu <= 0 or even epsilon = 0 holds)."""
    from scipy.optimize import brentq

    if mu <= 0 or gdp_delta(0.0, mu) <= delta:
        return 0.0
    hi = 1.0
    while gdp_delta(hi, mu) > delta:
        hi *= 2
    return float(brentq(lambda e: gdp_delta(e, mu) - delta, 0.0, hi, xtol=1e-10))


def gdp_mu_bounds(stat_d: np.ndarray, stat_d2: np.ndarray, confidence: float = 0.95) -> tuple[float, float, float]:
    """``(mu_hat, lower, upper)``: the GDP parameter of a release whose statistic is Gaussian with one
    standard deviation under both neighbours, mu = (mean under D' - mean under D) / sd, from draws under
    each (Nasr et al. 2023, "Tight auditing of differentially private machine learning": fit the
    Gaussian trade-off curve). Confidence interval by the delta method: Var(mu_hat) ~ (1/n1 + 1/n2) +
    mu^2 / (2 (n1 + n2 - 2)) (the mean difference's and the pooled sd's errors), one-sided bounds at
    ``confidence`` each."""
    from scipy.stats import norm

    a, b = np.asarray(stat_d, dtype=float), np.asarray(stat_d2, dtype=float)
    n1, n2 = len(a), len(b)
    sd = math.sqrt(((n1 - 1) * a.var(ddof=1) + (n2 - 1) * b.var(ddof=1)) / (n1 + n2 - 2))
    mu = (b.mean() - a.mean()) / sd
    se = math.sqrt(1 / n1 + 1 / n2 + mu * mu / (2 * (n1 + n2 - 2)))
    z = norm.ppf(confidence)
    return float(mu), float(mu - z * se), float(mu + z * se)
