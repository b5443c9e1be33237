"""Issue 37, real image folders: JPEGs decoded at a reduced DCT scale (close to a full decode), 16-bit
PNGs without loss, file-backed chunks decoded by a thread pool (same tensors, same order, the first
bad file's error), at most ``workers`` native-size images held at a time, and the cache key's part."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from PIL import Image

from gsd_cli.data import draw, resolve, to_model_input
from gsd_cli.data import loader
from gsd_cli.data.decode import DECODE, open_image
from gsd_cli.data.fingerprint import sample_fingerprint
from gsd_cli.errors import DatasetError


def _photo(rng, side=256):
    """A smooth colour picture with pixel noise (compresses and decodes like a photograph)."""
    yy, xx = np.mgrid[0:1:side * 1j, 0:1:side * 1j]
    f = [rng.uniform(2, 6), rng.uniform(2, 6), rng.uniform(0, 6)]
    base = np.stack([0.5 + 0.3 * np.sin(f[0] * xx + c) * np.cos(f[1] * yy + f[2]) for c in (0, 1, 2)], -1)
    return np.clip(base + 0.03 * rng.standard_normal(base.shape), 0, 1)


def _folder(tmp_path, n=64, side=256):
    """``n`` files of ``side`` x ``side`` in two classes: 8-bit grey PNG, 16-bit grey PNG and JPEG in turn;
    image i's mean brightness grows with i, so a row of the model input tells which file it came from."""
    rng = np.random.default_rng(0)
    for i in range(n):
        d = tmp_path / "set" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        img = 0.1 + 0.8 * i / n + 0.05 * (_photo(rng, side) - 0.5)
        if i % 3 == 0:
            Image.fromarray((img[..., 0] * 255 + 0.5).astype(np.uint8)).save(d / f"{i:03d}.png")
        elif i % 3 == 1:
            Image.fromarray((img[..., 0] * 65535 + 0.5).astype(np.uint16)).save(d / f"{i:03d}.png")
        else:
            Image.fromarray((img * 255 + 0.5).astype(np.uint8)).save(d / f"{i:03d}.jpg", quality=90)
    return tmp_path / "set"


@pytest.mark.parametrize("size", [32, 64, 100])
def test_a_draft_decoded_jpeg_is_close_to_a_full_decode_then_resize(tmp_path, size):
    rng = np.random.default_rng(size)
    files = []
    for i in range(4):
        files.append(tmp_path / f"{i}.jpg")
        Image.fromarray((_photo(rng) * 255 + 0.5).astype(np.uint8)).save(files[-1], quality=90)
    draft = [open_image(f, "t", draft=size) for f in files]
    full = [open_image(f, "t") for f in files]
    assert full[0].shape == (256, 256, 3)
    scale = 256 // max(s for s in (1, 2, 4, 8) if 256 // s >= size)
    assert draft[0].shape == (scale, scale, 3) and scale < 256  # really decoded smaller
    diff = (to_model_input(draft, size, 3) - to_model_input(full, size, 3)).abs() / 2  # back to the [0, 1] scale
    assert float(diff.mean()) < 0.005 and float(diff.max()) < 0.06
    png = tmp_path / "a.png"
    Image.fromarray((_photo(rng) * 255).astype(np.uint8)).save(png)
    assert np.array_equal(open_image(png, "t", draft=size), open_image(png, "t"))  # only JPEGs are drafted


def test_a_16_bit_png_is_read_without_loss_through_the_parallel_loader(tmp_path):
    (tmp_path / "x" / "a").mkdir(parents=True)
    values = (np.arange(48 * 48).reshape(48, 48) * 28).astype(np.uint16)  # 0..64484, steps of 28 < 256
    for i in range(3):
        Image.fromarray(values + i).save(tmp_path / "x" / "a" / f"{i}.png")
    src = resolve(f"folder:{tmp_path / 'x'}")
    img = src.images([1])[0]
    assert img.dtype == np.float32 and len(np.unique(img)) == 48 * 48  # no two values merged (8 bits would merge them)
    np.testing.assert_array_equal(img, ((values + 1) / 65535.0).astype(np.float32))
    [(_, x)] = list(loader.model_batches(src, np.arange(3), 48, 1, 8, ahead=0, workers=3))
    expect = to_model_input([((values + i) / 65535.0).astype(np.float32) for i in range(3)], 48, 1)
    assert torch.equal(x, expect)


