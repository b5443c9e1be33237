"""Issue 61's pilot: where public data pays (a pilot on seen tasks, never a held-out claim). What it runs is declared
in ``plan61.json`` beside this file (tasks, bases, arms, the tuning grid, sizes, epsilons, seeds, metrics, targets),
committed before the first result; every result is appended to ``benchmarks/results/pilot61/runs.jsonl`` as soon as it
exists, keyed by its settings, so that a stopped run resumes where it stopped.

    python -m benchmarks validity --round 1 prepare; python -m benchmarks validity --round 6 prepare   # the data
    python -m benchmarks validity.pilot.run61 base              # the two bases (gsd pretrain, public data only)
    python -m benchmarks validity.pilot.run61 tune [--part I/N] # the from-base grid, then tuned.json
    python -m benchmarks validity.pilot.run61 run [--part I/N]  # every arm, size, epsilon and seed
    python -m benchmarks validity.pilot.run61 table             # the tables (from the results alone)
    python -m benchmarks validity.pilot.run61 tune2 | tuned2 | run2 | table2   # pass 2 (plan61b.json), the same way
    python -m benchmarks validity.pilot.run61 tune3 | tuned3                    # pass 3 (plan61c.json): the second
                                                                                 # phase from scratch, re-tuned

Each training goes through gsd's library (:func:`gsd_cli.train.train`) with its private randomness from
``insecure_seed`` (reproducible, not DP); the ledger is the benchmark's own (in the data folder). ``--part I/N`` runs
every N-th job from the I-th: N processes in parallel share the results file (each line is appended whole).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLAN = HERE / "plan61.json"
PLAN2 = HERE / "plan61b.json"
OUT = HERE.parents[1] / "results" / "pilot61"
RUNS = OUT / "runs.jsonl"
TUNED = OUT / "tuned.json"
TUNED2 = OUT / "tuned2.json"


def plan() -> dict:
    return json.loads(PLAN.read_text())


def base_dir() -> Path:
    return Path(os.environ.get("GSD_BENCH_DATA", Path.home() / ".cache" / "gsd-bench")) / "pilot61"


# -- data ---------------------------------------------------------------------------------------------------------


def ready() -> dict:
    """Every set of the pilot's data rounds resolvable by name, and each task's seeded subsets (``<train>~<n>``: the
    held-out runner's rule, :func:`benchmarks.validity.heldout.spec.subset_indices`)."""
    from ..heldout.run import ready as round_ready
    from ..heldout.run import register_subset

    p = plan()
    for r in p["data_rounds"]:
        round_ready(r)
    os.environ["GSD_LEDGER"] = str(base_dir() / "ledger.sqlite")
    base_dir().mkdir(parents=True, exist_ok=True)
    for task in p["tasks"].values():
        for n in p["sizes"]:
            register_subset(f"{task['train']}~{n}", n)
    return p


def build_bases() -> dict:
    """The plan's bases (:func:`gsd_cli.train.pretrain.pretrain_base`), each built once; every task's private sets are
    named as private, so a base that saw one is refused."""
    from gsd_cli.train.pretrain import pretrain_base

    p = ready()
    privates = [t[k] for t in p["tasks"].values() for k in ("train", "test")]
    out = {}
    for name, b in p["bases"].items():
        folder = base_dir() / name
        if not (folder / "card.json").is_file():
            t0 = time.perf_counter()
            pretrain_base(b["public"], folder, model=b["model"], private=privates, epochs=b["epochs"], device="cpu")
            print(f"{name}: built in {time.perf_counter() - t0:.0f} s", flush=True)
        card = json.loads((folder / "card.json").read_text())
        out[name] = {"best_epoch": card["training"]["best_epoch"], "sets": [s["name"] for s in card["sets"]]}
    return out


# -- trainings ------------------------------------------------------------------------------------------------------


def read_jsonl(path: Path, key) -> dict:
    """The records of a results file (one JSON object a line; appended whole by parallel parts), by ``key(record)``;
    a key written twice keeps its last record."""
    if not path.is_file():
        return {}
    return {key(r): r for r in (json.loads(line) for line in path.read_text().splitlines() if line.strip())}


def read_runs() -> dict:
    return read_jsonl(RUNS, lambda r: r["key"])


def key(job: dict) -> str:
    return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:20]


