"""ResNet20 for 32x32 inputs with GroupNorm in place of BatchNorm, as GEP (paper 000, Section 5) uses.

Follows the GEP code (../shared/papers/notes-gep-rgp.md): three stages of three basic blocks with
16/32/64 channels (He et al. 2016, CIFAR variant), convolutions without bias, GroupNorm with 4 groups
and ``affine=False`` (BatchNorm would mix examples and break per-example sensitivity), option-A
shortcuts (stride by average pooling, zero-padded channels, then GroupNorm), a Linear head with bias.
About 268k parameters for 10 classes.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def _gn(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(4, channels, affine=False)


class _Shortcut(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.pad = planes - in_planes
        self.pool = nn.AvgPool2d(1, stride) if stride != 1 else nn.Identity()
        self.norm = _gn(in_planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.pool(x))
        if self.pad:
            x = F.pad(x, (0, 0, 0, 0, 0, self.pad))
        return x


class BasicBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.gn1 = _gn(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.gn2 = _gn(planes)
        self.shortcut = (
            _Shortcut(in_planes, planes, stride) if stride != 1 or in_planes != planes else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.gn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 3, blocks: int = 3):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 16, 3, stride=1, padding=1, bias=False)
        self.gn1 = _gn(16)
        layers, in_planes = [], 16
        for planes, stride in ((16, 1), (32, 2), (64, 2)):
            stage = []
            for b in range(blocks):
                stage.append(BasicBlock(in_planes, planes, stride if b == 0 else 1))
                in_planes = planes
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3 = layers
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.gn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.adaptive_avg_pool2d(out, 1).flatten(1)
        return self.fc(out)


def resnet20(num_classes: int = 10, in_channels: int = 3) -> ResNet20:
    """ResNet20 with GroupNorm (GEP's model for SVHN and CIFAR-10; expects 32x32 inputs)."""
    return ResNet20(num_classes=num_classes, in_channels=in_channels)
