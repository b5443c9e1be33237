"""What the held-out benchmark trains and ranks: the training settings, the tuning grid, the runs of
each cell, and one training or ranking through gsd's library (cached by :mod:`.cache`).

Every task, every seed: DP-SGD alone; GEP and the second phase with each candidate; GEP with uniform
noise of the private data's shape (the null). Every (method, public set) that a decision could pick
is therefore in the cache; the arms that choose among them (gsd's auto decision, a random candidate,
the largest candidate, the oracle) are read off these runs by :mod:`.score`.

Settings (both stages, all tasks): epsilon 2, delta 1e-5, the private training set's size declared
(``expected_size``, public), Poisson batches of 500, 3 epochs, clip 1, SGD momentum 0.9, step
schedule; fmnist-cnn for 28x28 grey tasks, fmnist-cnn@32x3 for 32x32 RGB ones. GEP at gsd's defaults
(k 32, 2,000 anchors, 128 per recomputation every 4 steps, S1 1, S2 0.5); the second phase's stage 1:
2,000 public examples, 2 epochs, batch 64, Adam 3e-3. The learning rate of each method is tuned on the
selection tasks with the same grid (:data:`GRID`: 4 values each) and applied unchanged to the held-out
tasks. The private randomness of each run comes from ``insecure_seed`` = the seed (reproducible; gsd
marks such runs not DP: experiments, not releases).
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from .cache import (
    RESULTS,
    append_run,
    gsd_commit,
    load_ranking,
    load_runs,
    run_key,
    save_ranking,
)
from .tasks import ROUND_STAGES, TASKS, null, read_round, register, sizes, split

METHODS = ("gep", "second-phase")
BASELINE = "dpsgd"
BASE = dict(epsilon=2.0, delta=1e-5, epochs=3, batch_size=500, clip=1.0, momentum=0.9, lr_schedule="step")
METHOD_SETTINGS = {
    "dpsgd": {},
    "gep": dict(k=32, public_examples=2000, clip_embedding=1.0, clip_residual=0.5, anchor_every=4, anchor_warm=True, anchor_batch=128),
    "second-phase": dict(public_examples=2000, public_epochs=2, public_batch_size=64, public_lr=3e-3),
}
#: the tuning grid: the same size for every method (the issue: DP-SGD tuned with the same effort). 4.0 was
#: added after the first tuning put DP-SGD's and GEP's best at the old edge, 2.0 (selection tasks only)
GRID = {m: [{"lr": 0.5}, {"lr": 1.0}, {"lr": 2.0}, {"lr": 4.0}] for m in (BASELINE, *METHODS)}
TUNE_SEEDS = (0, 1, 2)
SELECTION_SEEDS = (0, 1, 2)
HELD_OUT_SEEDS = (0, 1, 2, 3, 4)
#: auto-select's ranking at gsd train --auto-select's defaults (--rank-model probe --rank-k 16 --rank-examples 2000)
RANK = dict(model="probe", k=16, examples=2000)
TUNED = RESULTS / "tuned.json"


def settings(task: str, method: str, hp: dict) -> dict:
    """Every training setting of a run (what its key hashes)."""
    t = TASKS[task]
    return {**BASE, "model": t.model, "expected_size": sizes()[t.train], **METHOD_SETTINGS[method], **hp}


def train_one(task: str, method: str, candidate: str | None, hp: dict, seed: int, runs: dict | None = None) -> dict:
    """One training through gsd's library (:class:`gsd_cli.train.TrainConfig`, :func:`gsd_cli.train.train`),
    or its cached record."""
    s = settings(task, method, hp)
    key = run_key(task, method, candidate, s, seed)
    runs = load_runs() if runs is None else runs
    if key in runs:
        return runs[key]
    from gsd_cli.train import TrainConfig, train

    register()
    t = TASKS[task]
    cfg = TrainConfig(private=t.train, private_test=t.test, public=candidate, method=method, seed=seed, insecure_seed=seed, **s)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        summ = train(cfg, os.path.join(tmp, "run"), device="cpu")
    rec = {"key": key, "task": task, "method": method, "public": candidate, "seed": seed, "hp": hp, "settings": s,
           "accuracy": summ["test"]["accuracy"], "epsilon": summ["epsilon"], "seconds": round(time.perf_counter() - t0, 2),
           "commit": gsd_commit(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
    append_run(rec)
    runs[key] = rec
    return rec


_SOURCES: dict = {}


def rank_one(task: str, seed: int) -> dict:
    """auto-select's ranking of ``task``'s candidates at gsd train --auto-select's defaults
    (:func:`gsd_cli.train.select.auto_select`), cached as ``Ranking.to_dict()``. Public subspaces
    are kept on disk (:class:`gsd_cli.ranking.cache.SubspaceCache`): how it runs, not what it computes."""
    doc = load_ranking(task, seed)
    if doc is not None:
        return doc
    from gsd_cli.ranking.cache import SubspaceCache
    from gsd_cli.train import auto_select

    register()
    from .prepare import data_dir

    t = TASKS[task]
    t0 = time.perf_counter()
    ranking = auto_select(t.train, list(t.candidates), private_test=t.test, seed=seed, device="cpu",
                          cache=SubspaceCache(data_dir() / "subspaces"), **RANK)
    doc = ranking.to_dict()
    doc["benchmark"] = {"task": task, "seed": seed, "commit": gsd_commit(), "wall_seconds": round(time.perf_counter() - t0, 1)}
    save_ranking(task, seed, doc)
    return doc


#: the cache tag of the advised rankings with the probe network at the training model's side (issue 53's
#: proposal, :func:`native_model`) instead of 224
NATIVE = "advised-native"


def native_model(train_model: str) -> str:
    """The probe network at ``train_model``'s input side, at least the smallest it takes (73), at most 224:
    ``probe@73`` for the benchmark's 28 and 32 pixel models."""
    from probes import get_model_spec, smallest_input_size

    from gsd_cli.models.spec import resolve_model

    side = resolve_model(train_model).input_size or 224
    s = min(224, max(smallest_input_size(get_model_spec("probe")), int(side)))
    return "probe" if s == 224 else f"probe@{s}"


