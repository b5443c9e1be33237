"""Small CNNs of paper 004 (Gu, Kamath, Wu), Table 7.

* :func:`probe` is Table 7b, the "probe network": Conv 64 filters 8x8 stride 5, max-pool 2, Conv 16
  filters 4x4 stride 3, max-pool 2, Linear 144 -> classes. At 224x224x3 the feature map before the
  Linear layer is 16 x 3 x 3 = 144, and the network has 30,202 parameters for 10 classes (the paper:
  "around 30,000"). The paper's last row "Sigmoid num_classes" is the output non-linearity of its
  multi-label tasks; the network here returns logits and the loss applies the link (softmax
  cross-entropy for single-label tasks, sigmoid for multi-label ones).
* :func:`fmnist_cnn` is Table 7a, the Fashion-MNIST network of the pre-conditioning experiments: Conv
  16 filters 8x8 stride 2, max-pool 2, Conv 32 filters 4x4 stride 2, Linear 32, Linear 10 (about
  26,000 parameters at 28x28x1).

Neither table names the hidden activation; ReLU is used (the GEP code's choice for its CNNs is tanh,
which ``activation="tanh"`` gives; ``activation="none"`` leaves the identity).

**Other input sizes** (``probe@SIZE``, ``fmnist-cnn@SIZE``): the layers stay the table's; only the input
size of the first Linear layer follows the feature map the convolutions and poolings leave
(:func:`probe_side`, :func:`fmnist_side`; the flatten size is computed, not pooled), so at the native
size (224, 28) the network, its parameter count and its initial weights are exactly the table's, and at
another size it has more or fewer weights in that layer (``gsd models show probe@112``). A size whose
map vanishes (a kernel larger than its input) cannot work: :func:`check_size` refuses it in one line
naming the smallest size that works (:func:`smallest_size`: 73 for the probe, 14 for the FMNIST CNN).
"""

from __future__ import annotations

from collections import OrderedDict

import torch.nn as nn


#: hidden activations: ReLU (default), tanh (the GEP code's), none (identity: a linear network between poolings)
ACTIVATIONS = ("relu", "tanh", "none")


def _act(name: str) -> nn.Module:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; use one of {', '.join(ACTIVATIONS)}")
    return {"relu": nn.ReLU, "tanh": nn.Tanh, "none": nn.Identity}[name]()


def _conv(n: int, kernel: int, stride: int, padding: int = 0) -> int:
    """Output side of a convolution or pooling on an ``n``-pixel side; 0 where the kernel does not fit."""
    n += 2 * padding
    return (n - kernel) // stride + 1 if n >= kernel else 0


def probe_side(size: int) -> int:
    """Side of the probe's last feature map (16 channels) for ``size`` x ``size`` inputs; 0: none."""
    n = _conv(size, 8, 5)  # conv1
    n = _conv(n, 2, 2)  # pool1
    n = _conv(n, 4, 3)  # conv2
    return _conv(n, 2, 2)  # pool2


def fmnist_side(size: int) -> int:
    """Side of the FMNIST CNN's last feature map (32 channels) for ``size`` x ``size`` inputs; 0: none."""
    n = _conv(size, 8, 2, 3)  # conv1
    n = _conv(n, 2, 1)  # pool1
    n = _conv(n, 4, 2)  # conv2
    return _conv(n, 2, 1)  # pool2


#: the feature-map side of each network of this module, by its registry name
SIDES = {"probe": probe_side, "fmnist-cnn": fmnist_side}


def smallest_size(side) -> int:
    """The smallest input side for which ``side`` (:func:`probe_side`, :func:`fmnist_side`) leaves a map."""
    return next(s for s in range(1, 4097) if side(s) >= 1)


def check_size(name: str, side, size: int) -> int:
    """The last feature map's side at ``size``; a ``ValueError`` naming the smallest size that works
    where the map vanishes."""
    got = side(size)
    if got < 1:
        least = smallest_size(side)
        raise ValueError(f"{name} needs inputs of at least {least}x{least} pixels: at {size}x{size} a kernel is larger than the "
                         f"feature map it meets; use {name}@{least} or larger")
    return got


def probe(num_classes: int = 10, in_channels: int = 3, activation: str = "relu", input_size: int = 224) -> nn.Sequential:
    """Probe network of paper 004 Table 7b for ``input_size`` x ``input_size`` inputs (the paper's: 224;
    the Linear layer's input is the flattened last map, 144 at 224: module docstring)."""
    side = check_size("probe", probe_side, input_size)
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(in_channels, 64, kernel_size=8, stride=5),
        act1=_act(activation),
        pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(64, 16, kernel_size=4, stride=3),
        act2=_act(activation),
        pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(),
        fc=nn.Linear(16 * side * side, num_classes),
    ))


def fmnist_cnn(num_classes: int = 10, in_channels: int = 1, activation: str = "relu", input_size: int = 28) -> nn.Sequential:
    """Fashion-MNIST CNN of paper 004 Table 7a for ``input_size`` x ``input_size`` inputs (the paper's: 28;
    the first Linear layer's input is the flattened last map, 32 x 4 x 4 at 28: module docstring)."""
    side = check_size("fmnist-cnn", fmnist_side, input_size)
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(in_channels, 16, kernel_size=8, stride=2, padding=3),
        act1=_act(activation),
        pool1=nn.MaxPool2d(2, stride=1),
        conv2=nn.Conv2d(16, 32, kernel_size=4, stride=2),
        act2=_act(activation),
        pool2=nn.MaxPool2d(2, stride=1),
        flatten=nn.Flatten(),
        fc1=nn.Linear(32 * side * side, 32),
        act3=_act(activation),
        fc2=nn.Linear(32, num_classes),
    ))
