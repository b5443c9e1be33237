"""GSD (paper 004, Algorithm 1): the non-private distance between two datasets' gradient subspaces.

The private side's top-k right singular subspace is computed as every public one's
(:func:`gsd_cli.subspace.top_k_subspace`, exact or by the certified randomized method, or the Gram
path) and compared with each public side's by the normalised projection metric. Nothing
here is differentially private: every output of a ranking with it says ``"dp": false``.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn as nn

from .. import data as gdata
from ..errors import GSDError
from ..gradients import LossFn, resolve_device
from .side import ROW_NORMS, Subspace
from ..subspace import check_method, projection_metric, top_k_subspace
from .registry import Distance, SideContext, register_distance


@register_distance("gsd")
class GSD(Distance):
    """Paper 004's GSD: the private side as the public side, no privacy."""

    def private_side(self, ctx: SideContext, sample: gdata.Sample) -> Subspace:
        return ctx.subspace(sample)


def _as_xy(batch, num_classes: int, seed: int, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + salt)
        return batch, torch.randint(0, num_classes, (batch.shape[0],), generator=gen)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise GSDError("give examples as a tensor x (random labels) or a pair (x, y)")


def gradient_subspace_distance(
    model: nn.Module,
    private,
    public,
    k: int = 16,
    *,
    params: Sequence[str] | str | None = None,
    row_norm: str = "unit",
    loss: LossFn | None = None,
    chunk_size: int | None = None,
    engine: str = "auto",
    device: str | torch.device = "auto",
    seed: int = 0,
    subspace_method: str = "auto",
) -> float:
    """GSD (paper 004, Algorithm 1) between two batches at the model's current weights.

    ``private`` and ``public`` are input tensors (each example gets a uniformly random label in the
    model's label space, drawn from ``seed``, as the authors do) or ``(x, y)`` pairs. Returns the
    normalised projection metric in [0, 1] between the top-k right singular subspaces of the two
    per-sample gradient matrices. ``subspace_method``: ``exact``, ``randomized`` or ``auto``
    (:func:`gsd_cli.subspace.top_k_subspace`).
    """
    from ..gradients import per_sample_gradients

    if row_norm not in ROW_NORMS:
        raise GSDError(f"--row-norm must be one of {', '.join(ROW_NORMS)} (got {row_norm!r})")
    check_method(subspace_method)
    dev = resolve_device(device)
    first = private if isinstance(private, torch.Tensor) else private[0]
    with torch.no_grad():
        num_classes = model.to(dev)(first[:1].to(dev)).shape[-1]
    bases = []
    for salt, batch in enumerate((private, public)):
        x, y = _as_xy(batch, num_classes, seed, salt)
        G = per_sample_gradients(model, x, y, loss, params, chunk_size, engine=engine, device=dev, row_norm=row_norm)
        bases.append(top_k_subspace(G, k, subspace_method)[0])
        del G
    return projection_metric(*bases)
