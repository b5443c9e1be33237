"""Datasets the user has on disk: ``folder:PATH`` (ImageFolder layout) and ``npz:PATH`` (arrays).

A file-backed example's identity (:meth:`ImageSource.example_keys`) is its path relative to the
dataset's folder, in posix form: it names that example alone, whatever else is in the folder.

Folder listings skip hidden entries (:func:`is_hidden`): macOS's ``._x.png`` resource forks and
``.DS_Store``, Windows's ``Thumbs.db`` and ``desktop.ini``, ``__MACOSX`` folders of unzipped archives
and every dot-file or dot-folder (``.ipynb_checkpoints``): none is an image or a class.

DICOM files (:mod:`.dicom`) are images too: ``.dcm`` / ``.dicom``, and any file without an image
extension whose bytes 128..131 are ``DICM`` (extension-less or UID-named files; their first 132 bytes
are read when the folder is listed). Folder and file-list sources take ``groups`` (:mod:`.groups`:
the split then keeps a group's examples together) and ``frame`` (the frame of multi-frame DICOMs).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import DataWarning, DatasetError
from .base import ArraySource, ImageSource, non_finite_message
from .decode import IMAGE_EXTENSIONS, open_image
from .decode import pil_to_array as _pil_to_array  # noqa: F401 - imported from here by the torch and HF sources
from .dicom import DICOM_EXTENSIONS, is_dicom_file, pydicom_module
from .groups import read_groups_file
from .layout import FirstRead, nested_note
from .splits import group_summary


#: names that are never images or classes, whatever their extension (macOS and Windows folder metadata)
HIDDEN_NAMES = ("thumbs.db", "desktop.ini", "__macosx")


def is_hidden(name: str) -> bool:
    """A dot-file or dot-folder (``._x.png``, ``.DS_Store``), ``Thumbs.db``, ``desktop.ini``, ``__MACOSX``."""
    return name.startswith(".") or name.lower() in HIDDEN_NAMES


def list_image_folder(path: Path, nested: dict | None = None) -> tuple[list[str], list[tuple[str, int]]]:
    """``(classes, [(file, class index)])`` of ``PATH/<class>/**/<image>`` in torchvision's
    ``ImageFolder`` order (classes sorted, files sorted per folder, links followed), hidden entries
    (:func:`is_hidden`) skipped at every depth; images are files with torchvision's image extensions
    and DICOM files (:func:`gsd_cli.data.dicom.is_dicom_file`). Raises ``FileNotFoundError`` when
    there is no class folder or a class folder without an image. ``nested``: filled with each class whose
    folder holds sub-folders with images (class -> those sub-folders, relative to the class folder, and how
    many images they hold): as in ``ImageFolder``, those images count as the class (:func:`nested_note`)."""
    IMG_EXTENSIONS = IMAGE_EXTENSIONS  # torchvision's list, without importing it (a broken install is not "no images")
    classes = sorted(e.name for e in os.scandir(path) if e.is_dir() and not is_hidden(e.name))
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {path}.")
    samples = []
    for c, cls in enumerate(classes):
        before = len(samples)
        for root, _, names in sorted(os.walk(path / cls, followlinks=True)):
            if any(is_hidden(part) for part in Path(os.path.relpath(root, path / cls)).parts if part != "."):
                continue
            found = [(os.path.join(root, n), c) for n in sorted(names) if not is_hidden(n) and (
                n.lower().endswith(IMG_EXTENSIONS) or is_dicom_file(os.path.join(root, n), IMG_EXTENSIONS))]
            samples += found
            if found and nested is not None and os.path.normpath(root) != os.path.normpath(path / cls):
                nested.setdefault(cls, []).append((Path(os.path.relpath(root, path / cls)).as_posix(), len(found)))
        if len(samples) == before:  # as ImageFolder: an empty class folder is an error
            raise FileNotFoundError(f"Found no valid file for the class {cls}.")
    return classes, samples


class FolderSource(ImageSource):
    """``PATH/<class>/<image>`` as torchvision's ``ImageFolder`` reads it; images opened on demand.

    Only the examples that are drawn are opened, so a large folder costs one directory scan.
    ``groups``: a groups file (:func:`gsd_cli.data.groups.read_groups_file`); ``frame``: the frame
    read from multi-frame DICOM files (None: they are refused).
    """

    def __init__(self, path: str | Path, name: str | None = None, groups: str | Path | None = None,
                 frame: int | None = None):
        from types import SimpleNamespace

        path = Path(path).expanduser()
        self.name = name or f"folder:{path}"
        if not path.is_dir():
            raise DatasetError(f"{self.name}: no such folder; give a folder with one sub-folder of images per class")
        nested: dict = {}
        try:
            classes, samples = list_image_folder(path, nested=nested)
        except (FileNotFoundError, RuntimeError, OSError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DatasetError(
                f"{self.name}: no images found ({first}); expected PATH/<class>/<image>.png|jpg|..."
            ) from None
        self._folder = SimpleNamespace(classes=classes, samples=samples)  # the fields of ImageFolder used here
        self.num_classes = len(classes)
        self.classes = list(classes)  # declared by the class folders' names
        self._targets = np.asarray([c for _, c in samples], dtype=np.int64)
        self.root = str(path)
        self.origin_path = str(path)  # what it reads, for gsd_cli.data.identity.origin
        self.description = f"image folder {path} ({self.num_classes} classes)"
        self.frame = check_frame(frame, self.name)
        if any(not f.lower().endswith(IMAGE_EXTENSIONS) for f, _ in samples):  # DICOM found by the listing
            pydicom_module(self.name)
        self._groups = self.data_split = None
        self.nested = nested  # class -> sub-folders of images counted as that class (gsd datasets check)
        self._first_read = FirstRead(self.name)
        if nested:  # said when the folder is opened: a folder of one class inside another's is a mislabelled class
            warnings.warn(DataWarning(nested_note(self.name, nested)), stacklevel=2)
        if groups is not None:
            self._groups, self.data_split, self.data_split_column, self.group_label = read_groups_file(
                groups, self.example_keys(), self.name)
            self.description += f", grouped by {self.group_label}"

    def __len__(self) -> int:
        return len(self._folder.samples)

    def example_file(self, index: int) -> str:
        return self._folder.samples[int(index)][0]

    def example_keys(self, indices: Sequence[int] | None = None) -> list[str]:
        """``<class>/<file>``: the path relative to the folder (see the module docstring)."""
        idx = range(len(self)) if indices is None else indices
        return [relative_key(self.example_file(i), self.root) for i in idx]

    def example_groups(self, indices: Sequence[int] | None = None) -> list[str] | None:
        """Each example's group id (None: the folder has no groups file)."""
        return _pick(self._groups, indices)

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        return self._targets[np.asarray(indices, dtype=np.int64)]

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        """The images, decoded; the first read of images of mixed sizes or modes is said once (:class:`~gsd_cli.data.layout.FirstRead`)."""
        return self._first_read.see([open_image(self._folder.samples[int(i)][0], self.name, self.frame) for i in indices])

    def images_at(self, indices: Sequence[int], size: int) -> list[np.ndarray]:
        """:meth:`images`, JPEGs decoded at a reduced scale still >= ``size`` (:mod:`.decode`)."""
        return self._first_read.see([open_image(self._folder.samples[int(i)][0], self.name, self.frame, draft=size) for i in indices])

    def describe(self) -> dict:
        d = super().describe()
        d["class_names"] = self.classes
        d.update(group_summary(self))
        return d


