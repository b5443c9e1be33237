"""The private train and test parts a trainer uses.

``NAME`` trains on ``NAME:train`` and evaluates on ``NAME:test``: the dataset's official split where it
has one, HAM10000's lesion grouping, else the per-example hash split (see :mod:`gsd_cli.data.splits`),
whether ``NAME`` is a dataset name or a catalogue entry (:meth:`gsd_cli.ranking.catalog.Catalog.resolve` with
``split``), so a dataset gets the same parts however it is named. A name that already names a split
(``chestxray:train``) needs the test part named explicitly (``--private-test``); a test set named apart has its
classes matched to the training set's by name (:func:`private_parts`).
"""

from __future__ import annotations

from ..data import ImageSource, resolve
from ..data.classes import align_classes, parse_classes, with_classes
from ..data.splits import EmptyPartError, fixed_split
from ..errors import DatasetError, GSDError, PrivateError


def private_parts(name: str | ImageSource, test: str | ImageSource | None = None, catalog=None,
                  classes: int | str | None = None) -> tuple[ImageSource, ImageSource]:
    """``(train, test)`` sources for the private dataset ``name`` (see the module docstring).
    ``catalog`` (a :class:`gsd_cli.ranking.catalog.Catalog`) resolves the names it defines; ``classes``
    (``--classes``: a count or names) is declared on both parts (:func:`gsd_cli.data.with_classes`).
    A ``test`` set named apart has its labels matched to the training set's classes by name
    (:func:`gsd_cli.data.classes.align_classes`), or by ``classes``'s names where they are given."""
    train, held = _parts(name, test, catalog)
    if test is not None and (classes is None or not isinstance(parse_classes(classes), list)):
        held = align_classes(held, train)
    if classes is not None:
        train, held = with_classes(train, classes), with_classes(held, classes)
    return train, held


def _parts(name: str | ImageSource, test: str | ImageSource | None, catalog) -> tuple[ImageSource, ImageSource]:
    res = catalog.resolve if catalog is not None else resolve
    if test is not None:
        return res(name), res(test)
    if isinstance(name, ImageSource):
        return fixed_split(name, "train"), fixed_split(name, "test")
    if catalog is not None and name in catalog.datasets:
        entry = catalog.datasets[name]
        if entry.split:
            raise GSDError(f"catalogue dataset {name!r} is already the split {entry.split!r}; name its test set with --private-test")
        return catalog.resolve(name, split="train"), catalog.resolve(name, split="test")
    res(name)  # a missing or malformed dataset says so in its own words
    try:
        return res(f"{name}:train"), res(f"{name}:test")
    except EmptyPartError as e:  # all of the private set's examples fell in one part: a private output (docs/train.md)
        raise PrivateError(f"{name} has no train/test parts ({e}); name the test set with --private-test") from None
    except DatasetError as e:
        raise GSDError(f"{name} has no train/test parts ({e}); name the test set with --private-test") from None
