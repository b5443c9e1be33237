"""The large downstream benchmark of issue 33: private tasks where DP training works (6,000-10,000
private examples, 28x28), public candidates from the same distribution to harmful, and the downstream
truth (DP-SGD without public data, GEP with each candidate, second phase with each candidate) at
epsilon 2 and 8, over seeds, every training cached as one JSON file.

Data: ``prepare_large.py`` (benchmark-only wheels, npz files outside the repository). Tasks:

* ``mnist`` (selection): 10,000 MNIST training digits; test 2,000 MNIST test digits.
* ``animal`` (selection): 6,000 animal-mnist silhouettes; test 2,000 others.
* ``mnist-neg`` (held out: confirms the tuned defaults and the calibrated rule): 10,000 other MNIST
  digits inverted (white background); test 2,000 inverted test digits.

Candidates per task span the same distribution (``pub-mnist`` / ``pub-animal`` / ``pub-mnist-neg``),
related sets (rotated digits, inverted digits, scikit-learn's digits at 28x28), unrelated ones
(silhouettes for digits, digits for silhouettes, natural textures) and harmful ones (uniform noise),
with a known-order family per selection task: ``pub-mnist`` rotated 0/30/90 degrees, ``pub-animal``
mixed with 0/25/75% noise. (prepare_large.py builds a few more sets, rot60, noise50, textures for the
digit tasks, that the 2-core grid leaves out.)

Cache: ``RUNS/<task>/<method>-<candidate>-e<epsilon>-s<seed>-<hash>.json``; the hash covers every
setting, so a changed setting never reuses a run and a later session (a GPU) extends the grid.
The private randomness of each run comes from ``insecure_seed`` = the seed (reproducible, so these
runs are marked not DP by gsd itself: experiments, not releases).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from .prepare_large import NAMES, data_dir

RUNS = Path(__file__).resolve().parents[1] / "results" / "validity" / "large_runs"

#: task -> (private train set, private test set, candidates in table order)
TASKS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "mnist": ("mnist-train", "mnist-test", ("pub-mnist", "pub-mnist-rot30", "pub-mnist-rot90", "pub-digits28",
                                             "pub-animal", "pub-noise")),
    "animal": ("animal-train", "animal-test", ("pub-animal", "pub-animal-noise25", "pub-animal-noise75", "pub-mnist",
                                               "pub-textures", "pub-noise")),
    "mnist-neg": ("mnist-neg-train", "mnist-neg-test", ("pub-mnist-neg", "pub-mnist-neg-rot90", "pub-mnist", "pub-digits28",
                                                        "pub-animal", "pub-noise")),
}
SELECTION = ("mnist", "animal")
HELD_OUT = ("mnist-neg",)
#: known-order families: candidates in order of decreasing expected use
FAMILIES = {"mnist": ("pub-mnist", "pub-mnist-rot30", "pub-mnist-rot90"),
            "animal": ("pub-animal", "pub-animal-noise25", "pub-animal-noise75")}
#: what each candidate is to its task
KIND = {"mnist": dict(zip(TASKS["mnist"][2], ("same", "family", "family", "related", "unrelated", "harmful"))),
        "animal": dict(zip(TASKS["animal"][2], ("same", "family", "family", "unrelated", "unrelated", "harmful"))),
        "mnist-neg": dict(zip(TASKS["mnist-neg"][2], ("same", "related", "related", "related", "unrelated", "harmful")))}

METHODS = ("gep", "second-phase")
BASELINE = "dpsgd"
EPSILONS = (2.0, 8.0)

#: settings shared by every training: small enough for a 2-core shared CPU (a run takes 30-90 s
#: there under load), large enough that DP-SGD trains (MNIST ~85% at epsilon 2)
SETTINGS = dict(model="fmnist-cnn", delta=1e-5, epochs=3, batch_size=500, lr=1.0, clip=1.0, lr_schedule="step")
#: GEP's settings (issue 33 tuning: benchmarks/bench_downstream.py tune); gsd's defaults where they agree
GEP = dict(k=32, public_examples=2000, clip_embedding=1.0, clip_residual=0.5, anchor_every=4, anchor_warm=True,
           anchor_batch=128, power_iters=1, groups="auto")
#: each method's own settings
METHOD_SETTINGS = {
    "dpsgd": {},
    "gep": GEP,
    "second-phase": dict(public_examples=2000, public_epochs=2, public_batch_size=64, public_lr=3e-3),  # issue 24's stage 1
}


@functools.lru_cache(maxsize=None)
def register() -> None:
    """Make every benchmark set resolvable by its name (``pub-mnist``...) as an npz source."""
    from .npz_sets import register_npz

    register_npz(NAMES, data_dir(), "python benchmarks/validity/prepare_large.py")


def settings(method: str, epsilon: float, overrides: dict | None = None) -> dict:
    s = {**SETTINGS, "epsilon": float(epsilon)}
    s.update(METHOD_SETTINGS[method])
    s.update(overrides or {})
    return s


def settings_hash(task: str, method: str, candidate: str | None, epsilon: float, overrides: dict | None = None) -> str:
    doc = {"settings": settings(method, epsilon, overrides), "method": method, "private": TASKS[task][:2],
           "public": candidate, "version": 2}  # 2: de-duplicated animal-mnist
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def run_file(task: str, method: str, candidate: str | None, epsilon: float, seed: int, overrides: dict | None = None) -> Path:
    h = settings_hash(task, method, candidate, epsilon, overrides)
    return RUNS / task / f"{method}-{candidate or 'none'}-e{epsilon:g}-s{seed}-{h}.json"


def jobs(tasks=None, seeds=(0, 1, 2), epsilons=EPSILONS, methods=(BASELINE, *METHODS), first: int | None = None) -> list[tuple]:
    """(task, method, candidate, epsilon, seed), seed-major then epsilon (a partial run has whole cells);
    ``first``: only each task's first ``first`` candidates (the first is the same-distribution set)."""
    out = []
    for seed in seeds:
        for eps in epsilons:
            for task in tasks or TASKS:
                if BASELINE in methods:
                    out.append((task, BASELINE, None, eps, seed))
                for cand in TASKS[task][2][:first]:
                    for m in methods:
                        if m != BASELINE:
                            out.append((task, m, cand, eps, seed))
    return out


