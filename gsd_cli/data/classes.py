"""Declared class lists: the model's output layer must not be sized by the private labels.

A source whose class count was read off its labels (``max(label) + 1`` of an npz, the distinct strings
of a CSV column) has ``classes_declared`` False: on two neighbouring datasets (one example added) the
model would have a different shape, which the released model or subspace shows, so DP uses refuse it
(:func:`require_declared_classes`) until the classes are declared, in the data (an npz's ``classes``
or ``num_classes`` array, class folders, a CSV's named ``label_columns``, a dataset's definition) or
by the user (:func:`with_classes`, ``--classes``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import DatasetError
from .base import ImageSource


def parse_classes(spec: int | str) -> int | list[str]:
    """``10`` or ``"10"`` -> 10; ``"cat,dog"`` -> ``["cat", "dog"]`` (one-line error otherwise)."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        count: int | list[str] = int(spec)
    elif isinstance(spec, str) and spec.strip().isdigit():
        count = int(spec.strip())
    elif isinstance(spec, str):
        count = [n.strip() for n in spec.split(",")]
        if any(not n for n in count) or len(set(count)) != len(count):
            raise DatasetError(f"--classes {spec!r}: give a class count (e.g. 10) or distinct comma-separated names (e.g. cat,dog)")
    else:
        raise DatasetError(f"--classes {spec!r}: give a class count (e.g. 10) or comma-separated names (e.g. cat,dog)")
    if isinstance(count, int) and count < 1:
        raise DatasetError(f"--classes {spec!r}: give at least 1 class")
    from ..memory import MAX_CLASSES

    if (count if isinstance(count, int) else len(count)) > MAX_CLASSES:
        raise DatasetError(f"--classes {spec if isinstance(spec, int) else str(spec)[:40]}: at most {MAX_CLASSES:,} classes are "
                           "supported (a model head that size would not fit in memory); give the real class count")
    return count


def _label_names(source: ImageSource) -> list[str] | None:
    """The source's class names where its labels are names (CSV strings, folders, ClassLabel), None
    where they are plain integers (their 'names' are just 0, 1, ...)."""
    names = getattr(source, "classes", None)
    if names is None or [str(c) for c in names] == [str(i) for i in range(len(names))]:
        return None
    return [str(c) for c in names]


class ClassedSource(ImageSource):
    """``parent`` with a declared class list; labels re-indexed where names were given in another order."""

    def __init__(self, parent: ImageSource, classes: Sequence[str], mapping: np.ndarray | None):
        self.parent = parent
        self.name = parent.name
        self.multilabel = parent.multilabel
        self.classes = list(classes)
        self.num_classes = len(self.classes)
        self.classes_declared = True
        self.description = parent.description
        self._map = mapping  # parent's class index -> ours (None: the same)
        for attr in ("layout", "root", "group_label", "data_split", "data_split_column"):
            if hasattr(parent, attr):
                setattr(self, attr, getattr(parent, attr))

    def __len__(self) -> int:
        return len(self.parent)

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        y = self.parent.labels(indices)
        if self._map is None:
            return y
        if not self.multilabel:
            return self._map[y]
        out = np.zeros((len(y), self.num_classes), dtype=np.float32)
        out[:, self._map] = y
        return out

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        return self.parent.images(indices)

    def images_at(self, indices: Sequence[int], size: int) -> list[np.ndarray]:
        return self.parent.images_at(indices, size)

    def example_keys(self, indices: Sequence[int] | None = None) -> list[str]:
        return self.parent.example_keys(indices)

    def example_file(self, index: int) -> str | None:
        return self.parent.example_file(index)

    def example_groups(self, indices: Sequence[int] | None = None) -> list[str] | None:
        fn = getattr(self.parent, "example_groups", None)
        return None if fn is None else fn(indices)

    def describe(self) -> dict:
        d = {**self.parent.describe(), **super().describe()}
        d["class_names"] = self.classes
        return d


