"""The ``layers`` per-sample gradient engine: one batched forward, one backward to the layer outputs,
then each layer's per-sample gradients from its input and its output gradient (issue 21, "speed").

For a layer y = f(x; w) applied to example i, the per-example gradient is
dL_i/dw = (dy_i/dw)^T dL_i/dy_i, and when the examples of a batch do not interact, dL_i/dy_i is row i of
the gradient of the *summed* loss with respect to the batched output (the identity Opacus's hooks rest
on). So the engine

1. runs the model once on the chunk, with forward hooks that keep each parameterised layer's input
   and output (only the layers that own selected parameters);
2. calls ``torch.autograd.grad(sum of losses, those outputs)``: autograd then runs only the backward
   steps that lead to those outputs, so no summed parameter gradient is ever formed (Opacus's
   ``GradSampleModule`` forms it and throws it away) and the first layer's backward is skipped;
3. turns each layer's (input, output gradient) into per-example gradients by its rule, looked up in
   :data:`PER_SAMPLE_RULES` (a dict keyed by module type, filled by the :func:`register_per_sample`
   decorator, as Opacus's ``GRAD_SAMPLERS``; the ghost-clipping engine, :mod:`gsd_cli.train.clipsum`,
   takes its materialised layers' gradients from the same rules, so each layer kind has one rule):

   * ``nn.Conv2d`` (zero padding, numeric padding, :func:`conv2d_plain`): dL_i/dW[o, c, a, b] =
     sum_t g_i[o, t] x_i[c, t_a, t_b], t over output positions. :func:`conv2d_per_sample` is the one
     place that chooses the path: with one group, fewer than ``GROUPED_MIN_CHANNELS`` input channels
     and at most ``PATCHES_MAX`` patch entries per example, one batched matrix product of the output
     gradient (n x T x O) with the input's patches (n x T x kh kw C), read from the input in
     channels-last order by ``as_strided``; otherwise torch's own weight-gradient kernel run as one
     convolution with n x groups groups (what ``vmap``'s batching rule does), where the patches would
     be kh kw / (sh sw) times the input. On a CPU a model with a MaxPool2d
     gets the chunk in channels-last order: max-pooling a channels-first 64 x 64 x 44 x 44 map takes
     20-26 ms against 1.7 ms channels-last on the 2-core CPU, and the patches are then contiguous runs
     of kw x C floats. This is gsd's own rule because Opacus's convolution sampler unfolds a contiguous
     channels-first input (its ``unfold2d``): fed a channels-last chunk it needs a copy, and the
     probe's chunk took 75-79 ms with it against 59-65 ms here;
   * ``nn.Linear`` (torch's own forward): dL_i/dW = sum_t g_i[t] x_i[t]^T (t over any middle
     dimensions), dL_i/db = sum_t g_i[t];
   * a frozen BatchNorm (eval mode, ``--batchnorm freeze``, the registered backbones'
     ``FrozenBatchNorm2d``: running statistics, torch's own forward): y = x_hat w + b per channel with
     x_hat = (x - running_mean) / sqrt(running_var + eps), so dL_i/dw = rsqrt(running_var + eps)
     sum_t g_i[t] (x_i[t] - running_mean) and dL_i/db = sum_t g_i[t] (Opacus has no sampler for
     BatchNorm: it refuses the layer);
   * every other layer type Opacus has a per-layer grad sampler for (GroupNorm, LayerNorm, Embedding,
     Conv1d/3d, RMSNorm, ...): that sampler, on the same captured tensors.
     Opacus is imported only then (``import opacus`` takes 1.4 s on the 2-core CPU, more than the
     engine saves on a rank of the probe).

A layer called more than once per forward (shared weights) contributes the sum of its calls.

Per-chunk time on the probe (chunk of 64 at 224 x 224, 2 threads, ``benchmarks/bench_end_to_end.py
--engines``): see the README's Speed section.

The engine refuses (``NotImplementedError``, so ``engine="auto"`` takes ``vmap``) a model it cannot
treat exactly: a selected parameter owned by a layer without a rule or by a non-leaf module, a
BatchNorm layer in training mode that is not frozen (it mixes the examples of a batch), a layer whose output is changed
in place during the forward (the captured output would no longer be the layer's), and, checked on the
first chunk with two or more examples, a model where the first example's row changes when the other
examples of its batch do (any other way the examples of a batch interact, e.g. a functional batch
statistic or dropout's random masks).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch
import torch.nn as nn

from .patches import conv2d_input_patches, same_channels  # noqa: F401 (their old home: gradients.layers)
from .taps import broadcast_tap, input_tap, maxpool_channels_last  # noqa: F401 (their old home: gradients.layers)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: the independence check's tolerance (:meth:`LayersEngine._check`): example 0's row in two batches of the
#: same shape may differ by float32 rounding, no more: ||a - b|| <= CHECK_RTOL ||b|| + CHECK_ATOL sqrt(p)
CHECK_RTOL = 1e-4
CHECK_ATOL = 1e-6
#: input channels from which a Conv2d's per-example gradients come from the grouped weight-gradient
#: kernel instead of patches (64 examples, 2-core CPU, ``benchmarks/bench_layer_rules.py``: patches win
#: with 1 or 3 input channels, the grouped kernel with 16 to 64 channels and 3x3 kernels, where the
#: patches are 9 times the input)
GROUPED_MIN_CHANNELS = 16
#: the most patch entries (T kh kw C) per example for which a Conv2d with fewer input channels takes
#: the patches: the one threshold of both engines (issue 51; the ghost-clipping engine had 1 << 16, the
#: layers engine none). Measured on the 2-core CPU: patches win at 12.5k entries (FMNIST CNN's conv1:
#: 3.7 ms against 4.1 ms per 250 examples) and at 372k (the probe's conv1, channels-last chunk of 64:
#: 28 ms against 42 ms, ``benchmarks/results/cpu_layer_rules.json``), the grouped kernel at 1.8M
#: (ResNet-18's conv1 at 224: 49 ms against 110 ms per 16); the bound lies between the last two
PATCHES_MAX = 1 << 20

#: gsd's own per-sample rules by module type (as Opacus's ``GRAD_SAMPLERS``): type -> (applies, rule),
#: ``rule(layer, x, g) -> {parameter: n x shape}`` from the layer's input ``x`` and output gradient ``g``
PER_SAMPLE_RULES: dict[type, tuple[Callable[[nn.Module], bool], Callable]] = {}


def register_per_sample(*module_types: type, applies: Callable[[nn.Module], bool]):
    """Decorator: ``fn(layer, x, g)`` is gsd's per-sample rule for the modules of ``module_types`` (and
    their subclasses, found along the MRO) that ``applies`` accepts."""

    def deco(fn):
        for t in module_types:
            if t in PER_SAMPLE_RULES:
                raise ValueError(f"a per-sample rule for {t.__name__} is already registered")
            PER_SAMPLE_RULES[t] = (applies, fn)
        return fn

    return deco


def own_rule(layer: nn.Module):
    """gsd's per-sample rule ``fn(layer, x, g)`` for ``layer`` (the first registered type along its
    MRO whose ``applies`` accepts it), or ``None``."""
    for cls in type(layer).__mro__:
        entry = PER_SAMPLE_RULES.get(cls)
        if entry is not None and entry[0](layer):
            return entry[1]
    return None


def conv2d_plain(layer: nn.Module) -> bool:
    """A Conv2d with torch's own forward, zero padding and numeric padding (any groups): the layers
    every engine's Conv2d rule takes (this one, ghost clipping's, the Gram path's)."""
    return type(layer).forward is nn.Conv2d.forward and layer.padding_mode == "zeros" and not isinstance(layer.padding, str)