def fit(job: dict) -> dict:
    """One training through gsd's library; its record. ``job["private"]`` (default ``<train>~<size>``) and
    ``job["delta"]`` (default the plan's) for issue 62's price curve; ``size`` is the declared size either way."""
    from gsd_cli.train import TrainConfig
    from gsd_cli.train import train as gsd_train
    from gsd_cli.train.tuned import training_settings

    p = plan()
    task = p["tasks"].get(job["task"], {"train": None, "test": None, "model": None, "base": ""})  # pass 3: the job names them
    arm, n = job["arm"], job["size"]
    from_base = arm not in ("dpsgd", "sp-scratch")
    method = {"dpsgd": "dpsgd", "ft-base": "dpsgd", "sp-base": "second-phase", "gep-base": "gep", "sp-scratch": "second-phase"}[arm]
    hp = {"lr": job.get("lr"), "epochs": job.get("epochs")}
    s = training_settings(job.get("model") or task["model"], "dpsgd", expected_size=n, lr=None, epochs=hp["epochs"], batch_size=None)
    if hp["lr"] is not None:  # the grid's rates are at batch 500: scaled with the batch as gsd train's defaults
        s["lr"] = hp["lr"] * s["batch_size"] / 500
    peft = job.get("peft")
    cfg = TrainConfig(private=job.get("private") or f"{task['train']}~{n}", private_test=job.get("test") or task["test"],
                      public=job.get("public"), method=method, model=job.get("model") or task["model"], seed=job["seed"], insecure_seed=job["seed"], epsilon=job["epsilon"],
                      delta=job.get("delta", p["delta"]), expected_size=n, lr=s["lr"], epochs=s["epochs"], batch_size=s["batch_size"],
                      weights=str(base_dir() / task["base"]) if from_base else None,
                      peft=None if peft in (None, "all") else peft)
    t0 = time.perf_counter()
    stage1 = None
    with tempfile.TemporaryDirectory() as tmp:
        summ = gsd_train(cfg, os.path.join(tmp, "run"), device="cpu")
        s1 = Path(tmp) / "run" / "stage1.json"
        if s1.is_file():  # what stage 1 chose (public data only)
            c = (json.loads(s1.read_text()).get("record") or {}).get("search") or {}
            stage1 = {k: c.get(k) for k in ("lr", "lrs", "best_epoch", "epochs_run", "val_acc")}
    from ..heldout.results import gsd_commit

    return {**job, "accuracy": summ["test"]["accuracy"], "epsilon_spent": summ["epsilon"], "stage1": stage1, "commit": gsd_commit(),
            "settings": {"lr": s["lr"], "epochs": s["epochs"], "batch_size": s["batch_size"]},
            "seconds": round(time.perf_counter() - t0, 2), "loadavg": [round(x, 2) for x in os.getloadavg()]}


def do(jobs: list[dict], part: tuple[int, int]) -> None:
    ready()
    OUT.mkdir(parents=True, exist_ok=True)
    i, n = part
    mine = [j for k, j in enumerate(jobs) if k % n == i - 1]
    for job in mine:
        k = key(job)
        if k in read_runs():
            continue
        rec = {"key": k, **fit(job)}
        with open(RUNS, "a") as f:  # one whole line per write: parallel parts share the file
            f.write(json.dumps(rec) + "\n")
        print(f"  {job['task']} {job['arm']} {job.get('public') or '-'} n={job['size']} eps={job['epsilon']:g} "
              f"seed {job['seed']}: {100 * rec['accuracy']:.1f}% ({rec['seconds']:.0f} s)", flush=True)


def tune_jobs() -> list[dict]:
    t = plan()["tuning"]
    g = t["grid"]
    return [{"task": task, "arm": "ft-base", "size": t["size"], "epsilon": t["epsilon"], "seed": seed, "lr": lr, "epochs": ep,
             "peft": pf} for task in t["tasks"] for seed in t["seeds"] for pf in g["peft"] for ep in g["epochs"] for lr in g["lr"]]


