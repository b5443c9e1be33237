"""The private train and test parts a trainer uses.

``NAME`` trains on ``NAME:train`` and evaluates on ``NAME:test`` (the dataset's official split where
it has one; a fixed stratified 80/20 partition otherwise, see :mod:`gsd_cli.data`). A name that already
names a split (``chestxray:train``) needs the test part named explicitly (``--private-test``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..data import ImageSource, resolve
from ..errors import DatasetError


class SubsetSource(ImageSource):
    """The examples ``indices`` of ``source``, as a source of its own."""

    def __init__(self, source: ImageSource, indices: Sequence[int], name: str):
        self.source = source
        self.indices = np.asarray(indices, dtype=np.int64)
        self.name = name
        self.num_classes = source.num_classes
        self.multilabel = source.multilabel
        self.description = f"{len(self.indices)} examples of {source.name}"

    def __len__(self) -> int:
        return len(self.indices)

    def labels(self, indices):
        return self.source.labels(self.indices[np.asarray(indices, dtype=np.int64)])

    def images(self, indices):
        return self.source.images(self.indices[np.asarray(indices, dtype=np.int64)])


def holdout(source: ImageSource, test_fraction: float = 0.2) -> tuple[ImageSource, ImageSource]:
    """A fixed stratified split (seeded by the dataset's name only, so every run and every tool sees
    the same parts): ``(train, test)``."""
    import zlib

    n = len(source)
    rng = np.random.default_rng([zlib.crc32(source.name.encode()), 20])
    y = source.labels(np.arange(n))
    keys = y.argmax(1) if source.multilabel and y.ndim == 2 else y
    test = []
    for c in np.unique(keys):
        idx = np.flatnonzero(keys == c)
        rng.shuffle(idx)
        test.extend(idx[: int(round(len(idx) * test_fraction))].tolist())
    test_set = set(test)
    train = [i for i in range(n) if i not in test_set]
    return SubsetSource(source, train, f"{source.name}:train"), SubsetSource(source, sorted(test), f"{source.name}:test")


def private_parts(name: str | ImageSource, test: str | ImageSource | None = None) -> tuple[ImageSource, ImageSource]:
    """``(train, test)`` sources for the private dataset ``name`` (see the module docstring)."""
    if test is not None:
        return resolve(name), resolve(test)
    if isinstance(name, ImageSource):
        return holdout(name)
    try:
        return resolve(f"{name}:train"), resolve(f"{name}:test")
    except DatasetError:
        pass
    src = resolve(name)
    return holdout(src)
