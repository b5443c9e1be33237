"""Round 7's playing cards (the ``cards`` and ``cards-rank`` tasks of SOURCES.md): French-suited card decks from two
Debian packages, one image per card (jokers and backs left out), as 32x32 RGB on white (:func:`.prepare7._rgb`).

- ``cards-train`` / ``cards-test``: gnome-cards-data's decks (``/usr/share/aisleriot/cards/*.svgz``), labelled by
  suit (:data:`SUITS`); split by design family (:data:`GNOME_FAMILY`: decks that share court cards or number cards go
  to one part) with :func:`_test_families`. :func:`.prepare7.in_test` puts only 2 of the 15 families in test, so the
  fallback chooses: anglo (4 decks: anglo, gnomangelo and their bitmap twins), orell, rheinland, tango_nuevo
- ``cards-rank-train`` / ``cards-rank-test``: the same images, labelled by rank (:data:`RANKS`)
- ``pub-kde-cards`` / ``pub-kde-ranks``: kdegames-card-data-kf5's decks (``/usr/share/carddecks/svg-*/*.svgz``) that
  draw French suits and are no gnome deck's design (:data:`KDE_DROP`), by suit / by rank

Both packages name one SVG element per card: gnome ``<suit>_<rank>`` (``club_1`` ... ``spade_king``), KDE
``<rank>_<suit>`` (``1_club`` ... ``king_spade``). A deck is parsed once with librsvg (through ``ctypes``: the library
that ``rsvg-convert`` of librsvg2-bin runs on) and each card element is drawn alone, in its place on the page, at a
scale that makes the deck's cards :data:`HEIGHT` px tall, then cut out at its opaque pixels' bounding box. Neither
``rsvg-convert --export-id`` nor librsvg's per-element geometry will do: both size the card by its ink extents, which
librsvg 2.54 takes as empty for ``<image>`` elements (bitmap decks render blank) and which in some decks reach far
past the card (stray empty groups). The card (about 2:3) is then squashed to 32x32 by :func:`.prepare7._rgb` rather
than padded: every deck has nearly the same proportions, so the stretch is the same for all, and the pips and corner
indices keep half again as many pixels as in a padded square.

Decks left out, by eye on contact sheets of every deck: :data:`GNOME_DROP`, :data:`KDE_DROP`. Then
:func:`.prepare7._dedup` leaves out an image that an earlier part holds (train, test, then the KDE set), per task.
"""

from __future__ import annotations

import ctypes
import gzip
import hashlib
import io
from pathlib import Path

import numpy as np

from .prepare7 import Sets, _dedup, _rgb, deb, in_test

