"""One private training step: the step's secret randomness (:func:`private_randomness`), the release
of one Poisson subsample through a method's transform chain (:func:`private_step`), and the update
handed to the optimizer (:func:`flat_to_grads`).

A step may run in one process or across the processes of a :class:`~gsd_cli.train.distributed.World`
(``world``): every process then runs the per-example transforms on its own shard of the subsample,
the sums are added up across processes (all-reduce) and only process 0 runs the aggregated transforms
(the noise: added once), whose result every process receives.

The sums of the per-example contributions are accumulated in float64 whatever the number of
processes (a single fused chunk's sum stays in float32: casting it to float64 and back is the
identity) and cast back to the parts' dtype (float32 for the models here) before the aggregated
transforms: a float64 sum of float32 terms is correct to ~1e-16 relative in any order, so the order in
which the examples are added (chunks, shards, the all-reduce) changes the float32 sum the noise is
added to only when it lies within that distance of a float32 rounding boundary.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from .transforms import Chain, StepContext


def _seed_words(value: int) -> list[int]:
    return [(value >> (32 * i)) & 0xFFFFFFFF for i in range(4)]


def private_randomness(n: int, q: float, noise_seed: int, step: int) -> tuple[np.ndarray, torch.Generator]:
    """Step ``step``'s Poisson subsample (every one of ``n`` examples independently with probability
    ``q``) and its noise generator, both from the secret ``noise_seed``: a resumed run replays them.
    The whole n-length inclusion mask is drawn by every process of a distributed run (each keeps its
    shard), so the subsample is the same for any number of processes."""
    rng = np.random.default_rng([*_seed_words(noise_seed), step])
    idx = np.flatnonzero(rng.random(n) < q)
    gen = torch.Generator().manual_seed(int(rng.integers(2**63)))
    return idx, gen


def private_step(chain: Chain, model: torch.nn.Module, names: Sequence[str], batches, num_params: int, ctx: StepContext,
                 per_sample: Callable | None = None, *, world=None, clip_sum=None) -> dict:
    """One private release: ``chain`` over the per-sample gradients of the ``(x, y)`` chunks of one
    Poisson subsample (virtual steps), summed, then noised. Returns the parts of the release
    (``"grad"``: the noisy sum, p). An empty subsample still releases noise. ``per_sample``: the
    method's own per-sample gradients (:attr:`~gsd_cli.train.methods.Method.per_sample`), full gradients by default.

    ``world`` (a :class:`~gsd_cli.train.distributed.World` of several processes): ``batches`` are this
    process's shard of the subsample; the sums are all-reduced, process 0 alone runs
    :meth:`Chain.aggregated` (adds the noise) and every process returns its ``"grad"``.

    ``clip_sum`` (a :class:`~gsd_cli.train.clipsum.step.LazyClipSum`, for a chain whose per-example pass is
    one clip of ``"grad"``: :func:`~gsd_cli.train.clipsum.step.fusable`): each chunk's clipped sum by ghost
    norms and book-keeping instead of the per-sample gradient matrix, where the model allows it
    (the same sum to float rounding; :mod:`gsd_cli.train.clipsum`)."""
    chain.begin_step(ctx)
    sums = None
    dtypes = None
    for x, y in batches:
        fused = clip_sum.hook(model, names, x, y) if clip_sum is not None else None
        if fused is not None:
            chunk_sums = fused(model, names, x, y, ctx)  # in the parameters' dtype: one chunk needs no float64
            dtypes = dtypes or dict.fromkeys(chunk_sums, dict(model.named_parameters())[names[0]].dtype)
            sums = chunk_sums if sums is None else {k: sums[k].double() + chunk_sums[k].double() for k in sums}
            continue
        if per_sample is not None:
            parts = chain.per_example(per_sample(model, names, x, y, ctx), ctx)
        else:
            from .clipsum.step import gradient_rows  # the per-layer rules where the model allows them, else vmap

            parts = chain.per_example({"grad": gradient_rows(clip_sum, model, names, x, y, num_params, ctx.device)}, ctx)
        chunk_sums = {k: v.sum(0, dtype=torch.float64) for k, v in parts.items()}
        dtypes = {k: v.dtype for k, v in parts.items()}
        sums = chunk_sums if sums is None else {k: sums[k].double() + chunk_sums[k] for k in sums}
    if sums is None:
        width = getattr(per_sample, "width", num_params) if per_sample is not None else num_params
        parts = chain.per_example({"grad": torch.zeros(0, width, device=ctx.device)}, ctx)
        sums = {k: v.sum(0, dtype=torch.float64) for k, v in parts.items()}
        dtypes = {k: v.dtype for k, v in parts.items()}
    if world is not None and world.size > 1:
        sums = world.all_reduce_sums(sums)
    sums = {k: v.to(dtypes[k]) for k, v in sums.items()}
    if world is None or world.size == 1:
        return chain.aggregated(sums, ctx)
    released = chain.aggregated(sums, ctx)["grad"] if world.is_main else None
    return {"grad": world.broadcast_vector(released, num_params, next(iter(dtypes.values())), ctx.device)}


def flat_to_grads(model: torch.nn.Module, names: Sequence[str], v: torch.Tensor) -> None:
    """Set the ``.grad`` of the parameters ``names`` from the flat vector ``v`` (``names`` order)."""
    params = dict(model.named_parameters())
    col = 0
    for n in names:
        p = params[n]
        w = p.numel()
        p.grad = v[col : col + w].view_as(p).to(p.dtype)
        col += w
