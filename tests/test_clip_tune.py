"""The measured per-layer choice of ghost clipping (:mod:`gsd_cli.train.clipsum.tune`): which layers it
decides, that it reads only the private chunk's shape, and that either path it may pick gives the same
clipped sum as a brute-force per-example loop (so the choice moves speed, never the release)."""

from collections import OrderedDict

import itertools

import pytest
import torch
import torch.nn as nn

import gsd_cli.train.clipsum.tune as tune
from gsd_cli.gradients import _only_trainable
from gsd_cli.train.clipsum import ClippedSum
from gsd_cli.train.clipsum.step import LazyClipSum


def _net():
    """Two convolutions whose choice is open (T > 1, fastDP says ghost), a Linear on a sequence (T = 4,
    open too) and a Linear on vectors (T = 1: always ghost)."""
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(
        c1=nn.Conv2d(3, 32, 3, stride=4, padding=1), r1=nn.Tanh(),   # 4 x 4 out: T = 16, 2 T^2 < D C = 27 * 32
        c2=nn.Conv2d(32, 32, 3, padding=1), r2=nn.Tanh(),            # stride 1: its ghost norm by the pixel Gram
        f=nn.Flatten(2), t=_Transpose(), seq=nn.Linear(32, 24), r3=nn.Tanh(),  # 16 positions x 24
        f2=nn.Flatten(1), fc=nn.Linear(16 * 24, 5)))


class _Transpose(nn.Module):
    def forward(self, x):
        return x.transpose(1, 2)


def _data(n=6):
    g = torch.Generator().manual_seed(5)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 5, (n,), generator=g)


def _brute(brute_force, model, x, y, names, C):
    G = brute_force(model, x, y, names).double()
    nrm = G.norm(dim=1, keepdim=True)
    return (G * (C / nrm.clamp_min(1e-12)).clamp(max=1.0)).sum(0)


def test_tune_decides_the_open_layers_and_keeps_the_others_by_rule():
    model = _net().train()
    names = [n for n, _ in model.named_parameters()]
    x, y = _data()
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        paths = eng.tune(x, y) or eng.paths
    assert set(paths) == {"c1", "c2", "seq"}  # fc: T = 1, decided by rule
    assert set(paths.values()) <= {"ghost", "materialised"}
    assert all(g > 0 and m > 0 for g, m in eng.timings.values())
    with _only_trainable(model, names):
        eng(x, y, 1.0)
    assert eng.plan["fc"] == "ghost" and all(eng.plan[k] == v for k, v in paths.items())


def test_the_memory_cap_closes_the_choice(monkeypatch):
    monkeypatch.setattr(tune, "MATERIALISE_MAX_BYTES", 0)
    model = _net().train()
    names = [n for n, _ in model.named_parameters()]
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        eng.tune(*_data())
    assert eng.paths == {} and eng.timings == {}


@pytest.mark.parametrize("paths", list(itertools.product(["ghost", "materialised"], repeat=3)))
def test_every_choice_gives_the_brute_force_clipped_sum(paths, brute_force):
    model = _net().train()
    names = [n for n, _ in model.named_parameters()]
    x, y = _data()
    eng = ClippedSum(model, names)
    eng.paths = dict(zip(("c1", "c2", "seq"), paths))
    for C in (1e-3, 0.5, 1e6):
        with _only_trainable(model, names):
            s, _ = eng(x, y, C)
        ref = _brute(brute_force, model, x, y, names, C)
        torch.testing.assert_close(s.double(), ref, rtol=2e-5, atol=2e-6 * float(ref.abs().max()))
        assert {k: eng.plan[k] for k in ("c1", "c2", "seq")} == eng.paths


def test_tune_reads_only_the_shape_of_the_private_chunk(monkeypatch):
    """The timed batch is synthetic: a private chunk of 7.0s (or of NaNs) never reaches the layers."""
    seen = []
    real = ClippedSum._capture

    def spy(self, xs, ys):
        seen.append(xs.clone())
        return real(self, xs, ys)

    monkeypatch.setattr(ClippedSum, "_capture", spy)
    model = _net().train()
    names = [n for n, _ in model.named_parameters()]
    x = torch.full((5, 3, 16, 16), 7.0)
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        eng.tune(x, torch.zeros(5, dtype=torch.long))
        eng.tune(torch.full_like(x, float("nan")), torch.zeros(5, dtype=torch.long))
    assert seen and all(s.shape == x.shape and torch.isfinite(s).all() and not (s == 7.0).any() for s in seen)
    assert torch.equal(seen[0], seen[-1])  # the same stand-ins whatever the private values


def test_first_use_tunes_before_it_checks_and_reports_the_paths():
    model = _net()
    names = [n for n, _ in model.named_parameters()]
    lazy = LazyClipSum("auto", 1.0)
    x, y = _data()
    step = lazy.hook(model, names, x, y)
    assert step is not None and set(step.engine.paths) == {"c1", "c2", "seq"}
    for k, v in step.engine.paths.items():
        assert f"{k} {v}" in lazy.reason


def test_train_times_the_paths_on_a_chunk_of_public_size(tiny, tmp_path, monkeypatch):
    """gsd train times the paths on min(physical batch, expected batch) synthetic examples, never on the
    first Poisson chunk's own size (which depends on the private set; the paths go into summary.json)."""
    from gsd_cli.train import TrainConfig, train

    sizes = []
    real = tune.tune_paths

    def spy(engine, x, y, examples=None):
        sizes.append((x.shape[0], examples))
        return real(engine, x, y, examples)

    monkeypatch.setattr(tune, "tune_paths", spy)
    train(TrainConfig(private=tiny["private"], method="dpsgd", epsilon=4.0, epochs=1, batch_size=30, insecure_seed=5,
                      physical_batch=16, clip=0.5), tmp_path / "r")
    assert len(sizes) == 1 and sizes[0][1] == 16  # min(16, 30), whatever the first chunk held


def test_the_tuned_chunk_has_the_size_asked_for(monkeypatch):
    seen = []
    real = ClippedSum._capture
    monkeypatch.setattr(ClippedSum, "_capture", lambda self, xs, ys: seen.append(xs.shape[0]) or real(self, xs, ys))
    model = _net().train()
    names = [n for n, _ in model.named_parameters()]
    x, y = _data(3)
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        eng.tune(x, y, 7)
        eng.tune(x, y)
    assert seen == [7, 3]


@pytest.mark.parametrize("ratio, path", [(0.99, "ghost"), (0.8, "ghost"), (0.7, "materialised"), (1.2, "ghost")])
def test_a_near_tie_keeps_the_ghost_path_which_holds_less_memory(monkeypatch, ratio, path):
    """materialised / ghost time = ``ratio``: the materialised path only when faster by FASTER_BY (25%)."""
    import gsd_cli.gradients.engines as engines

    seconds = {"ghost": 1.0, "materialised": ratio}

    def fake_timed(fn, device):
        return seconds[fn.__name__]

    monkeypatch.setattr(engines, "timed", fake_timed)
    model = _net().train()
    names = [n for n, _ in model.named_parameters()]
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        eng.tune(*_data())
    assert tune.FASTER_BY == 0.25 and eng.paths and set(eng.paths.values()) == {path}
