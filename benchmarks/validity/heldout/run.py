"""The held-out benchmark's one runner: what a round's spec (:mod:`.spec`) declares, through gsd's library, each
result recorded (:mod:`.results`) as soon as it exists, so that a round resumes where it stopped (keyed by task,
arm and seed; a training by its settings).

* ``prepare``: the round's npz files (its data builder, benchmark-only packages; imported only here);
* ``freeze``: the pre-registration file (the spec, every npz file's SHA-256, the gsd commit under test), once,
  committed before the first run; ``tune`` and ``run`` then check the data against it;
* ``tune``: the tuning grid on the tuning tasks (each candidate method with each seed's ranking winner), then the
  tuned file (per method, the grid point with the best mean accuracy, the first on a tie);
* ``run``: per seed and task, every option (each no-candidate method; each candidate method with each candidate; the
  null), the steps (``rank``, ``advised``, ``advised-native``, ``probe``, ``dp``), each deciding arm's decision
  (``advise``: gsd's advice on the cell's advised ranking and probe; ``dp``: the DP advice's) and the training it
  names at its budget where that is no option already trained.

The private randomness of every training comes from ``insecure_seed`` = the seed: reproducible experiments, which
gsd marks not DP (never releases). Every gsd call happens here, lazily: scoring and status import none of it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import tempfile
import time

from .results import RESULTS, Results, append_line, gsd_commit, load_json, read_lines, run_key, save_json, step_file, tuned
from .spec import Round, Task, load

ROOT = (__package__ or "").removesuffix("validity.heldout").rstrip(".")


def data(spec: Round):
    """The round's data builder (``build(force)``, ``NAMES``, ``data_dir()``), imported when needed."""
    return importlib.import_module(f"{ROOT}.{spec.data}" if ROOT else spec.data)


@functools.cache
def ready(n: int) -> Round:
    """Round ``n``'s spec with its sets (and its tuning round's) resolvable by name, the data checked against the
    frozen file where it records their hashes."""
    from ..npz_sets import register_npz

    spec = load(n)
    frozen = load_json(spec.frozen_path) or {}
    mod = data(spec)
    for name, sha in frozen.get("data_sha256", {}).items():
        path = mod.data_dir() / f"{name}.npz"
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != sha:
            raise SystemExit(f"{path} is not the file {spec.frozen} froze: python -m benchmarks validity --round {n} prepare --force")
    register_npz(mod.NAMES, mod.data_dir(), f"python -m benchmarks validity --round {n} prepare")
    if spec.tuning["round"] != n:
        ready(spec.tuning["round"])
    os.environ.setdefault("GSD_LEDGER", str(mod.data_dir() / "ledger.sqlite"))  # the benchmark's bookings, not the user's
    return spec


@functools.cache
def size(name: str) -> int:
    from gsd_cli.data import resolve

    return len(resolve(name))


def settings(spec: Round, task: Task, method: str, hp: dict, epsilon: float | None = None, delta: float | None = None) -> dict:
    """Every setting of a training (what its key hashes): the shared ones, the model, the private set's declared size,
    the method's own, the tuned (or grid) point and the budget."""
    budget = {"epsilon": spec.epsilon if epsilon is None else epsilon, "delta": spec.delta if delta is None else delta}
    return {**spec.base, **budget, "model": task.model, "expected_size": size(task.train), **spec.methods[method], **hp}


def fit(task: Task, method: str, public: str | None, seed: int, s: dict) -> tuple[float, float]:
    """One training through gsd's library (:func:`gsd_cli.train.train`): its test accuracy and epsilon."""
    from gsd_cli.train import TrainConfig
    from gsd_cli.train import train as gsd_train

    cfg = TrainConfig(private=task.train, private_test=task.test, public=public, method=method, seed=seed, insecure_seed=seed, **s)
    with tempfile.TemporaryDirectory() as tmp:
        summ = gsd_train(cfg, os.path.join(tmp, "run"), device="cpu")
    return summ["test"]["accuracy"], summ["epsilon"]


def train(runs_file, runs: dict, task: Task, method: str, public: str | None, seed: int, s: dict) -> dict:
    """A training's record (``runs``: the runs file's, by key), trained and appended if missing."""
    key = run_key(task.name, method, public, s, seed)
    if key in runs:
        return runs[key]
    t0 = time.perf_counter()
    acc, eps = fit(task, method, public, seed, s)
    rec = {"key": key, "task": task.name, "method": method, "public": public, "seed": seed, "settings": s, "accuracy": acc,
           "epsilon": eps, "seconds": round(time.perf_counter() - t0, 2), "commit": gsd_commit(),
           "loadavg": [round(x, 2) for x in os.getloadavg()]}
    append_line(runs_file, rec)
    runs[key] = rec
    print(f"  {task.name} {method} {public or '-'} seed {seed} epsilon {s['epsilon']:g}: {100 * acc:.1f}% "
          f"({rec['seconds']:.0f} s)", flush=True)
    return rec


