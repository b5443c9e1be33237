"""Test metrics, and which one leads: the metrics users report for their task.

* Multi-label (a 0/1 matrix of findings, ChestX-ray14): the AUC of every finding (``auc_per_finding``,
  ``None`` for a finding whose test examples are all positive or all negative), their mean
  (``macro_auc``, over the findings that have an AUC), and the accuracy over all (example, finding)
  pairs at threshold 0.5. **Macro AUC leads**: with rare findings that accuracy mostly counts true
  negatives (a model that says "no finding" everywhere scores high).
* Single-label: accuracy of the arg-max, balanced accuracy (the mean recall over the classes present
  in the test set, ``sklearn.metrics.balanced_accuracy_score``) and macro AUC one-vs-rest (over the
  classes present, when there are at least two). **Balanced accuracy leads** when the test set is
  unbalanced: its largest class has more than :data:`IMBALANCE` (1.5) times the examples of its
  smallest present class (``class_ratio``); otherwise accuracy leads.

``primary`` names the leading metric. All of these are statistics of the private test set, outside
the privacy guarantee (which one leads says something about its class balance, too): they go to
``metrics.jsonl`` and ``private-summary.json``, never to ``summary.json`` (:mod:`gsd_cli.train.release`).
AUCs are ROC AUCs as ``sklearn.metrics.roc_auc_score`` gives them (paper 004 reports them for
ChestX-ray14 and HAM10000), computed here by :func:`roc_auc` (the Mann-Whitney statistic with ties
counted half, equal to scikit-learn's to float rounding, tested) and balanced accuracy by
:func:`balanced_accuracy` (scikit-learn's, exactly): importing scikit-learn cost a run 0.9 s on the
2-core CPU (issue 45).
"""

from __future__ import annotations

import numpy as np
import torch

from ..data import ImageSource, read_images, to_model_input
from ..gradients import default_loss

#: a single-label test set whose largest class has more than this many times the examples of its
#: smallest (present) class is unbalanced: balanced accuracy leads
IMBALANCE = 1.5
#: how each metric is written in tables and summary lines
LABELS = {"macro_auc": "macro AUC", "balanced_accuracy": "balanced accuracy", "accuracy": "accuracy"}


def finding_names(source: ImageSource, width: int) -> list[str]:
    """The names of the ``width`` findings (or classes) of ``source``: its declared class names when
    they fit, else ``"0"``, ``"1"``..."""
    names = [str(c) for c in (getattr(source, "classes", None) or [])]
    return names if len(names) == width and len(set(names)) == width else [str(i) for i in range(width)]


def midranks(values: np.ndarray) -> np.ndarray:
    """``scipy.stats.rankdata(values, method="average")`` of a 1-D array, the same floats (its algorithm:
    a stable sort, each run of equal values ranked at the mean of its ordinal ranks, k + (c - 1) / 2,
    exact in float64; a NaN makes every rank NaN, as SciPy's default ``nan_policy``), without importing
    ``scipy.stats`` (0.2-0.45 s of a short ``gsd train`` on the 2-core CPU, for one call an evaluation)."""
    s = np.asarray(values)
    if np.isnan(s).any():
        return np.full(s.shape, np.nan)
    order = np.argsort(s, kind="stable")
    y = s[order]
    first = np.flatnonzero(np.concatenate(([True], y[:-1] != y[1:])))  # where each run of equal values starts
    counts = np.diff(first, append=len(y))
    ranks = np.empty(len(y), dtype=np.float64)
    ranks[order] = np.repeat((first + 1).astype(np.float64) + (counts.astype(np.float64) - 1) / 2, counts)
    return ranks


