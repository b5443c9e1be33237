"""gsd train: the transforms (GEP's reductions, clipping, noise), Poisson sampling, the accounted
event of each method, resume, the run folder, and the CLI's one-line errors."""

import json
import math

import numpy as np
import pytest
import torch

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.privacy import effective_noise_multiplier
from gsd_cli.train import Anchor, StepContext, TrainConfig, build_method, chain, chain_step_event, clip, gaussian_noise, train
from gsd_cli.train.gep import power_basis, share_quota, split_groups
from gsd_cli.train.loop import private_randomness


def _anchor_with(bases, groups):
    a = Anchor(torch.zeros(3, 1), 2, sum(b.shape[0] for b in bases), groups, 1, 0, None)
    a.bases = bases
    a.ks = [b.shape[0] for b in bases]
    a.step = 0
    return a


def _run_chain(ch, G, gen=None):
    ctx = StepContext(step=0, generator=gen or torch.Generator().manual_seed(0))
    ch.begin_step(ctx)
    parts = ch.per_example({"grad": G}, ctx)
    return ch.aggregated({k: v.sum(0) for k, v in parts.items()}, ctx), parts, ctx


def _random_anchor(p=30, ks=(3, 2), seed=0):
    gen = torch.Generator().manual_seed(seed)
    groups = [list(range(0, 18)), list(range(18, p))]
    bases = [torch.linalg.qr(torch.randn(len(g), k, generator=gen, dtype=torch.float64))[0].T for g, k in zip(groups, ks)]
    return _anchor_with(bases, groups), groups


