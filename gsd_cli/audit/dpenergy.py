"""Audit of the DP energy distance's Laplace mechanism (:func:`gsd_cli.distance.dpenergy.private_energies`,
the default of ``gsd rank --dp``): a distinguishing test on two neighbouring row sets, and the exact
privacy loss of that pair.

The claim (``gsd_cli.distance.dpenergy``'s module docstring): one private row changes the vector of K
energies s_j = sum_i |W_j^T clip_C(q_i)|^2 by at most 2 C^2 Lambda in L1 norm when it is replaced
(Lambda = lambda_max(sum_j W_j W_j^T), public), so Laplace noise of scale b = 2 C^2 Lambda / epsilon on
each s_j is epsilon-DP on the rows (Dwork and Roth 2014, Theorem 3.6).

Neighbours (replace one row, the relation the rows' claim is made for): two public candidates in
p = 2 dimensions, W_1 = e_1 and W_2 = e_2 (Lambda = 1), D = {C e_2} and D' = {C e_1}. Their energies
are (0, C^2) and (C^2, 0): the L1 distance is 2 C^2, the sensitivity itself, so this pair's privacy
loss is exactly epsilon. :func:`exact_energy_loss` computes it independently of the mechanism's code:
the energies by hand (numpy), then the largest |log f_D(s) - log f_D'(s)| of the two product-Laplace
densities on a grid of outputs that covers both means by many scales.

Draws: ``draws`` under each neighbour, every one through the real function with secret randomness
(one generator from the OS for the whole audit, or ``insecure_seed``). Statistics, fixed in advance:
T = clamp(s~_1, 0, C^2) - clamp(s~_2, 0, C^2), whose likelihood ratio is exp(2 T / b) (so {T = C^2}
is the region where the ratio reaches e^epsilon), at the thresholds :func:`thresholds`; and a
*replay* statistic ||s~ - M(D; seed i)||_1, where M(D; seed i) is the release the code would make
from D with the public seed i of trial i: it has no power against correct code and catches a noise
generator reproduced from a public seed (``bug="public-seed"``). ``bug="half-scale"`` halves the
noise (a wrong sensitivity): the test then bounds epsilon above the claim.
:func:`~.bound.distinguishing_epsilon` turns counts into a lower bound (Clopper-Pearson).
"""

from __future__ import annotations

import numpy as np
import torch

from .bound import AuditResult, best_of_tests

BUGS = ("half-scale", "public-seed")


