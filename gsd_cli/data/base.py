"""The dataset-source interface every dataset plugs into.

A source is a list of labelled images that can be opened *by index*, so that drawing m examples from
a set of hundreds of thousands opens only those m files. Sources return images at their native size;
:mod:`gsd_cli.data.transform` turns them into model input.

Every example has an *identity* of its own (:meth:`ImageSource.example_keys`): its file's path
relative to the dataset's folder for file-backed sources, else a hash of its content
(:func:`content_key`). Splits are decided from it alone (:mod:`.splits`). Whether two examples are
*the same example* is another question, answered in one place for the overlap checks
(:mod:`.identity`) and the privacy ledger alike: :func:`example_identity`, a digest of the decoded
image in one canonical form.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np

#: Examples read at once when a source's content is hashed.
HASH_CHUNK = 256


def quantised(img: np.ndarray) -> np.ndarray:
    """An image in [0, 1] as uint8 ``round(img * 255)`` (non-finite values as 0): what content hashes
    compare, so that a float copy and a uint8 copy of the same image hash alike."""
    a = np.nan_to_num(np.asarray(img, dtype=np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    return np.round(np.clip(a, 0.0, 1.0) * 255.0).astype(np.uint8)


def content_key(img: np.ndarray) -> str:
    """``sha256:<hex>`` of the image quantised to uint8 (:func:`quantised`) and its shape."""
    q = quantised(img)
    h = hashlib.sha256(repr(tuple(q.shape)).encode())
    h.update(np.ascontiguousarray(q).tobytes())
    return "sha256:" + h.hexdigest()


def content_keys(source: "ImageSource", indices: Sequence[int] | None = None, chunk: int = HASH_CHUNK) -> list[str]:
    """:func:`content_key` of the examples ``indices`` of ``source`` (None: all), read ``chunk`` at a time."""
    idx = np.arange(len(source)) if indices is None else np.asarray(indices, dtype=np.int64)
    keys: list[str] = []
    for start in range(0, len(idx), chunk):
        imgs = source.images(idx[start : start + chunk])
        if len(imgs) > 1 and all(np.shape(im) == np.shape(imgs[0]) for im in imgs):
            # one quantisation for the chunk (elementwise: the same bytes per image, 5x faster)
            q = quantised(np.stack(imgs))
            shape = repr(tuple(q.shape[1:])).encode()
            for row in q:
                h = hashlib.sha256(shape)
                h.update(row.tobytes())
                keys.append("sha256:" + h.hexdigest())
        else:
            keys += [content_key(img) for img in imgs]
    return keys


#: The version tag hashed into every example identity (a change of canonical form must change it).
EXAMPLE_TAG = b"gsd-example-1\n"
#: Hex digits kept of an example identity's SHA-256 (128 bits: no two different images collide in practice).
EXAMPLE_HEX = 32


def canonical_images(q: np.ndarray):
    """A stack ``n x H x W [x C]`` of uint8 images (:func:`quantised`) in the canonical layout of an
    example identity: grey as ``H x W`` (a trailing channel of 1 dropped; an image whose three channels
    are equal *is* its grey image). Returns an array, or a list where grey and colour images mix."""
    if q.ndim == 4 and q.shape[-1] == 1:
        return q[..., 0]
    if q.ndim == 4 and q.shape[-1] == 3:
        grey = (q[..., 0] == q[..., 1]).all(axis=(1, 2)) & (q[..., 1] == q[..., 2]).all(axis=(1, 2))
        if grey.all():
            return q[..., 0]
        return [q[i, ..., 0] if g else q[i] for i, g in enumerate(grey)]
    return q


def canonical(img: np.ndarray) -> np.ndarray:
    """One image (``H x W`` or ``H x W x C``, floats in [0, 1]) in canonical form: uint8 ``round(255 x)``
    (non-finite values as 0, :func:`quantised`), grey as ``H x W`` (:func:`canonical_images`)."""
    return canonical_images(quantised(img)[None])[0]


def _identity_of(q: np.ndarray) -> str:
    h = hashlib.sha256(EXAMPLE_TAG)
    h.update(repr(tuple(q.shape)).encode())
    h.update(np.ascontiguousarray(q).tobytes())
    return h.hexdigest()[:EXAMPLE_HEX]


def example_identity(img: np.ndarray) -> str:
    """What "the same example" means everywhere in gsd: the SHA-256 (first :data:`EXAMPLE_HEX` hex
    digits) of the image in :func:`canonical` form and of that form's shape. The same picture has the
    same identity however it is stored (a uint8 or float npz, an 8- or 16-bit PNG, a palette PNG, a grey
    picture saved as RGB, a re-encoded lossless file); its label, file, path and position do not enter.
    The overlap checks (:mod:`.identity`) compare these; the privacy ledger stores them keyed
    (:mod:`gsd_cli.privacy.budget.key`), so that they are no membership oracle."""
    return _identity_of(canonical(img))


def example_identities(source: "ImageSource", indices: Sequence[int] | None = None, chunk: int = HASH_CHUNK) -> list[str]:
    """:func:`example_identity` of the examples ``indices`` of ``source`` (None: all), decoded ``chunk``
    at a time (one quantisation per chunk of same-shaped images)."""
    idx = np.arange(len(source)) if indices is None else np.asarray(indices, dtype=np.int64)
    out: list[str] = []
    for start in range(0, len(idx), chunk):
        imgs = source.images(idx[start : start + chunk])
        if len(imgs) > 1 and all(np.shape(im) == np.shape(imgs[0]) for im in imgs):
            out += [_identity_of(q) for q in canonical_images(quantised(np.stack(imgs)))]
        else:
            out += [example_identity(im) for im in imgs]
    return out


def non_finite_message(name: str, index: int, file: str | None = None) -> str:
    """The one-line error for an example with NaN or infinite pixel values."""
    where = f"example {index}" + (f" ({file})" if file else "")
    return f"{name}: {where} has NaN or infinite pixel values; fix or remove it"


def read_images(source: "ImageSource", indices: Sequence[int], size: int | None = None) -> list[np.ndarray]:
    """``source.images(indices)`` (``source.images_at(indices, size)`` when the images will be resized
    to ``size``), refusing any image with a NaN or infinite value.

    One such pixel in a private example would turn a DP model (or a DP subspace) into NaN, and that
    it did would show the example's presence with certainty; so it is an input error (exit 2) naming
    the dataset, the example's index in ``source`` and its file, not something to train through."""
    from ..errors import DatasetError

    images = source.images(indices) if size is None else source.images_at(indices, size)
    for i, img in zip(indices, images):
        if not np.isfinite(img).all():
            raise DatasetError(non_finite_message(source.name, int(i), source.example_file(int(i))))
    return images