def test_gep_without_noise_is_the_gradient_and_bgep_its_projection():
    from gsd_cli.train.gep import GEPProject, GEPReconstruct

    anchor, groups = _random_anchor()
    G = torch.randn(7, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    big = 1e9
    full = chain(GEPProject(anchor), clip(big, "embedding"), clip(big, "residual"),
                 gaussian_noise(0.0, "embedding", big), gaussian_noise(0.0, "residual", big), GEPReconstruct(anchor))
    v, _, _ = _run_chain(full, G)
    assert torch.allclose(v["grad"], G.sum(0), atol=1e-12)
    biased = chain(GEPProject(anchor, residual=False), clip(big, "embedding"), gaussian_noise(0.0, "embedding", big), GEPReconstruct(anchor))
    v, _, _ = _run_chain(biased, G)
    proj = torch.zeros(30, dtype=torch.float64)
    for idx, B in zip(groups, anchor.bases):
        proj[idx] = G.sum(0)[idx] @ B.T @ B
    assert torch.allclose(v["grad"], proj, atol=1e-12)


def test_clipping_bounds_hold_per_part():
    from gsd_cli.train.gep import GEPProject

    anchor, _ = _random_anchor()
    G = 10 * torch.randn(50, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ch = chain(GEPProject(anchor), clip(0.7, "embedding"), clip(0.3, "residual"))
    ctx = StepContext(step=0)
    parts = ch.per_example({"grad": G}, ctx)
    assert parts["embedding"].norm(dim=1).max() <= 0.7 + 1e-12
    assert parts["residual"].norm(dim=1).max() <= 0.3 + 1e-12
    small = torch.full((1, 30), 1e-3, dtype=torch.float64)
    assert torch.equal(clip(1.0).per_example({"grad": small}, ctx)["grad"], small)  # inside: untouched
    # the residual comes from the unclipped embedding: it is orthogonal to the basis
    R = ch.per_example({"grad": G[:1]}, StepContext(step=0))
    assert R["residual"].shape == (1, 30)


def test_noise_std_matches_the_formula():
    anchor, _ = _random_anchor(p=30, ks=(3, 2))
    cfg = TrainConfig(method="gep", public="x", clip_embedding=2.0, clip_residual=0.5)
    sigma = 1.7
    method = build_method(cfg, sigma, anchor)
    method.chain.transforms[0].anchor = anchor
    gen = torch.Generator().manual_seed(3)
    outs = []
    ctx = StepContext(step=0, generator=gen)
    for _ in range(4000):
        parts = method.chain.per_example({"grad": torch.zeros(0, 30, dtype=torch.float64)}, ctx)
        outs.append(method.chain.aggregated({k: v.sum(0) for k, v in parts.items()}, ctx)["grad"])
    V = torch.stack(outs)
    # v = z1 B + z2: total variance sigma^2 (S1^2 k + S2^2 p)
    expected = sigma**2 * (2.0**2 * 5 + 0.5**2 * 30)
    assert V.pow(2).sum(1).mean().item() == pytest.approx(expected, rel=0.03)
    dpsgd = build_method(TrainConfig(method="dpsgd", clip=0.8), sigma)
    x = torch.stack([dpsgd.chain.aggregated({"grad": torch.zeros(1000)}, StepContext(0, generator=gen))["grad"] for _ in range(20)])
    assert x.std().item() == pytest.approx(sigma * 0.8, rel=0.02)


def test_each_method_declares_the_event_it_is_accounted_with():
    anchor, _ = _random_anchor()
    sigma = 2.0
    dp = build_method(TrainConfig(method="dpsgd"), sigma)
    assert effective_noise_multiplier(chain_step_event(dp.chain)) == pytest.approx(sigma)
    gep = build_method(TrainConfig(method="gep", public="x"), sigma, anchor)
    assert effective_noise_multiplier(chain_step_event(gep.chain)) == pytest.approx(sigma / math.sqrt(2))
    bgep = build_method(TrainConfig(method="gep", public="x", residual=False), sigma, anchor)
    assert effective_noise_multiplier(chain_step_event(bgep.chain)) == pytest.approx(sigma)
    with pytest.raises(GSDError, match="never clipped"):
        chain_step_event(chain(gaussian_noise(1.0, "grad", 1.0)))
    with pytest.raises(GSDError, match="sensitivity"):
        chain_step_event(chain(clip(2.0), gaussian_noise(1.0, "grad", 1.0)))
    with pytest.raises(GSDError, match="no noise"):
        chain_step_event(chain(clip(2.0)))


def test_power_basis_and_quota():
    gen = torch.Generator().manual_seed(1)  # not the global generator: other tests move it
    G = torch.randn(40, 6, generator=gen) @ torch.randn(6, 50, generator=gen)  # rank 6
    B = power_basis(G, 6, 1, torch.Generator().manual_seed(0))
    assert torch.allclose(B @ B.T, torch.eye(6, dtype=B.dtype), atol=1e-6)
    resid = G - G @ B.T @ B
    assert resid.norm() / G.norm() < 1e-5  # Lemma 3.1: the rank-k span is recovered exactly
    assert share_quota(100, [100, 10_000], 2000) == [9, 90]
    assert share_quota(100, [4, 10_000], 2000)[0] == 1
    groups = split_groups(["a.w", "b.w", "c.w"], [2, 3, 4], [["b.*"]])
    assert groups == [[2, 3, 4], [0, 1, 5, 6, 7, 8]]
    with pytest.raises(GSDError):
        split_groups(["a.w"], [2], [["zzz*"]])


def test_poisson_sampling_rate():
    n, q = 400, 0.1
    sizes, counts = [], np.zeros(n)
    for step in range(600):
        idx, _ = private_randomness(n, q, 12345, step)
        sizes.append(len(idx))
        counts[idx] += 1
    sizes = np.array(sizes)
    assert abs(sizes.mean() - n * q) < 4 * math.sqrt(n * q * (1 - q) / len(sizes))
    assert sizes.var() == pytest.approx(n * q * (1 - q), rel=0.15)  # binomial, not fixed-size batches
    assert abs(counts.mean() / 600 - q) < 0.005 and counts.min() > 0
    a, _ = private_randomness(n, q, 12345, 7)
    b, _ = private_randomness(n, q, 12345, 7)
    c, _ = private_randomness(n, q, 54321, 7)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def _cfg(tiny, **kw):
    base = dict(private=tiny["private"], public=tiny["public"], method="gep", epsilon=4.0, epochs=2, batch_size=30,
                k=8, public_examples=40, deterministic_noise=True, physical_batch=16)
    base.update(kw)
    return TrainConfig(**base)


def test_train_gep_end_to_end(tiny, tmp_path):
    s = train(_cfg(tiny), tmp_path / "run")
    assert s["epsilon"] <= 4.0 and s["epsilon"] > 3.9
    # the per-example hash split puts 20 of the 120 examples in test (about 20%)
    # q and T from the DP estimate of N (train/size.py), never from N = 100
    n_hat = s["privacy"]["size"]["size"]
    assert s["privacy"]["size"]["how"] == "dp-estimate" and s["privacy"]["size"]["epsilon_size"] == pytest.approx(0.08)
    assert s["steps"] == 2 * round(n_hat / 30) and s["sampling_rate"] == pytest.approx(30 / n_hat)
    assert s["public"] == tiny["public"] and s["gep"]["k"] == 8
    assert s["private_test_examples"] == 20 and 0 <= s["test"]["accuracy"] <= 1
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and rows[-1]["epsilon_spent"] == pytest.approx(s["epsilon"])
    for f in ("summary.json", "curves.png", "checkpoint.safetensors", "checkpoint.json"):
        assert (tmp_path / "run" / f).stat().st_size > 0
    assert "noise_seed" not in (tmp_path / "run" / "summary.json").read_text()


def test_resume_gives_the_same_weights_and_refuses_other_settings(tiny, tmp_path, interrupt):
    from safetensors.torch import load_file

    cfg = _cfg(tiny, method="dpsgd", epochs=3, deterministic_noise=False)  # secret seed from the OS
    broken = tmp_path / "broken"
    with pytest.raises(interrupt.error):
        train(cfg, broken, progress=interrupt("epoch", 1))
    assert json.loads((broken / "checkpoint.json").read_text())["epoch"] == 1
    seed_before = json.loads((broken / "checkpoint.json").read_text())["secret"]["noise_seed"]
    s = train(cfg, broken, resume=True)
    assert s["epsilon"] <= cfg.epsilon
    ref = tmp_path / "ref"
    meta = json.loads((broken / "checkpoint.json").read_text())
    assert meta["epoch"] == 3 and meta["privacy"]["steps_done"] == s["steps"]
    assert meta["secret"]["noise_seed"] == seed_before  # the run's own private randomness, replayed
    with pytest.raises(GSDError, match="settings differ"):
        train(_cfg(tiny, method="dpsgd", epochs=3, deterministic_noise=False, lr=0.5), broken, resume=True)
    # how the clipped sums are computed is not a setting of the mechanism: a resume may change it
    other = tmp_path / "other-engine"
    with pytest.raises(interrupt.error):
        train(cfg, other, progress=interrupt("epoch", 1))
    s = train(_cfg(tiny, method="dpsgd", epochs=3, deterministic_noise=False, clip_engine="materialise", physical_batch=7),
              other, resume=True)
    assert s["epsilon"] <= cfg.epsilon and json.loads((other / "checkpoint.json").read_text())["epoch"] == 3
    # deterministic noise: an interrupted and resumed run equals a straight run exactly
    cfg2 = _cfg(tiny, method="gep", epochs=3)
    train(cfg2, ref)
    with pytest.raises(interrupt.error):
        train(cfg2, tmp_path / "b2", progress=interrupt("epoch", 1))
    train(cfg2, tmp_path / "b2", resume=True)
    wa, wb = load_file(str(ref / "checkpoint.safetensors")), load_file(str(tmp_path / "b2" / "checkpoint.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    ma = (ref / "metrics.jsonl").read_text().splitlines()
    mb = (tmp_path / "b2" / "metrics.jsonl").read_text().splitlines()
    assert ma == mb and len(ma) == 3


def _one_line_error(code, err):
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err


@pytest.mark.parametrize(
    "args",
    [
        ["--epsilon", "0"],
        ["--epsilon", "-1"],
        ["--delta", "0"],
        ["--delta", "1.5"],
        ["--method", "gep"],  # no public data
        ["--out", "/nonexistent-parent-gsd/run"],
        ["--batch-size", "500", "--expected-size", "400"],  # a declared size below the batch (the real N is not looked at)
        ["--expected-size", "300", "--sampling-rate", "0.1"],
        ["--sampling-rate", "1.5"],
        ["--size-epsilon", "9"],  # above --epsilon
    ],
)
def test_cli_bad_input(capsys, tiny, args):
    base = ["train", "--private", tiny["private"], "-q"]
    if "--method" not in args:
        base += ["--public", tiny["public"]]
    code = main(base + args)
    _one_line_error(code, capsys.readouterr().err)


@pytest.mark.parametrize("args", [["--peft", "no.such.layer"], ["--weights", "/nonexistent-gsd.safetensors"],
                                  ["--private", "npz:/nonexistent-gsd.npz"]])
def test_cli_bad_model_or_data_leaves_no_run_folder(capsys, tiny, tmp_path, args):
    """The run folder is created only once the model and the data are there: a bad --peft, --weights
    or dataset is one error line and leaves nothing behind."""
    run = tmp_path / "run"
    code = main(["train", "--private", tiny["private"], "--method", "dpsgd", "--epochs", "1", "--out", str(run), "-q", *args])
    _one_line_error(code, capsys.readouterr().err)
    assert not run.exists()


def test_cli_trains_resizes_public_and_refuses_other_settings_on_resume(capsys, tiny, tmp_path):
    run = tmp_path / "run"
    args = ["train", "--private", tiny["private"], "--public", tiny["public"], "--epochs", "1", "--batch-size", "30",
            "--k", "4", "--public-examples", "30", "--model", "fmnist-cnn", "--out", str(run), "-q"]
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "epsilon=" in out and "accuracy" in out
    s = json.loads((run / "summary.json").read_text())
    assert s["method"] == "gep" and s["epsilon"] <= 2.0
    code = main(args)  # the folder exists: never overwritten
    _one_line_error(code, capsys.readouterr().err)
    code = main(["train", "--resume", str(run), "--epochs", "3", "-q"])
    _one_line_error(code, capsys.readouterr().err)
    code = main(["train", "--resume", str(tmp_path), "-q"])
    _one_line_error(code, capsys.readouterr().err)


def test_auto_select_with_dp_ranking_adds_both_budgets(capsys, tiny, tmp_path, npz_pair):
    run = tmp_path / "sel"
    code = main(["train", "--private", tiny["private"], "--auto-select", "--public", tiny["public"], f"npz:{npz_pair['far']}",
                 "--rank-model", "fmnist-cnn", "--rank-k", "2", "--rank-examples", "40", "--select-epsilon", "1.5", "--probe-repeats", "0",
                 "--epochs", "1", "--batch-size", "30", "--k", "4", "--public-examples", "30", "--out", str(run), "-q",
                 "--classes", "4", "--no-fallback"])  # npz_pair's priv.npz declares no classes; noise-like candidates
    out, err = capsys.readouterr()
    assert code == 0, err
    s = json.loads((run / "summary.json").read_text())
    assert s["selection"]["privacy"]["epsilon"] == 1.5
    assert s["budget"]["total_epsilon"] == pytest.approx(1.5 + s["epsilon"]) and s["budget"]["total_epsilon"] <= 2.0  # --epsilon: the total
    assert s["public"] in (tiny["public"], f"npz:{npz_pair['far']}") and s["public_distance"] is not None
    assert "training with" in out
    code = main(["train", "--private", tiny["private"], "--public", tiny["public"], f"npz:{npz_pair['far']}", "-q"])
    _one_line_error(code, capsys.readouterr().err)  # several publics without --auto-select


def test_resnet20_default_groups_are_the_papers_five():
    from probes import get_model_spec
    from gsd_cli.gradients import select_parameters
    from gsd_cli.train.config import parse_groups

    model = get_model_spec("resnet20").build(10, 0)
    names = select_parameters(model)
    sizes = [dict(model.named_parameters())[n].numel() for n in names]
    groups = split_groups(names, sizes, parse_groups("auto", "resnet20"))
    assert len(groups) == 5 and sum(map(len, groups)) == sum(sizes)
    assert len(split_groups(names, sizes, parse_groups("none", "resnet20"))) == 1
    assert len(split_groups(names, sizes, parse_groups("layer1.*;fc.*", "resnet20"))) == 3  # + the rest
    with pytest.raises(GSDError):
        parse_groups("fc.*;;", "resnet20")


def test_evaluate_accuracy_and_macro_auc_single_and_multilabel():
    from gsd_cli.data import ArraySource
    from gsd_cli.train.evaluate import evaluate

    class Oracle(torch.nn.Module):
        """Logits read off the first pixels of the (normalised) input: perfect or reversed scores."""

        def __init__(self, c, sign):
            super().__init__()
            self.c, self.sign = c, sign

        def forward(self, x):
            return self.sign * 10 * x.flatten(1)[:, : self.c]

    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 40)
    x = np.zeros((40, 4, 4), dtype=np.float32)
    x[np.arange(40), 0, y] = 1.0  # pixel (0, y) lit
    src = ArraySource("toy", x, y, num_classes=3)
    good = evaluate(Oracle(3, 1), src, 4, 1, "cpu")
    assert good["accuracy"] == 1.0 and good["macro_auc"] == 1.0
    bad = evaluate(Oracle(3, -1), src, 4, 1, "cpu")
    assert bad["macro_auc"] == 0.0
    Y = rng.integers(0, 2, (40, 3)).astype(np.float32)
    Y[0] = 1
    Y[1] = 0
    xm = np.zeros((40, 4, 4), dtype=np.float32)
    xm[:, 0, :3] = Y
    ml = ArraySource("toy-ml", xm, Y)
    r = evaluate(Oracle(3, 1), ml, 4, 1, "cpu")
    assert ml.multilabel and r["macro_auc"] == 1.0 and r["accuracy"] == 1.0


def test_auto_select_from_a_catalogue(capsys, tiny, tmp_path):
    cat = tmp_path / "gsd.toml"
    cat.write_text(f"""
[datasets.xray]
source = "npz"
path = "{tiny['private'][4:]}"

[datasets.web]
source = "npz"
path = "{tiny['public'][4:]}"

[[jobs]]
private = "xray"
candidates = ["web", "digits"]
""")
    run = tmp_path / "cat"
    code = main(["train", "--catalog", str(cat), "--private", "xray", "--auto-select", "--rank-model", "fmnist-cnn",
                 "--rank-k", "2", "--rank-examples", "30", "--epochs", "1", "--batch-size", "30", "--k", "4",
                 "--public-examples", "30", "--no-fallback", "--out", str(run), "-q"])  # noise-like candidates: past the advice
    out, err = capsys.readouterr()
    assert code == 0, err
    s = json.loads((run / "summary.json").read_text())
    assert s["private"] == "xray:train" and s["public"] in ("web", "digits")
    assert s["selection"]["candidates"] == ["digits", "web"]  # the figures: in private-summary.json (a non-private selection)
    p = json.loads((run / "private-summary.json").read_text())
    assert {r["public"] for r in p["selection"]["results"]} == {"web", "digits"}
    assert any("NOT differentially private" in n for n in s["notes"])
