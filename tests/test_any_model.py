"""Any model (issue 23): timm:NAME, PATH.py:FACTORY and nn.Module objects rank and train like the
registry's models; BatchNorm is frozen, replaced or refused so per-sample gradients stay exact; bad
references are one-line errors; the cache tells user models apart."""

from __future__ import annotations

import json
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn

import gsd_cli
from gsd_cli.cli import main
from gsd_cli.data import ArraySource
from gsd_cli.errors import ModelError
from gsd_cli.models.exact import batch_mixing_layers, make_exact
from gsd_cli.models.spec import TIMM_INSTALL, model_identity, model_label, resolve_model
from gsd_cli.models.peft import build_model

FAST = dict(examples=12, k=2, device="cpu", engine="vmap")


def _source(name: str, seed: int, n: int = 16, classes: int = 3) -> ArraySource:
    r = np.random.default_rng(seed)
    return ArraySource(name, r.uniform(size=(n, 16, 16)).astype(np.float32), r.integers(0, classes, n),
                       classes=[str(c) for c in range(classes)])


class BNNet(nn.Module):
    """A small CNN with BatchNorm (the layer that mixes a batch) and a declared input size."""

    input_size = 16

    def __init__(self, num_classes: int = 3):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


FACTORY = """
import torch.nn as nn

class Net(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.norm = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4, num_classes)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x)).{act}().mean((2, 3)))

def make(num_classes):
    return Net(num_classes)

def broken(num_classes):
    return 42

def no_classes():
    return Net(3)
"""


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "net.py"
    path.write_text(FACTORY.format(act="relu"))
    return path


def test_timm_tiny_model_ranks_end_to_end_with_its_batchnorm_frozen(tmp_path):
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file
    priv, a, b = _source("priv", 0), _source("a", 1), _source("b", 2)
    r = gsd_cli.rank(priv, [a, b], model="timm:test_resnet@16", **FAST)
    assert r.model == "timm:test_resnet@16" and len(r.results) == 2
    assert all(0 <= x.distance <= 1 for x in r.results)
    spec, net, names, info = build_model("timm:test_resnet@16", 3, 0)
    assert spec.input_size == 16 and spec.channels == 3 and info["batchnorm"]["policy"] == "freeze"
    assert not batch_mixing_layers(net) and info["batchnorm"]["layers"] > 0
    # pre-trained weights from a local file (never a download): everything but the head, statistics included
    other = timm.create_model("test_resnet", pretrained=False, num_classes=5)
    other.bn1.running_mean.uniform_()
    save_file(other.state_dict(), str(tmp_path / "w.safetensors"))
    _, loaded, _, info = build_model("timm:test_resnet@16", 3, 0, weights=str(tmp_path / "w.safetensors"))
    assert info["stage0"]["head_keys_dropped"] == ["fc.bias", "fc.weight"]
    assert torch.equal(loaded.bn1.running_mean, other.bn1.running_mean) and loaded.fc.out_features == 3


def test_frozen_batchnorm_gives_exact_per_sample_gradients(brute_force):
    """In a batch, each example's gradient is the one it has alone (torch.func; Opacus's hooks refuse a
    layer with buffers, and ``engine="auto"`` then takes vmap)."""
    model, info = make_exact(BNNet(), "freeze")
    model.train()
    assert info["layers"] == 1 and not model.bn.training
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 1, 16, 16, generator=g), torch.randint(0, 3, (6,), generator=g)
    names = [n for n, _ in model.named_parameters()]
    want = brute_force(model, x, y, names)
    got = gsd_cli.per_sample_gradients(model, x, y, engine="vmap", device="cpu")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    live = BNNet()  # the same weights with BatchNorm live: the batch's gradients are not the examples' own
    live.load_state_dict(model.state_dict())
    live.train()
    batch = torch.autograd.grad(nn.functional.cross_entropy(live(x), y, reduction="sum"), list(live.parameters()))
    assert not torch.allclose(torch.cat([t.reshape(-1) for t in batch]), want.sum(0), atol=1e-3)


