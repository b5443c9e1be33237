"""Issue 50, item 5: one notion of "the same example". The overlap checks (``shared_examples`` of a
non-private command, ``PublicRows`` of a DP release) and the privacy ledger agree on every pair of
images stored as grey, RGB, 16-bit, palette and re-encoded PNGs and as npz arrays; before, the overlap
check compared shapes with a channel of 1 and the files' bytes, the ledger decoded images."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from PIL import Image

from gsd_cli import data as gdata
from gsd_cli.data.identity import PublicRows, shared_examples
from gsd_cli.privacy import budget as B


def _grey(seed):
    return np.random.default_rng(seed).integers(0, 256, size=(12, 12), dtype=np.uint8)


def _png(path, img, mode, **save):
    """One image saved in ``mode``: L, RGB (three equal channels), I;16 (v * 257), P (a grey palette), or
    RGB with distinct channels ("colour")."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "L":
        im = Image.fromarray(img, mode="L")
    elif mode == "RGB":
        im = Image.fromarray(np.repeat(img[..., None], 3, axis=-1), mode="RGB")
    elif mode == "I;16":
        im = Image.fromarray(img.astype(np.uint16) * 257)
    elif mode == "P":
        im = Image.fromarray(img, mode="L").convert("P")  # an 8-bit grey palette: the same pixels
    elif mode == "colour":
        rgb = np.stack([img, 255 - img, img // 2], axis=-1).astype(np.uint8)
        im = Image.fromarray(rgb, mode="RGB")
    else:
        raise ValueError(mode)
    im.save(path, **save)


FORMS = {  # name: (how it is written, which picture it shows)
    "grey": ("L", {}, 0),
    "rgb": ("RGB", {}, 0),
    "png16": ("I;16", {}, 0),
    "palette": ("P", {}, 0),
    "reencoded": ("L", {"compress_level": 0, "pnginfo": None}, 0),  # other bytes, same pixels
    "npz-uint8": ("npz", {}, 0),
    "npz-float": ("npz-float", {}, 0),
    "npz-channel": ("npz-channel", {}, 0),
    "other": ("L", {}, 1),  # another picture
    "colour": ("colour", {}, 0),  # the same picture's pixels in three different channels: another example
}


def _source(tmp_path, name):
    mode, save, pic = FORMS[name]
    img = _grey(pic)
    root = tmp_path / name
    if mode.startswith("npz"):
        root.mkdir()
        x = img[None].astype(np.float32) / 255.0 if mode == "npz-float" else img[None]
        if mode == "npz-channel":
            x = img[None, ..., None]
        np.savez(root / "x.npz", x=x, y=np.zeros(1, dtype=np.int64), classes=np.array(["a"]))
        return gdata.resolve(f"npz:{root / 'x.npz'}")
    if save.get("pnginfo", 1) is None:
        from PIL.PngImagePlugin import PngInfo

        info = PngInfo()
        info.add_text("Comment", "re-encoded")
        save = {**save, "pnginfo": info}
    _png(root / "a" / "img.png", img, mode, **save)
    return gdata.resolve(f"folder:{root}")


def test_the_overlap_checks_and_the_ledger_agree_on_every_pair(tmp_path):
    sources = {n: _source(tmp_path, n) for n in FORMS}
    ledger = {n: B.data_identity(s).examples for n, s in sources.items()}
    same_picture = {n for n, f in FORMS.items() if f[2] == 0 and n != "colour"}
    for a, b in itertools.combinations(FORMS, 2):
        by_ledger = ledger[a] == ledger[b]
        by_overlap = shared_examples(sources[a], sources[b]) is not None
        rows = PublicRows(sources[a], [gdata.Sample(sources[b], np.arange(1))])
        by_rule = bool(rows.mask([0])[0])
        assert by_ledger == by_overlap == by_rule, (a, b, by_ledger, by_overlap, by_rule)
        assert by_ledger == (a in same_picture and b in same_picture), (a, b)


@pytest.mark.parametrize("form", ["rgb", "png16", "palette", "reencoded"])
def test_a_reencoded_copy_is_left_out_of_a_dp_training_like_the_ledger_says(tmp_path, form):
    """A file-backed private folder and a public folder holding the same picture in another file:
    the per-example rule of a DP release leaves it out (it compared paths and bytes only)."""
    private, public = _source(tmp_path, "grey"), _source(tmp_path, form)
    assert PublicRows(private, [gdata.Sample(public, np.arange(1))]).mask([0]).tolist() == [True]
    assert B.data_identity(private).examples == B.data_identity(public).examples
