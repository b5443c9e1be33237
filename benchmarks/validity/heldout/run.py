"""The held-out benchmark's one runner: what a round's spec (:mod:`.spec`) declares, through gsd's library, each
result recorded (:mod:`.results`) as soon as it exists, so that a round resumes where it stopped (keyed by task,
arm and seed; a training by its settings).

* ``prepare``: the round's npz files (its data builder, benchmark-only packages; imported only here);
* ``freeze``: the pre-registration file (the spec, every npz file's SHA-256, the gsd commit under test), once,
  committed before the first run; ``tune`` and ``run`` then check the data against it;
* ``tune``: :mod:`.tuning` (the grid on the tuning tasks, then the tuned file), through this runner's trainings;
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
import shutil
import sys
import tempfile
import time

from dataclasses import replace
from pathlib import Path

from .results import Results, append_line, gsd_commit, load_json, read_lines, run_key, save_json, step_file, tuned
from .spec import Round, Task, load, subset_indices, tuning_tasks

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
    os.environ.setdefault("GSD_LEDGER", str(mod.data_dir() / "ledger.sqlite"))  # the benchmark's bookings, not the user's
    for r in {spec.tuning["round"], *spec.data_rounds} - {n}:
        ready(r)
    others = other_files(spec) if frozen.get("other_sha256") else {}
    for name, sha in frozen.get("other_sha256", {}).items():  # the earlier rounds' sets this round uses, as frozen
        if hashlib.sha256(others[name].read_bytes()).hexdigest() != sha:
            raise SystemExit(f"{others[name]} is not the file {spec.frozen} froze")
    rebuilt = (load_json(deviations_path(spec)) or {}).get("bases_rebuilt", {})
    for name, sha in frozen.get("bases_sha256", {}).items():
        BASE_SHA[name] = check_base(base_dir(spec, name) / "weights.safetensors", sha, rebuilt.get(name), n)
    for task in [*spec.tasks.values(), *tuning_tasks(spec)]:
        if task.size is not None:
            register_subset(task.train, task.size)
    if spec.bases:
        BASES.update({name: base_dir(spec, name) for name in spec.bases})
    return spec


#: every base a ready round declares, by name: its folder
BASES: dict[str, Path] = {}
#: every base a ready round declares, by name: the SHA-256 of the weights in use (each run and decision records it)
BASE_SHA: dict[str, str] = {}


def deviations_path(spec: Round) -> Path:
    """A frozen round's recorded deviations from its pre-registration (beside the frozen file; the frozen file itself
    is never rewritten): ``bases_rebuilt`` names a base rebuilt from the frozen recipe whose weights differ."""
    return spec.frozen_path.with_name(spec.frozen_path.stem + "-deviations.json")


def base_dir(spec: Round, name: str) -> Path:
    """Where a round's base ``name`` is built (beside its data)."""
    return data(spec).data_dir() / "bases" / name


def check_base(path: Path, frozen_sha: str, rebuilt: dict | None, n: int) -> str:
    """The SHA-256 of the base weights ``path``: the frozen one, or the one a deviation ``rebuilt`` (the round's
    deviations file: ``sha256``, ``reason``) records for a base rebuilt from the frozen recipe (said on stderr);
    anything else stops: a base is never swapped silently."""
    if not path.is_file():
        raise SystemExit(f"{path} is missing: python -m benchmarks validity --round {n} prepare")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got == frozen_sha:
        return got
    if rebuilt is None or got != rebuilt.get("sha256"):
        raise SystemExit(f"{path} is not the base round {n} froze (sha256 {got[:12]}): a base rebuilt from the frozen "
                         "recipe is used only once its hash and the reason are recorded in the round's deviations file")
    print(f"{path.parent.name}: the rebuilt base ({got[:12]}), not the frozen one ({frozen_sha[:12]}): {rebuilt['reason']}",
          file=sys.stderr, flush=True)
    return got


