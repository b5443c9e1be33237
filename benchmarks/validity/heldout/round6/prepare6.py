"""Round 6's data (issue 52; the tasks and candidates: ``rounds/round6.json``): npz files built from real images that ship in installable
packages no earlier round used, written to ``$GSD_BENCH_DATA/heldout6`` (default ``~/.cache/gsd-bench/heldout6``).
Benchmark-only: none of these packages is a dependency of gsd or of CI. SOURCES.md beside this file says what each
source is, its licence and what was checked.

Install (the data is inside the packages; nothing is downloaded at run time)::

    npm install --prefix ~/.cache/gsd-bench/npm emoji-datasource-twitter@16.0.0 emoji-datasource-google@16.0.0 \\
        material-design-icons@3.0.1 openmoji@17.0.0
    apt-get install openuniverse-common xplanet-images crawl-tiles-data freeciv-data oxygen-icon-theme \\
        faenza-icon-theme elementary-xfce-icon-theme gnome-icon-theme tango-icon-theme
    pip install --no-deps nilearn==0.14.1      # only its data files are read (no import of nilearn)
    pip install cairosvg==2.9.1                # renders OpenMoji's SVGs (needs the system's libcairo)

``$GSD_BENCH_NPM`` overrides the npm folder (default ``~/.cache/gsd-bench/npm/node_modules``); ``$GSD_BENCH_ROOT``
prefixes the Debian paths (default ``/``: a folder where .deb files were unpacked with ``dpkg-deb -x`` works too).

Every array ``x`` is uint8 (N, H, W) or (N, H, W, 3), ``y`` int64, ``classes`` the class names. Transparent images
are flattened on white (:data:`BG`) before they become RGB. Splits are by item (an emoji code with all its vendors and
tones, an icon theme, a band of a tile sheet, of a map or of a brain volume), so that no two parts share an item or a
pixel; on top of that, an image that is byte for byte the same as one of an earlier part of its task (train, then
test, then the public part built with it) is left out, and so is every copy of an image that a part holds under two
labels (:func:`_dedup`). Two public sets are, by the design of SOURCES.md, made of a private task's images and are
never that task's candidates: ``pub-emoji`` (the Google half of ``emoji-test``) and ``pub-openmoji`` (the alternative
to the private ``openmoji`` task). The round's runner makes every set resolvable by name.

    python -m benchmarks validity --round 6 prepare [--force]                       # every builder; idempotent
    python -m benchmarks validity.heldout.round6.prepare6 [--force] [BUILDER ...]   # some builders
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
from pathlib import Path

import numpy as np

from ..prepare import band_patches  # distinct random patches inside one band

INSTALL = ("npm install --prefix ~/.cache/gsd-bench/npm emoji-datasource-twitter@16.0.0 emoji-datasource-google@16.0.0 "
           "material-design-icons@3.0.1 openmoji@17.0.0; apt-get install openuniverse-common xplanet-images "
           "crawl-tiles-data freeciv-data oxygen-icon-theme faenza-icon-theme elementary-xfce-icon-theme "
           "gnome-icon-theme tango-icon-theme; pip install --no-deps nilearn==0.14.1; pip install cairosvg==2.9.1")

Sets = dict[str, tuple[np.ndarray, np.ndarray, list[str]]]

#: the background that every transparent image is flattened on (emoji, icons, tiles, flags)
BG = (255, 255, 255)
#: emoji-datasource categories (``Component``, 5 emoji, left out)
EMOJI_CATS = ["Smileys & Emotion", "People & Body", "Animals & Nature", "Food & Drink", "Travel & Places",
              "Activities", "Objects", "Symbols", "Flags"]
#: the Fitzpatrick modifiers of single-tone emoji; class 0 is the default (yellow) emoji
TONES = ["1F3FB", "1F3FC", "1F3FD", "1F3FE", "1F3FF"]
TONE_NAMES = ["default", "light", "medium-light", "medium", "medium-dark", "dark"]
#: the two emoji vendors with open image licences (Twitter: CC-BY 4.0; Google Noto: Apache 2.0)
VENDORS = ("twitter", "google")
#: OpenMoji's 9 standard groups (``component``, ``extras-openmoji`` and ``extras-unicode`` left out)
OPENMOJI_GROUPS = ["smileys-emotion", "people-body", "animals-nature", "food-drink", "travel-places", "activities",
                   "objects", "symbols", "flags"]
#: planetary maps of openuniverse-common (equirectangular; spacecraft mosaics), one class each
BODIES = ("earth", "mars", "mercury", "moon", "io", "europa", "ganymede", "callisto")
#: column bands of each map (fractions of its width), rows [15%, 85%) only (polar stretch left out)
MAP_BANDS = {"train": (0.0, 0.45), "test": (0.45, 0.6), "public": (0.6, 0.75), "grey-train": (0.75, 0.9),
             "grey-test": (0.9, 1.0)}
MAP_PER_CLASS = {"train": 375, "test": 125, "public": 200, "grey-train": 375, "grey-test": 125}
#: map and photo patches whose mean per-channel pixel standard deviation is below this are flat (open ocean, the
#: night side's dark land and sea) and left out
MIN_STD = 2.0
#: desktop-icon contexts (freedesktop icon-theme folders) used as classes
ICON_CTX = ["actions", "apps", "devices", "mimetypes", "places", "status"]
#: folder names that a theme uses for a context of :data:`ICON_CTX` (elementary-xfce: ``mimes``)
ICON_CTX_ALIAS = {"mimes": "mimetypes"}
ICON_THEMES = {"train": ("oxygen", "Faenza"), "test": ("elementary-xfce",), "public": ("gnome", "Tango")}
#: Dungeon Crawl Stone Soup tile sheets, cut in 32x32 cells, one class each
TILE_SHEETS = ("floor", "wall", "feat", "main", "player", "gui")
TILE_NAMES = ["floor", "wall", "feature", "item", "monster-or-player", "gui-spell"]
TILE_BANDS = {"train": (0.0, 0.6), "test": (0.6, 0.8), "public": (0.8, 1.0)}
#: brain tissue from the MNI ICBM152 2009a template in nilearn (T1, grey- and white-matter probability maps)
TISSUES = ["grey-matter", "white-matter", "other"]
BRAIN_PER_CLASS = {"train": 1000, "test": 300}

#: every builder and the sets it writes (train, then test, then the public part: the order of :func:`_dedup`)
SETS = {
    "emoji": ("emoji-train", "emoji-test", "pub-emoji", "emoji-tone-train", "emoji-tone-test"),
    "openmoji": ("openmoji-train", "openmoji-test", "pub-openmoji"),
    "planets": ("planets-train", "planets-test", "pub-planets", "planets-grey-train", "planets-grey-test"),
    "icons": ("icons-train", "icons-test", "pub-icons"),
    "tiles": ("tiles-train", "tiles-test", "pub-tiles"),
    "brain": ("brain-train", "brain-test"),
    "material": ("pub-material",),
    "flags": ("pub-flags",),
    "earth": ("pub-earth",),
}
NAMES = tuple(n for names in SETS.values() for n in names)

def data_dir() -> Path:
    return Path(os.environ.get("GSD_BENCH_DATA", "~/.cache/gsd-bench")).expanduser() / "heldout6"


def _npm(pkg: str) -> Path:
    d = Path(os.environ.get("GSD_BENCH_NPM", "~/.cache/gsd-bench/npm/node_modules")).expanduser() / pkg
    if not d.is_dir():
        raise SystemExit(f"{d} is missing: {INSTALL}")
    return d


def _deb(path: str) -> Path:
    p = Path(os.environ.get("GSD_BENCH_ROOT", "/")) / path.lstrip("/")
    if not p.exists():
        raise SystemExit(f"{p} is missing: {INSTALL}")
    return p


def _in_test(key: str, salt: str, parts: int = 4) -> bool:
    """A fixed split by item: one item in ``parts`` goes to the test part (sha256 of the salted key)."""
    return int(hashlib.sha256(f"gsd-issue-52:{salt}:{key}".encode()).hexdigest(), 16) % parts == 0


def _flatten(rgba: np.ndarray) -> np.ndarray:
    """An (H, W, 4) uint8 image composited on :data:`BG` (alpha over), as (H, W, 3) uint8."""
    a = rgba[..., 3:4].astype(np.float64) / 255
    return np.round(rgba[..., :3] * a + np.array(BG, np.float64) * (1 - a)).astype(np.uint8)


def _rgb(src: Path | bytes, size: int = 32) -> np.ndarray:
    """An image file (or its bytes) flattened on :data:`BG`, then resized to ``size`` x ``size`` RGB (Lanczos)."""
    from PIL import Image

    im = Image.open(io.BytesIO(src) if isinstance(src, bytes) else src).convert("RGBA")
    base = Image.new("RGBA", im.size, BG + (255,))
    base.alpha_composite(im)
    return np.asarray(base.convert("RGB").resize((size, size), Image.LANCZOS), dtype=np.uint8)


def _hashes(x: np.ndarray) -> list[str]:
    return [hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest() for a in x]


def _dedup(sets: Sets, order: tuple[str, ...]) -> Sets:
    """The sets ``order`` (train, test, public) without exact duplicates: an image that an earlier set holds is left
    out, a part keeps the first of its copies of an image, and none where the copies carry different labels."""
    seen: set[str] = set()
    out = dict(sets)
    for name in order:
        x, y, classes = sets[name]
        hs = _hashes(x)
        labels: dict[str, set[int]] = {}
        for h, lab in zip(hs, y):
            labels.setdefault(h, set()).add(int(lab))
        keep, first = [], set()
        for i, h in enumerate(hs):
            if h not in seen and h not in first and len(labels[h]) == 1:
                keep.append(i)
            first.add(h)
        seen |= first
        out[name] = (x[keep], y[keep], classes)
    return out


def _patches(img: np.ndarray, size: int, n: int, rng: np.random.Generator, seen: set[str]) -> np.ndarray:
    """``n`` patches of ``size`` at distinct random positions of ``img`` (one band), leaving out flat ones
    (:data:`MIN_STD`) and exact copies of a patch in ``seen`` (hashes, updated) or drawn before."""
    h, w = img.shape[:2]
    drawn = band_patches(img, size, min(4 * n, (h - size + 1) * (w - size + 1)), rng)
    sd = drawn.astype(np.float64).reshape(len(drawn), size, size, -1).std(axis=(1, 2)).mean(axis=1)
    keep = []
    for i, hsh in enumerate(_hashes(drawn)):
        if sd[i] >= MIN_STD and hsh not in seen and len(keep) < n:
            keep.append(i)
            seen.add(hsh)
    if len(keep) < n:
        raise SystemExit(f"a {h}x{w} band gave {len(keep)} distinct patches with content, asked for {n}")
    return drawn[keep]


# --- emoji (npm emoji-datasource-twitter / -google 16.0.0) ------------------------------------------------------

def emoji_sets() -> Sets:
    """``emoji``: 9 categories, both vendors' 64 px images of the base emoji (one code in four, by hash, is test);
    ``pub-emoji``: the Google images of ``emoji-test`` (a candidate of the non-emoji tasks and of ``openmoji`` only);
    ``emoji-tone``: skin tone (6 classes) of the 316 People & Body emoji that have the five single-tone variants,
    both vendors (one base emoji in four is test, with all its tones)."""
    out: dict[str, tuple[list, list]] = {k: ([], []) for k in ("emoji-train", "emoji-test", "emoji-tone-train",
                                                                "emoji-tone-test")}
    google: list[bool] = []  # whether each emoji-test row is Google's
    for vendor in VENDORS:
        root = _npm(f"emoji-datasource-{vendor}")
        img = root / "img" / vendor / "64"
        for e in json.loads((root / "emoji.json").read_text()):
            if e["category"] not in EMOJI_CATS or not e.get(f"has_img_{vendor}"):
                continue
            part = "test" if _in_test(e["unified"], "emoji") else "train"
            xs, ys = out[f"emoji-{part}"]
            xs.append(_rgb(img / e["image"]))
            ys.append(EMOJI_CATS.index(e["category"]))
            if part == "test":
                google.append(vendor == "google")
            sv = e.get("skin_variations") or {}
            if all(t in sv for t in TONES):
                part = "test" if _in_test(e["unified"], "tone") else "train"
                xs, ys = out[f"emoji-tone-{part}"]
                for k, im in enumerate([e["image"]] + [sv[t]["image"] for t in TONES]):
                    xs.append(_rgb(img / im))
                    ys.append(k)
    names = {"emoji": EMOJI_CATS, "emoji-tone": TONE_NAMES}
    sets = {k: (np.stack(xs), np.array(ys, np.int64), names[k.rsplit("-", 1)[0]]) for k, (xs, ys) in out.items()}
    x, y, _ = sets["emoji-test"]
    sets["pub-emoji"] = (x[np.array(google)], y[np.array(google)], EMOJI_CATS)
    sets = _dedup(_dedup(sets, ("emoji-train", "emoji-test")), ("emoji-tone-train", "emoji-tone-test"))  # 2 tasks
    test = set(_hashes(sets["emoji-test"][0]))  # pub-emoji: only the rows that emoji-test kept
    x, y, _ = sets["pub-emoji"]
    keep = [i for i, h in enumerate(_hashes(x)) if h in test]
    sets["pub-emoji"] = (x[keep], y[keep], EMOJI_CATS)
    return _dedup(sets, ("pub-emoji",))


# --- OpenMoji (npm openmoji 17.0.0, colour SVG) ----------------------------------------------------------------

def _svg(path: Path) -> bytes:
    """An SVG rendered to a 64x64 RGBA PNG (cairosvg), the size of the other emoji sources."""
    try:
        import cairosvg
    except ImportError:
        raise SystemExit(f"cairosvg is missing (OpenMoji's images are SVG): {INSTALL}") from None
    return cairosvg.svg2png(url=str(path), output_width=64, output_height=64)


def openmoji_sets() -> Sets:
    """``openmoji``: OpenMoji's colour SVGs rendered at 64 px and resized to 32x32 RGB, labelled by their 9 standard
    groups: every emoji without a skin tone, and of each of the 330 People & Body emoji that have the five single-tone
    variants one variant (its tone picked by hash), so that People & Body is 31% of the set rather than 61%; multi-tone
    variants left out. One emoji in four (a base emoji with its variant) is test. ``pub-openmoji``: the emoji without
    a skin tone, all of them: the same images as ``openmoji``, for a round where ``openmoji`` is not a private task."""
    root = _npm("openmoji")
    rows = [e for e in json.loads((root / "data" / "openmoji.json").read_text()) if e["group"] in OPENMOJI_GROUPS]
    out: dict[str, tuple[list, list]] = {k: ([], []) for k in SETS["openmoji"]}
    for e in rows:
        base = e["skintone_base_hexcode"] or e["hexcode"]
        tone = str(e["skintone"])  # "" (none), "1" ... "5" (single tone) or "1,2" ... (multi-tone)
        if tone and tone != str(1 + int(hashlib.sha256(f"gsd-issue-52:om-tone:{base}".encode()).hexdigest(), 16) % 5):
            continue
        im = _rgb(_svg(root / "color" / "svg" / f"{e['hexcode']}.svg"))
        label = OPENMOJI_GROUPS.index(e["group"])
        names = ["openmoji-test" if _in_test(base, "openmoji") else "openmoji-train"] + ([] if tone else ["pub-openmoji"])
        for name in names:
            out[name][0].append(im)
            out[name][1].append(label)
    sets = {k: (np.stack(xs), np.array(ys, np.int64), OPENMOJI_GROUPS) for k, (xs, ys) in out.items()}
    return _dedup(_dedup(sets, ("openmoji-train", "openmoji-test")), ("pub-openmoji",))


# --- planets (Debian openuniverse-common) -------------------------------------------------------------------------

def _map(body: str) -> np.ndarray:
    from PIL import Image

    im = Image.open(_deb(f"/usr/share/openuniverse/textures/{body}.jpg")).convert("RGB").resize((1024, 512), Image.LANCZOS)
    a = np.asarray(im, dtype=np.uint8)
    return a[int(0.15 * 512): int(0.85 * 512)]


def planet_sets(seed: int = 71) -> Sets:
    """``planets`` (32x32 RGB), ``pub-planets`` (32x32 RGB, another band: the untransformed source of
    ``planets-grey``) and ``planets-grey`` (28x28 grey, rotated 90 degrees, contrast stretched: the one round-6 task
    with a transformed copy of its source among its candidates). Flat patches (open ocean) are left out."""
    rng = np.random.default_rng(seed)
    maps = [_map(b) for b in BODIES]
    seen: set[str] = set()
    out = {}
    for part, (a, b) in MAP_BANDS.items():
        grey = part.startswith("grey")
        size = 28 if grey else 32
        xs, ys = [], []
        for label, m in enumerate(maps):
            w = m.shape[1]
            p = _patches(m[:, int(a * w): int(b * w)], size, MAP_PER_CLASS[part], rng, seen)
            if grey:
                g = p.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
                lo, hi = g.min(axis=(1, 2), keepdims=True), g.max(axis=(1, 2), keepdims=True)
                p = np.rot90(np.round(255 * (g - lo) / np.maximum(hi - lo, 1)), 1, axes=(1, 2)).astype(np.uint8)
            xs.append(p)
            ys += [label] * len(p)
        name = {"train": "planets-train", "test": "planets-test", "public": "pub-planets",
                "grey-train": "planets-grey-train", "grey-test": "planets-grey-test"}[part]
        out[name] = (np.concatenate(xs), np.array(ys, np.int64), list(BODIES))
    return _dedup(out, SETS["planets"])


# --- desktop icons (Debian icon themes) --------------------------------------------------------------------------

def _theme_files(theme: str) -> list[tuple[Path, int]]:
    """(file, context) of a theme's distinct 48x48 PNG icons (32x32 for Tango, which has no 48x48 PNGs); links and
    byte-identical copies left out. A context folder may have another name (:data:`ICON_CTX_ALIAS`)."""
    root = _deb(f"/usr/share/icons/{theme}")
    px = "32" if theme == "Tango" else "48"
    sizes = {f"{px}x{px}", px}  # gnome, oxygen, Tango: 48x48/<context>/; Faenza, elementary-xfce: <context>/48/
    seen, out = set(), []
    for p in sorted(root.rglob("*.png")):
        parts = p.relative_to(root).parts
        ctx = [ICON_CTX_ALIAS.get(c, c) for c in parts[:-1] if ICON_CTX_ALIAS.get(c, c) in ICON_CTX]
        if p.is_symlink() or not ctx or not sizes & set(parts[:-1]):
            continue
        h = hashlib.md5(p.read_bytes()).hexdigest()
        if h not in seen:
            seen.add(h)
            out.append((p, ICON_CTX.index(ctx[0])))
    return out


def icon_sets() -> Sets:
    """``icons`` (train: oxygen and Faenza; test: elementary-xfce) and ``pub-icons`` (gnome and Tango): 32x32 RGB on
    white, labelled by the icon's freedesktop context."""
    out = {}
    for part, themes in ICON_THEMES.items():
        files = [f for t in themes for f in _theme_files(t)]
        name = "pub-icons" if part == "public" else f"icons-{part}"
        out[name] = (np.stack([_rgb(p) for p, _ in files]), np.array([c for _, c in files], np.int64), ICON_CTX)
    return _dedup(out, SETS["icons"])


