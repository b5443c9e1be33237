"""Per-layer rules of ghost clipping (:mod:`gsd_cli.train.clipsum`): when a layer's ghost norm is
cheaper than its per-example gradients (fastDP's rule), and a convolution's ghost norm by its patches or
by the Gram of its input pixels. A layer's per-example gradients (Conv2d, Linear, frozen BatchNorm) come
from the one rule per layer kind of :mod:`gsd_cli.gradients.layers` (its ``PER_SAMPLE_RULES``), which
the ``layers`` engine uses too (issue 51)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...gradients.layers import conv2d_input_patches


def ghost_cheaper(T: int, D: int, C: int) -> bool:
    """fastDP's layer-wise rule: ghost norm when 2 T^2 < D C (the T x T Grams per example against the
    D x C per-example gradient)."""
    return 2 * T * T < D * C


#: the input's patches, n x T x (kh kw C) in channels-last order (the layers engine's own reader). A
#: ghost norm <A_i A_i^T, B_i B_i^T> does not depend on the order of A's columns; a group's columns are
#: picked by :func:`_group_columns`
_patches = conv2d_input_patches


def _conv_ghost_by_pixels(layer: nn.Conv2d, x: torch.Tensor, B: torch.Tensor, oh: int, ow: int) -> torch.Tensor:
    """||g_i||^2 of a one-group Conv2d's weight from the Gram of the padded input's pixels instead of its
    patches: (A_i A_i^T)[t, t'] = sum over kernel offsets o of P_i[s t + o, s t' + o] with
    P_i = X_i^T X_i (pixels x pixels, the channels summed), so ||g_i||^2 = sum_o <P_i[o-shifted], B_i B_i^T>.
    It costs (H_p W_p)^2 C per example against T^2 k_h k_w C for the patches: about k_h k_w / s^4 times
    less for a stride-s convolution (9x for 3x3, stride 1), the case of ResNets' deeper stages."""
    n = x.shape[0]
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = layer.kernel_size, layer.stride, layer.dilation, layer.padding
    xp = F.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    Hp, Wp = xp.shape[2], xp.shape[3]
    X = _positions(xp)  # n x pixels x C
    P = torch.bmm(X, X.transpose(1, 2)).view(n, Hp, Wp, Hp, Wp)
    Gb = torch.bmm(B, B.transpose(1, 2)).view(n, oh, ow, oh, ow)
    sq = torch.zeros(n, dtype=B.dtype, device=B.device)
    for a in range(kh):
        for b in range(kw):
            r, c = a * dh, b * dw
            Ps = P[:, r:r + sh * (oh - 1) + 1:sh, c:c + sw * (ow - 1) + 1:sw, r:r + sh * (oh - 1) + 1:sh, c:c + sw * (ow - 1) + 1:sw]
            sq += (Ps * Gb).sum((1, 2, 3, 4))
    return sq


def _positions(t: torch.Tensor) -> torch.Tensor:
    """A 4-d map n x C x H x W as n x (H W) x C: a view of a channels-last tensor (its memory order) and
    of a channels-first one (a transposed view), never a copy."""
    n, C = t.shape[:2]
    if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
        return t.permute(0, 2, 3, 1).reshape(n, -1, C)
    return t.reshape(n, C, -1).transpose(1, 2)


def _pixels_cheaper(layer: nn.Conv2d, x: torch.Tensor, T: int) -> bool:
    (kh, kw), (ph, pw) = layer.kernel_size, layer.padding
    pixels = (x.shape[2] + 2 * ph) * (x.shape[3] + 2 * pw)
    return layer.groups == 1 and pixels * pixels < T * T * kh * kw


def _group_columns(A: torch.Tensor, C: int, groups: int, gi: int) -> torch.Tensor:
    """Group ``gi``'s columns of channels-last patches (n x T x kk C, C input channels in all)."""
    if groups == 1:
        return A
    n, T = A.shape[:2]
    cg = C // groups
    return A.view(n, T, -1, C)[..., gi * cg:(gi + 1) * cg].reshape(n, T, -1)


def synthetic(x: torch.Tensor, y: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` public stand-ins shaped like the chunk ``(x, y)``: seeded Gaussian inputs (0/1 for an
    integer input), label 0. Only the shapes of ``x`` and ``y`` are read, never their values."""
    gen = torch.Generator().manual_seed(0x37C11)
    shape = (n, *x.shape[1:])
    if x.dtype.is_floating_point:
        xs = torch.randn(shape, generator=gen).to(x.device, x.dtype)
    else:
        xs = torch.randint(0, 2, shape, generator=gen).to(x.device, x.dtype)
    return xs, torch.zeros((n, *y.shape[1:]), dtype=y.dtype, device=y.device)
