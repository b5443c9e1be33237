"""Issue 33 item 3: which distance predicts which downstream method, on the large benchmark.

For each task of :mod:`.large` (the same candidates and the cached downstream truth), rankings with
variants of gsd's default (auto-select's: probe network at w0, k=16, 2,000 examples, random labels)
and with the non-private baselines ``gsd rank --metric`` offers, then Spearman's rho of each with the
mean accuracy over seeds of GEP and of the second phase with each candidate, at epsilon 2 and 8
(-1: the distance orders the candidates as the accuracy does, best first). One draw per variant and
task (public seed 0, private draw seed 0): cached in ``results/validity/large_variants/``.

    python -m benchmarks validity.variants_large            # rankings (cached), then the table
    python -m benchmarks validity.variants_large --table    # the table of the cached rankings
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from ..harness import add_json, write_json
from .large import EPSILONS, METHODS, TASKS, load_runs, register
from .large_score import RANK, distances
from .large_stats import _acc

OUT = Path(__file__).resolve().parents[1] / "results" / "validity" / "large_variants"
#: name -> options of gsd_cli.rank beside the task's private set and candidates
VARIANTS = {
    "default (probe, k=16, random labels)": dict(RANK),
    "own labels": dict(RANK, labels="own"),
    "k=4": dict(RANK, k=4),
    "k=64": dict(RANK, k=64),
    "fmnist-cnn at w0 (28x28)": dict(RANK, model="fmnist-cnn"),
    "baseline: frechet": dict(RANK, distance="frechet"),
    "baseline: logme": dict(RANK, distance="logme"),
    "baseline: task2vec": dict(RANK, distance="task2vec"),
}


def _file(task: str, name: str) -> Path:
    return OUT / f"{task}-{''.join(c if c.isalnum() else '_' for c in name)}.json"


def rank_variants(tasks=None, names=None) -> None:
    import torch

    from gsd_cli.ranking import rank

    torch.set_num_threads(1)
    register()
    for task in tasks or TASKS:
        for name in names or VARIANTS:
            f = _file(task, name)
            if f.is_file():
                continue
            if name.startswith("default"):  # the cached default ranking of large_score (seed 0)
                d = distances(task).get(0)
                if d is not None:
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text(json.dumps({"task": task, "variant": name, "options": VARIANTS[name], "distance": d}, indent=1) + "\n")
                    continue
            t0 = time.perf_counter()
            r = rank(TASKS[task][0], list(TASKS[task][2]), seed=0, insecure_seed=0, device="cpu", **VARIANTS[name])
            doc = {"task": task, "variant": name, "options": VARIANTS[name], "distance": {x.public: x.distance for x in r.results},
                   "seconds": round(time.perf_counter() - t0, 1), "loadavg": os.getloadavg()}
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"{task:10s} {name:40s} {doc['seconds']:6.1f} s", flush=True)


def spearman(d: dict, acc: dict) -> float | None:
    from scipy.stats import spearmanr

    names = [n for n in d if n in acc]
    if len(names) < 3:
        return None
    return float(spearmanr([d[n] for n in names], [acc[n] for n in names]).statistic)


def table() -> tuple[str, dict]:
    runs = load_runs()
    rows, doc = [], {}
    for name in VARIANTS:
        cells = {}
        for task in TASKS:
            f = _file(task, name)
            if not f.is_file():
                continue
            d = json.loads(f.read_text())["distance"]
            for method in METHODS:
                for eps in EPSILONS:
                    acc = {c: float(np.mean(list(v.values()))) for c, v in _acc(runs, task, method, eps).items() if c}
                    cells[(task, method, eps)] = spearman(d, acc)
        doc[name] = {f"{t}|{m}|{e:g}": v for (t, m, e), v in cells.items()}
        for method in METHODS:
            vals = [cells.get((t, method, e)) for t in TASKS for e in EPSILONS]
            shown = " | ".join("-" if v is None else f"{v:+.2f}" for v in vals)
            ok = [v for v in vals if v is not None]
            rows.append(f"| {name} | {method} | {shown} | {np.mean(ok):+.2f} |" if ok else f"| {name} | {method} | {shown} | - |")
    head = ("| distance | method | " + " | ".join(f"{t} e{e:g}" for t in TASKS for e in EPSILONS) + " | mean |\n|---|---|"
            + "---|" * (len(TASKS) * len(EPSILONS) + 1))
    return head + "\n" + "\n".join(rows), doc


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--tasks", nargs="+")
    add_json(ap, default=str(Path(__file__).resolve().parents[1] / "results" / "downstream_variants_cpu.json"))
    args = ap.parse_args(argv)
    if not args.table:
        rank_variants(args.tasks)
    text, doc = table()
    print(text)
    write_json(args.json, {"spearman": doc, "variants": {k: v for k, v in VARIANTS.items()}})


if __name__ == "__main__":
    main()
