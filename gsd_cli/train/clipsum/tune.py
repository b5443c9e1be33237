"""Each layer's path of the ghost clipped sum chosen by measurement (:meth:`ClippedSum.tune`).

fastDP's rule (ghost when 2 T^2 < D C, :func:`~gsd_cli.train.clipsum.rules.ghost_cheaper`) compares
the *memory* of a layer's ghost norm (two T x T Grams per example) with that of its per-example
gradient (D x C). In *time* the two paths are not what that compares. The ghost path costs the Grams
(2 T^2 (D + C) per example, or the pixel Gram of a stride-1 convolution) **plus** the book-keeping
weight-gradient product (2 T D C); the materialised path costs the per-example gradients (2 T D C, the
same products as the book-keeping sum, but written per example) plus a norm and a weighted sum over
n D C numbers. So the materialised path skips the Grams and pays in memory traffic: it is faster where
the per-example gradients are small and T is not (measured on the 2-core CPU, one thread, per chunk:
the FMNIST CNN's conv2, 64 examples, 0.57 ms against 0.73 ms; ResNet-18's stride-2 256-channel 3 x 3
convolution at 224, 16 examples, 17 ms against 30 ms; its 512-channel ones 59 ms against 21 ms the
other way), and which side wins depends on the machine.

:func:`tune_paths` therefore times both paths of every layer where the choice is open, once per
engine, on a **synthetic** chunk (:func:`~gsd_cli.train.clipsum.rules.synthetic`: seeded inputs,
label 0; of the private chunk only the shape of one example is read, and ``gsd train`` gives the number
of examples from its public settings), interleaved, the least of
:data:`ROUNDS` kept, and keeps the materialised path only where it is faster by :data:`FASTER_BY`
(else the ghost path, which holds less memory). Both paths compute the same release (sum_i w_i g_i with w_i
from ||g_i||, to float rounding), so the choice moves speed only, never the mechanism or its noise;
``summary.json``'s ``clip_engine`` lists each layer's path. The choice is open for a layer with one
Linear/Conv2d call whose weight is trained, T > 1 positions (for T = 1 the ghost norm is two vector
norms), where fastDP's rule says ghost and the chunk's per-example gradients of the layer take at most
:data:`MATERIALISE_MAX_BYTES`.
"""

from __future__ import annotations

import torch

#: timed rounds per path and layer (after one warm-up); the least is kept
ROUNDS = 5
#: the materialised path is kept only when it is faster than the ghost path by this fraction: on an open
#: layer the ghost path holds less memory (fastDP's rule), and a layer timed alone does not pay the memory
#: traffic its per-example gradients cause the rest of the step. The FMNIST CNN's conv2 (expected batch
#: 250, chunks of 128, one thread of the 2-core CPU) timed 0.80-0.93 materialised / ghost alone, yet the
#: runs that materialised it took 1.05-1.11 s an epoch against 0.89-1.06 s for those that did not, with
#: a peak RSS of 1180-1245 MiB against 1051-1098 MiB (issue 45). ResNet-18's stride-2 convolutions at 224
#: (0.57) stay materialised
FASTER_BY = 0.25
#: the largest per-example gradient tensor of one layer and chunk the measured choice may materialise
MATERIALISE_MAX_BYTES = 256 << 20


def open_layers(engine, by_layer: dict, n: int) -> list[tuple[int, object, torch.Tensor, torch.Tensor]]:
    """(index, layer, input, output gradient) of the layers whose path the measurement decides."""
    from .rules import ghost_cheaper

    out = []
    for i, layer in enumerate(engine.layers):
        calls = by_layer.get(i)
        if not calls or not engine.eligible(layer, calls):
            continue
        (args, _, g), = calls
        xin = args[0].to(g.dtype)
        groups, T, D, C = engine._shape(layer, xin, g)
        if T > 1 and ghost_cheaper(T, D, C) and n * groups * D * C * g.element_size() <= MATERIALISE_MAX_BYTES:
            out.append((i, layer, xin, g))
    return out


def tune_paths(engine, x: torch.Tensor, y: torch.Tensor, examples: int | None = None) -> dict[str, str]:
    """Set ``engine.paths`` (layer -> ``ghost`` / ``materialised``) and ``engine.timings`` (layer ->
    (ghost s, materialised s)) from one synthetic chunk of ``examples`` shaped like ``(x, y)``; return the
    paths. ``gsd train`` passes min(physical batch, expected batch): public numbers, where the first
    Poisson chunk's own size would let the paths (written in ``summary.json``) depend on the private set."""
    from ...gradients.engines import timed
    from .rules import synthetic

    n = int(examples) if examples else x.shape[0]
    xs, ys = synthetic(x, y, n)
    by_layer = engine._capture(xs, ys)
    gen = torch.Generator().manual_seed(1)
    w = (torch.rand(n, generator=gen, dtype=torch.float64) + 0.5).clamp(max=1.0).to(x.device)
    for i, layer, xin, g in open_layers(engine, by_layer, n):
        wd = w.to(g.dtype)

        def ghost():
            _, data = engine._ghost_norms(layer, xin, g)
            engine._ghost_sum(layer, data, wd)

        def materialised():
            per = engine._materialised(layer, by_layer[i])
            for v in per.values():
                v.reshape(n, -1).pow(2).sum(1)
                torch.tensordot(wd, v, dims=1)

        best = {"ghost": float("inf"), "materialised": float("inf")}
        ghost(), materialised()  # warm-up
        for r in range(ROUNDS):
            for name, fn in (("ghost", ghost), ("materialised", materialised))[:: 1 if r % 2 == 0 else -1]:
                best[name] = min(best[name], timed(fn, x.device))
        engine.timings[layer.prefix] = (best["ghost"], best["materialised"])
        engine.paths[layer.prefix] = "materialised" if best["materialised"] < (1.0 - FASTER_BY) * best["ghost"] else "ghost"
    return dict(engine.paths)


__all__ = ["FASTER_BY", "MATERIALISE_MAX_BYTES", "ROUNDS", "open_layers", "tune_paths"]
