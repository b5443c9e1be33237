"""Fixtures of the gsd test suite: tiny models, a brute-force per-example gradient, small npz
datasets (numpy random generators) and small image folders (PNG files written with PIL)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image

from gsd_cli.gradients import default_loss


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread. The suite's tensors are tiny: on the 2-core CI machine, and on any busy
    machine, OpenMP threads spinning against each other made it 7-1000x slower (4000 calls of
    projection_metric: 53 s with 2 threads, 0.05 s with one). Results do not depend on it."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# --------------------------------------------------------------------------------------------
# models


class AllLayers(nn.Module):
    """Every layer type the probes use, in one small network on 3 x 12 x 12 inputs:
    Conv2d with and without bias, GroupNorm with affine=True and affine=False, ReLU (module and
    functional), tanh (module and functional), MaxPool2d, AvgPool2d, Linear."""

    def __init__(self, num_classes: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, stride=1, bias=True)  # 12 -> 10
        self.gn1 = nn.GroupNorm(3, 6, affine=True)
        self.act1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)  # 10 -> 5
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1, bias=False)  # 5 -> 5
        self.gn2 = nn.GroupNorm(4, 8, affine=False)
        self.act2 = nn.Tanh()
        self.pool2 = nn.AvgPool2d(2)  # 5 -> 2
        self.fc1 = nn.Linear(8 * 2 * 2, 10)
        self.fc = nn.Linear(10, num_classes)

    def forward(self, x):
        x = self.pool1(self.act1(self.gn1(self.conv1(x))))
        x = self.pool2(self.act2(self.gn2(self.conv2(x))))
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc(torch.tanh(x))


def _all_layers(seed: int = 0, num_classes: int = 4) -> AllLayers:
    torch.manual_seed(seed)
    model = AllLayers(num_classes)
    with torch.no_grad():  # GroupNorm starts at weight 1, bias 0: move it so its gradients matter
        model.gn1.weight.uniform_(0.5, 1.5)
        model.gn1.bias.uniform_(-0.5, 0.5)
    return model


@pytest.fixture
def make_all_layers():
    """``make_all_layers(seed=0, num_classes=4)`` -> a fresh :class:`AllLayers`."""
    return _all_layers


@pytest.fixture
def small_batch():
    """13 inputs 3 x 12 x 12 and labels in 0..3 (13 is prime: no chunk size > 1 divides it)."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(13, 3, 12, 12, generator=g), torch.randint(0, 4, (13,), generator=g)


def _brute_force(model: nn.Module, x: torch.Tensor, y: torch.Tensor, names, loss=None) -> torch.Tensor:
    """Per-example gradients the slow, obvious way: one autograd.grad per example."""
    loss = loss or default_loss
    params = dict(model.named_parameters())
    saved = {n: p.requires_grad for n, p in params.items()}
    for n in names:
        params[n].requires_grad_(True)
    rows = []
    try:
        for i in range(x.shape[0]):
            value = loss(model(x[i : i + 1]), y[i : i + 1]).sum()
            grads = torch.autograd.grad(value, [params[n] for n in names])
            rows.append(torch.cat([g.reshape(-1) for g in grads]))
    finally:
        for n, p in params.items():
            p.requires_grad_(saved[n])
    return torch.stack(rows).detach()


@pytest.fixture
def brute_force():
    """``brute_force(model, x, y, names)`` -> (m, p): per-example autograd, columns in ``names`` order."""
    return _brute_force


# --------------------------------------------------------------------------------------------
# datasets on disk


def _templates(seed: int, n_classes: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 1, size=(n_classes, size, size))
    # smooth them a little so they look like images rather than noise
    return (t + np.roll(t, 1, axis=1) + np.roll(t, 1, axis=2) + np.roll(t, (1, 1), axis=(1, 2))) / 4


@pytest.fixture
def write_npz(tmp_path):
    """``write_npz(name, **arrays)`` -> path of ``tmp_path/name.npz`` holding the arrays."""

    def write(name: str, **arrays) -> Path:
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        return path

    return write


@pytest.fixture
def npz_sets(tmp_path):
    """Three 28 x 28 grey uint8 datasets of 60 examples, 4 classes: ``priv`` and ``near`` are two
    draws from one distribution (class templates plus a little noise), ``far`` is uniform noise."""
    base = _templates(0, 4, 28)

    def structured(n, seed):
        r = np.random.default_rng(seed)
        y = r.integers(0, 4, size=n)
        x = np.clip(base[y] + 0.05 * r.normal(size=(n, 28, 28)), 0, 1)
        return (x * 255).astype(np.uint8), y

    def noise(n, seed):
        r = np.random.default_rng(seed)
        return r.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), r.integers(0, 4, size=n)

    paths = {}
    for name, (x, y) in {"priv": structured(60, 1), "near": structured(60, 2), "far": noise(60, 3)}.items():
        paths[name] = tmp_path / f"{name}.npz"
        np.savez(paths[name], x=x, y=y)
    return paths


@pytest.fixture
def image_folder(tmp_path):
    """ImageFolder layout, 3 classes x 4 PNGs of mixed sizes and modes (RGB, L, RGBA).

    Returns ``(root, files)`` with ``files[class_name]`` the list of paths written.
    """
    root = tmp_path / "images"
    rng = np.random.default_rng(0)
    files = {}
    for c, cls in enumerate(["ants", "bees", "wasps"]):
        (root / cls).mkdir(parents=True)
        files[cls] = []
        for i in range(4):
            h, w = 10 + 2 * c + i, 14 - i
            mode = ("RGB", "L", "RGBA")[(c + i) % 3]
            shape = (h, w) if mode == "L" else (h, w, len(mode))
            arr = rng.integers(0, 256, size=shape, dtype=np.uint8)
            path = root / cls / f"img{i}.png"
            Image.fromarray(arr, mode=mode).save(path)
            files[cls].append(path)
    return root, files


@pytest.fixture
def empty_dir(tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    return d


@pytest.fixture
def garbage_folder(tmp_path):
    """ImageFolder layout with 6 good PNGs and one .png file of garbage bytes."""
    root = tmp_path / "broken"
    rng = np.random.default_rng(1)
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, size=(16, 16), dtype=np.uint8), mode="L").save(root / cls / f"{i}.png")
    (root / "b" / "zz_broken.png").write_bytes(b"this is not a png at all \x00\x01\x02" * 10)
    return root
