"""Round 6's runs (:mod:`.protocol`), through gsd's library, cached so that a stage resumes:

* ``tune``: the grid of :data:`.protocol.GRID` for DP-SGD and the second phase on split.json's selection tasks
  (:func:`validity.heldout.arms.train_one`: the earlier rounds' run cache, where the 3-epoch points already are),
  then ``results/heldout6/tuned6.json``;
* ``run``: per seed and task, DP-SGD alone and the second phase with each candidate at epsilon 2; the advised
  ranking at gsd's default ranking model and the feature probe (the non-private advice); the DP advice at
  --select-epsilon 0.5 and the training it decides at the rest of the total. Every record lands in
  ``results/heldout6/runs.jsonl`` or ``results/heldout6/rankings/``.

The private randomness of every run comes from ``insecure_seed`` = the seed: reproducible experiments, which gsd
marks not DP (never releases). Before any work, every npz file's SHA-256 is checked against ``split6.json``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import time

from ..cache import RESULTS, append_run, gsd_commit, load_runs, run_key
from .protocol import DELTA, EPSILON, GRID, SEEDS, SELECT_EPSILON, TUNE_METHODS, TUNE_SEEDS, read_split6

OUT = RESULTS.parent / "heldout6"
RUNS6 = OUT / "runs.jsonl"
RANKINGS6 = OUT / "rankings"
TUNED6 = OUT / "tuned6.json"


@functools.cache
def ready() -> dict:
    """Register the round's sets (and the earlier rounds', for the tuning) and check the data against split6.json."""
    from .. import tasks as old
    from . import prepare6

    doc = read_split6()
    for name, sha in doc["data_sha256"].items():
        path = prepare6.data_dir() / f"{name}.npz"
        if hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            raise SystemExit(f"{path} is not the file split6.json froze: rebuild with python -m validity.heldout.round6.prepare6 --force")
    prepare6.register()
    old.register()
    return doc


# -- tuning --------------------------------------------------------------------------------------------------


def tune_jobs() -> list[tuple]:
    from ..arms import tune_candidate
    from ..tasks import split

    return [(task, m, None if m == "dpsgd" else tune_candidate(task, seed), hp, seed)
            for seed in TUNE_SEEDS for task in split()["selection"] for m in TUNE_METHODS for hp in GRID]


def run_tune(part: tuple[int, int] = (1, 1)) -> dict | None:
    """Every tuning run (``part`` I/N: every N-th from the I-th, for N parallel processes); then, when all are
    cached, tuned6.json."""
    from ..arms import train_one

    import torch

    torch.set_num_threads(1)
    ready()
    runs = load_runs()
    jobs = tune_jobs()[part[0] - 1 :: part[1]]
    t0 = time.time()
    for i, (task, m, cand, hp, seed) in enumerate(jobs, 1):
        d = train_one(task, m, cand, dict(hp), seed, runs)
        print(f"[tune {i}/{len(jobs)} {time.time() - t0:.0f}s] {task} {m} {cand} {hp} seed {seed}: {100 * d['accuracy']:.1f}%", flush=True)
    try:
        return tuned()
    except SystemExit as e:  # another part is still running
        print(e)
        return None


def tuned(write: bool = True) -> dict:
    """Each method's grid point with the best mean accuracy over the selection tasks and seeds (tuned6.json)."""
    from ..arms import best_grid_point, settings

    runs = load_runs()
    doc = {}
    for m in TUNE_METHODS:
        def accuracies(hp, m=m):
            for task, mm, cand, h, seed in tune_jobs():
                if mm == m and h == hp:
                    key = run_key(task, m, cand, settings(task, m, dict(hp)), seed)
                    if key not in runs:
                        raise SystemExit(f"tuning run missing: {task} {m} {hp} seed {seed}: python -m validity.heldout.round6 tune")
                    yield runs[key]["accuracy"]

        doc[m] = best_grid_point(GRID, accuracies)
    if write:
        OUT.mkdir(parents=True, exist_ok=True)
        TUNED6.write_text(json.dumps({"rule": read_split6()["tuning"]["rule"], "methods": doc}, indent=1) + "\n")
    return {m: d["chosen"] for m, d in doc.items()}


def chosen() -> dict:
    if not TUNED6.is_file():
        raise SystemExit(f"{TUNED6} is missing: python -m validity.heldout.round6 tune")
    return {m: d["chosen"] for m, d in json.loads(TUNED6.read_text())["methods"].items()}


# -- one training, one ranking -------------------------------------------------------------------------------


def settings6(task: str, method: str, epsilon: float = EPSILON, delta: float = DELTA) -> dict:
    """Every setting of a round-6 training: the earlier rounds' (:data:`validity.heldout.arms.BASE`, the method's
    own) with the tuned learning rate and epochs, the private set's size declared, and the privacy budget."""
    from gsd_cli.data import resolve

    from ..arms import BASE, METHOD_SETTINGS
    from .prepare6 import TASKS

    t = TASKS[task]
    return {**BASE, "model": t.model, "expected_size": len(resolve(t.train)), **METHOD_SETTINGS[method], **chosen()[method],
            "epsilon": epsilon, "delta": delta}


def load6() -> dict[str, dict]:
    """Every round-6 run by key (runs.jsonl of results/heldout6)."""
    return load_runs(RUNS6)


