"""Linear: A_i = the layer's inputs (T positions x D, T = 1 for a plain batch), B_i = its output
gradients (T x C); <g_i, g_j> = <A_i A_j^T, B_i B_j^T> (:mod:`.pairs`), for a vector input
(a_i . a_j)(b_i . b_j)."""

from __future__ import annotations

import torch
import torch.nn as nn

from ...gradients.layers import linear_plain as _plain  # the Linear layers every engine's rule takes
from ..factors import Factors
from ..registry import Call, register_rule
from .pairs import ghost_pairs


def _ab(module: nn.Module, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = x.shape[0]
    return x.reshape(c, -1, x.shape[-1]), g.reshape(c, -1, g.shape[-1])


@register_rule(nn.Linear, name="linear", applies=_plain)
def linear(unit, calls: list[Call]) -> Factors:
    return ghost_pairs(unit, calls, _ab)
