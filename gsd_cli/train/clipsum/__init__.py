"""Clipped per-sample gradient sums without the per-sample gradient matrix (issue 37): per-layer ghost
norms and book-keeping, the engine of DP-SGD's step (``--clip-engine``).

DP-SGD releases sum_i clip_C(g_i) + N(0, sigma^2 C^2 I) with clip_C(g) = g min(1, C / ||g||) (Abadi et
al. 2016, Algorithm 1). Today's path (``materialise``) forms every g_i (an n x p matrix per chunk, by
``torch.func.vmap``), clips and sums it. This engine (``ghost``) needs neither the matrix nor a second
backward pass; what it computes is, for every example, the same function clip_C(g_i) summed:

1. one batched forward with hooks that keep the input (A) of every layer owning a selected parameter,
   and one ``torch.autograd.grad`` of the summed loss to those layers' outputs (B): when the examples
   of a batch do not interact, row i of B is dL_i/dy_i (the identity Opacus's hooks rest on);
2. per layer, each example's squared gradient norm, by the cheaper of (fastDP's layer-wise rule, Bu et
   al. ICML 2023, "book-keeping", mixed ghost clipping; T = sequence or spatial positions, D x C the
   weight's shape per group):

   * ghost norm, when 2 T^2 < D C: g_i = B_i^T A_i (A_i: T x D, B_i: T x C), so
     ||g_i||^2 = <A_i A_i^T, B_i B_i^T> (Li et al. 2022; Opacus's fast gradient clipping), and for T = 1
     simply ||a_i||^2 ||b_i||^2 -- the per-example gradient is never formed;
   * otherwise the layer's per-sample gradients (gsd's Conv2d/Linear/frozen BatchNorm rules of
     :mod:`gsd_cli.gradients.layers`, the same functions the ``layers`` engine uses, Opacus's samplers for
     GroupNorm, LayerNorm, Embedding..., torch.func on the layer alone for any other leaf layer), kept
     for step 4;
   * fastDP's rule compares memory; where it says ghost for a Linear/Conv2d with T > 1, the first use
     times both paths on a synthetic chunk and keeps the faster (:meth:`ClippedSum.tune`,
     :mod:`gsd_cli.train.clipsum.tune`: the ghost path also pays the book-keeping product, which the
     materialised path does not need);

3. ||g_i||^2 = the sum over layers, and the clip weights w_i = min(1, C / ||g_i||) exactly as
   :class:`~gsd_cli.train.transforms.Clip` computes them (an example whose squared norm is not finite --
   a NaN or an infinity in its gradient -- gets w_i = 0, as ``Clip`` zeroes such a row);
4. the clipped sum of every layer from the tensors already held ("book-keeping": no second backward):
   a ghost layer's sum_i w_i B_i^T A_i is ONE weight-gradient product of the weighted output gradients
   (w_i B_i) with the inputs -- for a Linear a matmul over the n T rows, for a Conv2d torch's own
   weight-gradient kernel (``convolution_backward``: stride, padding, dilation and groups as the
   layer's) -- and a materialised layer's is sum_i w_i g_i.

So the release is sum_i w_i g_i with w_i from ||g_i||: the same mechanism as the materialised path, to
float rounding (float32 products summed in another order), and each example's contribution has norm
at most C by construction whatever the layer rules compute (a layer's ghost norm is the norm of exactly
the tensor its book-keeping sum adds up). The noise is unchanged (the chain's
:class:`~gsd_cli.train.transforms.GaussianNoise`).

Refusals. The identity of step 1 needs examples that do not interact. :meth:`ClippedSum.check` runs on
the first use, on a *synthetic* batch (seeded Gaussian inputs of the chunk's shape, label 0: public, so
the choice of path never depends on the private data): the engine's per-example norms and its clipped
sum must equal the materialised path's (vmap of each example alone) to ``CHECK_RTOL``. A batch
statistic, dropout's random masks, a weight used outside its layer's forward (tied weights read by
``F.linear``) all fail it. :class:`ClippedSum` also refuses (``NotImplementedError``) a selected
parameter owned by a module with sub-layers and a BatchNorm in training that is not frozen. Under
``--clip-engine auto`` a refusal takes the materialised path (:func:`clip_engine_for`); under ``ghost``
it is an error.

Where it applies (:func:`fusable`): a chain whose only per-example transform is one
:class:`~gsd_cli.train.transforms.Clip` of ``"grad"`` -- DP-SGD and the second phase's stage 2. It does
not apply where each example's vector itself is needed: GEP's embedding W_i = g_i B^T (k projections
per example: k times the per-sample gradients' cost by factors; its residual's clipped sum then needs
no residual vectors: :mod:`gsd_cli.train.gep.sums`), TopAgg's NormTopK (a top-k of each g_i's
coordinates), random sparsification's mask before the clip (a masked norm does not factor). Those
chains take their per-example rows from the same per-layer rules
(:meth:`~gsd_cli.train.clipsum.step.LazyClipSum.rows`). RGP's carrier gradients take this engine on
the model with its carriers as leaf layers (:class:`~gsd_cli.train.clipsum.step.RGPClipSum`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Sequence

import torch
import torch.nn as nn

from ...errors import GSDError
from .rules import (  # noqa: F401 (the per-layer rules)
    ghost_cheaper, _patches, _conv_ghost_by_pixels, _pixels_cheaper, _group_columns, _positions, synthetic,
)
from ...gradients.layers import broadcast_tap, conv2d_plain, input_tap, linear_plain

CLIP_ENGINES = ("auto", "ghost", "materialise")
#: relative tolerance of the first-use check against the materialised path (float32 products)
CHECK_RTOL = 1e-3
#: synthetic examples of the first-use check
CHECK_EXAMPLES = 4


@dataclass
class _Layer:
    module: nn.Module
    prefix: str
    params: list  # (full name, local name, parameter) of the selected ones
    kind: str  # linear, conv2d, rule (gradients.layers.PER_SAMPLE_RULES / Opacus sampler), func, tap (gradients.layers.broadcast_tap)


class ClippedSum:
    """The ghost / book-keeping clipped sum of one model's selected parameters (module docstring).

    ``engine(x, y, max_norm)`` -> ``(s, sq)``: ``s`` the flat sum over the chunk of clip_C(g_i)
    (``names`` order) in the parameters' dtype (float64 if they differ): the step accumulates chunks
    in float64 (:func:`~gsd_cli.train.step.private_step`), and one chunk's float32 sum is the value
    a float64 copy would be cast back to, without the two passes over p numbers; ``sq`` the float64
    squared norms ||g_i||^2 (n). ``plan`` lists each
    layer's path once called (``ghost`` or ``materialised``). Opening refuses (``NotImplementedError``)
    a model it cannot treat; :meth:`check` refuses one whose examples interact."""

    def __init__(self, model: nn.Module, names: Sequence[str], loss: Callable | None = None):
        from ...gradients.layers import _rule, frozen_batchnorm, parameter_owners
        from ...gradients import default_loss

        self.model, self.names = model, list(names)
        self.loss = loss or default_loss
        params = dict(model.named_parameters())
        self.params = [params[n] for n in self.names]
        owner = parameter_owners(model)
        layers: dict[int, _Layer] = {}
        self._taps: dict[int, Callable] = {}  # id(tap layer) -> per-example gradient from the tap's input gradient
        for n, p in zip(self.names, self.params):
            prefix, mod, local = owner[id(p)]
            if list(mod.children()):
                tap = broadcast_tap(mod, local)
                if tap is None:
                    raise NotImplementedError(f"parameter {n} belongs to {prefix or 'the model'}, which has sub-layers")
                layer = _Layer(tap[0], f"{prefix}.{local}" if prefix else local, [(n, local, p)], "tap")
                self._taps[id(layer)] = tap[1]
                layers[id(p)] = layer
                continue
            if id(mod) not in layers:
                if conv2d_plain(mod):
                    kind = "conv2d"
                elif linear_plain(mod):
                    kind = "linear"
                elif _rule(mod) is not None:
                    kind = "rule"
                else:
                    kind = "func"
                layers[id(mod)] = _Layer(mod, prefix, [], kind)
            layers[id(mod)].params.append((n, local, p))
        for prefix, mod in model.named_modules():
            if isinstance(mod, nn.modules.batchnorm._BatchNorm) and mod.training is not False and not frozen_batchnorm(mod):
                raise NotImplementedError(f"layer {prefix} is a BatchNorm, which mixes the examples of a batch in training")
        self.layers = list(layers.values())
        # the materialised path of a conv2d, linear or rule layer: gsd's one rule per layer kind (the layers engine's)
        self._rules = {id(l.module): _rule(l.module) for l in self.layers if l.kind in ("conv2d", "linear", "rule")}
        self.channels_last = any(isinstance(m, nn.MaxPool2d) for m in model.modules())
        self.plan: dict[str, str] = {}
        self.paths: dict[str, str] = {}  # measured choices (tune)
        self.timings: dict[str, tuple[float, float]] = {}  # layer -> (ghost, materialised) seconds
        self.checked = False

    # -- one chunk ------------------------------------------------------------------------------
    def _capture(self, x: torch.Tensor, y: torch.Tensor):
        if self.channels_last and x.dim() == 4 and x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        calls: list[tuple[int, tuple, dict, torch.Tensor, int]] = []
        handles = []

        def hook(i):
            def h(mod, args, kwargs, output):
                if not isinstance(output, torch.Tensor):
                    raise NotImplementedError(f"layer type {type(mod).__name__} returns {type(output).__name__}, not one tensor")
                det = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
                calls.append((i, det, dict(kwargs), output, output._version))

            return h

        try:
            if self.channels_last:
                from ...gradients.layers import maxpool_channels_last

                handles += maxpool_channels_last(self.model)
            for i, layer in enumerate(self.layers):
                if layer.kind == "tap":  # its "output" is its module's input
                    handles.append(layer.module.register_forward_pre_hook(input_tap(lambda a, i=i: calls.append((i, (), {}, a, a._version)))))
                else:
                    handles.append(layer.module.register_forward_hook(hook(i), with_kwargs=True))
            total = self.loss(self.model(x), y).sum()
        finally:
            for h in handles:
                h.remove()
        for i, _, _, o, version in calls:
            if o._version != version:
                raise NotImplementedError(f"the output of a {type(self.layers[i].module).__name__} layer is changed in place "
                                          f"during the forward (e.g. ReLU(inplace=True))")
        live = [c for c in calls if c[3].requires_grad]
        grads = torch.autograd.grad(total, [c[3] for c in live], allow_unused=True) if live else ()
        by_layer: dict[int, list] = {}
        for (i, args, kwargs, o, _), g in zip(live, grads):
            if g is not None:
                by_layer.setdefault(i, []).append((args, kwargs, g))
        return by_layer

    def _materialised(self, layer: _Layer, calls) -> dict:
        """{parameter: n x shape} per-example gradients of ``layer``, summed over its calls."""
        per: dict[int, torch.Tensor] = {}
        for args, kwargs, g in calls:
            if layer.kind == "tap":
                (_, _, p), = layer.params
                d = {p: self._taps[id(layer)](g)}
            elif layer.kind in ("conv2d", "linear", "rule"):
                d = self._rules[id(layer.module)](layer.module, args, g)
            else:
                from ...ghost.rules.materialised import per_sample

                unit = SimpleNamespace(module=layer.module, params=layer.params)
                by_local = per_sample(unit, args, kwargs, g)
                d = {p: by_local[local] for _, local, p in layer.params}
            for p, v in d.items():
                per[id(p)] = v if id(p) not in per else per[id(p)] + v
        return per

    def _shape(self, layer: _Layer, xin: torch.Tensor, g: torch.Tensor) -> tuple[int, int, int, int]:
        """(groups, T, D, C) of a Linear/Conv2d call: T positions, a D x C weight per group."""
        m = layer.module
        if layer.kind == "linear":
            return 1, g.reshape(g.shape[0], -1, g.shape[-1]).shape[1], xin.shape[-1], g.shape[-1]
        return m.groups, g.shape[2] * g.shape[3], m.weight.shape[1] * m.weight.shape[2] * m.weight.shape[3], m.weight.shape[0] // m.groups

    def path(self, layer: _Layer, xin: torch.Tensor, g: torch.Tensor) -> str:
        """``ghost`` or ``materialised`` for one Linear/Conv2d call: the measured choice of :meth:`tune`
        where it ran for this layer, else fastDP's rule (:func:`ghost_cheaper`)."""
        if layer.prefix in self.paths:
            return self.paths[layer.prefix]
        return "ghost" if ghost_cheaper(*self._shape(layer, xin, g)[1:]) else "materialised"

    def _ghost_norms(self, layer: _Layer, xin: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """Each example's squared gradient norm of a ghost layer (step 2 of the module docstring), and
        what its book-keeping sum (:meth:`_ghost_sum`) needs."""
        m, n = layer.module, xin.shape[0]
        groups, T, D, C = self._shape(layer, xin, g)
        sq = torch.zeros(n, dtype=torch.float64, device=xin.device)
        A = B = None
        pixels = False
        if layer.kind == "linear":
            A, B = xin.reshape(n, -1, xin.shape[-1]), g.reshape(n, -1, g.shape[-1])
        else:
            B = _positions(g)  # n x T x O (a view in either memory format)
            pixels = _pixels_cheaper(m, xin, T)
            if pixels:
                sq += _conv_ghost_by_pixels(m, xin, B, g.shape[2], g.shape[3]).double()
            else:
                A = _patches(m, xin)  # n x T x (kh kw Cin), channels-last column order
        for gi in range(0 if pixels else groups):
            Ag = A if layer.kind == "linear" else _group_columns(A, xin.shape[1], groups, gi)
            Bg = B[:, :, gi * C:(gi + 1) * C]
            if T == 1:
                sq += (Ag.reshape(n, -1).pow(2).sum(1) * Bg.reshape(n, -1).pow(2).sum(1)).double()
            else:
                sq += (torch.bmm(Ag, Ag.transpose(1, 2)) * torch.bmm(Bg, Bg.transpose(1, 2))).sum((1, 2)).double()
        bias = None
        if m.bias is not None and any(local == "bias" for _, local, _ in layer.params):
            bias = B.sum(1) if layer.kind == "linear" else g.sum((2, 3))
            sq += bias.pow(2).sum(1).double()
        keep = layer.kind == "linear"
        return sq, (xin, g, A if keep else None, B if keep else None, bias)

    @staticmethod
    def _ghost_sum(layer: _Layer, data: tuple, wd: torch.Tensor, ok: torch.Tensor | None = None) -> dict:
        """A ghost layer's clipped sum (step 4, book-keeping): one weight-gradient product of the output
        gradients weighted by ``wd`` with the inputs; ``ok`` (examples with a finite norm) zeroes the
        others' inputs and output gradients first (0 * NaN is NaN)."""
        m = layer.module
        xin, g, A, B, bias = data
        if ok is not None:
            xin = torch.where(ok.view(-1, *[1] * (xin.dim() - 1)), xin, torch.zeros((), dtype=xin.dtype, device=xin.device))
            g = torch.where(ok.view(-1, *[1] * (g.dim() - 1)), g, torch.zeros((), dtype=g.dtype, device=g.device))
            if bias is not None:
                bias = torch.where(ok.view(-1, 1), bias, torch.zeros((), dtype=bias.dtype, device=bias.device))
            if A is not None:
                A, B = xin.reshape(A.shape), g.reshape(B.shape)
        grads = {}
        if layer.kind == "linear":
            Bw = B * wd.view(-1, 1, 1)
            grads[id(m.weight)] = Bw.reshape(-1, B.shape[2]).T @ A.reshape(-1, A.shape[2])
        else:  # torch's weight-gradient kernel with the weighted output gradients
            _, gw, _ = torch.ops.aten.convolution_backward(
                g * wd.view(-1, 1, 1, 1), xin, m.weight.detach(), None, m.stride, m.padding, m.dilation,
                False, [0, 0], m.groups, [False, True, False])
            grads[id(m.weight)] = gw
        if bias is not None:
            grads[id(m.bias)] = wd @ bias
        return grads

    def eligible(self, layer: _Layer, calls) -> bool:
        """Whether ``layer`` may take the ghost path: one call of a Linear/Conv2d whose weight is trained."""
        return len(calls) == 1 and layer.kind in ("linear", "conv2d") and any(local == "weight" for _, local, _ in layer.params)

    def __call__(self, x: torch.Tensor, y: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
        n = x.shape[0]
        by_layer = self._capture(x, y)
        sq = torch.zeros(n, dtype=torch.float64, device=x.device)
        finish = []  # (layer, how, data)
        for i, layer in enumerate(self.layers):
            calls = by_layer.get(i)
            if not calls:
                continue
            if self.eligible(layer, calls):
                (args, _, g), = calls
                xin = args[0].to(g.dtype)
                if self.path(layer, xin, g) == "ghost":
                    self.plan[layer.prefix] = "ghost"
                    s_, data = self._ghost_norms(layer, xin, g)
                    sq += s_
                    finish.append((layer, "ghost", data))
                    continue
            self.plan[layer.prefix] = "materialised"
            per = self._materialised(layer, calls)
            for _, _, p in layer.params:
                if id(p) in per:
                    sq += per[id(p)].reshape(n, -1).pow(2).sum(1).double()
            finish.append((layer, "mat", per))
        ok = torch.isfinite(sq)
        norms = torch.where(ok, sq, torch.zeros_like(sq)).sqrt()
        w = torch.where(ok, (max_norm / norms.clamp_min(1e-12)).clamp(max=1.0), torch.zeros_like(norms))
        bad = not bool(ok.all())
        grads: dict[int, torch.Tensor] = {}
        for layer, how, data in finish:
            if how == "mat":
                for _, _, p in layer.params:
                    if id(p) in data:
                        v = data[id(p)]
                        if bad:
                            v = torch.where(ok.view(-1, *[1] * (v.dim() - 1)), v, torch.zeros((), dtype=v.dtype, device=v.device))
                        grads[id(p)] = torch.tensordot(w.to(v.dtype), v, dims=1)
                continue
            grads.update(self._ghost_sum(layer, data, w.to(data[1].dtype), ok if bad else None))
        dtypes = {p.dtype for p in self.params}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.float64
        s = torch.cat([(grads[id(p)] if id(p) in grads else torch.zeros_like(p)).reshape(-1).to(dtype)  # unused by the loss: zero
                       for p in self.params])
        return s, torch.where(ok, sq, torch.full_like(sq, float("nan")))

    def tune(self, x: torch.Tensor, y: torch.Tensor, examples: int | None = None) -> dict[str, str]:
        """Choose each layer's path by measuring both on a synthetic batch of ``examples`` (None: ``x``'s
        number) shaped like ``x`` (:func:`gsd_cli.train.clipsum.tune.tune_paths`); the paths chosen."""
        from .tune import tune_paths

        return tune_paths(self, x, y, examples)

    # -- the first-use check -------------------------------------------------------------------
    def check(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Refuse (``NotImplementedError``) unless the engine equals the materialised path on a synthetic
        batch shaped like ``(x, y)`` (public: seeded inputs, label 0), example 0 alone and among others."""
        from ...gradients.engines import VmapEngine

        xs, ys = synthetic(x, y, CHECK_EXAMPLES)
        out = torch.empty(CHECK_EXAMPLES, sum(p.numel() for p in self.params), device=x.device)
        VmapEngine(self.model, self.names, self.loss)(xs, ys, out)
        ref_sq = out.double().pow(2).sum(1)
        C = float(ref_sq.sqrt().median()) or 1.0
        s, sq = self(xs, ys, C)
        w = (C / ref_sq.sqrt().clamp_min(1e-12)).clamp(max=1.0)
        ref = (w.view(-1, 1) * out.double()).sum(0)
        s0, sq0 = self(xs[:1].expand_as(xs).contiguous(), ys[:1].expand_as(ys).contiguous(), C)
        def close(a, b):
            return bool(torch.isfinite(a).all()) and float((a - b).norm()) <= CHECK_RTOL * float(b.norm()) + 1e-9
        if not (close(sq, ref_sq) and close(s, ref) and close(sq0[:1], ref_sq[:1])):
            raise NotImplementedError("the ghost clipped sum differs from the per-sample gradients on a synthetic batch "
                                      "(the examples of a batch interact, e.g. a batch statistic or dropout, or a weight is used outside its layer)")
        self.checked = True


def check_clip_engine(mode: str) -> None:
    if mode not in CLIP_ENGINES:
        raise GSDError(f"unknown --clip-engine {mode!r}; use one of {', '.join(CLIP_ENGINES)}")


__all__ = ["CLIP_ENGINES", "ClippedSum", "ghost_cheaper", "check_clip_engine"]