def test_batchnorm_refused_with_the_layer_named_and_groupnorm_replaces_it():
    with pytest.raises(ModelError, match=r"'bn' \(BatchNorm2d\).*--batchnorm freeze.*--batchnorm groupnorm") as e:
        make_exact(BNNet(), "refuse", "mine")
    assert "\n" not in str(e.value)
    fixed, info = make_exact(BNNet(), "groupnorm")
    assert isinstance(fixed.bn, nn.GroupNorm) and fixed.bn.num_groups == 4 and info["policy"] == "groupnorm"
    no_stats = BNNet()
    no_stats.bn = nn.BatchNorm2d(4, track_running_stats=False)
    with pytest.raises(ModelError, match="'bn'.*cannot be frozen"):
        make_exact(no_stats, "freeze")
    with pytest.raises(ModelError, match="--batchnorm must be one of"):
        make_exact(BNNet(), "ignore")


def test_timm_batchnorm_act_keeps_its_activation_under_groupnorm():
    layers = pytest.importorskip("timm.layers")
    net = nn.Sequential(nn.Conv2d(1, 8, 3), layers.BatchNormAct2d(8, act_layer=nn.ReLU))
    fixed, _ = make_exact(net, "groupnorm")
    assert isinstance(fixed[1], nn.Sequential) and isinstance(fixed[1][0], nn.GroupNorm) and isinstance(fixed[1][2], nn.ReLU)
    assert (fixed(torch.randn(2, 1, 6, 6)) >= 0).all()  # the activation is still there


