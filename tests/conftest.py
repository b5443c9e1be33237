import numpy as np
import pytest
from PIL import Image


@pytest.fixture
def npz_pair(tmp_path):
    """Two small npz datasets: 'near' shares the private set's distribution, 'far' does not."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, size=(4, 16, 16))

    def make(n, shift, noise, seed):
        r = np.random.default_rng(seed)
        y = r.integers(0, 4, size=n)
        x = np.clip(base[y] * (1 - shift) + shift * r.uniform(size=(n, 16, 16)) + noise * r.normal(size=(n, 16, 16)), 0, 1)
        return (x * 255).astype(np.uint8), y

    paths = {}
    for name, args in {"priv": (60, 0.0, 0.05, 1), "near": (60, 0.0, 0.05, 2), "far": (60, 1.0, 0.3, 3)}.items():
        x, y = make(*args)
        paths[name] = tmp_path / f"{name}.npz"
        np.savez(paths[name], x=x, y=y)
    return paths


@pytest.fixture
def image_folder(tmp_path):
    root = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for c, cls in enumerate(["cats", "dogs"]):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            arr = (rng.uniform(size=(20 + c, 18, 3)) * 255).astype(np.uint8)
            Image.fromarray(arr).save(root / cls / f"{i}.png")
    return root


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    """`gsd rank` caches public subspaces; tests never touch the user's cache."""
    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path_factory.mktemp("gsd-cache")))
