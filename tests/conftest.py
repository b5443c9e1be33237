"""Fixtures of the gsd tests: small npz datasets (numpy random generators) and image folders (PNG
files written with PIL), tiny models and a brute-force per-example gradient, a private cache and ledger;
and, for the whole session, a temporary folder in place of the user's HOME, XDG folders, ledger and caches
(:data:`SANDBOX`, set when this file is imported)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

#: The environment variables that stand for the user's folders, each pointed into one temporary folder
#: (``$GSD_TEST_SANDBOX``) when this file is imported: before any fixture runs (module- and session-scoped
#: ones too, and the processes the tests start, which inherit it), so no test reaches the user's HOME,
#: privacy ledger, ledger keys, caches or data root even where a test drops its per-test settings
#: (``monkeypatch.undo()``). The per-test fixtures below then give every test a fresh ledger and cache.
SANDBOX_ENV = "GSD_TEST_SANDBOX"
SANDBOX_DIRS = {"HOME": "home", "XDG_DATA_HOME": "data", "XDG_CONFIG_HOME": "config", "XDG_CACHE_HOME": "cache",
                "GSD_CACHE_DIR": "gsd-cache"}
#: the user's own settings that would reach past the sandbox (a ledger key, a data root) or change what the
#: tests see (tracebacks, a stage-timing file): unset for the session
UNSET = ("GSD_LEDGER_KEY", "GSD_DATA_ROOT", "GSD_DEBUG", "GSD_STAGE_TIMES", "GSD_TEST_RAY_FAIL_ONCE")


def _sandbox() -> Path:
    """The session's stand-in for the user's folders (:data:`SANDBOX_DIRS`); a process started by a test
    that imports this file again keeps its parent's."""
    given = os.environ.get(SANDBOX_ENV)
    if given and Path(given).is_dir():
        return Path(given)
    root = Path(tempfile.mkdtemp(prefix="gsd-tests-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    os.environ[SANDBOX_ENV] = str(root)
    for var, sub in SANDBOX_DIRS.items():
        (root / sub).mkdir()
        os.environ[var] = str(root / sub)
    os.environ["GSD_LEDGER"] = str(root / "data" / "gsd-ledger.sqlite")
    for var in UNSET:
        os.environ.pop(var, None)
    return root


SANDBOX = _sandbox()

import numpy as np  # noqa: E402 - after the sandbox: nothing imported may see the user's folders
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

from gsd_cli.gradients import default_loss  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread. The tests' tensors are tiny: on the 2-core CI machine, and on any busy
    machine, OpenMP threads spinning against each other made it 7-1000x slower (4000 calls of
    projection_metric: 53 s with 2 threads, 0.05 s with one). Results do not depend on it."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(autouse=True)
def _private_cache_dir(tmp_path_factory, monkeypatch):
    """`gsd rank` caches public subspaces; tests never touch the user's cache."""
    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path_factory.mktemp("gsd-cache")))


@pytest.fixture(autouse=True)
def _private_ledger(tmp_path_factory, monkeypatch):
    """DP runs book into the privacy ledger (`gsd budget`); tests never touch the user's, nor its keys."""
    monkeypatch.setenv("GSD_LEDGER", str(tmp_path_factory.mktemp("gsd-ledger") / "ledger.sqlite"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("gsd-config")))
    monkeypatch.delenv("GSD_LEDGER_KEY", raising=False)


# --------------------------------------------------------------------------------------------
# datasets on disk


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
def write_npz(tmp_path):
    """``write_npz(name, **arrays)`` -> path of ``tmp_path/name.npz`` holding the arrays."""

    def write(name: str, **arrays) -> Path:
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        return path

    return write


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
def image_folder(tmp_path):
    """ImageFolder layout, 2 classes (cats, dogs) x 6 RGB PNGs; returns the root."""
    root = tmp_path / "folder"
    rng = np.random.default_rng(0)
    for c, cls in enumerate(["cats", "dogs"]):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            arr = (rng.uniform(size=(20 + c, 18, 3)) * 255).astype(np.uint8)
            Image.fromarray(arr).save(root / cls / f"{i}.png")
    return root


@pytest.fixture
def mixed_image_folder(tmp_path):
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


# --------------------------------------------------------------------------------------------
# models and per-example gradients


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
# training


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


@pytest.fixture
def pg_server(tmp_path):
    """A real PostgreSQL (pgserver) for the budget-server tests, with sqlalchemy; skipped, with the reason,
    where it is not installed or cannot start on this machine. Stopped after the test."""
    try:
        import pgserver
        import psycopg  # noqa: F401
        import sqlalchemy  # noqa: F401
    except ImportError as e:
        pytest.skip(f"no pip-installable PostgreSQL here ({e.name} missing: pip install 'gsd-cli[budget-server]' pgserver)")
    try:
        server = pgserver.get_server(tmp_path / "pg", cleanup_mode="stop")
    except Exception as e:  # noqa: BLE001 - a server that cannot start on this machine is a skip, with its reason
        detail = " ".join(str(getattr(e, "stderr", "") or getattr(e, "output", "") or "").split())[-300:]
        pytest.skip(f"PostgreSQL (pgserver) did not start: {type(e).__name__}: {e} {detail}")
    try:
        yield server
    finally:
        server.cleanup()
