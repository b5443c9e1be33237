"""What a drawn sample is made of, hashed cheaply and exactly: the data part of the public-subspace
cache key (:mod:`gsd_cli.ranking.cache`).

The key must change whenever the model input of a drawn example could, and must not cost a second
decode-and-resize of the sample. So it hashes what the images are *made from*, read as cheaply as
the source allows:

* in-memory arrays (the embedded sets, ``npz:``; also through ``:train`` / ``:test`` subsets and
  declared class lists): the raw rows of the drawn examples, with their dtype and shape;
* file-backed sources (``folder:``, ``csv:``, the published sets, DICOM): the bytes of each drawn
  file (SHA-256), with the read settings that change what a file decodes to (:data:`READ_SETTINGS`,
  e.g. the frame of multi-frame DICOMs), how the input pipeline decodes files
  (:data:`gsd_cli.data.decode.DECODE`: JPEGs at a reduced DCT scale) and the versions of the decoders
  (:func:`library_versions`);
* anything else (torchvision's sets, Hugging Face and torch datasets): the decoded images at their
  native size (float32 bytes and shape), still without the resize to the model's input size.
* generated sources (gsd's in-run noise references, :class:`gsd_cli.data.reference.NoiseSource`): the
  parameters each image is drawn from (``generator()``: the generator's kind, seed, grid and channels), with
  numpy's version (:func:`library_versions`), which fixes the draws: no image is generated to be hashed.

The source's name and kind and the drawn indices enter as well. Nothing here uses ``id()`` or
Python's salted ``hash()``: the same sample gives the same digest in every process.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from typing import Sequence

import numpy as np

from ..errors import DatasetError
from .base import HASH_CHUNK, ArraySource, ImageSource
from .classes import ClassedSource
from .decode import DECODE
from .splits import SubsetSource

#: Attributes of a source (or of a source it wraps) that change what its files decode to.
READ_SETTINGS = ("frame",)
#: Libraries whose versions can change the decoded or resized pixels.
LIBRARIES = ("torch", "torchvision", "pillow", "numpy", "pydicom")


@functools.lru_cache(maxsize=1)
def _versions() -> tuple:
    out = []
    for lib in LIBRARIES:
        try:
            out.append((lib, importlib.metadata.version(lib)))
        except importlib.metadata.PackageNotFoundError:
            out.append((lib, None))
    return tuple(out)


def library_versions() -> dict[str, str | None]:
    """Installed versions of :data:`LIBRARIES` (None: not installed), read once per process from the
    packages' metadata; nothing is imported."""
    return dict(_versions())


def _wrappers_to_array(source: ImageSource, idx: np.ndarray) -> tuple[ArraySource, np.ndarray] | None:
    """``(array source, indices into it)`` when ``source`` is an :class:`ArraySource` seen through
    subsets and class lists only (which pass images through unchanged), else None."""
    while True:
        if type(source) is SubsetSource:
            idx, source = source.indices[idx], source.parent
        elif type(source) is ClassedSource:
            source = source.parent
        elif type(source) is ArraySource:
            return source, idx
        else:
            return None


def read_settings(source: ImageSource) -> dict:
    """:data:`READ_SETTINGS` of ``source`` and of every source it wraps (``parent``), outermost first."""
    found: dict = {}
    depth = 0
    while source is not None:
        for attr in READ_SETTINGS:
            if getattr(source, attr, None) is not None:
                found.setdefault(f"{depth}.{attr}", repr(getattr(source, attr)))
        source, depth = getattr(source, "parent", None), depth + 1
    return found


def _file_digest(source: ImageSource, index: int, file: str) -> str:
    try:
        with open(file, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as e:
        raise DatasetError(f"{source.name}: cannot read image {file} ({e.strerror or type(e).__name__}); "
                           f"remove or replace it") from None


def content_digest(source: ImageSource, indices: Sequence[int]) -> dict:
    """``{"how", "sha256", ...}``: the digest of what the examples ``indices`` of ``source`` are made of
    (see the module docstring for ``how``: ``arrays``, ``files`` or ``decoded``)."""
    idx = np.asarray(indices, dtype=np.int64)
    h = hashlib.sha256()
    generator = getattr(source, "generator", None)
    if callable(generator):  # every image a function of these parameters (and numpy's version, in the fingerprint)
        return {"how": "generated", **generator()}
    arrays = _wrappers_to_array(source, idx)
    if arrays is not None:
        leaf, rows = arrays
        for start in range(0, len(rows), 4096):
            part = np.ascontiguousarray(leaf._x[rows[start : start + 4096]])
            h.update(repr((part.shape, part.dtype.str)).encode())
            h.update(part.tobytes())
        return {"how": "arrays", "sha256": h.hexdigest()}
    files = [source.example_file(int(i)) for i in idx]
    if len(files) and all(f is not None for f in files):
        for i, f in zip(idx, files):
            h.update(_file_digest(source, int(i), f).encode())
        return {"how": "files", "sha256": h.hexdigest(), "read": read_settings(source), "decode": DECODE}
    for start in range(0, len(idx), HASH_CHUNK):
        for img in source.images(idx[start : start + HASH_CHUNK]):
            a = np.ascontiguousarray(img, dtype=np.float32)
            h.update(repr(a.shape).encode())
            h.update(a.tobytes())
    return {"how": "decoded", "sha256": h.hexdigest()}


def sample_fingerprint(source: ImageSource, indices: Sequence[int]) -> dict:
    """A JSON-able description of a drawn sample that changes whenever its model input could: the
    source's name and kind, the drawn indices (their SHA-256), :func:`content_digest` of the drawn
    examples and :func:`library_versions`. Labels are not in it (the cache key hashes the labels the
    gradients use)."""
    idx = np.ascontiguousarray(np.asarray(indices, dtype=np.int64))
    return {
        "name": source.name,
        "kind": f"{type(source).__module__}.{type(source).__qualname__}",
        "examples": len(idx),
        "indices": hashlib.sha256(idx.astype("<i8").tobytes()).hexdigest(),
        "content": content_digest(source, idx),
        "libraries": library_versions(),
    }
