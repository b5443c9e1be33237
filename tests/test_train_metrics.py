"""The metrics users report (issue 23): AUC per finding and its mean for multi-label sets, balanced
accuracy for unbalanced single-label sets, and a summary line led by the metric that fits the task;
all of them private (metrics.jsonl, private-summary.json), never in summary.json."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from gsd_cli.data import ArraySource
from gsd_cli.train.evaluate import IMBALANCE, evaluate, lead, metric_row, primary_metric, score, summary_block
from gsd_cli.train.release import not_dp_fields, split_summary
from gsd_cli.train.report import result_line as line_of


def _pair_auc(t: np.ndarray, s: np.ndarray) -> float:
    """AUC by brute force: over every (positive, negative) pair, 1 if the positive scores higher, 1/2 for a tie."""
    pos, neg = s[t == 1], s[t == 0]
    wins = [1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg)]
    return sum(wins) / len(wins)


# three findings over six examples, with ties; "rare" has no positive, so no AUC
TARGETS = np.array([[1, 0, 0], [0, 1, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=np.float32)
SCORES = np.array([[0.9, 0.2, 0.1], [0.4, 0.7, 0.3], [0.4, 0.6, 0.2], [0.4, 0.6, 0.1], [0.2, 0.1, 0.4], [0.5, 0.9, 0.2]])


def test_auc_per_finding_equals_pair_counting_and_macro_auc_is_their_mean():
    r = score(SCORES, TARGETS, multilabel=True, names=["effusion", "edema", "rare"])
    want = {n: _pair_auc(TARGETS[:, c], SCORES[:, c]) for c, n in enumerate(["effusion", "edema"])}
    assert r["auc_per_finding"]["effusion"] == pytest.approx(want["effusion"])  # ties count 1/2
    assert r["auc_per_finding"]["edema"] == pytest.approx(want["edema"])
    assert want["effusion"] == pytest.approx(4 / 9)  # 3 + 1/2 + 1/2 of 9 pairs
    assert r["auc_per_finding"]["rare"] is None
    assert r["macro_auc"] == pytest.approx((want["effusion"] + want["edema"]) / 2)
    assert r["primary"] == "macro_auc"
    assert r["accuracy"] == pytest.approx(((SCORES > 0.5) == (TARGETS > 0.5)).mean())


def test_balanced_accuracy_against_a_hand_computation():
    # class 0: 6 examples, 5 right; class 1: 2 examples, 1 right; class 2: 2 examples, 0 right
    y = np.array([0, 0, 0, 0, 0, 0, 1, 1, 2, 2])
    pred = np.array([0, 0, 0, 0, 0, 1, 1, 0, 0, 1])
    probs = np.eye(3)[pred] * 0.8 + 0.2 / 3
    r = score(probs, y, multilabel=False)
    assert r["balanced_accuracy"] == pytest.approx((5 / 6 + 1 / 2 + 0 / 2) / 3)
    assert r["accuracy"] == pytest.approx(6 / 10)
    assert r["class_ratio"] == pytest.approx(3.0) and r["primary"] == "balanced_accuracy"


@pytest.mark.parametrize("counts, lead_metric", [((10, 10), "accuracy"), ((15, 10), "accuracy"), ((16, 10), "balanced_accuracy"),
                                                  ((30, 3, 10), "balanced_accuracy")])
def test_which_metric_leads_single_label(counts, lead_metric):
    y = np.concatenate([np.full(n, c) for c, n in enumerate(counts)])
    r = score(np.eye(len(counts))[y], y, multilabel=False)
    assert r["primary"] == lead_metric
    assert (r["class_ratio"] > IMBALANCE) == (lead_metric == "balanced_accuracy")


def test_multilabel_without_any_auc_falls_back_to_accuracy():
    assert primary_metric({"macro_auc": None, "accuracy": 0.9}, multilabel=True) == "accuracy"


def test_summary_line_leads_with_macro_auc_for_multilabel_and_balanced_accuracy_when_unbalanced():
    ml = summary_block(metric_row({"loss": 0.3, **score(SCORES, TARGETS, True, ["effusion", "edema", "rare"])}))
    text = line_of(ml)
    assert text.startswith("macro AUC ") and "mean over 2 of 3 findings" in text
    assert text.index("macro AUC") < text.index("accuracy") and "true negatives" in text
    assert lead(ml) == ("macro AUC", ml["macro_auc"]) and ml["primary_value"] == ml["macro_auc"]
    y = np.array([0] * 8 + [1] * 2)
    sl = summary_block(metric_row({"loss": 0.5, **score(np.eye(2)[np.zeros(10, int)], y, False)}))
    assert line_of(sl).startswith("balanced accuracy 0.5 (classes 4:1") and "accuracy 0.8" in line_of(sl)
    old = {"accuracy": 0.7, "macro_auc": 0.8, "loss": 1.0}  # a summary written before issue 23
    assert line_of(old).startswith("accuracy 0.7")


def test_every_test_metric_is_private():
    row = {"epoch": 1, "epsilon_spent": 1.0, **metric_row({"loss": 0.3, **score(SCORES, TARGETS, True, ["a", "b", "c"])})}
    assert set(not_dp_fields(row)) == {k for k in row if k.startswith("test_")}
    public, private = split_summary({"dp": True, "test": summary_block(row), "epsilon": 1.0})
    assert "test" not in public and private["test"]["auc_per_finding"]["a"] is not None


def test_evaluate_reports_per_finding_auc_with_the_declared_names():
    class Oracle(torch.nn.Module):
        def forward(self, x):
            return 10 * (x.flatten(1)[:, :3] - 0.5)

    rng = np.random.default_rng(0)
    Y = rng.integers(0, 2, (30, 3)).astype(np.float32)
    Y[:, 2] = 0  # no positive: no AUC
    x = np.zeros((30, 4, 4), dtype=np.float32)
    x[:, 0, :3] = Y
    src = ArraySource("ml", x, Y, classes=["atelectasis", "effusion", "hernia"])
    r = evaluate(Oracle(), src, 4, 1, "cpu")
    assert r["auc_per_finding"] == {"atelectasis": 1.0, "effusion": 1.0, "hernia": None}
    assert r["macro_auc"] == 1.0 and r["primary"] == "macro_auc"


def test_a_training_run_writes_the_lead_metric_privately(tiny, tmp_path):
    from gsd_cli.train import TrainConfig, train

    s = train(TrainConfig(private=tiny["private"], method="dpsgd", epochs=1, batch_size=40, epsilon=4.0, insecure_seed=1),
              tmp_path / "run")
    assert s["test"]["primary"] in ("accuracy", "balanced_accuracy") and "balanced_accuracy" in s["test"]
    row = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["test_primary"] == s["test"]["primary"] and "test_balanced_accuracy" in row["not_dp"]
    assert "test" not in json.loads((tmp_path / "run" / "summary.json").read_text())
    private = json.loads((tmp_path / "run" / "private-summary.json").read_text())
    assert private["test"]["balanced_accuracy"] == pytest.approx(s["test"]["balanced_accuracy"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_auc_and_balanced_accuracy_equal_scikit_learns(seed):
    """gsd's own AUC (mid-ranks) and balanced accuracy against scikit-learn's, on scores with many ties
    (rounded) and without, predictions naming classes the targets lack (issue 45: sklearn is no
    longer imported by a run)."""
    from sklearn.metrics import balanced_accuracy_score, roc_auc_score

    from gsd_cli.train.evaluate import balanced_accuracy, roc_auc

    rng = np.random.default_rng(seed)
    for decimals in (1, 2, None):
        s = rng.random(500)
        s = np.round(s, decimals) if decimals else s
        t = rng.random(500) < 0.3
        assert roc_auc(t, s) == pytest.approx(roc_auc_score(t, s), rel=1e-12, abs=1e-12)
    small = rng.integers(0, 2, 12).astype(bool)
    small[:2] = [True, False]
    vals = np.round(rng.random(12), 1)
    assert roc_auc(small, vals) == pytest.approx(_pair_auc(small.astype(int), vals), abs=1e-12)
    targets = rng.integers(0, 6, 300)
    pred = np.where(rng.random(300) < 0.6, targets, rng.integers(0, 9, 300))  # classes 6-8 only predicted
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = balanced_accuracy_score(targets, pred)
    assert balanced_accuracy(targets, pred) == want  # the same fractions, the same mean: exactly


def test_evaluate_on_a_cpu_with_channels_last_max_pools_matches_a_plain_forward():
    """evaluate() feeds the max-pools channels-last on a CPU (issue 45): the model's loss and accuracy
    are those of its plain forward, to float rounding, and no hook is left on the model."""
    from probes import get_model_spec

    model = get_model_spec("fmnist-cnn").build(num_classes=10, seed=0)
    rng = np.random.default_rng(0)
    x = rng.random((300, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 300)
    src = ArraySource("evalcheck", x, y, classes=[str(i) for i in range(10)])
    got = evaluate(model, src, 28, 1, "cpu", batch=128)
    with torch.no_grad():
        out = model((torch.from_numpy(x)[:, None] - 0.5) / 0.5)
    want_loss = float(torch.nn.functional.cross_entropy(out.double(), torch.from_numpy(y)))
    assert got["loss"] == pytest.approx(want_loss, rel=1e-5)
    assert got["accuracy"] == pytest.approx(float((out.argmax(1).numpy() == y).mean()))
    assert not any(m._forward_pre_hooks for m in model.modules())
    assert model.training