def check_frame(frame, name: str) -> int | None:
    """``frame`` as a non-negative int (None stays None); else a one-line error."""
    if frame is None:
        return None
    try:
        value = int(frame)
    except (TypeError, ValueError):
        value = -1
    if value < 0 or isinstance(frame, bool) or (isinstance(frame, float) and frame != value):
        raise DatasetError(f"{name}: frame={frame!r}; give the frame of multi-frame DICOM files as an integer >= 0")
    return value


def _pick(values: list | None, indices: Sequence[int] | None) -> list | None:
    if values is None:
        return None
    return list(values) if indices is None else [values[int(i)] for i in indices]


def relative_key(file: str | Path, root: str | Path | None) -> str:
    """``file`` relative to ``root`` in posix form (the file as given when there is no root)."""
    if root is None:
        return Path(file).as_posix()
    return Path(os.path.relpath(file, root)).as_posix()


def npz_source(path: str | Path, name: str | None = None) -> ImageSource:
    """``npz:PATH``: arrays ``x`` (N,H,W | N,C,H,W | N,H,W,C; C in 1 or 3) and ``y`` (N,) or (N, classes).

    uint8 images are divided by 255, uint16 by 65535 (other integer types must hold 0..255); float images are used as they are and must lie in [0, 1], and
    NaN or infinite values are refused. The class list is declared by an optional array ``classes``
    (names) or scalar ``num_classes`` in the file; without either it is read off ``y``
    (``max(y) + 1``) and the source says so (``classes_declared`` False).
    """
    path = Path(path).expanduser()
    name = name or f"npz:{path}"
    if not path.is_file():
        raise DatasetError(f"{name}: no such file; give an .npz with arrays 'x' and 'y'")
    try:
        with np.load(path, allow_pickle=False) as f:
            if "x" not in f.files or "y" not in f.files:
                raise DatasetError(f"{name}: has arrays {f.files}; it needs arrays named 'x' (images) and 'y' (labels)")
            x, y = f["x"], f["y"]
            declared = _declared_classes(f, name)
    except DatasetError:
        raise
    except Exception as e:  # zipfile.BadZipFile, ValueError, OSError...
        raise DatasetError(f"{name}: cannot read ({type(e).__name__}: {e}); save it with numpy.savez(path, x=..., y=...)") from None
    if x.ndim == 4:
        if x.shape[-1] in (1, 3):
            pass
        elif x.shape[1] in (1, 3):
            x = np.moveaxis(x, 1, -1)
        else:
            raise DatasetError(f"{name}: x has shape {x.shape}; 4-d images need 1 or 3 channels (N,C,H,W or N,H,W,C)")
        if x.shape[-1] == 1:
            x = x[..., 0]
    elif x.ndim != 3:
        raise DatasetError(f"{name}: x has shape {x.shape}; expected N,H,W or N,C,H,W or N,H,W,C")
    if y.ndim not in (1, 2) or len(y) != len(x):
        raise DatasetError(f"{name}: y has shape {y.shape} for {len(x)} images; give one label (or one 0/1 row) per image")
    if np.issubdtype(x.dtype, np.integer):
        x = _integer_images(x, name)
    elif np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
        bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if bad.any():
            raise DatasetError(non_finite_message(name, int(np.argmax(bad))))
        if x.size and (x.min() < 0 or x.max() > 1):
            raise DatasetError(f"{name}: float images must lie in [0, 1] (found {x.min():.3g}..{x.max():.3g}); rescale or save as uint8")
    else:
        raise DatasetError(f"{name}: x has dtype {x.dtype}; use uint8 or float in [0, 1]")
    if y.ndim == 1:
        if not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
            raise DatasetError(f"{name}: y must hold non-negative integer class labels (got dtype {y.dtype})")
    elif y.dtype.kind not in "biuf" or (y.size and not np.isin(y, (0, 1)).all()):
        # a multi-label y is a 0/1 matrix; a 2 (or a NaN) would give a loss below zero and an accuracy of 1.0
        bad = sorted({float(v) for v in np.unique(y[~np.isin(y, (0, 1))])[:3]}) if y.dtype.kind in "biuf" else y.dtype
        raise DatasetError(f"{name}: y has shape {y.shape} (multi-label) but holds values other than 0 and 1 ({bad}); "
                           "give one 0/1 column per class, or one integer label per image (shape (N,))")
    from ..memory import MAX_CLASSES

    if (declared if isinstance(declared, int) else len(declared or ())) > MAX_CLASSES or (
            declared is None and y.ndim == 1 and len(y) and int(y.max()) >= MAX_CLASSES):
        what = "the file declares" if declared is not None else "the labels in y give"
        raise DatasetError(f"{name}: {what} more than {MAX_CLASSES:,} classes (a model head that size would not fit in "
                           "memory); labels must be class indices 0..N-1: fix y, or declare the classes (an array 'classes')")
    if isinstance(declared, int):
        declared = [str(c) for c in range(declared)]
    if declared is not None:
        _check_declared(name, y, len(declared))
        src = ArraySource(name, x, y, len(declared), f"arrays from {path}", classes=declared)
    else:
        src = ArraySource(name, x, y, description=f"arrays from {path}")
    src.origin_path = str(path)  # what it reads, for gsd_cli.data.identity.origin
    return src


