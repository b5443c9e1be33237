"""Images at native size -> model input: resize, channel count, normalisation.

Each image is resized once, on as few channels as it has: a grey image is resized (and normalised) on
its one channel and only then repeated to the model's three. Bilinear interpolation treats channels
independently, so this is the tensor the other order (repeat, then resize) gives, bit for bit
(``tests/test_input_pipeline.py``), at a third of the work. A colour image for a one-channel model
becomes grey before it is resized, for the same reason.

:data:`TRANSFORM` describes what this module computes; the cache of public subspaces keys on it, so
a change to the output here must change it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ModelError

#: Inputs are mapped from [0, 1] to [-1, 1]: (x - 0.5) / 0.5 per channel.
MEAN, STD = 0.5, 0.5
#: What :func:`to_model_input` computes (part of the public-subspace cache key): bump ``version``
#: whenever its output changes for some input.
TRANSFORM = {"resize": "bilinear", "antialias": True, "align_corners": False, "mean": MEAN, "std": STD,
             "grey": "itu-r-601 luma (0.299, 0.587, 0.114)", "version": 1}
_LUMA = (0.299, 0.587, 0.114)


def to_model_input(
    images: Sequence[np.ndarray], size: int, channels: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Stack images (H x W or H x W x C in [0, 1]) into a float tensor ``(n, channels, size, size)``.

    Images are resized with antialiased bilinear interpolation (one call per group of equal shape);
    grey images are repeated to 3 channels after resizing, colour images become grey by ITU-R 601 luma
    weights before. The images travel to ``device`` at their native size and are resized there.
    """
    out = torch.empty(len(images), channels, size, size, device=device)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, img in enumerate(images):
        groups.setdefault(img.shape, []).append(i)
    for idx in groups.values():
        # one image (the input pipeline's threads resize one at a time): a view of it, not a copy
        arr = images[idx[0]][None] if len(idx) == 1 else np.stack([images[i] for i in idx])
        arr = arr.astype(np.float32, copy=not arr.flags.writeable)
        batch = torch.from_numpy(arr).to(device)
        view = len(idx) == 1 and batch.device.type == "cpu"  # then batch shares the caller's image
        batch = batch.unsqueeze(1) if batch.ndim == 3 else batch.permute(0, 3, 1, 2)
        _check_channels(batch.shape[1], channels)
        if batch.shape[1] > channels:  # colour -> grey first: resize one channel, not three
            batch, view = _channels(batch, channels), False
        if batch.shape[-2:] != (size, size):
            batch = F.interpolate(batch, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        elif view:
            batch = batch.clone()  # normalised in place below: never the caller's image
        batch = _channels(batch.sub_(MEAN).div_(STD), channels)  # in place (batch is ours); grey -> colour last
        if len(idx) == len(images):  # one shape (the usual case): no index_put
            out.copy_(batch)
        else:
            out[torch.tensor(idx, device=out.device)] = batch
    return out


class ChannelError(ModelError, ValueError):
    """The images' channels cannot be mapped to the model's: a user error (exit 2), still a ValueError."""


def _channel_error(c: int, channels: int) -> Exception:
    return ChannelError(f"cannot map {c} channels to {channels}: the images have {c} channels but the model takes "
                        f"{channels}; grey images fit any channel count, colour images 3 (or 1, converted to grey): "
                        "give the model 1 or 3 channels (e.g. @SIZEx3 after its name)")


def _check_channels(c: int, channels: int) -> None:
    if not (c == channels or c == 1 or (channels == 1 and c == 3)):
        raise _channel_error(c, channels)


def _channels(batch: torch.Tensor, channels: int) -> torch.Tensor:
    """``batch`` with ``channels`` channels: grey repeated (a view), colour to grey by luma weights."""
    c = batch.shape[1]
    if c == channels:
        return batch
    if c == 1:
        return batch.expand(-1, channels, -1, -1)
    if channels == 1 and c == 3:
        w = torch.tensor(_LUMA, device=batch.device).view(1, 3, 1, 1)
        return (batch * w).sum(1, keepdim=True)
    raise _channel_error(c, channels)
