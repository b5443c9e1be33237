"""Conv2d (zero padding, numeric padding): A_i = the unfolded input (T output positions x C_in k_h k_w,
per group), B_i = the output gradient (T x C_out); <g_i, g_j> = <A_i A_j^T, B_i B_j^T> (:mod:`.pairs`)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...gradients.layers import conv2d_plain as _plain  # the Conv2d layers every engine's rule takes
from ..factors import Factors
from ..registry import Call, register_rule
from .pairs import ghost_pairs


def _ab(m: nn.Module, x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    c = x.shape[0]
    return unfold(x, m.kernel_size, m.dilation, m.padding, m.stride), g.reshape(c, g.shape[1], -1).transpose(1, 2)


@register_rule(nn.Conv2d, name="conv2d", applies=_plain)
def conv2d(unit, calls: list[Call]) -> Factors:
    return ghost_pairs(unit, calls, _ab)


def unfold(x: torch.Tensor, kernel, dilation, padding, stride) -> torch.Tensor:
    """``F.unfold(...).transpose(1, 2)`` (c x T x C k_h k_w, the same column order) by k_h k_w strided
    slices: several times faster than im2col on CPU, and a plain reshape for 1x1 kernels. Not the
    per-sample engines' channels-last patches (:func:`gsd_cli.gradients.layers.conv2d_input_patches`, :mod:`gsd_cli.gradients.patches`):
    :mod:`.pairs` slices a group's columns as a contiguous block and materialises B_i^T A_i in the
    weight's own (C_in, k_h, k_w) order, which needs channels-first columns."""
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel, dilation, padding, stride
    n, C, H, W = x.shape
    if ph or pw:
        x = F.pad(x, (pw, pw, ph, ph))
    oh = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = [x[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw] for i in range(kh) for j in range(kw)]
    A = cols[0].unsqueeze(2) if len(cols) == 1 else torch.stack(cols, 2)  # n x C x kk x oh x ow
    return A.reshape(n, C * kh * kw, oh * ow).transpose(1, 2)