def tuned(second: bool = False) -> dict:
    """The from-base point: the grid point of best mean accuracy over the tuning tasks and seeds (the first on a tie),
    overall and per PEFT choice; written to tuned.json (pass 2: tuned2.json) once every grid run exists."""
    runs = read_runs()
    jobs = tune2_jobs() if second else tune_jobs()
    t = (json.loads(PLAN2.read_text()) if second else plan())["tuning"]
    missing = [j for j in jobs if key(j) not in runs]
    if missing:
        raise SystemExit(f"{len(missing)} of {len(jobs)} tuning runs missing: python -m benchmarks validity.pilot.run61 tune")
    by = {}
    for j in jobs:
        by.setdefault((j["peft"], j["lr"], j["epochs"]), []).append(runs[key(j)]["accuracy"])
    means = {k: statistics.fmean(v) for k, v in by.items()}
    best = max(means, key=lambda k: means[k])
    per_peft = {pf: max((k for k in means if k[0] == pf), key=lambda k: means[k]) for pf in t["grid"]["peft"]}
    corner = best[1] in (min(t["grid"]["lr"]), max(t["grid"]["lr"])) or best[2] in (min(t["grid"]["epochs"]), max(t["grid"]["epochs"]))
    out = {"point": {"peft": best[0], "lr": best[1], "epochs": best[2], "mean_accuracy": round(means[best], 4)},
           "per_peft": {pf: {"lr": k[1], "epochs": k[2], "mean_accuracy": round(means[k], 4)} for pf, k in per_peft.items()},
           "grid": [{"peft": k[0], "lr": k[1], "epochs": k[2], "mean_accuracy": round(v, 4)} for k, v in means.items()],
           "corner": corner, "rule": t["rule"]}
    (TUNED2 if second else TUNED).write_text(json.dumps(out, indent=1) + "\n")
    return out


def tune2_jobs() -> list[dict]:
    """Pass 2's grid: the second phase from the base with each tuning task's first candidate (plan61b.json)."""
    t = json.loads(PLAN2.read_text())["tuning"]
    g, tasks = t["grid"], plan()["tasks"]
    return [{"task": task, "arm": "sp-base", "pass": 2, "public": next(iter(tasks[task]["candidates"])), "size": t["size"],
             "epsilon": t["epsilon"], "seed": seed, "lr": lr, "epochs": ep, "peft": pf}
            for task in t["tasks"] for seed in t["seeds"] for pf in g["peft"] for ep in g["epochs"] for lr in g["lr"]]


PLAN3 = HERE / "plan61c.json"
TUNED3 = OUT / "tuned3.json"


def tune3_jobs() -> list[dict]:
    """Pass 3's grid (plan61c.json): the second phase from scratch on the selection tasks' whole private sets."""
    from ..heldout.run import size

    t = json.loads(PLAN3.read_text())["tuning"]
    return [{"task": task, "arm": "sp-scratch", "pass": 3, "public": pub, "private": f"{task}-train", "test": f"{task}-test",
             "model": t["models"][task], "size": size(f"{task}-train"), "epsilon": t["epsilon"], "seed": seed, "lr": lr,
             "epochs": ep, "peft": "all"}
            for task, pub in t["tasks"].items() for seed in t["seeds"] for ep in t["grid"]["epochs"] for lr in t["grid"]["lr"]]


def tuned3() -> dict:
    ready()
    runs, jobs = read_runs(), tune3_jobs()
    missing = [j for j in jobs if key(j) not in runs]
    if missing:
        raise SystemExit(f"{len(missing)} of {len(jobs)} pass-3 runs missing: python -m benchmarks validity.pilot.run61 tune3")
    by = {}
    for j in jobs:
        by.setdefault((j["lr"], j["epochs"]), []).append(runs[key(j)]["accuracy"])
    means = {k: statistics.fmean(v) for k, v in by.items()}
    per_task = {}
    for j in jobs:
        per_task.setdefault(f"{j['task']} lr {j['lr']} x {j['epochs']}", []).append(runs[key(j)]["accuracy"])
    best = max(means, key=lambda k: means[k])
    out = {"point": {"lr": best[0], "epochs": best[1], "mean_accuracy": round(means[best], 4)},
           "grid": [{"lr": k[0], "epochs": k[1], "mean_accuracy": round(v, 4)} for k, v in means.items()],
           "per_task": {k: round(statistics.fmean(v), 4) for k, v in per_task.items()},
           "rule": json.loads(PLAN3.read_text())["tuning"]["rule"]}
    TUNED3.write_text(json.dumps(out, indent=1) + "\n")
    return out


