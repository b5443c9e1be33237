"""Splits: ``NAME:train`` / ``NAME:test`` (and ``:val`` where a dataset publishes one).

Datasets with official splits (torchvision's, ChestX-ray14's lists, the Kaggle folders) use them.
For the others (the embedded sets, ``folder:``, ``csv:``, ``npz:``, ``hf:`` without splits, and
HAM10000 by lesion) an example is in ``:test`` if and only if a hash of *its own identity* falls below
:data:`TEST_FRACTION` (:func:`in_test`): the identity is its file's path relative to the dataset's
folder for file-backed sets, else a hash of its image content (:meth:`ImageSource.example_keys`).

Why: a split that depends on the other examples (a seeded, label-stratified permutation, say) moves
examples between train and test whenever one example is added or removed, so the private training
set of two neighbouring datasets differs in many examples and no differential-privacy guarantee
about one example holds. Decided per example, adding or removing one example moves no other; and
with no salt from the dataset's name, a set splits the same whether named on the command line or in
a catalogue. The test part is about, not exactly, 20% (and not stratified by class).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from ..errors import DatasetError
from .base import ImageSource

#: Split names understood after ``NAME:``.
SPLITS = ("train", "val", "test")
TEST_FRACTION = 0.2
#: Prefix of every hashed identity; a new rule would take a new version, never reuse this one.
SALT = b"gsd-split-v1\0"


def split_value(key: str) -> float:
    """The example's position in [0, 1): the first 8 bytes of sha256(SALT + key) as uint64 / 2**64."""
    digest = hashlib.sha256(SALT + key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def in_test(key: str, test_fraction: float = TEST_FRACTION) -> bool:
    """Whether the example (or group: a HAM10000 lesion) with identity ``key`` is in the test part."""
    return split_value(key) < test_fraction


def split_mask(keys: Sequence[str], test_fraction: float = TEST_FRACTION) -> np.ndarray:
    """Boolean mask of the test part: :func:`in_test` of every key."""
    return np.fromiter((in_test(k, test_fraction) for k in keys), dtype=bool, count=len(keys))


class SubsetSource(ImageSource):
    """The examples ``indices`` of ``parent``, under their own name (e.g. ``mnist-a:train``)."""

    def __init__(self, parent: ImageSource, indices: Sequence[int], name: str, description: str = ""):
        self.parent = parent
        self.indices = np.asarray(indices, dtype=np.int64)
        self.name = name
        self.num_classes = parent.num_classes
        self.multilabel = parent.multilabel
        self.classes_declared = parent.classes_declared
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

    def example_keys(self, indices: Sequence[int] | None = None) -> list[str]:
        idx = self.indices if indices is None else self.indices[np.asarray(indices, dtype=np.int64)]
        return self.parent.example_keys(idx)

    def example_file(self, index: int) -> str | None:
        return self.parent.example_file(int(self.indices[int(index)]))

    def describe(self) -> dict:
        d = {**self.parent.describe(), **super().describe()}
        d["split_of"] = self.parent.name
        return d


def fixed_split(source: ImageSource, split: str, name: str | None = None) -> ImageSource:
    """``split`` ('train' or 'test') of ``source`` by the per-example hash rule (module docstring)."""
    if split not in ("train", "test"):
        raise DatasetError(
            f"{source.name} has no official splits; use {source.name}:train or {source.name}:test "
            f"(each example in test iff a hash of its identity is below {TEST_FRACTION}), not :{split}"
        )
    name = name or f"{source.name}:{split}"
    test = _test_mask_of(source)
    keep = np.flatnonzero(test if split == "test" else ~test)
    if not len(keep):
        raise DatasetError(
            f"{name}: empty (each of {source.name}'s {len(source)} examples falls in the test part with "
            f"probability {TEST_FRACTION}, and here {'none' if split == 'test' else 'all'} did); "
            f"name the train and test sets explicitly"
        )
    return SubsetSource(
        source, keep, name,
        description=f"{source.description} [{split}: per-example hash split, ~{int(TEST_FRACTION * 100)}% test]",
    )


def _test_mask_of(source: ImageSource) -> np.ndarray:
    """:func:`split_mask` of all of ``source``'s example keys, kept on the source (train and test both need it)."""
    mask = source.__dict__.get("_split_test_mask")
    if mask is None or len(mask) != len(source):
        mask = split_mask(source.example_keys())
        source._split_test_mask = mask
    return mask
