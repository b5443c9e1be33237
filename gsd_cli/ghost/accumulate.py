"""The Gram matrix K = G G^T (float64) of all m examples' stored factors, blockwise within a budget."""

from __future__ import annotations

import math

import torch

from ..subspace import gram
from .factors import Factors


def _blocks(m: int, b: int) -> list[tuple[int, int]]:
    return [(i, min(m, i + b)) for i in range(0, m, b)]


def pair_gram(K: torch.Tensor, A: torch.Tensor, B: torch.Tensor, budget: int, eq: torch.Tensor | None = None) -> None:
    """K += [<A_i A_j^T, B_i B_j^T>]_ij (or with A_i A_j^T replaced by token equality), float64, blockwise."""
    m, T = B.shape[0], B.shape[1]
    D = A.shape[2] if A.ndim == 3 else 1
    C = B.shape[2]
    b = int(min(math.sqrt(budget / (24.0 * T * T)), budget / (32.0 * T * (D + C))))
    bl = _blocks(m, max(1, min(m, b)))
    for i0, i1 in bl:
        Bi = B[i0:i1].to(torch.float64).reshape(-1, C)
        Ai = A[i0:i1].reshape(-1) if A.ndim == 2 else A[i0:i1].to(torch.float64).reshape(-1, D)
        for j0, j1 in bl:
            if j0 < i0:
                continue
            Bj = B[j0:j1].to(torch.float64).reshape(-1, C)
            BB = Bi @ Bj.T
            if A.ndim == 2:  # token ids
                BB *= Ai[:, None] == A[j0:j1].reshape(-1)[None, :]
            else:
                BB *= Ai @ A[j0:j1].to(torch.float64).reshape(-1, D).T
            blk = BB.view(i1 - i0, T, j1 - j0, T).sum((1, 3))
            K[i0:i1, j0:j1] += blk
            if j0 != i0:
                K[j0:j1, i0:i1] += blk.T


def gram_add(K: torch.Tensor, f: Factors, budget: int) -> None:
    """K += the Gram matrix of one layer's stored factors ``f`` (all m examples)."""
    for A, B, _, _, _, ghost in f.pairs:
        if ghost:
            pair_gram(K, A, B, budget)
        else:  # the layer's per-sample gradients B_i^T A_i, by blocks of output channels
            m, T, D = A.shape
            C = B.shape[2]
            cb = max(1, min(C, int(budget // (16 * m * D))))
            for c0 in range(0, C, cb):
                Gb = torch.einsum("ntc,ntd->ncd", B[:, :, c0 : c0 + cb], A).reshape(m, -1)
                K += gram(Gb)
    for idx, B, _ in f.embeds:
        pair_gram(K, idx, B, budget)
    for t, _ in f.mat:
        K += gram(t)
