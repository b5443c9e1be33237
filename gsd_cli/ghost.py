"""Gram ("ghost") path: GSD from m x m Gram matrices, never an m x p per-sample gradient matrix.

GSD needs only G G^T (DESIGN.md, "Projection metric"). Hooks capture every parameterised layer's
inputs and output gradients (the loss is the *sum* of per-example losses, so output gradients are
per-example), and each layer contributes to K = G G^T (float64) by its own rule:

* Linear / Conv2d (unfolded input A_i, T positions x D, output gradient B_i, T x C, per group):
  <g_i, g_j> = <A_i A_j^T, B_i B_j^T> ("ghost", ~T^2 (D + C) per pair), or, when that costs more than
  the layer's D x C parameters, the layer's per-sample gradients B_i^T A_i (mixed ghost clipping's
  per-layer choice). A bias adds (1^T B_i)(B_j^T 1).
* Embedding: <g_i, g_j> = sum_{t,s} [tok_it = tok_js] (b_it . b_js) (padding index excluded), or its
  per-sample gradients when the vocabulary is small against T^2.
* Any other layer (GroupNorm, LayerNorm, ... through Opacus' per-layer grad samplers; anything else,
  e.g. MultiheadAttention, through torch.func on that module alone): that layer's per-sample gradients.

Streaming: examples arrive in chunks (size chosen from ``memory_budget``); the layers are split into
groups whose compact per-example factors for all m examples fit half the budget, one forward+backward
pass over the data per group. The top-k basis V = G^T U diag(1/s) is G^T W for an m x k matrix W:
one more pass contracts each layer's factors with W (p x k memory, never m x p).

:class:`GhostOperator` exposes ``gram()``, ``matvec(X)`` = G X and ``rmatvec(Y)`` = G^T Y with an
optional row scaling (unit rows, DP clipping), which is all DP-GSD's Bingham sampler needs.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from .errors import GSDError, ModelError
from .gradients import LossFn, _full_precision, _only_trainable, default_loss, select_parameters
from .subspace import _check_rank, gram

GRAMS = ("auto", "materialize", "ghost")

#: default --memory-budget: 4 GiB
DEFAULT_BUDGET = 4 * 2**30

#: ``batches(chunk_size)`` -> a fresh iterator of ``(x, y)`` chunks, the same examples in the same order each time.
Batches = Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]


def parse_bytes(text: str | int | float) -> int:
    """``'4G'``, ``'512M'``, ``'1.5GiB'``, ``'2000000'`` -> bytes (binary units)."""
    if isinstance(text, (int, float)):
        n = int(text)
    else:
        mt = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
        if not mt:
            raise GSDError(f"--memory-budget {text!r} is not a size; write e.g. 4G, 512M or 2000000")
        n = int(float(mt.group(1)) * 1024 ** "bkmgt".index(mt.group(2) or "b"))
    if n < 2**20:
        raise GSDError(f"--memory-budget must be at least 1M (got {text!r})")
    return n


# ----------------------------------------------------------------------------------------------
# per-layer factors of one chunk


@dataclass
class Factors:
    """One layer's contribution for a chunk of c examples: ghost pairs ``(A, B)`` (c x T x D, c x T x C,
    with the parameter name, the slice of its rows and an optional transpose) whose per-sample gradient
    is B_i^T A_i; embedding triples; and ``mat`` (c x q): per-sample gradients of the rest, with names."""

    pairs: list = field(default_factory=list)  # (A, B, name, row0, rows)
    embeds: list = field(default_factory=list)  # (idx, B, name)
    mat: list = field(default_factory=list)  # (tensor c x q, name)

    def numel_per_example(self) -> int:
        n = 0
        for A, B, *_ in self.pairs:
            n += A[0].numel() + B[0].numel()
        for idx, B, _ in self.embeds:
            n += idx[0].numel() + B[0].numel()
        for t, _ in self.mat:
            n += t[0].numel()
        return n


def _sum_calls(ts: list[torch.Tensor]) -> torch.Tensor:
    out = ts[0]
    for t in ts[1:]:
        out = out + t
    return out


class _Unit:
    """A module whose parameters (selected ones among them) get gradients, with its capture hooks."""

    def __init__(self, module: nn.Module, prefix: str, params: list[tuple[str, str, nn.Parameter]], recurse: bool):
        self.module, self.prefix, self.params, self.recurse = module, prefix, params, recurse
        self.inputs: list = []  # (args, kwargs) per call, in call order
        self.grads: list = []  # output gradient per call, in backward order (reversed)
        self.rule = self._rule()

    def _rule(self) -> str:
        m = self.module
        if self.recurse:
            return "func"
        if type(m) is nn.Linear or isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward:
            return "linear"
        if isinstance(m, nn.Conv2d) and type(m).forward is nn.Conv2d.forward and m.padding_mode == "zeros" and not isinstance(m.padding, str):
            return "conv2d"
        if type(m) is nn.Embedding and m.max_norm is None and not m.scale_grad_by_freq and not m.sparse:
            return "embedding"
        from opacus.grad_sample import GradSampleModule

        if type(m) in GradSampleModule.GRAD_SAMPLERS:
            return "opacus"
        return "func"

    def clear(self) -> None:
        self.inputs, self.grads = [], []

    # -- factors -------------------------------------------------------------------------------

    def factors(self) -> Factors:
        if len(self.inputs) != len(self.grads):
            raise ModelError(f"layer {self.prefix or type(self.module).__name__}: {len(self.inputs)} calls but {len(self.grads)} output gradients")
        calls = list(zip(self.inputs, reversed(self.grads)))
        f = Factors()
        if self.rule in ("linear", "conv2d"):
            AB = [self._linear_ab(a[0], g) if self.rule == "linear" else self._conv_ab(a[0], g) for (a, _), g in calls]
            A = torch.cat([x for x, _ in AB], 1) if len(AB) > 1 else AB[0][0]
            B = torch.cat([y for _, y in AB], 1) if len(AB) > 1 else AB[0][1]
            self._pairs(f, A, B)
        elif self.rule == "embedding":
            idx = torch.cat([a[0].reshape(a[0].shape[0], -1) for (a, _), _ in calls], 1)
            B = torch.cat([g.reshape(g.shape[0], -1, g.shape[-1]) for _, g in calls], 1)
            if self.module.padding_idx is not None:
                B = B * (idx != self.module.padding_idx).unsqueeze(-1).to(B.dtype)
            full = self.params[0][0]
            T, V = idx.shape[1], self.module.num_embeddings
            if T * T < V:
                f.embeds.append((idx, B, full))
            else:
                g = torch.zeros(B.shape[0], V, B.shape[2], dtype=B.dtype, device=B.device)
                g.scatter_add_(1, idx.unsqueeze(-1).expand_as(B), B)
                f.mat.append((g.reshape(B.shape[0], -1), full))
        elif self.rule == "opacus":
            from opacus.grad_sample import GradSampleModule

            fn = GradSampleModule.GRAD_SAMPLERS[type(self.module)]
            per = [fn(self.module, list(a), g) for (a, _), g in calls]
            for full, local, p in self.params:
                gs = _sum_calls([d[p] for d in per])
                f.mat.append((gs.reshape(gs.shape[0], -1), full))
        else:
            sums = None
            for (a, kw), g in calls:
                d = self._func(a, kw, g)
                sums = d if sums is None else {n: sums[n] + d[n] for n in d}
            for full, local, _ in self.params:
                f.mat.append((sums[local].reshape(sums[local].shape[0], -1), full))
        return f

    def _linear_ab(self, x, g):
        c = x.shape[0]
        return x.reshape(c, -1, x.shape[-1]), g.reshape(c, -1, g.shape[-1])

    def _conv_ab(self, x, g):
        m = self.module
        c = x.shape[0]
        return _unfold(x, m.kernel_size, m.dilation, m.padding, m.stride), g.reshape(c, g.shape[1], -1).transpose(1, 2)

    def _pairs(self, f: Factors, A: torch.Tensor, B: torch.Tensor) -> None:
        m = self.module
        groups = getattr(m, "groups", 1)
        by_local = {local: full for full, local, _ in self.params}
        T, D, C = A.shape[1], A.shape[2] // groups, B.shape[2] // groups
        if "weight" in by_local:
            # Gram work per pair: ghost T^2 (D + C), per-sample gradients D C. Storage per example:
            # factors T (D + C), gradients D C. Kept as factors whenever they are the smaller; the Gram
            # then materialises the layer's gradients from them (by output-channel blocks) if cheaper.
            ghost = T * T * (D + C) < D * C
            compact = T * (D + C) <= D * C
            for gi in range(groups):
                Ag = A[:, :, gi * D : (gi + 1) * D]
                Bg = B[:, :, gi * C : (gi + 1) * C]
                if ghost or compact:
                    f.pairs.append((Ag, Bg, by_local["weight"], gi * C, C, ghost))
                else:
                    f.mat.append((torch.bmm(Bg.transpose(1, 2), Ag).reshape(A.shape[0], -1), (by_local["weight"], gi * C, C)))
        if "bias" in by_local:
            f.mat.append((B.sum(1), by_local["bias"]))

    def _func(self, args, kwargs, g) -> dict:
        """Per-sample gradients of this module's parameters by torch.func (vmap of a vjp), examples on dim 0."""
        from torch.func import functional_call, vjp, vmap

        c = g.shape[0]
        params = {local: p.detach() for _, local, p in self.params}
        pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.ndim and a.shape[0] == c]
        kpos = [k for k, v in kwargs.items() if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == c]
        module = self.module

        def one(batched, gi):
            a = list(args)
            kw = dict(kwargs)
            for i, t in zip(pos, batched[: len(pos)]):
                a[i] = t.unsqueeze(0)
            for k, t in zip(kpos, batched[len(pos) :]):
                kw[k] = t.unsqueeze(0)

            def fwd(p):
                out = functional_call(module, p, tuple(a), kw)
                return out[0] if isinstance(out, (tuple, list)) else out

            _, fn = vjp(fwd, params)
            return fn(gi.unsqueeze(0))[0]

        batched = [args[i] for i in pos] + [kwargs[k] for k in kpos]
        return vmap(one, randomness="different")(batched, g)


