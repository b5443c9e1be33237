"""Test metrics: accuracy, and macro AUC (one-vs-rest, or per finding for multi-label sets), as
paper 004 reports for ChestX-ray14 and HAM10000."""

from __future__ import annotations

import numpy as np
import torch

from ..data import ImageSource, read_images, to_model_input
from ..gradients import default_loss


@torch.no_grad()
def evaluate(model: torch.nn.Module, source: ImageSource, input_size: int, channels: int, device, batch: int = 256) -> dict:
    """``{"loss", "accuracy", "macro_auc"}`` of ``model`` on every example of ``source``.

    Single-label: accuracy of the arg-max, macro AUC one-vs-rest over the classes present.
    Multi-label: accuracy over all (example, finding) pairs at threshold 0.5, macro AUC over the
    findings that have both positives and negatives. ``macro_auc`` is None when no class qualifies.
    An image with a NaN or infinite value is a one-line error (:func:`gsd_cli.data.read_images`)."""
    from sklearn.metrics import roc_auc_score

    was = model.training
    model.eval()
    n = len(source)
    scores, targets, losses = [], [], []
    try:
        for start in range(0, n, batch):
            idx = np.arange(start, min(n, start + batch))
            x = to_model_input(read_images(source, idx), input_size, channels, device)
            y = torch.as_tensor(source.labels(idx)).to(device)
            out = model(x)
            losses.append(default_loss(out, y).double().cpu())
            scores.append((torch.sigmoid(out) if source.multilabel else torch.softmax(out, -1)).double().cpu())
            targets.append(y.cpu())
    finally:
        model.train(was)
    s = torch.cat(scores).numpy()
    t = torch.cat(targets).numpy()
    result = {"loss": float(torch.cat(losses).mean()), "examples": int(n)}
    if source.multilabel:
        result["accuracy"] = float(((s > 0.5) == (t > 0.5)).mean())
        cols = [c for c in range(t.shape[1]) if 0 < t[:, c].sum() < len(t)]
        result["macro_auc"] = float(np.mean([roc_auc_score(t[:, c], s[:, c]) for c in cols])) if cols else None
    else:
        result["accuracy"] = float((s.argmax(1) == t).mean())
        present = [c for c in range(s.shape[1]) if 0 < (t == c).sum() < len(t)]
        result["macro_auc"] = (
            float(np.mean([roc_auc_score(t == c, s[:, c]) for c in present])) if len(present) >= 2 else None
        )
    return result