def roc_auc(positive: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` for the boolean labels ``positive`` (both classes present):
    the probability that a positive example scores above a negative one, a tie counting 1/2 (the
    Mann-Whitney U over n+ n-, from the mid-ranks SciPy's ``rankdata`` gives, :func:`midranks`),
    which is the trapezoidal area scikit-learn's ``roc_auc_score`` computes."""
    positive = np.asarray(positive, dtype=bool)
    s = np.asarray(scores, dtype=np.float64)
    n_pos = int(positive.sum())
    n_neg = len(s) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("roc_auc needs positive and negative examples")
    u = midranks(s)[positive].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def balanced_accuracy(targets: np.ndarray, pred: np.ndarray) -> float:
    """Mean over the classes present in ``targets`` of the fraction of their examples predicted right
    (scikit-learn's ``balanced_accuracy_score``, whose classes absent from the targets have no recall
    and are left out)."""
    t, p = np.asarray(targets), np.asarray(pred)
    return float(np.mean([np.mean(p[t == c] == c) for c in np.unique(t)]))


def per_finding_auc(targets: np.ndarray, scores: np.ndarray, names: list[str]) -> dict[str, float | None]:
    """ROC AUC of each column of ``scores`` against the 0/1 column of ``targets`` (None where that
    column has no positive or no negative example)."""
    out = {}
    for c, name in enumerate(names):
        t = targets[:, c] > 0.5
        out[name] = roc_auc(t, scores[:, c]) if 0 < t.sum() < len(t) else None
    return out


def mean_or_none(values) -> float | None:
    got = [v for v in values if v is not None]
    return float(np.mean(got)) if got else None


def class_ratio(labels: np.ndarray) -> float:
    """Largest over smallest class count among the classes present in ``labels`` (1.0 for one class)."""
    counts = np.unique(labels, return_counts=True)[1]
    return float(counts.max() / counts.min()) if len(counts) else 1.0


def primary_metric(result: dict, multilabel: bool) -> str:
    """The metric that leads (module docstring): ``macro_auc`` for a multi-label set (``accuracy``
    when no finding has an AUC), ``balanced_accuracy`` for an unbalanced single-label set, else
    ``accuracy``."""
    if multilabel:
        return "macro_auc" if result.get("macro_auc") is not None else "accuracy"
    return "balanced_accuracy" if result.get("class_ratio", 1.0) > IMBALANCE else "accuracy"


def score(scores: np.ndarray, targets: np.ndarray, multilabel: bool, names: list[str] | None = None) -> dict:
    """The metrics of the module docstring from predicted probabilities ``scores`` (n x classes:
    sigmoid for multi-label, softmax otherwise) and ``targets`` (0/1 n x classes, or class indices)."""
    s, t = np.asarray(scores, dtype=np.float64), np.asarray(targets)
    result: dict = {}
    if multilabel:
        names = names or [str(i) for i in range(t.shape[1])]
        result["accuracy"] = float(((s > 0.5) == (t > 0.5)).mean())
        result["auc_per_finding"] = per_finding_auc(t, s, names)
        result["macro_auc"] = mean_or_none(result["auc_per_finding"].values())
    else:
        pred = s.argmax(1)
        result["accuracy"] = float((pred == t).mean())
        result["balanced_accuracy"] = balanced_accuracy(t, pred)  # predicted classes absent from t: no recall, left out
        result["class_ratio"] = class_ratio(t)
        present = [c for c in range(s.shape[1]) if 0 < (t == c).sum() < len(t)]
        result["macro_auc"] = float(np.mean([roc_auc(t == c, s[:, c]) for c in present])) if len(present) >= 2 else None
    result["primary"] = primary_metric(result, multilabel)
    return result


@torch.no_grad()
def evaluate(model: torch.nn.Module, source: ImageSource, input_size: int, channels: int, device, batch: int = 256) -> dict:
    """``{"loss", "examples", "accuracy", "macro_auc", "primary", ...}`` of ``model`` on every example
    of ``source`` (module docstring; :func:`score`). An image with a NaN or infinite value is a
    one-line error (:func:`gsd_cli.data.read_images`)."""
    from ..gradients.layers import maxpool_channels_last

    was = model.training
    model.eval()
    n = len(source)
    scores, targets, losses = [], [], []
    # on a CPU, max-pools fed channels-last (the private steps' trick: the same values, the channels-first
    # kernel was 10x slower on the FMNIST CNN; evaluating its 2,000 test images took 0.25 s an epoch, issue 45)
    hooks = maxpool_channels_last(model) if torch.device(device).type == "cpu" else []
    try:
        for start in range(0, n, batch):
            idx = np.arange(start, min(n, start + batch))
            x = to_model_input(read_images(source, idx, input_size), input_size, channels, device)
            y = torch.as_tensor(source.labels(idx)).to(device)
            out = model(x)
            if not bool(torch.isfinite(out).all()):
                from ..errors import ModelError

                finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
                state = "its weights are finite: its forward is not" if finite else "its weights became NaN or infinite: it diverged"
                raise ModelError(f"the model's outputs are NaN or infinite ({state}); check the model (gsd models show) "
                                 "and its --weights, or lower --lr")
            losses.append(default_loss(out, y).double().cpu())
            scores.append((torch.sigmoid(out) if source.multilabel else torch.softmax(out, -1)).double().cpu())
            targets.append(y.cpu())
    finally:
        for h in hooks:
            h.remove()
        model.train(was)
    s = torch.cat(scores).numpy()
    t = torch.cat(targets).numpy()
    names = finding_names(source, s.shape[1]) if source.multilabel else None
    return {"loss": float(torch.cat(losses).mean()), "examples": int(n), **score(s, t, source.multilabel, names)}


def metric_row(test: dict) -> dict:
    """The test fields of one ``metrics.jsonl`` row (all ``test_*``: not DP)."""
    row = {"test_loss": test["loss"], "test_accuracy": test["accuracy"], "test_macro_auc": test.get("macro_auc")}
    for key in ("balanced_accuracy", "class_ratio", "auc_per_finding"):
        if key in test:
            row[f"test_{key}"] = test[key]
    row["test_primary"] = test.get("primary", "accuracy")
    return row


def summary_block(row: dict) -> dict:
    """The ``test`` block of a run's summary from its last ``metrics.jsonl`` row: every test metric,
    ``primary`` (the one that leads) and ``primary_value``."""
    out = {k[len("test_"):]: v for k, v in row.items() if k.startswith("test_")}
    out.setdefault("primary", "accuracy")
    out["primary_value"] = out.get(out["primary"])
    return out


def lead(test: dict) -> tuple[str, float | None]:
    """``(label, value)`` of the metric that leads in a summary's ``test`` block (older summaries
    without ``primary``: accuracy)."""
    key = test.get("primary", "accuracy")
    return LABELS.get(key, key), test.get(key)
