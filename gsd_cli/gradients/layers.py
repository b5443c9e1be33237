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
3. turns each layer's (input, output gradient) into per-example gradients by its rule:

   * ``nn.Conv2d`` (one group, zero padding): dL_i/dW[o, c, a, b] = sum_t g_i[o, t] x_i[c, t_a, t_b],
     t over output positions. With few input channels (fewer than ``GROUPED_MIN_CHANNELS``): one
     batched matrix product of the output gradient (n x T x O) with the input's patches (n x T x kh kw
     C), read from the input in channels-last order by ``as_strided``; with more, torch's own
     weight-gradient kernel run as one convolution with n groups (what ``vmap``'s batching rule does),
     where the patches would be kh kw / (sh sw) times the input. On a CPU a model with a MaxPool2d
     gets the chunk in channels-last order: max-pooling a channels-first 64 x 64 x 44 x 44 map takes
     20-26 ms against 1.7 ms channels-last on the 2-core CPU, and the patches are then contiguous runs
     of kw x C floats. This is gsd's own rule because Opacus's convolution sampler unfolds a contiguous
     channels-first input (its ``unfold2d``): fed a channels-last chunk it needs a copy, and the
     probe's chunk took 75-79 ms with it against 59-65 ms here;
   * ``nn.Linear``: dL_i/dW = sum_t g_i[t] x_i[t]^T (t over any middle dimensions), dL_i/db = sum_t g_i[t];
   * a frozen BatchNorm (eval mode, ``--batchnorm freeze``, the registered backbones'
     ``FrozenBatchNorm2d``: running statistics, torch's own forward): y = x_hat w + b per channel with
     x_hat = (x - running_mean) / sqrt(running_var + eps), so dL_i/dw = sum_t g_i[t] x_hat_i[t] and
     dL_i/db = sum_t g_i[t] (Opacus has no sampler for BatchNorm: it refuses the layer);
   * every other layer type Opacus has a per-layer grad sampler for (GroupNorm, LayerNorm, Embedding,
     Conv1d/3d, grouped convolutions, RMSNorm, ...): that sampler, on the same captured tensors.
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
import torch.nn.functional as F

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


def conv2d_rule_applies(layer: nn.Module) -> bool:
    """gsd's own Conv2d rule: a plain ``nn.Conv2d`` with one group and numeric zero padding."""
    return (type(layer).forward is nn.Conv2d.forward and layer.groups == 1 and layer.padding_mode == "zeros"
            and not isinstance(layer.padding, str))


def conv2d_per_sample(layer: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of a Conv2d from its input ``x`` (n x C x H x W, any memory format) and its
    output gradient ``g`` (n x O x oh x ow): by patches (:func:`conv2d_patches`) for fewer than
    :data:`GROUPED_MIN_CHANNELS` input channels, else by one grouped weight-gradient convolution."""
    if x.shape[1] >= GROUPED_MIN_CHANNELS:
        return conv2d_grouped(layer, x, g)
    return conv2d_patches(layer, x, g)


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
    """Per-example Conv2d gradients as torch's own weight-gradient kernel computes them for a
    convolution with n groups: the chunk as one example of n C channels, the output gradient as n O
    channels (what ``torch.func.vmap``'s batching rule for ``convolution_backward`` does)."""
    n, C, H, W = x.shape
    O, oh, ow = g.shape[1], g.shape[2], g.shape[3]
    out = {}
    if layer.weight.requires_grad:
        w = layer.weight.detach()
        _, gw, _ = torch.ops.aten.convolution_backward(
            g.reshape(1, n * O, oh, ow), x.reshape(1, n * C, H, W).to(g.dtype), weight_of_shape((n * O, *w.shape[1:]), g.dtype, g.device),
            None, layer.stride, layer.padding, layer.dilation, False, [0, 0], n, [False, True, False])
        out[layer.weight] = gw.view(n, *w.shape)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = g.sum((2, 3))
    return out


def conv2d_patches(layer: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example Conv2d gradients by one batched matmul of g (n x T x O) with the input's patches
    (n x T x kh kw C, channels-last order), then the weight's axes put back (n x O x C x kh x kw)."""
    n, C = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = layer.kernel_size, layer.stride, layer.dilation, layer.padding
    oh, ow = g.shape[2], g.shape[3]
    xl = x.permute(0, 2, 3, 1)  # n H W C: a contiguous view when x is channels-last
    if ph or pw:
        xl = F.pad(xl, (0, 0, pw, pw, ph, ph))
    xl = xl.contiguous()
    H, W = xl.shape[1], xl.shape[2]
    patches = xl.as_strided((n, oh, ow, kh, kw, C), (H * W * C, sh * W * C, sw * C, dh * W * C, dw * C, 1))
    A = patches.reshape(n, oh * ow, kh * kw * C)
    gt = g.permute(0, 2, 3, 1).reshape(n, oh * ow, g.shape[1])  # n T O
    out = {}
    if layer.weight.requires_grad:
        w = torch.bmm(gt.transpose(1, 2), A.to(gt.dtype))  # n O (kh kw C)
        out[layer.weight] = w.view(n, -1, kh, kw, C).permute(0, 1, 4, 2, 3)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = gt.sum(1)
    return out


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


def batchnorm_per_sample(layer: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
    """Per-example gradients of a frozen BatchNorm (:func:`frozen_batchnorm`): y = x_hat w + b per
    channel (dimension 1), x_hat = (x - running_mean) / sqrt(running_var + eps), so example i's
    gradients are the sums over its other dimensions of g x_hat (weight) and g (bias)."""
    shape = (1, -1) + (1,) * (x.dim() - 2)
    dims = tuple(range(2, x.dim()))
    out = {}
    if layer.weight is not None and layer.weight.requires_grad:
        xhat = (x.to(g.dtype) - layer.running_mean.view(shape)) * torch.rsqrt(layer.running_var.view(shape) + layer.eps)
        gx = g * xhat
        out[layer.weight] = gx.sum(dims) if dims else gx
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = g.sum(dims) if dims else g
    return out


def _opacus_samplers() -> dict:
    from opacus.grad_sample.grad_sample_module import GradSampleModule

    return GradSampleModule.GRAD_SAMPLERS


def _rule(layer: nn.Module):
    """``fn(layer, args, g) -> {param: per-example grads}`` for ``layer`` (gsd's own rules first, then
    Opacus's samplers), or ``None``."""
    if conv2d_rule_applies(layer):
        return lambda m, args, g: conv2d_per_sample(m, args[0], g)
    if type(layer) is nn.Linear:
        return lambda m, args, g: linear_per_sample(m, args[0], g)
    if frozen_batchnorm(layer):
        return lambda m, args, g: batchnorm_per_sample(m, args[0], g)
    sampler = _opacus_samplers().get(type(layer))
    if sampler is None:
        return None
    return lambda m, args, g: sampler(m, [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args], g.contiguous())


def _to_channels_last(mod, args):
    x = args[0]
    if isinstance(x, torch.Tensor) and x.dim() == 4 and x.device.type == "cpu":
        return (x.contiguous(memory_format=torch.channels_last), *args[1:])
    return None


def maxpool_channels_last(model: nn.Module) -> list:
    """Forward pre-hooks (remove them after the forward) that give every ``nn.MaxPool2d`` of ``model``
    its CPU input in channels-last order. Converting the chunk is not enough when it has one channel
    (a 1-channel tensor is channels-first and channels-last at once, so the first convolution's output
    stays channels-first): on the 2-core CPU the FMNIST CNN's first max-pool of a chunk of 64 took
    2.2 ms channels-first against 0.23 ms channels-last, 0.06 ms of it the copy. Same values, so the
    same gradients to float rounding."""
    return [m.register_forward_pre_hook(_to_channels_last) for m in model.modules() if isinstance(m, nn.MaxPool2d)]


def broadcast_tap(module: nn.Module, local: str):
    """``(tap, per_example)`` for a parameter that a module with sub-layers adds to, or concatenates with,
    its activations, or None. Its per-example gradient is read off the gradient ``g`` (n x T x D) of the
    ``tap`` module's input: torchvision's ViT ``Encoder`` adds ``pos_embedding`` (1 x T x D) to its input,
    so example i's gradient is g_i; ``VisionTransformer`` puts ``class_token`` (1 x 1 x D) at position 0
    of the encoder's input, so example i's gradient is g_i[0]. Only for the library's own forwards (a
    subclass that changes one is refused); the first-use check compares the result with vmap."""
    try:
        from torchvision.models.vision_transformer import Encoder, VisionTransformer
    except ImportError:  # pragma: no cover - torchvision is a dependency
        return None
    if local == "class_token" and type(module).forward is VisionTransformer.forward and type(module.encoder).forward is Encoder.forward:
        return module.encoder, lambda g: g[:, :1, :].unsqueeze(1)
    if local == "pos_embedding" and type(module).forward is Encoder.forward:
        return module, lambda g: g.unsqueeze(1)
    return None


def input_tap(record: Callable[[torch.Tensor], None]):
    """A forward pre-hook for a :func:`broadcast_tap` module: hands ``record`` the module's input as a
    node of the graph (a constant input is made a leaf that requires grad, so its gradient exists) and
    passes that tensor on."""
    def h(mod, args):
        a = args[0] if args[0].requires_grad else args[0].detach().requires_grad_(True)
        record(a)
        return (a, *args[1:])

    return h


class LayersEngine:
    """Per-sample gradients from one batched forward and one backward to the layer outputs (module
    docstring). Opening it refuses (``NotImplementedError``) a model it cannot treat exactly; so may its
    first call with two or more examples (the independence check)."""

    name = "layers"

    def __init__(self, model: nn.Module, names: Sequence[str], loss: LossFn):
        self.model, self.loss, self.names = model, loss, list(names)
        params = dict(model.named_parameters())
        self.params = [params[n] for n in self.names]
        owner: dict[int, tuple[str, nn.Module, str]] = {}
        for prefix, mod in model.named_modules():
            for local, p in mod.named_parameters(recurse=False):
                owner[id(p)] = (prefix, mod, local)
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
