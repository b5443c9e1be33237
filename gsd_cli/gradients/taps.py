"""Capture helpers shared by the two engines that hook a model's layers, the ``layers`` per-sample
gradient engine (:mod:`gsd_cli.gradients.layers`) and ghost clipping (:mod:`gsd_cli.train.clipsum`):
channels-last max-pooling on a CPU, and the taps of parameters that a module with sub-layers adds to
its activations (a ViT's class token and position embedding). Moved out of
:mod:`gsd_cli.gradients.layers` (issue 51), which still exports them."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn as nn


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
