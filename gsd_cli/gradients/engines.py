"""The per-sample gradient engines, and the choice between them made once per process.

All compute the same rows (one per example, the selected parameters flattened in
``model.named_parameters()`` order) into a preallocated ``out`` (n x p):

* ``vmap``: ``torch.func.vmap(torch.func.grad(loss of functional_call))`` over a chunk.
* ``hooks``: Opacus's ``GradSampleModule``: per-layer grad samplers for the layers Opacus knows
  (Linear, Conv, GroupNorm, LayerNorm, Embedding...; the convolution one is an unfold + einsum over
  the layer's captured input and output gradient) and torch.func for any other layer with parameters.
* ``layers`` (:mod:`gsd_cli.gradients.layers`): one batched forward, one backward to the outputs of the
  layers that own selected parameters (no summed parameter gradient), then each layer's per-sample
  gradients from its input and output gradient (gsd's rules for Conv2d and Linear, with the chunk in
  channels-last order on a CPU; Opacus's samplers for the other layer types). It refuses a model whose
  examples interact in a batch, or with a layer it has no rule for.

``engine="auto"`` (:func:`start_engine`) decides **once per process and model structure** (model
class, parameter names, shapes and dtypes, the selected names, the loss, the device, the chunk's
shape and dtype) and remembers the decision (:func:`engine_choices`):

* by rule, on every device: ``layers`` where it accepts the model (checked when it opens and on the
  first chunk), else ``vmap``. The evidence (``benchmarks/bench_end_to_end.py --engines``: the three
  engines per chunk of 8, 64 and 128 examples in 11 interleaved rounds, the probe network, ResNet20
  and the FMNIST CNN): ``layers`` was the fastest in 97 of 99 rounds on a 2-core CPU and in 98 of 99
  on an H100 (0.33-0.55x vmap's time there); the README's Speed section has the figures. Between the
  other two, vmap is 1.1-1.6x faster than hooks on a CPU and hooks 1.0-1.7x faster on an H100.
  The rule imports neither Opacus nor torch.func's compiler stack for a Conv2d/Linear model (3.4 s
  and 3 s of a fresh process on the H100 machine, more than all the GPU work of a default rank).
* by measurement, when asked (``measure=True``, or :data:`MEASURE`): every engine that accepts the
  model warmed up on the first chunk, then three rounds in alternating order, and the lowest median
  wins. Before the rule, ``auto`` measured on a GPU; the 3-round measurement of one chunk picked
  hooks for the probe on an H100 where 11 interleaved rounds show ``layers`` 1.7x faster, because
  each round opened a fresh ``layers`` engine and timed its one-time independence check (now the
  vmap and ``layers`` engines stay open across the rounds). Timing one chunk per call instead
  flipped under load on a CPU (hooks for the probe in 3 of 5 calls at load 3) and cost more than it
  saved (``per_sample_gradients`` of 256 inputs: 1.7x a plain vmap call).

An engine that refuses a model (``NotImplementedError``: Opacus refusing a layer with buffers, ``layers``
refusing a BatchNorm in training that is not frozen) is left out; ``vmap`` accepts every model.
"""

from __future__ import annotations

import logging
import statistics
import time
import warnings
from typing import Callable, Sequence

import torch
import torch.nn as nn

from .layers import LayersEngine, LossFn
#: timed rounds per engine when ``auto`` measures (after one untimed warm-up round)
ROUNDS = 3
#: measure instead of the rule, on every device (tests; a device where the rule may not hold)
MEASURE = False


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
        had_mark = hasattr(model, "autograd_grad_sample_hooks")
        try:
            self.gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)
        except BaseException:
            # Opacus adds its hooks layer by layer (their handles in the model's autograd_grad_sample_hooks,
            # which also marks the model as hooked) and refuses at the first layer it cannot treat (one
            # with buffers, e.g. a frozen BatchNorm): the hooks already added would stay on the model and
            # break every later engine (vmap: "an autograd.Function ... must override setup_context"), and
            # the mark would make the next attempt fail with "Trying to add hooks twice"; undo both
            if not had_mark and hasattr(model, "autograd_grad_sample_hooks"):
                for handle in model.autograd_grad_sample_hooks:
                    handle.remove()
                del model.autograd_grad_sample_hooks
            raise

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
#: engines that leave nothing on the model between calls (kept open across measurement rounds)
_STAY_OPEN = ("vmap", "layers")

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
    hits all). Returns ``(name, engine, seconds)``: the engine with the lowest median (ties: the earlier
    in ``kinds``), **open**, with ``out`` holding its rows, and the timings (``seconds[kind]``: the timed
    runs; empty for one that refused). ``timer(fn, device)`` times one run (default :func:`timed`).

    The vmap and ``layers`` engines leave nothing on the model between calls: the ones opened in the
    warm-up stay open through the rounds, so that what is timed is what every later chunk costs (a
    fresh ``layers`` engine would repeat its one-time independence check). The hooks engine puts
    Opacus's hooks on the model, so it is opened and closed around each of its runs, with no other
    engine running meanwhile."""
    timer = timer or timed
    kinds = list(kinds)
    seconds: dict[str, list[float]] = {k: [] for k in kinds}
    kept: dict[str, object] = {}  # open across the rounds
    live = []
    last_ran = None
    try:
        for kind in kinds:  # untimed warm-up round: who accepts the model
            eng, _ = _first(kind, model, names, loss, x, y, out)
            if eng is None:
                continue
            live.append(kind)
            last_ran = kind
            if kind in _STAY_OPEN:
                kept[kind] = eng
            else:
                eng.close()
        if "vmap" not in live:  # vmap accepts every model
            live.insert(0, "vmap")
            kept["vmap"] = VmapEngine(model, names, loss)
            kept["vmap"](x, y, out)
            last_ran = "vmap"
        if len(live) > 1:
            for r in range(rounds):
                for kind in (live if r % 2 else list(reversed(live))):
                    eng = kept.get(kind) or ENGINE_CLASSES[kind](model, names, loss)
                    try:
                        seconds[kind].append(timer(lambda: eng(x, y, out), device))
                    finally:
                        if kind not in kept:
                            eng.close()
                    last_ran = kind
        best = min(live, key=lambda k: (statistics.median(seconds[k]) if seconds[k] else 0.0, kinds.index(k)))
        eng = kept.pop(best, None) or ENGINE_CLASSES[best](model, names, loss)
        if last_ran != best:  # the rows in ``out`` must come from the engine that computes the rest
            try:
                eng(x, y, out)
            except BaseException:
                eng.close()
                raise
        return best, eng, seconds
    finally:
        for eng in kept.values():
            eng.close()


def start_engine(engine: str, model, names, loss, x, y, out, device, info: dict | None = None, measure: bool | None = None):
    """Open the engine for a gradient matrix and compute its first chunk ``(x, y)`` into ``out``.

    ``engine``: ``vmap``, ``hooks``, ``layers`` or ``auto`` (the decision described in the module
    docstring, remembered per :func:`choice_key`). ``measure``, for ``auto``: ``True`` = measure,
    ``False`` = the rule, ``None`` = the rule unless :data:`MEASURE`.
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
        elif not (MEASURE if measure is None else measure):
            eng, why = _first("layers", model, names, loss, x, y, out)
            if eng is not None:
                engine, how = "layers", "rule: layers"
            else:
                engine, how = "vmap", f"rule: vmap (layers refused: {why})"
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
