"""torchvision's ResNet-50 (random weights; nothing is downloaded) with GroupNorm in place of BatchNorm.

Per-sample gradients need a network in which one example's output does not depend on the others:
BatchNorm in training mode mixes the batch, so every BatchNorm is GroupNorm(32, C) (affine, as in
Wu & He 2018), the usual choice for DP training. 25.5 million parameters at 1000 classes, 23.5
million at 10. Registered at 32x32 inputs (the CIFAR size the DP papers use) so that m=2000 examples
fit a 2-core CPU; the model itself accepts any input size of at least 32.
"""

from __future__ import annotations

import torch.nn as nn


def resnet50_gn(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    from torchvision.models import resnet50

    net = resnet50(weights=None, num_classes=num_classes, norm_layer=lambda c: nn.GroupNorm(32, c))
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return net
