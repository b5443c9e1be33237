"""Second-phase pre-training and PEFT (issue 6): the trainable set, LoRA, weight loading, frozen
BatchNorm, the three stages, resume across them, and gsd rank on the same parameters."""

import json
import pickle
import sys

import numpy as np
import pytest
import torch

from gsd_cli.cli import main
from gsd_cli.errors import GSDError, ModelError
from gsd_cli.models.peft import apply_peft, build_model, parse_peft
from gsd_cli.train import TrainConfig, train
from gsd_cli.models.weights import load_weights


@pytest.fixture
def tiny(tmp_path):
    """A 4-class 16x16 grey private set (120 examples) and a 3-class public set, and a 12-class one."""
    rng = np.random.default_rng(0)
    base = rng.uniform(size=(4, 16, 16))
    y = rng.integers(0, 4, 120)
    x = np.clip(base[y] + 0.1 * rng.normal(size=(120, 16, 16)), 0, 1)
    np.savez(tmp_path / "priv.npz", x=(x * 255).astype(np.uint8), y=y, classes=np.array(["a", "b", "c", "d"]))  # classes declared
    yp = rng.integers(0, 3, 60)  # three of the private classes, by name: the second phase shares the head
    np.savez(tmp_path / "pub.npz", x=(np.clip(base[yp] + 0.2 * rng.normal(size=(60, 16, 16)), 0, 1) * 255).astype(np.uint8), y=yp,
             classes=np.array(["a", "b", "c"]))
    np.savez(tmp_path / "pub12.npz", x=(rng.uniform(size=(40, 16, 16)) * 255).astype(np.uint8), y=np.arange(40) % 12)
    return {"private": f"npz:{tmp_path / 'priv.npz'}", "public": f"npz:{tmp_path / 'pub.npz'}", "public12": f"npz:{tmp_path / 'pub12.npz'}"}


@pytest.fixture
def weights_file(tmp_path):
    """Stage-0 weights of fmnist-cnn with a 3-class head (a 'pre-training task' of other classes)."""
    from safetensors.torch import save_file

    from probes import get_model_spec

    net = get_model_spec("fmnist-cnn").build(num_classes=3, seed=123)
    path = tmp_path / "pre.safetensors"
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return path, net.state_dict()


def _cfg(tiny, **kw):
    base = dict(private=tiny["private"], public=tiny["public"], method="second-phase", model="fmnist-cnn", epsilon=4.0,
                epochs=2, batch_size=30, lr=0.5, clip=0.5, peft="conv2.weight,fc2", public_examples=40,
                public_epochs=2, public_lr=1e-2, public_batch_size=16, deterministic_noise=True, physical_batch=16)
    base.update(kw)
    return TrainConfig(**base)


# -- the trainable set ---------------------------------------------------------------------------

def test_patterns_modules_presets_and_keywords():
    _, net, names, info = build_model("fmnist-cnn", 10, 0, peft="conv2.weight,fc2")
    assert names == ["conv2.weight", "fc2.weight", "fc2.bias"]  # 'fc2' names a module: all its parameters
    assert [n for n, p in net.named_parameters() if p.requires_grad] == names
    assert info["peft"]["trainable"] == 16 * 32 * 16 + 32 * 10 + 10
    _, _, names, _ = build_model("fmnist-cnn", 10, 0, peft="head")
    assert names == ["fc2.weight", "fc2.bias"]
    _, _, names, _ = build_model("fmnist-cnn", 10, 0, peft="bitfit")
    assert names == ["conv1.bias", "conv2.bias", "fc1.bias", "fc2.weight", "fc2.bias"]
    with pytest.raises(ModelError, match="matches no parameter"):
        build_model("fmnist-cnn", 10, 0, peft="conv9")
    with pytest.raises(ModelError, match="not both"):
        build_model("fmnist-cnn", 10, 0, peft="head", params=["fc2.*"])
    with pytest.raises(ModelError, match="unknown LoRA option"):
        parse_peft("lora:rank=4")
    with pytest.raises(ModelError, match="unknown model"):
        build_model("resnet9000", 10, 0)


