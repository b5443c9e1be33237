"""TopAgg for DP-SGD (paper 002, DataLens appendix A.1, Algorithm 4): NormTopK after clipping.

Each per-sample gradient is clipped to norm C, then compressed by NormTopK(g, K) (Algorithm 4,
lines 2-8): keep the coordinates of largest magnitude, in decreasing order, as long as the sum of
their squares stays at or below K * ||g||^2 (0 < K <= 1; "add up to right below" the target), and
zero the rest. So ||NormTopK(g)|| <= sqrt(K) ||g|| <= sqrt(K) C. As written, a gradient whose
largest coordinate alone holds more than a K fraction of its energy keeps nothing (it contributes 0).

Sensitivity and noise (A.1): under add/remove-one neighbours the clipped-and-compressed sum changes
by one compressed vector, whose norm is at most sqrt(K) C: the L2 sensitivity is sqrt(K) C (and no
smaller: a gradient with many equal small coordinates comes arbitrarily close to it; see the tests).
The noise N(0, K sigma^2 C^2 I) of Algorithm 4 (std sqrt(K) sigma C) is therefore a Gaussian
mechanism with noise multiplier sigma, the same multiplier, the same accounting and the same epsilon
as DP-SGD with sigma: the derivation in the paper is exact. (The "reduced sensitivity" buys less
noise in absolute terms, sqrt(K) times DP-SGD's, for a signal that is also at most sqrt(K) times
smaller: the gain, if any, comes from the signal keeping more than a K fraction of its energy's
direction, never from a cheaper privacy cost.)
"""

from __future__ import annotations

import math

import torch

from ..errors import GSDError
from .transforms import Parts, StepContext, Transform


def norm_top_k(G: torch.Tensor, fraction: float) -> torch.Tensor:
    """NormTopK of every row of ``G`` (n x p): each row keeps its largest-magnitude coordinates, in
    decreasing order of magnitude, while their squared sum is <= ``fraction`` * its squared norm."""
    if not 0 < fraction <= 1:
        raise GSDError(f"--topk-fraction must be in (0, 1] (got {fraction})")
    if G.numel() == 0 or fraction >= 1:
        return G  # K = 1 keeps every coordinate (no rounding at the boundary)
    sq = G.double().pow(2)
    vals, order = torch.sort(sq, dim=1, descending=True, stable=True)
    cum = torch.cumsum(vals, dim=1)
    target = fraction * sq.sum(dim=1, keepdim=True)
    keep_sorted = cum <= target
    keep = torch.zeros_like(keep_sorted)
    keep.scatter_(1, order, keep_sorted)
    return G * keep.to(G.dtype)


class NormTopK(Transform):
    """Algorithm 4, line 15: NormTopK(g, K) of each clipped per-sample ``part``."""

    def __init__(self, fraction: float, part: str = "grad"):
        if not 0 < fraction <= 1:
            raise GSDError(f"--topk-fraction must be in (0, 1] (got {fraction})")
        self.fraction = float(fraction)
        self.part = part

    def per_example(self, parts: Parts, ctx: StepContext) -> Parts:
        g = parts[self.part]
        out = norm_top_k(g, self.fraction)
        if g.shape[0]:
            kept = ctx.info.setdefault("topk_kept", [0.0, 0])
            kept[0] += float((out != 0).sum()) / g.shape[1]
            kept[1] += g.shape[0]
        return {**parts, self.part: out}

    def norm_bounds(self, bounds: dict[str, float]) -> dict[str, float]:
        if self.part in bounds:
            return {**bounds, self.part: bounds[self.part] * math.sqrt(self.fraction)}
        return bounds


def topagg_sensitivity(clip: float, fraction: float) -> float:
    """L2 sensitivity of the sum of clipped, NormTopK-compressed per-sample gradients: sqrt(K) C."""
    return math.sqrt(fraction) * clip
