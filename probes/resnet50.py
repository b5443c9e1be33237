"""torchvision's ResNet-50 (random weights; nothing is downloaded) with GroupNorm in place of BatchNorm.

Per-sample gradients need a network in which one example's output does not depend on the others:
BatchNorm in training mode mixes the batch, so every BatchNorm is GroupNorm(32, C) (affine, as in
Wu & He 2018), the usual choice for DP training. 25.5 million parameters at 1000 classes, 23.5
million at 10. Registered at 32x32 inputs (the CIFAR size the DP papers use) so that m=2000 examples
fit a 2-core CPU; the model itself accepts any input size of at least 32.
"""

from __future__ import annotations

import types

import torch
import torch.nn as nn


def _bottleneck_forward(self, x: torch.Tensor) -> torch.Tensor:
    """torchvision's Bottleneck.forward without its in-place ``out += identity`` and ReLU(inplace=True):
    Opacus' module backward hooks (the per-sample engine ``hooks`` and the authors' pipeline) refuse
    in-place changes of a hooked layer's output. Same function."""
    out = self.relu(self.bn1(self.conv1(x)))
    out = self.relu(self.bn2(self.conv2(out)))
    out = self.bn3(self.conv3(out))
    identity = x if self.downsample is None else self.downsample(x)
    return self.relu(out + identity)


def resnet50_gn(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    from torchvision.models import resnet50

    net = resnet50(weights=None, num_classes=num_classes, norm_layer=lambda c: nn.GroupNorm(32, c))
    from torchvision.models.resnet import Bottleneck

    for mod in net.modules():
        if isinstance(mod, nn.ReLU):
            mod.inplace = False
        if isinstance(mod, Bottleneck):
            mod.forward = types.MethodType(_bottleneck_forward, mod)
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net
