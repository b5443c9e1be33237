"""A convolution's input as patches, for the per-sample weight gradient dL_i/dW[o, c, a, b] =
sum_t g_i[o, t] x_i[c, t_a, t_b] (:func:`gsd_cli.gradients.layers.conv2d_patches`, the ghost-clipping engine's
convolution rule), and the test for channels that are copies of one."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def conv2d_input_patches(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The input's patches, n x T x (kh kw C) in channels-last order (one strided read of the padded
    input, 3-4x faster than stacking shifted slices on the CPU; a view of no copy when ``x`` is
    channels-last and unpadded)."""
    n, C = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = layer.kernel_size, layer.stride, layer.dilation, layer.padding
    xl = x.permute(0, 2, 3, 1)  # n H W C: a contiguous view when x is channels-last
    if ph or pw:
        xl = F.pad(xl, (0, 0, pw, pw, ph, ph))
    xl = xl.contiguous()
    H, W = xl.shape[1], xl.shape[2]
    oh, ow = (H - dh * (kh - 1) - 1) // sh + 1, (W - dw * (kw - 1) - 1) // sw + 1
    patches = xl.as_strided((n, oh, ow, kh, kw, C), (H * W * C, sh * W * C, sw * C, dh * W * C, dw * C, 1))
    return patches.reshape(n, oh * ow, kh * kw * C)


def same_channels(x: torch.Tensor) -> bool:
    """Whether every channel of ``x`` (n x C x H x W) equals the first: a grey image repeated to the model's colour
    channels (:func:`gsd_cli.data.transform.to_model_input`). Reading x once: 3 ms for 64 x 3 x 224 x 224."""
    return x.shape[1] > 1 and torch.equal(x[:, 1:], x[:, :1].expand(-1, x.shape[1] - 1, -1, -1))
