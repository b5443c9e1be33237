"""How well a predictor's order matches downstream accuracy, per task and method.

For a task and a downstream method (GEP or second phase), the truth is each candidate's test accuracy
over the training seeds; a predictor gives each candidate a value per predictor seed (lower = predicted
more useful). Scores, on the means over seeds:

* Spearman rho and Kendall tau between the predictor's mean value and the mean accuracy (scipy);
  **negative is right** (a smaller distance, a higher accuracy). 95% interval: percentile bootstrap,
  resampling the training seeds and the predictor seeds with replacement (:data:`BOOT` resamples).
* ``best``: the predictor's first candidate has the highest mean accuracy.
* ``below_none``: the predictor's first candidate has a mean accuracy below DP-SGD without public data.
* ``regret``: highest mean accuracy minus that of the predictor's first candidate.
"""

from __future__ import annotations

import numpy as np

BOOT = 1000


def _rho_tau(x, y) -> tuple[float, float]:
    from scipy.stats import kendalltau, spearmanr

    if len(set(np.round(x, 12))) < 2 or len(set(np.round(y, 12))) < 2:
        return float("nan"), float("nan")
    return float(spearmanr(x, y).statistic), float(kendalltau(x, y).statistic)


def rho_tau_rows(X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spearman rho (Pearson of average ranks) and Kendall tau-b of every row pair of X and Y (B x C),
    vectorised for the bootstrap; NaN where a row is constant (as scipy)."""
    from scipy.stats import rankdata

    rx, ry = rankdata(X, axis=1), rankdata(Y, axis=1)
    rx, ry = rx - rx.mean(1, keepdims=True), ry - ry.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (rx * ry).sum(1) / np.sqrt((rx**2).sum(1) * (ry**2).sum(1))
        i, j = np.triu_indices(X.shape[1], 1)
        sx, sy = np.sign(X[:, i] - X[:, j]), np.sign(Y[:, i] - Y[:, j])
        tau = (sx * sy).sum(1) / np.sqrt((sx != 0).sum(1) * (sy != 0).sum(1))
    return rho, tau


def truth(runs: list[dict], task: str, method: str) -> tuple[dict[str, dict[int, float]], dict[int, float]]:
    """``({candidate: {seed: accuracy}}, {seed: DP-SGD accuracy})`` of one task and method."""
    acc: dict[str, dict[int, float]] = {}
    none: dict[int, float] = {}
    for r in runs:
        if r["task"] != task:
            continue
        if r["method"] == "dpsgd":
            none[r["seed"]] = r["accuracy"]
        elif r["method"] == method:
            acc.setdefault(r["public"], {})[r["seed"]] = r["accuracy"]
    return acc, none


def score(pred: dict[int, dict], acc: dict[str, dict[int, float]], none: dict[int, float], seed: int = 0) -> dict | None:
    """The scores of one predictor (``{pred_seed: {candidate: value or None}}``) against one truth.
    Candidates without a value (labels that do not fit) or without every training seed are left out."""
    tseeds = sorted(set.intersection(*(set(v) for v in acc.values()))) if acc else []
    pseeds = sorted(pred)
    cands = [c for c in acc if all(pred[s].get(c) is not None for s in pseeds)]
    if len(cands) < 3 or not tseeds or not pseeds:
        return None
    P = np.array([[pred[s][c] for c in cands] for s in pseeds])  # S_p x C
    A = np.array([[acc[c][s] for c in cands] for s in tseeds])  # S_t x C
    pv, av = P.mean(0), A.mean(0)
    rho, tau = _rho_tau(pv, av)
    rng = np.random.default_rng(seed)
    pb = P[rng.integers(0, len(P), (BOOT, len(P)))].mean(1)  # BOOT x C
    ab = A[rng.integers(0, len(A), (BOOT, len(A)))].mean(1)
    br, bt = rho_tau_rows(pb, ab)
    ok = ~np.isnan(br)
    boot_r, boot_t = br[ok].tolist(), bt[ok].tolist()
    first = int(np.argmin(pv))
    none_mean = float(np.mean([none[s] for s in tseeds if s in none])) if none else float("nan")
    per_seed = [_rho_tau(P[i], av)[0] for i in range(len(P))]
    return {
        "candidates": cands, "n": len(cands), "pred_seeds": pseeds, "train_seeds": tseeds,
        "spearman": rho, "spearman_ci": [float(np.percentile(boot_r, 2.5)), float(np.percentile(boot_r, 97.5))] if boot_r else None,
        "kendall": tau, "kendall_ci": [float(np.percentile(boot_t, 2.5)), float(np.percentile(boot_t, 97.5))] if boot_t else None,
        "spearman_single_draws": per_seed,
        "first": cands[first], "best": bool(av[first] == av.max()), "below_none": bool(av[first] < none_mean),
        "regret": float(av.max() - av[first]), "accuracy_first": float(av[first]), "none": none_mean,
    }


def kendall_vs(pred: dict[int, dict], ref: dict[int, dict]) -> dict | None:
    """Kendall tau between a predictor and a reference order (DP-GSD against GSD), per seed and of
    the means over seeds."""
    from scipy.stats import kendalltau

    seeds = sorted(set(pred) & set(ref))
    if not seeds:
        return None
    cands = [c for c in ref[seeds[0]] if all(pred[s].get(c) is not None and ref[s].get(c) is not None for s in seeds)]
    per = [float(kendalltau([pred[s][c] for c in cands], [ref[s][c] for c in cands]).statistic) for s in seeds]
    mean = float(kendalltau(np.mean([[pred[s][c] for c in cands] for s in seeds], 0),
                            np.mean([[ref[s][c] for c in cands] for s in seeds], 0)).statistic)
    return {"per_seed": per, "mean_per_seed": float(np.mean(per)), "of_means": mean}
