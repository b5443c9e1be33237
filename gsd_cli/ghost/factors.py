"""Per-layer factors of one chunk of examples, and their storage for all m examples."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Factors:
    """One layer's contribution for a chunk of c examples: ghost pairs ``(A, B)`` (c x T x D, c x T x C,
    with the parameter name, the slice of its rows and an optional transpose) whose per-sample gradient
    is B_i^T A_i; embedding triples; and ``mat`` (c x q): per-sample gradients of the rest, with names."""

    pairs: list = field(default_factory=list)  # (A, B, name, row0, rows)
    embeds: list = field(default_factory=list)  # (idx, B, name)
    mat: list = field(default_factory=list)  # (tensor c x q, name)

    def numel_per_example(self) -> int:
        n = 0
        for A, B, *_ in self.pairs:
            n += A[0].numel() + B[0].numel()
        for idx, B, _ in self.embeds:
            n += idx[0].numel() + B[0].numel()
        for t, _ in self.mat:
            n += t[0].numel()
        return n


def alloc_like(f: Factors, m: int) -> Factors:
    """Empty factors of ``f``'s kinds and shapes for ``m`` examples."""

    def e(t):
        return torch.empty((m,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)

    return Factors(
        pairs=[(e(A), e(B), *rest) for A, B, *rest in f.pairs],
        embeds=[(e(i), e(B), n) for i, B, n in f.embeds],
        mat=[(e(t), k) for t, k in f.mat],
    )


def fill(store: Factors, f: Factors, row: int) -> None:
    """Copy a chunk's factors ``f`` into ``store`` from example ``row`` on."""
    for (SA, SB, *_), (A, B, *_) in zip(store.pairs, f.pairs):
        SA[row : row + A.shape[0]] = A
        SB[row : row + B.shape[0]] = B
    for (SI, SB, _), (I, B, _) in zip(store.embeds, f.embeds):
        SI[row : row + I.shape[0]] = I
        SB[row : row + B.shape[0]] = B
    for (St, _), (t, _) in zip(store.mat, f.mat):
        St[row : row + t.shape[0]] = t


def tensors(f: Factors) -> list[torch.Tensor]:
    return [A for A, *_ in f.pairs] + [B for _, B, *_ in f.pairs] + [i for i, _, _ in f.embeds] + [B for _, B, _ in f.embeds] + [t for t, _ in f.mat]


def rows(f: Factors, r0: int, r1: int) -> Factors:
    """Examples ``r0:r1`` of stored factors (views)."""
    return Factors(
        pairs=[(A[r0:r1], B[r0:r1], *rest) for A, B, *rest in f.pairs],
        embeds=[(i[r0:r1], B[r0:r1], n) for i, B, n in f.embeds],
        mat=[(t[r0:r1], k) for t, k in f.mat],
    )
