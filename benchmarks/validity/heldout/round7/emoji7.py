"""Round 7's emoji sets (builder ``emoji`` of :mod:`.prepare7`; SOURCES.md): Iconify's JSON packages of Microsoft
Fluent Emoji (Flat and Color styles), EmojiOne 2 and 1, Google Noto and Mozilla FxEmoji. Each icon is an SVG body in
``icons.json`` (its own ``width`` / ``height`` where it has them, else the package's), rendered at 64 px with cairosvg
and resized to 32x32 RGB on white. Categories come from each package's ``metadata.json``; Fluent Color has none and
takes Flat's (the same names). Only names listed there are used: Iconify's ``hidden`` names (deprecated ones, among
them Fluent's toned wrestlers, bunny ears and skier, and Noto's ``-tone1`` … names) are not listed, and its
``aliases`` (mirrored or renamed copies of an icon) are left out. cairo fails (``MemoryError``) on two Fluent
Color icons, ``umbrella`` and ``umbrella-with-rain-drops`` (a radial gradient transformed by ``skewY(-90)``): they
are left out, their Flat style kept.

- ``fluent``: Flat + Color, the names without a skin tone, in the 8 categories of :data:`FLUENT_CATS` (``Flags``
  left out); one name in four (sha256, salt ``fluent``) is test, with both styles.
- ``fluent-tone``: the Fluent names with all five single skin tones, 6 classes (:data:`TONE_NAMES`; class 0 the
  name without a tone), both styles; one base name in four (salt ``fluent-tone``) is test, with all its images.
- ``emojione``: EmojiOne 2 + 1, the names without a tone in :data:`EMOJIONE_CATS` (both versions use these names and
  agree on every shared name; 2's ``Modifiers``, the five tone swatches, left out); one name in five (salt
  ``emojione``, :data:`TEST_PARTS`) is test, with both versions.
- ``pub-noto``: Noto's names without a tone in :data:`FLUENT_CATS` (Noto's metadata uses the same Unicode group names).
- ``pub-noto-tone``: Noto's names with all five single tones (``-light-skin-tone`` …), the classes of ``fluent-tone``.
- ``pub-fxemoji``: every FxEmoji icon, labelled by its own categories (:data:`FX_CATS`; no Food or Activities).

A tone variant is found by name (:func:`_tones`): Fluent appends ``-light`` … ``-dark``, Noto and EmojiOne put
``-light-skin-tone`` … at the end or, for hair and beard styles, in the middle (``man-light-skin-tone-beard``); a
name with two tones (couples) is a variant too. A suffix counts as a tone only where the name without it exists and
has at least two tone variants (so ``police-car-light``, the siren, stays an object).

Exact copies are left out with round 6's :func:`_dedup`: within each task (train, then test), and each public set
after the task parts it is a candidate for (``pub-noto`` after ``fluent`` and ``emojione``, ``pub-noto-tone`` after
``fluent-tone``, ``pub-fxemoji`` after ``emojione`` and ``fluent``).
"""

from __future__ import annotations

import functools
import json
import re
from collections import defaultdict

import numpy as np

from ..round6.prepare6 import TONE_NAMES
from .prepare7 import Sets, _dedup, _rgb, in_test, npm, svg_png

#: the Iconify packages (npm ``@iconify-json/<name>``): Fluent's two styles (Flat first: it has the categories)
FLUENT = ("fluent-emoji-flat", "fluent-emoji")
#: EmojiOne 2 and EmojiOne 1
EMOJIONE = ("emojione", "emojione-v1")
NOTO = "noto"
FXEMOJI = "fxemoji"
#: Fluent's (and Noto's) categories, the Unicode emoji groups; ``Flags`` (8 or 9 icons) left out
FLUENT_CATS = ["Smileys & Emotion", "People & Body", "Animals & Nature", "Food & Drink", "Travel & Places",
               "Activities", "Objects", "Symbols"]
#: EmojiOne's categories (1 and 2 alike); 2's ``Modifiers`` left out
EMOJIONE_CATS = ["People", "Nature", "Food", "Activities", "Travel", "Objects", "Symbols", "Flags"]
#: FxEmoji's own categories (every icon is in one)
FX_CATS = ["People", "Nature", "Objects", "Places", "Symbols", "Flags"]
#: a tone in a Fluent name (a suffix) and in a Noto or EmojiOne name (anywhere, as a whole word sequence)
FLUENT_TONE = r"-(light|medium-light|medium|medium-dark|dark)$"
SKIN_TONE = r"-(light|medium-light|medium|medium-dark|dark)-skin-tone(?=-|$)"
#: one item in this many is test (default 4): EmojiOne's 1 in 5, so that its train part holds 2,000 examples (1 in 4
#: left 1,989; set before the round was frozen, before any of its runs)
TEST_PARTS = {"emojione": 5}
#: each public set and the task parts it is deduplicated after (those it is a candidate for)
PUBLIC_AFTER = {"pub-noto": ("fluent-train", "fluent-test", "emojione-train", "emojione-test"),
                "pub-noto-tone": ("fluent-tone-train", "fluent-tone-test"),
                "pub-fxemoji": ("emojione-train", "emojione-test", "fluent-train", "fluent-test")}
SVG = ('<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
       'viewBox="0 0 {w} {h}">{body}</svg>')


@functools.lru_cache(maxsize=None)
def _svgs(pkg: str) -> dict[str, str]:
    """An Iconify package's icons as SVG documents (name -> text); aliases left out."""
    data = json.loads((npm(f"@iconify-json/{pkg}") / "icons.json").read_text())
    w, h = data.get("width", 16), data.get("height", 16)
    return {n: SVG.format(w=d.get("width", w), h=d.get("height", h), body=d["body"]) for n, d in data["icons"].items()}