def test_file_factory_model_ranks_through_the_cli(capsys, model_file, npz_pair, tmp_path):
    out = tmp_path / "r.json"
    code = main(["rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}", f"npz:{npz_pair['far']}",
                 "--model", f"{model_file}:make@16x1", "--examples", "12", "--k", "2", "--engine", "vmap", "--device", "cpu",
                 "--json", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    r = json.loads(out.read_text())
    assert r["model"] == f"{model_file}:make@16x1" and len(r["results"]) == 2


def test_module_via_the_api_is_copied_and_ranks(brute_force):
    priv, a, b = _source("priv", 0), _source("a", 1), _source("b", 2)
    net = BNNet()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    r1 = gsd_cli.rank(priv, [a, b], model=net, **FAST)
    r2 = gsd_cli.rank(priv, [a, b], model=net, **FAST)
    assert r1.model.startswith("module:BNNet#") and r1.model == model_label(net)
    assert [(x.public, x.distance) for x in r1] == [(x.public, x.distance) for x in r2]
    assert type(net.bn) is nn.BatchNorm2d and all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    r3 = gsd_cli.rank(priv, [a, b], model=lambda num_classes: BNNet(num_classes), **FAST)  # a factory
    assert r3.model.startswith("factory:")


def test_train_refuses_batchnorm_by_default_and_trains_a_module_with_it_frozen(tiny, tmp_path):
    from gsd_cli.train import TrainConfig, train

    cfg = dict(private=tiny["private"], method="dpsgd", epochs=1, batch_size=40, epsilon=4.0, insecure_seed=1)
    with pytest.raises(ModelError, match="'bn' \\(BatchNorm2d\\)"):
        train(TrainConfig(model=BNNet(4), **cfg), tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    s = train(TrainConfig(model=BNNet(4), batchnorm="freeze", **cfg), tmp_path / "run")
    assert s["model"].startswith("module:BNNet#")
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["settings"]["model"] == s["model"] and saved["settings"]["batchnorm"] == "freeze"


def test_cli_train_refuses_batchnorm_in_one_line(capsys, tiny, tmp_path):
    path = tmp_path / "bn.py"
    path.write_text(textwrap.dedent("""
        import torch.nn as nn
        def make(num_classes):
            net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, num_classes))
            net.input_size = 16
            return net
    """))
    code = main(["train", "--private", tiny["private"], "--method", "dpsgd", "--model", f"{path}:make", "--epochs", "1", "--batch-size", "40",
                 "--out", str(tmp_path / "run"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len([l for l in err.splitlines() if l.strip()]) == 1, err
    assert "'1' (BatchNorm2d)" in err and "--batchnorm" in err
    assert not (tmp_path / "run").exists()


def test_timm_absent_gives_the_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm -> ImportError
    with pytest.raises(ModelError, match="install it with: pip install 'gsd-cli\\[timm\\]'") as e:
        resolve_model("timm:resnet10t")
    assert TIMM_INSTALL in str(e.value)


@pytest.mark.parametrize("ref, message", [
    ("{dir}/missing.py:make", "no such file"),
    ("{file}:nope", "defines no 'nope'; it defines Net, broken, make, no_classes"),
    ("{file}", "name the function or class"),
    ("{file}:broken@16x1", "returned a int, not a torch.nn.Module"),
    ("{file}:no_classes@16x1", "must take num_classes"),
    ("{file}:make", "input size is unknown"),
    ("{file}:make@16x3", "fails on a 1x3x16x16 input"),
    ("{dir}/raises.py:make", "running raises.py failed \\(ZeroDivisionError"),
    ("timm:resnet10", "did you mean"),
    ("nope", "unknown model 'nope'"),
    ("probe@5", "size after '@'"),
])
def test_bad_references_are_one_line_errors(model_file, ref, message):
    if ref.startswith("timm:"):
        pytest.importorskip("timm")
    (model_file.parent / "raises.py").write_text("x = 1 / 0\n")
    ref = ref.format(file=model_file, dir=model_file.parent)
    with pytest.raises(ModelError, match=message) as e:
        build_model(ref, 3, 0)
    assert "\n" not in str(e.value)


def test_wrong_number_of_outputs_is_named(tmp_path):
    with pytest.raises(ModelError, match=r"gives \(1, 3\) for one example, not \(1, 5\)"):
        build_model(BNNet(3), 5, 0)


def test_identity_follows_code_weights_and_file(model_file, tmp_path):
    _, a, _, _ = build_model(f"{model_file}:make@16x1", 3, 0)
    _, b, _, _ = build_model(f"{model_file}:make@16x1", 3, 1)  # other seed: other weights, same code
    assert model_identity(a, weights=False) == model_identity(b, weights=False)
    assert model_identity(a) != model_identity(b)
    other = tmp_path / "other"
    other.mkdir()
    (other / "net.py").write_text(FACTORY.format(act="tanh"))  # same class name and parameters, another forward
    _, c, _, _ = build_model(f"{other / 'net.py'}:make@16x1", 3, 0)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), c.state_dict().values()))
    assert model_identity(a, weights=False) != model_identity(c, weights=False)
    net = BNNet()
    twin = BNNet()
    twin.load_state_dict(net.state_dict())
    assert model_label(twin) == model_label(net) != model_label(BNNet())  # a module's label carries its weights


def test_models_show_takes_any_reference(model_file):
    from gsd_cli.models.info import show_model

    d = show_model(f"{model_file}:make@16x1", 3)
    assert d["input_size"] == 16 and d["channels"] == 1 and d["batchnorm"] is None
    assert [p["name"] for p in d["parameters"]] == ["conv.weight", "conv.bias", "norm.weight", "norm.bias", "fc.weight", "fc.bias"]
    shown = show_model(BNNet(), 3, batchnorm="groupnorm")
    assert shown["batchnorm"]["policy"] == "groupnorm" and shown["total"] == sum(p["count"] for p in shown["parameters"])


def test_the_disk_cache_keys_a_batchnorm_module_and_hits_the_second_time(tmp_path):
    from gsd_cli.ranking.cache import SubspaceCache

    priv, a, b = _source("priv", 0), _source("a", 1), _source("b", 2)
    cache = SubspaceCache(tmp_path / "cache")
    first = gsd_cli.rank(priv, [a, b], model=BNNet(), cache=cache, **FAST)  # num_batches_tracked: a 0-dim buffer
    again = gsd_cli.rank(priv, [a, b], model=BNNet(), cache=cache, **FAST)  # same class, other weights: a miss
    assert cache.misses == 4 and cache.hits == 0
    net = BNNet()
    gsd_cli.rank(priv, [a, b], model=net, cache=cache, **FAST)
    twice = gsd_cli.rank(priv, [a, b], model=net, cache=cache, **FAST)
    assert cache.hits == 2 and [x.distance for x in twice] != [x.distance for x in first] != [x.distance for x in again]