def test_paper_table8_presets_name_exactly_its_layers():
    _, net, names, info = build_model("resnet152", 14, 0, peft="paper")
    assert names == ["layer3.32.conv1.weight", "fc.weight", "fc.bias"]
    assert info["peft"]["trainable"] == 256 * 1024 + 2048 * 14 + 14
    # the spelling: a module name and a parameter name
    assert apply_peft(net, "fc,layer3.32.conv1.weight")[1] == names
    assert [n for n, p in net.named_parameters() if p.requires_grad] == names
    _, _, names, _ = build_model("densenet121", 14, 0, peft="paper")
    assert names == ["features.denseblock3.denselayer23.conv1.weight", "features.denseblock3.denselayer24.conv1.weight",
                     "classifier.weight", "classifier.bias"]


def test_frozen_batchnorm_is_per_example_and_never_moves():
    from probes.backbones import FrozenBatchNorm2d

    _, net, names, _ = build_model("resnet18@32", 5, 0, peft="bitfit")
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(isinstance(m, FrozenBatchNorm2d) for m in bns)
    with torch.no_grad():
        for m in bns:  # non-trivial statistics, as pre-trained weights have
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 2.0)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    x = torch.rand(3, 3, 32, 32)
    net.train()
    out_train = net(x)
    net.eval()
    out_eval = net(x)
    assert torch.allclose(out_train, out_eval)
    assert torch.allclose(net(x[:1]), out_eval[:1], atol=1e-5)  # one example's output ignores the others
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())


# -- LoRA ---------------------------------------------------------------------------------------

def test_lora_starts_as_the_same_function_and_trains_only_adapters_and_head(tmp_path):
    pytest.importorskip("peft")
    from probes import get_model_spec

    ref = get_model_spec("fmnist-cnn").build(num_classes=10, seed=0)
    _, net, names, info = build_model("fmnist-cnn", 10, 0, peft="lora:r=4,alpha=8")
    x = torch.rand(5, 1, 28, 28)
    assert torch.allclose(ref(x), net(x), atol=1e-6)
    assert all(".lora_" in n or n.startswith("fc2.") for n in names) and "fc2.weight" in names
    assert info["peft"]["lora"]["r"] == 4 and info["peft"]["lora"]["layers"] == 3  # conv1, conv2, fc1
    assert [n for n, p in net.named_parameters() if p.requires_grad] == names
    # ViT: torchvision's weights load into the Linear-projection attention, which computes the same
    # function; LoRA (the paper's r=8, alpha=8 preset) on the attention projections leaves it unchanged
    from torchvision.models import vit_b_16 as tv_vit

    torch.manual_seed(0)
    tv_ref = tv_vit(weights=None, num_classes=4, image_size=32).eval()
    torch.nn.init.normal_(tv_ref.heads.head.weight)  # torchvision starts the head at zero
    path = tmp_path / "vit.pt"
    torch.save(tv_ref.state_dict(), path)
    _, vit, vnames, vinfo = build_model("vit_b_16@32", 4, 0, weights=str(path), peft="paper")
    vit.eval()
    with torch.no_grad():
        vit.heads.head.load_state_dict(tv_ref.heads.head.state_dict())
    xv = torch.rand(2, 3, 32, 32)
    ref_out = tv_ref(xv)
    assert ref_out.abs().max() > 1 and torch.allclose(ref_out, vit(xv), atol=1e-4)
    assert vinfo["peft"]["lora"]["layers"] == 24 and vinfo["peft"]["lora"]["r"] == 8
    assert all(".self_attention." in n or n.startswith("heads.head.") for n in vnames)


def test_lora_without_peft_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(ModelError, match=r"pip install 'gsd-cli\[lora\]'"):
        build_model("fmnist-cnn", 10, 0, peft="lora")


# -- weights ------------------------------------------------------------------------------------