def _cats(pkg: str) -> dict[str, str]:
    """An Iconify package's categories, name -> category (``metadata.json``; hidden names are in none)."""
    meta = json.loads((npm(f"@iconify-json/{pkg}") / "metadata.json").read_text())
    return {n: c for c, names in sorted(meta.get("categories", {}).items()) for n in names}


@functools.lru_cache(maxsize=None)
def _image(pkg: str, name: str) -> np.ndarray | None:
    """An icon rendered at 64 px, flattened on white and resized to 32x32 RGB (cached: tone bases are used twice);
    None where cairo fails on it (then it is left out)."""
    try:
        return _rgb(svg_png(_svgs(pkg)[name], size=64))
    except MemoryError:  # cairo's CAIRO_STATUS_NO_MEMORY, from a degenerate gradient matrix
        return None


def _tones(names: set[str], pattern: str) -> tuple[set[str], dict[str, list[str]]]:
    """The tone variants among ``names`` (a ``pattern`` match), and the names that have all five single tones, each
    with its 6 names in :data:`TONE_NAMES`' order (itself first). A name with one match is a variant if the name
    without the match exists and has at least two variants; a name with two matches (multi-tone) always is."""
    single: dict[str, dict[str, str]] = defaultdict(dict)
    multi = set()
    for n in names:
        m = list(re.finditer(pattern, n))
        if len(m) > 1:
            multi.add(n)
        elif m and (base := n[:m[0].start()] + n[m[0].end():]) in names:
            single[base][m[0].group(1)] = n
    single = {b: v for b, v in single.items() if len(v) > 1}
    toned = multi | {n for v in single.values() for n in v.values()}
    five = {b: [b] + [v[t] for t in TONE_NAMES[1:]] for b, v in sorted(single.items())
            if len(v) == 5 and b not in toned}
    return toned, five


def _plain(pkg: str, pattern: str, classes: list[str]) -> list[tuple[str, int]]:
    """A package's names without a tone whose category is one of ``classes``, with their labels, sorted by name."""
    cats = _cats(pkg)
    toned, _ = _tones(set(cats), pattern)
    return [(n, classes.index(c)) for n, c in sorted(cats.items()) if n not in toned and c in classes]


def _put(xs: list, ys: list, im: np.ndarray | None, label: int) -> None:
    """Append an image and its label, unless the image could not be rendered."""
    if im is not None:
        xs.append(im)
        ys.append(label)


def _stack(out: dict[str, tuple[list, list]], classes: dict[str, list[str]]) -> Sets:
    """Lists of images and labels as arrays, with each set's class names."""
    return {k: (np.stack(xs), np.array(ys, np.int64), classes[k]) for k, (xs, ys) in out.items()}


def task_sets() -> Sets:
    """The private tasks' parts: ``fluent``, ``fluent-tone`` and ``emojione``, train and test, before deduplication."""
    out: dict[str, tuple[list, list]] = {f"{t}-{p}": ([], []) for t in ("fluent", "fluent-tone", "emojione")
                                         for p in ("train", "test")}

    def add(task: str, key: str, pkgs: tuple[str, ...], items: list[tuple[str, int]]) -> None:
        xs, ys = out[f"{task}-{'test' if in_test(key, task, TEST_PARTS.get(task, 4)) else 'train'}"]
        for pkg in pkgs:
            for name, label in items:
                _put(xs, ys, _image(pkg, name), label)

    for name, label in _plain(FLUENT[0], FLUENT_TONE, FLUENT_CATS):
        add("fluent", name, FLUENT, [(name, label)])
    _, five = _tones(set(_cats(FLUENT[0])), FLUENT_TONE)
    for base, names in five.items():
        add("fluent-tone", base, FLUENT, list(zip(names, range(len(TONE_NAMES)))))
    for pkg in EMOJIONE:
        for name, label in _plain(pkg, SKIN_TONE, EMOJIONE_CATS):
            add("emojione", name, (pkg,), [(name, label)])
    classes = {"fluent": FLUENT_CATS, "fluent-tone": TONE_NAMES, "emojione": EMOJIONE_CATS}
    return _stack(out, {k: classes[k.rsplit("-", 1)[0]] for k in out})


def public_sets() -> Sets:
    """``pub-noto``, ``pub-noto-tone`` and ``pub-fxemoji``, before deduplication."""
    out: dict[str, tuple[list, list]] = {k: ([], []) for k in ("pub-noto", "pub-noto-tone", "pub-fxemoji")}
    for name, label in _plain(NOTO, SKIN_TONE, FLUENT_CATS):
        _put(*out["pub-noto"], _image(NOTO, name), label)
    _, five = _tones(set(_cats(NOTO)), SKIN_TONE)
    for names in five.values():
        for label, name in enumerate(names):
            _put(*out["pub-noto-tone"], _image(NOTO, name), label)
    for name, cat in sorted(_cats(FXEMOJI).items()):
        if cat in FX_CATS:
            _put(*out["pub-fxemoji"], _image(FXEMOJI, name), FX_CATS.index(cat))
    return _stack(out, {"pub-noto": FLUENT_CATS, "pub-noto-tone": TONE_NAMES, "pub-fxemoji": FX_CATS})


def build() -> Sets:
    """Every emoji set of :data:`.prepare7.SETS` (``emoji``), deduplicated: each task's train then test part, then
    each public set after the task parts of :data:`PUBLIC_AFTER`."""
    sets = task_sets()
    for task in ("fluent", "fluent-tone", "emojione"):
        sets = _dedup(sets, (f"{task}-train", f"{task}-test"))
    sets.update(public_sets())
    for pub, after in PUBLIC_AFTER.items():
        sets[pub] = _dedup(sets, after + (pub,))[pub]
    return sets
