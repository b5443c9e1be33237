"""Downstream truth of the validity benchmark: for every (task, candidate, seed), the test accuracy of
GEP with that candidate as anchor data and of second-phase pre-training on it then DP-SGD, and for
every (task, seed) DP-SGD without public data, all at one epsilon.

Every finished training is cached as one JSON file, ``RUNS/<task>/<method>-<candidate>-s<seed>-<hash>.json``,
where ``hash`` is a digest of the training settings (:data:`SETTINGS`, the method's own, the task's
private set and the candidate), so a new predictor is scored without retraining and a changed
setting never reuses an old result. The private randomness of each run comes from
``insecure_seed`` = the seed (a benchmark must be reproducible; these runs are therefore marked not DP
by gsd itself, which is right: they are experiments, not releases).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from .tasks import TASKS, register

RUNS = Path(__file__).resolve().parents[1] / "results" / "validity" / "runs"
SEEDS = (0, 1, 2, 3, 4)
METHODS = ("gep", "second-phase")
BASELINE = "dpsgd"

#: settings shared by every training (small, so that the whole benchmark runs on 2 CPU cores)
SETTINGS = dict(model="fmnist-cnn", epsilon=2.0, delta=1e-5, epochs=5, batch_size=200, lr=0.1, clip=1.0,
                lr_schedule="step")
#: each method's own settings
METHOD_SETTINGS = {
    "dpsgd": {},
    "gep": dict(k=32, public_examples=300, clip_embedding=2.0, clip_residual=0.4, anchor_every=5, anchor_warm=True),
    "second-phase": dict(public_examples=1000, public_epochs=2, public_lr=3e-3, public_batch_size=64),
}


def settings_hash(task: str, method: str, candidate: str | None) -> str:
    doc = {"settings": SETTINGS, "method": method, "method_settings": METHOD_SETTINGS[method],
           "private": TASKS[task][0], "public": candidate, "version": 1}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def run_file(task: str, method: str, candidate: str | None, seed: int) -> Path:
    return RUNS / task / f"{method}-{candidate or 'none'}-s{seed}-{settings_hash(task, method, candidate)}.json"


def jobs(tasks=None, seeds=SEEDS) -> list[tuple[str, str, str | None, int]]:
    """Every training of the benchmark, seed-major (so that a partial run has whole seeds)."""
    out = []
    for seed in seeds:
        for task in tasks or TASKS:
            out.append((task, BASELINE, None, seed))
            for cand in TASKS[task][1]:
                for method in METHODS:
                    out.append((task, method, cand, seed))
    return out


def train_one(task: str, method: str, candidate: str | None, seed: int) -> dict:
    """Train once (or read the cached result)."""
    from gsd_cli.train import TrainConfig, train

    f = run_file(task, method, candidate, seed)
    if f.is_file():
        return json.loads(f.read_text())
    register()
    cfg = TrainConfig(private=TASKS[task][0], public=candidate, method=method,
                      seed=seed, insecure_seed=seed, **SETTINGS, **METHOD_SETTINGS[method])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        s = train(cfg, os.path.join(tmp, "run"), device="cpu")
    doc = {"task": task, "method": method, "public": candidate, "seed": seed, "accuracy": s["test"]["accuracy"],
           "epsilon": s["epsilon"], "sigma": s.get("sigma"), "seconds": round(time.perf_counter() - t0, 2),
           "settings": {**SETTINGS, **METHOD_SETTINGS[method]}, "hash": settings_hash(task, method, candidate),
           "loadavg": os.getloadavg()}
    f.parent.mkdir(parents=True, exist_ok=True)
    tmpf = f.with_suffix(".tmp")
    tmpf.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmpf, f)
    return doc


def load_runs(tasks=None) -> list[dict]:
    """Every cached run whose settings hash is the current one."""
    out = []
    for task in tasks or TASKS:
        for f in sorted((RUNS / task).glob("*.json")) if (RUNS / task).is_dir() else []:
            doc = json.loads(f.read_text())
            if doc["hash"] == settings_hash(task, doc["method"], doc["public"]):
                out.append(doc)
    return out