@pytest.mark.parametrize("chunk", [7, 64])
def test_parallel_decoding_gives_the_same_tensors_in_the_same_order(tmp_path, chunk, monkeypatch):
    src = resolve(f"folder:{_folder(tmp_path)}")
    idx = np.random.default_rng(1).permutation(len(src))[:50]
    one = list(loader.model_batches(src, idx, 32, 3, chunk, ahead=0, workers=1))
    seen = set()
    real = src.images_at
    monkeypatch.setattr(src, "images_at", lambda i, s: (seen.add(threading.current_thread().name), real(i, s))[1])
    many = list(loader.model_batches(src, idx, 32, 3, chunk, ahead=1, workers=4))
    assert [s for s, _ in many] == [s for s, _ in one] == list(range(0, 50, chunk))
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(many, one))  # bit for bit
    assert any(t.startswith("gsd-decode") for t in seen)
    assert not any(t.name.startswith("gsd-decode") for t in threading.enumerate())  # the pool is gone
    # the order: image i's brightness grows with i (the file names), so the rows follow idx
    x = torch.cat([b for _, b in many])
    order = [int(src.example_file(int(i)).rsplit("/", 1)[1][:3]) for i in idx]
    means = x.mean(dim=(1, 2, 3)).numpy()
    assert np.array_equal(np.argsort(means, kind="stable"), np.argsort(order, kind="stable"))
    sample = draw(src, 40, seed=3)  # labels are read by index, not through the pool: one per row, in order
    assert sample.labels().tolist() == [int(src.example_file(int(i)).split("/")[-2][1]) for i in sample.indices]


def test_the_first_unreadable_file_in_order_is_the_error(tmp_path):
    root = _folder(tmp_path, n=24, side=64)
    files = sorted(root.rglob("*.*"))
    for bad in (files[5], files[9]):
        bad.write_bytes(b"not an image")
    src = resolve(f"folder:{root}")
    idx = np.arange(len(src))
    first = min((i for i in idx if src.example_file(int(i)) in {str(files[5]), str(files[9])}))
    with pytest.raises(DatasetError, match=src.example_file(int(first)).rsplit("/", 1)[1]):
        list(loader.model_batches(src, idx, 16, 1, 24, ahead=0, workers=4))


def test_a_chunk_holds_at_most_workers_native_size_images(tmp_path, monkeypatch):
    """On the CPU each decoding thread resizes its image before taking the next one: the images alive
    at their native size never exceed the threads, whatever the chunk."""
    src = resolve(f"folder:{_folder(tmp_path, n=40, side=128)}")
    lock, live, peak, sizes = threading.Lock(), [0], [0], []
    real_read, real_resize = loader.read_images, loader.to_model_input

    def read(source, indices, size=None):
        out = real_read(source, indices, size)
        with lock:
            live[0] += len(out)
            peak[0] = max(peak[0], live[0])
        return out

    def resize(images, *a, **k):
        sizes.append(len(images))
        try:
            return real_resize(images, *a, **k)
        finally:
            with lock:
                live[0] -= len(images)

    monkeypatch.setattr(loader, "read_images", read)
    monkeypatch.setattr(loader, "to_model_input", resize)
    for _ in loader.model_batches(src, np.arange(40), 16, 3, 40, ahead=0, workers=3):
        pass
    assert set(sizes) == {1} and 1 <= peak[0] <= 3


def test_the_cache_key_of_a_file_backed_sample_names_the_decoding(tmp_path):
    src = resolve(f"folder:{_folder(tmp_path, n=6, side=32)}")
    fp = sample_fingerprint(src, [0, 1, 2])
    assert fp["content"]["how"] == "files" and fp["content"]["decode"] == DECODE


