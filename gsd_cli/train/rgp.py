"""Reparametrized Gradient Perturbation (RGP, paper 001: Algorithms 1 and 2, Eq. 1-4, Prop. 3.1).

Every trained weight W (p x d) of a Linear layer, and of a Conv2d layer (groups 1, zero padding;
kernel p x d x k x k flattened to p x d k^2, Sec. 2.1), is reparametrized for the gradient
computation only (Eq. 1):

    W  ->  L R + (W - L R).stop_gradient(),    L: p x r,  R: r x d,

implemented as two stacked sub-layers (R first: a Linear d -> r, or a convolution with W's kernel
size, stride, padding and dilation and r output channels; then L: a Linear r -> p, or a 1x1
convolution) plus the frozen residual layer W~ = W - L R, whose output is the same as W's. The
per-sample gradients are taken with ``torch.func`` (vmap of grad) with respect to the carriers L and
R (and the parameters that are not reparametrized) only: the residual branch gets no weight gradient,
so no p x d per-sample gradient is ever formed; each example stores r (p + d) floats per layer
instead of p d (Table 1; what ``benchmarks/bench_rgp_memory.py`` measures). By Theorem 2.1,
dL = dW R^T and dR = L^T dW, per example.

Carriers (Algorithm 1 line 5, Algorithm 2), recomputed at every step from public quantities only:
the historical update D = W_t - W_0 after ``warmup`` steps, the weight itself D = W_t during the
warm-up (W_0: the weights when the method is built, i.e. the run's initial weights). Algorithm 2:
R ~ N(0, 1)^{r x d} (seeded by (seed, step, layer)); K times: L = D R^T, orthonormalise the columns
of L, R = L^T D; finally orthonormalise the rows of R (QR in float64). Where D = 0 (the first step
after a warm-up of 0 steps) both carriers are random orthonormal. r is capped at min(p, d).

Privacy (Algorithm 1 lines 10-13): each example's gradient vector (all layers' dL and dR, and the
gradients of the parameters that are not reparametrized: biases, norm layers, layers Opacus-style
reparametrization does not cover) is clipped to L2 norm C as **one** vector and the sum gets
N(0, sigma^2 C^2 I) on every coordinate: one Gaussian mechanism with sensitivity C and multiplier
sigma per Poisson-subsampled step, accounted exactly like DP-SGD. (The paper leaves the other
parameters out of Algorithm 1; the authors' code trains its classifier jointly in the same clipped
vector, and freezes biases for BERT. We train every selected parameter: plain DP-SGD coordinates in
the same clipped vector.) The carriers depend only on released weights: post-processing, no cost.

Update (Algorithm 1 line 14, Eq. 3, with the minus sign of Corollary 2.1.1): from the noisy sums,

    grad W = dL R + L dR - L L^T dL R,

the projection P_L G + G P_R - P_L G P_R of the (noisy) gradient onto the matrices whose column
space is span L or row space span R; the optimizer (SGD with momentum) takes it as W's gradient.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import GSDError
from ..gradients import _full_precision, default_loss
from .transforms import Parts, StepContext, Transform


def _orth_columns(A: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning A's columns (reduced QR, float64; Q is orthonormal even where A
    is rank-deficient)."""
    return torch.linalg.qr(A.double())[0]


