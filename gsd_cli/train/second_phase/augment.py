"""Augmentation of stage 1's public training batches (``--public-augment``): standard image augmentations,
each example transformed with its own random draw.

=============  ================================================================================================
``none``       the images as they are
``crop``       random crop with padding: a shift of up to ``pad`` pixels each way (``pad`` = input size / 8, at
               least 1; torchvision's ``RandomCrop(size, padding=pad)``), the border filled black
``crop-flip``  ``crop`` and a horizontal flip with probability 1/2 (natural photos; not digits or text)
``affine``     ``crop`` and a small affine map: rotation by up to 10 degrees, scale in [0.9, 1.1] (torchvision's
               ``RandomAffine(10, scale=(0.9, 1.1))``), bilinear
``auto``       ``affine`` for images of at least :data:`MIN_SIZE` pixels, else ``none``: whether a horizontal flip
               keeps a set's meaning (a photo) or not (a digit, a letter) cannot be told from the images, so the
               default never flips
=============  ================================================================================================

The maps are torchvision's (``torchvision.transforms.v2.functional.affine`` gives the same images for the
same draw: ``tests/test_stage1_fit.py``), applied to a whole batch at once by ``affine_grid`` and
``grid_sample``: torchvision's v2 transforms draw *one* set of parameters per call, so a batch would be
shifted as one, and a loop over the examples cost 72 ms per batch of 64 MNIST images on the 2-core CPU
(``RandomAffine``; a step of fmnist-cnn on that batch is about 25 ms) against about 3 ms here. The draws come
from the generator passed in (stage 1 seeds it from ``--seed``). Stage 1 augments its training batches
only, never the validation examples.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

AUGMENTS = ("auto", "none", "crop", "crop-flip", "affine")
#: ``auto`` augments images of at least this many pixels a side
MIN_SIZE = 16
#: the fill of the border: black, in the model input's [-1, 1] range (gsd_cli.data.transform)
FILL = -1.0
MAX_DEGREES, SCALE = 10.0, (0.9, 1.1)


def resolve_augment(name: str, input_size: int) -> str:
    """The augmentation ``name`` means for inputs of ``input_size`` pixels a side (``auto``: module docstring)."""
    if name not in AUGMENTS:
        from ...errors import GSDError

        raise GSDError(f"unknown --public-augment {name!r}; use one of {', '.join(AUGMENTS)}")
    if name == "auto":
        return "affine" if input_size >= MIN_SIZE else "none"
    return name


def pad_of(size: int) -> int:
    """The crop's padding: ``size`` / 8 (4 at 32 pixels, the CIFAR convention), at least 1."""
    return max(1, round(size / 8))


def draw_params(n: int, size: int, kind: str, generator: torch.Generator) -> dict:
    """Each example's shift (pixels), flip, rotation (degrees) and scale for ``kind`` (CPU tensors of length ``n``)."""
    pad = pad_of(size)
    shift = torch.randint(-pad, pad + 1, (n, 2), generator=generator)
    flip = (torch.rand(n, generator=generator) < 0.5) if kind == "crop-flip" else torch.zeros(n, dtype=torch.bool)
    affine = kind == "affine"
    angle = (torch.rand(n, generator=generator) * 2 - 1) * MAX_DEGREES if affine else torch.zeros(n)
    scale = SCALE[0] + (SCALE[1] - SCALE[0]) * torch.rand(n, generator=generator) if affine else torch.ones(n)
    return {"shift": shift, "flip": flip, "angle": angle, "scale": scale}


def apply_params(x: torch.Tensor, p: dict, bilinear: bool) -> torch.Tensor:
    """``x`` (n, c, h, w) with each example's map of ``p`` (:func:`draw_params`): flipped, then rotated and scaled
    about the centre and shifted (torchvision's ``affine(angle, translate=shift, scale)`` convention), black outside."""
    n, _, h, w = x.shape
    a = torch.deg2rad(p["angle"].to(torch.float64))
    s = p["scale"].to(torch.float64)
    cos, sin = torch.cos(a) / s, torch.sin(a) / s  # the inverse map: output coordinates -> input coordinates
    flip = torch.where(p["flip"], -1.0, 1.0).to(torch.float64)
    tx, ty = p["shift"][:, 0].to(torch.float64) * 2 / w, p["shift"][:, 1].to(torch.float64) * 2 / h
    # normalised coordinates (aspect-corrected for non-square inputs): in = F R^-1 (out - t)
    r = h / w
    m00, m01 = cos, sin * r
    m10, m11 = -sin / r, cos
    theta = torch.stack([torch.stack([flip * m00, flip * m01, -flip * (m00 * tx + m01 * ty)], 1),
                         torch.stack([m10, m11, -(m10 * tx + m11 * ty)], 1)], 1)
    grid = F.affine_grid(theta.to(x.device, x.dtype), list(x.shape), align_corners=False)
    out = F.grid_sample(x - FILL, grid, mode="bilinear" if bilinear else "nearest", padding_mode="zeros", align_corners=False)
    return out + FILL


def augment(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """A training batch ``x`` (n, c, h, w, model input) augmented by ``kind`` (a resolved name: not ``auto``)."""
    if kind == "none" or len(x) == 0:
        return x
    p = draw_params(len(x), x.shape[-1], kind, generator)
    return apply_params(x, p, bilinear=kind == "affine")