def test_16_bit_values_divided_in_float32_equal_the_float64_quotient_rounded():
    """pil_to_array divides 16-bit pixels in float32: the same float32 for every one of the 65,536 values."""
    v = np.arange(65536)
    assert np.array_equal((v / 65535.0).astype(np.float32), v.astype(np.float32) / np.float32(65535.0))
    from gsd_cli.data.decode import pil_to_array

    img = Image.fromarray(v.reshape(256, 256).astype(np.uint16))
    np.testing.assert_array_equal(pil_to_array(img), (v.reshape(256, 256) / 65535.0).astype(np.float32))


@pytest.mark.parametrize("header", [
    dict(dtype=np.uint16, bits_stored=12, window=(2048, 4000)),
    dict(dtype=np.uint16, photometric="MONOCHROME1"),
    dict(dtype=np.int16, signed=True, rescale=(1, -1024), window=(40, 400)),
    dict(dtype=np.uint8, voi_lut=255 - np.arange(256)),
])
def test_dicom_pixels_looked_up_per_value_equal_the_steps_on_every_pixel(tmp_path, header):
    """read_dicom computes the grey-scale steps once per stored value (a table) for images over 4,096
    pixels: the same float32 values, bit for bit, as the steps applied to every pixel."""
    pytest.importorskip("pydicom")
    import pydicom

    from gsd_cli.data.dicom import _grey, output_range, read_dicom
    from test_dicom import write_dicom

    header = dict(header)
    dtype = header.pop("dtype")
    info = np.iinfo(dtype)
    rng = np.random.default_rng(0)
    top = min(info.max, 4095) if header.get("bits_stored") == 12 else info.max
    px = rng.integers(max(info.min, -2000) if header.get("signed") else 0, top, (96, 96)).astype(dtype)
    f = write_dicom(tmp_path / "x.dcm", px, **header)
    got = read_dicom(f, "t")
    ds = pydicom.dcmread(f)
    lo, hi = output_range(ds)
    want = _grey(ds.pixel_array, ds, lo, hi, str(ds.PhotometricInterpretation))
    assert got.dtype == np.float32 and got.shape == px.shape and np.array_equal(got, want)


@pytest.mark.parametrize("shape", [(16, 16), (16, 16, 3), (20, 20)])
def test_one_image_is_resized_from_a_view_and_never_changed(shape):
    """to_model_input reads a lone image without copying it; the caller's array stays as it was, also
    when no resize is needed (the normalisation is in place on gsd's own tensor)."""
    img = np.random.default_rng(0).uniform(size=shape).astype(np.float32)
    keep = img.copy()
    x = to_model_input([img], 16, 3)
    assert np.array_equal(img, keep)
    assert torch.equal(x, to_model_input([img, img], 16, 3)[:1])  # the same as from a stacked copy
    img.setflags(write=False)
    assert torch.equal(to_model_input([img], 16, 3), x)  # a read-only image is copied, not refused


def test_sample_tensor_is_the_pipeline_s_chunks_in_one(tmp_path):
    src = resolve(f"folder:{_folder(tmp_path, n=12, side=64)}")
    sample = draw(src, 10, seed=2)
    whole = sample.tensor(16, 3)
    chunks = torch.cat([x for _, x in sample.batches(16, 3, 4)])
    assert whole.shape == (10, 3, 16, 16) and torch.equal(whole, chunks)


def test_training_reads_the_pixels_the_ranking_reads(tmp_path, monkeypatch):
    """gsd train (private steps, evaluation) asks a file-backed source for images at the model's size,
    as the ranking does: a JPEG is decoded by the same reduced-scale path, not at full size."""
    from gsd_cli.data.files import FolderSource
    from gsd_cli.train import TrainConfig, train

    folder = _folder(tmp_path, n=40, side=256)
    sizes = []
    real = FolderSource.images_at
    monkeypatch.setattr(FolderSource, "images_at", lambda self, idx, size: sizes.append(size) or real(self, idx, size))
    cfg = TrainConfig(private=f"folder:{folder}", private_test=f"folder:{folder}", method="dpsgd", epochs=1, batch_size=10,
                      epsilon=4.0, classes="2", insecure_seed=0)
    train(cfg, tmp_path / "run")
    assert sizes and set(sizes) == {28}  # fmnist-cnn's input: every read of the private and test images