class ImageSource(ABC):
    """A labelled image dataset opened by index.

    Subclasses set ``name``, ``num_classes`` and ``multilabel`` and implement ``__len__``,
    :meth:`labels` and :meth:`images`. ``classes_declared`` is False where ``num_classes`` was read
    off the labels themselves (the maximum label seen, the distinct strings of a CSV column): the
    model's shape would then depend on the private labels, so DP uses refuse such a source until the
    class list is declared (:func:`gsd_cli.data.with_classes`).
    """

    name: str
    num_classes: int
    multilabel: bool = False
    description: str = ""
    classes_declared: bool = True

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def labels(self, indices: Sequence[int]) -> np.ndarray:
        """Labels of the given examples: int64 ``(n,)``, or float32 0/1 ``(n, num_classes)`` if multi-label."""

    @abstractmethod
    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        """The given examples as arrays ``H x W`` or ``H x W x C`` (C in 1, 3), float32 in [0, 1]."""

    def images_at(self, indices: Sequence[int], size: int) -> list[np.ndarray]:
        """:meth:`images` for a model input of ``size`` x ``size``: a source may decode an image at a
        reduced scale whose sides stay >= ``size`` (JPEG files: :mod:`gsd_cli.data.decode`); by
        default the images at their native size."""
        return self.images(indices)

    def example_keys(self, indices: Sequence[int] | None = None) -> list[str]:
        """The identity of each example (None: all): a string that depends on that example alone.

        By default a hash of its content (:func:`content_key`, reading the images in chunks);
        file-backed sources give the file's path relative to their folder instead, which is cheap."""
        return content_keys(self, indices)

    def example_file(self, index: int) -> str | None:
        """The file example ``index`` is read from, for error messages and overlap checks (None: in memory)."""
        return None

    def describe(self) -> dict:
        """What ``gsd datasets show`` prints: a JSON-able summary."""
        return {
            "name": self.name,
            "examples": len(self),
            "classes": self.num_classes,
            "classes_declared": self.classes_declared,
            "multilabel": self.multilabel,
            "description": self.description,
        }


class ArraySource(ImageSource):
    """Images held in memory as one array ``N x H x W`` or ``N x H x W x C``, values in [0, 1].

    ``num_classes=None`` reads the class count off the labels (``max(label) + 1``, or the width of a
    0/1 label matrix); single-label classes read that way are not *declared* (see :class:`ImageSource`).
    """

    def __init__(self, name: str, x: np.ndarray, y: np.ndarray, num_classes: int | None = None, description: str = "",
                 classes: Sequence[str] | None = None):
        if len(x) != len(y):
            from ..errors import DatasetError

            raise DatasetError(f"{name}: {len(x)} images but {len(y)} labels; give one label per image")
        self.name = name
        self._x = x
        self._y = np.asarray(y)
        self.multilabel = self._y.ndim == 2
        if classes is not None and num_classes is None:
            num_classes = len(classes)
        self.classes_declared = num_classes is not None or self.multilabel
        if num_classes is None:
            num_classes = self._y.shape[1] if self.multilabel else (int(self._y.max()) + 1 if len(self._y) else 0)
        self.num_classes = int(num_classes)
        if classes is not None:
            self.classes = [str(c) for c in classes]
        self.description = description

    def __len__(self) -> int:
        return len(self._x)

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        return self._y[idx].astype(np.float32 if self.multilabel else np.int64)

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64)
        return list(np.asarray(self._x[idx], dtype=np.float32))

    def example_keys(self, indices: Sequence[int] | None = None) -> list[str]:
        """Content hashes, computed once for the whole array (in-memory sets are small) and kept."""
        keys = self.__dict__.get("_keys")
        if keys is None:
            keys = self._keys = content_keys(self, None, chunk=4096)
        return list(keys) if indices is None else [keys[int(i)] for i in indices]

    def describe(self) -> dict:
        d = super().describe()
        d["image_size"] = list(self._x.shape[1:])
        return d