def with_classes(source: ImageSource, spec: int | str) -> ImageSource:
    """``source`` with the class list ``spec`` declared (``classes_declared`` True).

    ``spec`` is a count N (int or ``"N"``: classes 0..N-1) or comma-separated names. Names are matched
    against the source's label names (CSV strings, class folders) and the labels re-indexed to their
    order; for integer labels, names only give the count. Every label must lie in the list (checked
    here, once): otherwise a one-line :class:`DatasetError` says what to do.
    """
    want = parse_classes(spec)
    names = want if isinstance(want, list) else [str(i) for i in range(want)]
    have = _label_names(source)
    if have is not None and isinstance(want, list):
        missing = [c for c in have if c not in names]
        if missing:
            # no label value in the message: it may be private (gsd datasets check shows the labels to their owner)
            raise DatasetError(f"{source.name}: has a class name that is not in --classes {','.join(names)}; "
                               f"list every class (gsd datasets check {source.name} shows them)")
        mapping = np.asarray([names.index(c) for c in have], dtype=np.int64)
        return ClassedSource(source, names, None if np.array_equal(mapping, np.arange(len(names))) else mapping)
    if have is not None and not source.classes_declared:
        raise DatasetError(f"{source.name}: its labels are names read off the data ({', '.join(have[:3])}...); "
                           f"declare them all by name: --classes {','.join(have[:3])},...")
    if source.multilabel:
        if source.num_classes != len(names):
            raise DatasetError(f"{source.name}: has {source.num_classes} labels per example but --classes gives {len(names)}; "
                               f"give {source.num_classes} or the names of its label columns")
        return ClassedSource(source, have or names, None)
    n = len(source)
    y = source.labels(np.arange(n))
    if n and (int(y.min()) < 0 or int(y.max()) >= len(names)):
        # the message names no label value: the largest label of a private set is private
        raise DatasetError(f"{source.name}: has a label outside --classes ({len(names)} classes: 0..{len(names) - 1}); "
                           f"give a class count above every label (gsd datasets check {source.name} shows them)")
    if have is not None:
        names = (have + names[len(have):])[: len(names)]
    return ClassedSource(source, names, None)


def align_classes(test: ImageSource, train: ImageSource) -> ImageSource:
    """``test`` with its labels as ``train``'s class indices, matched by name: a test set named apart from
    the training set (``--private-test``) may hold a subset of its classes, in any order (a class folder
    missing shifts every later folder's sorted position, which would score each class as another).

    ``test`` is returned as it is where either's labels are plain integers (no names: an npz without
    ``classes``; the index is the only mapping), where both name the same classes in the same order, and
    where the training set's names were read off its labels (not declared: private training refuses it).
    Refused with one line (:class:`DatasetError`, naming no class: it may be private): a test class that the
    training set does not have, and a test set that is multi-label where the training set is not, or the
    other way round."""
    if bool(test.multilabel) != bool(train.multilabel):
        kind = lambda s: "multi-label" if s.multilabel else "single-label"  # noqa: E731
        raise DatasetError(f"--private-test {test.name} is {kind(test)} but the training set {train.name} is {kind(train)}; "
                           "give a test set of the same task")
    have, want = _label_names(test), _label_names(train)
    if have is None or want is None or have == want or not getattr(train, "classes_declared", True):
        return test
    if any(c not in want for c in have):
        raise DatasetError(f"--private-test {test.name} has a class that the training set {train.name} does not have (classes "
                           "are matched by name); give a test set of the training set's classes (gsd datasets check lists both)")
    return ClassedSource(test, want, np.asarray([want.index(c) for c in have], dtype=np.int64))


def require_declared_classes(source: ImageSource) -> None:
    """Refuse a source whose class list was read off its labels (see the module docstring)."""
    if not getattr(source, "classes_declared", True):
        name = str(source.name)
        how = ("add a 'classes' array (or num_classes) to the file, or pass --classes N" if name.startswith("npz:") else
               "pass every class name with --classes, e.g. --classes cat,dog (a catalogue entry: label_columns)"
               if name.startswith(("csv:", "hf:")) else "pass --classes N or the class names")
        raise DatasetError(f"{name} declares no class list (its classes would be read off the private labels, which is "
                           f"not private); {how}")
