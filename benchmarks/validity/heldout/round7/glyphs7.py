"""Round 7's glyph sets (SOURCES.md, tasks ``letters`` and ``digits``): the capital letters A-Z and the digits 0-9 of
Debian's Latin font files, rendered with Pillow's FreeType as 32x32 grey glyphs (black on white, the three channels
the same). A class is the character, so every font gives the same labels.

- Private (``font-letters-*``, ``font-digits-*``): the font files of the 15 ``fonts-adf-*`` packages, Latin Modern,
  TeX Gyre, URW base35, Lato, Roboto, Open Sans, Libertine, Cantarell, EB Garamond, Comic Neue, Carlito, Caladea, Hack
  and Inconsolata (:data:`PRIVATE`). A file is used if its cmap has all of A-Z and 0-9 (fontTools) and its family is
  not a symbol, keyboard or ornament font (:data:`NOT_LATIN`, checked on contact sheets). A family is the font's
  typographic family (name ID 16, else 1, as FreeType reports it); of each family at most :data:`FACES` faces are
  kept (:func:`_faces`) so that no family with many weights and widths dominates. The split is by design group
  (:func:`_group`): URW base35 and TeX Gyre (derived from it) share one group per design, all of Latin Modern is one
  group, and the other families are grouped by their first word (Accanthis ADF Std with its No2 and No3, Verana with
  Verana Sans, Roboto with Roboto Condensed, Linux Libertine with Linux Biolinum). About one group in four is test
  (``in_test(group, "fonts")``), the same split for letters and digits.
- Public (``pub-noto-letters``, ``pub-noto-digits``; no split): Noto's five Latin designs (Sans, Serif, Sans Display,
  Serif Display, Sans Mono; at most 2 faces each: the many script fonts of fonts-noto-core/-extra that carry Noto
  Sans's Latin are not read) and every face of Liberation, FreeFont and DejaVu Sans and Serif (fonts-dejavu-core:
  DejaVu Sans Mono is left out, as the private Hack is a modification of it), other foundries than the private fonts.

A glyph is drawn at :data:`RENDER` px, cropped to its ink, scaled (Lanczos, antialiased) so that its box fits
:data:`BOX` px keeping its aspect, and centred in a :data:`SIZE` x :data:`SIZE` image; a glyph without ink is left
out. Exact duplicates are left out by :func:`_dedup` (train, test, then the public set; letters and digits apart).
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

from .prepare7 import INSTALL, Sets, _dedup, deb, in_test

LETTERS = list(string.ascii_uppercase)
DIGITS = list(string.digits)
#: the private fonts: (folder a Debian package installs, file patterns); fonts-adf-* share one folder
PRIVATE = (
    ("/usr/share/fonts/truetype/adf", ("*.otf",)),                          # the 15 fonts-adf-* packages
    ("/usr/share/texmf/fonts/opentype/public/lm", ("*.otf",)),              # fonts-lmodern
    ("/usr/share/texmf/fonts/opentype/public/lm-math", ("*.otf",)),         # fonts-lmodern
    ("/usr/share/texmf/fonts/opentype/public/tex-gyre", ("*.otf",)),        # fonts-texgyre
    ("/usr/share/fonts/opentype/urw-base35", ("*.otf",)),                   # fonts-urw-base35 (Type 1 copies unread)
    ("/usr/share/fonts/truetype/lato", ("*.ttf",)),                         # fonts-lato
    ("/usr/share/fonts/truetype/roboto/unhinted", ("*.ttf", "*/*.ttf")),    # fonts-roboto-unhinted
    ("/usr/share/fonts/truetype/open-sans", ("*.ttf",)),                    # fonts-open-sans
    ("/usr/share/fonts/opentype/linux-libertine", ("*.otf",)),              # fonts-linuxlibertine
    ("/usr/share/fonts/opentype/cantarell", ("*.otf",)),                    # fonts-cantarell
    ("/usr/share/fonts/opentype/ebgaramond", ("*.otf",)),                   # fonts-ebgaramond
    ("/usr/share/fonts/opentype/comic-neue", ("*.otf",)),                   # fonts-comic-neue
    ("/usr/share/fonts/truetype/crosextra", ("Carlito-*.ttf", "Caladea-*.ttf")),  # fonts-crosextra-carlito/-caladea
    ("/usr/share/fonts/truetype/hack", ("*.ttf",)),                         # fonts-hack
    ("/usr/share/fonts/truetype/inconsolata", ("*.otf",)),                  # fonts-inconsolata
)
#: the public fonts: (folder, file patterns, at most this many faces per family; 0: all)
PUBLIC = (
    ("/usr/share/fonts/truetype/noto", ("NotoSans-*.ttf", "NotoSerif-*.ttf", "NotoSansDisplay-*.ttf",
                                        "NotoSerifDisplay-*.ttf", "NotoSansMono-*.ttf"), 2),  # fonts-noto-core/-extra
    ("/usr/share/fonts/truetype/liberation", ("*.ttf",), 0),                # fonts-liberation
    ("/usr/share/fonts/truetype/freefont", ("*.ttf",), 0),                  # fonts-freefont-ttf
    ("/usr/share/fonts/truetype/dejavu", ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf",
                                          "DejaVuSerif-Bold.ttf"), 0),  # fonts-dejavu-core, less Sans Mono (Hack's)
)
#: families whose A-Z and 0-9 are symbols, dingbats, keyboard keys or ornamented initials, not plain characters
NOT_LATIN = {"D050000L", "Standard Symbols PS", "Linux Biolinum Keyboard O", "Linux Libertine Initials O"}
#: URW base35 and TeX Gyre, the same designs: each family's design group
TWINS = {"Nimbus Roman": "times", "TeX Gyre Termes": "times", "Nimbus Sans": "helvetica",
         "Nimbus Sans Narrow": "helvetica", "TeX Gyre Heros": "helvetica", "TeX Gyre Heros Cn": "helvetica",
         "Nimbus Mono PS": "courier", "TeX Gyre Cursor": "courier", "P052": "palatino", "TeX Gyre Pagella": "palatino",
         "URW Bookman": "bookman", "TeX Gyre Bonum": "bookman", "C059": "schoolbook", "TeX Gyre Schola": "schoolbook",
         "URW Gothic": "avantgarde", "TeX Gyre Adventor": "avantgarde", "Z003": "chancery",
         "TeX Gyre Chorus": "chancery"}
#: faces kept per private family (the styles of :data:`STYLES` first, then the others by file name); 5 rather than 4
#: so that ``font-digits-train`` has 2,000 glyphs or more (219 faces; 4 would give 202 faces, 2,020 less duplicates)
FACES = 5
#: the preferred styles, in order (a leading optical size such as Latin Modern's "10 " ignored)
STYLES = (("regular", "roman", "book", "normal"), ("bold",), ("italic", "oblique"), ("bolditalic", "boldoblique"))
RENDER, BOX, SIZE = 96, 24, 32


def _files(folder: str, patterns: tuple[str, ...]) -> list[Path]:
    """The font files under a package's folder that match ``patterns``, sorted."""
    d = deb(folder)
    return sorted({p for pat in patterns for p in d.glob(pat) if p.is_file()})


