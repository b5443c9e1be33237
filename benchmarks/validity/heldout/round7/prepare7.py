"""Round 7's data (issue 62; the tasks and candidates: ``rounds/round7.json``): npz files built from real images that
ship in installable packages no earlier round used, written to ``$GSD_BENCH_DATA/heldout7`` (default
``~/.cache/gsd-bench/heldout7``). Benchmark-only: none of these packages is a dependency of gsd or of CI. SOURCES.md
beside this file says what each source is, its licence and what was checked.

Install (the data is inside the packages; nothing is downloaded at run time)::

    npm install --prefix ~/.cache/gsd-bench/npm @iconify-json/fluent-emoji-flat@1.2.6 @iconify-json/fluent-emoji@1.2.7 \\
        @iconify-json/noto@1.2.9 @iconify-json/emojione@1.2.3 @iconify-json/emojione-v1@1.2.3 @iconify-json/fxemoji@1.2.2
    apt-get install paper-icon-theme moka-icon-theme mate-icon-theme adwaita-icon-theme numix-icon-theme \\
        suru-icon-theme gnome-cards-data kdegames-card-data-kf5 librsvg2-bin <the font packages of FONT_PACKAGES>
    pip install cairosvg==2.9.1                # renders the SVGs (needs the system's libcairo)

``$GSD_BENCH_NPM`` overrides the npm folder (default ``~/.cache/gsd-bench/npm/node_modules``); ``$GSD_BENCH_ROOT``
prefixes the Debian paths (default ``/``).

Every array ``x`` is uint8 (N, 32, 32, 3), ``y`` int64, ``classes`` the class names; transparent images are flattened
on white. Splits are by item (an emoji name with all its styles and tones, an icon theme, a font family, a card deck),
and an image byte for byte the same as one of an earlier part of its task (train, then test, then the public sets
built with it) is left out (round 6's :func:`_dedup`). The builders live in modules named for their kind
(:mod:`.emoji7`, :mod:`.icons7`, :mod:`.glyphs7`, :mod:`.cards7`); this module holds what they share and the one
``build``. The round's runner makes every set resolvable by name.

    python -m benchmarks validity --round 7 prepare [--force]                       # every builder; idempotent
    python -m benchmarks validity.heldout.round7.prepare7 [--force] [BUILDER ...]   # some builders
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path

import numpy as np

from ..round6.prepare6 import BG, Sets, _dedup, _flatten, _hashes, _rgb  # noqa: F401  (shared with the builders)

FONT_PACKAGES = ("fonts-adf-accanthis fonts-adf-baskervald fonts-adf-berenis fonts-adf-gillius fonts-adf-ikarius "
                 "fonts-adf-irianis fonts-adf-libris fonts-adf-mekanus fonts-adf-oldania fonts-adf-romande "
                 "fonts-adf-solothurn fonts-adf-switzera fonts-adf-tribun fonts-adf-universalis fonts-adf-verana "
                 "fonts-lmodern fonts-texgyre fonts-urw-base35 fonts-lato fonts-roboto-unhinted fonts-open-sans "
                 "fonts-linuxlibertine fonts-cantarell fonts-ebgaramond fonts-comic-neue fonts-crosextra-carlito "
                 "fonts-crosextra-caladea fonts-hack fonts-inconsolata fonts-noto-core fonts-noto-extra fonts-liberation "
                 "fonts-freefont-ttf fonts-dejavu-core")
INSTALL = ("npm install --prefix ~/.cache/gsd-bench/npm @iconify-json/fluent-emoji-flat@1.2.6 "
           "@iconify-json/fluent-emoji@1.2.7 @iconify-json/noto@1.2.9 @iconify-json/emojione@1.2.3 "
           "@iconify-json/emojione-v1@1.2.3 @iconify-json/fxemoji@1.2.2; apt-get install paper-icon-theme "
           "moka-icon-theme mate-icon-theme adwaita-icon-theme numix-icon-theme suru-icon-theme gnome-cards-data "
           f"kdegames-card-data-kf5 librsvg2-bin {FONT_PACKAGES}; pip install cairosvg==2.9.1")

#: every builder's module (under this package) and the sets it writes, in :func:`_dedup`'s order (train, test,
#: then the public sets built with them)
SETS = {
    "emoji": ("emoji7", ("fluent-train", "fluent-test", "fluent-tone-train", "fluent-tone-test", "emojione-train",
                         "emojione-test", "pub-noto", "pub-noto-tone", "pub-fxemoji")),
    "icons": ("icons7", ("paper-train", "paper-test", "pub-adwaita", "pub-icons-svg")),
    "glyphs": ("glyphs7", ("font-letters-train", "font-letters-test", "font-digits-train", "font-digits-test",
                           "pub-noto-letters", "pub-noto-digits")),
    "cards": ("cards7", ("cards-train", "cards-test", "cards-rank-train", "cards-rank-test", "pub-kde-cards",
                         "pub-kde-ranks")),
}
NAMES = tuple(n for _, names in SETS.values() for n in names)


def data_dir() -> Path:
    return Path(os.environ.get("GSD_BENCH_DATA", "~/.cache/gsd-bench")).expanduser() / "heldout7"


def npm(pkg: str) -> Path:
    """An npm package's folder (``$GSD_BENCH_NPM``); missing, it stops with the install line."""
    d = Path(os.environ.get("GSD_BENCH_NPM", "~/.cache/gsd-bench/npm/node_modules")).expanduser() / pkg
    if not d.is_dir():
        raise SystemExit(f"{d} is missing: {INSTALL}")
    return d


