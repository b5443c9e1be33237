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


def probe(num_classes: int = 10, in_channels: int = 3, activation: str = "relu") -> nn.Sequential:
    """Probe network of paper 004 Table 7b (expects 224x224 inputs)."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(in_channels, 64, kernel_size=8, stride=5),
        act1=_act(activation),
        pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(64, 16, kernel_size=4, stride=3),
        act2=_act(activation),
        pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(),
        fc=nn.Linear(144, num_classes),
    ))


def fmnist_cnn(num_classes: int = 10, in_channels: int = 1, activation: str = "relu") -> nn.Sequential:
    """Fashion-MNIST CNN of paper 004 Table 7a (expects 28x28 inputs)."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(in_channels, 16, kernel_size=8, stride=2, padding=3),
        act1=_act(activation),
        pool1=nn.MaxPool2d(2, stride=1),
        conv2=nn.Conv2d(16, 32, kernel_size=4, stride=2),
        act2=_act(activation),
        pool2=nn.MaxPool2d(2, stride=1),
        flatten=nn.Flatten(),
        fc1=nn.Linear(32 * 4 * 4, 32),
        act3=_act(activation),
        fc2=nn.Linear(32, num_classes),
    ))