# -- the steps of a cell ----------------------------------------------------------------------------------------


def native_model(train_model: str) -> str:
    """The probe network at ``train_model``'s input side (at least the smallest it takes, at most 224)."""
    from probes import get_model_spec, smallest_input_size

    from gsd_cli.models.spec import resolve_model

    side = resolve_model(train_model).input_size or 224
    s = min(224, max(smallest_input_size(get_model_spec("probe")), int(side)))
    return "probe" if s == 224 else f"probe@{s}"


def compute_step(spec: Round, task: Task, seed: int, step: str) -> dict:
    """One step of a cell through gsd's library (the spec's ranking settings; the probe with the second phase's)."""
    from gsd_cli.data import resolve
    from gsd_cli.ranking.cache import SubspaceCache
    from gsd_cli.advice.dp_probe import split_budget
    from gsd_cli.advice.probe import probe_second_phase
    from gsd_cli.advice.select import advised_selection, auto_select, dp_advised_selection
    from gsd_cli.train import TrainConfig

    cache, cands = SubspaceCache(data(spec).data_dir() / "subspaces"), list(task.candidates)
    sp = spec.validated

    def config(epsilon=None, delta=None):
        return TrainConfig(private=task.train, public=cands[0], method=sp, **settings(spec, task, sp, tuned(spec)[sp], epsilon, delta))

    if step == "rank":
        return auto_select(task.train, cands, private_test=task.test, seed=seed, device="cpu", cache=cache, **spec.rank).to_dict()
    if step in ("advised", "advised-native"):
        opts = {**spec.rank, **({"model": native_model(task.model)} if step == "advised-native" else {})}
        ranking, dec = advised_selection(task.train, cands, "auto", private_test=task.test, seed=seed, device="cpu", cache=cache, **opts)
        return {"ranking": ranking.to_dict(), "references": [r.to_dict() for r in getattr(ranking, "references", None) or []],
                "decision": dec.to_dict(), "model": opts["model"]}
    if step == "probe":  # every draw of every candidate (stop_decided=False): the orders read every mean gain
        return probe_second_phase(resolve(task.train), [resolve(c) for c in cands], config(), examples=spec.rank["examples"],
                                  seed=seed, device="cpu", stop_decided=False).to_dict()
    if step == "dp":
        eps_t, delta_t, delta_s = split_budget(spec.epsilon, spec.delta, spec.select_epsilon)
        dec, selection = dp_advised_selection(task.train, cands, "auto", settings=config(eps_t, delta_t), epsilon=spec.select_epsilon,
                                              delta=delta_s, private_test=task.test, seed=seed, device="cpu", insecure_seed=seed)
        return {"decision": dec.to_dict(), "selection": selection, "training": {"epsilon": eps_t, "delta": delta_t}}
    raise SystemExit(f"round {spec.round}: unknown step {step!r} (rank, advised, advised-native, probe, dp)")


def step(spec: Round, steps_dir, task: Task, seed: int, name: str) -> dict:
    """A step's record (``steps_dir``: the results' rankings folder), computed and saved if missing."""
    path = step_file(steps_dir, task.name, seed, name)
    doc = load_json(path)
    if doc is None:
        t0 = time.perf_counter()
        doc = compute_step(spec, task, seed, name)
        doc["benchmark"] = {"task": task.name, "seed": seed, "commit": gsd_commit(), "wall_seconds": round(time.perf_counter() - t0, 1)}
        save_json(path, doc)
    return doc


def decide(spec: Round, res: Results, task: Task, seed: int, arm: str) -> dict | None:
    """The arm's decision in a cell (its decider on the cell's steps), or None where the spec gives it no decider (an
    arm of an earlier round whose decisions are frozen only)."""
    a = spec.arms[arm]
    if a.get("decider") == "dp":
        doc = step(spec, res.steps_dir, task, seed, "dp")
        d = doc["decision"]
        return {"method": d["method"], "public": d["public"] if d["method"] not in spec.no_candidate else None, **doc["training"]}
    if a.get("decider") != "advise":
        return None
    from gsd_cli.data import resolve
    from gsd_cli.advice.decide import describe

    from .replay import advise

    facts = {c: describe(resolve(c)) for c in task.candidates}
    probe = step(spec, res.steps_dir, task, seed, "probe") if a.get("probe") else None
    m, p = advise(step(spec, res.steps_dir, task, seed, a["ranking"]), probe, facts, int(resolve(task.train).num_classes))
    return {"method": m, "public": p}


