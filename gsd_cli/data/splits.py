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

A source with groups (patients: :mod:`.groups`, ``example_groups``) is split by the hash of each
example's *group id* instead: a group's examples are all on one side, and adding or removing a group
(or an example) moves no other example. About 20% of the groups, not of the examples, are in test.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from ..errors import DatasetError
from .base import ImageSource
from .groups import SHOWN, straddling

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
        for attr in ("classes", "layout", "root", "group_label"):
            if hasattr(parent, attr):
                setattr(self, attr, getattr(parent, attr))

    def __len__(self) -> int:
        return len(self.indices)

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        return self.parent.labels(self.indices[np.asarray(indices, dtype=np.int64)])

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        return self.parent.images(self.indices[np.asarray(indices, dtype=np.int64)])

    def images_at(self, indices: Sequence[int], size: int) -> list[np.ndarray]:
        return self.parent.images_at(self.indices[np.asarray(indices, dtype=np.int64)], size)

    def example_keys(self, indices: Sequence[int] | None = None) -> list[str]:
        idx = self.indices if indices is None else self.indices[np.asarray(indices, dtype=np.int64)]
        return self.parent.example_keys(idx)

    def example_file(self, index: int) -> str | None:
        return self.parent.example_file(int(self.indices[int(index)]))

    def example_groups(self, indices: Sequence[int] | None = None) -> list[str] | None:
        idx = self.indices if indices is None else self.indices[np.asarray(indices, dtype=np.int64)]
        return groups_of(self.parent, idx)

    def describe(self) -> dict:
        d = {**self.parent.describe(), **super().describe()}
        d["split_of"] = self.parent.name
        if groups_of(self) is not None:  # this part's groups (the parent's own split column checks stay)
            d.update({k: v for k, v in group_summary(self).items() if not k.startswith("data_split")})
        return d


class EmptyPartError(DatasetError):
    """A part of the per-example split that holds no example: whether it does turns on the examples, so for
    a private set its refusal is a private output (:func:`gsd_cli.train.splits.private_parts`)."""


def fixed_split(source: ImageSource, split: str, name: str | None = None) -> ImageSource:
    """``split`` ('train' or 'test') of ``source`` by the per-example hash rule (module docstring)."""
    if split not in ("train", "test"):
        raise DatasetError(
            f"{source.name} has no official splits; use {source.name}:train or {source.name}:test "
            f"(each example in test iff a hash of its identity is below {TEST_FRACTION}), not :{split}"
        )
    name = name or f"{source.name}:{split}"
    grouped = groups_of(source) is not None
    test = _test_mask_of(source)
    keep = np.flatnonzero(test if split == "test" else ~test)
    if not len(keep):
        raise EmptyPartError(
            f"{name}: empty (each of {source.name}'s {len(source)} examples falls in the test part with "
            f"probability {TEST_FRACTION}, and here {'none' if split == 'test' else 'all'} did); "
            f"name the train and test sets explicitly"
        )
    rule = "per-group hash split, ~{}% of groups in test" if grouped else "per-example hash split, ~{}% test"
    part = SubsetSource(
        source, keep, name, description=f"{source.description} [{split}: {rule.format(int(TEST_FRACTION * 100))}]",
    )
    part.origin_split = split  # which part, for gsd_cli.data.identity.origin
    return part


def groups_of(source: ImageSource, indices: Sequence[int] | None = None) -> list[str] | None:
    """The group ids of ``source``'s examples ``indices`` (None: all), or None for a source without groups."""
    fn = getattr(source, "example_groups", None)
    return None if fn is None else fn(indices)


def _test_mask_of(source: ImageSource) -> np.ndarray:
    """:func:`split_mask` of all of ``source``'s group ids, else of its example keys, kept on the source
    (train and test both need it). Each distinct group is hashed once."""
    mask = source.__dict__.get("_split_test_mask")
    if mask is None or len(mask) != len(source):
        groups = groups_of(source)
        if groups is None:
            mask = split_mask(source.example_keys())
        else:
            test = {g: in_test(g) for g in set(groups)}
            mask = np.fromiter((test[g] for g in groups), dtype=bool, count=len(groups))
        source._split_test_mask = mask
    return mask


def group_summary(source) -> dict:
    """What ``gsd datasets show`` reports about ``source``'s groups ({} when it has none).

    ``groups`` (count) and ``grouped_by``; ``groups_train`` / ``groups_test`` and ``examples_train`` /
    ``examples_test`` of the per-group hash split (:func:`gsd_cli.data.splits.in_test` of the group
    id); ``groups_on_both_sides``: groups with examples in both parts (0 by construction: checked);
    and where the data has its own split column, ``data_split_column`` and
    ``groups_across_data_split`` (how many groups it puts in more than one part, the first few named)."""
    groups = groups_of(source)
    if groups is None:
        return {}
    test_of = {g: in_test(g) for g in set(groups)}
    test = np.fromiter((test_of[g] for g in groups), dtype=bool, count=len(groups))
    out = {
        "groups": len(test_of),
        "grouped_by": getattr(source, "group_label", "") or "groups",
        "groups_train": sum(not t for t in test_of.values()),
        "groups_test": sum(test_of.values()),
        "examples_train": int((~test).sum()),
        "examples_test": int(test.sum()),
        "groups_on_both_sides": len(straddling(groups, test)),
        "split_rule": f"per-group hash split, ~{int(TEST_FRACTION * 100)}% of groups in test",
    }
    data_split = getattr(source, "data_split", None)
    if data_split is not None:
        across = straddling(groups, data_split)
        out["data_split_column"] = getattr(source, "data_split_column", "split")
        out["groups_across_data_split"] = len(across)
        if across:
            out["groups_across_data_split_first"] = across[:SHOWN]
    return out
