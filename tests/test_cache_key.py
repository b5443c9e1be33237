"""Issue 21, the public cache key: computed from what the drawn examples are made of (raw rows, file
bytes), their labels and every setting, never from a second decode and resize; the same in every
process; any one change gives another key."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image

import gsd_cli.data.loader as loader
import gsd_cli.data.transform as transform
from gsd_cli.ranking.cache import SCHEMA, SubspaceCache, public_cache_key
from gsd_cli.data import ArraySource, ImageSource, draw, resolve
from gsd_cli.data.fingerprint import content_digest
from gsd_cli.errors import DatasetError

COMMON = dict(k=2, names=["1.weight", "1.bias"], row_norm="unit", labels="random", input_size=8, channels=1,
              num_classes=3, seed=0, sketch_dim=None, loss=None, engine="auto", device="cpu", chunk_size=None)


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 3))


def _key(sample, net=None, **over):
    return public_cache_key(SubspaceCache("unused"), net if net is not None else _net(), sample, {**COMMON, **over})


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "imgs"
    rng = np.random.default_rng(0)
    for c in ("a", "b", "c"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            Image.fromarray(rng.integers(0, 256, (9, 7), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


@pytest.fixture
def no_resize(monkeypatch):
    """The key must not compute model input: any call to the transform fails the test."""

    def refuse(*a, **k):
        raise AssertionError("the cache key resized the sample")

    monkeypatch.setattr(transform, "to_model_input", refuse)
    monkeypatch.setattr(loader, "to_model_input", refuse)


def test_a_drawn_files_bytes_change_the_key_an_undrawn_files_do_not(folder, no_resize):
    src = resolve(f"folder:{folder}")
    smp = draw(src, 6, seed=0)
    key = _key(smp)
    assert content_digest(src, smp.indices)["how"] == "files"
    assert _key(draw(resolve(f"folder:{folder}"), 6, seed=0)) == key  # same inputs, same key
    undrawn = next(i for i in range(len(src)) if i not in set(smp.indices.tolist()))
    with open(src.example_file(undrawn), "ab") as f:
        f.write(b"\0")
    assert _key(smp) == key
    drawn = src.example_file(int(smp.indices[3]))
    arr = np.asarray(Image.open(drawn)).copy()
    arr[0, 0] ^= 1  # one pixel, one bit
    Image.fromarray(arr).save(drawn)
    assert _key(smp) != key


def test_indices_labels_and_every_setting_change_the_key(no_resize):
    rng = np.random.default_rng(0)
    src = ArraySource("arr", rng.uniform(size=(40, 8, 8)).astype(np.float32), rng.integers(0, 3, 40), 3)
    smp = draw(src, 10, seed=0)
    net = _net()
    key = _key(smp, net)
    keys = {key}
    other = draw(src, 10, seed=1)
    assert not np.array_equal(other.indices, smp.indices)
    variants = [_key(other, net), _key(type(smp)(src, smp.indices[::-1].copy()), net),
                _key(smp, _net(seed=1)), _key(smp, nn.Sequential(nn.Flatten(), nn.Linear(64, 3), nn.Tanh()))]
    for name, value in [("k", 3), ("names", ["1.weight"]), ("row_norm", "none"), ("labels", "own"),
                        ("input_size", 16), ("channels", 3), ("num_classes", 4), ("seed", 1), ("sketch_dim", 32)]:
        variants.append(_key(smp, net, **{name: value}))
    assert len(set(variants) | keys) == len(variants) + 1  # every one differs from the key and each other
    for name, value in [("engine", "hooks"), ("chunk_size", 3), ("device", "meta")]:  # same subspace
        assert _key(smp, net, **{name: value}) == key
    with torch.no_grad():
        net[1].bias[0] += 1e-6  # weights changed in place: the kept digest is not reused
    assert _key(smp, net) != key
    src._x[smp.indices[0], 0, 0] += 1e-7  # one drawn pixel
    assert _key(smp, _net()) != key


class _Custom(ImageSource):
    """A source with neither arrays nor files: its images are decoded (not resized) for the key."""

    name, num_classes = "custom", 3

    def __init__(self, shift=0.0):
        self.shift = shift

    def __len__(self):
        return 12

    def labels(self, indices):
        return np.asarray(indices, dtype=np.int64) % 3

    def images(self, indices):
        return [np.full((5, 5), i / 20 + self.shift, np.float32) for i in indices]


def test_other_sources_key_on_their_decoded_images(no_resize):
    smp = draw(_Custom(), 6, seed=0)
    assert content_digest(smp.source, smp.indices)["how"] == "decoded"
    assert _key(smp) == _key(draw(_Custom(), 6, seed=0))
    assert _key(smp) != _key(draw(_Custom(shift=0.01), 6, seed=0))


class _Framed(ImageSource):
    name, num_classes = "framed", 2

    def __init__(self, files, frame):
        self.files, self.frame = files, frame

    def __len__(self):
        return len(self.files)

    def labels(self, indices):
        return np.zeros(len(indices), np.int64)

    def images(self, indices):
        raise AssertionError("not read for the key")

    def example_file(self, index):
        return self.files[int(index)]


def test_a_read_setting_of_a_file_backed_source_changes_the_key(tmp_path):
    files = []
    for i in range(4):
        files.append(tmp_path / f"{i}.bin")
        files[-1].write_bytes(bytes([i]) * 10)
    idx = np.arange(4)
    assert content_digest(_Framed(files, 0), idx) == content_digest(_Framed(files, 0), idx)
    assert content_digest(_Framed(files, 0), idx) != content_digest(_Framed(files, 1), idx)
    files[2].unlink()
    with pytest.raises(DatasetError, match="cannot read image"):
        content_digest(_Framed(files, 0), idx)


def test_the_key_is_the_same_in_another_process():
    script = (
        "import json, sys, torch, torch.nn as nn\n"
        "from gsd_cli.ranking.cache import SubspaceCache, public_cache_key\n"
        "from gsd_cli.data import draw, resolve\n"
        "common = json.loads(sys.argv[1])\n"
        "torch.manual_seed(0)\n"
        "net = nn.Sequential(nn.Flatten(), nn.Linear(64, 3))\n"
        "smp = draw(resolve('digits:test'), 50, seed=3)\n"
        "print(public_cache_key(SubspaceCache('unused'), net, smp, common))\n"
    )
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # another salt for str hashes than ours
    there = subprocess.run([sys.executable, "-c", script, json.dumps(COMMON)], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip()
    assert len(there) == 64 and there == _key(draw(resolve("digits:test"), 50, seed=3))


def test_entries_of_the_old_schema_miss_and_are_cleared(tmp_path):
    from safetensors.torch import save_file

    cache = SubspaceCache(tmp_path / "c")
    key = "cd" * 32
    cache.directory.mkdir()
    V, s = torch.eye(4, 2, dtype=torch.float64), torch.ones(2)
    cache.store(key, V, s, {"name": "x", "examples": 4, "engine": "vmap"})
    assert cache.load(key) is not None and SCHEMA == 2
    from gsd_cli.ranking.cache import _tensor_digest

    meta = {"gsd": json.dumps({"schema": 1, "key": key, "sha256": _tensor_digest(V, s), "examples": 4})}
    save_file({"V": V, "s": s}, str(cache.path(key)), metadata=meta)
    assert cache.load(key) is None and cache.get(key, "x") is None  # a miss, never trusted
    assert cache.info()["entries"] == 1 and cache.clear()["deleted"] == 1
