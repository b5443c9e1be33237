"""Model zoo for gsd: the networks of the source papers, behind one registry.

A :class:`ModelSpec` names a constructor and the input it expects (size and channels). Later parts
of the project register more (torchvision backbones, parameter-efficient subsets) with
:func:`register`.

>>> from probes import get_model_spec
>>> spec = get_model_spec("probe")
>>> spec.input_size, spec.channels
(224, 3)
>>> model = spec.build(num_classes=10, seed=0)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from .cnn import fmnist_cnn, fmnist_side, probe, probe_side, smallest_size
from .resnet import resnet20
from .resnet50 import resnet50_gn
from . import backbones as _bb

__all__ = ["ModelSpec", "register", "get_model_spec", "list_models", "check_input_size", "smallest_input_size", "probe",
           "fmnist_cnn", "resnet20"]


@dataclass(frozen=True)
class ModelSpec:
    """A named model: ``constructor(num_classes=..., in_channels=...)`` and its expected input."""

    name: str
    constructor: Callable[..., nn.Module]
    input_size: int | None  # None: read off the built model (a user's model, gsd_cli.models.spec.settle_spec)
    channels: int | None  # None: read off the built model (as input_size)
    description: str = ""
    presets: dict[str, tuple[str, ...]] = field(default_factory=dict)
    takes_input_size: bool = False  # the constructor also takes ``input_size`` (ViT's patch grid)
    #: where the model comes from, for its identity (:func:`gsd_cli.models.spec.model_identity`): empty
    #: for a registered model; ``{"kind": "timm" | "file" | "module" | "factory", ...}`` otherwise
    origin: dict = field(default_factory=dict)
    #: the smallest input side ``NAME@SIZE`` may ask for, and the step sizes must be a multiple of
    #: (ViT's 16-pixel patches); :func:`get_model_spec` refuses others in one line
    min_input_size: int = 8
    size_multiple: int = 1

    def build(self, num_classes: int = 10, seed: int | None = 0) -> nn.Module:
        """Construct the model; its initial weights w0 are a function of ``seed`` alone."""
        kw = dict(num_classes=num_classes, in_channels=self.channels)
        if self.takes_input_size:
            kw["input_size"] = self.input_size
        if seed is None:
            return self.constructor(**kw)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return self.constructor(**kw)


_REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Add (or replace) a model in the registry."""
    _REGISTRY[spec.name] = spec
    return spec


def parse_input(name: str) -> tuple[str, int | None, int | None]:
    """``NAME@SIZE`` or ``NAME@SIZExC`` -> ``(NAME, SIZE, C)`` (None where not given); raises
    ``KeyError`` for a malformed suffix. ``resnet18@32`` is resnet18 for 32x32 inputs, ``fmnist-cnn@28x3``
    for 28x28 inputs with 3 channels."""
    base, at, suffix = name.rpartition("@")
    if not at:
        return name, None, None
    size, x, chans = suffix.partition("x")
    if not size.isdigit() or not 8 <= int(size) <= 1024 or (x and not (chans.isdigit() and 1 <= int(chans) <= 64)):
        raise KeyError(f"model {name!r}: the size after '@' must be a whole number of pixels in 8..1024, optionally "
                       "followed by x CHANNELS (1..64): NAME@32 or NAME@32x1")
    return base, int(size), int(chans) if x else None


def get_model_spec(name: str) -> ModelSpec:
    """Look a model up by name; raises ``KeyError`` listing the known names. ``NAME@SIZE`` (e.g.
    ``resnet18@32``) is model NAME built for SIZE x SIZE inputs, ``NAME@SIZExC`` also for C channels.
    (``timm:NAME``, ``FILE.py:FACTORY`` and ``nn.Module`` objects: :func:`gsd_cli.models.spec.resolve_model`.)"""
    base, size, chans = parse_input(name)
    try:
        spec = _REGISTRY[base]
    except KeyError:
        raise KeyError(f"unknown model {base!r}; known models: {', '.join(sorted(_REGISTRY))} "
                       "(or timm:NAME, or FILE.py:FACTORY)") from None
    if size is None:
        return spec
    check_input_size(spec, size)
    from dataclasses import replace

    return replace(spec, name=name, input_size=size, channels=spec.channels if chans is None else chans)