def run2_jobs() -> list[dict]:
    """Pass 2's trainings: the second phase from the base with every candidate at pass 2's tuned point."""
    if not TUNED2.is_file():
        raise SystemExit(f"no {TUNED2}: python -m benchmarks validity.pilot.run61 tune2, then tuned2")
    pt = json.loads(TUNED2.read_text())["point"]
    p = plan()
    return [{"task": name, "size": n, "epsilon": eps, "seed": seed, "arm": "sp-base", "pass": 2, "public": c, "lr": pt["lr"],
             "epochs": pt["epochs"], "peft": pt["peft"]}
            for eps in sorted(p["epsilons"], key=lambda e: (e != 2, e)) for n in p["sizes"] for seed in p["seeds"]
            for name, task in p["tasks"].items() for c in task["candidates"]]


def run_jobs() -> list[dict]:
    p = plan()
    pt = json.loads(TUNED.read_text())["point"] if TUNED.is_file() else None
    if pt is None:
        raise SystemExit(f"no {TUNED}: python -m benchmarks validity.pilot.run61 tune first")
    fb = {"lr": pt["lr"], "epochs": pt["epochs"], "peft": pt["peft"]}
    jobs = []
    # epsilon 2 first (the targets' regime), then 1 and 8; the small size first within each
    for eps in sorted(p["epsilons"], key=lambda e: (e != 2, e)):
        for n in p["sizes"]:
            for seed in p["seeds"]:
                for name, task in p["tasks"].items():
                    cell = {"task": name, "size": n, "epsilon": eps, "seed": seed}
                    jobs.append({**cell, "arm": "dpsgd"})
                    jobs.append({**cell, "arm": "ft-base", **fb})
                    for c in task["candidates"]:
                        jobs.append({**cell, "arm": "sp-base", "public": c, **fb})
                    first = next(iter(task["candidates"]))
                    jobs.append({**cell, "arm": "gep-base", "public": first, **fb})
    return jobs


# -- tables ---------------------------------------------------------------------------------------------------------


