"""Dataset sources: seeded draws, npz and folder sources, the transform to model input, the embedded
sets (MNIST halves and the others)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from gsd_cli import DatasetError
from gsd_cli.data import ArraySource, draw, resolve, to_model_input
from gsd_cli.data.files import FolderSource

# ------------------------------------------------------------------------------ draw


def _array_source(name, n, seed=0):
    rng = np.random.default_rng(seed)
    return ArraySource(name, rng.uniform(size=(n, 4, 4)).astype(np.float32), rng.integers(0, 3, size=n))


@pytest.mark.parametrize("m,n", [(10, 50), (50, 50), (80, 50), (None, 50), (2, 3)])
def test_draw_size_and_distinct(m, n):
    s = draw(_array_source("a", n), m, seed=0)
    expected = n if m is None else min(m, n)
    assert len(s) == expected == len(s.indices)
    assert len(set(s.indices.tolist())) == expected
    assert s.indices.min() >= 0 and s.indices.max() < n
    assert len(s.labels()) == expected


def test_draw_depends_only_on_seed_and_name():
    a1 = draw(_array_source("set-a", 200, seed=1), 20, seed=7).indices
    a2 = draw(_array_source("set-a", 200, seed=99), 20, seed=7).indices  # other content, same name
    assert np.array_equal(a1, a2)
    assert not np.array_equal(a1, draw(_array_source("set-b", 200), 20, seed=7).indices)  # other name
    assert not np.array_equal(a1, draw(_array_source("set-a", 200), 20, seed=8).indices)  # other seed
    # names resolve to the same draw as the source object
    assert np.array_equal(draw("noise", 15, seed=3).indices, draw(resolve("noise"), 15, seed=3).indices)


def test_draw_is_uniform_over_examples():
    counts = np.zeros(10)
    for seed in range(400):
        counts[draw(_array_source("u", 10), 3, seed).indices] += 1
    # every example drawn with probability 3/10: 120 expected, sd ~9
    assert counts.sum() == 1200 and counts.min() > 80 and counts.max() < 160


def test_draw_refuses_fewer_than_two():
    with pytest.raises(DatasetError, match="at least 2"):
        draw(_array_source("a", 10), 1, seed=0)
    with pytest.raises(DatasetError):
        draw(_array_source("a", 10), 0, seed=0)
    with pytest.raises(DatasetError):
        draw(_array_source("one", 1), 5, seed=0)


# ------------------------------------------------------------------------------ npz


def _images(source, n):
    return np.stack(source.images(list(range(n))))


@pytest.mark.parametrize(
    "layout", ["NHW", "N1HW", "NHW1", "N3HW", "NHW3"],
)
@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64"])
def test_npz_layouts(layout, dtype, write_npz):
    rng = np.random.default_rng(4)
    n, h, w = 6, 9, 7
    c = 3 if "3" in layout else 1
    hwc = rng.integers(0, 256, size=(n, h, w, c)).astype(np.uint8)  # the images, N,H,W,C
    arr = {"NHW": hwc[..., 0], "N1HW": hwc.transpose(0, 3, 1, 2), "NHW1": hwc,
           "N3HW": hwc.transpose(0, 3, 1, 2), "NHW3": hwc}[layout]
    if dtype != "uint8":
        arr = (arr / 255.0).astype(dtype)
    y = rng.integers(0, 5, size=n)
    src = resolve(f"npz:{write_npz('d', x=arr, y=y)}")
    assert len(src) == n
    assert src.num_classes == int(y.max()) + 1
    imgs = _images(src, n)
    expected = (hwc[..., 0] if c == 1 else hwc).astype(np.float32) / 255.0
    assert imgs.shape == expected.shape
    np.testing.assert_allclose(imgs, expected, atol=1e-6)
    assert imgs.dtype == np.float32
    np.testing.assert_array_equal(src.labels([4, 0, 2]), y[[4, 0, 2]])


def test_npz_errors(write_npz):
    ok_y = np.zeros(4, dtype=np.int64)
    with pytest.raises(DatasetError, match="'x'"):
        resolve(f"npz:{write_npz('nox', images=np.zeros((4, 8, 8)), y=ok_y)}")
    with pytest.raises(DatasetError, match="\\[0, 1\\]"):
        resolve(f"npz:{write_npz('range', x=np.full((4, 8, 8), 2.0), y=ok_y)}")
    with pytest.raises(DatasetError):
        resolve(f"npz:{write_npz('nlab', x=np.zeros((4, 8, 8)), y=np.zeros(3, dtype=np.int64))}")
    with pytest.raises(DatasetError):
        resolve(f"npz:{write_npz('chan', x=np.zeros((4, 5, 8, 8)), y=ok_y)}")
    with pytest.raises(DatasetError):
        resolve(f"npz:{write_npz('flat', x=np.zeros((4, 64)), y=ok_y)}")
    with pytest.raises(DatasetError):
        resolve(f"npz:{write_npz('neg', x=np.zeros((4, 8, 8)), y=-ok_y - 1)}")
    with pytest.raises(DatasetError, match="no such file"):
        resolve("npz:/definitely/not/here.npz")


def test_npz_not_a_zip(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"garbage" * 20)
    with pytest.raises(DatasetError, match="cannot read"):
        resolve(f"npz:{bad}")


# ------------------------------------------------------------------------------ to_model_input


def test_model_input_grey_to_rgb_and_normalisation():
    img = np.linspace(0, 1, 28 * 28, dtype=np.float32).reshape(28, 28)
    out = to_model_input([img, 1 - img], 28, 3)
    assert out.shape == (2, 3, 28, 28) and out.dtype == torch.float32
    for c in (1, 2):
        assert torch.equal(out[:, c], out[:, 0])  # grey repeated
    torch.testing.assert_close(out[0, 0], torch.from_numpy(img) * 2 - 1)  # [0, 1] -> [-1, 1], no resize
    # an H x W x 1 image is grey too
    torch.testing.assert_close(to_model_input([img[..., None]], 28, 3), out[:1])


def test_model_input_rgb_to_grey_uses_luma():
    rng = np.random.default_rng(0)
    img = rng.uniform(size=(16, 16, 3)).astype(np.float32)
    out = to_model_input([img], 16, 1)
    assert out.shape == (1, 1, 16, 16)
    luma = 0.299 * img[..., 0] + 0.587 * img[..., 1] + 0.114 * img[..., 2]
    torch.testing.assert_close(out[0, 0], torch.from_numpy(luma) * 2 - 1, rtol=1e-5, atol=1e-6)
    # rgb stays rgb, channel order kept
    out3 = to_model_input([img], 16, 3)
    torch.testing.assert_close(out3[0], torch.from_numpy(img).permute(2, 0, 1) * 2 - 1)


def test_model_input_resize():
    const = np.full((40, 30), 0.25, dtype=np.float32)
    out = to_model_input([const], 28, 1)
    assert out.shape == (1, 1, 28, 28)
    torch.testing.assert_close(out, torch.full((1, 1, 28, 28), -0.5), rtol=0, atol=1e-6)  # constants stay
    # up-sampling a 2x2 checker keeps its quadrants' means in order
    small = np.array([[0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    up = to_model_input([small], 8, 1)[0, 0]
    assert up[:4, :4].mean() < 0 < up[:4, 4:].mean() and up[4:, 4:].mean() < 0 < up[4:, :4].mean()
    # down-sampling is antialiased: 64 -> 8 averages ~8 x 8 pixels of uniform noise (sd of the
    # result ~0.08 on the [-1, 1] scale), where plain bilinear would mix just 2 x 2 (sd ~0.29)
    noise = np.random.default_rng(0).uniform(size=(64, 64)).astype(np.float32)
    down = to_model_input([noise], 8, 1)
    assert abs(float(down.mean())) < 0.05
    assert float(down.std()) < 0.15


def test_model_input_mixed_shapes_keep_their_order():
    rng = np.random.default_rng(1)
    imgs = [
        rng.uniform(size=(20, 20)).astype(np.float32),
        rng.uniform(size=(10, 12, 3)).astype(np.float32),
        rng.uniform(size=(20, 20)).astype(np.float32),
        rng.uniform(size=(28, 28)).astype(np.float32),
        rng.uniform(size=(10, 12, 3)).astype(np.float32),
    ]
    for channels in (1, 3):
        batch = to_model_input(imgs, 16, channels)
        one_by_one = torch.cat([to_model_input([im], 16, channels) for im in imgs])
        torch.testing.assert_close(batch, one_by_one)


# ------------------------------------------------------------------------------ folder


def test_folder_source_labels_and_images(mixed_image_folder):
    root, files = mixed_image_folder
    src = resolve(f"folder:{root}")
    assert isinstance(src, FolderSource)
    assert src.name == f"folder:{root}"
    assert len(src) == 12 and src.num_classes == 3
    assert src.classes == ["ants", "bees", "wasps"]
    for i in range(len(src)):
        path = src._folder.samples[i][0]
        cls = path.split("/")[-2]
        assert src.labels([i])[0] == src.classes.index(cls)
    imgs = src.images(list(range(12)))
    for i, img in enumerate(imgs):
        path = src._folder.samples[i][0]
        with Image.open(path) as pil:
            w, h = pil.size
            mode = pil.mode
        assert img.dtype == np.float32 and 0 <= img.min() and img.max() <= 1
        assert img.shape == ((h, w) if mode == "L" else (h, w, 3))  # RGBA -> RGB
        if mode == "RGB":
            np.testing.assert_allclose(img, np.asarray(Image.open(path), dtype=np.float32) / 255)


def test_folder_opens_only_the_drawn_files(mixed_image_folder, monkeypatch):
    root, files = mixed_image_folder
    opened = []
    real_open = Image.open

    def counting_open(fp, *a, **kw):
        opened.append(str(fp))
        return real_open(fp, *a, **kw)

    monkeypatch.setattr(Image, "open", counting_open)
    src = resolve(f"folder:{root}")
    assert opened == []  # scanning the folder opens no image
    sample = draw(src, 5, seed=2)
    assert opened == []
    chunks = list(sample.batches(size=16, channels=3, chunk=2))
    assert [start for start, _ in chunks] == [0, 2, 4]
    x = torch.cat([t for _, t in chunks])
    assert x.shape == (5, 3, 16, 16)
    drawn = [src._folder.samples[int(i)][0] for i in sample.indices]
    assert opened == drawn  # each drawn file once, in draw order, nothing else
    opened.clear()
    assert len(src.images(sample.indices[:2])) == 2 and opened == drawn[:2]  # images() too
    # labels of the drawn examples are their class folders
    expected = [src.classes.index(p.split("/")[-2]) for p in drawn]
    assert sample.labels().tolist() == expected


def test_folder_errors(empty_dir, garbage_folder, tmp_path):
    with pytest.raises(DatasetError, match="no images"):
        resolve(f"folder:{empty_dir}")
    (empty_dir / "cls").mkdir()  # a class folder with no images
    with pytest.raises(DatasetError):
        resolve(f"folder:{empty_dir}")
    with pytest.raises(DatasetError, match="no such folder"):
        resolve(f"folder:{tmp_path / 'missing'}")
    src = resolve(f"folder:{garbage_folder}")
    assert len(src) == 7
    with pytest.raises(DatasetError, match="cannot read image .*zz_broken.png"):
        src.images(list(range(7)))
    good = [i for i in range(7) if not src._folder.samples[i][0].endswith("zz_broken.png")]
    assert len(src.images(good)) == 6


def test_unknown_names():
    with pytest.raises(DatasetError, match="did you mean 'mnist-a'"):
        resolve("mnist_a")
    with pytest.raises(DatasetError, match="did you mean 'digits'"):
        resolve("digit")
    with pytest.raises(DatasetError):
        resolve("npz:")
    with pytest.raises(DatasetError):
        resolve("")


def test_bug_16bit_grey_png_is_saturated_by_folder_source(tmp_path):
    """files._pil_to_array converts any mode other than L/RGB with img.convert("RGB"). For a 16-bit
    greyscale PNG (mode "I;16", usual for X-rays) Pillow clips every value above 255 to 255, so
    the image arrives as almost all 1.0 (here 99.6% of the pixels) and as three channels."""
    (tmp_path / "xray" / "normal").mkdir(parents=True)
    ramp = np.linspace(0, 65535, 32 * 32).reshape(32, 32).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "xray" / "normal" / "a.png")
    assert Image.open(tmp_path / "xray" / "normal" / "a.png").mode == "I;16"
    img = resolve(f"folder:{tmp_path / 'xray'}").images([0])[0]
    grey = img if img.ndim == 2 else img[..., 0]
    assert np.mean(grey >= 1.0) < 0.01, "the 16-bit image is saturated"
    np.testing.assert_allclose(grey, ramp / 65535.0, atol=1 / 255 + 1e-6)


# ------------------------------------------------------------------------------ embedded


def test_embedded_mnist_halves():
    from gsd_cli.data.embedded import _mnist5k

    a, b, inv = resolve("mnist-a"), resolve("mnist-b"), resolve("mnist-inverted")
    assert len(a) == len(b) == 2500
    ya, yb = a.labels(range(2500)), b.labels(range(2500))
    assert np.bincount(ya, minlength=10).tolist() == [250] * 10
    assert np.bincount(yb, minlength=10).tolist() == [250] * 10
    xa, xb = _images(a, 2500), _images(b, 2500)
    assert xa.shape == (2500, 28, 28) and 0 <= xa.min() and xa.max() <= 1
    # disjoint: no image of one half is in the other
    ha, hb = {im.tobytes() for im in xa}, {im.tobytes() for im in xb}
    assert len(ha) == len(hb) == 2500 and not ha & hb
    # together they are all of MNIST-5k
    x, _, half = _mnist5k()
    assert ha | hb == {im.tobytes() for im in x}
    assert set(np.flatnonzero(half == 0)).isdisjoint(np.flatnonzero(half == 1))
    np.testing.assert_allclose(_images(inv, 50), 1 - xb[:50], atol=1e-7)
    np.testing.assert_array_equal(inv.labels(range(2500)), yb)


@pytest.mark.parametrize("name,n,classes,shape", [
    ("digits", 1797, 10, (8, 8)), ("faces", 200, 2, (25, 25)), ("noise", 2500, 10, (28, 28)), ("textures", None, 3, (56, 56)),
])
def test_other_embedded_sets(name, n, classes, shape):
    src = resolve(name)
    if n is not None:
        assert len(src) == n
    assert src.num_classes == classes
    img = src.images([0, len(src) - 1])
    assert img[0].shape == shape and 0 <= img[0].min() <= img[0].max() <= 1
    assert set(np.unique(src.labels(range(len(src))))) == set(range(classes))