def test_weights_load_with_a_new_head_and_refuse_bad_files(tmp_path, weights_file):
    path, state = weights_file
    _, net, _, info = build_model("fmnist-cnn", 10, 0, weights=str(path), peft="head")
    got = net.state_dict()
    assert all(torch.equal(got[k], state[k]) for k in state if not k.startswith("fc2."))
    assert got["fc2.weight"].shape == (10, 32)
    assert info["stage0"]["head_keys_dropped"] == ["fc2.bias", "fc2.weight"] and info["stage0"]["format"] == "safetensors"
    # a torch.save'd state dict loads too (weights_only)
    torch.save(state, tmp_path / "pre.pt")
    assert load_weights(net, tmp_path / "pre.pt", "fmnist-cnn")["format"] == "torch (weights_only)"
    # missing and unexpected keys: listed, nothing loaded
    bad = {k: v for k, v in state.items() if k != "conv1.weight"}
    bad["extra.weight"] = torch.zeros(2)
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ModelError, match=r"missing 1 key\(s\): conv1.weight; unexpected 1 key\(s\): extra.weight"):
        load_weights(net, tmp_path / "bad.pt", "fmnist-cnn")
    shapes = dict(state, **{"conv2.weight": torch.zeros(3, 3)})
    torch.save(shapes, tmp_path / "shape.pt")
    with pytest.raises(ModelError, match="shapes differ.*conv2.weight"):
        load_weights(net, tmp_path / "shape.pt", "fmnist-cnn")
    with pytest.raises(ModelError, match="no such file"):
        load_weights(net, tmp_path / "absent.pt", "fmnist-cnn")
    # a torchvision model: a name that is neither a file nor one of its published weights (no download)
    with pytest.raises(ModelError, match="nor a torchvision weight of resnet18.*IMAGENET1K_V1"):
        load_weights(net, "NOT_A_WEIGHT", "resnet18@32")
    # NAME@SIZE: the same model for another input size; nonsense sizes refused
    from probes import get_model_spec

    assert get_model_spec("resnet18@64").input_size == 64 and get_model_spec("resnet18").input_size == 224
    with pytest.raises(ModelError, match="size after '@'"):
        build_model("resnet18@x", 10, 0)


class _Evil:
    def __reduce__(self):
        return (exec, ("import pathlib; pathlib.Path(__import__('os').environ['GSD_TEST_PWNED']).write_text('ran')",))


def test_a_pickle_that_is_not_a_state_dict_is_refused_without_running_it(tmp_path, monkeypatch):
    from probes import get_model_spec

    flag = tmp_path / "pwned"
    monkeypatch.setenv("GSD_TEST_PWNED", str(flag))
    torch.save({"conv1.weight": _Evil()}, tmp_path / "evil.pt")  # an ordinary torch.load would run exec
    with open(tmp_path / "evil.pkl", "wb") as f:
        pickle.dump({"conv1.weight": _Evil()}, f)
    net = get_model_spec("fmnist-cnn").build(num_classes=10, seed=0)
    with pytest.raises(ModelError, match="refused"):
        load_weights(net, tmp_path / "evil.pt", "fmnist-cnn")
    with pytest.raises(ModelError, match="refused"):
        load_weights(net, tmp_path / "evil.pkl", "fmnist-cnn")
    assert not flag.exists()
    torch.save({"weights": [1, 2, 3]}, tmp_path / "list.pt")  # loads under weights_only, but is no state dict
    with pytest.raises(ModelError, match="not a state dict"):
        load_weights(net, tmp_path / "list.pt", "fmnist-cnn")


# -- stages, accounting, resume ------------------------------------------------------------------

