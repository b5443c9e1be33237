"""Issue 53, the cache for a CI job: ``gsd train --auto-select --warm-cache`` (:mod:`gsd_cli.advice.warm`) does the
advice's public work ahead, under the keys the advice reads, from the private task's declared label space alone."""

from __future__ import annotations

import numpy as np
import pytest

import gsd_cli.advice.select as select
from gsd_cli.cli import main
from gsd_cli.data import resolve
from gsd_cli.data.base import ImageSource
from gsd_cli.ranking.cache import SubspaceCache
from gsd_cli.train import TrainConfig
from gsd_cli.train.second_phase import stage1_cache
from gsd_cli.advice.warm import warm_advice

CFG = dict(private="mnist-a", model="fmnist-cnn", params=["fc*"], public_examples=400, public_epochs=2, public_batch_size=100,
           public_augment="none")  # (2 epochs of augmented batches on 360 examples: no confident probe gain, no second phase)
RANK = dict(model="fmnist-cnn", k=4, examples=200, device="cpu", seed=0)
CANDIDATES = ["mnist-b", "faces", "noise"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path / "cache"))
    stage1_cache._MEMORY.clear()  # this process's entries: the advice must find the warmed ones on disk
    yield tmp_path / "cache"
    stage1_cache._MEMORY.clear()


def _spy_work(monkeypatch) -> dict:
    """Counts of stage-1 models trained (stored) and public subspaces computed (put) from now on."""
    seen = {"stage1": 0, "subspaces": []}
    store, put = stage1_cache.store, SubspaceCache.put

    def counted_store(*a, **k):
        seen["stage1"] += 1
        return store(*a, **k)

    def counted_put(self, key, sub):
        seen["subspaces"].append(key)
        return put(self, key, sub)

    monkeypatch.setattr(stage1_cache, "store", counted_store)
    monkeypatch.setattr(SubspaceCache, "put", counted_put)
    return seen


def test_after_warming_the_advice_computes_nothing_public_and_decides_the_same(cache_dir, monkeypatch):
    cfg = TrainConfig(method="auto", **CFG)
    report = warm_advice(cfg, "mnist-a", CANDIDATES, **RANK)
    # faces (2 classes) cannot serve a 10-class second phase: neither probed nor ranked; 2 candidates + 2 references
    assert report.candidates == ["mnist-b", "noise"] and set(report.left_out) == {"faces"}
    assert (report.stage1_trained, report.stage1_cached) == (6, 0) and (report.subspaces_computed, report.subspaces_cached) == (12, 0)
    seen = _spy_work(monkeypatch)
    stage1_cache._MEMORY.clear()
    ranking, decision = select.advised_selection("mnist-a", CANDIDATES, "auto", gate="helping", train_settings=cfg, probe_repeats=3,
                                                 repeats=3, cache=SubspaceCache(), **RANK)
    assert seen == {"stage1": 0, "subspaces": []}  # every stage 1 and public subspace read from the cache
    assert (decision.method, decision.public) == ("second-phase", "mnist-b")
    again = warm_advice(cfg, "mnist-a", CANDIDATES, **RANK)
    assert (again.stage1_trained, again.stage1_cached, again.subspaces_computed, again.subspaces_cached) == (0, 6, 0, 12)
    # the same decision and figures as without the cache (a fresh folder: everything computed again)
    monkeypatch.setenv("GSD_CACHE_DIR", str(cache_dir.parent / "cold"))
    stage1_cache._MEMORY.clear()
    cold_ranking, cold = select.advised_selection("mnist-a", CANDIDATES, "auto", gate="helping", train_settings=cfg,
                                                  probe_repeats=3, repeats=3, cache=SubspaceCache(), **RANK)
    # computed here: the probe's stage 1 (it may stop a decided candidate), the subspaces of the helpful candidate alone
    # (mnist-b and the two references, three draws: the warmed noise's were a superset the advice did not need)
    assert len(seen["subspaces"]) == 9 and seen["stage1"] >= 3
    assert (cold.method, cold.public) == (decision.method, decision.public)
    assert [r.public for r in cold_ranking] == [r.public for r in ranking]
    # to rounding: cached bases are kept in float32 and used in float64 (docs/rank.md: distances move by at most 6.8e-10)
    assert np.allclose([r.distances for r in cold_ranking], [r.distances for r in ranking], rtol=0, atol=1e-8)


