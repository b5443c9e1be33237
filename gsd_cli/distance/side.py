"""One side of a comparison: a sample's labels and its top-k gradient subspace.

Below both the distances (:mod:`gsd_cli.distance`) and the ranking (:mod:`gsd_cli.ranking`), and the
public-subspace cache (:mod:`gsd_cli.ranking.cache`): the types and steps they share.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn

from .. import data as gdata
from ..data.loader import AHEAD
from ..errors import GSDError
from ..gradients import LossFn, default_chunk_size, gradient_matrix, resolve_device
from ..subspace import top_k_subspace

LABELS = ("random", "own")
ROW_NORMS = ("unit", "none")

#: ``progress(dataset_name, examples_done, examples_total)``, called after every chunk.
Progress = Callable[[str, int, int], None]
#: suffix of a DP private side's progress name: reported once, as m of m, and shown without its time
#: (both would grow with min(m, N), the private set's size)
DP_PROGRESS = " (DP)"


@dataclass
class Side:
    """What one sample's side of a comparison states besides its content: the sample's name, its examples, the
    seconds it took, the per-sample gradient engine used and the dimension worked in (None: p). A
    :class:`Subspace` is one kind; a DP distance's private side that releases scores instead
    (:class:`gsd_cli.distance.dpenergy.EnergySide`) is another, with no basis to fake."""

    name: str
    examples: int
    seconds: float
    engine: str = ""
    dims: int | None = None


@dataclass
class Subspace:
    """Top-k gradient subspace of one sample: basis ``V`` (p x k, float64) and singular values ``s``."""

    name: str
    V: torch.Tensor
    s: torch.Tensor
    examples: int
    seconds: float
    engine: str = ""
    dims: int | None = None  # the dimension V was drawn in, when a sketch made it not p (the public basis's D)


def _label_seed(seed: int, name: str) -> list[int]:
    """The random labels' seed: ``seed`` and the dataset's identity, not its name as typed
    (:func:`gsd_cli.data.identity.draw_key`)."""
    from ..data.identity import draw_key

    return [seed, zlib.crc32(draw_key(name).encode()), 1]


def sample_labels(sample: gdata.Sample, labels: str, num_classes: int, seed: int,
                  rng: np.random.Generator | None = None) -> torch.Tensor:
    """Labels for the gradients: uniformly random in the model's label space (the authors' choice,
    i.i.d. per row, seeded by ``seed`` and the dataset's identity, or drawn from ``rng``: the private side
    of DP-GSD passes a secret generator), or the dataset's own."""
    if labels not in LABELS:
        raise GSDError(f"--labels must be one of {', '.join(LABELS)} (got {labels!r})")
    if labels == "random":
        rng = rng if rng is not None else np.random.default_rng(_label_seed(seed, sample.source.name))
        return torch.from_numpy(rng.integers(0, num_classes, size=len(sample)))
    y = sample.labels()
    if sample.source.multilabel:
        if y.shape[1] != num_classes:
            raise GSDError(
                f"{sample.source.name} has {y.shape[1]} labels per example but the model has {num_classes} outputs; use --labels random"
            )
        return torch.from_numpy(y.astype(np.float32))
    if len(y) and int(y.max()) >= num_classes:
        raise GSDError(
            f"{sample.source.name} has labels up to {int(y.max())} but the model has {num_classes} classes "
            f"(set by the private dataset); use --labels random"
        )
    return torch.from_numpy(y.astype(np.int64))


