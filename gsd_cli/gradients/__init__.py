"""Package :mod:`gsd_cli.gradients`: per-sample gradients. This module holds the public API (:func:`per_sample_gradients`, :func:`gradient_matrix`); :mod:`.engines` the engines (vmap, Opacus hooks, and the choice between them) and :mod:`.layers` the ``layers`` engine's per-layer rules. The Gram ("ghost") path is :mod:`gsd_cli.ghost`. Layer: above :mod:`gsd_cli.models`, below :mod:`gsd_cli.subspace`.

Per-sample gradients at fixed weights w0, in chunks, on the chosen device.

Three engines compute the same matrix G (m x p, one row per example): ``vmap`` (torch.func),
``hooks`` (Opacus's ``GradSampleModule``) and ``layers`` (one batched forward, one backward to the layer
outputs, per-layer rules), in :mod:`gsd_cli.gradients.engines`. ``engine="auto"`` picks one once per process and
model structure, by rule on every device (layers where it accepts the model, else vmap; a measurement
when asked, :func:`gsd_cli.gradients.engines.start_engine`), and remembered; ``info["engine"]``
and ``info["engine_choice"]`` say which and how.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .engines import ENGINE_CLASSES as _ENGINE_CLASSES  # noqa: F401  (older name, kept for callers)
from .engines import HooksEngine as _HooksEngine  # noqa: F401
from .engines import VmapEngine as _VmapEngine  # noqa: F401
from .engines import LossFn, start_engine
from .engines import scatter as _scatter  # noqa: F401
from ..errors import GSDError, ModelError
from ..models.params import match_patterns, select_parameters  # noqa: F401 (their home is the models layer)

ENGINES = ("auto", "vmap", "hooks", "layers")


def default_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-example loss: softmax cross-entropy for class indices, sigmoid BCE (summed) for 0/1 rows."""
    if target.dtype.is_floating_point:
        return F.binary_cross_entropy_with_logits(logits, target, reduction="none").sum(-1)
    return F.cross_entropy(logits, target, reduction="none")


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cuda`` without a GPU is a user error."""
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise GSDError("--device cuda was asked for but no CUDA GPU is visible; use --device auto or cpu")
    return dev


def default_chunk_size(device: torch.device, num_params: int) -> int:
    """Examples per chunk: 64 on CPU (cache-friendly), 256 on CUDA; fewer when p is large."""
    base = 256 if device.type == "cuda" else 64
    by_memory = int(2e9 // (4 * max(num_params, 1)))  # at most ~2 GB of per-sample gradients
    return max(1, min(base, by_memory))


@contextlib.contextmanager
def _full_precision():
    """No TF32 while gradients are computed: cuDNN uses it for convolutions by default, which on a GPU
    moves the per-sample gradients by ~1e-3 relative and the distance in its third decimal."""
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        cudnn = torch.backends.cudnn
        with cudnn.flags(
            enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic, allow_tf32=False
        ):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


@contextlib.contextmanager
def _only_trainable(model: nn.Module, names: Sequence[str]):
    keep = set(names)
    saved = {n: p.requires_grad for n, p in model.named_parameters()}
    try:
        for n, p in model.named_parameters():
            p.requires_grad_(n in keep)
        yield
    finally:
        for n, p in model.named_parameters():
            p.requires_grad_(saved[n])


def gradient_matrix(
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    m: int,
    params: Sequence[str] | None = None,
    loss: LossFn | None = None,
    engine: str = "auto",
    device: str | torch.device | None = "auto",
    row_norm: str = "none",
    on_chunk: Callable[[int], None] | None = None,
    info: dict | None = None,
) -> torch.Tensor:
    """Stack per-sample gradients of ``m`` examples that arrive as ``(x, y)`` chunks into G (m x p).

    ``row_norm="unit"`` scales every row to unit L2 norm (zero rows stay zero) as each chunk
    arrives. Returns float32 on ``device``. The model's parameters are not changed. ``info``, when
    given, receives ``info["engine"]``: the engine that computed the rows, and
    ``info["engine_choice"]``: how it was chosen (asked for, rule, measured, remembered).
    """
    if row_norm not in ("unit", "none"):
        raise GSDError(f"--row-norm must be 'unit' or 'none' (got {row_norm!r})")
    if engine not in ENGINES:
        raise GSDError(f"unknown gradient engine {engine!r}; use one of {', '.join(ENGINES)}")
    dev = resolve_device(device)
    names = list(params) if params is not None else select_parameters(model)
    loss = loss or default_loss
    model = model.to(dev)
    p = sum(dict(model.named_parameters())[n].numel() for n in names)
    G = torch.empty(m, p, device=dev)
    row = 0
    eng = None
    was_training = model.training
    try:
        model.train()  # per-sample gradients as in training (Opacus' hooks only fire in train mode)
        with _only_trainable(model, names), _full_precision():
            for x, y in batches:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                n = x.shape[0]
                if row + n > m:
                    raise GSDError(f"more than the announced {m} examples arrived")
                out = G[row : row + n]
                if eng is None:
                    try:
                        kind, eng = start_engine(engine, model, names, loss, x, y, out, dev, info)
                    except NotImplementedError as e:  # Opacus has no per-layer sampler (e.g. a layer with buffers)
                        raise GSDError(f"--engine {engine}: {str(e).splitlines()[0]}; use --engine vmap") from None
                else:
                    eng(x, y, out)
                if row_norm == "unit":
                    norms = out.norm(dim=1, keepdim=True)
                    out /= torch.where(norms > 0, norms, torch.ones_like(norms))
                row += n
                if on_chunk is not None:
                    on_chunk(n)
    finally:
        if eng is not None:
            eng.close()
        model.train(was_training)
    if info is not None:
        info["engine"] = kind if eng is not None else engine
    if row != m:
        raise GSDError(f"expected {m} examples, got {row}")
    return G


def per_sample_gradients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss: LossFn | None = None,
    params: Sequence[str] | str | None = None,
    chunk_size: int | None = None,
    *,
    engine: str = "auto",
    device: str | torch.device | None = "auto",
    row_norm: str = "none",
) -> torch.Tensor:
    """Per-sample gradients of ``loss(model(x_i), y_i)`` w.r.t. the selected parameters: ``(m, p)``.

    ``params``: glob patterns over parameter names (default: all trainable); the columns follow
    ``model.named_parameters()`` order, each parameter flattened. ``loss(logits, targets)`` returns
    per-example losses (default :func:`default_loss`). ``chunk_size`` examples are processed at a time.
    """
    if x.shape[0] != y.shape[0]:
        raise GSDError(f"x has {x.shape[0]} examples but y has {y.shape[0]}")
    names = select_parameters(model, params)
    dev = resolve_device(device)
    p = sum(dict(model.named_parameters())[n].numel() for n in names)
    cs = chunk_size if chunk_size is not None else default_chunk_size(dev, p)
    if cs < 1:
        raise GSDError(f"--chunk-size must be at least 1 (got {cs})")
    chunks = ((x[i : i + cs], y[i : i + cs]) for i in range(0, x.shape[0], cs))
    return gradient_matrix(model, chunks, x.shape[0], names, loss, engine, dev, row_norm)
