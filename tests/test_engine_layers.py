"""The ``layers`` engine (issue 21): one batched forward, one backward to the layer outputs, per-layer
rules. Its rows equal per-example autograd; it refuses what it cannot treat exactly; it needs neither
torch.func nor Opacus for Conv2d / Linear models."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gsd_cli import engine_layers
from gsd_cli.gradients.layers import LayersEngine, conv2d_grouped, conv2d_patches, conv2d_per_sample
from gsd_cli.errors import GSDError
from gsd_cli.gradients import default_loss, per_sample_gradients


def _per_example_conv_grads(layer: nn.Conv2d, x: torch.Tensor, g: torch.Tensor):
    """Brute force: for each example, autograd of <conv(x_i), g_i> w.r.t. weight and bias."""
    ws, bs = [], []
    for i in range(x.shape[0]):
        w, b = torch.autograd.grad((layer(x[i : i + 1]) * g[i : i + 1]).sum(), [layer.weight, layer.bias])
        ws.append(w)
        bs.append(b)
    return torch.stack(ws), torch.stack(bs)


@pytest.mark.parametrize("rule", [conv2d_patches, conv2d_grouped, conv2d_per_sample])
@pytest.mark.parametrize("shape", [
    # in, out, kernel, stride, padding, dilation, size
    (3, 5, 4, 3, 0, 1, 14),
    (1, 4, 5, 2, 3, 1, 11),
    (17, 3, 3, 1, 1, 1, 7),
    (4, 6, (3, 2), (2, 1), (1, 2), (2, 1), 9),
])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_conv2d_rules_match_per_example_autograd(rule, shape, layout):
    cin, cout, k, s, p, d, size = shape
    torch.manual_seed(0)
    layer = nn.Conv2d(cin, cout, k, stride=s, padding=p, dilation=d)
    x = torch.randn(5, cin, size, size + 1)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        g = torch.randn_like(layer(x))
    ref_w, ref_b = _per_example_conv_grads(layer, x, g)
    got = rule(layer, x, g)
    torch.testing.assert_close(got[layer.weight], ref_w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[layer.bias], ref_b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("channels", [2, 3])
def test_a_grey_image_at_a_colour_input_gets_the_same_rows_from_one_channel(layout, channels, monkeypatch):
    """Issue 53: channels that are copies of one (a grey image at the probe's colour input) are computed once and
    repeated: the rows equal per-example autograd, and the patches are read for one channel; one differing pixel
    turns the shortcut off."""
    import gsd_cli.gradients.layers as L

    torch.manual_seed(0)
    layer = nn.Conv2d(channels, 4, 8, stride=5)
    grey = torch.randn(6, 1, 33, 31)
    x = grey.expand(-1, channels, -1, -1).contiguous()
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        g = torch.randn_like(layer(x))
    seen = []
    real = L.conv2d_input_patches
    monkeypatch.setattr(L, "conv2d_input_patches", lambda lay, xx: seen.append(xx.shape[1]) or real(lay, xx))
    ref_w, ref_b = _per_example_conv_grads(layer, x, g)
    got = conv2d_patches(layer, x, g)
    torch.testing.assert_close(got[layer.weight], ref_w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[layer.bias], ref_b, rtol=1e-5, atol=1e-5)
    assert seen == [1]
    x2 = x.clone()
    x2[3, channels - 1, 5, 7] += 1.0  # one pixel of one channel differs: every channel's own patches
    ref_w, _ = _per_example_conv_grads(layer, x2, g)
    torch.testing.assert_close(conv2d_patches(layer, x2, g)[layer.weight], ref_w, rtol=1e-5, atol=1e-5)
    assert seen == [1, channels]


def test_conv2d_rule_choice_follows_the_input_channels(monkeypatch):
    calls = []
    monkeypatch.setattr(engine_layers, "conv2d_grouped", lambda *a: calls.append("grouped") or {})
    monkeypatch.setattr(engine_layers, "conv2d_patches", lambda *a: calls.append("patches") or {})
    for c in (engine_layers.GROUPED_MIN_CHANNELS - 1, engine_layers.GROUPED_MIN_CHANNELS):
        layer = nn.Conv2d(c, 2, 3)
        engine_layers.conv2d_per_sample(layer, torch.zeros(2, c, 5, 5), torch.zeros(2, 2, 3, 3))
    assert calls == ["patches", "grouped"]


class _Shared(nn.Module):
    """One Linear applied twice (shared weights) on 3-d inputs (a middle dimension to sum over)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(4, 4)
        self.head = nn.Linear(4 * 3, 3)

    def forward(self, x):
        h = torch.tanh(self.emb(torch.tanh(self.emb(x))))
        return self.head(h.flatten(1))


def test_a_layer_called_twice_sums_its_calls(brute_force):
    torch.manual_seed(0)
    model = _Shared()
    x, y = torch.randn(7, 3, 4), torch.randint(0, 3, (7,))
    names = [n for n, _ in model.named_parameters()]
    G = per_sample_gradients(model, x, y, chunk_size=4, engine="layers", device="cpu")
    torch.testing.assert_close(G, brute_force(model, x, y, names), rtol=1e-5, atol=1e-6)


class _InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        return self.out(F.relu(self.fc(x), inplace=True))


class _Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 8)
        self.drop = nn.Dropout(0.5)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        return self.out(self.drop(torch.tanh(self.fc(x))))