def _has_chars(path: Path) -> bool:
    """Whether the font's cmap maps all of A-Z and 0-9 (fontTools)."""
    try:
        from fontTools.ttLib import TTFont
    except ImportError:
        raise SystemExit(f"fontTools is missing (round 7 reads font cmaps): {INSTALL}; pip install fonttools") from None
    with TTFont(path, lazy=True, fontNumber=0) as f:
        cmap = f.getBestCmap() or {}
    return all(ord(c) in cmap for c in LETTERS + DIGITS)


def _rank(style: str) -> int:
    """A face's place in :data:`STYLES` (``len(STYLES)`` for the others)."""
    s = style.lstrip("0123456789 ").lower().replace(" ", "")
    return next((i for i, names in enumerate(STYLES) if s in names), len(STYLES))


def _faces(files: list[Path], cap: int) -> list[tuple[str, str, Path]]:
    """(family, style, path) of the usable ``files`` (:func:`_has_chars`, not :data:`NOT_LATIN`), at most ``cap``
    faces per family (0: all): the styles of :data:`STYLES` first, then the others by file name."""
    from PIL import ImageFont

    fams: dict[str, list[tuple[int, str, str, Path]]] = {}
    for p in files:
        fam, style = ImageFont.truetype(str(p), RENDER).getname()
        if fam and fam not in NOT_LATIN and _has_chars(p):
            fams.setdefault(fam, []).append((_rank(style or ""), p.name, style or "", p))
    out = []
    for fam in sorted(fams):
        out += [(fam, style, p) for _, _, style, p in sorted(fams[fam])[:cap or None]]
    return out