def deb(path: str) -> Path:
    """A path a Debian package installs (``$GSD_BENCH_ROOT`` prefixes it); missing, it stops with the install line."""
    p = Path(os.environ.get("GSD_BENCH_ROOT", "/")) / path.lstrip("/")
    if not p.exists():
        raise SystemExit(f"{p} is missing: {INSTALL}")
    return p


def in_test(key: str, salt: str, parts: int = 4) -> bool:
    """A fixed split by item: one item in ``parts`` goes to the test part (sha256 of the salted key)."""
    return int(hashlib.sha256(f"gsd-issue-62:{salt}:{key}".encode()).hexdigest(), 16) % parts == 0


def svg_png(svg: bytes | str, size: int = 64) -> bytes:
    """An SVG document rendered to a ``size`` x ``size`` RGBA PNG (cairosvg)."""
    try:
        import cairosvg
    except ImportError:
        raise SystemExit(f"cairosvg is missing (round 7 renders SVGs): {INSTALL}") from None
    data = svg.encode() if isinstance(svg, str) else svg
    return cairosvg.svg2png(bytestring=data, output_width=size, output_height=size)


def build(which: list[str] | None = None, force: bool = False) -> dict[str, int]:
    """Write the sets of the builders ``which`` (default all); a builder whose files all exist is skipped (its sets
    are read back for the counts) unless ``force``."""
    out = data_dir()
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for b in which or list(SETS):
        if b not in SETS:
            raise SystemExit(f"unknown builder {b!r}; one of {sorted(SETS)}")
        module, names = SETS[b]
        if not force and all((out / f"{n}.npz").is_file() for n in names):
            counts.update({n: int(np.load(out / f"{n}.npz")["y"].shape[0]) for n in names})
            continue
        sets = importlib.import_module(f"{__package__}.{module}").build()
        assert set(sets) == set(names), (b, sorted(sets))
        for name, (x, y, classes) in sets.items():
            assert x.dtype == np.uint8 and x.shape[1:] == (32, 32, 3), (name, x.dtype, x.shape)
            np.savez_compressed(out / f"{name}.npz", x=x, y=y.astype(np.int64), classes=np.array(classes))
            counts[name] = len(y)
    return counts


def main(argv: list[str] | None = None) -> None:
    """``python -m benchmarks validity.heldout.round7.prepare7 [BUILDER...] [--force]``: build the npz files and print
    each set's examples."""
    import argparse

    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description="build round 7's npz files (SOURCES.md)")
    ap.add_argument("builders", nargs="*", metavar="BUILDER", help=f"only these (default: all of {', '.join(SETS)})")
    ap.add_argument("--force", action="store_true", help="rebuild where the files exist")
    a = ap.parse_intermixed_args(argv)
    for k, v in build(a.builders or None, force=a.force).items():
        print(f"{k}\t{v}")


if __name__ == "__main__":
    main()