def power_carriers(D: torch.Tensor, r: int, iters: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Algorithm 2: L (p x r, orthonormal columns) and R (r x d, orthonormal rows) from D (p x d) by
    ``iters`` power iterations from a Gaussian R; random orthonormal carriers where D is zero."""
    p, d = D.shape
    r = min(r, p, d)
    D = D.double()
    R = torch.randn(r, d, generator=generator, dtype=torch.float64).to(D.device)
    if not torch.any(D != 0):
        L = _orth_columns(torch.randn(p, r, generator=generator, dtype=torch.float64).to(D.device))
        return L, _orth_columns(R.T).T
    for _ in range(max(1, iters)):
        L = _orth_columns(D @ R.T)
        R = L.T @ D
    return L, _orth_columns(R.T).T


class _LowRankWeight:
    """``weight``: L R + W~ in the original layer's shape, for code that reads a layer's weight (peft's
    LoRA layers read ``lora_A.weight`` to cast their input when RGP reparametrizes an adapter)."""

    @property
    def weight(self) -> torch.Tensor:
        return (self.L.flatten(1) @ self.R.flatten(1)).reshape(self.residual.shape) + self.residual


class _RGPLinear(_LowRankWeight, nn.Module):
    """Linear with weight L R + W~: y = L (R x) + W~ x + b (Eq. 1). L, R, W~ are buffers (set by
    :class:`RGP` each step); the bias is the original parameter (same name)."""

    def __init__(self, orig: nn.Linear):
        super().__init__()
        self.register_parameter("bias", orig.bias)
        self.register_buffer("L", torch.empty(0))
        self.register_buffer("R", torch.empty(0))
        self.register_buffer("residual", torch.empty(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.R), self.L) + F.linear(x, self.residual, self.bias)


class _RGPConv2d(_LowRankWeight, nn.Module):
    """Conv2d with kernel L R + W~ (Sec. 2.1): R is a conv with W's kernel size, stride, padding and
    dilation and r output channels, L a 1x1 conv r -> p, W~ a conv like W."""

    def __init__(self, orig: nn.Conv2d):
        super().__init__()
        self.register_parameter("bias", orig.bias)
        self.stride, self.padding, self.dilation = orig.stride, orig.padding, orig.dilation
        self.register_buffer("L", torch.empty(0))
        self.register_buffer("R", torch.empty(0))
        self.register_buffer("residual", torch.empty(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.conv2d(x, self.R, None, self.stride, self.padding, self.dilation)
        return F.conv2d(h, self.L) + F.conv2d(x, self.residual, self.bias, self.stride, self.padding, self.dilation)


class _RGPLeaves(nn.Module):
    """The same L R + W~ form as three leaf layers, for the ghost clipped sum (:class:`RGPClipSum`):
    ``r`` (W's kernel, r outputs, weight R), ``l`` (r -> p, 1x1 for a convolution, weight L) and ``res``
    (W~ and the original bias, the same Parameter); y = l(r(x)) + res(x)."""

    def __init__(self, orig: nn.Module, L: torch.Tensor, R: torch.Tensor, residual: torch.Tensor):
        super().__init__()
        conv = isinstance(orig, nn.Conv2d)
        if conv:
            kw = dict(stride=orig.stride, padding=orig.padding, dilation=orig.dilation)
            self.r = nn.Conv2d(R.shape[1], R.shape[0], tuple(R.shape[2:]), bias=False, **kw)
            self.l = nn.Conv2d(L.shape[1], L.shape[0], 1, bias=False)
            self.res = nn.Conv2d(residual.shape[1], residual.shape[0], tuple(residual.shape[2:]), bias=False, **kw)
        else:
            self.r = nn.Linear(R.shape[1], R.shape[0], bias=False)
            self.l = nn.Linear(L.shape[1], L.shape[0], bias=False)
            self.res = nn.Linear(residual.shape[1], residual.shape[0], bias=False)
        self.r.weight = nn.Parameter(R.detach().clone())
        self.l.weight = nn.Parameter(L.detach().clone())
        self.res.weight = nn.Parameter(residual.detach().clone(), requires_grad=False)
        if orig.bias is not None:
            self.res.bias = orig.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l(self.r(x)) + self.res(x)


def reparametrizable(module: nn.Module) -> bool:
    if isinstance(module, nn.Linear):
        return True
    return isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros"


class _Layer:
    def __init__(self, mname: str, module: nn.Module, weight_name: str):
        self.mname = mname
        self.module = module
        self.weight_name = weight_name
        w = module.weight
        self.shape = tuple(w.shape)
        self.p = w.shape[0]
        self.d = int(np.prod(w.shape[1:]))
        self.L: torch.Tensor | None = None  # p x r (float64)
        self.R: torch.Tensor | None = None  # r x d (float64)

    @property
    def r(self) -> int:
        return 0 if self.L is None else self.L.shape[1]


class RGP:
    """RGP's state for one model: the reparametrized layers, their initial weights W_0 and the
    carriers of the current step. ``per_sample`` (the loop's per-sample gradient hook) returns the
    carrier-space gradients ``{"grad": n x width}``; :class:`RGPCarriers` recomputes the carriers at
    each step and :class:`RGPReconstruct` maps the noisy sum back to every trained parameter."""

    def __init__(self, model: nn.Module, names: Sequence[str], rank: int, power_iters: int = 1, warmup: int = 0, seed: int = 0):
        if rank < 1:
            raise GSDError(f"--rgp-rank must be at least 1 (got {rank})")
        if power_iters < 1:
            raise GSDError(f"--power-iters must be at least 1 (got {power_iters})")
        if warmup < 0:
            raise GSDError(f"--rgp-warmup must be >= 0 steps (got {warmup})")
        self.rank, self.power_iters, self.warmup, self.seed = int(rank), int(power_iters), int(warmup), int(seed)
        self.names = list(names)
        params = dict(model.named_parameters())
        chosen = set(self.names)
        self.layers: list[_Layer] = []
        for mname, mod in model.named_modules():
            wname = f"{mname}.weight"
            if mname and reparametrizable(mod) and wname in chosen and mod.weight is params.get(wname):
                self.layers.append(_Layer(mname, mod, wname))
        if not self.layers:
            raise GSDError("--method rgp found no trained Linear or Conv2d weight to reparametrize; check --params")
        self.weights = {l.weight_name for l in self.layers}
        self.other = [n for n in self.names if n not in self.weights]
        self._others = {n: params[n] for n in self.other}  # the Parameter objects (found again after a swap)
        self.sizes = {n: params[n].numel() for n in self.names}
        self.w0 = {l.weight_name: params[l.weight_name].detach().clone() for l in self.layers}
        self.step = None
        for i, layer in enumerate(self.layers):  # carriers for width before the first step
            self._carriers(layer, params[layer.weight_name], -1, i)

    # -- carriers -------------------------------------------------------------------------------
    def _carriers(self, layer: _Layer, W: torch.Tensor, step: int, index: int) -> None:
        W2 = W.detach().reshape(layer.p, layer.d)
        if step >= self.warmup:
            D = W2 - self.w0[layer.weight_name].reshape(layer.p, layer.d).to(W2.device)
        else:
            D = W2
        gen = torch.Generator().manual_seed(int(np.random.default_rng([self.seed, step + 1, index, 0x26B]).integers(2**62)))
        layer.L, layer.R = power_carriers(D.cpu(), self.rank, self.power_iters, gen)
        layer.L, layer.R = layer.L.to(W.device), layer.R.to(W.device)

    def compute(self, model: nn.Module, step: int) -> None:
        """Algorithm 1, line 5: the carriers of step ``step`` (0-based: the paper's t = step + 1, the
        historical update is used when t > T_warm-up)."""
        if self.step == step:
            return
        params = dict(model.named_parameters())
        for i, layer in enumerate(self.layers):
            self._carriers(layer, params[layer.weight_name], step, i)
        self.step = step

    @property
    def width(self) -> int:
        """Length of one example's gradient vector: sum over layers of r (p + d), plus the others."""
        return sum(l.r * (l.p + l.d) for l in self.layers) + sum(self.sizes[n] for n in self.other)

    def carrier_shapes(self, layer: _Layer) -> tuple[tuple, tuple]:
        r = layer.r
        if isinstance(layer.module, nn.Conv2d):
            return (layer.p, r, 1, 1), (r, *layer.shape[1:])
        return (layer.p, r), (r, layer.d)

    # -- per-sample gradients on the carriers ---------------------------------------------------
    @contextlib.contextmanager
    def swapped(self, model: nn.Module):
        """The model with every reparametrized layer replaced by its L R + W~ form (same outputs)."""
        saved = []
        try:
            for layer in self.layers:
                parent_name, _, child = layer.mname.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                wrap = _RGPConv2d(layer.module) if isinstance(layer.module, nn.Conv2d) else _RGPLinear(layer.module)
                W = layer.module.weight.detach()
                Ls, Rs = self.carrier_shapes(layer)
                L, R = layer.L.to(W.dtype), layer.R.to(W.dtype)
                wrap.L = L.reshape(Ls)
                wrap.R = R.reshape(Rs)
                wrap.residual = (W.double().reshape(layer.p, layer.d) - layer.L @ layer.R).to(W.dtype).reshape(layer.shape)
                setattr(parent, child, wrap)
                saved.append((parent, child, layer.module))
            yield model
        finally:
            for parent, child, mod in reversed(saved):
                setattr(parent, child, mod)

    @contextlib.contextmanager
    def leaves(self, model: nn.Module):
        """The model with every reparametrized layer replaced by :class:`_RGPLeaves` (same outputs), and
        the names, in the swapped model, of the per-sample vector's entries in :meth:`order` (each layer's
        ``l.weight``, ``r.weight``, then the other trained parameters, a reparametrized layer's bias now
        ``res.bias``)."""
        saved = []
        try:
            for layer in self.layers:
                parent_name, _, child = layer.mname.rpartition(".")
                parent = model.get_submodule(parent_name) if parent_name else model
                W = layer.module.weight.detach()
                Ls, Rs = self.carrier_shapes(layer)
                residual = (W.double().reshape(layer.p, layer.d) - layer.L @ layer.R).to(W.dtype).reshape(layer.shape)
                wrap = _RGPLeaves(layer.module, layer.L.to(W.dtype).reshape(Ls), layer.R.to(W.dtype).reshape(Rs), residual)
                setattr(parent, child, wrap)
                saved.append((parent, child, layer.module))
            by_id = {id(p): n for n, p in model.named_parameters()}
            names = [f"{layer.mname}.{part}.weight" for layer in self.layers for part in ("l", "r")]
            names += [by_id[id(self._others[n])] for n in self.other]
            yield model, names
        finally:
            for parent, child, mod in reversed(saved):
                setattr(parent, child, mod)

    def order(self) -> list[str]:
        """Keys of the per-sample vector, in order: each layer's L then R, then the other parameters."""
        keys = []
        for layer in self.layers:
            keys += [f"{layer.mname}.L", f"{layer.mname}.R"]
        return keys + list(self.other)

    def per_sample(self, model: nn.Module, names: Sequence[str], x: torch.Tensor, y: torch.Tensor, ctx: StepContext | None = None, loss=None) -> Parts:
        """Per-sample gradients of the loss w.r.t. the carriers (and the other trained parameters) of
        the examples ``x``: ``{"grad": n x width}``. Algorithm 1, lines 7-8."""
        from torch.func import functional_call, grad, vmap

        if ctx is not None:
            self.compute(model, ctx.step)
        loss = loss or default_loss
        was_training = model.training
        model.train()
        try:
            with self.swapped(model), _full_precision():
                params = dict(model.named_parameters())
                buffers = dict(model.named_buffers())
                keys = self.order()
                sel = {}
                for k in keys:
                    sel[k] = buffers.pop(k) if k in buffers else params[k].detach()
                frozen = {n: p.detach() for n, p in params.items() if n not in sel}

                def one(selected, xi, yi):
                    out = functional_call(model, (selected, frozen, buffers), (xi.unsqueeze(0),))
                    return loss(out, yi.unsqueeze(0)).sum()

                g = vmap(grad(one), in_dims=(None, 0, 0), randomness="different")(sel, x, y)
                G = torch.cat([g[k].reshape(x.shape[0], -1) for k in keys], dim=1)
        finally:
            model.train(was_training)
        return {"grad": G}

    def empty(self, device) -> Parts:
        return {"grad": torch.zeros(0, self.width, device=device)}

    # -- reconstruction ---------------------------------------------------------------------------
    def reconstruct(self, v: torch.Tensor) -> torch.Tensor:
        """Eq. 3 for every layer (grad W = dL R + L dR - L L^T dL R) and the other parameters as they
        are: the carrier-space vector ``v`` (width) -> the full gradient vector (p, ``names`` order)."""
        pieces: dict[str, torch.Tensor] = {}
        col = 0
        for layer in self.layers:
            r = layer.r
            dL = v[col : col + layer.p * r].reshape(layer.p, r).double()
            col += layer.p * r
            dR = v[col : col + r * layer.d].reshape(r, layer.d).double()
            col += r * layer.d
            L, R = layer.L.to(v.device), layer.R.to(v.device)
            gW = dL @ R + L @ dR - L @ (L.T @ dL) @ R
            pieces[layer.weight_name] = gW.reshape(-1).to(v.dtype)
        for n in self.other:
            pieces[n] = v[col : col + self.sizes[n]]
            col += self.sizes[n]
        assert col == v.shape[0], (col, v.shape)
        return torch.cat([pieces[n] for n in self.names])


class RGPCarriers(Transform):
    """Algorithm 1, line 5, at the start of each step: the carriers from the current weights."""

    def __init__(self, rgp: RGP):
        self.rgp = rgp

    def begin_step(self, ctx: StepContext) -> None:
        if ctx.model is not None:
            self.rgp.compute(ctx.model, ctx.step)
            ctx.info.setdefault("epoch_metrics", {})["rgp_rank"] = max(l.r for l in self.rgp.layers)


class RGPReconstruct(Transform):
    """Algorithm 1, line 14: the noisy carrier gradients -> the update of every trained parameter."""

    def __init__(self, rgp: RGP):
        self.rgp = rgp

    def aggregated(self, parts: Parts, ctx: StepContext) -> Parts:
        return {**parts, "grad": self.rgp.reconstruct(parts["grad"])}
