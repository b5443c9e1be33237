"""Issue 62's price curve (``plan62.json`` beside this file, committed before its first run): the DP advice's gain
against its selection's price, in issue 61's pilot regime (from a base; 500 and 2,000 private examples; total epsilon 2).

    python -m benchmarks validity.pilot.price62 run [--part I/N]   # every design, cell and the trainings they name
    python -m benchmarks validity.pilot.price62 table              # the curve (from the results alone)
    python -m benchmarks validity.pilot.price62 plot               # docs/images/price62.png, the curve
    python -m benchmarks validity.pilot.price62 table --update-package   # and gsd_cli/report/price62.json, which
                                                                          # gsd_cli.advice.decline reads

Each cell (task, size, seed) and design: the DP feature probe (:func:`gsd_cli.advice.select.dp_advised_selection`, its
private draws from ``insecure_seed`` = the seed: reproducible, not DP) decides, then the training it names runs through
:func:`run61.fit` at the design's training budget (a training of issue 61's pilot where the same, read from its results).
Decisions go to ``benchmarks/results/pilot61/price62.jsonl``, trainings to the pilot's ``runs.jsonl``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time

from . import run61
from .run61 import OUT, PLAN2, key, plan, read_runs

PLAN62 = run61.HERE / "plan62.json"
DECISIONS = OUT / "price62.jsonl"


def plan62() -> dict:
    return json.loads(PLAN62.read_text())


def held_aside(n_total: int, fraction: float, seed: int):
    """Per example of a task's private set (by its index): held aside for the probe with probability ``fraction``, by a
    keyed hash of that index alone (the key from ``seed``): adding or removing another example moves none."""
    import numpy as np

    h = [int.from_bytes(hashlib.sha256(f"gsd-62:{seed}:{i}".encode()).digest()[:8], "big") / 2**64 for i in range(n_total)]
    return np.asarray(h) < fraction


def ready() -> dict:
    """The pilot's sets, and each cell's two parts for the parallel designs (``<train>~<n>|probe-<f>-<seed>``, ``|rest-...``)."""
    from gsd_cli.data import register_dataset, resolve
    from gsd_cli.data.splits import SubsetSource

    p = run61.ready()
    for d in plan62()["designs"].values():
        if d["composition"] != "parallel":
            continue
        for task in p["tasks"].values():
            for n in p["sizes"]:
                for seed in p["seeds"]:
                    for part in ("probe", "rest"):
                        name = f"{task['train']}~{n}|{part}-{d['examples']}-{seed}"

                        def make(base=f"{task['train']}~{n}", f=d["examples"], seed=seed, part=part, name=name):
                            src = resolve(base)
                            aside = held_aside(len(src.parent), f, seed)[src.indices]
                            keep = aside if part == "probe" else ~aside
                            return SubsetSource(src, [i for i in range(len(src)) if keep[i]], name)
                        register_dataset(name, make)
    return p


def read_decisions() -> dict:
    return run61.read_jsonl(DECISIONS, lambda r: (r["task"], r["size"], r["seed"], r["design"]))


def training_job(task: str, n: int, seed: int, eps: float, chosen: str | None, private: str | None = None,
                 delta: float | None = None) -> dict:
    """The pilot's job for the training a decision names: ft-base (the base alone) or the second phase with ``chosen``."""
    if chosen is None:
        t = json.loads(run61.TUNED.read_text())["point"]
        job = {"task": task, "size": n, "epsilon": eps, "seed": seed, "arm": "ft-base", "lr": t["lr"], "epochs": t["epochs"], "peft": t["peft"]}
    else:
        t = json.loads(run61.TUNED2.read_text())["point"]
        job = {"task": task, "size": n, "epsilon": eps, "seed": seed, "arm": "sp-base", "pass": 2, "public": chosen, "lr": t["lr"],
               "epochs": t["epochs"], "peft": t["peft"]}
    if private is not None:
        job["private"] = private
    if delta is not None:
        job["delta"] = delta
    return job