def energy_neighbours(clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(D, D', [W_1, W_2]): one row C e_2 against one row C e_1, candidates e_1 and e_2 in p = 2."""
    D = torch.tensor([[0.0, clip]], dtype=torch.float64)
    D2 = torch.tensor([[clip, 0.0]], dtype=torch.float64)
    W = [torch.tensor([[1.0], [0.0]], dtype=torch.float64), torch.tensor([[0.0], [1.0]], dtype=torch.float64)]
    return D, D2, W


def _energies_by_hand(G: np.ndarray, W: list[np.ndarray], clip: float) -> np.ndarray:
    norms = np.linalg.norm(G, axis=1, keepdims=True)
    Gc = G * np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return np.array([float(((Gc @ w) ** 2).sum()) for w in W])


def exact_energy_loss(D: torch.Tensor, D2: torch.Tensor, W: list[torch.Tensor], epsilon: float, clip: float,
                      lam: float, n: int = 200001) -> float:
    """max_s |log f_D(s) - log f_D'(s)| of the mechanism's output densities: independent Laplace of
    scale b = 2 C^2 Lambda / epsilon around each pair's energies, computed here by hand. The log ratio
    is a sum over candidates of sum_j (|s_j - mu'_j| - |s_j - mu_j|) / b, so its extremes are the sums
    of each term's extremes, found on a grid of n outputs per candidate reaching 20 scales beyond both
    means (each term is constant outside them)."""
    w = [x.numpy() for x in W]
    mu, mu2 = _energies_by_hand(D.numpy(), w, clip), _energies_by_hand(D2.numpy(), w, clip)
    b = 2.0 * clip * clip * lam / epsilon
    hi = lo = 0.0
    for j in range(len(w)):
        s = np.linspace(min(mu[j], mu2[j]) - 20 * b, max(mu[j], mu2[j]) + 20 * b, n)
        term = (np.abs(s - mu2[j]) - np.abs(s - mu[j])) / b  # this candidate's part of log f_D - log f_D'
        hi, lo = hi + float(term.max()), lo + float(term.min())
    return max(hi, -lo)


def thresholds(clip: float) -> list[float]:
    """The thresholds of the T test, public and fixed before any draw: T's extremes (where the
    likelihood ratio is largest) and three points between."""
    c2 = clip * clip
    return [c2 * (1 - 1e-9), 0.5 * c2, 0.0, -0.5 * c2, -c2 * (1 - 1e-9)]


def _release(G: torch.Tensor, W, epsilon: float, clip: float, lam: float, rng) -> np.ndarray:
    from ..distance.dpenergy import private_energies

    return private_energies(G, W, epsilon, clip, lam, rng)


def audit_dp_energy(epsilon: float = 2.0, *, draws: int = 2000, clip: float = 1.0, insecure_seed: int | None = None,
                    bug: str | None = None, confidence: float = 0.95) -> AuditResult:
    """Audit the DP energy distance's Laplace mechanism at ``epsilon`` (pure DP) with ``draws`` releases
    under each neighbour (module docstring). ``details["exact_loss"]``: the pair's exact privacy loss."""
    from ..distance.dpenergy import energy_sensitivity
    from ..privacy.randomness import private_rng
    from .dpgsd import check_draw_audit

    check_draw_audit(epsilon, draws, insecure_seed, bug, BUGS, "DP energy")
    D, D2, W = energy_neighbours(clip)
    lam = energy_sensitivity(W)  # 1 for these two candidates: public
    noise_lam = lam / 2 if bug == "half-scale" else lam
    rng = private_rng("audit-dp-energy", insecure_seed)

    def draw(G: torch.Tensor, i: int) -> np.ndarray:
        # the bug: the noise generator reproduced from trial i's public seed, the same for D and D'
        gen = np.random.default_rng(i) if bug == "public-seed" else rng
        return _release(G, W, epsilon, clip, noise_lam, gen)

    a = np.stack([draw(D, i) for i in range(draws)])
    b = np.stack([draw(D2, i) for i in range(draws)])
    ref = np.stack([_release(D, W, epsilon, clip, lam, np.random.default_rng(i)) for i in range(draws)])
    c2 = clip * clip

    def T(s: np.ndarray) -> np.ndarray:
        return np.clip(s[:, 0], 0, c2) - np.clip(s[:, 1], 0, c2)

    ts = thresholds(clip)
    tests = [("T", T(a), T(b), ts), ("replay", np.abs(a - ref).sum(1), np.abs(b - ref).sum(1), (1e-9 * max(c2, 1.0),))]
    best, how = best_of_tests(tests, confidence)  # Bonferroni over every threshold of both statistics
    exact = exact_energy_loss(D, D2, W, epsilon, clip, lam)
    details = {"clip": clip, "draws_per_neighbour": draws, "exact_loss": exact, "best_test": how, "bug": bug,
               "laplace_scale": 2.0 * c2 * noise_lam / epsilon, "sensitivity_lambda": lam,
               "neighbours": "D = {C e2}, D' = {C e1}, candidates e1 and e2 (replace one row)",
               "dp_randomness": "insecure seed" if insecure_seed is not None else "operating system"}
    return AuditResult("dp-energy", float(epsilon), 0.0, best, 2 * draws, 2 * draws, int(how.get("correct", draws)),
                       confidence, details)


__all__ = ["BUGS", "audit_dp_energy", "energy_neighbours", "exact_energy_loss", "thresholds"]
