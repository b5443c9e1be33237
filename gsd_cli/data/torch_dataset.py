"""A map-style ``torch.utils.data.Dataset`` as a source: the data a user already has in PyTorch.

>>> src = from_torch_dataset(my_dataset, name="xrays", num_classes=2)          # doctest: +SKIP
>>> gsd_cli.rank(private=src, publics={"cifar": cifar_ds, "faces": "faces"})   # doctest: +SKIP

``ds[i]`` must return ``(image, label)``. The image is a PIL image, a tensor ``C x H x W`` or
``H x W`` (C in 1, 3; what ``ToTensor`` gives), or an array ``H x W [x C]``; integers are divided by
their type's top (255, 65535), floats must already lie in [0, 1] (leave ``Normalize`` out of the
transform: gsd normalises itself). The label is an int (or 0-d tensor), or a 0/1 vector of
``num_classes`` for a multi-label set. Only the drawn indices are read; labels come from a
``targets`` list of the dataset where it has one, else from ``ds[i][1]``.

Classes are declared: by ``num_classes`` or ``classes`` (names), else by the dataset's own
``classes`` list (torchvision's datasets and ``ImageFolder`` have one). A dataset with neither can be
wrapped (``gsd_cli.rank`` accepts it as a public candidate), but its class count is then read off its
labels (all of them: one pass over the dataset) and DP uses refuse it, as for other sources.

Splits. A torch dataset has no identity per example (an index is not one: removing example 5 would
shift every later index and move many examples between train and test, which voids a DP guarantee
about one example). So the dataset is used **as given**: give your train and test parts as two
datasets. ``:train`` / ``:test`` of it (``split=`` here, :func:`gsd_cli.data.splits.fixed_split`)
hash each example's identity: ``keys`` (ids you give: a sequence, or ``keys(i) -> str``), else a
hash of its image content (every image is read once). ``groups`` (a sequence or ``groups(i)``) keeps
a patient's examples on one side, as for files (:mod:`.groups`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Sequence

import numpy as np

from ..errors import DatasetError
from .base import ImageSource


def is_torch_dataset(obj) -> bool:
    """A map-style dataset: indexable, sized, and not a name, a source or a mapping."""
    return (not isinstance(obj, (str, bytes, ImageSource, Mapping)) and hasattr(obj, "__getitem__")
            and hasattr(obj, "__len__"))


def _per_index(values, n: int, what: str, name: str) -> Callable[[int], object] | list[str] | None:
    """``values`` checked: None, a function of the index, or a list of ``n`` strings (no lambda: a
    source may be pickled, to a worker process)."""
    if values is None or callable(values):
        return values
    values = [str(v) for v in values]
    if len(values) != n:
        raise DatasetError(f"{name}: {len(values)} {what} for {n} examples; give one per example")
    return values


def _at(values, indices, n: int) -> list[str]:
    """``values`` (:func:`_per_index`) of ``indices`` (None: all ``n``) as strings."""
    idx = range(n) if indices is None else (int(i) for i in indices)
    return [str(values(i)) for i in idx] if callable(values) else [values[i] for i in idx]


class TorchDatasetSource(ImageSource):
    """``ds`` (``ds[i] = (image, label)``) read by index; see the module docstring."""

    def __init__(self, ds, name: str, num_classes: int | None = None, classes: Sequence[str] | None = None,
                 multilabel: bool | None = None, keys=None, groups=None, description: str = ""):
        if not is_torch_dataset(ds):
            raise DatasetError(f"{name}: a map-style torch Dataset (ds[i] -> (image, label), len(ds)) is needed, "
                               f"got {type(ds).__name__}")
        self._ds, self.name, n = ds, name, len(ds)
        if classes is None and num_classes is None and isinstance(getattr(ds, "classes", None), (list, tuple)):
            classes = ds.classes
        if classes is not None:
            classes = [str(c) for c in classes]
            if num_classes is not None and num_classes != len(classes):
                raise DatasetError(f"{name}: num_classes={num_classes} but {len(classes)} class names; give one of them")
        self.classes_declared = classes is not None or num_classes is not None
        targets = getattr(ds, "targets", None)
        self._targets = None
        if targets is not None and not isinstance(targets, Mapping) and hasattr(targets, "__len__") and len(targets) == n:
            self._targets = [targets[i] for i in range(n)]
        if multilabel is None:
            multilabel = n > 0 and np.ndim(self._label(0)) == 1
        self.multilabel = bool(multilabel)
        if classes is not None:
            self.classes = classes
        self._num_classes = len(classes) if classes is not None else num_classes
        if self._num_classes is not None and int(self._num_classes) < 1:
            raise DatasetError(f"{name}: num_classes={num_classes}; give at least 1")
        self._keys = _per_index(keys, n, "keys", name)
        self._groups = _per_index(groups, n, "group ids", name)
        self.group_label = "groups given" if groups is not None else ""
        self.description = description or f"torch dataset {type(ds).__name__} ({n} examples)"

    @property
    def num_classes(self) -> int:
        """The declared count, else (``classes_declared`` False) read off every label once."""
        if self._num_classes is None:
            n = len(self)
            if self.multilabel:
                self._num_classes = int(np.shape(self._label(0))[0]) if n else 0
            else:
                y = self.labels(np.arange(n), check=False)
                self._num_classes = int(y.max()) + 1 if n else 0
        return int(self._num_classes)

    def __len__(self) -> int:
        return len(self._ds)

    def _item(self, i: int):
        try:
            item = self._ds[int(i)]
        except DatasetError:
            raise
        except Exception as e:  # the user's __getitem__ (a missing file, a transform error...)
            raise DatasetError(f"{self.name}: ds[{i}] failed ({type(e).__name__}: {' '.join(str(e).split())[:200]})") from None
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise DatasetError(f"{self.name}: ds[{i}] returned {type(item).__name__}; it must return (image, label)")
        return item

    def _label(self, i: int):
        value = self._targets[int(i)] if self._targets is not None else self._item(i)[1]
        return np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)

    def labels(self, indices: Sequence[int], check: bool = True) -> np.ndarray:
        idx = [int(i) for i in indices]
        values = [self._label(i) for i in idx]
        if self.multilabel:
            y = np.stack(values).astype(np.float32) if values else np.zeros((0, self.num_classes), np.float32)
            if check and (y.ndim != 2 or y.shape[1] != self.num_classes or not np.isin(y, (0.0, 1.0)).all()):
                raise DatasetError(f"{self.name}: multi-label targets must be 0/1 vectors of {self.num_classes}")
            return y
        if any(v.ndim != 0 or not (np.issubdtype(v.dtype, np.integer) or float(v) == int(v)) for v in values):
            raise DatasetError(f"{self.name}: labels must be integers (class indices); got e.g. {values[0]!r}")
        y = np.asarray([int(v) for v in values], dtype=np.int64)
        if check and len(y) and (y.min() < 0 or y.max() >= self.num_classes):
            bad = int(y.min()) if y.min() < 0 else int(y.max())
            raise DatasetError(f"{self.name}: a label is {bad}, outside its {self.num_classes} classes (0..{self.num_classes - 1}); "
                               "give num_classes above every label")
        return y

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [to_image_array(self._item(i)[0], self.name, int(i)) for i in indices]

    def example_keys(self, indices: Sequence[int] | None = None) -> list[str]:
        """The ``keys`` given, else content hashes (:meth:`ImageSource.example_keys`)."""
        if self._keys is None:
            return super().example_keys(indices)
        return _at(self._keys, indices, len(self))

    def example_groups(self, indices: Sequence[int] | None = None) -> list[str] | None:
        return None if self._groups is None else _at(self._groups, indices, len(self))

    def describe(self) -> dict:
        from .splits import group_summary

        d = super().describe()
        if len(self):
            d["image_size"] = list(self.images([0])[0].shape)
        d.update(group_summary(self))
        return d


def to_image_array(img, name: str, index: int) -> np.ndarray:
    """One dataset image as float32 ``H x W`` or ``H x W x C`` (C in 1, 3) in [0, 1]; else a one-line error."""
    from .files import _pil_to_array

    if hasattr(img, "mode") and hasattr(img, "convert"):  # a PIL image
        return _pil_to_array(img)
    chw = hasattr(img, "detach")  # torch tensors are channels-first
    a = img.detach().cpu().numpy() if chw else np.asarray(img)
    if a.ndim == 3 and chw:
        a = np.moveaxis(a, 0, -1)
    if a.ndim == 3 and a.shape[-1] == 1:
        a = a[..., 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] != 3):
        layout = "C x H x W" if chw else "H x W x C"
        raise DatasetError(f"{name}: image {index} has shape {tuple(np.shape(img))}; give {layout} with 1 or 3 channels, or H x W")
    if np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
        top = 1.0 if a.dtype == np.bool_ else float(np.iinfo(a.dtype).max)
        return (np.clip(a.astype(np.float64), 0, None) / top).astype(np.float32)
    if not np.issubdtype(a.dtype, np.floating):
        raise DatasetError(f"{name}: image {index} has dtype {a.dtype}; give uint8 or float images in [0, 1]")
    a = a.astype(np.float32)
    finite = a[np.isfinite(a)]
    if finite.size and (finite.min() < 0 or finite.max() > 1):
        raise DatasetError(f"{name}: image {index} has values {finite.min():.3g}..{finite.max():.3g}, outside [0, 1]; "
                           "leave Normalize out of the dataset's transform (gsd normalises itself)")
    return a


def from_torch_dataset(ds, name: str | None = None, num_classes: int | None = None, classes: Sequence[str] | None = None,
                       *, multilabel: bool | None = None, keys=None, groups=None, split: str | None = None) -> ImageSource:
    """``ds`` as an :class:`ImageSource` named ``name`` (default ``torch:<class name>``): see the module
    docstring. ``split`` ('train' or 'test'): that part by the hash of ``keys`` (else of each image's
    content) or of ``groups``; None (default) uses the dataset as given."""
    src = TorchDatasetSource(ds, name or f"torch:{type(ds).__name__}", num_classes, classes, multilabel, keys, groups)
    if split is None:
        return src
    from .splits import fixed_split

    return fixed_split(src, split, f"{src.name}:{split}")


def as_sources(private, publics) -> tuple:
    """``(private, [public, ...])`` with torch datasets wrapped and ``publics`` given as a mapping
    ``{name: dataset or name}`` unpacked; names must differ (they seed the draws and tell sets apart)."""
    def wrap(value, name=None):
        if is_torch_dataset(value):
            return from_torch_dataset(value, name)
        if name is not None and isinstance(value, ImageSource) and value.name != name:
            raise DatasetError(f"public candidate {name!r} is a source named {value.name!r}; use the same name for both")
        return value

    items = list(publics.items()) if isinstance(publics, Mapping) else [(None, p) for p in publics]
    if isinstance(publics, Mapping) and any(isinstance(v, str) and v != k for k, v in items):
        bad = next(k for k, v in items if isinstance(v, str) and v != k)
        raise DatasetError(f"public candidate {bad!r} is the dataset name {publics[bad]!r}; key a name by itself")
    priv = wrap(private)
    pubs = [wrap(v, k) for k, v in items]
    names = [getattr(s, "name", s) for s in (priv, *pubs)]
    wrapped = [n for n, v in zip(names, (private, *(v for _, v in items))) if is_torch_dataset(v)]
    dup = next((n for n in wrapped if names.count(n) > 1), None)  # other repeats: the ranking's own checks
    if dup is not None:
        raise DatasetError(f"two datasets are named {dup!r}; give each torch dataset its own name "
                           "(from_torch_dataset(ds, name=...), or publics={'name': ds, ...})")
    return priv, pubs
