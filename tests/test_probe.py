"""The feature probe (gsd_cli.advice.probe, issue 42): --method auto and --method second-phase take the
candidate whose stage-1 features beat the untrained model's with confidence, or none."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gsd_cli.advice.decide import ALPHA, Candidate, advise
from gsd_cli.advice.probe import RIDGE, ProbeResult, linear_probe_accuracy

from test_advice import REFS, FakeRanking


def _ridge_predictions_by_lstsq(f, y, fit, score, k):
    """An independent computation: ridge as least squares on the augmented system [X; sqrt(lam) I]."""
    mu, sd = f[fit].mean(0), f[fit].std(0, ddof=1) + 1e-6
    x = np.c_[(f[fit] - mu) / sd, np.ones(len(fit))]
    xs = np.c_[(f[score] - mu) / sd, np.ones(len(score))]
    lam = RIDGE * len(fit)
    a = np.r_[x, np.sqrt(lam) * np.eye(x.shape[1])]
    b = np.r_[np.eye(k)[y[fit]], np.zeros((x.shape[1], k))]
    w = np.linalg.lstsq(a, b, rcond=None)[0]
    return (xs @ w).argmax(1)


def test_the_linear_probe_equals_a_ridge_solved_independently():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 301)
    f = rng.normal(size=(301, 6)) + 0.8 * np.eye(4, 6)[y]
    acc = linear_probe_accuracy(torch.from_numpy(f), torch.from_numpy(y), 4, seed=5)
    perm = np.random.default_rng([5, 0x9E0B]).permutation(301)
    folds = (perm[:150], perm[150:])
    right = sum(int((_ridge_predictions_by_lstsq(f, y, a, b, 4) == y[b]).sum()) for a, b in (folds, folds[::-1]))
    assert acc == pytest.approx(right / 301)


def test_the_probe_is_near_chance_on_noise_and_near_perfect_on_separable_features():
    rng = np.random.default_rng(1)
    y = torch.from_numpy(rng.integers(0, 5, 2000))
    noise = torch.from_numpy(rng.normal(size=(2000, 16)))
    assert abs(linear_probe_accuracy(noise, y, 5, 0) - 0.2) < 0.05
    sep = noise.clone()
    sep[torch.arange(2000), y] += 6.0
    assert linear_probe_accuracy(sep, y, 5, 0) > 0.97


FACTS = {"mnist-b": Candidate("mnist-b", 5000, 10), "digits": Candidate("digits", 1797, 10),
         "faces": Candidate("faces", 200, 2), "noise": Candidate("noise", 2500, 10)}


def _probe(**gains):
    return ProbeResult([0.6, 0.62, 0.61], {n: list(g) for n, g in gains.items()}, examples=2000, model="fmnist-cnn")


def test_the_probe_picks_the_largest_confident_gain_not_the_closest():
    r = FakeRanking({"mnist-b": [0.50, 0.51, 0.49], "digits": [0.40, 0.41, 0.39], **REFS})  # digits is the closer
    p = _probe(**{"mnist-b": [0.20, 0.22, 0.21], "digits": [0.05, 0.06, 0.04]})
    d = advise(r, "auto", candidates=FACTS, private_classes=10, probe=p)
    assert (d.method, d.public, d.fell_back) == ("second-phase", "mnist-b", False)
    assert "21.0 points better" in d.message and d.evidence["digits"]["probe_helps"]


def test_from_a_base_the_contestant_without_a_candidate_is_the_base_alone():
    """Issue 61: with --weights the probe's baseline is the base's features, and the advice says so (never "untrained")."""
    from types import SimpleNamespace

    from gsd_cli.advice.probe import start_of

    assert start_of(SimpleNamespace(weights=None)) == "the untrained model"
    start = start_of(SimpleNamespace(weights="base"))
    assert start == "the base alone (--weights base)"
    r = FakeRanking({"mnist-b": [0.50, 0.51, 0.49], "digits": [0.40, 0.41, 0.39], **REFS})
    p = ProbeResult([0.6, 0.62, 0.61], {"mnist-b": [0.03, -0.02, 0.01], "digits": [-0.05, -0.06, -0.04]}, examples=2000,
                    model="fmnist-cnn", start=start)
    d = advise(r, "auto", candidates=FACTS, private_classes=10, probe=p)
    assert (d.method, d.public) == ("dpsgd", None)
    assert "training DP-SGD from the base alone (--weights base), with no candidate" in d.message
    assert "beat those of the base alone" in d.message and "untrained" not in d.message
    assert p.to_dict()["start"] == start
    p = ProbeResult([0.6, 0.62, 0.61], {"mnist-b": [0.20, 0.22, 0.21]}, examples=2000, model="fmnist-cnn", start=start)
    assert "better than those of the base alone" in p.phrase("mnist-b", ALPHA)


def test_no_confident_gain_trains_dpsgd_and_an_explicit_second_phase_is_refused():
    r = FakeRanking({"mnist-b": [0.50, 0.51, 0.49], "digits": [0.40, 0.41, 0.39], **REFS})
    p = _probe(**{"mnist-b": [0.03, -0.02, 0.01], "digits": [-0.05, -0.06, -0.04]})  # mnist-b: p > 0.05
    d = advise(r, "auto", candidates=FACTS, private_classes=10, probe=p)
    assert (d.method, d.public, d.fell_back) == ("dpsgd", None, True)
    assert "features beat those of the untrained model" in d.message and "does not try GEP" in d.message
    assert not p.test("mnist-b", ALPHA)[0]
    d = advise(r, "second-phase", candidates=FACTS, private_classes=10, probe=p)
    assert d.refused and "--no-fallback" in d.message
    # --method gep is the GSD advice's, whatever the probe says
    d = advise(r, "gep", candidates=FACTS, private_classes=10, probe=p)
    assert (d.method, d.public, d.refused) == ("gep", "digits", False)


def test_the_probe_never_overrides_the_noise_reference_or_the_label_rule():
    # a strong probe gain cannot make a candidate that is no closer than noise, or a 2-class one, the pick
    r = FakeRanking({"noise": [0.735, 0.74, 0.745], "faces": [0.45, 0.46, 0.44], **REFS})
    p = _probe(noise=[0.3, 0.31, 0.32], faces=[0.3, 0.31, 0.32])
    d = advise(r, "auto", candidates=FACTS, private_classes=10, probe=p)
    assert (d.method, d.public) == ("dpsgd", None) and "2 classes" in d.message and "not closer than noise: noise" in d.message


def test_the_probe_end_to_end_prefers_real_digits_over_noise():
    """Stage 1 exactly as gsd train runs it, on real digits: pretraining on the other half of MNIST-5k helps
    the features; Gaussian noise with random labels does not."""
    from gsd_cli import data as gdata
    from gsd_cli.train import TrainConfig
    from gsd_cli.advice.probe import probe_second_phase

    cfg = TrainConfig(private="mnist-a", public="mnist-b", method="second-phase", model="fmnist-cnn", public_examples=500,
                      public_epochs=2, public_batch_size=64, public_lr=3e-3)
    res = probe_second_phase(gdata.resolve("mnist-a"), [gdata.resolve("mnist-b"), gdata.resolve("noise")], cfg, examples=400,
                             repeats=2, seed=0, device="cpu")
    assert res.repeats == 2 and len(res.gains["mnist-b"]) == 2
    assert len(res.gains["noise"]) == res.stopped.get("noise", 2)  # a loss in draw 1 decides its test: no draw 2
    assert res.mean_gain("mnist-b") > 0.05 and res.mean_gain("noise") < res.mean_gain("mnist-b") - 0.05
    assert res.stage1["mnist-b"]["head"].startswith("shared") and res.stage1["noise"]["head"].startswith("a separate")
    assert 0.1 < res.baseline[0] < 0.95


def test_probe_repeats_zero_leaves_the_gsd_advice_and_one_is_refused(capsys, tmp_path):
    import json

    from gsd_cli.cli import main

    base = ["train", "--auto-select", "--public", "mnist-b", "--rank-examples", "64", "--rank-k", "4", "--epochs", "1",
            "--batch-size", "100", "--expected-size", "400", "--delta", "1e-3", "-q"]
    assert main([*base, "--probe-repeats", "1", "--out", str(tmp_path / "one")]) == 2
    assert "--probe-repeats 1" in capsys.readouterr().err and not (tmp_path / "one").exists()
    assert main([*base, "--probe-repeats", "0", "--public-examples", "200", "--public-epochs", "1", "--out", str(tmp_path / "zero")]) == 0
    s = json.loads((tmp_path / "zero" / "private-summary.json").read_text())  # a non-private selection's figures
    assert "probe" not in s["selection"]["advice"]["evidence"] and s["selection"]["advice"]["method"] in ("second-phase", "gep", "dpsgd")


def test_head_features_are_the_head_input_in_any_float_dtype():
    from probes import get_model_spec

    from gsd_cli.advice.probe import head_features

    net = get_model_spec("fmnist-cnn").build(num_classes=10, seed=0)
    x = torch.rand(300, 1, 28, 28)
    f = head_features(net, x, chunk=128)
    with torch.no_grad():
        direct = net[:-1](x)  # everything before fc2, the head: an independent computation
    assert f.dtype == torch.float32 and torch.allclose(f, direct, atol=1e-6)
    assert torch.allclose(head_features(net, x.half()), direct, atol=2e-2) and net.training


def test_the_probe_runs_stage_one_on_pretrained_weights_with_peft(tmp_path):
    """--weights and --peft reach the probe's model and stage 1 as they reach gsd train's."""
    from safetensors.torch import save_file

    from gsd_cli import data as gdata
    from gsd_cli.train import TrainConfig
    from gsd_cli.advice.probe import probe_second_phase
    from probes import get_model_spec

    pre = get_model_spec("fmnist-cnn").build(num_classes=3, seed=123)
    path = tmp_path / "pre.safetensors"
    save_file({k: v.contiguous() for k, v in pre.state_dict().items()}, str(path))
    cfg = TrainConfig(private="mnist-a", public="mnist-b", method="second-phase", model="fmnist-cnn", weights=str(path),
                      peft="conv2.weight,fc2", public_examples=120, public_epochs=1, public_batch_size=32)
    res = probe_second_phase(gdata.resolve("mnist-a"), [gdata.resolve("mnist-b")], cfg, examples=120, repeats=2, seed=0, device="cpu")
    assert len(res.gains["mnist-b"]) == 2 and res.stage1["mnist-b"]["lr"] == 5e-5  # paper 004's CNN rate with --weights


def test_auto_select_options_without_auto_select_are_named_as_ignored(capsys, tmp_path):
    from gsd_cli.cli import main

    base = ["train", "--method", "dpsgd", "--epochs", "1", "--batch-size", "100", "--expected-size", "400", "--delta", "1e-3", "-q"]
    assert main([*base, "--probe-repeats", "2", "--rank-k", "4", "--out", str(tmp_path / "run")]) == 0
    assert "--rank-k, --probe-repeats are only read with --auto-select: ignored" in " ".join(capsys.readouterr().err.split())
    assert main([*base, "--out", str(tmp_path / "run2")]) == 0  # none given: no warning
    assert "only read with --auto-select" not in capsys.readouterr().err


def test_the_probe_phrase_says_worse_for_a_loss_and_better_for_a_gain():
    from gsd_cli.advice.probe import ProbeResult

    r = ProbeResult([0.6, 0.6, 0.6], {"loss": [-0.09, -0.1, -0.08], "gain": [0.05, 0.06, 0.04]}, examples=100, model="probe")
    assert "9.0 points worse than" in r.phrase("loss", 0.05) and "-9.0" not in r.phrase("loss", 0.05)
    assert "5.0 points better than" in r.phrase("gain", 0.05) and "p = " in r.phrase("gain", 0.05)
