"""The in-run noise references of ``gsd train --auto-select``'s ranking: public sources of noise images.

A reference is ranked like a candidate (:mod:`gsd_cli.ranking.reference` says whether a candidate is
closer than them); its name starts with :data:`REFERENCE`, which no dataset name can (a colon and no
source kind), so every layer can tell a reference row from a candidate's.
"""

from __future__ import annotations

import numpy as np

from .base import ImageSource

#: the in-run references' names start so
REFERENCE = "reference:noise"
#: the coarsest grid the noise references are drawn at (pixels a side) before resizing to the model's input
SMALLEST_GRID = 7
#: the finest grid: noise on a finer grid is white at any scale a private image is likely to have
LARGEST_GRID = 64


def is_reference(name: str) -> bool:
    return str(name).startswith(REFERENCE)


def reference_kind(name: str) -> str:
    """The kind of noise a reference is (its name without the draw's ``#n`` tag): draws of one kind are
    exchangeable, and their gap measures what one public draw of noise can win over another."""
    return str(name).split("#", 1)[0]


def reference_sources(input_size: int | None, channels: int | None, examples: int, num_classes: int, seed: int,
                      draws: int = 1, shapes=()) -> list:
    """The in-run references: for each grid G in {S, S/4, S/8} between :data:`SMALLEST_GRID` and
    :data:`LARGEST_GRID` pixels (S itself where none is; S the ranking model's input size, 28 where the
    model does not say), ``examples`` images of i.i.d. Gaussian noise N(0.5, 0.25^2) clipped to [0, 1] on a
    G x G grid, grey and (for a colour model) in colour, random labels, from the public ``seed`` (``draws``
    independent sets of each, seeds ``seed``, ``seed + 1``, ...); the ranking resizes them to the model's
    input as it resizes every image. The bar is the closest reference: a candidate must be closer than
    noise like it. Which noise is closest depends on the model's input and the private set's resolution:
    at the probe's 224 against 28 x 28 digits noise drawn on a 28 grid is closest (grids of 28, 56, 112, 224:
    0.708, 0.779, 0.826, 0.833, m = 500), at the FMNIST CNN's 28 the 28 grid beats the 7 grid; noise finer
    than 64 pixels is white at any scale a private set is likely to have, and was never the closest.
    ``shapes``: (height, width, channels) of further noise sets (``gsd train --auto-select --select-epsilon``
    passes its candidates' own shapes: a private selection has one draw and no paired test, and noise of a
    shape between the grids, 28 x 28 noise resized to ResNet20's 32, was chosen over noise on 32 and 8 grids).
    """
    size, chans = int(input_size or 28), int(channels or 1)
    grids = sorted({g for g in (size, size // 4, size // 8) if SMALLEST_GRID <= g <= LARGEST_GRID} or {size}, reverse=True)
    kinds = [(g, g, c) for g in grids for c in sorted({1, chans})]
    for h, w, c in shapes:  # noise of each given shape too (a candidate's own: public), where not there already
        if (int(h), int(w), int(c)) not in kinds:
            kinds.append((int(h), int(w), int(c)))
    return [NoiseSource(h, c, examples, max(2, int(num_classes)), seed + i, tag=f"#{i + 1}" if i else "", width=w)
            for i in range(max(1, int(draws))) for h, w, c in kinds]


class NoiseSource(ImageSource):
    """An in-run reference (:func:`reference_sources`): Gaussian noise N(0.5, 0.25^2) clipped to [0, 1] on a
    ``grid`` x ``grid`` grid, each example drawn from (seed, grid, index) alone, so any subset reads the same
    images in O(batch) memory; random labels."""

    multilabel = False
    classes_declared = True

    def __init__(self, grid: int, channels: int, examples: int, num_classes: int, seed: int, tag: str = "",
                 width: int | None = None):
        self.grid, self.channels, self.n = int(grid), int(channels), int(examples)
        self.width = self.grid if width is None else int(width)
        self.num_classes, self.seed = int(num_classes), int(seed)
        side = f"{self.grid}" if self.width == self.grid else f"{self.grid}x{self.width}"
        self.name = f"{REFERENCE}@{side}{'' if self.channels == 1 else '-rgb'}{tag}"
        self.description = (f"gsd's in-run reference: {'grey' if self.channels == 1 else 'colour'} Gaussian noise on a "
                            f"{self.grid}x{self.width} grid")

    def __len__(self) -> int:
        return self.n

    def generator(self) -> dict:
        """What each image and label is drawn from (:meth:`images`, :meth:`labels`; with numpy's version): the
        data part of its public-subspace cache key (:func:`gsd_cli.data.fingerprint.content_digest`)."""
        return {"kind": "gaussian N(0.5, 0.25^2) clipped to [0, 1], numpy default_rng([seed, 0x4EF, grid, index, what(, width)])",
                "seed": self.seed, "grid": self.grid, "width": self.width, "channels": self.channels,
                "num_classes": self.num_classes}

    def _rng(self, i: int, what: int) -> np.random.Generator:
        key = [self.seed, 0x4EF, self.grid, int(i), what] + ([self.width] if self.width != self.grid else [])
        return np.random.default_rng(key)

    def labels(self, indices) -> np.ndarray:
        return np.asarray([int(self._rng(i, 1).integers(0, self.num_classes)) for i in indices], dtype=np.int64)

    def images(self, indices) -> list[np.ndarray]:
        shape = (self.grid, self.width) if self.channels == 1 else (self.grid, self.width, self.channels)
        return [np.clip(self._rng(i, 0).standard_normal(size=shape, dtype=np.float32) * 0.25 + 0.5, 0.0, 1.0) for i in indices]
