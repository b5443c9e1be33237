"""Streaming of the Gram path: passes over the data in chunks, within a memory budget.

Examples arrive in chunks (size chosen from ``memory_budget``); the layers are split into groups whose
compact per-example factors for all m examples fit half the budget, one forward+backward pass over the
data per group. Hooks capture every unit's inputs and output gradients (the loss is the *sum* of
per-example losses, so output gradients are per-example) and each unit's layer rule turns them into
factors (:mod:`gsd_cli.ghost.rules`).

:class:`Streaming` is the part of :class:`gsd_cli.ghost.GhostOperator` that runs these passes; it
relies on the operator's ``model``, ``batches``, ``m``, ``names``, ``loss``, ``device``, ``budget``,
``progress``, ``units``, ``info``, ``_chunk``, ``_sizes``, ``_store``, ``_done`` and ``_total``.
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable

import torch

from ..errors import GSDError, ModelError
from ..gradients import _full_precision, _only_trainable
from .factors import Factors, rows, tensors
from .units import Unit


def _detach(v):
    return v.detach() if isinstance(v, torch.Tensor) else v


class Streaming:
    """Passes over the data: :meth:`_pass` (one forward+backward per chunk), :meth:`_measure` (sizes and
    chunk size), :meth:`_groups` (layer groups within the budget), :meth:`_run` (stored or streamed)."""

    #: zero each example's factors that hold a NaN or an infinity (set by a DP release: see
    #: :func:`_zero_nonfinite_examples`)
    zero_nonfinite = False

    def _pass(self, units: list[Unit], chunk: int, on_chunk: Callable[[int, list[Factors]], None]) -> None:
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
                    if getattr(self, "zero_nonfinite", False):
                        _zero_nonfinite_examples(facs, n)
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

    def _run(self, fn: Callable[[int, list[Factors]], None]) -> None:
        """``fn(row, factors)`` over all examples: from the stored factors when the Gram pass kept them
        (one layer group), else by one more pass over the data."""
        if self._store is None:
            self._pass(self.units, self._chunk, fn)
            return
        for r0 in range(0, self.m, self._chunk):
            r1 = min(self.m, r0 + self._chunk)
            fn(r0, [rows(f, r0, r1) for f in self._store])
            self._done += r1 - r0
            if self.progress is not None:
                self.progress(self._done, max(self._total, self._done))


def _zero_nonfinite_examples(facs: list, n: int) -> None:
    """Zero, in place, every factor of each example of the chunk whose factors hold a NaN or an
    infinity, as :func:`gsd_cli.subspace.dppca.clip_rows` zeroes such a row of a materialised G: a per-example
    rule (it looks at that example alone), so a DP release's sensitivity is unchanged, and one bad
    example cannot turn the release into NaN (which would show its presence)."""
    bad = None
    for f in facs:
        for t in tensors(f):
            if t.is_floating_point():
                b = ~torch.isfinite(t.reshape(n, -1)).all(dim=1)
                bad = b if bad is None else bad | b
    if bad is None or not bool(bad.any()):
        return
    for f in facs:
        for t in tensors(f):
            if t.is_floating_point():
                t[bad] = 0
