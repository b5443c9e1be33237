"""Models at any size (issue 44): ``probe@SIZE`` and ``fmnist-cnn@SIZE`` work at every size from the
smallest that can work (the Linear layer's input computed from the feature map), their native size
unchanged bit for bit; every other size, and the other registered models' sizes that cannot work, are
refused in one line naming the smallest that works."""

from __future__ import annotations

import json
import os
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn as nn

import gsd_cli
from gsd_cli.cli import main
from gsd_cli.errors import ModelError
from gsd_cli.gradients import gradient_matrix
from gsd_cli.models.spec import resolve_model
from probes import check_input_size, get_model_spec, list_models, smallest_input_size
from probes.cnn import fmnist_side, probe_side, smallest_size

SMALLEST = {"probe": 73, "fmnist-cnn": 14}
#: GSD_ALL_SIZES=1: rank and a 1-step train end to end at every size (minutes); otherwise a spread of them
ALL = os.environ.get("GSD_ALL_SIZES") == "1"
END_TO_END = {"fmnist-cnn": list(range(14, 225)) if ALL else [14, 15, 16, 17, 21, 28, 32, 57, 224],
              "probe": list(range(73, 225)) if ALL else [73, 74, 77, 96, 112, 150, 223, 224]}


def _paper_probe(num_classes=10, in_channels=3):
    """Paper 004 Table 7b exactly as it was written before sizes (fixed 144 inputs)."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(in_channels, 64, kernel_size=8, stride=5), act1=nn.ReLU(), pool1=nn.MaxPool2d(2),
        conv2=nn.Conv2d(64, 16, kernel_size=4, stride=3), act2=nn.ReLU(), pool2=nn.MaxPool2d(2),
        flatten=nn.Flatten(), fc=nn.Linear(144, num_classes)))


def _paper_fmnist(num_classes=10, in_channels=1):
    """Paper 004 Table 7a exactly as it was written before sizes (fixed 32 x 4 x 4 inputs)."""
    return nn.Sequential(OrderedDict(
        conv1=nn.Conv2d(in_channels, 16, kernel_size=8, stride=2, padding=3), act1=nn.ReLU(), pool1=nn.MaxPool2d(2, stride=1),
        conv2=nn.Conv2d(16, 32, kernel_size=4, stride=2), act2=nn.ReLU(), pool2=nn.MaxPool2d(2, stride=1),
        flatten=nn.Flatten(), fc1=nn.Linear(32 * 4 * 4, 32), act3=nn.ReLU(), fc2=nn.Linear(32, num_classes)))


@pytest.mark.parametrize("name, ref, native, count", [("probe", _paper_probe, 224, 30_202), ("fmnist-cnn", _paper_fmnist, 28, 26_010)])
@pytest.mark.parametrize("suffix", ["", "@NATIVE"])
def test_the_native_size_is_the_papers_network_bit_for_bit(name, ref, native, count, suffix):
    spec = get_model_spec(name + suffix.replace("NATIVE", str(native)))
    for seed in (0, 7):
        net = spec.build(num_classes=10, seed=seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            old = ref(10, spec.channels)
        assert repr(net) == repr(old)  # the model's identity (cache keys) digests its repr
        assert sum(p.numel() for p in net.parameters()) == count
        a, b = net.state_dict(), old.state_dict()
        assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_the_smallest_sizes_are_the_layer_arithmetic():
    """The feature-map side against a forward pass at every size (meta device: shapes only)."""
    for name, side in (("probe", probe_side), ("fmnist-cnn", fmnist_side)):
        assert smallest_size(side) == SMALLEST[name] == smallest_input_size(get_model_spec(name))
        ref = _paper_probe if name == "probe" else _paper_fmnist
        convs = nn.Sequential(*list(ref(10, 1).children())[:6])  # up to the last pooling
        for s in range(1, 300):
            try:
                got = convs(torch.zeros(1, 1, s, s)).shape[-1]
            except RuntimeError:
                got = 0
            assert side(s) == got, (name, s)


@pytest.mark.parametrize("name", ["probe", "fmnist-cnn"])
def test_every_size_from_the_smallest_gives_per_sample_gradients_and_a_clipped_sum(name):
    """Every size up to 224: rank's per-sample gradients (layers engine) and train's ghost clipped sum."""
    from gsd_cli.train.clipsum import ClippedSum

    g = torch.Generator().manual_seed(0)
    for s in range(SMALLEST[name], 225):
        spec = get_model_spec(f"{name}@{s}")
        net = spec.build(num_classes=3, seed=0)
        side = (probe_side if name == "probe" else fmnist_side)(s)
        assert net[-1 if name == "probe" else -3].in_features == (16 if name == "probe" else 32) * side * side
        x, y = torch.rand(3, spec.channels, s, s, generator=g), torch.tensor([0, 1, 2])
        G = gradient_matrix(net, [(x, y)], 3, engine="auto", device="cpu")
        assert G.shape == (3, sum(p.numel() for p in net.parameters())) and torch.isfinite(G).all()
        total, sq = ClippedSum(net, [n for n, _ in net.named_parameters()])(x, y, 1.0)
        Gd = G.double()
        expect = (Gd / (Gd.norm(dim=1, keepdim=True) / 1.0).clamp(min=1.0)).sum(0)
        assert torch.allclose(sq, (Gd * Gd).sum(1), rtol=1e-3), s
        assert torch.allclose(total.double(), expect, rtol=1e-3, atol=1e-5), s


@pytest.mark.parametrize("spec", list_models(), ids=lambda s: s.name)
def test_every_registered_model_refuses_below_its_smallest_size_and_works_there(spec):
    least = smallest_input_size(spec)
    if least > 8:  # parse_input's floor: below it nothing is a size
        for s in range(8, least):
            if s % spec.size_multiple == 0:
                with pytest.raises(KeyError, match=f"at least {least}x{least} pixels.*use {spec.name}@{least} or larger"):
                    get_model_spec(f"{spec.name}@{s}")
    with torch.device("meta"):  # shapes only: even resnet152 in a fraction of a second
        for s in (least, least + spec.size_multiple):
            built = get_model_spec(f"{spec.name}@{s}")
            out = built.build(num_classes=5, seed=None)(torch.zeros(2, built.channels, s, s))
            assert tuple(out.shape) == (2, 5), (spec.name, s)


def test_a_size_off_the_patch_grid_is_refused_with_the_two_nearest():
    with pytest.raises(KeyError, match="multiple of 16.*vit_b_16@32 or vit_b_16@48"):
        get_model_spec("vit_b_16@40")
    check_input_size(get_model_spec("vit_b_16"), 48)
    with pytest.raises(ModelError, match="at least 73x73 pixels"):
        resolve_model("probe@72x1")


@pytest.fixture
def sets(tmp_path):
    rng = np.random.default_rng(0)
    paths = {}
    for name, shape in (("priv", (24, 20, 20)), ("pub", (24, 20, 20, 3))):
        paths[name] = tmp_path / f"{name}.npz"
        np.savez(paths[name], x=(rng.uniform(size=shape) * 255).astype(np.uint8), y=rng.integers(0, 3, 24),
                 classes=np.array(["a", "b", "c"]))
    return {k: f"npz:{v}" for k, v in paths.items()}


@pytest.mark.parametrize("name", ["fmnist-cnn", "probe"])
def test_rank_and_a_one_step_train_at_every_size(name, sets, tmp_path):
    from gsd_cli.train import TrainConfig, train

    for s in END_TO_END[name]:
        ref = f"{name}@{s}"
        r = gsd_cli.rank(sets["priv"], [sets["pub"]], model=ref, examples=6, k=2, device="cpu")
        assert r.model == ref and 0 <= r.results[0].distance <= 1
        cfg = TrainConfig(private=sets["priv"], model=ref, method="dpsgd", epochs=1, batch_size=6, sampling_rate=1.0,
                          physical_batch=6, insecure_seed=1, epsilon=8.0)
        summary = train(cfg, tmp_path / f"run-{name}-{s}")
        assert summary["steps"] == 1 and summary["model"] == ref


@pytest.mark.parametrize("ref", ["fmnist-cnn@32", "probe@112"])
def test_the_issue_cases_rank_and_train_through_the_cli(ref, sets, tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["rank", "--private", sets["priv"], "--public", sets["pub"], "--model", ref, "-m", "6", "-k", "2",
                 "--device", "cpu", "--json", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(out.read_text())["model"] == ref
    code = main(["train", "--private", sets["priv"], "--model", ref, "--method", "dpsgd", "--epochs", "1", "--batch-size", "6",
                 "--sampling-rate", "1", "--insecure-seed", "1", "--epsilon", "8", "--out", str(tmp_path / "run"), "-q"])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("ref, least", [("fmnist-cnn@8", 14), ("fmnist-cnn@13", 14), ("probe@16", 73), ("probe@32", 73),
                                        ("probe@64", 73), ("probe@72", 73), ("densenet121@28", 29)])
@pytest.mark.parametrize("command", ["rank", "train", "models"])
def test_a_size_too_small_is_one_line_naming_the_smallest(ref, least, command, sets, tmp_path, capsys):
    argv = {"rank": ["rank", "--private", sets["priv"], "--public", sets["pub"], "--model", ref, "-m", "6", "-k", "2", "-q"],
            "train": ["train", "--private", sets["priv"], "--model", ref, "--method", "dpsgd", "--epochs", "1",
                      "--insecure-seed", "1", "--out", str(tmp_path / "run"), "-q"],
            "models": ["models", "show", ref]}[command]
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"at least {least}x{least} pixels" in lines[0] and f"@{least} or larger" in lines[0], err
    assert not (tmp_path / "run").exists()