def register_subset(name: str, n: int) -> None:
    """``<set>~<n>`` resolvable: the seeded subset of :func:`.spec.subset_indices` (public: it depends on the set's
    length only)."""
    from gsd_cli.data import register_dataset, resolve
    from gsd_cli.data.splits import SubsetSource

    parent = name.rsplit("~", 1)[0]

    def make():
        src = resolve(parent)
        return SubsetSource(src, subset_indices(len(src), n), name)

    register_dataset(name, make)


@functools.cache
def size(name: str) -> int:
    from gsd_cli.data import resolve

    return len(resolve(name))


def settings(spec: Round, task: Task, method: str, hp: dict, epsilon: float | None = None, delta: float | None = None) -> dict:
    """Every setting of a training (what its key hashes): the shared ones, the model, the private set's declared size,
    the method's own, the tuned (or grid) point and the budget."""
    budget = {"epsilon": spec.epsilon if epsilon is None else epsilon, "delta": spec.delta if delta is None else delta}
    own = dict(spec.methods[method])
    if "method" in own:  # a method of the spec that trains another gsd method (ft-base: dpsgd from the base)
        own["train_method"] = own.pop("method")
    if own.pop("from_base", False):
        own["from_base"] = task.base
    batch = {}
    if task.size is not None and "batch_size" not in spec.base:  # gsd train's default batch: at most N/4, the grid's
        b = min(500, task.size // 4)                                # rates (at batch 500) scaled with it
        batch = {"batch_size": b, "lr_scale": b / 500}
    return {**spec.base, **budget, "model": task.model, "expected_size": size(task.train), **own, **batch, **hp}


def train_config(task: Task, method: str, public: str | None, s: dict, **extra):
    """The :class:`gsd_cli.train.TrainConfig` of a training's settings (``train_method``: the gsd method; ``from_base``:
    the base's name, trained from its weights)."""
    from gsd_cli.train import TrainConfig

    s = dict(s)
    gsd_method, base = s.pop("train_method", method), s.pop("from_base", None)
    if "lr_scale" in s:
        s["lr"] = s["lr"] * s.pop("lr_scale")
    weights = None if base is None else str(BASES[base])
    return TrainConfig(private=task.train, public=public, method=gsd_method, weights=weights, **s, **extra)


def fit(task: Task, method: str, public: str | None, seed: int, s: dict) -> tuple[float, float]:
    """One training through gsd's library (:func:`gsd_cli.train.train`): its test accuracy and epsilon."""
    from gsd_cli.train import train as gsd_train

    cfg = train_config(task, method, public, s, private_test=task.test, seed=seed, insecure_seed=seed)
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
           "loadavg": [round(x, 2) for x in os.getloadavg()], **({"bases": dict(BASE_SHA)} if BASE_SHA else {})}
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

    cache, cands = SubspaceCache(data(spec).data_dir() / "subspaces"), list(task.candidates)
    sp = spec.validated

    def config(epsilon=None, delta=None):
        return train_config(task, sp, cands[0], settings(spec, task, sp, tuned(spec, task.size)[sp], epsilon, delta))

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
    if step in (spec.dp or {}):  # gsd train --auto-select --select-epsilon's plan (its decline rule included)
        return dp_step(spec, task, seed, step, config(), cands)
    if step == "dp":
        eps_t, delta_t, delta_s = split_budget(spec.epsilon, spec.delta, spec.select_epsilon)
        dec, selection = dp_advised_selection(task.train, cands, "auto", settings=config(eps_t, delta_t), epsilon=spec.select_epsilon,
                                              delta=delta_s, private_test=task.test, seed=seed, device="cpu", insecure_seed=seed)
        return {"decision": dec.to_dict(), "selection": selection, "training": {"epsilon": eps_t, "delta": delta_t}}
    raise SystemExit(f"round {spec.round}: unknown step {step!r} (rank, advised, advised-native, probe, dp)")


