"""Per-layer rules of ghost clipping (:mod:`gsd_cli.train.clipsum`): when a layer's ghost norm is
cheaper than its per-example gradients (fastDP's rule), and the per-example gradients and ghost norms
of the layers that need their own (convolutions by patches or by the Gram of their input pixels,
grouped convolutions, frozen BatchNorm)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F




def ghost_cheaper(T: int, D: int, C: int) -> bool:
    """fastDP's layer-wise rule: ghost norm when 2 T^2 < D C (the T x T Grams per example against the
    D x C per-example gradient)."""
    return 2 * T * T < D * C


def _conv_plain(m: nn.Module) -> bool:
    return type(m).forward is nn.Conv2d.forward and m.padding_mode == "zeros" and not isinstance(m.padding, str)


#: a one-group Conv2d with fewer input channels than 16 gets its per-example gradients from its patches
#: when one example's patch matrix has at most this many entries, else from the grouped weight-gradient
#: kernel (2-core CPU: FMNIST CNN's conv1, 12.5k entries, patches 3.7 ms against 4.1 ms per 250
#: examples; ResNet-18's conv1 at 224, 1.8M entries, patches 110 ms against 49 ms per 16)
PATCHES_MAX = 1 << 16


def _conv_per_sample(layer: nn.Conv2d, x: torch.Tensor, g: torch.Tensor) -> dict:
    """Per-example Conv2d gradients (any groups): by patches (small inputs with few channels) or torch's
    weight-gradient kernel with n * groups groups."""
    from ..gradients.layers import conv2d_patches

    kk = layer.kernel_size[0] * layer.kernel_size[1]
    if layer.groups == 1 and x.shape[1] < 16 and g.shape[2] * g.shape[3] * kk * x.shape[1] <= PATCHES_MAX:
        return conv2d_patches(layer, x, g)
    n, Cin, H, W = x.shape
    O, oh, ow = g.shape[1:]
    out = {}
    if layer.weight.requires_grad:
        from ..gradients.layers import weight_of_shape

        w = layer.weight.detach()
        _, gw, _ = torch.ops.aten.convolution_backward(
            g.reshape(1, n * O, oh, ow), x.reshape(1, n * Cin, H, W).to(g.dtype), weight_of_shape((n * w.shape[0], *w.shape[1:]), g.dtype, g.device),
            None, layer.stride, layer.padding, layer.dilation, False, [0, 0], n * layer.groups, [False, True, False])
        out[layer.weight] = gw.view(n, *w.shape)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = g.sum((2, 3))
    return out


def _patches(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """The input's patches, n x T x (kh kw C) in channels-last order (one strided read, 3-4x faster than
    stacking shifted slices on the CPU). A ghost norm <A_i A_i^T, B_i B_i^T> does not depend on the
    order of A's columns; a group's columns are picked by :func:`_group_columns`."""
    n, C = x.shape[:2]
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = layer.kernel_size, layer.stride, layer.dilation, layer.padding
    xl = x.permute(0, 2, 3, 1)  # n H W C: a view when x is channels-last
    if ph or pw:
        xl = F.pad(xl, (0, 0, pw, pw, ph, ph))
    xl = xl.contiguous()
    H, W = xl.shape[1], xl.shape[2]
    oh, ow = (H - dh * (kh - 1) - 1) // sh + 1, (W - dw * (kw - 1) - 1) // sw + 1
    p = xl.as_strided((n, oh, ow, kh, kw, C), (H * W * C, sh * W * C, sw * C, dh * W * C, dw * C, 1))
    return p.reshape(n, oh * ow, kh * kw * C)


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


def _batchnorm_per_sample(layer: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict:
    """A frozen BatchNorm's per-example gradients (y = x_hat w + b, x_hat = (x - running_mean) /
    sqrt(running_var + eps)): dL_i/dw = rsqrt(var + eps) * sum_t g_i[t] (x_i[t] - mean), the scale per
    channel applied after the sum (three passes over the activations instead of five:
    :func:`gsd_cli.gradients.layers.batchnorm_per_sample` forms x_hat and g x_hat), in the tensors' own
    memory format (no copy of a channels-last map)."""
    out = {}
    shape = (1, -1) + (1,) * (x.dim() - 2)
    dims = tuple(range(2, x.dim()))
    if layer.weight is not None and layer.weight.requires_grad:
        gx = g * (x.to(g.dtype) - layer.running_mean.view(shape))
        out[layer.weight] = (gx.sum(dims) if dims else gx) * torch.rsqrt(layer.running_var + layer.eps)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = g.sum(dims) if dims else g
    return out


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
