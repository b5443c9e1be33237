"""Issue 53, "no work done twice": stage 1 of the second phase is a function of public inputs, trained
once (gsd_cli.train.second_phase.stage1_cache); the feature probe's stage 1 with the run's own settings and seed is
the training's starting point; the probe runs only on candidates the advice could choose."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gsd_cli import data as gdata
from gsd_cli.cli import main
from gsd_cli.models.peft import build_model
from gsd_cli.train import TrainConfig
from gsd_cli.train.second_phase import stage1_cache
from gsd_cli.train.second_phase import run_second_phase

CLASSES = np.array([str(i) for i in range(10)])


def _npz(path, n, seed):
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), y=np.arange(n) % 10, classes=CLASSES)
    return f"npz:{path}"


def _stage1(cfg, out):
    spec, model, names, _ = build_model(cfg.model, 10, cfg.seed, params=cfg.params)
    rec = run_second_phase(model, names, cfg, spec, out, torch.device("cpu"), num_classes=10, multilabel=False,
                           private_classes=list(CLASSES))
    return rec, {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_second_stage_1_with_the_same_public_inputs_is_read_not_trained(tmp_path, monkeypatch, capsys):
    pub = _npz(tmp_path / "pub.npz", 60, 1)
    cfg = TrainConfig(private="mnist-a", public=pub, method="second-phase", model="fmnist-cnn", params=["fc*"], public_epochs=2,
                      public_examples=60, public_batch_size=20, seed=3)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, w1 = _stage1(cfg, tmp_path / "a")
    assert first["reused"] is False and len(list(stage1_cache.cache_dir().glob("*.safetensors"))) == 1
    stage1_cache._MEMORY.clear()  # read from disk, as a new process would
    second, w2 = _stage1(cfg, tmp_path / "b")
    assert second["reused"] is True and second["train_loss"] == first["train_loss"]
    assert all(torch.equal(w1[n], w2[n]) for n in w1)
    # the run folder holds what a trained stage 1 leaves: a --resume of it verifies and loads it
    meta = json.loads((tmp_path / "b" / "stage1.json").read_text())
    assert meta["epochs_done"] == first["search"]["epochs_run"] and meta["search"]["complete"]
    assert (tmp_path / "b" / "stage1.safetensors").is_file() and meta["record"]["search"] == first["search"]
    # another seed, another public set or other settings: trained again
    stage1_cache._MEMORY.clear()
    cfg.seed = 4
    (tmp_path / "c").mkdir()
    assert _stage1(cfg, tmp_path / "c")[0]["reused"] is False
    # a damaged entry is not trusted
    for f in stage1_cache.cache_dir().glob("*.safetensors"):
        f.write_bytes(f.read_bytes()[:-8] + b"\0" * 8)
    stage1_cache._MEMORY.clear()
    (tmp_path / "d").mkdir()
    rec, w4 = _stage1(cfg, tmp_path / "d")
    assert rec["reused"] is False
    mine = stage1_cache.cache_dir() / ("A" * 64 + ".safetensors")  # not a gsd key (lower-case hex): a user's file
    mine.write_bytes(b"mine")
    assert main(["cache", "info"]) == 0 and "2 stage-1 model(s) in stage1/" in capsys.readouterr().out  # seeds 3 and 4, not 3
    assert main(["cache", "clear"]) == 0 and list(stage1_cache.cache_dir().glob("*.safetensors")) == [mine]


@pytest.mark.parametrize("mode", ["same", "quick"])
def test_the_training_starts_from_the_probes_stage_1(tmp_path, capsys, monkeypatch, mode):
    """--auto-select with the probe, forced to the second phase on one candidate: with --probe-stage1 same the
    training's stage 1 is the probe's first draw (same settings and seed), read, not trained again; with quick (the
    default, issue 61: one learning rate, not the grid) the probe's are cheaper and the training trains its own."""
    import gsd_cli.advice.select as select

    monkeypatch.setattr(select, "choosable", lambda ranking, sources, *a: list(sources))
    monkeypatch.setattr("gsd_cli.ranking.reference.can_still_pass", lambda *a, **k: True)  # every draw, whatever the gains
    priv = _npz(tmp_path / "priv.npz", 120, 5)
    pub = _npz(tmp_path / "pub.npz", 1000, 6)
    trained = []
    real = stage1_cache.store
    monkeypatch.setattr(stage1_cache, "store", lambda key, *a, **k: (trained.append(key), real(key, *a, **k)))
    code = main(["train", "--private", priv, "--auto-select", "--public", pub, "--no-fallback", "--method", "second-phase",
                 "--rank-model", "fmnist-cnn", "--rank-k", "2", "--rank-examples", "30", "--probe-repeats", "2",
                 "--model", "fmnist-cnn", "--params", "fc*", "--epochs", "1", "--batch-size", "30", "--public-examples", "100",
                 "--public-epochs", "1", "--probe-stage1", mode, "-q", "--out", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    stages = json.loads((tmp_path / "run" / "summary.json").read_text())["stages"]
    if mode == "same":
        assert len(trained) == 2, "two probe draws trained stage 1; the training read the first"
        assert stages[1]["reused"] is True and 3 <= len(stages[1]["search"]["lrs"]) <= 5  # the grid (extended at its edge)
    else:
        assert len(trained) == 3, "two probe draws of one lr, then the training's stage 1 with its grid"
        assert stages[1]["reused"] is False and 3 <= len(stages[1]["search"]["lrs"]) <= 5


def test_the_probe_runs_only_on_candidates_the_advice_could_choose(tmp_path):
    """A candidate that is not closer than noise is not probed, and the decision is the advice's all the same."""
    from gsd_cli.advice.select import advised_selection

    priv = _npz(tmp_path / "priv.npz", 120, 7)
    far = _npz(tmp_path / "far.npz", 1000, 8)
    cfg = TrainConfig(private=priv, public=far, method="auto", model="fmnist-cnn", params=["fc*"], public_examples=100, public_epochs=1)
    ranking, decision = advised_selection(priv, [far], "auto", train_settings=cfg, probe_repeats=2, model="fmnist-cnn", k=2,
                                          examples=30, device="cpu")
    probe = decision.evidence["probe"]
    if decision.evidence[far]["beats_reference"]:
        pytest.skip("random data came out closer than noise at this seed")
    assert probe["gains"] == {} and probe["repeats"] == 0 and decision.method == "dpsgd"
    assert gdata.resolve(far).name == far


def test_a_second_auto_select_reads_the_public_subspaces_from_the_cache(tmp_path, capsys):
    """Issue 53: the candidates' and the noise references' subspaces are public: a second --auto-select with the
    same candidates and settings (a new private set of the same task) computes only the private side."""
    from gsd_cli.ranking.cache import SubspaceCache

    pub = _npz(tmp_path / "pub.npz", 200, 9)
    argv = ["train", "--auto-select", "--public", pub, "--rank-model", "fmnist-cnn", "--rank-k", "2", "--rank-examples", "30",
            "--rank-repeats", "2", "--probe-repeats", "0", "--method", "dpsgd", "--model", "fmnist-cnn", "--epochs", "1",
            "--batch-size", "30", "-q"]
    counts = []
    for i, seed in enumerate((10, 11)):
        before = {p.name for p in SubspaceCache().directory.glob("*") if p.is_file()}
        priv = _npz(tmp_path / f"priv{i}.npz", 120, seed)
        assert main([*argv, "--private", priv, "--out", str(tmp_path / f"run{i}")]) == 0, capsys.readouterr().err
        counts.append(len({p.name for p in SubspaceCache().directory.glob("*") if p.is_file()} - before))
    assert counts[0] > 0, "the first run stores the public subspaces"
    assert counts[1] == 0, "the second run computes no public subspace again (nothing new stored)"
