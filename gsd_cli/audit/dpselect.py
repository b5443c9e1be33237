"""Audit of the DP selection (:func:`gsd_cli.distance.dpselect.private_selection`, the default of
``gsd rank --dp`` and of ``gsd train --auto-select --select-epsilon``): a distinguishing test on two
neighbouring row sets, and the exact privacy loss of that pair.

The claim (:mod:`gsd_cli.distance.dpselect`): replacing one private row moves each candidate's
clipped regret u_j by at most tau = regret_clip C^2, so permute-and-flip at epsilon_select =
(1 - score_share) epsilon, p_j = exp(epsilon_select (u_j - max u) / (2 tau)), chooses epsilon_select-DP
(McKenna and Sheldon 2020); the chosen candidate's energy, L1 sensitivity C^2, is released with
Laplace noise of scale C^2 / epsilon_score, epsilon_score = score_share epsilon (Dwork and Roth 2014,
Theorem 3.6): epsilon in all.

Neighbours (replace one row, the relation the rows' claim is made for): two candidates in p = 2
dimensions, W_1 = e_1 and W_2 = e_2, D = {C e_1, C e_2} and D' = {C e_1, C e_1}. By hand: under D
each row is tau short of its best for the other candidate, u(D) = (-tau, -tau) (a tie), energies
(C^2, C^2); under D', u(D') = (0, -2 tau), energies (2 C^2, 0). Permute-and-flip picks candidate 2
with probability 1/2 under D and e^{-epsilon_select} / 2 under D' (a log ratio of exactly
epsilon_select), and its released energy is centred on C^2 against 0 (log ratio up to epsilon_score):
the pair's privacy loss is exactly epsilon, the claim, so a halved noise (``bug="half-scale"``, both
parts at twice the epsilon) doubles it. :func:`exact_selection_loss` computes the loss apart from the
mechanism's code: utilities and energies by hand (numpy), permute-and-flip's law by brute force over
the orders of the candidates, the Laplace part in closed form (the log ratio of two Laplace densities
of one scale lies within +- |mu - mu'| / b and reaches both ends).

Draws: ``draws`` under each neighbour, every one through the real function with secret randomness
(one generator from the OS for the whole audit, or ``insecure_seed``). Statistics, fixed in advance:
T = 1 + clamp(s~, 0, C^2) / C^2 when candidate 2 is chosen, -clamp(s~, C^2, 2 C^2) / C^2 when
candidate 1 is (the likelihood ratio of D over D' grows with T: it is e^epsilon on {T = 2}), at the
thresholds :func:`thresholds`; and a *replay* statistic, whether the release equals the one the code
would make from D with the public seed i of trial i (``bug="public-seed"``: the generator reproduced
from a public seed). :func:`~.bound.distinguishing_epsilon` turns counts into a lower bound
(Clopper-Pearson).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from .bound import AuditResult, best_of_tests

BUGS = ("half-scale", "public-seed")


def select_neighbours(clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(D, D', [W_1, W_2]): rows {C e_1, C e_2} against {C e_1, C e_1}, candidates e_1 and e_2 in p = 2."""
    D = torch.tensor([[clip, 0.0], [0.0, clip]], dtype=torch.float64)
    D2 = torch.tensor([[clip, 0.0], [clip, 0.0]], dtype=torch.float64)
    W = [torch.tensor([[1.0], [0.0]], dtype=torch.float64), torch.tensor([[0.0], [1.0]], dtype=torch.float64)]
    return D, D2, W


def _by_hand(G: np.ndarray, W: list[np.ndarray], clip: float, tau: float) -> tuple[np.ndarray, np.ndarray]:
    """(clipped regret, energies) of the rows G, written apart from gsd_cli.distance.dpselect."""
    norms = np.linalg.norm(G, axis=1, keepdims=True)
    Gc = G * np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    A = np.array([[float((g @ w) @ (g @ w)) for w in W] for g in Gc])  # a_ij = |w_j^T g_i|^2
    regret = np.minimum(A.max(axis=1, keepdims=True) - A, tau)
    return -regret.sum(axis=0), A.sum(axis=0)


def pf_law(u: np.ndarray, c: float) -> np.ndarray:
    """Permute-and-flip's law by brute force: the mean over all K! orders of P[first heads is j], each
    coin heads with probability exp(c (u_j - max u))."""
    p = np.exp(c * (np.asarray(u, float) - max(u)))
    K = len(p)
    law = np.zeros(K)
    perms = list(itertools.permutations(range(K)))
    for order in perms:
        tails = 1.0
        for j in order:
            law[j] += tails * p[j]
            tails *= 1.0 - p[j]
    return law / len(perms)


