"""What a DP-GSD release can and cannot say, from data-independent quantities only: the guarantee
each mechanism delivers (:func:`mechanism_guarantee`), the bound epsilon m / (2k) on each draw's
concentration (:func:`concentration_bound`) and the distances of a uniformly random subspace
(:func:`uniform_distance_quantiles`). The samplers are :mod:`gsd_cli.subspace.dppca`."""

from __future__ import annotations

import numpy as np



def mechanism_guarantee(mechanism: str, sweeps: int = 10) -> dict:
    """What each mechanism delivers, as the report prints it. Never more than the code delivers."""
    if mechanism == "sequential":
        return {
            "exact": True,
            "delta": 0.0,
            "guarantee": "pure epsilon-DP (exponential mechanism, k exact draws with epsilon/k each, basic composition)",
        }
    return {
        "exact": False,
        "delta": None,
        "guarantee": (
            f"NONE PROVEN: {sweeps} sweeps of a Gibbs sampler (a Markov chain) approximate the matrix Bingham, whose exact "
            "law would be epsilon-DP; with total-variation error eta it would be (epsilon, eta (1 + e^epsilon))-DP, "
            "but eta has no known bound. Use --mechanism sequential for a proven guarantee."
        ),
    }


def concentration_bound(epsilon: float, m: int, k: int) -> float:
    """Data-independent upper bound on the top eigenvalue of each sequential step's B:
    (epsilon/k) / (2 C^2) * ||G||_2^2 <= (epsilon/k) / (2 C^2) * m C^2 = epsilon m / (2k).
    A vector Bingham on the sphere of R^p is close to uniform while this is small against p/2."""
    return epsilon * m / (2.0 * k)


def uniform_distance_quantiles(k: int, p: int, draws: int = 4000, seed: int = 0, qs=(0.005, 0.5, 0.995)) -> list[float]:
    """Quantiles of the projection metric between a fixed k-subspace and a uniformly random one in R^p.

    Exact Monte Carlo in O(k^3) per draw, independent of p: with V1 the first k coordinates and
    V2 = Z (Z^T Z)^(-1/2), Z Gaussian p x k, ||V1^T V2||_F^2 = tr(Z1 (Z1^T Z1 + W)^(-1) Z1^T) where Z1 is
    Z's top k x k block and W = Z2^T Z2 ~ Wishart_k(p - k, I), drawn by Bartlett's decomposition.
    Depends on (k, p) only, so it reveals nothing about the data."""
    rng = np.random.default_rng(seed)
    if p < 2 * k:  # Bartlett needs p - k >= k degrees of freedom: draw V2 = qr(Z) directly (p is small here)
        Q = np.linalg.qr(rng.standard_normal((draws, p, k)))[0]
        d = np.sqrt(np.clip(1.0 - (Q[:, :k, :] ** 2).sum(axis=(1, 2)) / k, 0.0, 1.0))
        return [float(v) for v in np.quantile(d, qs)]
    Z1 = rng.standard_normal((draws, k, k))
    L = np.tril(rng.standard_normal((draws, k, k)), -1)
    dof = p - k - np.arange(k)  # chi-square degrees of freedom on the diagonal
    idx = np.arange(k)
    L[:, idx, idx] = np.sqrt(rng.chisquare(dof, size=(draws, k)))
    W = L @ np.transpose(L, (0, 2, 1))
    S = np.transpose(Z1, (0, 2, 1)) @ Z1 + W
    X = np.linalg.solve(S, np.transpose(Z1, (0, 2, 1)))  # S^-1 Z1^T
    fro2 = np.einsum("nij,nji->n", Z1, X)
    d = np.sqrt(np.clip(1.0 - fro2 / k, 0.0, 1.0))
    return [float(v) for v in np.quantile(d, qs)]
