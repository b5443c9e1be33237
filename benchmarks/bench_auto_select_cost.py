"""What the advice costs: ``gsd train --auto-select`` against ``gsd train --method dpsgd`` on the same
task, as whole processes in one sitting, with a per-stage breakdown of the advised run.

    OMP_NUM_THREADS=2 python benchmarks/bench_auto_select_cost.py --json benchmarks/results/auto_select_cost_cpu.json
    python benchmarks/bench_auto_select_cost.py --private npz:/data/big.npz --public mnist-b digits noise --rounds 1

Each round runs the two commands as separate processes (alternating which goes first), and the advised one a
second time with the first one's cache (public subspaces, stage-1 models: a new private set of the same task), timing each
whole process (start-up, imports, data, the advice, the training). The breakdown comes from one more
advised run under cProfile (its wall time is not used for the ratio): the cumulative time inside each
stage's function, so stages are read as shares of that run:

* rankings: :func:`gsd_cli.ranking.rank` (the candidates and the in-run noise references, all repeats);
* probe stage 1: :func:`gsd_cli.train.second_phase.run_second_phase` called by the feature probe;
* probe fits: the probe's features and ridge fits (``head_features``, ``linear_probe_accuracy``);
* training's stage 1: ``run_second_phase`` called by the training itself;
* training (DP steps): :func:`gsd_cli.train.loop.train` less its stage 1;
* the rest: start-up, imports, reading the data, writing outputs.

Prints each process's seconds, the mean ratio, the load average before and after, and the stages.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_PUBLIC = ["mnist-b", "digits", "mnist-inverted", "textures", "faces", "noise"]


def _run(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall


def _stage(stats: pstats.Stats, module: str, func: str, caller: str | None = None) -> float:
    """Cumulative seconds in ``module.func`` (only the calls made from ``caller``'s function when given)."""
    total = 0.0
    for (file, _, name), (_, _, _, ct, callers) in stats.stats.items():
        if name != func or not file.replace(os.sep, "/").endswith(module):
            continue
        if caller is None:
            total += ct
        else:
            total += sum(v[3] for (cf, _, cn), v in callers.items() if cn == caller)
    return total


def breakdown(prof: str, total: float) -> dict:
    st = pstats.Stats(prof)
    rank = _stage(st, "gsd_cli/ranking/__init__.py", "rank")
    probe_s1 = _stage(st, "gsd_cli/train/second_phase.py", "run_second_phase", caller="probe_second_phase")
    fits = _stage(st, "gsd_cli/train/probe.py", "head_features") + _stage(st, "gsd_cli/train/probe.py", "linear_probe_accuracy")
    train = _stage(st, "gsd_cli/train/loop.py", "train")
    train_s1 = _stage(st, "gsd_cli/train/second_phase.py", "run_second_phase", caller="train")
    stages = {"rankings": rank, "probe stage 1": probe_s1, "probe fits": fits, "training's stage 1": train_s1,
              "training (DP steps)": max(0.0, train - train_s1)}
    stages["the rest (start-up, imports, data, outputs)"] = max(0.0, total - sum(stages.values()))
    return {k: round(v, 2) for k, v in stages.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--private", default="mnist-a")
    ap.add_argument("--public", nargs="+", default=DEFAULT_PUBLIC)
    ap.add_argument("--epsilon", default="2")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of whole processes (alternating order)")
    ap.add_argument("--extra", default="", help="more gsd train options for both runs, one string")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled run (no breakdown)")
    ap.add_argument("--json")
    a = ap.parse_args()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    work = Path(tempfile.mkdtemp(prefix="gsd-auto-cost-"))
    env["GSD_LEDGER"] = str(work / "ledger.sqlite")
    env["XDG_CONFIG_HOME"] = str(work / "config")
    gsd = [sys.executable, "-m", "gsd_cli.cli"]
    common = ["train", "--private", a.private, "--epsilon", a.epsilon, "-q", *a.extra.split()]
    dpsgd = [*gsd, *common, "--method", "dpsgd"]
    auto = [*gsd, *common, "--auto-select", "--public", *a.public]
    load0 = os.getloadavg()
    rows = []
    try:
        for r in range(a.rounds):
            # "auto": a first --auto-select with an empty cache; "auto-again": the same candidates again, the cache
            # (public subspaces, stage-1 models) kept, as for a new private set of the same task
            order = [("dpsgd", dpsgd), ("auto", auto), ("auto-again", auto)] if r % 2 == 0 else \
                [("auto", auto), ("auto-again", auto), ("dpsgd", dpsgd)]
            cache = work / f"cache-{r}"
            for name, argv in order:
                out = work / f"{name}-{r}"
                wall = _run([*argv, "--out", str(out)], {**env, "GSD_CACHE_DIR": str(cache)})
                rows.append({"run": name, "round": r, "seconds": round(wall, 2), "load1": round(os.getloadavg()[0], 2)})
                print(f"round {r} {name}: {wall:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True)
                shutil.rmtree(out, ignore_errors=True)
        mean = {n: sum(x["seconds"] for x in rows if x["run"] == n) / a.rounds for n in ("dpsgd", "auto", "auto-again")}
        stages = None
        if not a.no_profile:
            prof = str(work / "auto.prof")
            t0 = time.perf_counter()
            _run([sys.executable, "-m", "cProfile", "-o", prof, "-m", "gsd_cli.cli", *common, "--auto-select", "--public", *a.public,
                  "--out", str(work / "profiled")], {**env, "GSD_CACHE_DIR": str(work / "cache-profiled")})  # a first run: empty cache
            stages = breakdown(prof, time.perf_counter() - t0)
            for k, v in stages.items():
                print(f"  {k:<44} {v:8.1f} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = mean["auto"] / mean["dpsgd"]
    again = mean["auto-again"] / mean["dpsgd"]
    print(f"gsd train --method dpsgd {mean['dpsgd']:.1f} s, --auto-select {mean['auto']:.1f} s: {ratio:.2f}x; again with the same "
          f"candidates (cache kept) {mean['auto-again']:.1f} s: {again:.2f}x (load {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after)")
    doc = {"command": "python benchmarks/bench_auto_select_cost.py " + " ".join(sys.argv[1:]), "private": a.private, "public": a.public,
           "threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count(), "loadavg_before": load0, "loadavg_after": os.getloadavg(),
           "runs": rows, "mean_seconds": {k: round(v, 2) for k, v in mean.items()}, "ratio": round(ratio, 2),
           "ratio_again": round(again, 2), "stages_profiled": stages}
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