# --- Dungeon Crawl tiles (Debian crawl-tiles-data) ----------------------------------------------------------------

def tile_sets() -> Sets:
    """``tiles`` and ``pub-tiles``: the non-empty 32x32 cells (more than 50 pixels not transparent) of six tile sheets,
    flattened on white, labelled by sheet; each sheet's cell rows split in bands :data:`TILE_BANDS`. The floor and wall
    sheets are 32x32 tiles on the grid. The other four pack sprites cropped to their content, so that a cell there
    often holds parts of two sprites (the tile positions are compiled into the game, not shipped)."""
    from PIL import Image

    out = {}
    sheets = [np.asarray(Image.open(_deb(f"/usr/share/crawl/dat/tiles/{s}.png")).convert("RGBA")) for s in TILE_SHEETS]
    for part, (lo, hi) in TILE_BANDS.items():
        xs, ys = [], []
        for label, a in enumerate(sheets):
            rows = a.shape[0] // 32
            for r in range(int(round(lo * rows)), int(round(hi * rows))):
                for c in range(a.shape[1] // 32):
                    cell = a[32 * r: 32 * r + 32, 32 * c: 32 * c + 32]
                    if (cell[..., 3] > 0).sum() > 50:
                        xs.append(_flatten(cell))
                        ys.append(label)
        name = "pub-tiles" if part == "public" else f"tiles-{part}"
        out[name] = (np.stack(xs), np.array(ys, np.int64), TILE_NAMES)
    return _dedup(out, SETS["tiles"])


# --- brain MRI (pip nilearn 0.14.1: MNI ICBM152 2009a) ------------------------------------------------------------

def _nifti(path: Path) -> np.ndarray:
    """A NIfTI-1 volume (gzip), scaled by its slope and intercept, without nibabel."""
    raw = gzip.open(path).read()
    dims = np.frombuffer(raw, "<i2", 8, 40)
    dtype = {2: "u1", 4: "<i2", 8: "<i4", 16: "<f4", 64: "<f8", 512: "<u2"}[int(np.frombuffer(raw, "<i2", 1, 70)[0])]
    off = int(np.frombuffer(raw, "<f4", 1, 108)[0])
    slope, inter = (float(v) for v in np.frombuffer(raw, "<f4", 2, 112))
    shape = tuple(int(d) for d in dims[1: 1 + dims[0]])
    v = np.frombuffer(raw, dtype, int(np.prod(shape)), off).reshape(shape, order="F").astype(np.float64)
    return v * (slope or 1.0) + inter


def brain_sets(seed: int = 73) -> Sets:
    """``brain``: 28x28 grey patches of axial T1 slices (anterior up) labelled by the tissue at their centre voxel
    (grey-matter probability >= 0.5, white-matter >= 0.5, or both below 0.1 inside the brain mask of the template,
    which is skull-stripped: mostly the cerebrospinal fluid of the ventricles and sulci). Slices of the lower 55% of
    the brain's extent are training, a gap of 6 slices, the rest test (no voxel shared)."""
    spec = importlib.util.find_spec("nilearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"nilearn is missing: {INSTALL}")
    d = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data"
    t1, gm, wm = (_nifti(d / f"mni_icbm152_{k}_tal_nlin_sym_09a_converted.nii.gz") for k in ("t1", "gm", "wm"))
    gm, wm = gm / 255, wm / 255  # nilearn's "converted" maps store the probabilities as uint8 0..255
    t1 = np.round(255 * np.clip(t1 / np.percentile(t1, 99.5), 0, 1)).astype(np.uint8)
    head = np.flatnonzero((t1 > 20).any(axis=(0, 1)))
    z0, z1 = head[0], head[-1]
    cut = z0 + int(0.55 * (z1 - z0))
    zs = {"train": range(z0, cut), "test": range(cut + 6, z1 + 1)}
    rng = np.random.default_rng(seed)
    lab = np.full(t1.shape, -1, np.int64)
    lab[gm >= 0.5] = 0
    lab[wm >= 0.5] = 1
    lab[(gm < 0.1) & (wm < 0.1) & (t1 > 20)] = 2
    h = 14
    out = {}
    for part, z in zs.items():
        xs, ys = [], []
        valid = np.zeros_like(lab, bool)
        valid[h: -h, h: -h, list(z)] = True
        for c in range(3):
            idx = np.flatnonzero((lab == c) & valid)
            pick = rng.choice(idx, BRAIN_PER_CLASS[part], replace=False)
            for i, j, k in zip(*np.unravel_index(pick, lab.shape)):
                xs.append(t1[i - h: i + h, j - h: j + h, k].T[::-1])
                ys.append(c)
        out[f"brain-{part}"] = (np.stack(xs), np.array(ys, np.int64), TISSUES)
    return _dedup(out, SETS["brain"])


# --- public candidates that no private task uses ------------------------------------------------------------------

def material_set() -> Sets:
    """``pub-material``: material-design-icons 3.0.1, black 48dp web icons (1x_web), 32x32 RGB on white, labelled by
    category (the 10 categories with at least 40 icons)."""
    root = _npm("material-design-icons")
    cats = sorted(c.name for c in root.iterdir() if (c / "1x_web").is_dir()
                  and len(list((c / "1x_web").glob("*_black_48dp.png"))) >= 40)
    files = [(p, k) for k, c in enumerate(cats) for p in sorted((root / c / "1x_web").glob("*_black_48dp.png"))]
    sets = {"pub-material": (np.stack([_rgb(p) for p, _ in files]), np.array([k for _, k in files], np.int64), cats)}
    return _dedup(sets, SETS["material"])


def flag_set() -> Sets:
    """``pub-flags``: freeciv's flags of 568 nations, each as a flag and as a shield (2 classes), 32x32 RGB on white."""
    d = _deb("/usr/share/games/freeciv/flags")
    nations = sorted(p.name[: -len("-shield-large.png")] for p in d.glob("*-shield-large.png"))
    xs, ys = [], []
    for n in nations:
        for k, suffix in enumerate(("-large.png", "-shield-large.png")):
            xs.append(_rgb(d / f"{n}{suffix}"))
            ys.append(k)
    return _dedup({"pub-flags": (np.stack(xs), np.array(ys, np.int64), ["flag", "shield"])}, SETS["flags"])


def earth_set(seed: int = 79) -> Sets:
    """``pub-earth``: 32x32 RGB patches of xplanet's Earth by day (Blue Marble) and by night (city lights), 800 each,
    rows 150-874 of 1024; flat patches (open ocean, unlit land) left out."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    xs = [_patches(np.asarray(Image.open(_deb(f"/usr/share/xplanet/images/{f}.jpg")).convert("RGB"))[150:874], 32, 800,
                   rng, seen) for f in ("earth", "night")]
    return {"pub-earth": (np.concatenate(xs), np.repeat(np.arange(2), 800).astype(np.int64), ["day", "night"])}


BUILDERS = {"emoji": emoji_sets, "openmoji": openmoji_sets, "planets": planet_sets, "icons": icon_sets,
            "tiles": tile_sets, "brain": brain_sets, "material": material_set, "flags": flag_set, "earth": earth_set}


def build(which: list[str] | None = None, force: bool = False) -> dict[str, int]:
    """Write the sets of the builders ``which`` (default all); a builder whose files all exist is skipped (its sets
    are read back for the counts) unless ``force``."""
    out = data_dir()
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for b in which or list(BUILDERS):
        if b not in BUILDERS:
            raise SystemExit(f"unknown builder {b!r}; one of {sorted(BUILDERS)}")
        if not force and all((out / f"{n}.npz").is_file() for n in SETS[b]):
            counts.update({n: int(np.load(out / f"{n}.npz")["y"].shape[0]) for n in SETS[b]})
            continue
        sets = BUILDERS[b]()
        assert set(sets) == set(SETS[b]), (b, sorted(sets))
        for name, (x, y, classes) in sets.items():
            np.savez_compressed(out / f"{name}.npz", x=x, y=y.astype(np.int64), classes=np.array(classes))
            counts[name] = len(y)
    return counts


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks validity.heldout.round6.prepare6 [BUILDER...] [--force]``: build the npz files (every builder's,
    or those of the BUILDERs named) and print each set's examples."""
    import argparse

    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description="build round 6's npz files (SOURCES.md)")
    ap.add_argument("builders", nargs="*", metavar="BUILDER", help=f"only these (default: all of {', '.join(sorted(BUILDERS))})")
    ap.add_argument("--force", action="store_true", help="rebuild where the files exist")
    a = ap.parse_intermixed_args(argv)  # BUILDERs and --force in any order, as before
    for k, v in build(a.builders or None, force=a.force).items():
        print(f"{k}\t{v}")


if __name__ == "__main__":
    main()
