"""Embedding (no max_norm, no scale_grad_by_freq, dense): <g_i, g_j> = sum_{t,s} [tok_it = tok_js]
(b_it . b_js) (padding index excluded), or its per-sample gradients when the vocabulary is small
against T^2."""

from __future__ import annotations

import torch
import torch.nn as nn

from ..factors import Factors
from ..registry import Call, register_rule


def _plain(m: nn.Module) -> bool:
    return type(m) is nn.Embedding and m.max_norm is None and not m.scale_grad_by_freq and not m.sparse


@register_rule(nn.Embedding, name="embedding", applies=_plain)
def embedding(unit, calls: list[Call]) -> Factors:
    f = Factors()
    idx = torch.cat([a[0].reshape(a[0].shape[0], -1) for (a, _), _ in calls], 1)
    B = torch.cat([g.reshape(g.shape[0], -1, g.shape[-1]) for _, g in calls], 1)
    if unit.module.padding_idx is not None:
        B = B * (idx != unit.module.padding_idx).unsqueeze(-1).to(B.dtype)
    full = unit.params[0][0]
    T, V = idx.shape[1], unit.module.num_embeddings
    if T * T < V:
        f.embeds.append((idx, B, full))
    else:
        g = torch.zeros(B.shape[0], V, B.shape[2], dtype=B.dtype, device=B.device)
        g.scatter_add_(1, idx.unsqueeze(-1).expand_as(B), B)
        f.mat.append((g.reshape(B.shape[0], -1), full))
    return f
