"""The held-out benchmark's tuning: a round's grid on its tuning tasks, through the runner's trainings (:mod:`.run`),
then the tuned file (the spec's ``tuning.out``) every arm trains at.

* rounds 1-6: each method over its grid on the tuning round's selection tasks, each candidate method with each
  seed's plain-ranking winner (:func:`tune_jobs`), the grid point with the best mean accuracy;
* a round tuned per private size (round 7: ``tuning.sizes``): each method over a product grid (learning rate x
  epochs) on seen tasks of earlier rounds at each size (:func:`.spec.tuning_tasks`), the grid grown outwards where
  its best point is on an edge (:func:`grown`), the point per size and method (:func:`tune_sized`).
"""

from __future__ import annotations

from pathlib import Path

from . import run as R
from .results import RESULTS, read_lines, run_key, save_json
from .spec import Round, load, tuning_tasks


def tune_jobs(spec: Round) -> list[tuple]:
    """(task, method, candidate, grid point, seed) of every tuning run: a candidate method with the plain ranking's
    winner of that task and seed."""
    tspec = load(spec.tuning["round"])
    jobs = []
    for seed in spec.tuning["seeds"]:
        for name in spec.tuning["tasks"]:
            task = tspec.tasks[name]
            winner = None
            for method, grid in spec.tuning["grid"].items():
                if method not in spec.no_candidate and winner is None:
                    winner = R.step(tspec, RESULTS / spec.tuning["runs"] / "rankings", task, seed, "rank")["results"][0]["public"]
                jobs += [(task, method, None if method in spec.no_candidate else winner, dict(hp), seed) for hp in grid]
    return jobs


def best_points(spec: Round, jobs: list[tuple], runs: dict) -> dict | None:
    """Per method, each grid point's mean accuracy over its tuning runs and the best point (the first on a tie);
    None while a run is missing."""
    out = {}
    for method, grid in spec.tuning["grid"].items():
        accs = [[runs.get(run_key(t.name, m, c, R.settings(spec, t, m, hp), s), {}).get("accuracy")
                 for t, m, c, hp, s in jobs if m == method and hp == point] for point in grid]
        if any(a is None for x in accs for a in x):
            return None
        scores = [{"hp": p, "mean_accuracy": sum(x) / len(x), "runs": len(x)} for p, x in zip(grid, accs)]
        out[method] = {"chosen": max(scores, key=lambda s: s["mean_accuracy"])["hp"], "grid": scores}
    return out


def tune(n: int, part: tuple[int, int] = (1, 1)) -> dict | None:
    """Every tuning run (``part`` I/N, as :func:`run`); then, once all are recorded, the tuned file (kept if it exists).
    A round tuned per private size (:func:`tune_sized`) grows its grid at an edge and may need a second call."""
    spec = R.ready(n)
    R._threads()
    runs_file = RESULTS / spec.tuning["runs"] / "runs.jsonl"
    if spec.tuning.get("sizes"):
        return tune_sized(spec, runs_file, part)
    runs = {r["key"]: r for r in read_lines(runs_file)}
    jobs = tune_jobs(spec)
    for task, m, c, hp, seed in jobs[part[0] - 1:: part[1]]:
        R.train(runs_file, runs, task, m, c, seed, R.settings(spec, task, m, hp))
    out = best_points(spec, jobs, {r["key"]: r for r in read_lines(runs_file)})
    if out is None:
        print("tuning runs missing (another part still running?)")
        return None
    path = RESULTS / spec.tuning["out"]
    if not path.is_file():
        save_json(path, {"rule": spec.tuning["rule"], "tasks": spec.tuning["tasks"], "methods": out})
    return {m: d["chosen"] for m, d in out.items()}


def grid_jobs(spec: Round, method: str, size: int, axes: dict) -> list[tuple]:
    """(task, method, candidate, point, seed) of every tuning run of ``method`` at ``size`` over the product of
    ``axes`` (lr x epochs): each tuning task with its declared candidate (none for a no-candidate method)."""
    cand = {e["task"]: e["candidate"] for e in spec.tuning["tasks"]}
    tasks = [t for t in tuning_tasks(spec) if t.size == size]
    return [(t, method, None if method in spec.no_candidate else cand[t.group], {"lr": lr, "epochs": ep}, seed)
            for seed in spec.tuning["seeds"] for t in tasks for ep in axes["epochs"] for lr in axes["lr"]]  # parts: alike