def _group(family: str) -> str:
    """The design group a private family is split by: its :data:`TWINS` design, else its name's first word (all of
    Latin Modern, a family with its numbered, styled and condensed variants)."""
    return TWINS.get(family, family.split()[0].lower())


def _glyph(font, ch: str) -> np.ndarray | None:
    """One character of ``font`` (drawn at :data:`RENDER` px) cropped to its ink, scaled to fit :data:`BOX` px and
    centred, black on white, as (:data:`SIZE`, :data:`SIZE`, 3) uint8; None without ink."""
    from PIL import Image, ImageDraw

    left, top, right, bottom = font.getbbox(ch)
    if right <= left or bottom <= top:
        return None
    im = Image.new("L", (right - left + 8, bottom - top + 8), 0)
    ImageDraw.Draw(im).text((4 - left, 4 - top), ch, font=font, fill=255)
    box = im.getbbox()
    if box is None:
        return None
    im = im.crop(box)
    s = BOX / max(im.size)
    w, h = max(1, round(im.width * s)), max(1, round(im.height * s))
    out = Image.new("L", (SIZE, SIZE), 0)
    out.paste(im.resize((w, h), Image.LANCZOS), ((SIZE - w) // 2, (SIZE - h) // 2))
    g = 255 - np.asarray(out, dtype=np.uint8)
    return np.repeat(g[:, :, None], 3, axis=2)


def _render(faces: list[Path]) -> dict[str, tuple[list, list]]:
    """The letters and the digits of every face: ``{"letters": (images, labels), "digits": ...}``."""
    from PIL import ImageFont

    out: dict[str, tuple[list, list]] = {"letters": ([], []), "digits": ([], [])}
    for p in faces:
        font = ImageFont.truetype(str(p), RENDER)
        for task, chars in (("letters", LETTERS), ("digits", DIGITS)):
            for k, ch in enumerate(chars):
                g = _glyph(font, ch)
                if g is not None:
                    out[task][0].append(g)
                    out[task][1].append(k)
    return out


def private_faces() -> dict[str, list[tuple[str, str, str, Path]]]:
    """The private faces by part: ``{"train": [(group, family, style, path), ...], "test": [...]}``."""
    faces = _faces([p for folder, pats in PRIVATE for p in _files(folder, pats)], FACES)
    parts: dict[str, list] = {"train": [], "test": []}
    for fam, style, p in faces:
        g = _group(fam)
        parts["test" if in_test(g, "fonts") else "train"].append((g, fam, style, p))
    return parts


def public_faces() -> list[tuple[str, str, Path]]:
    """The public faces: (family, style, path)."""
    return [f for folder, pats, cap in PUBLIC for f in _faces(_files(folder, pats), cap)]


def build() -> Sets:
    """``font-letters-train/-test``, ``font-digits-train/-test`` (private fonts, split by design group) and
    ``pub-noto-letters``, ``pub-noto-digits`` (public fonts, all of them), without exact duplicates."""
    names = {"letters": LETTERS, "digits": DIGITS}
    parts = {k: [f[-1] for f in v] for k, v in private_faces().items()}
    parts["pub"] = [p for _, _, p in public_faces()]
    sets: Sets = {}
    for part, faces in parts.items():
        for task, (xs, ys) in _render(faces).items():
            name = f"pub-noto-{task}" if part == "pub" else f"font-{task}-{part}"
            sets[name] = (np.stack(xs), np.array(ys, np.int64), names[task])
    sets = _dedup(sets, ("font-letters-train", "font-letters-test", "pub-noto-letters"))
    return _dedup(sets, ("font-digits-train", "font-digits-test", "pub-noto-digits"))