def run_cell(spec: Round, res: Results, runs: dict, task: Task, seed: int) -> None:
    hp = tuned(spec)
    jobs = [(m, c) for m, c in spec.options(task.name)] + ([(spec.null["method"], spec.null_set(task.name))] if spec.null else [])
    for m, c in jobs:
        train(res.runs_file, runs, task, m, c, seed, settings(spec, task, m, hp[m]))
    for name in spec.steps:
        step(spec, res.steps_dir, task, seed, name)
    for arm in spec.arms:
        d = res.decision(task.name, arm, seed)
        if d is None:
            d = decide(spec, res, task, seed, arm)
            if d is None:
                print(f"  {arm}: no decider (its decisions are frozen only)", flush=True)
                continue
            d = {"task": task.name, "seed": seed, "arm": arm, **d, "commit": gsd_commit()}
            append_line(res.decisions_file, d)
            res.decisions[(task.name, arm, seed)] = d
        if "epsilon" in d:
            s = settings(spec, task, d["method"], hp[d["method"]], d["epsilon"], d["delta"])
            train(res.runs_file, runs, task, d["method"], d["public"], seed, s)


def _threads() -> None:
    import torch

    torch.set_num_threads(1)


def run(n: int, part: tuple[int, int] = (1, 1)) -> None:
    """Every cell of round ``n`` (``part`` I/N: every N-th cell from the I-th, seed-major, for N parallel processes)."""
    spec = ready(n)
    _threads()
    res = Results(spec)
    runs = {r["key"]: r for r in read_lines(res.runs_file)}
    cells = [(t, s) for s in spec.seeds for t in spec.scored_tasks]  # seed-major: a partial round has whole seeds
    for i, (t, s) in enumerate(cells[part[0] - 1:: part[1]], 1):
        print(f"[round {n}, cell {i}: {t} seed {s}]", flush=True)
        run_cell(spec, res, runs, spec.tasks[t], s)


# -- tuning ------------------------------------------------------------------------------------------------------


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
                    winner = step(tspec, RESULTS / spec.tuning["runs"] / "rankings", task, seed, "rank")["results"][0]["public"]
                jobs += [(task, method, None if method in spec.no_candidate else winner, dict(hp), seed) for hp in grid]
    return jobs


def best_points(spec: Round, jobs: list[tuple], runs: dict) -> dict | None:
    """Per method, each grid point's mean accuracy over its tuning runs and the best point (the first on a tie);
    None while a run is missing."""
    out = {}
    for method, grid in spec.tuning["grid"].items():
        accs = [[runs.get(run_key(t.name, m, c, settings(spec, t, m, hp), s), {}).get("accuracy")
                 for t, m, c, hp, s in jobs if m == method and hp == point] for point in grid]
        if any(a is None for x in accs for a in x):
            return None
        scores = [{"hp": p, "mean_accuracy": sum(x) / len(x), "runs": len(x)} for p, x in zip(grid, accs)]
        out[method] = {"chosen": max(scores, key=lambda s: s["mean_accuracy"])["hp"], "grid": scores}
    return out


def tune(n: int, part: tuple[int, int] = (1, 1)) -> dict | None:
    """Every tuning run (``part`` I/N, as :func:`run`); then, once all are recorded, the tuned file (kept if it exists)."""
    spec = ready(n)
    _threads()
    runs_file = RESULTS / spec.tuning["runs"] / "runs.jsonl"
    runs = {r["key"]: r for r in read_lines(runs_file)}
    jobs = tune_jobs(spec)
    for task, m, c, hp, seed in jobs[part[0] - 1:: part[1]]:
        train(runs_file, runs, task, m, c, seed, settings(spec, task, m, hp))
    out = best_points(spec, jobs, {r["key"]: r for r in read_lines(runs_file)})
    if out is None:
        print("tuning runs missing (another part still running?)")
        return None
    path = RESULTS / spec.tuning["out"]
    if not path.is_file():
        save_json(path, {"rule": spec.tuning["rule"], "tasks": spec.tuning["tasks"], "methods": out})
    return {m: d["chosen"] for m, d in out.items()}


# -- data --------------------------------------------------------------------------------------------------------


def prepare(n: int, force: bool = False) -> dict:
    """The round's npz files (missing ones; every one with ``force``): {name: examples}."""
    return data(load(n)).build(force=force)


def freeze(n: int) -> dict:
    """Write the round's frozen file (refused when it exists): the spec, the SHA-256 of every npz file and the gsd
    commit under test. Commit it before the round's first run."""
    spec = load(n)
    if spec.frozen_path.is_file():
        raise SystemExit(f"{spec.frozen_path} exists: round {n} is frozen")
    mod = data(spec)
    missing = [x for x in mod.NAMES if not (mod.data_dir() / f"{x}.npz").is_file()]
    if missing:
        raise SystemExit(f"missing {missing[:3]}...: python -m benchmarks validity --round {n} prepare")
    doc = {"spec": json.loads(spec.path.read_text()), "gsd_cli_commit": gsd_commit(),
           "data_sha256": {x: hashlib.sha256((mod.data_dir() / f"{x}.npz").read_bytes()).hexdigest() for x in mod.NAMES},
           "note": f"written by python -m benchmarks validity --round {n} freeze before any run; the commit that froze it: "
                   f"git log --diff-filter=A -- {spec.frozen_path.name}"}
    save_json(spec.frozen_path, doc)
    return doc