def test_second_phase_changes_only_the_trainable_parameters(tiny, tmp_path, weights_file):
    from safetensors.torch import load_file

    from gsd_cli.train.second_phase import run_second_phase

    path, _ = weights_file
    cfg = _cfg(tiny, weights=str(path))
    spec, net, names, _ = build_model("fmnist-cnn", 4, 0, weights=str(path), peft=cfg.peft)
    before = {k: v.clone() for k, v in net.state_dict().items()}
    (tmp_path / "s1").mkdir()
    rec = run_second_phase(net, names, cfg, spec, tmp_path / "s1", torch.device("cpu"), num_classes=4, multilabel=False,
                           private_classes=["a", "b", "c", "d"])
    after = net.state_dict()
    assert rec["head"].startswith("shared with the private task") and len(rec["train_loss"]) == 2
    for k in before:
        trained = k in names
        assert torch.equal(before[k], after[k]) != trained, k
    assert all(p.grad is None for n, p in net.named_parameters() if n not in names)
    # a public set whose labels do not fit the private head: a separate head for stage 1, the private head untouched
    cfg12 = _cfg(tiny, weights=str(path), public=tiny["public12"])
    spec, net, names, _ = build_model("fmnist-cnn", 4, 0, weights=str(path), peft=cfg.peft)
    head0 = net.fc2.weight.detach().clone()
    conv0 = net.conv2.weight.detach().clone()
    (tmp_path / "s12").mkdir()
    rec = run_second_phase(net, names, cfg12, spec, tmp_path / "s12", torch.device("cpu"), num_classes=4, multilabel=False)
    assert rec["head"].startswith("a separate 12-way head") and net.fc2.out_features == 4
    assert torch.equal(net.fc2.weight, head0) and not torch.equal(net.conv2.weight, conv0)
    # the end-to-end run: stage 2 starts from theta_0 and moves only the same parameters
    s = train(cfg, tmp_path / "run")
    w = load_file(str(tmp_path / "run" / "checkpoint.safetensors"))
    for k, v in before.items():
        assert torch.equal(w[f"model.{k}"], v) != (k in names), k
    assert [st["stage"] for st in s["stages"]] == [0, 1, 2]
    assert s["stages"][0]["weights"] == "pre-trained" and s["stages"][0]["sha256"]
    assert s["stages"][1]["public"] == tiny["public"] and "no privacy cost" in s["stages"][1]["what"]
    assert s["stages"][2]["epsilon"] == s["epsilon"] and s["public"] == tiny["public"]
    # stage 2 is DP-SGD, calibrated and accounted as in the train issue; stage 1 spends nothing
    from gsd_cli.privacy import calibrate_noise, dpsgd_step_event, epsilon_of, training_event

    q, eps_n = s["sampling_rate"], s["privacy"]["size"]["epsilon_size"]  # (the DP estimate of N spends eps_n of the budget)
    assert s["sigma"] == calibrate_noise(dpsgd_step_event, cfg.epsilon - eps_n, cfg.delta, q, s["steps"], "rdp")
    assert s["epsilon"] == pytest.approx(eps_n + epsilon_of(training_event(dpsgd_step_event(s["sigma"]), q, s["steps"]), cfg.delta, "rdp"))
    assert s["epsilon"] <= cfg.epsilon and len(s["budget"]["entries"]) == 1
    assert s["privacy"]["mechanism"].startswith("DP-SGD")