def grid_scores(spec: Round, jobs: list[tuple], runs: dict) -> list[dict] | None:
    """Each point's mean accuracy over its runs (None while one is missing)."""
    by_point: dict[tuple, list] = {}
    for t, m, c, hp, seed in jobs:
        by_point.setdefault((hp["lr"], hp["epochs"]), []).append(runs.get(run_key(t.name, m, c, R.settings(spec, t, m, hp), seed), {}).get("accuracy"))
    if any(a is None for x in by_point.values() for a in x):
        return None
    return [{"hp": {"lr": lr, "epochs": ep}, "mean_accuracy": sum(x) / len(x), "runs": len(x)} for (lr, ep), x in by_point.items()]


def grown(axes: dict, best: dict, rule: dict) -> dict | None:
    """The grid grown outwards where its best point is on an edge (``rule``: ``factor``; ``epochs_max``,
    ``epochs_min``: the bounds of the epochs), or None where it is inside (or at a bound)."""
    f, out, grew = rule["factor"], {k: list(v) for k, v in axes.items()}, False
    lo, hi = min(axes["lr"]), max(axes["lr"])
    if best["lr"] == lo:
        out["lr"].insert(0, lo / f)
        grew = True
    if best["lr"] == hi:
        out["lr"].append(hi * f)
        grew = True
    lo, hi = min(axes["epochs"]), max(axes["epochs"])
    if best["epochs"] == hi and hi * f <= rule["epochs_max"]:
        out["epochs"].append(int(hi * f))
        grew = True
    if best["epochs"] == lo and lo // f >= rule["epochs_min"]:
        out["epochs"].insert(0, int(lo // f))
        grew = True
    return out if grew else None


def tune_sized(spec: Round, runs_file: Path, part: tuple[int, int]) -> dict | None:
    """Per private size and method: the grid's runs (this part's share), then the best point (the first on a tie);
    where it is on an edge of the grid the grid grows outwards (:func:`grown`, at most ``extend.times`` times) and
    those runs follow. Once every size and method has its point, the tuned file (kept if it exists)."""
    rule, out, missing = spec.tuning["extend"], {}, False
    for k in spec.tuning["sizes"]:
        for method, grid in spec.tuning["grid"].items():
            axes, history = {"lr": list(grid["lr"]), "epochs": list(grid["epochs"])}, []
            while True:
                jobs = grid_jobs(spec, method, k, axes)
                runs = {r["key"]: r for r in read_lines(runs_file)}
                for t, m, c, hp, seed in jobs[part[0] - 1:: part[1]]:
                    R.train(runs_file, runs, t, m, c, seed, R.settings(spec, t, m, hp))
                scores = grid_scores(spec, jobs, {r["key"]: r for r in read_lines(runs_file)})
                if scores is None:
                    missing = True
                    break
                best = max(scores, key=lambda x: x["mean_accuracy"])["hp"]
                nxt = grown(axes, best, rule) if len(history) < rule["times"] else None
                if nxt is None:
                    corner = grown(axes, best, {**rule, "epochs_max": 10**9, "epochs_min": 0}) is not None
                    out.setdefault(str(k), {"methods": {}})["methods"][method] = {
                        "chosen": best, "grid": scores, "grown": history, "edge": corner}
                    break
                history.append({"from": axes, "best": best})
                axes = nxt
    if missing:
        print("tuning runs missing (another part still running?): run tune again once every part has finished")
        return None
    path = RESULTS / spec.tuning["out"]
    if not path.is_file():
        save_json(path, {"rule": spec.tuning["rule"], "tasks": spec.tuning["tasks"], "sizes": out})
    return {k: {m: d["chosen"] for m, d in v["methods"].items()} for k, v in out.items()}
