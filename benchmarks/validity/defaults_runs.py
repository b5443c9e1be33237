"""The downstream benchmark at gsd's *own* training defaults (issue 33): what a user who runs
``gsd train`` without tuning gets. The grid of :mod:`.large` trains 3 epochs at batch 500 and lr 1
(a 2-core compromise, optimisation-limited: epsilon 8 is no better than 2 there); here every setting
the grid overrides is set back to :class:`gsd_cli.train.TrainConfig`'s default (20 epochs, batch 250,
SGD lr 0.1 with momentum 0.9; GEP k=100, S1=2, S2=1, 250 anchors every 2 steps; second phase 5 public
epochs at its default lr), for DP-SGD alone and for GEP and the second phase with each task's
same-distribution set (and, with ``--candidates all``, every candidate), cached as the grid's runs
are (their ``overrides`` name this variant, so :func:`.large.load_runs` leaves them out of the grid).

    cd benchmarks && OMP_NUM_THREADS=1 python -m validity.defaults_runs --seeds 0 1 2 [--epsilons 2]
    cd benchmarks && python -m validity.defaults_runs --table
    cd benchmarks && OMP_NUM_THREADS=1 python -m validity.defaults_runs --epochs10   # the grid at 10 epochs
"""

from __future__ import annotations

import argparse
import dataclasses
import sys


from .large import METHOD_SETTINGS, SETTINGS, TASKS, run_file, train_one
from .large_stats import _fmt, interval

VARIANT = "gsd-defaults"


def overrides(method: str) -> dict:
    """Every setting the grid sets for ``method``, back at TrainConfig's default (and a tag)."""
    from gsd_cli.train import TrainConfig

    d = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    keys = set(SETTINGS) | set(METHOD_SETTINGS[method])
    keys.discard("model")
    return {"variant": VARIANT, **{k: d[k] for k in sorted(keys)}}


def _clean(o: dict) -> dict:
    return {k: v for k, v in o.items() if k != "variant"}


def jobs(seeds, epsilons, candidates: str) -> list[tuple]:
    out = []
    for seed in seeds:
        for eps in epsilons:
            for task, (_, _, cands) in TASKS.items():
                out.append((task, "dpsgd", None, eps, seed))
                for c in (cands if candidates == "all" else cands[:1]):
                    out += [(task, "gep", c, eps, seed), (task, "second-phase", c, eps, seed)]
    return out


def run(seeds, epsilons, candidates: str, ov=overrides) -> None:
    import torch

    torch.set_num_threads(1)
    import os

    todo = jobs(seeds, epsilons, candidates)
    for i, (task, method, cand, eps, seed) in enumerate(todo, 1):
        f = run_file(task, method, cand, eps, seed, ov(method))
        lock = f.with_suffix(".lock")
        if not f.is_file():  # processes on the same list share it: each claims a job by its lock file
            f.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
        try:
            d = train_one(task, method, cand, eps, seed, ov(method))
        finally:
            lock.unlink(missing_ok=True)
        print(f"[{i}/{len(todo)}] {task} {method} {cand} eps {eps:g} seed {seed}: {100 * d['accuracy']:.1f}% ({d['seconds']} s)", flush=True)


#: the grid's settings at 10 epochs instead of 3 (the same batch 500 and lr 1: 3.3x the private steps at the
#: same budget, so more noise per step), a probe of the noise-limited regime
EPOCHS10 = {"epochs": 10}


def table(seeds, epsilons, ov=overrides) -> str:
    import json

    lines = ["| task (epsilon) | DP-SGD alone | GEP with the same-distribution set | gain | second phase with it | gain |",
             "|---|---|---|---|---|---|"]
    for eps in epsilons:
        for task, (_, _, cands) in TASKS.items():
            def acc(method, cand):
                out = {}
                for s in seeds:
                    f = run_file(task, method, cand, eps, s, ov(method))
                    if f.is_file():
                        out[s] = json.loads(f.read_text())["accuracy"]
                return out
            base = acc("dpsgd", None)
            if not base:
                continue
            row = [f"{task} ({eps:g})", _fmt(interval(list(base.values())))]
            for m in ("gep", "second-phase"):
                a = acc(m, cands[0])
                ss = sorted(set(a) & set(base))
                if not ss:
                    row += ["-", "-"]
                    continue
                g = interval([a[s] - base[s] for s in ss])
                row += [_fmt(interval([a[s] for s in ss])) + f" ({len(ss)} seeds)",
                        f"{100 * g['mean']:+.1f}" + (f" [{100 * g['ci'][0]:+.1f}, {100 * g['ci'][1]:+.1f}]" if g["ci"] else "")]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epsilons", nargs="+", type=float, default=[2.0])
    ap.add_argument("--candidates", choices=("same", "all"), default="same")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--epochs10", action="store_true", help="the grid's settings at 10 epochs (EPOCHS10) instead of gsd's defaults")
    a = ap.parse_args(argv)
    ov = (lambda m: dict(EPOCHS10)) if a.epochs10 else overrides
    if not a.table:
        run(a.seeds, a.epsilons, a.candidates, ov)
    print(table(a.seeds, a.epsilons, ov))


if __name__ == "__main__":
    sys.exit(main())