def decide(task: str, n: int, seed: int, design: str, d: dict) -> dict:
    """The DP feature probe's decision in one cell and design, and the training it names."""
    from gsd_cli.advice.dp_probe import split_budget
    from gsd_cli.advice.select import dp_advised_selection
    from gsd_cli.train import TrainConfig

    p = plan()
    t = p["tasks"][task]
    total, delta = 2.0, p["delta"]
    cands = list(t["candidates"])
    private, train_private, train_delta = f"{t['train']}~{n}", None, None
    if d["composition"] == "basic":
        sel_eps = d["share"] * total
        eps_t, delta_t, delta_s = split_budget(total, delta, sel_eps)
        train_delta = delta_t
    else:  # parallel composition: the probe on the held-aside part at the full budget, the training on the rest
        sel_eps, eps_t, delta_s = total, total, 0.1 * delta
        private = f"{private}|probe-{d['examples']}-{seed}"
        train_private = f"{t['train']}~{n}|rest-{d['examples']}-{seed}"
    base = str(run61.base_dir() / t["base"])
    settings = TrainConfig(private=private, private_test=t["test"], public=cands[0], method="second-phase", model=t["model"],
                           weights=base, seed=seed, insecure_seed=seed, epsilon=eps_t, delta=delta)
    t0 = time.perf_counter()
    dec, record = dp_advised_selection(private, cands, "auto", settings=settings, epsilon=sel_eps, delta=delta_s,
                                       private_test=t["test"], seed=seed, device="cpu", insecure_seed=seed)
    chosen = dec.public if dec.method == "second-phase" else None
    size = n if train_private is None else round((1 - d["examples"]) * n)
    job = training_job(task, size, seed, eps_t, chosen, private=train_private, delta=train_delta)
    return {"task": task, "size": n, "seed": seed, "design": design, "chosen": chosen, "select_epsilon": sel_eps,
            "train_epsilon": eps_t, "train_job": job, "message": dec.message, "seconds": round(time.perf_counter() - t0, 1),
            "commit": run61_commit()}


def run61_commit() -> str:
    from ..heldout.results import gsd_commit

    return gsd_commit()


def cells() -> list[tuple]:
    p = plan()
    return [(task, n, seed, name, d) for n in p["sizes"] for seed in p["seeds"] for task in p["tasks"]
            for name, d in plan62()["designs"].items()]


def run(part: tuple[int, int]) -> None:
    ready()
    i, n_parts = part
    for k, (task, n, seed, name, d) in enumerate(cells()):
        if k % n_parts != i - 1:
            continue
        rec = read_decisions().get((task, n, seed, name))
        if rec is None:
            rec = decide(task, n, seed, name, d)
            with open(DECISIONS, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"  {task} n={n} seed {seed} {name}: {rec['chosen'] or 'the base alone'}", flush=True)
        run61.do([rec["train_job"]], (1, 1))
        # the baselines of the curve: ft-base at the training's epsilon on the training's examples, and at 2 on all
        run61.do([training_job(task, rec["train_job"]["size"], seed, rec["train_epsilon"], None,
                               private=rec["train_job"].get("private"), delta=rec["train_job"].get("delta")),
                  training_job(task, n, seed, 2.0, None)], (1, 1))