def rank_advised(task: str, seed: int, native: bool = False) -> dict | None:
    """The ranking and decision of ``gsd_cli.train.select.advised_selection`` (the lead's advice, issue 42:
    the candidates plus the in-run noise reference, over its default repeats), cached beside the plain
    ranking as ``<task>-s<seed>-advised.json`` ({"ranking": ..., "decision": ...}). None where gsd has
    no advised_selection yet. ``native``: the ranking model at the training model's size
    (:func:`native_model`, ``probe@73`` for the benchmark's 28 and 32 pixel models),
    cached as ``<task>-s<seed>-advised-native.json``; else :data:`RANK`'s (the probe network at 224)."""
    kind = NATIVE if native else "advised"
    doc = load_ranking(task, seed, kind)
    if doc is not None:
        return doc
    try:
        from gsd_cli.train.select import advised_selection
    except ImportError:
        return None
    from gsd_cli.ranking.cache import SubspaceCache

    register()
    from .prepare import data_dir

    t = TASKS[task]
    opts = dict(RANK)
    if native:
        opts["model"] = native_model(t.model)
    t0 = time.perf_counter()
    ranking, dec = advised_selection(t.train, list(t.candidates), "auto", private_test=t.test, seed=seed, device="cpu",
                                     cache=SubspaceCache(data_dir() / "subspaces"), **opts)
    refs = [r.to_dict() for r in getattr(ranking, "references", None) or []]  # split_references: the noise rows apart
    doc = {"ranking": ranking.to_dict(), "references": refs, "decision": dec.to_dict(),
           "benchmark": {"task": task, "seed": seed, "commit": gsd_commit(), "model": opts["model"],
                         "wall_seconds": round(time.perf_counter() - t0, 1)}}
    save_ranking(task, seed, doc, kind)
    return doc


def probe_one(task: str, seed: int) -> dict:
    """The feature probe of ``task``'s candidates (:func:`gsd_cli.train.probe.probe_second_phase`) with the
    second phase's stage-1 settings and the ranking's private examples and seed, cached as
    ``<task>-s<seed>-probe.json`` (``ProbeResult.to_dict()``)."""
    doc = load_ranking(task, seed, "probe")
    if doc is not None:
        return doc
    from gsd_cli.data import resolve
    from gsd_cli.train import TrainConfig
    from gsd_cli.train.probe import probe_second_phase

    register()
    t = TASKS[task]
    s = settings(task, "second-phase", chosen()["second-phase"])
    cfg = TrainConfig(private=t.train, public=t.candidates[0], method="second-phase", **s)
    t0 = time.perf_counter()
    res = probe_second_phase(resolve(t.train), [resolve(c) for c in t.candidates], cfg, examples=RANK["examples"], seed=seed, device="cpu",
                             stop_decided=False)  # every mean gain: the variants and the Spearman read them all
    doc = {**res.to_dict(), "benchmark": {"task": task, "seed": seed, "commit": gsd_commit(), "wall_seconds": round(time.perf_counter() - t0, 1)}}
    save_ranking(task, seed, doc, "probe")
    return doc


def tune_candidate(task: str, seed: int) -> str:
    """The public set GEP and the second phase are tuned with on a selection task: the ranking's winner at that seed."""
    return rank_one(task, seed)["results"][0]["public"]


def tune_jobs() -> list[tuple]:
    out = []
    for seed in TUNE_SEEDS:
        for task in split()["selection"]:
            for method, grid in GRID.items():
                for hp in grid:
                    out.append((task, method, None if method == BASELINE else tune_candidate(task, seed), hp, seed))
    return out


def best_grid_point(grid, accuracies) -> dict:
    """``{"chosen", "grid"}``: each grid point's mean of ``accuracies(point)`` (its runs' test accuracies) and the
    point with the best mean (the first on a tie, in grid order): the tuning rule of every round."""
    scores = []
    for hp in grid:
        accs = list(accuracies(hp))
        scores.append({"hp": hp, "mean_accuracy": sum(accs) / len(accs), "runs": len(accs)})
    return {"chosen": max(scores, key=lambda s: s["mean_accuracy"])["hp"], "grid": scores}


