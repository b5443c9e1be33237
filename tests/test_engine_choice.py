"""engine="auto" decides once per process and model structure (issue 21): by rule (layers where it
accepts the model, else vmap) on every device, or, when asked, by a robust measurement (warm-up,
alternating rounds, median); the rows never depend on it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gsd_cli import engines
from gsd_cli.gradients import default_loss, gradient_matrix, per_sample_gradients


@pytest.fixture(autouse=True)
def _fresh_choices():
    engines.forget_engine_choices()
    yield
    engines.forget_engine_choices()


def _chunks(x, y, cs):
    return [(x[i : i + cs], y[i : i + cs]) for i in range(0, x.shape[0], cs)]


class _NoHooks:
    """Stands in for the hooks engine: opening it fails the test."""

    name = "hooks"

    def __init__(self, *a, **k):
        raise AssertionError("the hooks engine was opened")


class _ScriptedTimer:
    """A fake timer: runs the engine, returns the next scripted time for the engine that ran (the
    engines are wrapped to say which, by ``track``)."""

    def __init__(self, script: dict[str, list[float]]):
        self.script = {k: list(v) for k, v in script.items()}
        self.calls = 0
        self.ran: list[str] = []

    def track(self, monkeypatch):
        for kind, cls in list(engines.ENGINE_CLASSES.items()):
            monkeypatch.setitem(engines.ENGINE_CLASSES, kind, type(cls.__name__, (cls,), {"__call__": self._wrap(cls)}))
        return self

    def _wrap(self, cls):
        def call(eng, x, y, out):
            self.ran.append(eng.name)
            cls.__call__(eng, x, y, out)
        return call

    def __call__(self, fn, device):
        fn()
        self.calls += 1
        return self.script[self.ran[-1]].pop(0)


def test_auto_on_cpu_is_layers_by_rule_without_opening_hooks(monkeypatch, make_all_layers, small_batch, brute_force):
    monkeypatch.setitem(engines.ENGINE_CLASSES, "hooks", _NoHooks)
    model = make_all_layers(seed=0)
    x, y = small_batch
    info: dict = {}
    G = gradient_matrix(model, _chunks(x, y, 5), 13, device="cpu", info=info)
    assert info["engine"] == "layers" and info["engine_choice"] == "rule: layers"
    ref = brute_force(model, x, y, [n for n, _ in model.named_parameters()])
    torch.testing.assert_close(G, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
    (choice,) = engines.engine_choices().values()
    assert choice["engine"] == "layers"


class _Centred(nn.Module):
    """Subtracts the batch mean of a hidden layer: the examples of a batch interact (no buffer, no
    BatchNorm: only layers' independence check on the first chunk can tell)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        h = self.fc(x)
        return self.out(torch.tanh(h - 0.5 * h.mean(0, keepdim=True)))


def test_auto_on_cpu_is_vmap_where_layers_refuses(monkeypatch):
    """layers refuses on the first chunk, auto takes vmap by rule and says why, and the rows are
    vmap's (each example a batch of its own), for this and every later chunk."""
    monkeypatch.setitem(engines.ENGINE_CLASSES, "hooks", _NoHooks)
    torch.manual_seed(0)
    model = _Centred()
    x, y = torch.randn(9, 6), torch.randint(0, 3, (9,))
    info: dict = {}
    G = gradient_matrix(model, _chunks(x, y, 4), 9, device="cpu", info=info)
    assert info["engine"] == "vmap"
    assert info["engine_choice"].startswith("rule: vmap (layers refused: the examples of a batch interact")
    ref = per_sample_gradients(model, x, y, chunk_size=4, engine="vmap", device="cpu")
    torch.testing.assert_close(G, ref)
    # not vacuous: without the check, the batched rows of the first chunk would differ from vmap's
    eng = engines.LayersEngine(model, [n for n, _ in model.named_parameters()], default_loss)
    eng.checked = True
    batched = torch.empty(4, ref.shape[1])
    eng(x[:4], y[:4], batched)
    assert not torch.allclose(batched, ref[:4], rtol=1e-3, atol=1e-5)


def test_measurement_takes_the_median_and_ignores_the_warm_up(monkeypatch, make_all_layers, small_batch, brute_force):
    """hooks: one outlier among fast runs; vmap: steady. The median picks hooks (the mean would pick
    vmap); the warm-up round is not timed; ``out`` holds rows of the engine left open."""
    model = make_all_layers(seed=1)
    model.train()
    x, y = small_batch
    names = [n for n, _ in model.named_parameters()]
    out = torch.empty(13, sum(p.numel() for p in model.parameters()))
    ref = brute_force(model, x, y, names)
    timer = _ScriptedTimer({"hooks": [0.1, 9.0, 0.1], "vmap": [0.2, 0.2, 0.2]}).track(monkeypatch)
    name, eng, seconds = engines.measure_engines(model, names, default_loss, x, y, out, torch.device("cpu"), timer=timer,
                                                 kinds=("vmap", "hooks"))
    try:
        assert name == "hooks" and eng.name == "hooks"
        assert seconds == {"hooks": [0.1, 9.0, 0.1], "vmap": [0.2, 0.2, 0.2]}
        assert timer.calls == 2 * engines.ROUNDS  # the warm-up round is not timed at all
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
    finally:
        eng.close()
    # the other way round: vmap wins; the last round ran hooks, so vmap recomputes the rows
    out.zero_()
    timer = _ScriptedTimer({"hooks": [0.3, 0.3, 0.3], "vmap": [0.2, 0.2, 0.2]}).track(monkeypatch)
    name, eng, _ = engines.measure_engines(model, names, default_loss, x, y, out, torch.device("cpu"), timer=timer,
                                           kinds=("vmap", "hooks"))
    eng.close()
    assert name == "vmap" and eng.name == "vmap"
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
    for mod in model.modules():  # no Opacus hook left behind
        assert not mod._forward_hooks and not mod._backward_hooks


def test_the_decision_is_made_once_per_structure(monkeypatch, make_all_layers, small_batch, brute_force):
    """Measured (as on a GPU) on the first call; the same structure with other weights reuses it;
    another chunk size or parameter selection decides again."""
    monkeypatch.setattr(engines, "MEASURE", True)
    timer = _ScriptedTimer({"hooks": [0.1] * 6, "vmap": [0.5] * 6, "layers": [0.3] * 6})
    timer.track(monkeypatch)
    monkeypatch.setattr(engines, "timed", timer)
    x, y = small_batch
    info: dict = {}
    a = make_all_layers(seed=2)
    G = gradient_matrix(a, _chunks(x, y, 5), 13, device="cpu", info=info)
    assert info["engine"] == "hooks" and info["engine_choice"].startswith("measured: vmap 0.5 s, hooks 0.1 s, layers 0.3 s")
    assert timer.calls == 9
    b = make_all_layers(seed=3)  # other weights, same structure
    G2 = gradient_matrix(b, _chunks(x, y, 5), 13, device="cpu", info=info)
    assert info["engine"] == "hooks" and info["engine_choice"].startswith("remembered")
    assert timer.calls == 9  # not measured again
    for model, M in ((a, G), (b, G2)):
        ref = brute_force(model, x, y, [n for n, _ in model.named_parameters()])
        torch.testing.assert_close(M, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
    gradient_matrix(b, _chunks(x, y, 4), 13, device="cpu", info=info)  # another chunk shape
    assert info["engine_choice"].startswith("measured") and timer.calls == 18
    assert len(engines.engine_choices()) == 2


def test_measurement_times_what_later_chunks_cost(monkeypatch, make_all_layers, small_batch):
    """Regression (H100): each round opened a fresh layers engine, so every timed layers run repeated its
    one-time independence check and auto picked hooks for the probe where layers was 1.7x faster. The
    vmap and layers engines opened in the warm-up now stay open: the check runs once, untimed, and
    neither engine is opened again in the rounds."""
    opened = {"vmap": 0, "layers": 0, "hooks": 0}
    checks = []
    for kind, cls in list(engines.ENGINE_CLASSES.items()):
        def init(eng, *a, _cls=cls, _kind=kind, **k):
            opened[_kind] += 1
            _cls.__init__(eng, *a, **k)
        monkeypatch.setitem(engines.ENGINE_CLASSES, kind, type(cls.__name__, (cls,), {"__init__": init}))
    real_check = engines.LayersEngine._check
    monkeypatch.setattr(engines.LayersEngine, "_check", lambda eng, *a: (checks.append(1), real_check(eng, *a)))
    model = make_all_layers(seed=4)
    model.train()
    x, y = small_batch
    names = [n for n, _ in model.named_parameters()]
    out = torch.empty(13, sum(p.numel() for p in model.parameters()))
    name, eng, seconds = engines.measure_engines(model, names, default_loss, x, y, out, torch.device("cpu"))
    eng.close()
    assert all(len(v) == engines.ROUNDS for v in seconds.values())
    assert len(checks) == 1
    assert opened["vmap"] == 1 and opened["layers"] == 1  # the warm-up's, kept (the winner is returned open)
    assert opened["hooks"] == 1 + engines.ROUNDS + (name == "hooks")
    for mod in model.modules():  # no Opacus hook left behind
        assert not mod._forward_hooks and not mod._backward_hooks


def test_the_key_follows_structure_not_weights(make_all_layers, small_batch):
    x, _ = small_batch
    cpu = torch.device("cpu")
    a, b = make_all_layers(seed=0), make_all_layers(seed=9)
    names = [n for n, _ in a.named_parameters()]
    key = engines.choice_key(a, names, default_loss, x[:5], cpu)
    assert key == engines.choice_key(b, names, default_loss, x[:5], cpu)
    assert key != engines.choice_key(a, names[:-1], default_loss, x[:5], cpu)
    assert key != engines.choice_key(a, names, default_loss, x[:4], cpu)
    assert key != engines.choice_key(a, names, default_loss, x[:5].double(), cpu)
    assert key != engines.choice_key(make_all_layers(seed=0, num_classes=5), names, default_loss, x[:5], cpu)


class _Scaled(nn.Module):
    """A layer with a buffer and a parameter of the model itself: Opacus refuses the buffer, layers the
    parameter outside a leaf layer (NotImplementedError each); vmap handles it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.w = nn.Parameter(torch.ones(3))
        self.register_buffer("scale", torch.full((3,), 2.0))

    def forward(self, x):
        return self.fc(x) * self.w * self.scale


def test_a_model_the_other_engines_refuse_gets_vmap_when_measured(monkeypatch):
    monkeypatch.setattr(engines, "MEASURE", True)
    torch.manual_seed(0)
    model = _Scaled()
    x, y = torch.randn(7, 6), torch.randint(0, 3, (7,))
    ref = per_sample_gradients(model, x, y, chunk_size=3, engine="vmap", device="cpu")
    G = per_sample_gradients(model, x, y, chunk_size=3, device="cpu")
    torch.testing.assert_close(G, ref)
    (choice,) = engines.engine_choices().values()
    assert choice["engine"] == "vmap" and "the other engines refuse" in choice["how"]


def _conv_frozen_bn():
    from probes.backbones import FrozenBatchNorm2d

    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), FrozenBatchNorm2d(4), nn.Tanh(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def test_a_refused_hooks_engine_leaves_no_hook_behind(brute_force):
    """Regression: Opacus adds hooks layer by layer and refuses at the first layer with buffers (a
    frozen BatchNorm); the conv's hooks stayed on the model, and the next engine (vmap) failed with
    'an autograd.Function ... must override the setup_context staticmethod'."""
    model = _conv_frozen_bn()
    model.train()
    names = [n for n, _ in model.named_parameters()]
    with pytest.raises(NotImplementedError, match="buffers"):
        engines.HooksEngine(model, names, default_loss)
    for mod in model.modules():
        assert not mod._forward_hooks and not mod._backward_hooks and not mod._forward_pre_hooks, type(mod).__name__
    with pytest.raises(NotImplementedError, match="buffers"):  # again: not "Trying to add hooks twice"
        engines.HooksEngine(model, names, default_loss)
    x, y = torch.randn(5, 3, 8, 8), torch.randint(0, 3, (5,))
    ref = brute_force(model, x, y, names)
    G = per_sample_gradients(model, x, y, chunk_size=3, engine="vmap", device="cpu")
    torch.testing.assert_close(G, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))


def test_measured_on_a_model_hooks_refuses(monkeypatch, brute_force):
    monkeypatch.setattr(engines, "MEASURE", True)
    model = _conv_frozen_bn()
    x, y = torch.randn(6, 3, 8, 8), torch.randint(0, 3, (6,))
    info: dict = {}
    G = gradient_matrix(model, _chunks(x, y, 3), 6, device="cpu", info=info)
    (choice,) = engines.engine_choices().values()
    assert info["engine"] in ("vmap", "layers") and choice["seconds"]["hooks"] == []
    ref = brute_force(model, x, y, [n for n, _ in model.named_parameters()])
    torch.testing.assert_close(G, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
