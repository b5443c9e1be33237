"""Round 7's desktop icons (the ``icons-paper`` task of SOURCES.md): freedesktop icon themes from Debian packages,
labelled by the icon's context (the folder it lies in), as 32x32 RGB on white (:func:`.prepare7._rgb`).

- ``paper-train``: Paper and Moka (one designer's two themes), 48x48 PNG; ``apps`` capped (:data:`APPS_CAP`)
- ``paper-test``: MATE, 48x48 PNG (only 17 ``places`` icons)
- ``pub-adwaita``: Adwaita, 48x48 PNG (1 ``apps`` icon; ≈ 90% are pre-rendered black ``.symbolic.png`` icons; its
  full-colour ``legacy/`` folder has no context and is not read)
- ``pub-icons-svg``: Numix (``48/`` and ``scalable/``) and Suru (``<context>/scalable/``) SVG, rendered at
  :data:`SVG_PX` px (:func:`.prepare7.svg_png`); SVGs that fail to render or render blank are left out. Many are
  monochrome and kept: 31% are ``-symbolic`` by name (Numix's ``scalable/`` nearly all), ≈ 55% render grey only
  (Suru's ``actions`` too); Numix's ``places`` are mostly folders in several colours.

Symbolic links and byte-identical files are left out of each part; then :func:`.prepare7._dedup` leaves out an image
that an earlier part holds (train, test, then each public set against the two private parts only).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

from .prepare7 import SETS, Sets, _dedup, _rgb, deb, svg_png

#: the 6 freedesktop contexts (a theme's folder names) used as classes
CTX = ["actions", "apps", "devices", "mimetypes", "places", "status"]
#: folder names that a theme may use for a context of :data:`CTX`
CTX_ALIAS = {"mimes": "mimetypes"}
#: the PNG parts and their themes, read from ``/usr/share/icons/<theme>/<PNG_DIR>/<context>/*.png``
PNG_THEMES = {"paper-train": ("Paper", "Moka"), "paper-test": ("mate",), "pub-adwaita": ("Adwaita",)}
#: one size per theme: Paper's and Moka's other sizes hold the same icons (rescaled), so they add no designs
PNG_DIR = "48x48"
#: the most ``apps`` icons that ``paper-train`` keeps: the first ones in the order of :func:`_order` (SOURCES.md's
#: choice). The 48x48 files hold far fewer distinct images than SOURCES.md counted (Paper apps 373 of 1,162, mimetypes
#: 48 of 262): train has 975 distinct apps icons and 279 others, so no cap brings it to 2,000 (none: 1,254, 78% apps): the
#: task runs at 500 private examples only, and the cap keeps apps near half of train (the test theme has 10% apps)
APPS_CAP = 300
#: the SVG folders of ``pub-icons-svg`` under ``/usr/share/icons`` (``{ctx}``: the context folder; one missing is
#: skipped: Numix has no ``48/actions``, no ``scalable/apps``)
SVG_DIRS = ("Numix/48/{ctx}", "Numix/scalable/{ctx}", "suru/{ctx}/scalable")
#: the size SVGs are rendered at before :func:`.prepare7._rgb` resizes them to 32x32
SVG_PX = 64
#: a rendered SVG whose 32x32 RGB stays within this of white everywhere is blank (nothing drawn, or pure white on clear)
BLANK = 8


def _order(p: Path) -> str:
    """A fixed order of files that mixes the themes (sha256 of ``<theme>/48x48/<context>/<name>``)."""
    return hashlib.sha256(f"gsd-issue-62:icons:{'/'.join(p.parts[-4:])}".encode()).hexdigest()


def _distinct(files: list[Path], seen: set[str]) -> list[Path]:
    """The regular files of ``files`` (symbolic links left out) whose bytes are not in ``seen`` (md5; updated)."""
    out = []
    for p in files:
        if p.is_symlink() or not p.is_file():
            continue
        h = hashlib.md5(p.read_bytes()).hexdigest()
        if h not in seen:
            seen.add(h)
            out.append(p)
    return out


def _ctx_dirs(root: Path) -> list[tuple[Path, int]]:
    """(folder, class) of the context folders under ``root`` (:data:`CTX`, under their :data:`CTX_ALIAS` names too)."""
    return [(d, CTX.index(CTX_ALIAS.get(d.name, d.name))) for d in sorted(root.iterdir())
            if d.is_dir() and not d.is_symlink() and CTX_ALIAS.get(d.name, d.name) in CTX]


def png_files(themes: tuple[str, ...], apps_cap: int | None = None) -> list[tuple[Path, int]]:
    """(file, class) of the distinct :data:`PNG_DIR` PNG icons of ``themes``; at most ``apps_cap`` ``apps`` icons
    (the first in :func:`_order`), all icons of the other contexts."""
    seen: set[str] = set()
    out = []
    for theme in themes:
        for d, c in _ctx_dirs(deb(f"/usr/share/icons/{theme}/{PNG_DIR}")):
            out += [(p, c) for p in _distinct(sorted(d.glob("*.png")), seen)]
    if apps_cap is not None:
        apps = sorted((f for f in out if CTX[f[1]] == "apps"), key=lambda f: _order(f[0]))
        out = [f for f in out if CTX[f[1]] != "apps"] + apps[:apps_cap]
    return out


def png_set(themes: tuple[str, ...], apps_cap: int | None = None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A part made of the PNG icons of ``themes`` (:func:`png_files`), 32x32 RGB on white."""
    files = png_files(themes, apps_cap)
    return np.stack([_rgb(p) for p, _ in files]), np.array([c for _, c in files], np.int64), CTX