def exact_selection_loss(D: torch.Tensor, D2: torch.Tensor, W: list[torch.Tensor], epsilon: float, clip: float,
                         regret_clip: float, score_share: float) -> float:
    """max over outputs (j, s) of |log P_D(j, s) - log P_D'(j, s)|: permute-and-flip's law on each
    side by brute force (:func:`pf_law`), then the chosen energy's Laplace densities of scale
    C^2 / epsilon_score (one chosen candidate: L1 sensitivity C^2): for output j the log ratio is
    L_j + (|s - mu'_j| - |s - mu_j|) / b, whose largest absolute value over s is |L_j| + |mu_j - mu'_j| / b."""
    w = [x.numpy() for x in W]
    tau = regret_clip * clip * clip
    u, s = _by_hand(D.numpy(), w, clip, tau)
    u2, s2 = _by_hand(D2.numpy(), w, clip, tau)
    eps_sel, eps_score = epsilon * (1 - score_share), epsilon * score_share
    c = eps_sel / (2 * tau)
    P, P2 = pf_law(u, c), pf_law(u2, c)
    b = clip * clip / eps_score
    return max(abs(math.log(P[j] / P2[j])) + abs(s[j] - s2[j]) / b for j in range(len(w)))


def thresholds() -> list[float]:
    """The thresholds of the T test, public and fixed before any draw (T in [-2, -1] or [1, 2])."""
    return [2 - 1e-9, 1.5, 0.0, -1.5, -2 + 1e-9]


def audit_dp_select(epsilon: float = 2.0, *, draws: int = 2000, clip: float = 1.0, regret_clip: float | None = None,
                    score_share: float | None = None, insecure_seed: int | None = None, bug: str | None = None,
                    confidence: float = 0.95) -> AuditResult:
    """Audit the DP selection at ``epsilon`` (pure DP) with ``draws`` releases under each neighbour
    (module docstring), at gsd rank's settings unless ``regret_clip`` / ``score_share`` are given.
    ``details["exact_loss"]``: the pair's exact privacy loss (the claim itself for correct code)."""
    from ..distance.dpselect import REGRET_CLIP, SCORE_SHARE, check_settings, private_selection
    from ..privacy.randomness import private_rng
    from .dpgsd import check_draw_audit

    check_draw_audit(epsilon, draws, insecure_seed, bug, BUGS, "DP selection")
    rc = REGRET_CLIP if regret_clip is None else regret_clip
    share = SCORE_SHARE if score_share is None else score_share
    check_settings(1, rc, share)
    D, D2, W = select_neighbours(clip)
    rng = private_rng("audit-dp-select", insecure_seed)
    eps_used = 2 * epsilon if bug == "half-scale" else epsilon  # the bug: both parts' noise halved

    def release(G: torch.Tensor, gen) -> tuple[int, float]:
        sel = private_selection(G, W, eps_used, clip, regret_clip=rc, top=1, score_share=share, rng=gen)
        return sel.chosen[0], sel.scores[0]

    def draw(G: torch.Tensor, i: int) -> tuple[int, float]:
        # the bug: the generator reproduced from trial i's public seed, the same for D and D'
        return release(G, np.random.default_rng(i) if bug == "public-seed" else rng)

    a = [draw(D, i) for i in range(draws)]
    b = [draw(D2, i) for i in range(draws)]
    ref = [release(D, np.random.default_rng(i)) for i in range(draws)]
    c2 = clip * clip

    def T(rel) -> np.ndarray:
        return np.array([1 + min(max(s, 0.0), c2) / c2 if j == 1 else -min(max(s, c2), 2 * c2) / c2 for j, s in rel])

    def replay(rel) -> np.ndarray:
        return np.array([float(j == rj and abs(s - rs) <= 1e-9 * max(c2, 1.0)) for (j, s), (rj, rs) in zip(rel, ref)])

    ts = thresholds()
    tests = [("T", T(a), T(b), ts), ("replay", replay(a), replay(b), (0.5,))]
    best, how = best_of_tests(tests, confidence)  # Bonferroni over every threshold of both statistics
    exact = exact_selection_loss(D, D2, W, epsilon, clip, rc, share)
    eps_sel, eps_score = eps_used * (1 - share), eps_used * share
    details = {"clip": clip, "draws_per_neighbour": draws, "exact_loss": exact, "best_test": how, "bug": bug,
               "regret_clip": rc, "score_share": share, "epsilon_select": eps_sel, "epsilon_score": eps_score,
               "selection_sensitivity": rc * c2, "score_laplace_scale": c2 / eps_score,
               "mechanism": "permute-and-flip, then the chosen energy by the Laplace mechanism",
               "neighbours": "D = {C e1, C e2}, D' = {C e1, C e1}, candidates e1 and e2 (replace one row)",
               "dp_randomness": "insecure seed" if insecure_seed is not None else "operating system"}
    return AuditResult("dp-select", float(epsilon), 0.0, best, 2 * draws, 2 * draws, int(how.get("correct", draws)),
                       confidence, details)


__all__ = ["BUGS", "audit_dp_select", "exact_selection_loss", "pf_law", "select_neighbours", "thresholds"]