SUITS = ["clubs", "diamonds", "hearts", "spades"]
RANKS = ["A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K"]
#: how both packages spell the suits and ranks of :data:`SUITS` and :data:`RANKS` in element ids
SUIT_IDS = ("club", "diamond", "heart", "spade")
RANK_IDS = ("1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "jack", "queen", "king")
GNOME_DIR = "/usr/share/aisleriot/cards"
KDE_DIR = "/usr/share/carddecks"
#: gnome decks left out, and why
GNOME_DROP = {"swiss-xvii": "Swiss suits (acorns, shields, roses, bells) under club/diamond/heart/spade ids"}
#: gnome decks that share a design, merged by eye (the same court cards recoloured, as bitmaps, relabelled or with
#: other aces) and by a check at 32x32 (two decks whose same cards differ by a median mean absolute difference under
#: 10 of 255: the same number cards); the split keeps each family (named by one member) whole
GNOME_FAMILY = {"anglo_bitmap": "anglo", "gnomangelo": "anglo", "gnomangelo_bitmap": "anglo",
                "anglo_modern_4_color": "anglo_modern", "anglo_poker": "anglo_modern", "atlasnye": "anglo_modern",
                "atlasnye_skat": "anglo_modern", "Атласные": "anglo_modern", "lattmann": "berlin", "tarocco": "berlin",
                "ancient_french": "paris", "bellot": "paris", "guyenne-classic": "paris",
                "neoclassical_4_color": "neoclassical"}
#: KDE deck folders (``svg-<name>``) left out, and why
KDE_DROP = {"dondorf": "a gnome deck's design (dondorf)", "gm-paris": "a gnome deck's design (paris)",
            "nicu-ornamental": "a gnome deck's design (ornamental)",
            "nicu-white": "gnome ornamental's design on a white ground",
            "tigullio-international": "a gnome deck's design (tigullio)",
            "future": "no suit symbols (cards drawn as memory cartridges with a hex number)",
            "xskat-german": "German suits (acorns, leaves, hearts, bells)"}
#: the height in pixels that each card is drawn at before :func:`.prepare7._rgb` makes it 32x32
HEIGHT = 128
#: the fewest gnome families (designs) in test; when :func:`.prepare7.in_test` gives fewer, :func:`_test_families`
#: takes every fourth family in sha256 order instead
MIN_TEST = 4


class _Rect(ctypes.Structure):
    _fields_ = [("x", ctypes.c_double), ("y", ctypes.c_double), ("width", ctypes.c_double),
                ("height", ctypes.c_double)]


def _libs() -> tuple[ctypes.CDLL, ctypes.CDLL, ctypes.CDLL]:
    """librsvg, cairo and gobject (``ctypes``), with the signatures used here."""
    try:
        rsvg, cairo = ctypes.CDLL("librsvg-2.so.2"), ctypes.CDLL("libcairo.so.2")
        gobject = ctypes.CDLL("libgobject-2.0.so.0")
    except OSError as e:
        raise SystemExit(f"librsvg or cairo is missing ({e}): apt-get install librsvg2-bin") from None
    p, d = ctypes.c_void_p, ctypes.POINTER(ctypes.c_double)
    for f, res, args in [
            (rsvg.rsvg_handle_new_from_data, p, [ctypes.c_char_p, ctypes.c_size_t, p]),
            (rsvg.rsvg_handle_get_intrinsic_size_in_pixels, ctypes.c_int, [p, d, d]),
            (rsvg.rsvg_handle_render_layer, ctypes.c_int, [p, p, ctypes.c_char_p, ctypes.POINTER(_Rect), p]),
            (cairo.cairo_image_surface_create, p, [ctypes.c_int, ctypes.c_int, ctypes.c_int]),
            (cairo.cairo_create, p, [p]), (cairo.cairo_destroy, None, [p]), (cairo.cairo_surface_flush, None, [p]),
            (cairo.cairo_surface_destroy, None, [p]), (cairo.cairo_image_surface_get_stride, ctypes.c_int, [p]),
            (cairo.cairo_image_surface_get_data, ctypes.POINTER(ctypes.c_uint8), [p]),
            (gobject.g_object_unref, None, [p])]:
        f.restype, f.argtypes = res, args
    return rsvg, cairo, gobject


def _draw(libs: tuple, handle: int, page: tuple[float, float], eid: str, scale: float) -> np.ndarray | None:
    """Element ``eid`` alone, the page drawn at ``scale``, cut to its opaque pixels and flattened on white: (H, W, 3)
    uint8, or None when it draws nothing."""
    rsvg, cairo, _ = libs
    w, h = max(1, round(page[0] * scale)), max(1, round(page[1] * scale))
    surface = cairo.cairo_image_surface_create(0, w, h)  # ARGB32: premultiplied B, G, R, A bytes
    cr = cairo.cairo_create(surface)
    try:
        if not rsvg.rsvg_handle_render_layer(handle, cr, f"#{eid}".encode(), _Rect(0, 0, w, h), None):
            raise SystemExit(f"librsvg could not draw #{eid}")
        cairo.cairo_surface_flush(surface)
        stride = cairo.cairo_image_surface_get_stride(surface)
        buf = np.ctypeslib.as_array(cairo.cairo_image_surface_get_data(surface), shape=(h * stride,))
        bgra = buf.reshape(h, stride)[:, :w * 4].reshape(h, w, 4).astype(np.int16)
    finally:
        cairo.cairo_destroy(cr)
        cairo.cairo_surface_destroy(surface)
    ys, xs = np.nonzero(bgra[..., 3])
    if not len(ys):
        return None
    c = bgra[ys.min():ys.max() + 1, xs.min():xs.max() + 1]
    return np.clip(c[..., 2::-1] + 255 - c[..., 3:], 0, 255).astype(np.uint8)  # premultiplied over white


def deck_cards(path: Path, kde: bool, height: int = HEIGHT) -> list[tuple[np.ndarray, int, int]]:
    """Every card of a deck file as (image ``height`` px tall, suit index, rank index), in suit then rank order."""
    libs = _libs()
    rsvg, _, gobject = libs
    data = gzip.decompress(path.read_bytes())
    handle = rsvg.rsvg_handle_new_from_data(data, len(data), None)
    if not handle:
        raise SystemExit(f"librsvg could not read {path}")
    try:
        w, h = ctypes.c_double(), ctypes.c_double()
        if not rsvg.rsvg_handle_get_intrinsic_size_in_pixels(handle, ctypes.byref(w), ctypes.byref(h)):
            raise SystemExit(f"{path} has no size in pixels")
        page = (w.value, h.value)
        ids = [(f"{r}_{s}" if kde else f"{s}_{r}", i, j)
               for i, s in enumerate(SUIT_IDS) for j, r in enumerate(RANK_IDS)]
        probe = _draw(libs, handle, page, ids[0][0], 1000 / max(page))  # the ace of clubs sets the deck's scale
        if probe is None:
            raise SystemExit(f"{path}: #{ids[0][0]} draws nothing")
        scale = 1000 / max(page) * height / probe.shape[0]
        out = []
        for eid, i, j in ids:
            im = _draw(libs, handle, page, eid, scale)
            if im is None:
                raise SystemExit(f"{path}: #{eid} draws nothing")
            out.append((im, i, j))
        return out
    finally:
        gobject.g_object_unref(handle)


def _png(im: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 image as PNG bytes (what :func:`.prepare7._rgb` reads)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(im).save(buf, format="PNG")
    return buf.getvalue()


def gnome_decks() -> dict[str, Path]:
    """The gnome decks used (name: file), :data:`GNOME_DROP` left out."""
    return {p.name[:-5]: p for p in sorted(deb(GNOME_DIR).glob("*.svgz")) if p.name[:-5] not in GNOME_DROP}


def kde_decks() -> dict[str, Path]:
    """The KDE decks used (folder name without ``svg-``: file), :data:`KDE_DROP` left out."""
    out = {}
    for d in sorted(deb(KDE_DIR).glob("svg-*")):
        files = sorted(d.glob("*.svgz"))
        if d.name[4:] not in KDE_DROP and len(files) == 1:
            out[d.name[4:]] = files[0]
    return out


def _test_families(families: list[str]) -> set[str]:
    """The gnome families in test: :func:`.prepare7.in_test` (salt ``cards``); if that gives fewer than
    :data:`MIN_TEST`, every fourth family in sha256 order (starting with the first)."""
    test = {f for f in families if in_test(f, "cards")}
    if len(test) < MIN_TEST:
        test = set(sorted(families, key=lambda f: hashlib.sha256(f.encode()).hexdigest())[::4])
    return test


def build() -> Sets:
    """The six card sets (see the module's doc)."""
    gnome = gnome_decks()
    family = {d: GNOME_FAMILY.get(d, d) for d in gnome}
    test = _test_families(sorted(set(family.values())))
    parts: dict[str, tuple[list, list, list]] = {k: ([], [], []) for k in ("train", "test", "kde")}
    decks = [("test" if family[d] in test else "train", p) for d, p in gnome.items()]
    for part, path in decks + [("kde", p) for p in kde_decks().values()]:
        xs, ss, rs = parts[part]
        for im, s, r in deck_cards(path, kde=part == "kde"):
            xs.append(_rgb(_png(im)))
            ss.append(s)
            rs.append(r)
    sets: Sets = {}
    for part, (xs, ss, rs) in parts.items():
        suit, rank = ("pub-kde-cards", "pub-kde-ranks") if part == "kde" else (f"cards-{part}", f"cards-rank-{part}")
        x = np.stack(xs)
        sets[suit] = (x, np.array(ss, np.int64), SUITS)
        sets[rank] = (x.copy(), np.array(rs, np.int64), RANKS)
    sets = _dedup(sets, ("cards-train", "cards-test", "pub-kde-cards"))
    return _dedup(sets, ("cards-rank-train", "cards-rank-test", "pub-kde-ranks"))
