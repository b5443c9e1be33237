"""Ghost pairs, shared by the Linear and Conv2d rules (not a rule itself).

A layer whose per-sample gradient is B_i^T A_i (A_i: T positions x D inputs, B_i: T x C output
gradients, per group) has <g_i, g_j> = <A_i A_j^T, B_i B_j^T> ("ghost", ~T^2 (D + C) per pair), or,
when that costs more than the layer's D x C parameters, the layer's per-sample gradients B_i^T A_i
(mixed ghost clipping's per-layer choice). A bias adds (1^T B_i)(B_j^T 1).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn

from ..factors import Factors
from ..registry import Call

#: ``ab(module, x, g)`` -> ``(A, B)`` (c x T x D, c x T x C) of one call
AB = Callable[[nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def ghost_pairs(unit, calls: list[Call], ab: AB) -> Factors:
    """The factors of a unit whose calls give ``(A, B)`` by ``ab``; several calls are concatenated along T."""
    AB_ = [ab(unit.module, a[0], g) for (a, _), g in calls]
    A = torch.cat([x for x, _ in AB_], 1) if len(AB_) > 1 else AB_[0][0]
    B = torch.cat([y for _, y in AB_], 1) if len(AB_) > 1 else AB_[0][1]
    f = Factors()
    add_pairs(unit, f, A, B)
    return f


def add_pairs(unit, f: Factors, A: torch.Tensor, B: torch.Tensor) -> None:
    """Add the weight's ghost pairs (or per-sample gradients, per group) and the bias' gradients to ``f``."""
    m = unit.module
    groups = getattr(m, "groups", 1)
    by_local = {local: full for full, local, _ in unit.params}
    T, D, C = A.shape[1], A.shape[2] // groups, B.shape[2] // groups
    if "weight" in by_local:
        # Gram work per pair: ghost T^2 (D + C), per-sample gradients D C. Storage per example:
        # factors T (D + C), gradients D C. Kept as factors whenever they are the smaller; the Gram
        # then materialises the layer's gradients from them (by output-channel blocks) if cheaper.
        # Not ghost clipping's 2 T^2 < D C (gsd_cli.train.clipsum.rules.ghost_cheaper): that one
        # prices each example's own norm, this one every pair <g_i, g_j> of the Gram (issue 51).
        ghost = T * T * (D + C) < D * C
        compact = T * (D + C) <= D * C
        for gi in range(groups):
            Ag = A[:, :, gi * D : (gi + 1) * D]
            Bg = B[:, :, gi * C : (gi + 1) * C]
            if ghost or compact:
                f.pairs.append((Ag, Bg, by_local["weight"], gi * C, C, ghost))
            else:
                f.mat.append((torch.bmm(Bg.transpose(1, 2), Ag).reshape(A.shape[0], -1), (by_local["weight"], gi * C, C)))
    if "bias" in by_local:
        f.mat.append((B.sum(1), by_local["bias"]))
