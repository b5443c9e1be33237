"""Private gradient processing as small composable per-sample gradient transforms (after optax).

A step of every private trainer is the same loop (:mod:`gsd_cli.train.loop`): per-sample gradients of
a Poisson subsample arrive in chunks as ``parts = {"grad": G}`` (G: n x p, one row per example);
each transform of a :class:`Chain` maps the parts of a chunk (:meth:`Transform.per_example`: clip,
project, mask...), the loop sums every part over the examples, and the transforms then map the sums
(:meth:`Transform.aggregated`: add noise, reconstruct). The result must be one part ``"grad"`` (p,),
the noisy sum, which the loop divides by the expected batch size and hands to the optimizer.

Transforms that add noise declare it (:meth:`Transform.releases`): the part, its L2 sensitivity (the
clip norm of that part) and the noise standard deviation. The trainer checks that the chain's
releases are exactly the per-step event it accounted (see :func:`chain_step_event`), so a chain that
adds less noise than was accounted cannot run.

DP-SGD (Abadi et al. 2016)::

    chain(clip(C), gaussian_noise(sigma * C))

GEP (paper 000, Algorithm 1: embed onto the anchor basis B, clip embedding and residual separately,
noise each, map back)::

    chain(gep_project(anchor), clip(S1, "embedding"), clip(S2, "residual"),
          gaussian_noise(sigma * S1, "embedding"), gaussian_noise(sigma * S2, "residual"), gep_reconstruct(anchor))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..errors import GSDError

Parts = dict[str, torch.Tensor]


@dataclass
class StepContext:
    """What transforms may read during a step: the step number, the model at the current weights,
    the selected parameter names, the noise generator (secret), the device, and ``info`` where
    transforms leave figures for the metrics (fraction clipped, projection error...)."""

    step: int
    model: torch.nn.Module | None = None
    names: Sequence[str] = ()
    generator: torch.Generator | None = None
    device: torch.device = torch.device("cpu")
    info: dict = field(default_factory=dict)
    epoch: int = 0
    epochs: int = 1


@dataclass(frozen=True)
class Release:
    """One noisy release per step: ``part`` with L2 sensitivity ``sensitivity`` and noise N(0, std^2 I)."""

    part: str
    sensitivity: float
    std: float

    @property
    def noise_multiplier(self) -> float:
        return self.std / self.sensitivity


class Transform:
    """Base class: every hook is optional and the identity by default."""

    def begin_step(self, ctx: StepContext) -> None:
        """Called once per step before any per-sample gradient (GEP computes its anchor basis here)."""

    def per_example(self, parts: Parts, ctx: StepContext) -> Parts:
        return parts

    def aggregated(self, parts: Parts, ctx: StepContext) -> Parts:
        return parts

    def releases(self) -> list[Release]:
        return []

    def norm_bounds(self, bounds: dict[str, float]) -> dict[str, float]:
        """The per-example L2 norm bound of each part after this transform, given those before it
        (what the sensitivity check reads). The default keeps them: a transform that can enlarge a
        bounded part after its clip must override this."""
        return bounds


class Chain(Transform):
    """Transforms applied in order (per example), then in order again (on the sums)."""

    def __init__(self, *transforms: Transform):
        self.transforms = list(transforms)

    def begin_step(self, ctx: StepContext) -> None:
        for t in self.transforms:
            t.begin_step(ctx)

    def per_example(self, parts: Parts, ctx: StepContext) -> Parts:
        for t in self.transforms:
            parts = t.per_example(parts, ctx)
        return parts

    def aggregated(self, parts: Parts, ctx: StepContext) -> Parts:
        for t in self.transforms:
            parts = t.aggregated(parts, ctx)
        return parts

    def releases(self) -> list[Release]:
        return [r for t in self.transforms for r in t.releases()]

    def norm_bounds(self, bounds: dict[str, float]) -> dict[str, float]:
        for t in self.transforms:
            bounds = t.norm_bounds(dict(bounds))
        return bounds

    def clip_norms(self) -> dict[str, float]:
        """Each part's per-example norm bound at the end of the per-example pass: its clip norm, as
        changed by later transforms (TopAgg's NormTopK multiplies it by sqrt(K))."""
        return self.norm_bounds({})


def chain(*transforms: Transform) -> Chain:
    return Chain(*transforms)


class Clip(Transform):
    """Scale each example's ``part`` to L2 norm at most ``max_norm``: g * min(1, C / ||g||).

    An example whose ``part`` holds a NaN or an infinity contributes zero (a second line of defence
    behind the data check: unclipped, it would turn the released sum into NaN and so reveal itself)."""

    def __init__(self, max_norm: float, part: str = "grad"):
        if not max_norm > 0:
            raise GSDError(f"clip norms must be positive (got {max_norm} for {part})")
        self.max_norm = float(max_norm)
        self.part = part

    def per_example(self, parts: Parts, ctx: StepContext) -> Parts:
        g = parts[self.part]
        # a row holds a NaN or an infinity exactly when its norm is not finite (a finite row whose norm
        # overflows is zeroed too, as min(1, C / inf) = 0 did): one pass over the rows instead of two
        norms = g.norm(dim=1, keepdim=True)
        ok = torch.isfinite(norms)
        if not bool(ok.all()):
            zero = torch.zeros((), dtype=g.dtype, device=g.device)
            g, norms = torch.where(ok, g, zero), torch.where(ok, norms, zero)
        scale = (self.max_norm / norms.clamp_min(1e-12)).clamp(max=1.0)
        info = ctx.info.setdefault(f"clipped_{self.part}", [0, 0])
        info[0] += int((norms > self.max_norm).sum())
        info[1] += g.shape[0]
        return {**parts, self.part: g * scale}

    def norm_bounds(self, bounds: dict[str, float]) -> dict[str, float]:
        return {**bounds, self.part: self.max_norm}


def clip(max_norm: float, part: str = "grad") -> Clip:
    return Clip(max_norm, part)


class GaussianNoise(Transform):
    """Add N(0, std^2 I) to the summed ``part``. ``sensitivity`` is that part's clip norm: what the
    accountant sees is the multiplier std / sensitivity."""

    def __init__(self, std: float, part: str = "grad", sensitivity: float | None = None):
        if std < 0:
            raise GSDError(f"noise std must be >= 0 (got {std})")
        self.std = float(std)
        self.part = part
        self.sensitivity = sensitivity

    def aggregated(self, parts: Parts, ctx: StepContext) -> Parts:
        s = parts[self.part]
        if self.std == 0:
            return parts
        noise = torch.randn(s.shape, generator=ctx.generator, dtype=s.dtype, device="cpu").to(s.device)
        return {**parts, self.part: torch.add(s, noise, alpha=self.std)}  # s + std * noise in one pass

    def releases(self) -> list[Release]:
        return [Release(self.part, float(self.sensitivity if self.sensitivity is not None else float("nan")), self.std)]


def gaussian_noise(std: float, part: str = "grad", sensitivity: float | None = None) -> GaussianNoise:
    return GaussianNoise(std, part, sensitivity)


def chain_step_event(ch: Chain):
    """The dp-accounting event of one step of ``ch``: its noisy releases composed (same subsample).

    Every released part must be clipped before its noise (the sensitivity is its per-example norm
    bound: the clip norm, times sqrt(K) after NormTopK), and every part that reaches the output must
    have been released with noise."""
    from ..privacy.lazy_dpa import events

    ev = events()  # dp-accounting's events, without its PLD accountant and calibration (lazy_dpa)
    clips = ch.clip_norms()
    rel = ch.releases()
    if not rel:
        raise GSDError("this gradient pipeline adds no noise; it is not differentially private")
    events = []
    for r in rel:
        if r.part not in clips:
            raise GSDError(f"part {r.part!r} gets noise but is never clipped: its sensitivity is unbounded")
        if abs(r.sensitivity - clips[r.part]) > 1e-12 * clips[r.part]:
            raise GSDError(f"noise on {r.part!r} assumes sensitivity {r.sensitivity}, but it is clipped to {clips[r.part]}")
        events.append(ev.GaussianDpEvent(r.noise_multiplier))
    return events[0] if len(events) == 1 else ev.ComposedDpEvent(events)