def tuned(write: bool = True) -> dict:
    """Each method's learning rate: the grid point with the best mean accuracy over the selection
    tasks and tuning seeds (every grid run must be cached). Written to results/heldout/tuned.json."""
    runs = load_runs()
    doc = {}
    for method, grid in GRID.items():
        def accuracies(hp, method=method):
            for seed in TUNE_SEEDS:
                for task in split()["selection"]:
                    cand = None if method == BASELINE else tune_candidate(task, seed)
                    key = run_key(task, method, cand, settings(task, method, hp), seed)
                    if key not in runs:
                        raise SystemExit(f"tuning run missing: {task} {method} {cand} {hp} seed {seed}: python -m validity.heldout run --stage tune")
                    yield runs[key]["accuracy"]

        doc[method] = best_grid_point(grid, accuracies)
    if write:
        TUNED.parent.mkdir(parents=True, exist_ok=True)
        TUNED.write_text(json.dumps({"rule": "per method, the grid point with the best mean accuracy over the selection tasks "
                                     "and seeds 0-2 (GEP and the second phase with each seed's ranking winner)",
                                     "selection": split()["selection"], "methods": doc}, indent=1) + "\n")
    return {m: d["chosen"] for m, d in doc.items()}


def chosen() -> dict:
    """The tuned learning rates (from tuned.json)."""
    if not TUNED.is_file():
        raise SystemExit(f"{TUNED} is missing: python -m validity.heldout run --stage tune")
    return {m: d["chosen"] for m, d in json.loads(TUNED.read_text())["methods"].items()}


def cell_jobs(task: str, seeds, hps: dict) -> list[tuple]:
    """Every run of a task's cells: DP-SGD alone, GEP and the second phase with each candidate, GEP with noise."""
    t = TASKS[task]
    out = []
    for seed in seeds:
        out.append((task, BASELINE, None, hps[BASELINE], seed))
        for c in t.candidates:
            for m in METHODS:
                out.append((task, m, c, hps[m], seed))
        out.append((task, "gep", null(task), hps["gep"], seed))
    return out


def stage_tasks(stage: str) -> tuple[list[str], tuple[int, ...]]:
    """The tasks and seeds of a stage: selection, held-out (round 1), or held-out-N (round N,
    2-5: splitN.json)."""
    if stage == "selection":
        return split()["selection"], SELECTION_SEEDS
    if stage == "held-out":
        return split()["held_out"], HELD_OUT_SEEDS
    if stage in ROUND_STAGES:
        return read_round(int(stage[-1]))["held_out"], HELD_OUT_SEEDS
    raise SystemExit(f"unknown stage {stage}")


def stage_jobs(stage: str, methods=None) -> list[tuple]:
    if stage == "tune":
        jobs = tune_jobs()
    else:
        hps = chosen()
        tasks, seeds = stage_tasks(stage)
        jobs = [j for seed in seeds for task in tasks for j in cell_jobs(task, (seed,), hps)]  # seed-major: a partial stage has whole cells
    return [j for j in jobs if methods is None or j[1] in methods]


def rank_stage(stage: str, advised: bool = False, probe: bool = False, native: bool = False) -> None:
    import torch

    torch.set_num_threads(1)
    tasks, seeds = stage_tasks(stage)
    for seed in seeds:
        for task in tasks:
            t0 = time.time()
            if probe:
                d = probe_one(task, seed)
                top = sorted(d["gains"], key=lambda n: -sum(d["gains"][n]))
                print(f"probe {task} seed {seed}: " + ", ".join(f"{n} {100 * sum(d['gains'][n]) / len(d['gains'][n]):+.1f}" for n in top)
                      + f" ({time.time() - t0:.0f} s)", flush=True)
                continue
            if advised:
                a = rank_advised(task, seed, native)
                if a is None:
                    raise SystemExit("this gsd has no gsd_cli.train.select.advised_selection")
                print(f"rank (advised) {task} seed {seed}: {a['decision']['method']} {a['decision']['public']} "
                      f"({time.time() - t0:.0f} s)", flush=True)
                continue
            d = rank_one(task, seed)
            order = ", ".join(f"{r['public']} {r['distance']:.3f}" for r in d["results"])
            print(f"rank {task} seed {seed}: {order} ({time.time() - t0:.0f} s)", flush=True)


def run_stage(stage: str, methods=None) -> None:
    import torch

    torch.set_num_threads(1)
    jobs = stage_jobs(stage, methods)
    runs = load_runs()
    t0 = time.time()
    for i, (task, method, cand, hp, seed) in enumerate(jobs, 1):
        d = train_one(task, method, cand, hp, seed, runs)
        print(f"[{stage} {i}/{len(jobs)} {time.time() - t0:.0f}s] {task} {method} {cand} {hp} seed {seed}: "
              f"{100 * d['accuracy']:.1f}% ({d['seconds']:.0f} s)", flush=True)
