"""The auto-select fallback rule for a *private* selection (``gsd train --auto-select --select-epsilon``):
calibrated on the DP energy distance, the ranking ``gsd rank --dp`` releases by default.

The GSD rule (:mod:`.large_score`) is a threshold on the winner's GSD; under ``--select-epsilon`` the
released distance is the DP energy distance d_j = sqrt(max(0, 1 - s~_j / (m C^2))), another scale, so
that rule cannot be applied. This module calibrates the same kind of rule on the energy distance:

1. :func:`rank_energy_all`: each task's candidates ranked as auto-select ranks them privately (probe,
   k=16, 2,000 rows, clip 1), with an epsilon so large that the Laplace noise is below 1e-8 (the
   noise-free energy distance d_j; benchmark only, never a release), the public seed and the rows'
   draw from the seed, cached; the sensitivity Lambda and m of each ranking kept.
2. :func:`build_dp`: the same cells as the GSD rule (every candidate at every epsilon of the training
   runs, "would it, were it the winner, beat DP-SGD?"), read with the energy distance; the threshold
   with the fewest wrong decisions on the selection tasks (:func:`.large_stats.calibrate`), its errors
   on the held-out task.
3. The rule reads the *released* distance, noised at the selection's epsilon: the released energy is
   s_j + L with L ~ Laplace(2 C^2 Lambda / epsilon), so d~^2 = d^2 - L / (m C^2) (clamped at 0), and
   "d~ <= t" holds with probability P(L / (m C^2) >= d^2 - t^2), exactly
   (:func:`use_probability`). :func:`expected_errors` sums, over the cells, the probability of the
   wrong decision at each selection epsilon.
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np

from .large import HELD_OUT, METHODS, SELECTION, TASKS, register
from .large_stats import ROOT, calibrate, evaluate, missing

RANKS = ROOT / "validity" / "large_ranks_energy"
#: auto-select's private ranking (gsd train --rank-model/--rank-k/--rank-examples, gsd rank --dp's clip)
RANK_DP = dict(model="probe", k=16, examples=2000, metric="dp-energy", clip=1.0)
#: an epsilon at which the Laplace noise is negligible (scale 2 C^2 Lambda / epsilon < 1e-8 on s_j,
#: m C^2 = 2000): the noise-free energy distance, for calibration only
NOISE_FREE_EPSILON = 1e10
#: the selection epsilons the rule's expected errors are reported at
SELECT_EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0)


def rank_file(task: str, seed: int):
    return RANKS / f"{task}-s{seed}.json"


def rank_energy_all(tasks=None, seeds=(0, 1, 2)) -> None:
    """The noise-free energy distances of each task's candidates (module docstring, step 1); cached."""
    import torch

    from gsd_cli.privacy.budget import unbooked
    from gsd_cli.ranking import rank

    torch.set_num_threads(int(os.environ.get("GSD_BENCH_THREADS", "2")))
    register()
    opts = {k: v for k, v in RANK_DP.items() if k != "metric"}
    for task, seed, f in missing(tasks, seeds, rank_file):
        t0 = time.perf_counter()
        with unbooked("benchmark calibration: a noise-free energy distance, never released"):
            r = rank(TASKS[task][0], list(TASKS[task][2]), seed=seed, insecure_seed=seed, device="cpu", dp=True,
                     epsilon=NOISE_FREE_EPSILON, **opts)
        pv = r.privacy or {}
        doc = {"task": task, "seed": seed, "settings": RANK_DP, "epsilon": NOISE_FREE_EPSILON, "metric": r.metric,
               "distance": {x.public: x.distance for x in r.results}, "lambda": pv.get("sensitivity_lambda"),
               "examples": pv.get("examples"), "clip": pv.get("clip"), "laplace_scale": pv.get("laplace_scale"),
               "seconds": round(time.perf_counter() - t0, 1), "loadavg": os.getloadavg()}
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{task} s{seed}: {doc['distance']} Lambda {doc['lambda']:.3f} ({doc['seconds']} s)", flush=True)


def energy(task: str) -> dict[int, dict]:
    out = {}
    for f in sorted(RANKS.glob(f"{task}-s*.json")):
        d = json.loads(f.read_text())
        if d["task"] == task and d["settings"] == RANK_DP:
            out[d["seed"]] = d
    return out