def sample_subspace(
    model: nn.Module,
    sample: gdata.Sample,
    *,
    k: int,
    input_size: int,
    channels: int,
    num_classes: int,
    names: Sequence[str],
    labels: str = "random",
    row_norm: str = "unit",
    seed: int = 0,
    loss: LossFn | None = None,
    engine: str = "auto",
    device: str | torch.device = "auto",
    chunk_size: int | None = None,
    progress: Progress | None = None,
    dp: dict | None = None,
    sketch_dim: int | None = None,
    label_seed: int | None = None,
    gram: str = "materialize",
    memory_budget: int | str | None = None,
    prefetch: int | None = None,
    subspace_method: str = "auto",
    basis: torch.Tensor | None = None,
) -> Subspace:
    """Per-sample gradients of ``sample`` at the model's weights, then their top-k subspace.

    With ``dp = {"epsilon", "clip", "mechanism", "rng"}`` the subspace is drawn by the epsilon-DP
    mechanism of :func:`gsd_cli.subspace.dppca.private_top_k_subspace` instead, with the private generator
    ``rng`` for the random labels and the draw (``s`` is then empty: the private singular values are
    never released). ``label_seed`` (default ``seed``) seeds the random labels alone otherwise;
    ``seed`` also seeds the sketch (public). ``prefetch``: chunks of model input prepared by a
    background thread while the current chunk's gradients are computed (0: none; the values are
    the same either way, :mod:`gsd_cli.data.loader`); ``None``: ``AHEAD`` on an accelerator, 0 on a
    CPU, where the loader and the gradients compete for the same cores (measured with
    benchmarks/bench_end_to_end.py: no gain on 2 cores, and more variance). ``subspace_method``: how the non-private top-k
    subspace of the materialised matrix is found (:func:`gsd_cli.subspace.top_k_subspace`). ``basis``: an
    orthonormal p x D basis computed from public data only (``--dp-sketch public``,
    :mod:`gsd_cli.subspace.public_basis`): each row g becomes Q^T g before the clip and the subspace, and the
    subspace found in R^D is mapped back to R^p (V = Q V_D: post-processing)."""
    t0 = time.perf_counter()
    dev = resolve_device(device)
    # Under DP nothing outside the mechanism may depend on the private rows' number (it is min(m, N)):
    # the check below, the progress total and the Gram/materialised choice use the requested m
    # (``dp["m"]``) instead. The mechanism itself needs no k <= rows: it draws k orthonormal directions
    # from any number of rows (fewer rows only make the draw closer to uniform).
    shown = len(sample) if dp is None else int(dp.get("m") or len(sample))
    if k > shown:
        raise GSDError(f"k={k} is larger than the {shown} examples of {sample.source.name}; use --k <= {shown}")
    y = sample_labels(sample, labels, num_classes, seed if label_seed is None else label_seed,
                      rng=None if dp is None else dp["rng"])
    p = sum(dict(model.named_parameters())[n].numel() for n in names)
    cs = chunk_size if chunk_size is not None else default_chunk_size(dev, p)
    if prefetch is None:
        prefetch = AHEAD if dev.type != "cpu" else 0
    if cs < 1:
        raise GSDError(f"--chunk-size must be at least 1 (got {cs})")
    done = 0

    def batches():
        for start, x in sample.batches(input_size, channels, cs, dev, ahead=prefetch):
            yield x, y[start : start + x.shape[0]]

    def on_chunk(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None and dp is None:  # under DP: once, at the end, as m of m (below)
            progress(sample.source.name, done, len(sample))

    info: dict = {}
    if gram != "materialize":
        from ..ghost import choose_gram, ghost_subspace

        if choose_gram(gram, shown, p, memory_budget, sketch_dim or (basis is not None and basis.shape[1])) == "ghost":
            bs = lambda c: ((x, y[s : s + x.shape[0]]) for s, x in sample.batches(input_size, channels, c, dev, ahead=prefetch))  # noqa: E731
            prog = None if progress is None or dp is not None else (lambda d, t: progress(sample.source.name, d, t))
            V, s = ghost_subspace(model, bs, len(sample), names, k, loss=loss, device=dev, row_norm=row_norm,
                                  memory_budget=memory_budget, chunk_size=chunk_size, progress=prog, dp=dp)
            if progress is not None:  # done, whatever the passes' estimated total was (it may have counted a pass not run)
                progress(sample.source.name + DP_PROGRESS, shown, shown)
            return Subspace(sample.source.name, V, s, len(sample) if dp is None else shown, time.perf_counter() - t0, "ghost")
    G = gradient_matrix(model, batches(), len(sample), names, loss, engine, dev, row_norm, on_chunk, info)
    if sketch_dim:
        G = sketch(G, sketch_dim, seed)
    if basis is not None:
        from ..subspace.public_basis import project_rows

        G = project_rows(G, basis)
    if dp is None:
        V, s = top_k_subspace(G, k, subspace_method)
    else:
        from ..subspace.dppca import private_top_k_subspace

        if G.shape[0] < shown:  # fewer rows than m (N < m): zero rows leave B = scale G^T G, hence the law, unchanged,
            G = torch.cat([G, G.new_zeros(shown - G.shape[0], G.shape[1])])  # and the mechanism's shapes no longer tell N
        V = private_top_k_subspace(G, k, dp["epsilon"], dp["clip"], dp["mechanism"], dp["rng"], dp.get("sweeps", 10))
        s = torch.empty(0, dtype=torch.float64)
        if progress is not None:
            progress(sample.source.name + DP_PROGRESS, shown, shown)
    del G
    if basis is not None:
        V = basis.to(V.device, torch.float64) @ V.to(torch.float64)
    return Subspace(sample.source.name, V, s, len(sample) if dp is None else shown, time.perf_counter() - t0, info["engine"])


def sketch(G: torch.Tensor, dim: int, seed: int, block: int = 16384) -> torch.Tensor:
    """G S: a data-independent Gaussian random projection of the rows of G to ``dim`` dimensions.

    S is p x dim with i.i.d. N(0, 1/dim) entries (Johnson-Lindenstrauss), drawn from ``seed`` alone in
    row blocks, so it is never stored whole and is the same for the private and every public matrix.
    It does not look at the data, so applying it before the mechanism costs no privacy; clip after it.
    """
    if dim < 1:
        raise GSDError(f"--dp-sketch must be at least 1 (got {dim})")
    m, p = G.shape
    from ..memory import check_fits

    check_fits(4 * dim * (m + min(block, p)), f"--dp-sketch {dim} ({m} rows and a {min(block, p)}-row block of the "
               f"projection, float32)", "give a smaller --dp-sketch (a few thousand dimensions suffice)", G.device)
    out = torch.zeros(m, dim, dtype=torch.float32, device=G.device)
    for b, j in enumerate(range(0, p, block)):
        w = min(block, p - j)
        gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 7919, b]).generate_state(1)[0]))
        S = torch.randn(w, dim, generator=gen) / math.sqrt(dim)
        out += G[:, j : j + w].float() @ S.to(G.device)
    return out
