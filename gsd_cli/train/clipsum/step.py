"""How a training step uses ghost clipping (:mod:`gsd_cli.train.clipsum`): which chains it fuses with
(:func:`fusable`: one clip of ``"grad"``), the step of DP-SGD (:class:`ClipSumStep`, :class:`LazyClipSum`:
the path chosen once on a synthetic batch, never on private data) and of RGP's carriers
(:class:`RGPClipSum`)."""

from __future__ import annotations

import torch

from ...errors import GSDError
from . import ClippedSum


def fusable(chain) -> bool:
    """Whether ``chain``'s per-example pass is exactly one clip of ``"grad"`` (DP-SGD): then the sum of
    its per-example outputs is a clipped sum this engine computes."""
    from ..transforms import Clip, Transform

    per = [t for t in chain.transforms if type(t).per_example is not Transform.per_example]
    return len(per) == 1 and isinstance(per[0], Clip) and per[0].part == "grad"


class ClipSumStep:
    """The loop's hook for a fusable chain: ``(model, names, x, y, ctx) -> {"grad": sum}`` (the parameters' dtype),
    counting the clipped examples into ``ctx.info`` as :class:`~gsd_cli.train.transforms.Clip` does."""

    def __init__(self, engine: ClippedSum, max_norm: float):
        self.engine, self.max_norm = engine, float(max_norm)

    def __call__(self, model, names, x, y, ctx) -> dict:
        from ...gradients import _full_precision, _only_trainable

        was = model.training
        try:
            model.train()
            with _only_trainable(model, names), _full_precision():
                s, sq = self.engine(x, y, self.max_norm)
        finally:
            model.train(was)
        info = ctx.info.setdefault("clipped_grad", [0, 0])
        info[0] += int((torch.nan_to_num(sq, nan=0.0) > self.max_norm ** 2).sum())
        info[1] += x.shape[0]
        return {"grad": s}


class LazyClipSum:
    """Chooses the path on the first chunk (``mode``: ``auto``, ``ghost``) from the model's structure and
    a synthetic batch of the chunk's shape (never the private examples), then keeps it. ``None`` from
    :meth:`hook` means the materialised path; ``reason`` says why.

    ``max_norm=None``: a chain that needs every example's vector (GEP, TopAgg, random sparsification):
    :meth:`rows` then gives the per-sample gradient matrix of a chunk by the same per-layer rules (one
    batched forward, one backward to the layer outputs: :class:`gsd_cli.gradients.layers.LayersEngine`)
    where the same synthetic check passes, else ``None`` (torch.func's vmap, as before)."""

    def __init__(self, mode: str, max_norm: float | None, loss=None):
        self.mode, self.loss = mode, loss
        self.tune_examples: int | None = None  # the synthetic chunk the paths are timed on (gsd train: public)
        self.fixed_paths: dict[str, str] | None = None  # paths measured before (a resumed run's checkpoint): not timed again
        self.max_norm = None if max_norm is None else float(max_norm)
        self.step: ClipSumStep | None = None
        self.layers = None
        self.decided = False
        self.reason = ""

    def rows(self, model, names, x, y, out: torch.Tensor) -> bool:
        """Fill ``out`` (n x p) with the chunk's per-sample gradients by the layers rules and return True,
        or return False (the caller takes vmap)."""
        from ...gradients import _full_precision, _only_trainable

        if not self.decided:
            from ...gradients.layers import LayersEngine

            was = model.training
            try:
                model.train()
                with _only_trainable(model, names), _full_precision():
                    ClippedSum(model, names, self.loss).check(x, y)
                    self.layers = LayersEngine(model, names, self.loss or _default_loss())
                    self.layers.checked = True  # the synthetic check above: no private example read
                self.reason = "layers (per-sample gradients by per-layer rules)"
            except NotImplementedError as e:
                if self.mode == "ghost":
                    raise GSDError(f"--clip-engine ghost: {str(e).splitlines()[0]}; use --clip-engine auto or materialise") from None
                self.reason = f"materialise ({str(e).splitlines()[0]})"
            finally:
                model.train(was)
            self.decided = True
        if self.layers is None:
            return False
        was = model.training
        try:
            model.train()
            with _only_trainable(model, names), _full_precision():
                self.layers(x, y, out)
        finally:
            model.train(was)
        return True

    def hook(self, model, names, x, y) -> ClipSumStep | None:
        if self.max_norm is None:
            return None
        if not self.decided:
            from ...gradients import _only_trainable

            eng, self.reason = _first_use(self.mode, model, lambda: _only_trainable(model, names),
                                          lambda m, n: ClippedSum(m, n, self.loss), (model, names), x, y, "ghost",
                                          self.tune_examples, self.fixed_paths)
            self.step = ClipSumStep(eng, self.max_norm) if eng is not None else None
            self.decided = True
        return self.step

    @property
    def chosen_paths(self) -> dict[str, str] | None:
        """Each layer's path once the first step chose them (``{}``: the materialised path for all), for
        the checkpoint, so that ``--resume`` computes the same bits; None before the first step."""
        if not self.decided or self.max_norm is None:
            return None
        return dict(self.step.engine.paths) if self.step is not None else {}


