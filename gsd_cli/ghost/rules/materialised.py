"""The materialised fallback: any layer no other rule takes (e.g. MultiheadAttention, with all its
parameters, or a custom module) gets its per-sample gradients by torch.func on that module alone
(a vmap of a vjp), summed over its calls. Tried last; the only rule for a whole-module unit."""

from __future__ import annotations

import torch

from ..factors import Factors
from ..registry import Call, register_fallback


@register_fallback(name="func", priority=100, whole=True)
def func(unit, calls: list[Call]) -> Factors:
    f = Factors()
    sums = None
    for (a, kw), g in calls:
        d = per_sample(unit, a, kw, g)
        sums = d if sums is None else {n: sums[n] + d[n] for n in d}
    for full, local, _ in unit.params:
        f.mat.append((sums[local].reshape(sums[local].shape[0], -1), full))
    return f


def per_sample(unit, args, kwargs, g) -> dict:
    """Per-sample gradients of the unit's module's parameters by torch.func (vmap of a vjp), examples on dim 0."""
    from torch.func import functional_call, vjp, vmap

    c = g.shape[0]
    params = {local: p.detach() for _, local, p in unit.params}
    pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.ndim and a.shape[0] == c]
    kpos = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == c]
    module = unit.module

    def one(batched, gi):
        a = list(args)
        kw = dict(kwargs)
        for i, t in zip(pos, batched[: len(pos)]):
            a[i] = t.unsqueeze(0)
        for k, t in zip(kpos, batched[len(pos) :]):
            kw[k] = t.unsqueeze(0)

        def fwd(p):
            out = functional_call(module, p, tuple(a), kw)
            return out[0] if isinstance(out, (tuple, list)) else out

        _, fn = vjp(fwd, params)
        return fn(gi.unsqueeze(0))[0]

    batched = [args[i] for i in pos] + [kwargs[k] for k in kpos]
    return vmap(one, randomness="different")(batched, g)