def train_one(task: str, method: str, candidate: str | None, epsilon: float, seed: int, overrides: dict | None = None) -> dict:
    """Train once, or read the cached result."""
    from gsd_cli.train import TrainConfig, train

    f = run_file(task, method, candidate, epsilon, seed, overrides)
    if f.is_file():
        return json.loads(f.read_text())
    register()
    s = settings(method, epsilon, overrides)
    cfg = TrainConfig(private=TASKS[task][0], private_test=TASKS[task][1], public=candidate, method=method,
                      seed=seed, insecure_seed=seed, **{k: v for k, v in s.items() if k != "variant"})  # variant: a tag of the hash
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summ = train(cfg, os.path.join(tmp, "run"), device="cpu")
    doc = {"task": task, "method": method, "public": candidate, "seed": seed, "epsilon_target": float(epsilon),
           "accuracy": summ["test"]["accuracy"], "epsilon": summ["epsilon"], "sigma": summ.get("sigma"),
           "seconds": round(time.perf_counter() - t0, 2), "settings": s, "overrides": overrides or {},
           "hash": settings_hash(task, method, candidate, epsilon, overrides), "loadavg": os.getloadavg()}
    f.parent.mkdir(parents=True, exist_ok=True)
    tmpf = f.with_suffix(".tmp")
    tmpf.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmpf, f)
    return doc


def load_runs(tasks=None, overrides_ok: bool = False) -> list[dict]:
    """Every cached run made with the current settings (tuning runs with overrides only if asked)."""
    out = []
    for task in tasks or TASKS:
        d = RUNS / task
        for f in sorted(d.glob("*.json")) if d.is_dir() else []:
            doc = json.loads(f.read_text())
            if doc.get("overrides") and not overrides_ok:
                continue
            if doc["hash"] == settings_hash(task, doc["method"], doc["public"], doc["epsilon_target"], doc.get("overrides")):
                out.append(doc)
    return out