def _integer_images(x: np.ndarray, name: str) -> np.ndarray:
    """Integer images in [0, 1] by their type's range: uint8 / 255, uint16 / 65535 (16-bit X-rays, as the
    DICOM and TIFF paths do). Other integer types (int64 from a Python list) are read as 8-bit when
    their values lie in 0..255; anything else is refused, as no scale can be told from the values."""
    if x.dtype == np.uint16:
        return x.astype(np.float32) / 65535.0
    if x.dtype != np.uint8 and x.size and (x.min() < 0 or x.max() > 255):
        raise DatasetError(f"{name}: x has dtype {x.dtype} with values {x.min()}..{x.max()}; save 8-bit images as uint8 "
                           "(0..255), 16-bit as uint16 (0..65535), or floats in [0, 1]")
    return x.astype(np.float32) / 255.0


def _declared_classes(f, name: str) -> list[str] | int | None:
    """The class list an npz declares: its array ``classes`` (names) or scalar ``num_classes``."""
    if "classes" in f.files:
        c = f["classes"]
        if c.ndim != 1 or not len(c) or c.dtype.kind not in "USiu" or len(set(c.tolist())) != len(c):
            raise DatasetError(f"{name}: 'classes' must be a 1-d array of distinct class names; save e.g. classes=np.array(['cat', 'dog'])")
        return [str(v) for v in c.tolist()]
    if "num_classes" in f.files:
        n = f["num_classes"]
        if n.ndim != 0 or n.dtype.kind not in "iu" or int(n) < 1:
            raise DatasetError(f"{name}: 'num_classes' must be one positive integer; save e.g. num_classes=np.int64(10)")
        return int(n)
    return None