class RGPClipSum:
    """RGP's clipped sums (paper 001, Algorithm 1 lines 7-10: the carrier gradients dL, dR of every layer
    and the other trained parameters' gradients, clipped to C as one vector, summed) by the same engine:
    each step the model with its reparametrized layers as three leaf layers (``r`` weight R, ``l``
    weight L, ``res`` the frozen W~ with the bias: :meth:`~gsd_cli.train.rgp.RGP.leaves`), whose
    selected parameters are exactly the carriers and the others, in :meth:`~gsd_cli.train.rgp.RGP.order`.
    The first-use check (synthetic batch) runs on that model; a refusal keeps RGP's vmap path."""

    def __init__(self, mode: str, max_norm: float, rgp, loss=None):
        self.mode, self.max_norm, self.rgp, self.loss = mode, float(max_norm), rgp, loss
        self.decided, self.ok = False, False
        self.tune_examples: int | None = None
        self.fixed_paths: dict[str, str] | None = None  # as LazyClipSum's
        self.paths: dict[str, str] = {}
        self.reason = ""

    @property
    def chosen_paths(self) -> dict[str, str] | None:
        """As :attr:`LazyClipSum.chosen_paths`."""
        return dict(self.paths) if self.decided else None

    def rows(self, model, names, x, y, out) -> bool:
        return False

    def hook(self, model, names, x, y):
        if not self.decided:
            eng, self.reason = _first_use(self.mode, model, lambda: self.rgp.leaves(model),
                                          lambda m, n: ClippedSum(m, n, self.loss), None, x, y, "ghost (RGP carriers)",
                                          self.tune_examples, self.fixed_paths)
            self.ok = eng is not None
            self.paths = dict(eng.paths) if eng is not None else {}  # the measured choice, for every step's engine
            self.decided = True
        return self if self.ok else None

    def __call__(self, model, names, x, y, ctx) -> dict:
        if ctx is not None and ctx.model is not None:
            self.rgp.compute(model, ctx.step)
        with self.rgp.leaves(model) as (m2, names2):
            eng = ClippedSum(m2, names2, self.loss)  # the carriers change every step: a new engine, the same layers
            eng.paths = dict(self.paths)
            return ClipSumStep(eng, self.max_norm)(m2, names2, x, y, ctx)


def gradient_rows(rows_engine, model, names, x, y, num_params: int, device) -> torch.Tensor:
    """A chunk's per-example gradient rows (n x ``num_params``): by the per-layer rules where the model
    allows them (``rows_engine``: a :class:`LazyClipSum` or None), else torch.func's vmap."""
    if rows_engine is not None:
        G = torch.empty(x.shape[0], num_params, device=device)
        if rows_engine.rows(model, names, x.to(device), y.to(device), G):
            return G
    from ...gradients import gradient_matrix

    return gradient_matrix(model, [(x, y)], x.shape[0], names, None, "vmap", device, "none")


def _first_use(mode: str, model, context, make, fixed, x, y, label: str, tune_examples: int | None = None,
               fixed_paths: dict[str, str] | None = None):
    """The first-use check of ghost clipping on one synthetic batch: ``(engine, reason)``, or ``(None,
    reason)`` when the model is refused (``mode`` ghost: a one-line GSDError instead). ``context()``
    yields the model and parameter names to check (``fixed`` when it yields nothing of its own: the
    model and names as they are), ``make(model, names)`` builds the engine; train mode and full
    precision during the check, the model's mode restored after. ``tune_examples``: the size of the
    synthetic chunk each layer's path is timed on (:meth:`ClippedSum.tune`; None: ``x``'s). ``fixed_paths``:
    paths chosen before (``gsd train --resume``: the checkpoint's), kept instead of timing again, so that
    the resumed run computes the bits the uninterrupted one would have."""
    from ...gradients import _full_precision, _only_trainable

    was = model.training
    try:
        model.train()
        with context() as got, _full_precision():
            m, n = fixed if fixed is not None else got
            with _only_trainable(m, n) if fixed is None else _nullcontext():
                eng = make(m, n)
                if fixed_paths is not None:
                    eng.paths = {str(k): v for k, v in fixed_paths.items() if v in ("ghost", "materialised")}
                else:
                    eng.tune(x, y, tune_examples)  # each layer's faster path, timed on a synthetic chunk
                eng.check(x, y)
        return eng, f"{label}: " + ", ".join(f"{k or 'model'} {v}" for k, v in eng.plan.items())
    except NotImplementedError as e:
        if mode == "ghost":
            raise GSDError(f"--clip-engine ghost: {str(e).splitlines()[0]}; use --clip-engine auto or materialise") from None
        return None, f"materialise ({str(e).splitlines()[0]})"
    finally:
        model.train(was)


def _nullcontext():
    from contextlib import nullcontext

    return nullcontext()


def _default_loss():
    from ...gradients import default_loss

    return default_loss


__all__ = ["ClipSumStep", "LazyClipSum", "RGPClipSum", "fusable"]