def table(second: bool = False) -> str:
    """Per regime (size, epsilon): each task's no-candidate arms, the candidate arms, the oracle's gain (in-sample and
    leave-one-seed-out), the related candidate's gain and the worst harm; from the results alone. Pass 2
    (``second``): pass 1's trainings with its sp-base arms replaced by pass 2's."""
    p = plan()
    runs = read_runs()
    jobs = run_jobs()
    if second:
        jobs = [j for j in jobs if j["arm"] != "sp-base"] + run2_jobs()
    have = [runs[key(j)] for j in jobs if key(j) in runs]
    label = json.loads(PLAN2.read_text())["label"] if second else p["label"]
    lines = [f"# {label}", "", f"{len(have)} of {len(jobs)} trainings done.", ""]
    if second and TUNED2.is_file():
        t = json.loads(TUNED2.read_text())
        lines += [f"Second phase's point (pass 2, tuned on {', '.join(json.loads(PLAN2.read_text())['tuning']['tasks'])} with their first "
                  f"candidate): lr {t['point']['lr']} at batch 500, {t['point']['epochs']} epochs (mean {100 * t['point']['mean_accuracy']:.1f}%)"
                  + (", a corner of its grid" if t.get("corner") else ""), ""]
    if TUNED.is_file():
        t = json.loads(TUNED.read_text())
        lines.append(f"From-base point (tuned on {', '.join(p['tuning']['tasks'])}): peft {t['point']['peft']}, lr {t['point']['lr']} "
                     f"at batch 500, {t['point']['epochs']} epochs (mean {100 * t['point']['mean_accuracy']:.1f}%); per PEFT: "
                     + "; ".join(f"{k} lr {v['lr']} x {v['epochs']} ep ({100 * v['mean_accuracy']:.1f}%)" for k, v in t["per_peft"].items()))
        lines.append("")
    acc: dict = {}
    for r in have:
        arm = r["arm"] if r.get("public") is None else f"{r['arm']}:{r['public']}"
        acc.setdefault((r["size"], r["epsilon"], r["task"]), {}).setdefault(arm, {})[r["seed"]] = 100 * r["accuracy"]
    summary = []
    for n in p["sizes"]:
        for eps in p["epsilons"]:
            cells = {t: acc.get((n, eps, t)) for t in p["tasks"]}
            if not any(cells.values()):
                continue
            lines += [f"## {n} private examples, epsilon {eps:g}", "",
                      "| task | DP-SGD scratch | FT base | best candidate arm | oracle gain | oracle gain (LOSO) | related (sp-base) | worst harm |",
                      "|---|---:|---:|---|---:|---:|---:|---:|"]
            for t, arms in cells.items():
                if not arms:
                    continue
                complete = {a: v for a, v in arms.items() if len(v) == len(p["seeds"])}
                mean = {a: statistics.fmean(v.values()) for a, v in complete.items()}
                none = {a: m for a, m in mean.items() if a in ("dpsgd", "ft-base")}
                cand = {a: m for a, m in mean.items() if a not in none}
                if len(none) < 2 or not cand:
                    lines.append(f"| {t} | (incomplete) | | | | | | |")
                    continue
                base = max(none.values())
                best = max(cand, key=lambda a: cand[a])
                related = f"sp-base:{next(iter(p['tasks'][t]['candidates']))}"
                loso = []
                for s in p["seeds"]:
                    others = {a: statistics.fmean(v[o] for o in v if o != s) for a, v in complete.items()}
                    ch_none = max((a for a in others if a in none), key=lambda a: others[a])
                    ch_c = max((a for a in others if a not in none), key=lambda a: others[a])
                    loso.append(complete[ch_c][s] - complete[ch_none][s])
                gain, lgain = cand[best] - base, statistics.fmean(loso)
                harm = min(cand.values()) - base
                rel = cand.get(related, float("nan")) - base
                summary.append({"size": n, "epsilon": eps, "task": t, "oracle": gain, "loso": lgain, "related": rel, "harm": harm,
                                "ft_over_scratch": mean["ft-base"] - mean["dpsgd"]})
                lines.append(f"| {t} | {mean['dpsgd']:.1f} | {mean['ft-base']:.1f} | {best} {cand[best]:.1f} | {gain:+.1f} | {lgain:+.1f} | "
                             f"{rel:+.1f} | {harm:+.1f} |")
            lines.append("")
    if summary:
        lines += ["## By regime", "", "| size | epsilon | tasks | FT base over scratch (mean) | oracle gain (mean) | LOSO (mean) | "
                  "tasks with oracle >= +3 | related (mean) | worst harm (mean) |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for n in p["sizes"]:
            for eps in p["epsilons"]:
                rows = [s for s in summary if s["size"] == n and s["epsilon"] == eps]
                if rows:
                    f = lambda k: statistics.fmean(r[k] for r in rows)  # noqa: E731
                    lines.append(f"| {n} | {eps:g} | {len(rows)} | {f('ft_over_scratch'):+.1f} | {f('oracle'):+.1f} | {f('loso'):+.1f} | "
                                 f"{sum(r['oracle'] >= 3 for r in rows)}/{len(rows)} | {f('related'):+.1f} | {f('harm'):+.1f} |")
        lines.append("")
    suffix = "2" if second else ""
    if OUT.is_dir():
        (OUT / f"tables{suffix}.md").write_text("\n".join(lines) + "\n")
        (OUT / f"summary{suffix}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return "\n".join(lines)


def _part(text: str) -> tuple[int, int]:
    i, n = (int(x) for x in text.split("/"))
    return i, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks validity.pilot.run61", description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["base", "tune", "tuned", "run", "table", "tune2", "tuned2", "run2", "table2", "tune3", "tuned3"])
    ap.add_argument("--part", type=_part, default=(1, 1), help="I/N: every N-th job from the I-th")
    a = ap.parse_args(argv)
    jobs = {"tune": tune_jobs, "run": run_jobs, "tune2": tune2_jobs, "run2": run2_jobs, "tune3": tune3_jobs}
    shown = {"base": build_bases, "tuned": tuned, "tuned2": lambda: tuned(second=True), "tuned3": tuned3}
    if a.cmd in jobs:
        do(jobs[a.cmd](), a.part)
    elif a.cmd in shown:
        print(json.dumps(shown[a.cmd](), indent=1))
    else:
        print(table(second=a.cmd == "table2"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