def _check_declared(name: str, y: np.ndarray, n: int) -> None:
    """Labels within the declared ``n`` classes (a 0/1 matrix ``n`` wide), else a one-line error."""
    if y.ndim == 2 and y.shape[1] != n:
        raise DatasetError(f"{name}: y has {y.shape[1]} label columns but the file declares {n} classes; make them agree")
    if y.ndim == 1 and len(y) and int(y.max()) >= n:
        raise DatasetError(f"{name}: a label is {int(y.max())} but the file declares {n} classes (0..{n - 1}); fix the labels or the class list")


class FileListSource(ImageSource):
    """Images given as a list of files with their labels; only the files that are drawn are opened.

    ``labels`` is int ``(N,)`` (single-label) or 0/1 ``(N, C)`` (multi-label); ``classes`` names them.
    ``groups``: each example's group id (the split keeps a group together, :mod:`.groups`), described
    by ``group_label``; ``data_split``: the data's own split value per example (checked, not used);
    ``frame``: the frame read from multi-frame DICOM files.
    """

    def __init__(self, name: str, files: Sequence[str | Path], labels: np.ndarray, classes: Sequence[str],
                 description: str = "", layout: str = "", root: str | Path | None = None,
                 classes_declared: bool = True, keys: Sequence[str] | None = None,
                 groups: Sequence[str] | None = None, group_label: str = "", data_split: Sequence[str] | None = None,
                 data_split_column: str = "", frame: int | None = None):
        labels = np.asarray(labels)
        if len(files) != len(labels):
            raise DatasetError(f"{name}: {len(files)} images but {len(labels)} labels")
        self.name = name
        self.files = [str(f) for f in files]
        self._labels = labels
        self.multilabel = labels.ndim == 2
        self.classes = list(classes)
        self.num_classes = len(self.classes)
        self.description = description
        self.layout = layout
        self.root = str(root) if root is not None else None
        self.classes_declared = classes_declared
        if keys is not None and len(keys) != len(self.files):
            raise DatasetError(f"{name}: {len(keys)} example keys for {len(self.files)} files")
        self._keys = None if keys is None else [str(k) for k in keys]
        if groups is not None and len(groups) != len(self.files):
            raise DatasetError(f"{name}: {len(groups)} group ids for {len(self.files)} files")
        self._groups = None if groups is None else [str(g) for g in groups]
        self.group_label, self.data_split, self.data_split_column = group_label, data_split, data_split_column
        self.frame = check_frame(frame, name)
        if any(f.lower().endswith(DICOM_EXTENSIONS) for f in self.files):
            pydicom_module(name)

    def __len__(self) -> int:
        return len(self.files)

    def example_file(self, index: int) -> str:
        return self.files[int(index)]

    def example_keys(self, indices: Sequence[int] | None = None) -> list[str]:
        """The keys given (e.g. ChestX-ray14's image names), else each file's path relative to ``root``."""
        idx = range(len(self)) if indices is None else indices
        if self._keys is not None:
            return [self._keys[int(i)] for i in idx]
        return [relative_key(self.files[int(i)], self.root) for i in idx]

    def example_groups(self, indices: Sequence[int] | None = None) -> list[str] | None:
        """Each example's group id (None: no groups)."""
        return _pick(self._groups, indices)

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        y = self._labels[np.asarray(indices, dtype=np.int64)]
        return y.astype(np.float32 if self.multilabel else np.int64)

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [open_image(self.files[int(i)], self.name, self.frame) for i in indices]

    def images_at(self, indices: Sequence[int], size: int) -> list[np.ndarray]:
        """:meth:`images`, JPEGs decoded at a reduced scale still >= ``size`` (:mod:`.decode`)."""
        return [open_image(self.files[int(i)], self.name, self.frame, draft=size) for i in indices]

    def describe(self) -> dict:
        d = super().describe()
        d.update(class_names=self.classes, layout=self.layout, root=self.root)
        if self.files:
            d["image_size"] = list(open_image(self.files[0], self.name, self.frame).shape)
        d.update(group_summary(self))
        return d
