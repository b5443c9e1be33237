"""How many examples a private step computes at once on a CPU when the clipped sums come from the
ghost engine (:mod:`gsd_cli.train.clipsum`): its chunk.

The per-sample-gradient chunk of 64 on a CPU (:func:`gsd_cli.gradients.default_chunk_size`) bounds the
memory of the materialised per-sample gradients (chunk x p floats). The ghost engine holds no such
matrix: a chunk's memory is its activations and their gradients (and a materialised layer's own
per-example gradients). Where those are small, a chunk of 64 mostly pays per-chunk overhead: on the
2-core CPU the FMNIST CNN's DP-SGD step at an expected batch of 250 (0.09 MB of activations and
gradients an example) took 30-32 ms of CPU time in chunks of 64, 26-28 ms in chunks of 128 and 23-25 ms
in one of 256, whose peak RSS was 290 MiB higher than at 128 (Opacus: 40-44 ms). Where they are large
the bigger chunk leaves the caches: ResNet20 at 32x32 (3.5 MB an example) took 767 ms in chunks of 64
and 918 ms in one of 256 (issue 45). So on a CPU a ghost
step's chunk grows from the default up to :data:`MOST` examples while they hold at most
:data:`ACTIVATION_BUDGET` bytes of activations (the leaf modules' outputs of one example, counted by
a forward of one synthetic example, twice: kept for the backward, and their gradients), and never
past the default's bound on per-sample gradients. The chunk is compute only (``--physical-batch``
sets it): the clipped sum is the same to float rounding, the mechanism and its accounting the same;
it depends on the model and its input size, never on the data.
"""

from __future__ import annotations

import torch

#: the most examples a ghost step's chunk takes on a CPU
MOST = 128
#: bytes of activations (and their gradients) a CPU chunk may hold
ACTIVATION_BUDGET = 64 << 20


def activation_bytes(model: torch.nn.Module, input_shape: tuple[int, ...]) -> int:
    """Bytes of the leaf modules' outputs for one example of ``input_shape`` (C, H, W), float32: a
    forward of one zero example without gradients, the model's mode kept, torch's global random state
    restored after (a dropout draws from it)."""
    total = 0

    def count(_m, _inp, out):
        nonlocal total
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                total += t.numel() * 4

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    handles = [m.register_forward_hook(count) for m in leaves]
    try:
        p = next(model.parameters(), None)
        x = torch.zeros((1, *input_shape), device=p.device if p is not None else "cpu")
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            model(x)
    finally:
        for h in handles:
            h.remove()
    return total


def ghost_cpu_chunk(model: torch.nn.Module, input_shape: tuple[int, ...], num_params: int, default: int) -> int:
    """The chunk of a ghost-engine step on a CPU (module docstring); ``default`` where one example's
    forward fails (a model with its own input contract)."""
    by_gradients = int(2e9 // (4 * max(num_params, 1)))  # default_chunk_size's bound, should a layer be materialised
    try:
        per_example = 2 * activation_bytes(model, input_shape)
    except (RuntimeError, TypeError, ValueError):
        return default
    fits = ACTIVATION_BUDGET // max(per_example, 1)
    return int(max(default, min(MOST, fits, by_gradients)))