def svg_files() -> list[tuple[Path, int]]:
    """(file, class) of the distinct SVG icons of :data:`SVG_DIRS`."""
    root, seen, out = deb("/usr/share/icons"), set(), []
    for c, ctx in enumerate(CTX):
        for pattern in SVG_DIRS:
            for name in [ctx] + [a for a, k in CTX_ALIAS.items() if k == ctx]:
                d = root / pattern.format(ctx=name)
                if d.is_dir():
                    out += [(p, c) for p in _distinct(sorted(d.glob("*.svg")), seen)]
    return out


def svg_set() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``pub-icons-svg``: :func:`svg_files` rendered at :data:`SVG_PX` px, then 32x32 RGB on white; those that fail
    to render or come out blank (:data:`BLANK`) left out. Prints what was left out and the share of symbolic icons."""
    xs, ys, failed, blank, symbolic = [], [], [], [], 0
    for p, c in svg_files():
        try:
            a = _rgb(svg_png(p.read_bytes(), size=SVG_PX))
        except Exception as e:  # cairosvg raises many kinds on a malformed or unsupported SVG
            failed.append(f"{p} ({type(e).__name__})")
            continue
        if (255 - a.astype(np.int16)).max() <= BLANK:
            blank.append(str(p))
            continue
        xs.append(a)
        ys.append(c)
        symbolic += p.name.endswith("-symbolic.svg")
    print(f"icons7: pub-icons-svg {len(xs)} rendered ({symbolic} symbolic, {symbolic / max(len(xs), 1):.0%}); "
          f"{len(failed)} failed, {len(blank)} blank", file=sys.stderr)
    for f in failed + blank:
        print(f"  left out: {f}", file=sys.stderr)
    return np.stack(xs), np.array(ys, np.int64), CTX


def build() -> Sets:
    """The 4 sets of :data:`.prepare7.SETS` ``["icons"]``, deduplicated: train, test, then each public set against
    train and test only."""
    order = SETS["icons"][1]
    parts = {"paper-train": png_set(PNG_THEMES["paper-train"], APPS_CAP),
             "paper-test": png_set(PNG_THEMES["paper-test"]),
             "pub-adwaita": png_set(PNG_THEMES["pub-adwaita"]),
             "pub-icons-svg": svg_set()}
    out = {}
    for pub in order[2:]:
        out.update(_dedup({k: parts[k] for k in (*order[:2], pub)}, (*order[:2], pub)))
    return out
