"""Package :mod:`gsd_cli.subspace`: from gradients to subspaces. This module holds the top-k subspace, the projection metric and principal angles; :mod:`.krylov` the Krylov top-k; :mod:`.dppca` the DP samplers (exact real matrix Bingham); :mod:`.public_basis` the public sketch of DP-GSD; :mod:`.side` one sample's subspace at a model (gradients, then top-k or the DP draw). Layer: above :mod:`gsd_cli.gradients`, below :mod:`gsd_cli.distance`.

Top-k gradient subspaces and the distance between them (paper 004, Algorithm 1 and Definition 3).

Top-k subspace. G is m x p. When m <= p, eigh(G G^T) = U diag(s^2) U^T and V_k = G^T U_k diag(1/s_k)
(the top-k right singular vectors, the same subspace as the SVD's, at O(m^2 p) instead of a full SVD);
otherwise eigh(G^T G). The Gram matrix is formed in float64: in float32 the subspace is already wrong
(error ~0.1) when s_k / s_1 is near 1e-4. eigh returns ascending order; the *largest* k are taken.
That is ``method="exact"``; ``"randomized"`` is block Krylov with a float64 certificate
(:mod:`gsd_cli.subspace.krylov`: the same V and s, any distance within 1e-7, the exact path when it
cannot certify that), and ``"auto"`` picks by size (:func:`choose_method`).

Projection metric. Paper 004's Definition 3 is the unnormalised (sum_i sin^2 theta_i)^(1/2) =
(k - ||V1^T V2||_F^2)^(1/2), in [0, sqrt(k)]; the values in its tables (all below 1 at k=16) fit the
normalised form, which is what gsd reports:

    d(V1, V2) = sqrt(1 - ||V1^T V2||_F^2 / k)  in [0, 1],

with cos(theta_i) the singular values of V1^T V2 (so Lemma 1's bound carries a factor 1/sqrt(k)).
For two independent uniformly random k-subspaces of R^p, E[d^2] = 1 - k/p exactly.
"""

from __future__ import annotations

import math

import torch

from ..errors import GSDError
from .krylov import KrylovInfo, krylov_top_k, krylov_top_k_gram

#: How :func:`top_k_subspace` finds the top-k subspace (``--subspace-method``).
SUBSPACE_METHODS = ("auto", "exact", "randomized")
#: ``auto`` takes the randomized method from this n = min(m, p) on: on 2 CPU cores (p = 30202, k = 16,
#: benchmarks/bench_subspace.py) exact was faster at m = 1000, randomized 2.5-6x faster at m = 2000.
AUTO_MIN_N = 1500


def _rank_tolerance(s_max: float, m: int, p: int) -> float:
    # Singular values below this are numerically zero: float32 gradients carry relative error
    # ~1e-7, and the float64 Gram's eigenvalues have absolute error ~ m * eps64 * s_1^2.
    return s_max * max(1e-6, math.sqrt(max(m, p) * torch.finfo(torch.float64).eps))


#: Columns of G converted to float64 at a time: the Gram matrix never needs a float64 copy of G.
_BLOCK = 8192


def gram(G: torch.Tensor) -> torch.Tensor:
    """G G^T in float64, accumulated over column blocks (memory O(m * block) beyond G itself)."""
    m, p = G.shape
    K = torch.zeros(m, m, dtype=torch.float64, device=G.device)
    for j in range(0, p, _BLOCK):
        B = G[:, j : j + _BLOCK].to(torch.float64)
        K.addmm_(B, B.T)
    return K


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`SUBSPACE_METHODS`, else a one-line :class:`GSDError`."""
    if method not in SUBSPACE_METHODS:
        raise GSDError(f"--subspace-method must be one of {', '.join(SUBSPACE_METHODS)} (got {method!r})")
    return method


def choose_method(method: str, m: int, p: int, k: int) -> str:
    """``exact`` or ``randomized`` for an m x p matrix and k: ``auto`` takes the randomized method when
    n = min(m, p) >= :data:`AUTO_MIN_N` and the Krylov space (about 9 (k + 16) columns) is at most n / 4."""
    if check_method(method) != "auto":
        return method
    n = min(m, p)
    return "randomized" if n >= AUTO_MIN_N and 36 * (k + 16) <= n else "exact"


#: the error for NaN or infinite per-sample gradients (the pixels were checked when read: it is the model)
NON_FINITE = ("the per-sample gradients are NaN or infinite: the model's outputs or gradients are not finite on these "
              "inputs at its initial weights; check the model's forward and its --weights (gsd models show NAME)")


def top_k_subspace(G: torch.Tensor, k: int, method: str = "auto", info: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k right singular subspace of G (m x p): ``(V, s)`` with V ``(p, k)`` orthonormal, float64.

    ``s`` holds the k largest singular values in descending order. Raises :class:`GSDError` when G
    has fewer than k numerically independent rows (the k-th singular value is zero). ``method``:
    ``exact`` (float64 Gram + eigh), ``randomized`` (certified block Krylov; the exact path when not
    certified), ``auto`` (by size, :func:`choose_method`). ``info``, when given, receives ``method``
    (the one that produced the result), ``fallback`` and, for the randomized method, its certificate.
    """
    if G.ndim != 2:
        raise GSDError(f"the gradient matrix must be 2-d (m x p), got shape {tuple(G.shape)}")
    m, p = G.shape
    if k < 1:
        raise GSDError(f"k must be at least 1 (got {k})")
    if k > min(m, p):
        raise GSDError(f"k={k} is larger than the {m} examples x {p} parameters allow; use --k <= {min(m, p)} or more examples")
    if not bool(torch.isfinite(G).all()):
        raise GSDError(NON_FINITE)
    out = _certified(method, m, p, k, info, lambda kinfo: krylov_top_k(G, k, info=kinfo))
    if out is not None:
        _check_rank(out[1], k, m, p)
        return out
    return _exact_top_k(G, k)  # not chosen, or not certified: the exact path, never an uncertain subspace