def test_resume_across_stages_equals_a_straight_run(tiny, tmp_path, interrupt):
    from safetensors.torch import load_file

    from gsd_cli.train.second_phase import stage1_cache

    # one clipping path for every layer: two separate runs that *time* their paths (clip_engine auto) may choose
    # differently on a loaded machine and differ by float rounding; reuse on resume is tested in test_resume_verify
    cfg = _cfg(tiny, clip_engine="materialise")
    train(cfg, tmp_path / "ref")
    for name, where in (("in-stage1", ("public", 1)), ("in-stage2", ("epoch", 1))):
        run = tmp_path / name
        stage1_cache.clear()  # train stage 1 again (the reference run cached it), to be interrupted in it
        with pytest.raises(interrupt.error):
            train(cfg, run, progress=interrupt(*where))
        assert (run / "stage1.json").is_file()
        if name == "in-stage1":
            assert json.loads((run / "stage1.json").read_text())["epochs_done"] == 1 and not (run / "checkpoint.json").exists()
            code = main(["train", "--resume", str(run), "-q"])  # the CLI finds the settings in stage1.json
            assert code == 0
        else:
            train(cfg, run, resume=True)
        a, b = load_file(str(tmp_path / "ref" / "checkpoint.safetensors")), load_file(str(run / "checkpoint.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
        assert (tmp_path / "ref" / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
    with pytest.raises(GSDError, match="settings differ"):
        train(_cfg(tiny, public_epochs=3), tmp_path / "in-stage2", resume=True)


# -- gsd rank on the same parameters, and the CLI -------------------------------------------------

def test_rank_with_peft_uses_exactly_the_trained_parameters(tiny, weights_file):
    from gsd_cli.ranking import rank

    path, _ = weights_file
    a = rank(tiny["private"], [tiny["public"]], model="fmnist-cnn", weights=str(path), peft="conv2.weight,fc2", k=4, examples=40, device="cpu", engine="vmap")
    b = rank(tiny["private"], [tiny["public"]], model="fmnist-cnn", weights=str(path), params=["conv2.weight", "fc2.*"], k=4, examples=40, device="cpu", engine="vmap")
    c = rank(tiny["private"], [tiny["public"]], model="fmnist-cnn", peft="conv2.weight,fc2", k=4, examples=40, device="cpu", engine="vmap")
    assert a.num_params == b.num_params == 16 * 32 * 16 + 32 * 4 + 4
    assert a[0].distance == pytest.approx(b[0].distance, abs=1e-9)
    assert a[0].distance != pytest.approx(c[0].distance, abs=1e-6)  # the pre-trained weights are used


def _one_line_error(code, err):
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err


def test_cli_models_and_second_phase(capsys, tiny, tmp_path, weights_file):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "resnet152" in out and "vit_b_16" in out and "paper" in out
    assert main(["models", "show", "fmnist-cnn", "--peft", "fc2"]) == 0
    out = capsys.readouterr().out
    assert "conv2.weight" in out and "trains 330 of 26,010" in out
    _one_line_error(main(["models", "show", "nosuch"]), capsys.readouterr().err)
    base = ["train", "--private", tiny["private"], "--model", "fmnist-cnn", "-q"]
    _one_line_error(main(base + ["--method", "second-phase"]), capsys.readouterr().err)  # no public data
    _one_line_error(main(base + ["--method", "dpsgd", "--peft", "nosuch"]), capsys.readouterr().err)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    _one_line_error(main(base + ["--method", "dpsgd", "--weights", str(tmp_path / "junk.pt")]), capsys.readouterr().err)
    path, _ = weights_file
    run = tmp_path / "cli-run"
    args = base + ["--method", "second-phase", "--public", tiny["public"], "--weights", str(path), "--peft", "fc2",
                   "--epochs", "1", "--batch-size", "30", "--public-epochs", "1", "--public-examples", "30", "--out", str(run)]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    s = json.loads((run / "summary.json").read_text())
    assert s["method"] == "second-phase" and s["num_params"] == 32 * 4 + 4 and s["peft"]["spec"] == "fc2"
    assert "second phase" in out
    code = main(args)  # never overwritten
    _one_line_error(code, capsys.readouterr().err)
    code = main(["rank", "--private", tiny["private"], "--public", tiny["public"], "--model", "fmnist-cnn", "--weights", str(path),
                 "--peft", "fc2", "-k", "4", "-m", "30", "--no-cache", "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "p=132" in out.replace(",", "")


def test_auto_select_for_second_phase_ranks_on_the_trained_parameters(capsys, tiny, tmp_path, weights_file):
    path, _ = weights_file
    run = tmp_path / "auto"
    code = main(["train", "--private", tiny["private"], "--auto-select", "--public", tiny["public"], tiny["public12"],
                 "--method", "second-phase", "--model", "fmnist-cnn", "--weights", str(path), "--peft", "fc2",
                 "--rank-k", "2", "--rank-examples", "30", "--epochs", "1", "--batch-size", "30", "--public-epochs", "1",
                 "--public-examples", "30", "--no-fallback", "--out", str(run), "-q"])  # noise-like candidates: past the advice
    out, err = capsys.readouterr()
    assert code == 0, err
    s = json.loads((run / "summary.json").read_text())
    assert s["selection"]["model"] == "fmnist-cnn" and s["selection"]["num_params"] == 32 * 4 + 4
    p = json.loads((run / "private-summary.json").read_text())  # a non-private selection's figures
    assert s["public"] == p["selection"]["results"][0]["public"] and "results" not in s["selection"]
    assert any("NOT differentially private" in n for n in s["notes"])


def test_stage1_default_lr_from_scratch_and_for_pre_trained_weights(tiny, tmp_path, weights_file):
    """--public-lr left out: 3e-3 for a model trained from scratch (gsd's downstream benchmark: paper
    004's 5e-5 hardly moves it), paper 004's 5e-5 for a pre-trained CNN, each the middle of the grid stage 1
    chooses from on its validation split (without one, --public-val 0: the default alone); a given lr always stands."""
    from gsd_cli.train.second_phase import CNN_LR, SCRATCH_LR, run_second_phase

    path, _ = weights_file
    for name, kw, want in (("scratch", {"public_val": 0.0}, SCRATCH_LR), ("pre", {"weights": str(path), "public_val": 0.0}, CNN_LR),
                           ("given", {"public_lr": 1e-2}, 1e-2), ("grid", {}, (1e-3, 3e-3, 9e-3)),
                           ("grid-pre", {"weights": str(path)}, (1.67e-5, 5e-5, 1.5e-4))):
        cfg = _cfg(tiny, **{"public_lr": None, "public_epochs": 1, **kw})
        spec, net, names, _ = build_model("fmnist-cnn", 4, 0, weights=cfg.weights, peft=cfg.peft)
        (tmp_path / name).mkdir()
        rec = run_second_phase(net, names, cfg, spec, tmp_path / name, torch.device("cpu"), num_classes=4, multilabel=False)
        if isinstance(want, tuple):
            lrs = rec["search"]["lrs"]  # the grid, then at most 2 trials beyond its edge (stage1_fit.EXTEND)
            assert tuple(lrs[:3]) == want and rec["lr"] in lrs and len(rec["search"]["trials"]) == len(lrs) <= 5, name
            assert all(x in (float(f"{max(lrs[:i]) * 3:.3g}"), float(f"{min(lrs[:i]) / 3:.3g}")) for i, x in enumerate(lrs) if i >= 3), name
        else:
            assert rec["lr"] == want and rec["search"]["lrs"] == [want], name
    assert SCRATCH_LR == 3e-3 and CNN_LR == 5e-5


def test_the_head_is_shared_only_with_private_classes_by_name(tmp_path):
    """Issue 42: a public label that fits the head's index range is not the private class of that index.
    Stage 1 trains the private head only where every public class is a private class by name (mapped to
    its private index); otherwise a separate head, and the private head keeps its initial weights."""
    from gsd_cli import data as gdata
    from gsd_cli.train.second_phase import _public_labels, label_map

    private = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot"]
    assert label_map(["sandal", "Sneaker ", "ankle-boot"], private) == [5, 7, 9]
    assert label_map(["0", "1"], private) is None and label_map(None, private) is None and label_map(["a"], None) is None
    rng = np.random.default_rng(0)
    x = (rng.uniform(size=(30, 8, 8)) * 255).astype(np.uint8)
    y = np.arange(30) % 3
    cases = {"shoes": (["sandal", "sneaker", "ankle-boot"], None, [5, 7, 9]),  # mapped by name
             "photos": (["coffee", "rocket", "moon"], 3, [0, 1, 2]),  # fits 0..9 by index, but no private class
             "unnamed": (None, 3, [0, 1, 2])}  # names unknown: never assumed to be the private classes
    for name, (classes, head, labels) in cases.items():
        kw = {} if classes is None else {"classes": np.array(classes)}
        np.savez(tmp_path / f"{name}.npz", x=x, y=y, **kw)
        sample = gdata.draw(gdata.resolve(f"npz:{tmp_path / name}.npz"), 30, 0)
        got, width = _public_labels(sample, 10, False, private)
        assert width == head, name
        order = np.asarray(sample.indices)
        assert got.tolist() == [labels[v] for v in y[order]], name