def use_probability(d: float, t: float, beta: float) -> float:
    """P(d~ <= t) for the released d~ = sqrt(max(0, d^2 - L')), L' ~ Laplace(beta) (module docstring)."""
    if beta <= 0:
        return float(d <= t)
    x = d * d - t * t  # d~ <= t  <=>  L' >= d^2 - t^2 (a clamped d~ = 0 <= t included)
    return 0.5 * math.exp(-x / beta) if x >= 0 else 1.0 - 0.5 * math.exp(x / beta)


def expected_errors(t: float, cells: list[dict], epsilon: float) -> float:
    """The expected number of wrong decisions of "use public data iff d~ <= t" over ``cells`` when d~ is
    released at ``epsilon`` (each cell's Laplace scale on d^2: 2 Lambda / (m epsilon), C = 1 cancels)."""
    e = 0.0
    for c in cells:
        p = use_probability(c["distance"], t, 2.0 * c["lambda"] / (c["m"] * epsilon))
        e += (1.0 - p) if c["gain"] > 0 else p
    return e


def build_dp(doc: dict) -> dict:
    """The DP rule from the GSD doc's cells (:func:`.large_score.build`) read with the energy distance."""
    en = {task: energy(task) for task in TASKS}
    cells = []
    for c in doc["cells"]:
        runs = en.get(c["task"]) or {}
        if not runs:
            continue
        cells.append({**c, "gsd": c["distance"],
                      "distance": float(np.mean([r["distance"][c["candidate"]] for r in runs.values()])),
                      "lambda": float(np.mean([r["lambda"] for r in runs.values()])),
                      "m": float(np.mean([r["examples"] for r in runs.values()]))})
    out = {"rank": RANK_DP, "noise_free_epsilon": NOISE_FREE_EPSILON, "select_epsilons": list(SELECT_EPSILONS),
           "energy": {task: {c: float(np.mean([r["distance"][c] for r in runs.values()])) for c in TASKS[task][2]}
                      for task, runs in en.items() if runs},
           "lambda": {task: [r["lambda"] for r in runs.values()] for task, runs in en.items() if runs},
           "cells": cells, "rule": {}}
    for method in METHODS:
        sel = [c for c in cells if c["method"] == method and c["task"] in SELECTION]
        held = [c for c in cells if c["method"] == method and c["task"] in HELD_OUT]
        if not sel:
            continue
        cal = calibrate(sel)
        t = cal["threshold"]
        out["rule"][method] = {**cal, "held_out": evaluate(t, held) if held else None,
                               "expected_errors": {f"{e:g}": {"selection": round(expected_errors(t, sel, e), 2),
                                                               "held_out": round(expected_errors(t, held, e), 2) if held else None}
                                                   for e in SELECT_EPSILONS}}
    return out


def package_rule(dp: dict) -> dict:
    """What ``validity.json`` ships under ``rule_dp`` (read by :mod:`gsd_cli.advice.fallback` when the
    selection is private)."""
    rule = {}
    for m, r in dp["rule"].items():
        ho = r["held_out"]
        rule[m] = {"threshold": r["threshold"], "errors": r["errors"], "cells": r["cells"], "gain": r["gain"],
                   "held_out_errors": ho["errors"] if ho else None, "held_out_cells": ho["cells"] if ho else None,
                   "held_out_gain": ho["gain"] if ho else None, "expected_errors": r["expected_errors"]}
    return {"rank": dp["rank"], "rule": rule, "metric": "dp-energy",
            "source": "python benchmarks/bench_downstream.py score --variant gsd-defaults --update-package (validity/dp_rule.py)"}


def tables(dp: dict) -> str:
    lines = ["\n### The fallback rule for a private selection (DP energy distance)"]
    for task, e in dp["energy"].items():
        lines.append(f"{task}: " + ", ".join(f"{c} {d:.3f}" for c, d in sorted(e.items(), key=lambda x: x[1]))
                     + f" (Lambda {np.mean(dp['lambda'][task]):.2f})")
    for m, r in dp["rule"].items():
        ho = r["held_out"]
        lines.append(f"rule {m}: use public data iff the released energy distance <= {r['threshold']}: wrong on {r['errors']}/{r['cells']} "
                     f"selection cells" + (f", {ho['errors']}/{ho['cells']} held-out" if ho else "")
                     + "; expected wrong decisions with the noise at epsilon "
                     + ", ".join(f"{e}: {v['selection']}" + (f" / {v['held_out']}" if v["held_out"] is not None else "")
                                 for e, v in r["expected_errors"].items()))
    return "\n".join(lines)


__all__ = ["RANK_DP", "build_dp", "expected_errors", "package_rule", "rank_energy_all", "tables", "use_probability"]