def train6(task: str, method: str, candidate: str | None, seed: int, runs: dict, epsilon: float = EPSILON,
           delta: float = DELTA) -> dict:
    """One round-6 training (cached by its key in runs.jsonl)."""
    from gsd_cli.train import TrainConfig, train

    from .prepare6 import TASKS

    s = settings6(task, method, epsilon, delta)
    key = run_key(task, method, candidate, s, seed)
    if key in runs:
        return runs[key]
    t = TASKS[task]
    cfg = TrainConfig(private=t.train, private_test=t.test, public=candidate, method=method, seed=seed, insecure_seed=seed, **s)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summ = train(cfg, os.path.join(tmp, "run"), device="cpu")
    rec = {"key": key, "task": task, "method": method, "public": candidate, "seed": seed, "settings": s,
           "accuracy": summ["test"]["accuracy"], "epsilon": summ["epsilon"], "seconds": round(time.perf_counter() - t0, 2),
           "commit": gsd_commit(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
    append_run(rec, RUNS6)
    runs[key] = rec
    return rec


def _cached(task: str, seed: int, kind: str, compute) -> dict:
    path = RANKINGS6 / f"{task}-s{seed}-{kind}.json"
    if path.is_file():
        return json.loads(path.read_text())
    t0 = time.perf_counter()
    doc = compute()
    doc["benchmark"] = {"task": task, "seed": seed, "commit": gsd_commit(), "wall_seconds": round(time.perf_counter() - t0, 1)}
    RANKINGS6.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)
    return doc


def advised6(task: str, seed: int) -> dict:
    """The advised ranking (candidates and the in-run noise references, 3 repeats) with gsd train --auto-select's
    default ranking model (:data:`gsd_cli.train.select.RANK_MODEL`, k 16, 2,000 examples)."""
    def compute():
        from gsd_cli.ranking.cache import SubspaceCache
        from gsd_cli.train.select import RANK_MODEL, advised_selection

        from .prepare6 import TASKS, data_dir

        t = TASKS[task]
        model = RANK_MODEL
        ranking, dec = advised_selection(t.train, list(t.candidates), "auto", private_test=t.test, seed=seed, device="cpu",
                                         cache=SubspaceCache(data_dir() / "subspaces"), model=model, k=16, examples=2000)
        return {"ranking": ranking.to_dict(), "references": [r.to_dict() for r in getattr(ranking, "references", None) or []],
                "decision": dec.to_dict(), "model": model}

    return _cached(task, seed, "advised", compute)


def _config(task: str, method: str, epsilon: float = EPSILON, delta: float = DELTA):
    from gsd_cli.train import TrainConfig

    from .prepare6 import TASKS

    t = TASKS[task]
    return TrainConfig(private=t.train, public=t.candidates[0], method=method, **settings6(task, method, epsilon, delta))


def probe6(task: str, seed: int) -> dict:
    """The feature probe of every candidate (3 draws) with the second phase's stage-1 settings."""
    def compute():
        from gsd_cli.data import resolve
        from gsd_cli.train.probe import probe_second_phase

        from .prepare6 import TASKS

        t = TASKS[task]
        res = probe_second_phase(resolve(t.train), [resolve(c) for c in t.candidates], _config(task, "second-phase"),
                                 examples=2000, seed=seed, device="cpu", stop_decided=False)  # as pre-registered: every draw
        return res.to_dict()

    return _cached(task, seed, "probe", compute)


def dp6(task: str, seed: int) -> dict:
    """The DP advice: ``gsd train --auto-select --select-epsilon 0.5 --epsilon 2``'s decision
    (:func:`gsd_cli.train.select.dp_advised_selection` at the selection's share of the total)."""
    def compute():
        from gsd_cli.train.dp_advice import split_budget
        from gsd_cli.train.select import dp_advised_selection

        from .prepare6 import TASKS

        t = TASKS[task]
        eps_t, delta_t, delta_s = split_budget(EPSILON, DELTA, SELECT_EPSILON)
        dec, selection = dp_advised_selection(t.train, list(t.candidates), "auto", settings=_config(task, "second-phase", eps_t, delta_t),
                                              epsilon=SELECT_EPSILON, delta=delta_s, private_test=t.test, seed=seed,
                                              device="cpu", insecure_seed=seed)
        return {"decision": dec.to_dict(), "selection": selection, "training": {"epsilon": eps_t, "delta": delta_t}}

    return _cached(task, seed, "dp", compute)


def run_cell(task: str, seed: int, runs: dict) -> None:
    from .prepare6 import TASKS

    t = TASKS[task]
    t0 = time.time()
    base = train6(task, "dpsgd", None, seed, runs)
    for c in t.candidates:
        train6(task, "second-phase", c, seed, runs)
    advised6(task, seed)
    probe6(task, seed)
    dp = dp6(task, seed)
    d = dp["decision"]
    m = d["method"]
    r = train6(task, m, d["public"] if m != "dpsgd" else None, seed, runs, dp["training"]["epsilon"], dp["training"]["delta"])
    print(f"[{task} seed {seed} {time.time() - t0:.0f}s] dpsgd {100 * base['accuracy']:.1f}%, dp advice {m} {d['public']} "
          f"{100 * r['accuracy']:.1f}%", flush=True)


def run(seeds: tuple[int, ...] = SEEDS, part: tuple[int, int] = (1, 1)) -> None:
    """Every cell (``part`` I/N: every N-th cell from the I-th, seed-major, for N parallel processes)."""
    import torch

    from .prepare6 import TASKS

    torch.set_num_threads(1)
    ready()
    chosen()
    runs = load6()
    cells = [(task, seed) for seed in seeds for task in TASKS]  # seed-major: a partial round has whole seeds
    for task, seed in cells[part[0] - 1 :: part[1]]:
        run_cell(task, seed, runs)
