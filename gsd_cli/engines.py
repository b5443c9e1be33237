"""The per-sample gradient engines, and the choice between them made once per process.

All compute the same rows (one per example, the selected parameters flattened in
``model.named_parameters()`` order) into a preallocated ``out`` (n x p):

* ``vmap``: ``torch.func.vmap(torch.func.grad(loss of functional_call))`` over a chunk.
* ``hooks``: Opacus's ``GradSampleModule``: per-layer grad samplers for the layers Opacus knows
  (Linear, Conv, GroupNorm, LayerNorm, Embedding...; the convolution one is an unfold + einsum over
  the layer's captured input and output gradient) and torch.func for any other layer with parameters.
* ``layers`` (:mod:`gsd_cli.engine_layers`): one batched forward, one backward to the outputs of the
  layers that own selected parameters (no summed parameter gradient), then each layer's per-sample
  gradients from its input and output gradient (gsd's rules for Conv2d and Linear, with the chunk in
  channels-last order on a CPU; Opacus's samplers for the other layer types). It refuses a model whose
  examples interact in a batch, or with a layer it has no rule for.

``engine="auto"`` (:func:`start_engine`) decides **once per process and model structure** (model
class, parameter names, shapes and dtypes, the selected names, the loss, the device, the chunk's
shape and dtype) and remembers the decision (:func:`engine_choices`):

* on a CPU, by rule: ``layers`` where it accepts the model (checked when it opens and on the first
  chunk), else ``vmap``. Measured on a 2-core CPU (``benchmarks/bench_end_to_end.py --engines``:
  interleaved rounds per chunk of 8, 64 and 128 examples): see the README's Speed section for the
  figures of each model. Between the other two, vmap is 1.1-1.6x faster than hooks on the probe
  network and 1.2-1.5x on ResNet20, each in 10-11 of 11 rounds; the FMNIST CNN is a tie. Timing one
  chunk per call instead flipped under load (hooks for the probe in 3 of 5 calls at load 3) and cost
  more than it saved (``per_sample_gradients`` of 256 inputs: 1.7x a plain vmap call).
* on a GPU, by measurement: every engine that accepts the model warmed up on the first chunk, then
  three rounds in alternating order, and the lowest median wins (on an H100, before ``layers``
  existed, hooks won on ResNet20, 1.4x, and tied on the probe). The measurement costs about 3 x 4
  chunks, once.

An engine that refuses a model (``NotImplementedError``: Opacus refusing a layer with buffers, ``layers``
refusing a BatchNorm) is left out; ``vmap`` accepts every model.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from typing import Callable, Sequence

import torch
import torch.nn as nn

from .engine_layers import LayersEngine, LossFn
#: timed rounds per engine when ``auto`` measures (after one untimed warm-up round)
ROUNDS = 3
#: measure on a CPU too instead of the rule (tests; a CPU where the rule may not hold)
MEASURE_ON_CPU = False


def scatter(out: torch.Tensor, grads: Sequence[torch.Tensor]) -> None:
    """Copy per-sample gradients (n x param shape each) into the columns of ``out`` (n x p)."""
    col = 0
    for g in grads:
        w = g[0].numel()
        out[:, col : col + w] = g.reshape(out.shape[0], w)
        col += w


class VmapEngine:
    """Per-sample gradients by ``torch.func``: ``vmap(grad(loss of functional_call))``."""

    name = "vmap"

    def __init__(self, model: nn.Module, names: Sequence[str], loss: LossFn):
        from torch.func import functional_call, grad, vmap

        params = dict(model.named_parameters())
        self.names = list(names)
        frozen = {n: p.detach() for n, p in params.items() if n not in set(names)}
        buffers = {n: b.detach() for n, b in model.named_buffers()}

        def one(selected, x, y):
            out = functional_call(model, (selected, frozen, buffers), (x.unsqueeze(0),))
            return loss(out, y.unsqueeze(0)).sum()

        self._fn = vmap(grad(one), in_dims=(None, 0, 0), randomness="different")
        self._selected = {n: params[n].detach() for n in names}

    def __call__(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
        g = self._fn(self._selected, x, y)
        scatter(out, [g[n] for n in self.names])

    def close(self) -> None:
        pass


class HooksEngine:
    """Per-sample gradients by Opacus's ``GradSampleModule`` (per-layer samplers); ``close`` removes
    its hooks (they break vmap on the same model)."""

    name = "hooks"

    def __init__(self, model: nn.Module, names: Sequence[str], loss: LossFn):
        from opacus import GradSampleModule

        logging.getLogger("opacus").setLevel(logging.ERROR)
        self.model = model
        self.loss = loss
        self.params = [dict(model.named_parameters())[n] for n in names]
        self.gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
        for p in self.params:
            p.grad = None
            p.grad_sample = None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
            self.loss(self.gsm(x), y).sum().backward()
        # a parameter the loss does not use has no grad_sample: its per-sample gradients are zero
        scatter(out, [torch.zeros_like(p).expand(x.shape[0], *p.shape) if p.grad_sample is None else p.grad_sample for p in self.params])
        for p in self.params:
            p.grad = None
            p.grad_sample = None

    def close(self) -> None:
        self.gsm._close()


ENGINE_CLASSES = {"vmap": VmapEngine, "hooks": HooksEngine, "layers": LayersEngine}
#: the engines ``auto`` measures (on a GPU), in the order of their first round
MEASURED = ("vmap", "hooks", "layers")

#: choice key -> {"engine", "how", "seconds"}: the decisions ``auto`` made in this process
_CHOICES: dict[tuple, dict] = {}


def engine_choices() -> dict[tuple, dict]:
    """A copy of the decisions ``engine="auto"`` made in this process, by choice key."""
    return {k: dict(v) for k, v in _CHOICES.items()}


def forget_engine_choices() -> None:
    """Forget every decision: the next ``auto`` call decides afresh (tests, benchmarks)."""
    _CHOICES.clear()


def choice_key(model: nn.Module, names: Sequence[str], loss: LossFn, x: torch.Tensor, device: torch.device) -> tuple:
    """What the faster engine depends on: the model's structure (class, parameter names, shapes and
    dtypes, never the weights), the selected names, the loss, the device and the chunk's shape."""
    cls = type(model)
    shapes = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters())
    loss_name = f"{getattr(loss, '__module__', '')}.{getattr(loss, '__qualname__', type(loss).__qualname__)}"
    return (f"{cls.__module__}.{cls.__qualname__}", shapes, tuple(names), loss_name, str(device), tuple(x.shape), str(x.dtype))


