"""Random sparsification (RS, paper 003) for DP-SGD and GEP.

Paper 003 (Algorithm 1, Sections 4.1 and 4.2; the authors' code, JunyiZhu-AI/RandomSparsification):

* a random coordinate mask that zeroes a fraction ``rate`` of the p trained coordinates, drawn
  uniformly (``floor(rate * p)`` of them, without replacement) **independently of the data**, from a
  generator seeded by (``seed``, epoch) only;
* **per-epoch randomisation** (4.2): the mask is redrawn once per epoch, at its first step;
* **gradual cooling** (4.1): the rate ramps linearly from 0 to the final rate R over training,
  rate(e) = R * e / (E - 1) for epochs e = 0 .. E - 1 (R itself when E = 1), as the authors' code
  does (its ``--refresh 1``);
* the mask is applied to every per-sample gradient **before clipping**, so the clip budget goes to
  the kept coordinates, and to the released (noisy) update, so there is **noise only where the mask
  keeps coordinates**.

Privacy (paper 003, Theorem 3.1): the mask does not depend on the data, so masking the per-sample
gradients is part of the function whose clipped sum is released (the sensitivity is still the clip
norm), and masking the noisy sum afterwards is post-processing. The step is accounted exactly as the
method without RS (same Gaussian, same multiplier).

With GEP (paper 003, Sec. 6.3 plugs RS into GEP without saying where; this is our choice): the mask
is applied to the private per-sample gradients before GEP's projection and clipping, to the public
anchor gradients before the power method (so the anchor basis lies in the kept coordinates and
neither the embedding nor the residual spends clip budget outside them), and to the reconstructed
noisy update.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import GSDError
from .transforms import Parts, StepContext, Transform


def sparsity_rate(final_rate: float, epoch: int, epochs: int) -> float:
    """Gradual cooling (paper 003, Sec. 4.1): the rate of epoch ``epoch`` (0-based) of ``epochs``,
    linear from 0 at the first epoch to ``final_rate`` at the last."""
    if not 0 <= final_rate < 1:
        raise GSDError(f"--sparsify must be in [0, 1) (got {final_rate}); it is the fraction of coordinates dropped")
    if epochs <= 1:
        return float(final_rate)
    return float(final_rate) * min(max(epoch, 0), epochs - 1) / (epochs - 1)


def random_mask(p: int, rate: float, seed: int, epoch: int) -> torch.Tensor:
    """A 0/1 float mask of length ``p`` that zeroes ``floor(rate * p)`` coordinates drawn uniformly
    without replacement by a generator seeded from (``seed``, ``epoch``) alone: never from data."""
    gen = torch.Generator().manual_seed(int(np.random.default_rng([int(seed), int(epoch), 0x5A25E]).integers(2**62)))
    drop = int(rate * p)
    mask = torch.ones(p)
    if drop > 0:
        mask[torch.randperm(p, generator=gen)[:drop]] = 0.0
    return mask


class RandomSparsify(Transform):
    """Multiply each example's ``part`` by the epoch's random mask (place it before the clip)."""

    def __init__(self, final_rate: float, seed: int, part: str = "grad"):
        sparsity_rate(final_rate, 0, 1)  # validates
        self.final_rate = float(final_rate)
        self.seed = int(seed)
        self.part = part
        self.epoch = None
        self.rate = 0.0
        self._mask: torch.Tensor | None = None
        self._p = None
        self._epochs = 1

    def begin_step(self, ctx: StepContext) -> None:
        if ctx.epoch != self.epoch or ctx.epochs != self._epochs:
            self.epoch, self._epochs = ctx.epoch, ctx.epochs
            self.rate = sparsity_rate(self.final_rate, ctx.epoch, ctx.epochs)
            self._mask = None  # drawn when the width is known
        m = ctx.info.setdefault("epoch_metrics", {})
        m["sparsify_rate"] = self.rate

    def mask(self, p: int, device=None) -> torch.Tensor:
        if self._mask is None or self._p != p:
            self._mask, self._p = random_mask(p, self.rate, self.seed, self.epoch or 0), p
        return self._mask if device is None else self._mask.to(device)

    def per_example(self, parts: Parts, ctx: StepContext) -> Parts:
        g = parts[self.part]
        m = self.mask(g.shape[1], g.device).to(g.dtype)
        ctx.info.setdefault("epoch_metrics", {})["sparsity"] = float(1.0 - m.mean())
        return {**parts, self.part: g * m}

    def norm_bounds(self, bounds: dict[str, float]) -> dict[str, float]:
        return bounds  # a 0/1 mask never enlarges a norm


class SparsifyRelease(Transform):
    """Multiply the released (noisy) ``part`` by the same mask: noise only on the kept coordinates
    (post-processing). Place it last."""

    def __init__(self, rs: RandomSparsify, part: str = "grad"):
        self.rs = rs
        self.part = part

    def aggregated(self, parts: Parts, ctx: StepContext) -> Parts:
        v = parts[self.part]
        m = self.rs.mask(v.shape[-1], v.device).to(v.dtype)
        ctx.info.setdefault("epoch_metrics", {})["sparsity"] = float(1.0 - m.mean())
        return {**parts, self.part: v * m}


class MaskedGradients:
    """Wraps GEP's anchor-gradient function so the public gradients are masked too (see the module
    docstring): ``(model, x, y, names) -> G * mask``."""

    def __init__(self, gradients, rs: RandomSparsify):
        self.gradients = gradients
        self.rs = rs

    def __call__(self, model, x, y, names):
        G = self.gradients(model, x, y, names)
        return G * self.rs.mask(G.shape[1], G.device).to(G.dtype)