def table(update_package: bool = False) -> str:
    p, runs, decs = plan(), read_runs(), read_decisions()
    figures = {}
    lines = [f"# {plan62()['label']}", ""]
    oracle = {}
    s2 = OUT / "summary2.json"
    if s2.is_file():
        for r in json.loads(s2.read_text()):
            if r["epsilon"] == 2:
                oracle[(r["task"], r["size"])] = r["oracle"]
    rows = []
    for name, d in plan62()["designs"].items():
        gains, budget, chose = [], [], 0
        for (task, n, seed, design), rec in decs.items():
            if design != name:
                continue
            job = rec["train_job"]
            base_all = runs.get(key(training_job(task, n, seed, 2.0, None)))
            got = runs.get(key(job))
            base_t = runs.get(key(training_job(task, job["size"], seed, rec["train_epsilon"], None, private=job.get("private"),
                                               delta=job.get("delta"))))
            if not (base_all and got and base_t):
                continue
            gains.append(100 * (got["accuracy"] - base_all["accuracy"]))
            budget.append(100 * (base_t["accuracy"] - base_all["accuracy"]))
            chose += rec["chosen"] is not None
        if gains:
            g, b = statistics.fmean(gains), statistics.fmean(budget)
            figures[name] = {"gain": round(g, 3), "budget_part": round(b, 3), "cells": len(gains), "chose": chose,
                             "composition": d["composition"]}
            o = statistics.fmean(oracle.values()) if oracle else float("nan")
            rows.append(f"| {name} | {len(gains)} | {chose} | {g:+.2f} | {b:+.2f} | {g - b:+.2f} | {100 * g / o if o == o and o > 0 else float('nan'):.0f}% |")
    lines += ["| design | cells | chose a candidate | gain over ft-base at 2 | budget part | choice part | share of the oracle's gain |",
              "|---|---:|---:|---:|---:|---:|---:|", *rows, ""]
    if oracle:
        lines.append(f"Oracle (pass 2, in-sample, epsilon 2): mean {statistics.fmean(oracle.values()):+.2f} over {len(oracle)} task-size cells.")
    text = "\n".join(lines) + "\n"
    (OUT / "price62.md").write_text(text)
    if update_package:
        want = len(p["tasks"]) * len(p["sizes"]) * len(p["seeds"])
        short = [n for n in plan62()["designs"] if figures.get(n, {}).get("cells") != want]
        if short:
            raise SystemExit(f"designs {short} have fewer than {want} complete cells: run price62 run first")
        doc = {"source": "issue 62's price curve (benchmarks/results/pilot61/price62.md; a pilot on seen tasks)",
               "regime": {"model": "fmnist-cnn", "start": "base", "sizes": sorted(p["sizes"]), "epsilon": 2.0},
               # gsd train --select-epsilon runs the basic designs: it declines where none of them gained
               "designs": figures, "decline": all(f["gain"] <= 0 for f in figures.values() if f["composition"] == "basic"),
               "rule": plan62()["rule"]}
        path = run61.HERE.parents[2] / "gsd_cli" / "report" / "price62.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        text += f"wrote {path}\n"
    return text


def plot() -> str:
    """The curve as a figure: each design's mean gain (and its budget part) against the share of the budget it takes,
    the selection's epsilon share for basic composition, the share of examples held aside for parallel composition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads((run61.HERE.parents[2] / "gsd_cli" / "report" / "price62.json").read_text())
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for comp, marker, label in (("basic", "o", "basic composition: share of epsilon"), ("parallel", "s", "parallel: share of examples")):
        pts = sorted((plan62()["designs"][n].get("share", plan62()["designs"][n].get("examples")), f)
                     for n, f in doc["designs"].items() if f["composition"] == comp)
        x = [100 * a for a, _ in pts]
        ax.plot(x, [f["gain"] for _, f in pts], marker=marker, label=f"{label}: gain")
        ax.plot(x, [f["budget_part"] for _, f in pts], marker=marker, linestyle=":", alpha=0.6, label=f"{label}: budget part")
    ax.axhline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("the selection's share (%)")
    ax.set_ylabel("points over DP fine-tuning from the base")
    ax.set_title("DP advice at total epsilon 2, 500-2,000 private examples (20 cells)", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = run61.HERE.parents[2] / "docs" / "images" / "price62.png"
    fig.savefig(path, dpi=120)
    return f"wrote {path}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks validity.pilot.price62", description=__doc__.split("\n\n")[0])
    ap.add_argument("cmd", choices=["run", "table", "plot"])
    ap.add_argument("--part", type=run61._part, default=(1, 1))
    ap.add_argument("--update-package", action="store_true", help="table: also write gsd_cli/report/price62.json")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        run(a.part)
    elif a.cmd == "plot":
        print(plot())
    else:
        print(table(a.update_package))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
