"""Dataset sources, sampling and the transform to model input."""

import numpy as np
import pytest
import torch

from gsd_cli import DatasetError
from gsd_cli.data import draw, resolve, to_model_input
from gsd_cli.data.files import FolderSource


def test_draw_is_seeded_distinct_and_capped():
    a = draw("digits", 100, seed=3)
    assert len(set(a.indices.tolist())) == 100
    assert np.array_equal(a.indices, draw("digits", 100, seed=3).indices)
    assert not np.array_equal(a.indices, draw("digits", 100, seed=4).indices)
    assert len(draw("faces", 2000, seed=0)) == 200  # all of a smaller set
    with pytest.raises(DatasetError, match="at least 2"):
        draw("digits", 1, seed=0)


def test_mnist_halves_are_disjoint_and_stratified():
    from gsd_cli.data.embedded import _mnist5k

    x, y, half = _mnist5k()
    a, b = resolve("mnist-a"), resolve("mnist-b")
    assert len(a) == len(b) == 2500
    assert np.array_equal(np.bincount(a.labels(range(2500))), np.full(10, 250))
    assert np.array_equal(np.bincount(b.labels(range(2500))), np.full(10, 250))
    assert set(np.flatnonzero(half == 0)).isdisjoint(np.flatnonzero(half == 1))
    inv = resolve("mnist-inverted").images([0])[0]
    assert np.allclose(inv, 1 - b.images([0])[0])


@pytest.mark.parametrize("layout", ["NHW", "NCHW", "NHWC", "NHWC1"])
def test_npz_layouts(tmp_path, layout):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(7, 9, 11, 3), dtype=np.uint8)
    arr = {"NHW": x[..., 0], "NCHW": x.transpose(0, 3, 1, 2), "NHWC": x, "NHWC1": x[..., :1]}[layout]
    np.savez(tmp_path / "d.npz", x=arr, y=np.arange(7) % 2)
    src = resolve(f"npz:{tmp_path / 'd.npz'}")
    img = src.images([3])[0]
    want = x[3, ..., 0] if layout in ("NHW", "NHWC1") else x[3]
    assert np.allclose(img, want / 255.0)
    assert src.num_classes == 2 and list(src.labels([2, 3])) == [0, 1]


def test_npz_float_and_bad_files(tmp_path):
    np.savez(tmp_path / "f.npz", x=np.full((4, 5, 5), 0.25, dtype=np.float32), y=np.zeros(4, dtype=int))
    assert resolve(f"npz:{tmp_path / 'f.npz'}").images([0])[0].max() == pytest.approx(0.25)
    np.savez(tmp_path / "big.npz", x=np.full((4, 5, 5), 3.0), y=np.zeros(4, dtype=int))
    with pytest.raises(DatasetError, match=r"\[0, 1\]"):
        resolve(f"npz:{tmp_path / 'big.npz'}")
    np.savez(tmp_path / "nox.npz", images=np.zeros((4, 5, 5)))
    with pytest.raises(DatasetError, match="'x'"):
        resolve(f"npz:{tmp_path / 'nox.npz'}")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(DatasetError, match="cannot read"):
        resolve(f"npz:{tmp_path / 'junk.npz'}")
    with pytest.raises(DatasetError, match="no such file"):
        resolve(f"npz:{tmp_path / 'missing.npz'}")


def test_to_model_input_resizes_and_maps_channels():
    grey = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    rgb = np.stack([np.zeros((5, 5)), np.ones((5, 5)), np.zeros((5, 5))], -1).astype(np.float32)
    x = to_model_input([grey, rgb], size=16, channels=3)
    assert x.shape == (2, 3, 16, 16)
    assert torch.equal(x[0, 0], x[0, 1]) and torch.equal(x[0, 1], x[0, 2])  # grey repeated
    assert x[1, 1].eq(1.0).all() and x[1, 0].eq(-1.0).all()  # [0, 1] -> [-1, 1]
    y = to_model_input([rgb], size=5, channels=1)
    assert torch.allclose(y, torch.full((1, 1, 5, 5), 0.587 * 2 - 1))  # luma of pure green


def test_folder_source_opens_only_drawn_files(image_folder, monkeypatch):
    from PIL import Image

    src = resolve(f"folder:{image_folder}")
    assert isinstance(src, FolderSource) and len(src) == 12 and src.num_classes == 2
    opened = []
    real_open = Image.open
    monkeypatch.setattr(Image, "open", lambda f, *a, **k: (opened.append(f), real_open(f, *a, **k))[1])
    sample = draw(src, 3, seed=0)
    imgs = src.images(sample.indices)
    assert len(opened) == 3 and all(i.shape[2] == 3 for i in imgs)
    labels = src.labels(sample.indices)
    assert [("dogs" in str(f)) for f in opened] == [bool(v) for v in labels]


def test_folder_errors(tmp_path, image_folder):
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError, match="no images"):
        resolve(f"folder:{tmp_path / 'empty'}")
    (image_folder / "cats" / "0.png").write_bytes(b"garbage")
    src = resolve(f"folder:{image_folder}")
    with pytest.raises(DatasetError, match="cannot read image"):
        src.images(range(len(src)))


def test_unknown_dataset_suggests():
    with pytest.raises(DatasetError, match="did you mean 'digits'"):
        resolve("digit")