def smallest_input_size(spec: ModelSpec) -> int:
    """The smallest side ``spec`` works at (:attr:`ModelSpec.min_input_size`, rounded up to its multiple)."""
    m = max(1, spec.size_multiple)
    return -(-spec.min_input_size // m) * m


def check_input_size(spec: ModelSpec, size: int) -> None:
    """``KeyError`` (one line, naming the smallest size that works) where ``spec`` cannot take ``size``
    x ``size`` inputs: a kernel larger than the map it meets, or ViT's patch grid."""
    least = smallest_input_size(spec)
    if size < least:
        raise KeyError(f"model {spec.name}@{size}: {spec.name} needs inputs of at least {least}x{least} pixels (at {size}x{size} a "
                       f"kernel is larger than the feature map it meets); use {spec.name}@{least} or larger")
    if size % max(1, spec.size_multiple):
        m = spec.size_multiple
        raise KeyError(f"model {spec.name}@{size}: {spec.name} needs an input size that is a multiple of {m} (its patches); "
                       f"use {spec.name}@{size // m * m} or {spec.name}@{-(-size // m) * m}")


def list_models() -> list[ModelSpec]:
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


# probe, fmnist-cnn: the Linear layer's input follows the input size (probes.cnn); the sizes below the
# smallest are refused. densenet121: its last transition's 2x2 pooling needs a 2x2 map (29 pixels and
# up); the ResNets pool adaptively and take any size from 8 (tests/test_model_sizes.py checks each).
register(ModelSpec("probe", probe, 224, 3, "probe network of paper 004 Table 7b (~30k parameters at 224; probe@SIZE from 73)",
                   takes_input_size=True, min_input_size=smallest_size(probe_side)))
register(ModelSpec("fmnist-cnn", fmnist_cnn, 28, 1, "Fashion-MNIST CNN of paper 004 Table 7a (~26k parameters at 28; fmnist-cnn@SIZE from 14)",
                   takes_input_size=True, min_input_size=smallest_size(fmnist_side)))
register(ModelSpec("resnet20", resnet20, 32, 3, "ResNet20 with GroupNorm, as GEP (~268k parameters)"))
register(ModelSpec("resnet50", resnet50_gn, 32, 3, "torchvision ResNet-50, GroupNorm(32) for BatchNorm, random weights, 32x32 inputs (~23.5M parameters)"))
register(ModelSpec("resnet18", _bb.resnet18, 224, 3, "torchvision ResNet-18, BatchNorm frozen in eval mode (~11.2M parameters)"))
register(ModelSpec("resnet50-bn", _bb.resnet50_bn, 224, 3, "torchvision ResNet-50, BatchNorm frozen in eval mode (~23.5M parameters)"))
register(ModelSpec("resnet152", _bb.resnet152, 224, 3, "torchvision ResNet-152, BatchNorm frozen in eval mode (~58.2M parameters)",
                   presets={"paper": _bb.RESNET152_PAPER}))
register(ModelSpec("densenet121", _bb.densenet121, 224, 3, "torchvision DenseNet-121, BatchNorm frozen in eval mode (~7.0M parameters)",
                   presets={"paper": _bb.DENSENET121_PAPER}, min_input_size=29))
register(ModelSpec("vit_b_16", _bb.vit_b_16, 224, 3, "torchvision ViT-B/16 (~85.8M parameters); --peft paper: LoRA r=8, alpha=8 as paper 004",
                   presets={"paper": ("lora:r=8,alpha=8",)}, takes_input_size=True, min_input_size=16, size_multiple=16))
