"""Private selection: pick the best of K candidates at a cost of epsilon whatever K is.

A *quality* vector u (one number per candidate, higher is better) whose every coordinate moves by at
most Delta between neighbouring inputs (per-coordinate sensitivity, ``max_r |u_r(D) - u_r(D')| <=
Delta``) is turned into a choice by one of two mechanisms; the caller states Delta and proves it
(:mod:`gsd_cli.distance.dpselect` for the candidates of ``gsd rank --dp``).

**Permute-and-flip** (:func:`permute_and_flip`; McKenna and Sheldon, "Permute-and-Flip: a new
mechanism for differentially private selection", NeurIPS 2020, Algorithm 1). With u* = max_r u_r,
visit the candidates in a uniformly random order and stop at the first r for which a coin with
probability

    p_r = exp( epsilon / (2 Delta) * (u_r - u*) )

lands heads (the best candidate has p = 1, so the walk stops). Their privacy theorem (Sec. 3): this
is epsilon-DP for every quality function of sensitivity Delta. Its expected quality is never below
the exponential mechanism's at the same epsilon, and up to twice as close to u* (their Sec. 4). It
has the law of report-noisy-max with exponential noise Exp(scale 2 Delta / epsilon) on each u_r
(Ding et al., "The permute-and-flip mechanism is identical to report-noisy-max with exponential
noise", 2021; ``tests/test_dp_select.py`` checks the two laws agree). The noise does not grow with K:
the cost is epsilon for one choice among any number of candidates. The scale is tight: two
candidates tied under D and 2 Delta apart under D' (each quality moved by Delta) give the trailing
one probability 1/2 against e^-epsilon / 2, a log ratio of exactly epsilon (tested).

**Top-k by peeling the exponential mechanism** (:func:`peel_top_k`; Durfee and Rogers, "Practical
differentially private top-k selection with pay-what-you-get composition", NeurIPS 2019). k rounds of
the exponential mechanism, each on the candidates not yet picked, each with epsilon/k:
P[r] proportional to exp( (epsilon/k) u_r / (2 Delta) ), epsilon/k-DP per round (McSherry and Talwar
2007; Dwork and Roth 2014, Theorem 3.10). Drawn in one shot: add i.i.d. standard Gumbel noise G_r to
(epsilon/k) u_r / (2 Delta) and report the k largest, in order; Durfee and Rogers (Sec. 4) show the
one-shot Gumbel list has exactly the law of the k peeling rounds (the Gumbel-max trick, round by
round). Accounting: **basic composition** of the k rounds (Dwork and Roth 2014, Theorem 3.16, which
holds for adaptively chosen mechanisms): epsilon in all, pure DP, delta = 0. Durfee and Rogers also
bound the k rounds more tightly as (epsilon', delta)-DP; that bound is not used, the privacy ledger
books pure epsilon.

The monotone case. For a quality function that moves all coordinates the same way between
neighbours (every u_r goes up, or every one down), the exponential mechanism is epsilon-DP with
epsilon/Delta in place of epsilon/(2 Delta) (McSherry and Talwar 2007; Dwork and Roth 2014, the
remark after Theorem 3.10). Neither function here takes that factor, and gsd relies on no monotone
form of permute-and-flip: the general epsilon/(2 Delta) of Algorithm 1 is used, as in McKenna's own
implementation. gsd's ranking could not use it anyway: its neighbours are replace-one on the rows,
where its utility is not monotone (:mod:`gsd_cli.distance.dpselect`).

**Scores** (:func:`laplace_scores`): released values of given (already chosen, so public) candidates,
the Laplace mechanism (Dwork and Roth 2014, Theorem 3.6): noise of scale L1-sensitivity / epsilon on
each value.

Every function takes its generator from the caller: private randomness comes from the operating system
(:func:`gsd_cli.privacy.randomness.private_rng`), never from a public seed.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import GSDError


def _check(u, epsilon: float, sensitivity: float) -> np.ndarray:
    u = np.asarray(u, dtype=np.float64)
    if u.ndim != 1 or len(u) < 1:
        raise GSDError("a private selection needs at least one candidate")
    if not np.all(np.isfinite(u)):
        raise GSDError("a private selection's qualities must be finite numbers")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise GSDError(f"the selection's epsilon must be a positive number (got {epsilon})")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise GSDError(f"the selection's sensitivity must be a positive number (got {sensitivity})")
    return u


def flip_probabilities(u, epsilon: float, sensitivity: float) -> np.ndarray:
    """p_r = exp(epsilon / (2 Delta) (u_r - u*)): each candidate's coin in permute-and-flip."""
    u = _check(u, epsilon, sensitivity)
    return np.exp(epsilon / (2.0 * sensitivity) * (u - u.max()))


def permute_and_flip(u, epsilon: float, sensitivity: float, rng: np.random.Generator) -> int:
    """The index chosen by permute-and-flip (McKenna and Sheldon 2020, Algorithm 1; module docstring):
    epsilon-DP for qualities ``u`` of per-coordinate sensitivity ``sensitivity``. ``rng``: a private
    generator."""
    p = flip_probabilities(u, epsilon, sensitivity)
    for r in rng.permutation(len(p)):
        if p[r] >= 1.0 or rng.random() < p[r]:
            return int(r)
    raise AssertionError("unreachable: the best candidate's coin has probability 1")  # pragma: no cover


def peel_top_k(u, k: int, epsilon: float, sensitivity: float, rng: np.random.Generator) -> list[int]:
    """The k indices, in order, of k rounds of the exponential mechanism at epsilon/k each, each round
    on the candidates not yet picked (Durfee and Rogers 2019; module docstring): one Gumbel draw per
    candidate, the k largest of (epsilon/k) u_r / (2 Delta) + G_r. epsilon-DP by basic composition."""
    u = _check(u, epsilon, sensitivity)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= len(u):
        raise GSDError(f"--top {k}: give a whole number from 1 to the {len(u)} candidates")
    keys = (epsilon / k) * u / (2.0 * sensitivity) + rng.gumbel(size=len(u))
    return [int(i) for i in np.argsort(-keys, kind="stable")[:k]]


def laplace_scores(values, l1_sensitivity: float, epsilon: float, rng: np.random.Generator) -> np.ndarray:
    """``values`` + Laplace(l1_sensitivity / epsilon) on each (Dwork and Roth 2014, Theorem 3.6)."""
    v = _check(values, epsilon, l1_sensitivity)
    return v + rng.laplace(0.0, l1_sensitivity / epsilon, size=len(v))


__all__ = ["flip_probabilities", "laplace_scores", "peel_top_k", "permute_and_flip"]
