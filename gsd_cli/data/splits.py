"""Splits: ``NAME:train`` / ``NAME:test`` (and ``:val`` where a dataset publishes one).

Datasets with official splits (torchvision's, ChestX-ray14's lists, the Kaggle folders) use them.
For the others (the embedded sets, ``folder:``, ``csv:``, ``npz:``, ``hf:`` without splits, HAM10000)
``:train`` and ``:test`` are a fixed, stratified 80/20 partition seeded only by the dataset's name, so
that public and private examples can come from disjoint parts and every run gets the same parts.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from ..errors import DatasetError
from .base import ImageSource

#: Split names understood after ``NAME:``.
SPLITS = ("train", "val", "test")
TEST_FRACTION = 0.2


def _strata(labels: np.ndarray) -> np.ndarray:
    """One stratum per class; multi-label rows by their first positive label (-1: none)."""
    if labels.ndim == 2:
        pos = labels > 0.5
        return np.where(pos.any(axis=1), pos.argmax(axis=1), -1)
    return labels.astype(np.int64)


def partition(labels: np.ndarray, name: str, test_fraction: float = TEST_FRACTION) -> np.ndarray:
    """Boolean mask of the test part: in every class, ``round(test_fraction * n_class)`` examples
    chosen by a generator seeded with the CRC-32 of ``name`` only."""
    strata = _strata(np.asarray(labels))
    rng = np.random.default_rng([zlib.crc32(name.encode()), 80_20])
    test = np.zeros(len(strata), dtype=bool)
    for c in np.unique(strata):
        idx = rng.permutation(np.flatnonzero(strata == c))
        test[idx[: int(round(test_fraction * len(idx)))]] = True
    return test


class SubsetSource(ImageSource):
    """The examples ``indices`` of ``parent``, under their own name (e.g. ``mnist-a:train``)."""

    def __init__(self, parent: ImageSource, indices: Sequence[int], name: str, description: str = ""):
        self.parent = parent
        self.indices = np.asarray(indices, dtype=np.int64)
        self.name = name
        self.num_classes = parent.num_classes
        self.multilabel = parent.multilabel
        self.description = description or parent.description
        for attr in ("classes", "layout", "root"):
            if hasattr(parent, attr):
                setattr(self, attr, getattr(parent, attr))

    def __len__(self) -> int:
        return len(self.indices)

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        return self.parent.labels(self.indices[np.asarray(indices, dtype=np.int64)])

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        return self.parent.images(self.indices[np.asarray(indices, dtype=np.int64)])

    def describe(self) -> dict:
        d = {**self.parent.describe(), **super().describe()}
        d["split_of"] = self.parent.name
        return d


def fixed_split(source: ImageSource, split: str, name: str | None = None) -> ImageSource:
    """``split`` ('train' or 'test') of ``source`` by :func:`partition` (seeded by ``source.name``)."""
    if split not in ("train", "test"):
        raise DatasetError(
            f"{source.name} has no official splits; use {source.name}:train or {source.name}:test "
            f"(a fixed stratified {100 - int(TEST_FRACTION * 100)}/{int(TEST_FRACTION * 100)} partition), not :{split}"
        )
    test = partition(source.labels(np.arange(len(source))), source.name)
    keep = np.flatnonzero(test if split == "test" else ~test)
    return SubsetSource(
        source, keep, name or f"{source.name}:{split}",
        description=f"{source.description} [{split}: fixed stratified 80/20 partition seeded by the name]",
    )
