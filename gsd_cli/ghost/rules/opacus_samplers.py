"""Norm layers and the other layers Opacus has a per-layer grad sampler for (GroupNorm, LayerNorm,
InstanceNorm, Conv1d/3d, ...): that layer's per-sample gradients, from Opacus' sampler, summed over
the layer's calls. A fallback, tried after the type rules (Linear, Conv2d, Embedding)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..factors import Factors
from ..registry import Call, register_fallback


def _samplers() -> dict:
    from opacus.grad_sample import GradSampleModule

    return GradSampleModule.GRAD_SAMPLERS


def _has_sampler(m: nn.Module) -> bool:
    return type(m) in _samplers()


def _sum_calls(ts: list[torch.Tensor]) -> torch.Tensor:
    out = ts[0]
    for t in ts[1:]:
        out = out + t
    return out


@register_fallback(name="opacus", priority=10, applies=_has_sampler)
def opacus(unit, calls: list[Call]) -> Factors:
    f = Factors()
    fn = _samplers()[type(unit.module)]
    per = [fn(unit.module, list(a), g) for (a, _), g in calls]
    for full, local, p in unit.params:
        gs = _sum_calls([d[p] for d in per])
        f.mat.append((gs.reshape(gs.shape[0], -1), full))
    return f
