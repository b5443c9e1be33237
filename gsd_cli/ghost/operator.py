"""The Gram-path operator: the per-sample gradient matrix G (m x p) of a model over a stream of
examples, never formed.

GSD needs only G G^T (DESIGN.md, "Projection metric"): :meth:`GhostOperator.gram` adds every layer's
contribution to K = G G^T (float64) by its own rule (:mod:`gsd_cli.ghost.rules`), from factors
streamed by :mod:`gsd_cli.ghost.stream` and summed by :mod:`gsd_cli.ghost.accumulate`. ``matvec(X)``
= G X and ``rmatvec(Y)`` = G^T Y (one more pass each, p x c memory, never m x p) contract each
layer's factors, with an optional row scaling (unit rows, DP clipping): all DP-GSD's Bingham
sampler needs.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn as nn

from ..gradients import LossFn, default_loss, select_parameters
from .accumulate import gram_add
from .budget import DEFAULT_BUDGET, Batches
from .factors import Factors, alloc_like, fill, tensors
from .stream import Streaming
from .units import find_units


class GhostOperator(Streaming):
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
        self.units = find_units(model, self.names)
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
                            store[j] = alloc_like(f, self.m)
                        fill(store[j], f, row)

                self._pass(units, cs, keep)
                if len(groups) == 1:  # everything fits: the products reuse these factors, no more passes
                    self._store = store
                nbytes = sum(t.numel() * t.element_size() for f in store for t in tensors(f))
                self.info["stored_bytes_max"] = max(self.info.get("stored_bytes_max", 0), nbytes)
                for f in store:
                    kinds["ghost"] += len(f.pairs) + len(f.embeds)
                    kinds["materialised"] += len(f.mat)
                    gram_add(K, f, self.budget // 8)
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