def dp_step(spec: Round, task: Task, seed: int, name: str, config, cands: list[str]) -> dict:
    """A DP advice step of ``spec.dp`` (``select_epsilon``, ``fallback``): :func:`gsd_cli.advice.select.dp_plan` at
    the round's total, as ``gsd train --auto-select --select-epsilon`` runs it (where the advice declines to spend,
    nothing is read and the training gets the whole total); the plan's training, decision and selection record."""
    from gsd_cli.advice.select import dp_plan

    d = spec.dp[name]
    cfg = replace(config, method="auto", seed=seed, insecure_seed=seed)
    plan = dp_plan(cfg, task.train, cands, select_epsilon=d["select_epsilon"], total=(spec.epsilon, spec.delta),
                   fallback=d.get("fallback", True), private_test=task.test, device="cpu")
    if plan is None or plan.error:
        raise SystemExit(f"{task.name} seed {seed}: the DP advice refused ({None if plan is None else plan.error})")
    c = plan.config
    return {"decision": plan.decision.to_dict(), "selection": plan.selection, "warning": plan.warning,
            "training": {"method": c.method, "public": c.public, "from_base": c.weights is not None, "epsilon": c.epsilon,
                         "delta": c.delta}}


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
    if a.get("decider") == "dp" and (name := a.get("step", "dp")) in (spec.dp or {}):
        t = step(spec, res.steps_dir, task, seed, name)["training"]
        m = spec.method_of(t["method"], t["from_base"])
        return {"method": m, "public": t["public"] if m not in spec.no_candidate else None, "epsilon": t["epsilon"],
                "delta": t["delta"]}
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
    if spec.bases:  # a from-base round: gsd's decision names gsd's method, trained from the task's base
        m = spec.method_of(m, task.base is not None)
    return {"method": m, "public": p}


def run_cell(spec: Round, res: Results, runs: dict, task: Task, seed: int) -> None:
    hp = tuned(spec, task.size)
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
            d = {"task": task.name, "seed": seed, "arm": arm, **d, "commit": gsd_commit(),
                     **({"bases": dict(BASE_SHA)} if BASE_SHA else {})}
            append_line(res.decisions_file, d)
            res.decisions[(task.name, arm, seed)] = d
        if "epsilon" in d:
            s = settings(spec, task, d["method"], hp[d["method"]], d["epsilon"], d["delta"])
            train(res.runs_file, runs, task, d["method"], d["public"], seed, s)
            if spec.dp and d["epsilon"] < spec.epsilon:  # every no-candidate method at the training's own share too
                for m in spec.no_candidate:
                    train(res.runs_file, runs, task, m, None, seed, settings(spec, task, m, hp[m], d["epsilon"], d["delta"]))


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


# -- data --------------------------------------------------------------------------------------------------------


def prepare(n: int, force: bool = False) -> dict:
    """The round's npz files (missing ones; every one with ``force``) and its bases (:func:`build_bases`):
    {name: examples}."""
    spec = load(n)
    counts = data(spec).build(force=force)
    if spec.bases:
        build_bases(spec)
    return counts


def build_bases(spec: Round) -> None:
    """The round's missing bases (:func:`gsd_cli.train.pretrain.pretrain_base`), each from its public sets; every
    private set of the round's tasks and tuning tasks is named as private, so a base that would see one is refused.
    The sets are registered without :func:`ready`'s check of the bases (a lost base is built again here; ``ready``
    then checks it against the frozen hash)."""
    from gsd_cli.train.pretrain import pretrain_base

    from ..npz_sets import register_npz

    mod = data(spec)
    register_npz(mod.NAMES, mod.data_dir(), f"python -m benchmarks validity --round {spec.round} prepare")
    for r in {spec.tuning["round"], *spec.data_rounds} - {spec.round}:
        ready(r)
    tasks = [*spec.tasks.values(), *tuning_tasks(spec)]
    private = sorted({t.train.rsplit("~", 1)[0] for t in tasks} | {t.test for t in tasks})
    _threads()
    for name, b in spec.bases.items():
        def build(folder, b=b):
            pretrain_base(list(b["public"]), folder, model=b["model"], private=private, epochs=b["epochs"], device="cpu")

        t0 = time.perf_counter()
        how = place_base(base_dir(spec, name), kept_base(spec, name), build)
        print(f"{name}: {how} ({time.perf_counter() - t0:.0f} s)", flush=True)