def _certified(method: str, rows: int, cols: int, k: int, info: dict | None, krylov):
    """The randomized top-k (``krylov(KrylovInfo)``) where ``method`` chooses it and it is certified,
    else None (the caller's exact path); ``info`` gets ``method``, ``fallback`` and ``krylov``."""
    info = info if info is not None else {}
    info.update(method="exact", fallback=False)
    if choose_method(method, rows, cols, k) != "randomized":
        return None
    kinfo = KrylovInfo()
    out = krylov(kinfo)
    info.update(krylov=kinfo)
    if out is None:
        info["fallback"] = True
        return None
    info["method"] = "randomized"
    return out


def top_k_eigh(K: torch.Tensor, k: int, method: str = "auto", info: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k eigenvectors ``U`` (n x k, float64, largest first) of an explicit n x n Gram matrix K = G G^T
    and ``s`` = the square roots of their eigenvalues: ``exact`` by a full eigh, O(n^3); ``randomized``
    by certified block Krylov on K, O(n^2 k) (the exact eigh when not certified); ``auto``: randomized
    from n >= :data:`AUTO_MIN_N` on. The rank check is the caller's (:func:`_check_rank`)."""
    n = K.shape[0]
    if not bool(torch.isfinite(K).all()):
        raise GSDError(NON_FINITE)
    out = _certified(method, n, n, k, info, lambda kinfo: krylov_top_k_gram(K, k, info=kinfo))
    if out is not None:
        return out
    evals, U = torch.linalg.eigh(K)
    return U.flip(1)[:, :k], evals.flip(0)[:k].clamp_min(0).sqrt()


def _exact_top_k(G: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, p = G.shape
    if m <= p:
        evals, U = torch.linalg.eigh(gram(G))
        evals, U = evals.flip(0)[:k], U.flip(1)[:, :k]
        s = evals.clamp_min(0).sqrt()
        _check_rank(s, k, m, p)
        # G^T U by column blocks, each as (U^T B)^T: row-major friendly (G^T U directly is ~7x slower)
        V = torch.cat([(U.T @ G[:, j : j + _BLOCK].to(torch.float64)).T for j in range(0, p, _BLOCK)]) / s
        # re-orthonormalise (same span): removes the rounding left by the division by s
        V, _ = torch.linalg.qr(V)
    else:
        G64 = G.to(torch.float64)
        evals, W = torch.linalg.eigh(G64.T @ G64)
        evals, V = evals.flip(0)[:k], W.flip(1)[:, :k]
        s = evals.clamp_min(0).sqrt()
        _check_rank(s, k, m, p)
    return V, s


def _check_rank(s: torch.Tensor, k: int, m: int, p: int) -> None:
    tol = _rank_tolerance(float(s[0]), m, p)
    r = int((s > tol).sum())
    if float(s[0]) == 0.0 or r < k:
        raise GSDError(
            f"the gradients span only {r} independent directions, fewer than k={k} "
            f"(duplicate or constant examples?); use --k <= {max(r, 1)} or more varied examples"
        )


def _cross(V1: torch.Tensor, V2: torch.Tensor) -> torch.Tensor:
    if V1.ndim != 2 or V2.ndim != 2 or V1.shape != V2.shape:
        raise GSDError(f"subspace bases must both be p x k with the same shape, got {tuple(V1.shape)} and {tuple(V2.shape)}")
    # by row blocks: a float32 basis of a large model (p x k) is never copied whole to float64; on
    # V1's device (a cached public basis is loaded on the CPU, the private one may be on a GPU)
    C = torch.zeros(V1.shape[1], V2.shape[1], dtype=torch.float64, device=V1.device)
    for i in range(0, V1.shape[0], 1 << 20):
        C += V1[i : i + (1 << 20)].to(torch.float64).T @ V2[i : i + (1 << 20)].to(V1.device, torch.float64)
    return C


def projection_metric(V1: torch.Tensor, V2: torch.Tensor) -> float:
    """Normalised projection metric sqrt(1 - ||V1^T V2||_F^2 / k) in [0, 1] (orthonormal p x k bases)."""
    C = _cross(V1, V2)
    k = C.shape[0]
    return math.sqrt(max(0.0, 1.0 - float((C * C).sum()) / k))


def principal_angles(V1: torch.Tensor, V2: torch.Tensor) -> torch.Tensor:
    """Principal angles (radians, ascending) between span(V1) and span(V2): arccos of the singular values of V1^T V2."""
    cos = torch.linalg.svdvals(_cross(V1, V2)).clamp(0.0, 1.0)
    return torch.arccos(cos)


def uniform_baseline(k: int, p: int) -> float:
    """sqrt(E[d^2]) = sqrt(1 - k/p) for two independent uniformly random k-subspaces of R^p."""
    return math.sqrt(max(0.0, 1.0 - k / p))
