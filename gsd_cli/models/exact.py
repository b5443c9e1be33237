"""Exact per-sample gradients: layers whose output for one example depends on the other examples of
the batch (BatchNorm in training mode) are frozen, replaced or refused.

Why. ``gsd rank`` and ``gsd train`` take per-sample gradients with the model in training mode. A
BatchNorm layer in training mode normalises each example with the mean and variance of the whole
batch: one example's gradient then depends on the others, torch.func's per-example gradient is not
the gradient of that example's loss, and DP-SGD's per-example sensitivity (the clip norm) no longer
bounds what one example changes. Opacus refuses such layers for the same reason
(``opacus.validators.ModuleValidator``).

Policies (``batchnorm=``, ``--batchnorm``), for every ``torch.nn`` BatchNorm layer (any subclass of
``_BatchNorm``: ``BatchNorm1d/2d/3d``, ``SyncBatchNorm``, timm's ``BatchNormAct2d``...; the
torchvision backbones' :class:`probes.backbones.FrozenBatchNorm2d` is frozen already):

* ``freeze`` (default of ``gsd rank``): the layer always normalises with its running statistics and
  never updates them, whatever ``model.train()`` says: the same function as in eval mode, one example
  at a time, exactly as gsd's torchvision backbones (its affine weight and bias stay trainable). Right
  for pre-trained weights (``--weights``), whose statistics are part of what was learned; for a random
  network the statistics are the initial mean 0 and variance 1. A layer without running statistics
  (``track_running_stats=False``) normalises by the batch even in eval mode and cannot be frozen.
* ``groupnorm``: each layer replaced by GroupNorm (Opacus's ``ModuleValidator`` fixer: ``gcd(32, C)``
  groups; for timm's ``BatchNormAct2d`` a GroupNorm followed by the layer's own dropout and
  activation). For training from scratch. Pre-trained BatchNorm parameters are dropped.
* ``refuse`` (default of ``gsd train``): a one-line :class:`ModelError` naming the layers and these
  choices.

Opacus's ``ModuleValidator.validate`` is not used to find the layers: it looks classes up by their
exact type (a subclass such as ``BatchNormAct2d`` slips through) and skips layers without trainable
parameters (``affine=False`` still mixes the batch). The search here is ``isinstance``.
"""

from __future__ import annotations

import math

import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import ModelError

POLICIES = ("freeze", "groupnorm", "refuse")
HINT = ("use --batchnorm freeze (its running statistics, fixed: right with pre-trained --weights), --batchnorm groupnorm "
        "(GroupNorm in its place, as Opacus's ModuleValidator.fix: for training from scratch), or a model without BatchNorm")


class FrozenNorm:
    """Mixin of a frozen BatchNorm class: ``train(mode)`` leaves the layer itself in eval mode."""

    gsd_frozen = True

    def train(self, mode: bool = True):
        super().train(mode)
        self.training = False
        return self


_FROZEN: dict[type, type] = {}


def frozen_class(cls: type) -> type:
    """The frozen variant of the BatchNorm class ``cls`` (made once, importable from this module)."""
    if cls not in _FROZEN:
        name = f"Frozen{cls.__name__}"
        while name in globals():
            name += "_"
        made = type(name, (FrozenNorm, cls), {"__module__": __name__, "__doc__": f"{cls.__qualname__}, frozen in eval mode (gsd)."})
        made.__qualname__ = name
        globals()[name] = made
        _FROZEN[cls] = made
    return _FROZEN[cls]


def is_frozen(module: nn.Module) -> bool:
    from probes.backbones import FrozenBatchNorm2d

    return isinstance(module, (FrozenNorm, FrozenBatchNorm2d))


def batch_mixing_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, layer)`` of every BatchNorm layer of ``model`` that is not frozen."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _BatchNorm) and not is_frozen(m)]


def _listing(layers, limit: int = 3) -> str:
    shown = ", ".join(f"'{n}' ({type(m).__name__})" for n, m in layers[:limit])
    return shown + (f" and {len(layers) - limit} more" if len(layers) > limit else "")


def _set(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def _groupnorm(layer: nn.Module) -> nn.Module:
    from opacus.validators import ModuleValidator

    fixer = ModuleValidator.FIXERS.get(type(layer))
    if fixer is not None:  # torch's own BatchNorm classes: Opacus's replacement
        return fixer(layer)
    gn = nn.GroupNorm(math.gcd(32, layer.num_features), layer.num_features, eps=layer.eps, affine=layer.affine)
    return nn.Sequential(gn, layer.drop, layer.act)  # timm's BatchNormAct: normalise, then its dropout and activation


def make_exact(model: nn.Module, policy: str = "freeze", label: str = "the model") -> tuple[nn.Module, dict | None]:
    """Apply ``policy`` (module docstring) to the BatchNorm layers of ``model`` in place. Returns the
    model and what was done (None when it has no unfrozen BatchNorm layer)."""
    if policy not in POLICIES:
        raise ModelError(f"--batchnorm must be one of {', '.join(POLICIES)} (got {policy!r})")
    layers = batch_mixing_layers(model)
    if not layers:
        return model, None
    why = "normalises each example with statistics of the whole batch in training mode, so per-sample gradients and DP's per-example sensitivity would be wrong"
    if policy == "refuse":
        raise ModelError(f"model {label}: BatchNorm layer {_listing(layers)} {why}; {HINT}")
    if policy == "freeze":
        stateless = [(n, m) for n, m in layers if m.running_mean is None or m.running_var is None]
        if stateless:
            raise ModelError(f"model {label}: BatchNorm layer {_listing(stateless)} has no running statistics "
                             "(track_running_stats=False) and normalises by the batch even in eval mode, so it cannot be "
                             "frozen; use --batchnorm groupnorm, or a model without BatchNorm")
        for _, m in layers:
            m.__class__ = frozen_class(type(m))
            m.training = False
        return model, {"policy": "freeze", "layers": len(layers), "note": "BatchNorm frozen: running statistics, never updated"}
    odd = [(n, m) for n, m in layers if type(m) not in _torch_batchnorms() and not (hasattr(m, "act") and hasattr(m, "drop"))]
    if odd:
        raise ModelError(f"model {label}: BatchNorm layer {_listing(odd)} has its own forward, which GroupNorm cannot "
                         "replace safely; use --batchnorm freeze, or build the model with GroupNorm")
    for name, m in layers:  # the model is still on the CPU, where it was built
        _set(model, name, _groupnorm(m))
    return model, {"policy": "groupnorm", "layers": len(layers),
                   "note": "BatchNorm replaced by GroupNorm (gcd(32, C) groups); any pre-trained BatchNorm parameters are dropped"}


def _torch_batchnorms() -> tuple[type, ...]:
    return (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