def place_base(folder: Path, kept: Path, build) -> str:
    """A base in ``folder``: there already, else copied from its committed copy ``kept``, else ``build(folder)`` and
    copied to ``kept`` (to commit). Says which."""
    if (folder / "card.json").is_file():
        return "present"
    folder.parent.mkdir(parents=True, exist_ok=True)
    if (kept / "weights.safetensors").is_file():  # a lost cache does not rebuild (and change) the round's base
        shutil.copytree(kept, folder)
        return f"restored from {kept}"
    build(folder)
    shutil.copytree(folder, kept)
    return f"built; its copy in {kept} is to be committed"


def kept_base(spec: Round, name: str) -> Path:
    """The committed copy of a round's base ``name`` (its weights and card, beside the round's results; a small CNN's
    are about 160 kB): a base is a float computation that another CPU does not reproduce bit for bit, so the run
    reads the copy the round froze or recorded, not a rebuild."""
    return spec.results_dir / "bases" / name


def other_files(spec: Round) -> dict[str, Path]:
    """The npz files of the earlier rounds' sets this round uses (candidates, tuning tasks, bases' public sets)."""
    used = {c for t in spec.tasks.values() for c in t.candidates}
    used |= {x for t in tuning_tasks(spec) for x in (t.train.rsplit("~", 1)[0], t.test)}
    used |= {e["candidate"] for e in spec.tuning["tasks"] if isinstance(e, dict)}
    used |= {x for b in (spec.bases or {}).values() for x in b["public"]}
    out = {}
    for r in spec.data_rounds:
        mod = data(load(r))
        out.update({x: mod.data_dir() / f"{x}.npz" for x in mod.NAMES if x in used})
    return out


def freeze(n: int) -> dict:
    """Write the round's frozen file (refused when it exists): the spec, the SHA-256 of every npz file (the round's and
    the earlier rounds' sets it uses), of every base's weights, and the gsd commit under test. Commit it before the
    round's first run."""
    spec = load(n)
    if spec.frozen_path.is_file():
        raise SystemExit(f"{spec.frozen_path} exists: round {n} is frozen")
    mod = data(spec)
    missing = [x for x in mod.NAMES if not (mod.data_dir() / f"{x}.npz").is_file()]
    missing += [f"base {b}" for b in spec.bases or {} if not (base_dir(spec, b) / "weights.safetensors").is_file()]
    if missing:
        raise SystemExit(f"missing {missing[:3]}...: python -m benchmarks validity --round {n} prepare")
    sha = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()  # noqa: E731
    doc = {"spec": json.loads(spec.path.read_text()), "gsd_cli_commit": gsd_commit(),
           "data_sha256": {x: sha(mod.data_dir() / f"{x}.npz") for x in mod.NAMES},
           "note": f"written by python -m benchmarks validity --round {n} freeze before any run; the commit that froze it: "
                   f"git log --diff-filter=A -- {spec.frozen_path.name}"}
    if spec.data_rounds:
        doc["other_sha256"] = {x: sha(p) for x, p in sorted(other_files(spec).items())}
    if spec.bases:
        doc["bases_sha256"] = {b: sha(base_dir(spec, b) / "weights.safetensors") for b in spec.bases}
        doc["bases_card"] = {b: json.loads((base_dir(spec, b) / "card.json").read_text()) for b in spec.bases}
    save_json(spec.frozen_path, doc)
    return doc
