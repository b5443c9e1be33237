"""What the large downstream benchmark's scorers share (issue 33): where the results live, the cache
walk of a ranking stage, the per-seed accuracies of a cell, the t-interval over seeds and how it is
printed, and the fallback rule's calibration on cells ({distance, gain}).

:mod:`.large_score` (the GSD rule), :mod:`.dp_rule` (the private selection's rule), :mod:`.pipeline_score`
(auto-select by scenario) and :mod:`.defaults_runs` all read these; it imports none of them (only
:mod:`.large`), so they import each other in one direction only (``large_score`` -> ``dp_rule``, ``pipeline_score``,
``defaults_runs``; each -> this module). The names stay importable from :mod:`.large_score` too.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .large import TASKS

ROOT = Path(__file__).resolve().parents[1] / "results"


def missing(tasks, seeds, path_of):
    """(task, seed, cache file) of the rankings not cached yet."""
    for task in tasks or TASKS:
        for seed in seeds:
            f = path_of(task, seed)
            if not f.is_file():
                yield task, seed, f


def interval(v: list[float]) -> dict:
    """Mean, sd and the 95% t-interval of the mean over seeds."""
    from scipy.stats import t

    v = [float(x) for x in v]
    n = len(v)
    m = float(np.mean(v))
    if n < 2:
        return {"mean": m, "sd": None, "ci": None, "n": n}
    sd = float(np.std(v, ddof=1))
    h = float(t.ppf(0.975, n - 1) * sd / math.sqrt(n))
    return {"mean": m, "sd": sd, "ci": [m - h, m + h], "n": n}


def _acc(runs, task, method, eps):
    out: dict[str | None, dict[int, float]] = {}
    for r in runs:
        if r["task"] == task and r["method"] == method and r["epsilon_target"] == eps:
            out.setdefault(r["public"], {})[r["seed"]] = r["accuracy"]
    return out


def _fmt(iv: dict) -> str:
    if iv["ci"] is None:
        return f"{100 * iv['mean']:.1f}"
    return f"{100 * iv['mean']:.1f} [{100 * iv['ci'][0]:.1f}, {100 * iv['ci'][1]:.1f}]"


def calibrate(cells: list[dict]) -> dict:
    """The threshold t on the winner's distance with the fewest wrong decisions over ``cells``
    ({distance, gain}); "use public data" iff distance <= t. Candidates: every midpoint between
    sorted distances, and below all (never use public data)."""
    ds = sorted({c["distance"] for c in cells})
    cand = [ds[0] - 1e-6] + [(a + b) / 2 for a, b in zip(ds, ds[1:])] + [ds[-1] + 1e-6]
    best = None
    for t in cand:
        wrong = sum((c["distance"] <= t) != (c["gain"] > 0) for c in cells)
        if best is None or wrong < best[1]:
            best = (t, wrong)
    t, wrong = best
    return {"threshold": round(float(t), 4), **evaluate(t, cells)}


def evaluate(t: float, cells: list[dict]) -> dict:
    """The rule "use public data iff distance <= t" on ``cells``: wrong decisions, and ``gain``, the mean
    accuracy gain over DP-SGD alone (in points) of the cells where it uses public data (None: none),
    which auto-select compares between methods."""
    used = [c["gain"] for c in cells if c["distance"] <= t]
    return {"errors": sum((c["distance"] <= t) != (c["gain"] > 0) for c in cells), "cells": len(cells),
            "false_use": sum(c["distance"] <= t and c["gain"] <= 0 for c in cells),
            "false_fallback": sum(c["distance"] > t and c["gain"] > 0 for c in cells),
            "gain": round(100 * float(np.mean(used)), 2) if used else None, "used": len(used)}
