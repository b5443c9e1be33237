"""The top-k subspace from the Gram path: V = G^T U diag(1/s) is G^T W for an m x k matrix W, so one
more pass contracts each layer's factors with W (p x k memory, never m x p)."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn

from ..errors import GSDError
from ..gradients import LossFn
from ..subspace import _check_rank
from .budget import DEFAULT_BUDGET, Batches, parse_bytes
from .operator import GhostOperator


def top_k_from_operator(op, k: int, row_norm: str = "none", v_dtype: torch.dtype = torch.float64):
    """Top-k right singular subspace ``(V, s)`` of G (optionally with unit rows), from the Gram matrix
    and one product G^T W: eigh(K) = U diag(s^2) U^T, V = G^T U diag(1/s), re-orthonormalised.

    ``op`` is a :class:`GhostOperator` or :class:`gsd_cli.subspace.dppca.DenseOperator`. ``V`` is p x k in
    ``v_dtype`` (float32 halves the memory of large models; the orthonormalisation runs in float64)."""
    m, p = op.shape
    if k < 1:
        raise GSDError(f"k must be at least 1 (got {k})")
    if k > min(m, p):
        raise GSDError(f"k={k} is larger than the {m} examples x {p} parameters allow; use --k <= {min(m, p)} or more examples")
    if row_norm == "unit":
        n = op.gram().diagonal().sqrt()
        op = op.scaled(torch.where(n > 0, 1.0 / n, torch.ones_like(n)))
    K = op.gram()
    if not bool(torch.isfinite(K).all()):
        from ..subspace import NON_FINITE

        raise GSDError(NON_FINITE)
    evals, U = torch.linalg.eigh(K)
    evals, U = evals.flip(0)[:k], U.flip(1)[:, :k]
    s = evals.clamp_min(0).sqrt()
    _check_rank(s, k, m, p)
    V = op.rmatvec(U / s, out_dtype=v_dtype)
    orthonormalise_(V)
    return V, s


def orthonormalise_(V: torch.Tensor, block: int = 1 << 20) -> torch.Tensor:
    """In place: V <- V R^-1 with R the Cholesky factor of V^T V (float64, accumulated by row blocks);
    the same span as QR without a p x k copy. Two rounds (CholeskyQR2) for full accuracy."""
    for _ in range(2):
        Gm = torch.zeros(V.shape[1], V.shape[1], dtype=torch.float64, device=V.device)
        for i in range(0, V.shape[0], block):
            b = V[i : i + block].to(torch.float64)
            Gm += b.T @ b
        R = torch.linalg.cholesky(Gm, upper=True)
        Rinv = torch.linalg.inv(R)
        for i in range(0, V.shape[0], block):
            V[i : i + block] = (V[i : i + block].to(torch.float64) @ Rinv).to(V.dtype)
    return V


def ghost_subspace(
    model: nn.Module,
    batches: Batches,
    m: int,
    names: Sequence[str],
    k: int,
    *,
    loss: LossFn | None = None,
    device: torch.device | str = "cpu",
    row_norm: str = "none",
    memory_budget: int | str | None = None,
    chunk_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    dp: dict | None = None,
    info: dict | None = None,
):
    """Top-k subspace ``(V, s)`` of the per-sample gradients of ``m`` examples by the Gram path.

    V is p x k: float64 when p*k*8 bytes is at most a quarter of the budget, else float32 (resnet50:
    1.5 GB instead of 3 GB), orthonormal either way. With ``dp`` (as :func:`gsd_cli.distance.side.sample_subspace`)
    the subspace is drawn by :func:`gsd_cli.subspace.dppca.private_top_k_subspace` on the operator, with the
    private generator ``dp["rng"]``, and ``s`` is empty."""
    budget = DEFAULT_BUDGET if memory_budget is None else parse_bytes(memory_budget)
    model = model.to(device)
    op = GhostOperator(model, batches, m, names, loss, device, budget, chunk_size, progress)
    p = op.shape[1]
    v_dtype = torch.float64 if 8 * p * k <= budget // 4 else torch.float32
    if dp is None:
        V, s = top_k_from_operator(op, k, row_norm, v_dtype)
    else:
        from ..subspace.dppca import private_top_k_subspace

        if row_norm == "unit":
            n = op.gram().diagonal().sqrt()
            op = op.scaled(torch.where(n > 0, 1.0 / n, torch.ones_like(n)))
        V = private_top_k_subspace(op, k, dp["epsilon"], dp["clip"], dp["mechanism"], dp["rng"], dp.get("sweeps", 10))
        s = torch.empty(0, dtype=torch.float64)
    if info is not None:
        info.update(op.info)
    return V, s