def timed(fn: Callable[[], None], device: torch.device) -> float:
    """Wall seconds of ``fn()``, with the device synchronised before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _open(kind: str, model, names, loss):
    """The engine ``kind``; a refusal (``NotImplementedError``) gives ``None``."""
    try:
        return ENGINE_CLASSES[kind](model, names, loss)
    except NotImplementedError:
        return None


def _first(kind: str, model, names, loss, x, y, out):
    """Open ``kind`` and compute the chunk into ``out``: ``(engine, None)``, or ``(None, reason)`` when it
    refuses the model on opening or on this first chunk (the ``layers`` engine's independence check)."""
    eng = None
    try:
        eng = ENGINE_CLASSES[kind](model, names, loss)
        eng(x, y, out)
        return eng, None
    except NotImplementedError as e:
        if eng is not None:
            eng.close()
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__


def measure_engines(model, names, loss, x, y, out, device, rounds: int = ROUNDS, timer=None, kinds=MEASURED):
    """Time the engines ``kinds`` on the chunk ``(x, y)``: one untimed warm-up round (:func:`_first`;
    an engine that refuses the model drops out), then ``rounds`` rounds in alternating order (so a change of load
    hits all), one engine open at a time. Returns ``(name, engine, seconds)``: the engine with the lowest
    median (ties: the earlier in ``kinds``), **open**, with ``out`` holding its rows, and the timings
    (``seconds[kind]``: the timed runs; empty for one that refused). ``timer(fn, device)`` times one run
    (default :func:`timed`)."""
    timer = timer or timed
    kinds = list(kinds)
    seconds: dict[str, list[float]] = {k: [] for k in kinds}
    live = []
    last = None
    try:
        for kind in kinds:  # untimed warm-up round: who accepts the model
            if last is not None:
                last.close()
            last, _ = _first(kind, model, names, loss, x, y, out)
            if last is not None:
                live.append(kind)
        if "vmap" not in live:  # vmap accepts every model
            live.insert(0, "vmap")
        if len(live) == 1:
            if last is None or last.name != live[0]:
                if last is not None:
                    last.close()
                last = VmapEngine(model, names, loss)
                last(x, y, out)
            return live[0], last, seconds
        for r in range(rounds):
            for kind in (live if r % 2 else list(reversed(live))):
                if last is not None:
                    last.close()
                last = None
                last = ENGINE_CLASSES[kind](model, names, loss)
                seconds[kind].append(timer(lambda: last(x, y, out), device))
        best = min(live, key=lambda k: (statistics.median(seconds[k]), kinds.index(k)))
        if last.name != best:  # the rows in ``out`` must come from the engine that computes the rest
            last.close()
            last = None
            last = ENGINE_CLASSES[best](model, names, loss)
            last(x, y, out)
        return best, last, seconds
    except BaseException:
        if last is not None:  # no Opacus hook may stay on the model
            last.close()
        raise


def start_engine(engine: str, model, names, loss, x, y, out, device, info: dict | None = None, measure: bool | None = None):
    """Open the engine for a gradient matrix and compute its first chunk ``(x, y)`` into ``out``.

    ``engine``: ``vmap``, ``hooks``, ``layers`` or ``auto`` (the decision described in the module
    docstring, remembered per :func:`choice_key`). ``measure``, for ``auto``: ``None`` = by rule on a
    CPU (unless :data:`MEASURE_ON_CPU`) and measured elsewhere; ``True`` = measure; ``False`` = vmap.
    ``info`` receives ``engine_choice``: how the engine was chosen. Returns ``(name, engine)``, the
    engine open."""
    if engine != "auto":
        eng = ENGINE_CLASSES[engine](model, names, loss)  # NotImplementedError: the caller's message
        eng(x, y, out)
        how = "asked for"
    else:
        key = choice_key(model, names, loss, x, device)
        known = _CHOICES.get(key)
        if known is not None:
            engine, how = known["engine"], f"remembered ({known['how']})"
            eng, _ = _first(engine, model, names, loss, x, y, out)
            if eng is None:  # the same structure, but this model's first chunk was refused (layers' check)
                eng = VmapEngine(model, names, loss)
                eng(x, y, out)
        elif measure is False:
            how = "vmap (measure=False)"
            engine, eng = "vmap", VmapEngine(model, names, loss)
            eng(x, y, out)
            _CHOICES[key] = {"engine": "vmap", "how": how, "seconds": {}}
        elif measure is None and device.type == "cpu" and not MEASURE_ON_CPU:
            eng, why = _first("layers", model, names, loss, x, y, out)
            if eng is not None:
                engine, how = "layers", "rule: layers on a CPU"
            else:
                engine, how = "vmap", f"rule: vmap on a CPU (layers refused: {why})"
                eng = VmapEngine(model, names, loss)
                eng(x, y, out)
            _CHOICES[key] = {"engine": engine, "how": how, "seconds": {}}
        else:
            engine, eng, seconds = measure_engines(model, names, loss, x, y, out, device)
            med = {k: statistics.median(v) for k, v in seconds.items() if v}
            how = ("measured: " + ", ".join(f"{k} {v:.4g} s" for k, v in med.items())
                   + f" per chunk of {x.shape[0]} (median of {ROUNDS})") if med else "vmap: the other engines refuse a layer"
            _CHOICES[key] = {"engine": engine, "how": how, "seconds": seconds}
        engine = eng.name
    if info is not None:
        info["engine_choice"] = how
    return engine, eng