def linear_plain(layer: nn.Module) -> bool:
    """A Linear with torch's own forward: the layers every engine's Linear rule takes."""
    return type(layer).forward is nn.Linear.forward


def patches_fit(layer: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> bool:
    """Whether a Conv2d call takes the patches (:func:`conv2d_patches`) rather than the grouped kernel:
    one group, fewer than :data:`GROUPED_MIN_CHANNELS` input channels, at most :data:`PATCHES_MAX`
    patch entries per example."""
    kk = layer.kernel_size[0] * layer.kernel_size[1]
    C = x.shape[1]
    return layer.groups == 1 and C < GROUPED_MIN_CHANNELS and g.shape[2] * g.shape[3] * kk * C <= PATCHES_MAX


@register_per_sample(nn.Conv2d, applies=conv2d_plain)
def conv2d_per_sample(layer: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of a Conv2d from its input ``x`` (n x C x H x W, any memory format) and its
    output gradient ``g`` (n x O x oh x ow): by patches (:func:`conv2d_patches`) where
    :func:`patches_fit`, else by one grouped weight-gradient convolution (:func:`conv2d_grouped`)."""
    if patches_fit(layer, x, g):
        return conv2d_patches(layer, x, g)
    return conv2d_grouped(layer, x, g)


_SHAPE_WEIGHTS: dict = {}


def weight_of_shape(shape, dtype, device) -> torch.Tensor:
    """A zero tensor of ``shape`` to pass as the weight of a weight-gradient-only
    ``convolution_backward`` (output mask ``[False, True, False]``: the weight gives the shape and is
    not read), cached: the n-group per-example kernel used to copy the weight n times per call
    (``expand(...).reshape``: 9 MB for a 64-channel 3x3 layer at 64 examples)."""
    key = (tuple(shape), dtype, str(device))
    w = _SHAPE_WEIGHTS.get(key)
    if w is None:
        if len(_SHAPE_WEIGHTS) >= 64:
            _SHAPE_WEIGHTS.clear()
        w = _SHAPE_WEIGHTS[key] = torch.zeros(shape, dtype=dtype, device=device)
    return w


def conv2d_grouped(layer: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example Conv2d gradients (any groups) as torch's own weight-gradient kernel computes them for
    a convolution with n x groups groups: the chunk as one example of n C channels, the output gradient
    as n O channels (what ``torch.func.vmap``'s batching rule for ``convolution_backward`` does)."""
    n, C, H, W = x.shape
    O, oh, ow = g.shape[1], g.shape[2], g.shape[3]
    out = {}
    if layer.weight.requires_grad:
        w = layer.weight.detach()
        _, gw, _ = torch.ops.aten.convolution_backward(
            g.reshape(1, n * O, oh, ow), x.reshape(1, n * C, H, W).to(g.dtype), weight_of_shape((n * O, *w.shape[1:]), g.dtype, g.device),
            None, layer.stride, layer.padding, layer.dilation, False, [0, 0], n * layer.groups, [False, True, False])
        out[layer.weight] = gw.view(n, *w.shape)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = g.sum((2, 3))
    return out


def conv2d_patches(layer: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of a one-group Conv2d by one batched matmul of g (n x T x O) with the
    input's patches (:func:`conv2d_input_patches`), then the weight's axes put back (n x O x C x kh x kw).
    Channels that are copies of one (:func:`same_channels`: grey images at a colour model's input) have the same
    patches, so the same gradient: dL_i/dW[o, c, a, b] = sum_t g_i[o, t] x_i[c, t_a, t_b] does not depend on c. It
    is computed for the first channel and repeated (the same products, a third of them for three channels)."""
    n, C = x.shape[:2]
    kh, kw = layer.kernel_size
    copies = C if same_channels(x) else 1
    if copies > 1:
        x, C = x[:, :1], 1
    A = conv2d_input_patches(layer, x)
    gt = g.permute(0, 2, 3, 1).reshape(n, g.shape[2] * g.shape[3], g.shape[1])  # n T O
    out = {}
    if layer.weight.requires_grad:
        w = torch.bmm(gt.transpose(1, 2), A.to(gt.dtype))  # n O (kh kw C)
        out[layer.weight] = w.view(n, -1, kh, kw, C).permute(0, 1, 4, 2, 3)
        if copies > 1:
            out[layer.weight] = out[layer.weight].expand(-1, -1, copies, -1, -1)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = gt.sum(1)
    return out


@register_per_sample(nn.Linear, applies=linear_plain)
def linear_per_sample(layer: nn.Linear, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of a Linear layer: sum over any middle dimensions t of g_t x_t^T (weight)
    and g_t (bias)."""
    n = x.shape[0]
    x3, g3 = x.reshape(n, -1, x.shape[-1]).to(g.dtype), g.reshape(n, -1, g.shape[-1])
    out = {}
    if layer.weight.requires_grad:
        out[layer.weight] = torch.bmm(g3.transpose(1, 2), x3)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = g3.sum(1)
    return out


def frozen_batchnorm(layer: nn.Module) -> bool:
    """A BatchNorm that normalises every example with its running statistics (eval mode, or gsd's frozen
    classes: ``--batchnorm freeze``, the registered backbones' ``FrozenBatchNorm2d``) and whose forward is
    torch's own: each example's output depends on that example alone."""
    from probes.backbones import FrozenBatchNorm2d

    from ..models.exact import is_frozen

    if not isinstance(layer, nn.modules.batchnorm._BatchNorm) or layer.running_mean is None or layer.running_var is None:
        return False
    fwd = type(layer).forward
    if fwd is FrozenBatchNorm2d.forward:
        return True
    return fwd is nn.modules.batchnorm._BatchNorm.forward and (layer.training is False or is_frozen(layer))


@register_per_sample(nn.modules.batchnorm._BatchNorm, applies=frozen_batchnorm)
def batchnorm_per_sample(layer: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of a frozen BatchNorm (:func:`frozen_batchnorm`): y = x_hat w + b per
    channel (dimension 1), x_hat = (x - running_mean) / sqrt(running_var + eps), so example i's
    gradients are rsqrt(running_var + eps) times the sum over its other dimensions of g (x - running_mean)
    (weight; the scale per channel applied after the sum: three passes over the activations instead of
    the five of forming x_hat and g x_hat) and the sum of g (bias), in the tensors' own memory format
    (no copy of a channels-last map). The one BatchNorm rule of both engines (issue 51)."""
    out = {}
    shape = (1, -1) + (1,) * (x.dim() - 2)
    dims = tuple(range(2, x.dim()))
    if layer.weight is not None and layer.weight.requires_grad:
        gx = g * (x.to(g.dtype) - layer.running_mean.view(shape))
        out[layer.weight] = (gx.sum(dims) if dims else gx) * torch.rsqrt(layer.running_var + layer.eps)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = g.sum(dims) if dims else g
    return out


def _opacus_samplers() -> dict:
    from opacus.grad_sample.grad_sample_module import GradSampleModule

    return GradSampleModule.GRAD_SAMPLERS


def _rule(layer: nn.Module):
    """``fn(layer, args, g) -> {param: per-example grads}`` for ``layer`` (gsd's own rules of
    :data:`PER_SAMPLE_RULES` first, then Opacus's samplers), or ``None``."""
    fn = own_rule(layer)
    if fn is not None:
        return lambda m, args, g: fn(m, args[0], g)
    sampler = _opacus_samplers().get(type(layer))
    if sampler is None:
        return None
    return lambda m, args, g: sampler(m, [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args], g.contiguous())


def parameter_owners(model: nn.Module) -> dict[int, tuple[str, nn.Module, str]]:
    """``id(parameter) -> (the owning module's name, the module, the parameter's local name)`` for every parameter."""
    return {id(p): (prefix, mod, local) for prefix, mod in model.named_modules() for local, p in mod.named_parameters(recurse=False)}


class LayersEngine:
    """Per-sample gradients from one batched forward and one backward to the layer outputs (module
    docstring). Opening it refuses (``NotImplementedError``) a model it cannot treat exactly; so may its
    first call with two or more examples (the independence check)."""

    name = "layers"

    def __init__(self, model: nn.Module, names: Sequence[str], loss: LossFn):
        self.model, self.loss, self.names = model, loss, list(names)
        params = dict(model.named_parameters())
        self.params = [params[n] for n in self.names]
        owner = parameter_owners(model)
        layers: dict[int, nn.Module] = {}
        taps: dict[int, tuple[nn.Module, Callable]] = {}  # id(parameter) -> (tap module, rule of its input gradient)
        for n, p in zip(self.names, self.params):
            prefix, mod, local = owner[id(p)]
            if list(mod.children()):
                tap = broadcast_tap(mod, local)
                if tap is None:
                    raise NotImplementedError(f"parameter {n} belongs to {prefix or 'the model'}, which has sub-layers; "
                                              f"the layers engine needs every selected parameter in a leaf layer")
                taps[id(p)] = (tap[0], (lambda f, q: lambda _m, _a, g: {q: f(g)})(tap[1], p))
                continue
            layers[id(mod)] = mod
        for prefix, mod in model.named_modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.training is not False and not frozen_batchnorm(mod):
                raise NotImplementedError(f"layer {prefix} is a BatchNorm, which mixes the examples of a batch in training")
        self.layers = list(layers.values())
        self.rules = []
        for mod in self.layers:
            rule = _rule(mod)
            if rule is None:
                raise NotImplementedError(f"no per-sample rule for layer type {type(mod).__name__}")
            self.rules.append(rule)
        self.taps = set(range(len(self.layers), len(self.layers) + len(taps)))  # indices hooked on their input
        for mod, rule in taps.values():
            self.layers.append(mod)
            self.rules.append(rule)
        # channels-last on a CPU where the model max-pools: PyTorch's channels-first max_pool2d is the
        # slow kernel there (module docstring); elsewhere the layout stays (ResNet20 is faster without)
        self.channels_last = any(isinstance(m, nn.MaxPool2d) for m in model.modules())
        self.checked = False

    def _rows(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
        if self.channels_last and x.dim() == 4 and x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        calls: list[tuple[int, tuple, torch.Tensor, int]] = []
        handles = []

        def hook(i):
            def h(mod, args, output):
                if not isinstance(output, torch.Tensor):
                    raise NotImplementedError(f"layer type {type(mod).__name__} returns {type(output).__name__}, not one tensor")
                calls.append((i, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args), output, output._version))

            return h

        try:
            if self.channels_last:
                handles += maxpool_channels_last(self.model)
            for i, mod in enumerate(self.layers):
                if i in self.taps:  # its "output" is its module's input
                    handles.append(mod.register_forward_pre_hook(input_tap(lambda a, i=i: calls.append((i, (), a, a._version)))))
                else:
                    handles.append(mod.register_forward_hook(hook(i)))
            total = self.loss(self.model(x), y).sum()
        finally:
            for h in handles:
                h.remove()
        for i, _, o, version in calls:
            if o._version != version:
                raise NotImplementedError(f"the output of a {type(self.layers[i]).__name__} layer is changed in place "
                                          f"during the forward (e.g. ReLU(inplace=True))")
        outputs = [c[2] for c in calls if c[2].requires_grad]
        grads = iter(torch.autograd.grad(total, outputs, allow_unused=True) if outputs else ())
        per: dict[int, torch.Tensor] = {}
        for i, args, o, _ in calls:
            if not o.requires_grad:
                continue
            g = next(grads)
            if g is None:  # the loss does not depend on this call
                continue
            for p, gs in self.rules[i](self.layers[i], args, g).items():
                per[id(p)] = gs if id(p) not in per else per[id(p)] + gs
        n = x.shape[0]
        col = 0
        for p in self.params:
            w = p.numel()
            if id(p) in per:
                out[:, col : col + w] = per[id(p)].reshape(n, w)
            else:  # a parameter the loss does not use: zero rows
                out[:, col : col + w] = 0
            col += w

    def __call__(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
        self._rows(x, y, out)
        if not self.checked and x.shape[0] >= 2:
            self._check(x, y, out)

    def _check(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> None:
        """Example 0's row must not depend on the other examples of its batch: the chunk again, with every
        other example replaced by a copy of example 0, must give example 0 the same row (the same shapes
        run the same kernels, so it is the same to rounding; a row computed alone would not do: a
        different batch size may round the forward differently and flip a near-tie of a max-pool)."""
        same = torch.empty_like(out[:1]).expand(x.shape[0], -1).contiguous()
        self._rows(x[:1].expand_as(x).contiguous(), y[:1].expand_as(y).contiguous(), same)
        err, scale = float((same[0] - out[0]).norm()), float(out[0].norm())
        if not err <= CHECK_RTOL * scale + CHECK_ATOL * math.sqrt(out.shape[1]):
            raise NotImplementedError(
                "the examples of a batch interact in this model (an example's gradient changes by "
                f"{err / max(scale, 1e-30):.2g} relative when the rest of its batch changes: e.g. a batch statistic or dropout)")
        self.checked = True

    def close(self) -> None:
        pass