class _WithBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 4)
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 3)

    def forward(self, x):
        return self.out(self.bn(self.fc(x)))


class _BareParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.fc(x) * self.scale


class _Odd(nn.Module):
    """A parameterised leaf layer no rule knows."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(5))

    def forward(self, x):
        return x * self.w


@pytest.mark.parametrize("make, says", [
    (_InPlace, "changed in place"),
    (_Dropout, "the examples of a batch interact"),
    (_WithBatchNorm, "layer bn is a BatchNorm"),
    (_BareParameter, "parameter scale belongs to the model"),
    (lambda: nn.Sequential(_Odd(), nn.Linear(5, 3)), "no per-sample rule for layer type _Odd"),
])
def test_what_layers_refuses_is_a_one_line_error_naming_vmap(make, says):
    torch.manual_seed(0)
    model = make()
    x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
    with pytest.raises(GSDError) as e:
        per_sample_gradients(model, x, y, chunk_size=3, engine="layers", device="cpu")
    msg = str(e.value)
    assert says in msg and msg.endswith("use --engine vmap") and "\n" not in msg
    for mod in model.modules():  # no hook left behind
        assert not mod._forward_hooks


def test_auto_takes_vmap_for_dropout_and_inplace_models():
    for make in (_Dropout, _InPlace):
        torch.manual_seed(0)
        model = make()
        x, y = torch.randn(6, 5), torch.randint(0, 3, (6,))
        info: dict = {}
        from gsd_cli.gradients import gradient_matrix

        gradient_matrix(model, [(x[:3], y[:3]), (x[3:], y[3:])], 6, device="cpu", info=info)
        assert info["engine"] == "vmap" and "layers refused" in info["engine_choice"]


def test_the_check_runs_once_and_only_with_two_or_more_examples(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3))
    eng = LayersEngine(model, [n for n, _ in model.named_parameters()], default_loss)
    checks = []
    real = eng._check
    monkeypatch.setattr(eng, "_check", lambda *a: checks.append(a[0].shape[0]) or real(*a))
    out = torch.empty(4, 4 * 5 + 4 + 3 * 4 + 3)
    eng(torch.randn(1, 5), torch.randint(0, 3, (1,)), out[:1])  # one example: nothing to interact with
    eng(torch.randn(4, 5), torch.randint(0, 3, (4,)), out)
    eng(torch.randn(4, 5), torch.randint(0, 3, (4,)), out)
    assert checks == [4] and eng.checked


def test_the_probe_needs_neither_torch_func_nor_opacus():
    """The default rank's model takes no 1.2 s torch._dynamo import (torch.func's first call) and no
    1.4 s Opacus import: a fresh interpreter computes its rows with layers and has imported neither."""
    code = (
        "import sys, torch\n"
        "from probes.cnn import probe\n"
        "from gsd_cli.gradients import per_sample_gradients, gradient_matrix\n"
        "m = probe(10)\n"
        "x, y = torch.randn(3, 3, 224, 224), torch.randint(0, 10, (3,))\n"
        "info = {}\n"
        "G = gradient_matrix(m, [(x, y)], 3, device='cpu', info=info)\n"
        "assert G.shape == (3, 30202) and info['engine'] == 'layers', info\n"
        "print(sorted(k for k in ('torch._dynamo', 'opacus') if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_dp_gsd_private_side_takes_vmap_under_auto_and_the_public_sides_keep_auto(declared_pair, monkeypatch):
    """Under DP the clip bounds each example's own gradient only if the rows are per-example by
    construction: ``auto`` gives the private side vmap, the public sides (no privacy at stake) layers."""
    from gsd_cli import side
    from gsd_cli.ranking import rank

    private, public = declared_pair
    used = []
    real = side.gradient_matrix

    def spy(model, batches, m, names, loss, engine, *a, **k):
        info = a[-1] if a else k.get("info")
        G = real(model, batches, m, names, loss, engine, *a, **k)
        used.append((engine, info.get("engine") if info is not None else None))
        return G

    with monkeypatch.context() as spying:  # the spy alone is undone after it (monkeypatch.undo() would drop conftest's too)
        spying.setattr(side, "gradient_matrix", spy)
        r = rank(private, [public], k=2, examples=30, model="fmnist-cnn", dp=True, epsilon=5.0, device="cpu", distance="dp-gsd")
    assert r.dp and r.engine == "vmap"
    assert used[0] == ("vmap", "vmap") and used[1] == ("auto", "layers")
    r = rank(private, [public], k=2, examples=30, model="fmnist-cnn", dp=True, epsilon=5.0, device="cpu")  # DP energy
    assert r.dp and r.engine == "vmap"
    r = rank(private, [public], k=2, examples=30, model="fmnist-cnn", device="cpu")  # without DP: layers for both
    assert r.engine == "layers"


@pytest.fixture
def declared_pair(tiny):
    """A private and a public source from the ``tiny`` fixture's files."""
    return tiny["private"], tiny["public"]


