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
        declared = {"classes": np.array(["0", "1", "2", "3"])} if name == "priv" else {}  # as DP ranking and training need
        np.savez(paths[name], x=x, y=y, **declared)
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


@pytest.fixture
def tiny(tmp_path):
    """A 4-class 16x16 grey private set (120 examples, its classes declared, as private training
    requires) and a 12x12 colour public set (a different size)."""
    rng = np.random.default_rng(0)
    base = rng.uniform(size=(4, 16, 16))
    y = rng.integers(0, 4, 120)
    x = np.clip(base[y] + 0.1 * rng.normal(size=(120, 16, 16)), 0, 1)
    np.savez(tmp_path / "priv.npz", x=(x * 255).astype(np.uint8), y=y, classes=np.array(["a", "b", "c", "d"]))  # declared
    xp = rng.uniform(size=(60, 12, 12, 3))
    np.savez(tmp_path / "pub.npz", x=(xp * 255).astype(np.uint8), y=rng.integers(0, 3, 60))
    return {"private": f"npz:{tmp_path / 'priv.npz'}", "public": f"npz:{tmp_path / 'pub.npz'}"}


@pytest.fixture
def interrupt():
    """``interrupt(kind, n)``: a training progress callback that stops the run, as a crash would, when
    ``kind`` ("epoch", "public"...) reaches ``n``; ``interrupt.error`` is the exception it raises."""

    class Interrupted(Exception):
        pass

    def after(kind: str = "epoch", n: int = 1):
        def progress(k, done, total):
            if k == kind and done == n:
                raise Interrupted(f"{kind} {n}")
        return progress

    after.error = Interrupted
    return after
