"""Images at native size -> model input: resize, channel count, normalisation."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

#: Inputs are mapped from [0, 1] to [-1, 1]: (x - 0.5) / 0.5 per channel.
MEAN, STD = 0.5, 0.5


def to_model_input(
    images: Sequence[np.ndarray], size: int, channels: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Stack images (H x W or H x W x C in [0, 1]) into a float tensor ``(n, channels, size, size)``.

    Images are resized with antialiased bilinear interpolation (one call per group of equal shape);
    grey images are repeated to 3 channels, colour images become grey by ITU-R 601 luma weights.
    The images travel to ``device`` at their native size and are resized there.
    """
    out = torch.empty(len(images), channels, size, size, device=device)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault(img.shape, []).append(i)
    for shape, idx in groups.items():
        batch = torch.from_numpy(np.stack([images[i] for i in idx]).astype(np.float32, copy=False)).to(device)
        batch = batch.unsqueeze(1) if batch.ndim == 3 else batch.permute(0, 3, 1, 2)
        batch = _channels(batch, channels)
        if batch.shape[-2:] != (size, size):
            batch = F.interpolate(batch, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out[torch.tensor(idx, device=out.device)] = batch
    return (out - MEAN) / STD


def _channels(batch: torch.Tensor, channels: int) -> torch.Tensor:
    c = batch.shape[1]
    if c == channels:
        return batch
    if c == 1:
        return batch.expand(-1, channels, -1, -1)
    if channels == 1 and c == 3:
        w = torch.tensor([0.299, 0.587, 0.114], device=batch.device).view(1, 3, 1, 1)
        return (batch * w).sum(1, keepdim=True)
    raise ValueError(f"cannot map {c} channels to {channels}")