# ------------------------------------------------------------------------------------ frozen BatchNorm
class _FrozenNorms(nn.Module):
    """Conv -> FrozenBatchNorm2d (the registered backbones' class) -> conv -> BatchNorm2d frozen by
    ``--batchnorm freeze`` -> Linear -> BatchNorm1d frozen on a 2-d input -> Linear -> BatchNorm1d
    frozen on a 3-d input; running statistics far from 0 and 1, so a rule that used batch statistics
    (or none) would be caught."""

    def __init__(self):
        super().__init__()
        from probes.backbones import FrozenBatchNorm2d

        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3), FrozenBatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 5, 3), nn.BatchNorm2d(5)
        self.fc1, self.bn3 = nn.Linear(5 * 4 * 4, 6), nn.BatchNorm1d(6)
        self.fc2, self.bn4 = nn.Linear(3, 3), nn.BatchNorm1d(2)
        self.out = nn.Linear(6 + 6, 3)
        for bn in (self.bn1, self.bn2, self.bn3, self.bn4):
            c = bn.num_features
            bn.running_mean.copy_(torch.linspace(-1.0, 2.0, c))
            bn.running_var.copy_(torch.linspace(0.3, 4.0, c))
            with torch.no_grad():
                bn.weight.copy_(torch.linspace(0.5, 1.5, c))
                bn.bias.copy_(torch.linspace(-0.2, 0.3, c))

    def forward(self, x):
        h = torch.tanh(self.bn2(self.conv2(torch.tanh(self.bn1(self.conv1(x))))))
        a = torch.tanh(self.bn3(self.fc1(h.flatten(1))))  # (n, 6)
        b = torch.tanh(self.bn4(self.fc2(a.view(-1, 2, 3))))  # BatchNorm1d on (n, 2, 3)
        return self.out(torch.cat([a, b.flatten(1)], 1))


def _frozen_norms(seed: int = 0):
    from gsd_cli.models.exact import make_exact

    torch.manual_seed(seed)
    model, done = make_exact(_FrozenNorms(), "freeze")
    assert done["layers"] == 3  # bn2, bn3, bn4 frozen; bn1 already was
    return model


@pytest.mark.parametrize("select", ["all", "weights", "biases"])
def test_frozen_batchnorm_rule_matches_brute_force(select, brute_force):
    from gsd_cli.gradients.layers import frozen_batchnorm

    model = _frozen_norms()
    names = [n for n, _ in model.named_parameters()
             if select == "all" or not n.startswith("bn") or n.endswith("weight" if select == "weights" else "bias")]
    assert all(frozen_batchnorm(m) for m in (model.bn1, model.bn2, model.bn3, model.bn4))
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(7, 3, 8, 8, generator=g) * 2 + 0.5, torch.randint(0, 3, (7,), generator=g)
    ref = brute_force(model, x, y, names)
    G = per_sample_gradients(model, x, y, params=names, chunk_size=4, engine="layers", device="cpu")
    torch.testing.assert_close(G, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
    assert not model.bn2.training and model.bn1.running_mean[0] == -1.0  # frozen and never updated


def test_registered_backbone_with_frozen_batchnorm_takes_layers(brute_force):
    """resnet18 (torchvision, FrozenBatchNorm2d) was refused with 'a BatchNorm, which mixes the examples
    of a batch in training' and fell back to vmap; its rows now come from layers, exactly."""
    from gsd_cli.gradients import gradient_matrix
    from probes import get_model_spec

    model = get_model_spec("resnet18").build(num_classes=10, seed=0)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(3, 3, 40, 40, generator=g), torch.randint(0, 10, (3,), generator=g)
    info: dict = {}
    G = gradient_matrix(model, [(x, y)], 3, device="cpu", info=info)
    assert info["engine"] == "layers", info["engine_choice"]
    names = [n for n, _ in model.named_parameters()]
    ref = brute_force(model, x, y, names)
    torch.testing.assert_close(G, ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))


class _NormAct(nn.BatchNorm2d):
    """A BatchNorm with its own forward (as timm's BatchNormAct2d: normalisation, then an activation)."""

    def forward(self, x):
        return torch.relu(super().forward(x))


def test_a_batchnorm_with_its_own_forward_gets_no_rule_even_frozen():
    from gsd_cli.gradients.layers import frozen_batchnorm
    from gsd_cli.models.exact import make_exact

    model, _ = make_exact(nn.Sequential(nn.Conv2d(3, 4, 3), _NormAct(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 3)), "freeze")
    assert not frozen_batchnorm(model[1])
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 3, (4,))
    with pytest.raises(GSDError, match="no per-sample rule for layer type Frozen_NormAct"):
        per_sample_gradients(model, x, y, engine="layers", device="cpu")