def _unfold(x: torch.Tensor, kernel, dilation, padding, stride) -> torch.Tensor:
    """``F.unfold(...).transpose(1, 2)`` (c x T x C k_h k_w, the same column order) by k_h k_w strided
    slices: several times faster than im2col on CPU, and a plain reshape for 1x1 kernels."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    n, C, H, W = x.shape
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    oh = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = [x[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw] for i in range(kh) for j in range(kw)]
    A = cols[0].unsqueeze(2) if len(cols) == 1 else torch.stack(cols, 2)  # n x C x kk x oh x ow
    return A.reshape(n, C * kh * kw, oh * ow).transpose(1, 2)


def _units(model: nn.Module, names: Sequence[str]) -> list[_Unit]:
    """The modules that own selected parameters; MultiheadAttention (which uses its out_proj's weights
    without calling it) is one unit with all its parameters."""
    keep = set(names)
    units, taken = [], set()
    for prefix, mod in model.named_modules():
        if any(prefix == t or prefix.startswith(t + ".") for t in taken):
            continue
        recurse = isinstance(mod, nn.MultiheadAttention)
        own = [(f"{prefix}.{n}" if prefix else n, n, p) for n, p in mod.named_parameters(recurse=recurse)]
        own = [t for t in own if t[0] in keep]
        if recurse:
            taken.add(prefix)
        if own:
            units.append(_Unit(mod, prefix, own, recurse))
    covered = {t[0] for u in units for t in u.params}
    missing = keep - covered
    if missing:
        raise ModelError(f"parameters {sorted(missing)[:3]} belong to no module; the ghost path cannot capture them (use --gram materialize)")
    return units


# ----------------------------------------------------------------------------------------------
# the operator


def _detach(v):
    return v.detach() if isinstance(v, torch.Tensor) else v


class GhostOperator:
    """The per-sample gradient matrix G (m x p, rows scaled by ``row_scale`` when set) of a model over a
    stream of examples, without G: ``gram()`` (m x m float64), ``matvec(X)`` = G X, ``rmatvec(Y)`` = G^T Y.

    ``batches(chunk_size)`` must yield the same ``m`` examples as ``(x, y)`` chunks every time it is
    called. Columns follow ``names`` order, each parameter flattened (as :func:`gradient_matrix`).
    ``info`` (after a pass): ``chunk_size``, ``passes``, ``groups``, ``ghost_layers``, ``materialised_layers``.
    """

    def __init__(
        self,
        model: nn.Module,
        batches: Batches,
        m: int,
        names: Sequence[str] | None = None,
        loss: LossFn | None = None,
        device: torch.device | str = "cpu",
        memory_budget: int = DEFAULT_BUDGET,
        chunk_size: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ):
        self.model = model
        self.batches = batches
        self.m = m
        self.names = list(names) if names is not None else select_parameters(model)
        self.loss = loss or default_loss
        self.device = torch.device(device)
        self.budget = int(memory_budget)
        self.progress = progress
        params = dict(model.named_parameters())
        self.offsets, col = {}, 0
        for n in self.names:
            self.offsets[n] = (col, params[n].shape)
            col += params[n].numel()
        self.shape = (m, col)
        self.row_scale: torch.Tensor | None = None
        self.units = _units(model, self.names)
        self._chunk = chunk_size
        self._K: torch.Tensor | None = None
        self._sizes: list[int] | None = None
        self.info: dict = {"passes": 0}
        self._store: list[Factors] | None = None
        self._done = 0
        self._total = 0

    def scaled(self, f: torch.Tensor) -> "GhostOperator":
        """The same operator with rows scaled by ``f`` (m,), composed with any scaling already set."""
        new = object.__new__(GhostOperator)
        new.__dict__.update(self.__dict__)
        f = f.to(torch.float64)
        new.row_scale = f if self.row_scale is None else self.row_scale * f
        return new

    # -- one pass ---------------------------------------------------------------------------------

    def _pass(self, units: list[_Unit], chunk: int, on_chunk: Callable[[int, list[Factors]], None]) -> None:
        model = self.model
        handles = []

        def fwd_hook(u):
            def h(mod, args, kwargs, out):
                u.inputs.append((tuple(_detach(a) for a in args), {k: _detach(v) for k, v in kwargs.items()}))
                t = out[0] if isinstance(out, (tuple, list)) else out
                if not (isinstance(t, torch.Tensor) and t.requires_grad):
                    raise ModelError(f"layer {u.prefix}: its output does not depend on its parameters as a tensor; use --gram materialize")
                # a tensor hook, not a module backward hook: it survives in-place ops on the output
                # (e.g. ReLU(inplace=True)) and receives the gradient of the layer's own output
                t.register_hook(lambda g: u.grads.append(g.detach()))

            return h

        def register():  # only during forward+backward: torch.func on a hooked module would fail
            for u in units:
                handles.append(u.module.register_forward_hook(fwd_hook(u), with_kwargs=True))

        def remove():
            for h in handles:
                h.remove()
            handles.clear()

        was_training = model.training
        row = 0
        try:
            model.train()
            with _only_trainable(model, self.names), _full_precision(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*Full backward hook is firing.*")
                logging.getLogger("opacus").setLevel(logging.ERROR)
                for x, y in self.batches(chunk):
                    x, y = x.to(self.device), y.to(self.device)
                    n = x.shape[0]
                    if row + n > self.m:
                        raise GSDError(f"more than the announced {self.m} examples arrived")
                    for u in units:
                        u.clear()
                    model.zero_grad(set_to_none=True)
                    register()
                    try:
                        self.loss(model(x), y).sum().backward()
                    finally:
                        remove()
                    model.zero_grad(set_to_none=True)
                    facs = []
                    for u in units:
                        facs.append(u.factors())
                        u.clear()
                    on_chunk(row, facs)
                    row += n
                    self._done += n
                    if self.progress is not None:
                        self.progress(self._done, max(self._total, self._done))
        finally:
            remove()
            for u in units:
                u.clear()
            model.train(was_training)
        if row != self.m:
            raise GSDError(f"expected {self.m} examples, got {row}")
        self.info["passes"] += 1

    def _measure(self) -> None:
        """Per-example sizes (floats) of each unit's factors and of the activations, from one example."""
        if self._sizes is not None:
            return
        acts = [0]
        hs = []

        def h(mod, inp, out):
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    acts[0] += t.numel()

        for mod in self.model.modules():
            if not list(mod.children()):
                hs.append(mod.register_forward_hook(h))
        sizes = []
        first = next(iter(self.batches(1)))
        x1, y1 = first[0][:1], first[1][:1]
        saved = self.batches
        self.batches = lambda c: iter([(x1, y1)])
        m_saved = self.m
        self.m = 1

        def grab(row, facs):
            sizes.extend(f.numel_per_example() for f in facs)

        try:
            self._pass(self.units, 1, grab)
        finally:
            for hd in hs:
                hd.remove()
            self.batches, self.m = saved, m_saved
            self.info["passes"] -= 1
        self._sizes = sizes
        self._acts = acts[0]
        per_chunk = 4 * (3 * self._acts + sum(sizes))
        if self._chunk is None:
            self._chunk = int(max(1, min(256, (self.budget // 4) // max(per_chunk, 1))))
        self.info["chunk_size"] = self._chunk
        self.info["activation_floats_per_example"] = self._acts
        self.info["factor_floats_per_example"] = sum(sizes)

    def _groups(self) -> list[list[int]]:
        """Units split so that each group's factors for all m examples fit half the budget."""
        cap = self.budget // 2
        groups, cur, used = [], [], 0
        for i, s in enumerate(self._sizes):
            need = 4 * self.m * s
            if need > cap:
                u = self.units[i]
                raise GSDError(
                    f"layer {u.prefix} alone needs {need / 2**30:.2f} GiB for {self.m} examples, more than half of "
                    f"--memory-budget; raise --memory-budget or lower -m"
                )
            if cur and used + need > cap:
                groups.append(cur)
                cur, used = [], 0
            cur.append(i)
            used += need
        if cur:
            groups.append(cur)
        return groups

    # -- Gram ---------------------------------------------------------------------------------------

    def gram(self) -> torch.Tensor:
        """K = G G^T (m x m, float64), rows scaled by ``row_scale`` when set."""
        if self._K is None:
            self._measure()
            groups = self._groups()
            self.info["groups"] = len(groups)
            self._total += self.m * len(groups)
            K = torch.zeros(self.m, self.m, dtype=torch.float64, device=self.device)
            kinds = {"ghost": 0, "materialised": 0}
            for grp in groups:
                units = [self.units[i] for i in grp]
                store: list[Factors | None] = [None] * len(units)
                cs = self._chunk

                def keep(row, facs):
                    for j, f in enumerate(facs):
                        if store[j] is None:
                            store[j] = _alloc_like(f, self.m)
                        _fill(store[j], f, row)

                self._pass(units, cs, keep)
                if len(groups) == 1:  # everything fits: the products reuse these factors, no more passes
                    self._store = store
                nbytes = sum(t.numel() * t.element_size() for f in store for t in _tensors(f))
                self.info["stored_bytes_max"] = max(self.info.get("stored_bytes_max", 0), nbytes)
                for f in store:
                    kinds["ghost"] += len(f.pairs) + len(f.embeds)
                    kinds["materialised"] += len(f.mat)
                    _gram_add(K, f, self.budget // 8)
                del store  # (still referenced by self._store when it is the only group)
            self.info["ghost_blocks"] = kinds["ghost"]
            self.info["materialised_blocks"] = kinds["materialised"]
            self._K = K
        K = self._K
        if self.row_scale is not None:
            K = K * self.row_scale[:, None] * self.row_scale[None, :]
        return K

    # -- products -------------------------------------------------------------------------------------

    def rmatvec(self, Y: torch.Tensor, out_dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """G^T Y for Y (m x c): p x c, one pass over the data."""
        Y = Y.to(torch.float64).to(self.device)
        if Y.ndim == 1:
            return self.rmatvec(Y[:, None], out_dtype)[:, 0]
        if self.row_scale is not None:
            Y = Y * self.row_scale[:, None]
        self._measure()
        self._total += self.m
        out = torch.zeros(self.shape[1], Y.shape[1], dtype=out_dtype, device=self.device)

        def contract(row, facs):
            for f in facs:
                n = None
                for A, B, name, r0, rows, _ in f.pairs:
                    n = A.shape[0]
                    Yc = Y[row : row + n].to(A.dtype)
                    kk = Y.shape[1]
                    # sum_i y_ij B_i^T A_i for all j in one GEMM: (D x nT) @ (nT x C k) -> D x C x k
                    BY = (B.unsqueeze(-1) * Yc[:, None, None, :]).reshape(-1, B.shape[2] * kk)
                    Gall = (A.reshape(-1, A.shape[2]).T @ BY).view(A.shape[2], B.shape[2], kk)
                    self._view(out, name, r0, rows).add_(Gall.transpose(0, 1).to(out_dtype))
                for idx, B, name in f.embeds:
                    n = B.shape[0]
                    Yc = Y[row : row + n].to(B.dtype)
                    col, shape = self.offsets[name]
                    view = out[col : col + shape.numel()].view(shape[0], shape[1], -1)
                    for j in range(Y.shape[1]):
                        acc = torch.zeros(shape[0], shape[1], dtype=B.dtype, device=B.device)
                        acc.index_add_(0, idx.reshape(-1), (B * Yc[:, j, None, None]).reshape(-1, B.shape[2]))
                        view[:, :, j] += acc.to(out_dtype)
                for t, key in f.mat:
                    n = t.shape[0]
                    name, r0, rows = key if isinstance(key, tuple) else (key, None, None)
                    blk = (t.to(torch.float64).T @ Y[row : row + n]).to(out_dtype)
                    self._view(out, name, r0, rows).view(-1, Y.shape[1])[:] += blk

        self._run(contract)
        return out

    def _run(self, fn: Callable[[int, list[Factors]], None]) -> None:
        """``fn(row, factors)`` over all examples: from the stored factors when the Gram pass kept them
        (one layer group), else by one more pass over the data."""
        if self._store is None:
            self._pass(self.units, self._chunk, fn)
            return
        for r0 in range(0, self.m, self._chunk):
            r1 = min(self.m, r0 + self._chunk)
            fn(r0, [_rows(f, r0, r1) for f in self._store])
            self._done += r1 - r0
            if self.progress is not None:
                self.progress(self._done, max(self._total, self._done))

    def _view(self, out: torch.Tensor, name: str, r0: int | None, rows: int | None) -> torch.Tensor:
        """The rows of ``out`` (p x c) that hold parameter ``name``: (q, c); or, for a weight block (output
        rows r0..r0+rows of that parameter), shaped (rows, D, c)."""
        col, shape = self.offsets[name]
        full = out[col : col + shape.numel()]
        if r0 is None:
            return full
        per_row = shape.numel() // shape[0]
        return full[r0 * per_row : (r0 + rows) * per_row].view(rows, per_row, out.shape[1])

    def matvec(self, X: torch.Tensor) -> torch.Tensor:
        """G X for X (p x c): m x c float64, one pass over the data."""
        X = X.to(self.device)
        if X.ndim == 1:
            return self.matvec(X[:, None])[:, 0]
        self._measure()
        self._total += self.m
        out = torch.zeros(self.m, X.shape[1], dtype=torch.float64, device=self.device)

        def apply(row, facs):
            for f in facs:
                for A, B, name, r0, rows, _ in f.pairs:
                    n = A.shape[0]
                    Xl = self._view(X, name, r0, rows).to(A.dtype)  # C x D x c
                    for j in range(X.shape[1]):
                        # (G X)_i = sum_t b_it^T X a_it
                        out[row : row + n, j] += ((B @ Xl[:, :, j]) * A).sum((1, 2)).to(torch.float64)
                for idx, B, name in f.embeds:
                    n = B.shape[0]
                    col, shape = self.offsets[name]
                    W = X[col : col + shape.numel()].view(shape[0], shape[1], -1).to(B.dtype)
                    for j in range(X.shape[1]):
                        out[row : row + n, j] += (W[:, :, j][idx] * B).sum((1, 2)).to(torch.float64)
                for t, key in f.mat:
                    n = t.shape[0]
                    name, r0, rows = key if isinstance(key, tuple) else (key, None, None)
                    Xl = self._view(X, name, r0, rows).reshape(-1, X.shape[1])
                    out[row : row + n] += t.to(torch.float64) @ Xl.to(torch.float64)

        self._run(apply)
        if self.row_scale is not None:
            out = out * self.row_scale[:, None]
        return out


# ----------------------------------------------------------------------------------------------
# storage of all m examples' factors, and their Gram matrix


def _alloc_like(f: Factors, m: int) -> Factors:
    def e(t):
        return torch.empty((m,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)

    return Factors(
        pairs=[(e(A), e(B), *rest) for A, B, *rest in f.pairs],
        embeds=[(e(i), e(B), n) for i, B, n in f.embeds],
        mat=[(e(t), k) for t, k in f.mat],
    )


def _fill(store: Factors, f: Factors, row: int) -> None:
    for (SA, SB, *_), (A, B, *_) in zip(store.pairs, f.pairs):
        SA[row : row + A.shape[0]] = A
        SB[row : row + B.shape[0]] = B
    for (SI, SB, _), (I, B, _) in zip(store.embeds, f.embeds):
        SI[row : row + I.shape[0]] = I
        SB[row : row + B.shape[0]] = B
    for (St, _), (t, _) in zip(store.mat, f.mat):
        St[row : row + t.shape[0]] = t


def _tensors(f: Factors) -> list[torch.Tensor]:
    return [A for A, *_ in f.pairs] + [B for _, B, *_ in f.pairs] + [i for i, _, _ in f.embeds] + [B for _, B, _ in f.embeds] + [t for t, _ in f.mat]


def _rows(f: Factors, r0: int, r1: int) -> Factors:
    return Factors(
        pairs=[(A[r0:r1], B[r0:r1], *rest) for A, B, *rest in f.pairs],
        embeds=[(i[r0:r1], B[r0:r1], n) for i, B, n in f.embeds],
        mat=[(t[r0:r1], k) for t, k in f.mat],
    )


def _blocks(m: int, b: int) -> list[tuple[int, int]]:
    return [(i, min(m, i + b)) for i in range(0, m, b)]


def _pair_gram(K: torch.Tensor, A: torch.Tensor, B: torch.Tensor, budget: int, eq: torch.Tensor | None = None) -> None:
    """K += [<A_i A_j^T, B_i B_j^T>]_ij (or with A_i A_j^T replaced by token equality), float64, blockwise."""
    m, T = B.shape[0], B.shape[1]
    D = A.shape[2] if A.ndim == 3 else 1
    C = B.shape[2]
    b = int(min(math.sqrt(budget / (24.0 * T * T)), budget / (32.0 * T * (D + C))))
    bl = _blocks(m, max(1, min(m, b)))
    for i0, i1 in bl:
        Bi = B[i0:i1].to(torch.float64).reshape(-1, C)
        Ai = A[i0:i1].reshape(-1) if A.ndim == 2 else A[i0:i1].to(torch.float64).reshape(-1, D)
        for j0, j1 in bl:
            if j0 < i0:
                continue
            Bj = B[j0:j1].to(torch.float64).reshape(-1, C)
            BB = Bi @ Bj.T
            if A.ndim == 2:  # token ids
                BB *= Ai[:, None] == A[j0:j1].reshape(-1)[None, :]
            else:
                BB *= Ai @ A[j0:j1].to(torch.float64).reshape(-1, D).T
            blk = BB.view(i1 - i0, T, j1 - j0, T).sum((1, 3))
            K[i0:i1, j0:j1] += blk
            if j0 != i0:
                K[j0:j1, i0:i1] += blk.T


def _gram_add(K: torch.Tensor, f: Factors, budget: int) -> None:
    for A, B, _, _, _, ghost in f.pairs:
        if ghost:
            _pair_gram(K, A, B, budget)
        else:  # the layer's per-sample gradients B_i^T A_i, by blocks of output channels
            m, T, D = A.shape
            C = B.shape[2]
            cb = max(1, min(C, int(budget // (16 * m * D))))
            for c0 in range(0, C, cb):
                Gb = torch.einsum("ntc,ntd->ncd", B[:, :, c0 : c0 + cb], A).reshape(m, -1)
                K += gram(Gb)
    for idx, B, _ in f.embeds:
        _pair_gram(K, idx, B, budget)
    for t, _ in f.mat:
        K += gram(t)


# ----------------------------------------------------------------------------------------------
# top-k subspace from the operator


def top_k_from_operator(op, k: int, row_norm: str = "none", v_dtype: torch.dtype = torch.float64):
    """Top-k right singular subspace ``(V, s)`` of G (optionally with unit rows), from the Gram matrix
    and one product G^T W: eigh(K) = U diag(s^2) U^T, V = G^T U diag(1/s), re-orthonormalised.

    ``op`` is a :class:`GhostOperator` or :class:`gsd_cli.dppca.DenseOperator`. ``V`` is p x k in
    ``v_dtype`` (float32 halves the memory of large models; the orthonormalisation runs in float64)."""
    m, p = op.shape
    if k < 1:
        raise GSDError(f"k must be at least 1 (got {k})")
    if k > min(m, p):
        raise GSDError(f"k={k} is larger than the {m} examples x {p} parameters allow; use --k <= {min(m, p)} or more examples")
    if row_norm == "unit":
        n = op.gram().diagonal().sqrt()
        op = op.scaled(torch.where(n > 0, 1.0 / n, torch.ones_like(n)))
    K = op.gram()
    evals, U = torch.linalg.eigh(K)
    evals, U = evals.flip(0)[:k], U.flip(1)[:, :k]
    s = evals.clamp_min(0).sqrt()
    _check_rank(s, k, m, p)
    V = op.rmatvec(U / s, out_dtype=v_dtype)
    orthonormalise_(V)
    return V, s


def orthonormalise_(V: torch.Tensor, block: int = 1 << 20) -> torch.Tensor:
    """In place: V <- V R^-1 with R the Cholesky factor of V^T V (float64, accumulated by row blocks);
    the same span as QR without a p x k copy. Two rounds (CholeskyQR2) for full accuracy."""
    for _ in range(2):
        Gm = torch.zeros(V.shape[1], V.shape[1], dtype=torch.float64, device=V.device)
        for i in range(0, V.shape[0], block):
            b = V[i : i + block].to(torch.float64)
            Gm += b.T @ b
        R = torch.linalg.cholesky(Gm, upper=True)
        Rinv = torch.linalg.inv(R)
        for i in range(0, V.shape[0], block):
            V[i : i + block] = (V[i : i + block].to(torch.float64) @ Rinv).to(V.dtype)
    return V


def choose_gram(gram: str, m: int, p: int, memory_budget: int | str | None, sketch_dim: int | None = None) -> str:
    """``materialize`` or ``ghost`` for ``gram`` in :data:`GRAMS`: ``auto`` materialises when the m x p
    float32 matrix fits ``memory_budget`` (default :data:`DEFAULT_BUDGET`), else ghost. ``--dp-sketch``
    projects the m x p matrix, so it materialises."""
    if gram not in GRAMS:
        raise GSDError(f"--gram must be one of {', '.join(GRAMS)} (got {gram!r})")
    budget = DEFAULT_BUDGET if memory_budget is None else parse_bytes(memory_budget)
    if sketch_dim:
        if gram == "ghost":
            raise GSDError("--dp-sketch projects the m x p gradient matrix; use --gram materialize or auto with it")
        return "materialize"
    if gram == "auto":
        return "materialize" if 4 * m * p <= budget else "ghost"
    return gram


def ghost_subspace(
    model: nn.Module,
    batches: Batches,
    m: int,
    names: Sequence[str],
    k: int,
    *,
    loss: LossFn | None = None,
    device: torch.device | str = "cpu",
    row_norm: str = "none",
    memory_budget: int | str | None = None,
    chunk_size: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    dp: dict | None = None,
    info: dict | None = None,
):
    """Top-k subspace ``(V, s)`` of the per-sample gradients of ``m`` examples by the Gram path.

    V is p x k: float64 when p*k*8 bytes is at most a quarter of the budget, else float32 (resnet50:
    1.5 GB instead of 3 GB), orthonormal either way. With ``dp`` (as :func:`gsd_cli.ranking.sample_subspace`)
    the subspace is drawn by :func:`gsd_cli.dppca.private_top_k_subspace` on the operator, with the
    private generator ``dp["rng"]``, and ``s`` is empty."""
    budget = DEFAULT_BUDGET if memory_budget is None else parse_bytes(memory_budget)
    model = model.to(device)
    op = GhostOperator(model, batches, m, names, loss, device, budget, chunk_size, progress)
    p = op.shape[1]
    v_dtype = torch.float64 if 8 * p * k <= budget // 4 else torch.float32
    if dp is None:
        V, s = top_k_from_operator(op, k, row_norm, v_dtype)
    else:
        from .dppca import private_top_k_subspace

        if row_norm == "unit":
            n = op.gram().diagonal().sqrt()
            op = op.scaled(torch.where(n > 0, 1.0 / n, torch.ones_like(n)))
        V = private_top_k_subspace(op, k, dp["epsilon"], dp["clip"], dp["mechanism"], dp["rng"], dp.get("sweeps", 10))
        s = torch.empty(0, dtype=torch.float64)
    if info is not None:
        info.update(op.info)
    return V, s