class Unreadable(ImageSource):
    """A private set that declares its label space and refuses to be read."""

    def __init__(self, like):
        self.name, self.num_classes, self.multilabel = "secret-scans", like.num_classes, False
        self.classes = getattr(like, "classes", None)

    def __len__(self):
        raise AssertionError("the private set's size was read")

    def labels(self, indices):
        raise AssertionError("a private label was read")

    def images(self, indices):
        raise AssertionError("a private image was read")


def test_warming_reads_no_private_example_and_refuses_the_private_set_as_a_candidate(cache_dir, monkeypatch):
    cfg = TrainConfig(method="second-phase", **CFG)
    private = Unreadable(resolve("mnist-a"))
    report = warm_advice(cfg, private, ["mnist-b"], probe_repeats=2, rank_repeats=2, **RANK)
    # --method second-phase: the advice ranks every candidate (no gate); the probe's two draws of stage 1
    assert (report.stage1_trained, report.subspaces_computed) == (2, 2 * 3) and report.draws == {"probe": 2, "ranking": 2}
    from gsd_cli.errors import GSDError

    with pytest.raises(GSDError, match="is private data"):
        warm_advice(cfg, "mnist-a", ["mnist-a"], **RANK)


def test_the_private_advice_reads_its_warmed_stage_1(cache_dir, monkeypatch):
    """--select-epsilon: the DP feature probe's stage 1 (one draw, at --seed) is all it prepares; the DP probe then
    trains none."""
    from gsd_cli.advice.dp_probe import dp_probe_advice
    from gsd_cli.train.splits import private_parts

    cfg = TrainConfig(method="auto", **CFG)
    report = warm_advice(cfg, "mnist-a", CANDIDATES, dp=True, **RANK)
    assert (report.stage1_trained, report.subspaces_computed, report.draws) == (2, 0, {"probe": 1, "ranking": 0})
    seen = _spy_work(monkeypatch)
    stage1_cache._MEMORY.clear()
    train_part, _ = private_parts("mnist-a")
    decision, record = dp_probe_advice(train_part, [resolve(c) for c in CANDIDATES], cfg, "auto", epsilon=1.0, delta=1e-6,
                                       seed=0, device="cpu", insecure_seed=1)
    assert seen["stage1"] == 0 and sorted(record["usable"]) == ["mnist-b", "noise"]


def test_cli_warm_cache_prepares_then_stops(cache_dir, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("GSD_LEDGER", raising=False)
    argv = ["train", "--auto-select", "--warm-cache", "--public", "mnist-b", "faces", "--model", "fmnist-cnn", "--params", "fc*",
            "--rank-model", "fmnist-cnn", "--rank-k", "4", "--rank-examples", "200", "--public-examples", "400",
            "--public-epochs", "2", "--probe-repeats", "2", "--rank-repeats", "2", "-q"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("prepared 1 candidate(s) (mnist-b): stage 1 trained 2, already cached 0; public subspaces computed 6")
    assert "left out faces: faces has 2 classes" in out
    assert not list(tmp_path.glob("gsd-train-*")) and not (tmp_path / "data").exists()  # no run folder, no ledger
    assert main(argv) == 0 and "stage 1 trained 0, already cached 2; public subspaces computed 0" in capsys.readouterr().out
    assert main(["cache", "info"]) == 0
    info = capsys.readouterr().out
    assert ": 6 entries" in info and "2 stage-1 model(s) in stage1/" in info and "not gsd cache entries" not in info
    for bad in (["train", "--warm-cache"], argv + ["--out", str(tmp_path / "run")]):
        assert main(bad) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "--warm-cache prepares --auto-select's advice" in err
    assert not (tmp_path / "run").exists()
