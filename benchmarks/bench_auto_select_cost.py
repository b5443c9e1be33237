"""What the advice costs: ``gsd train --auto-select`` against ``gsd train --method dpsgd`` on the same
task, as whole processes in one sitting, with a per-stage breakdown of the advised run.

    OMP_NUM_THREADS=2 python benchmarks/bench_auto_select_cost.py --json benchmarks/results/auto_select_cost_cpu.json
    python benchmarks/bench_auto_select_cost.py --private npz:/data/big.npz --public mnist-b digits noise --rounds 1

After one untimed DP-SGD run (it fills what only a machine's first run pays for: the noise calibration cache, the
ledger), each round runs the two commands as separate processes (alternating which goes first), and the advised one a
second time with the first one's cache (public subspaces, stage-1 models: a new private set of the same task), with
``--warm`` also ``--warm-cache`` into an empty cache then the first advised run after it (a CI image), timing each
whole process (start-up, imports, data, the advice, the training). Every advised run also writes its stages'
wall times (:mod:`gsd_cli.timing`, ``$GSD_STAGE_TIMES``; summed over threads and calls):

* rankings: the GSD rankings of the candidates and the in-run noise references, all repeats;
* probe stage 1: stage 1 of the second phase on each candidate the feature probe (or the DP probe) trains;
* probe fits: the probe's features and fits (the DP probe: its features, partition and mechanism);
* training: the whole training, of which "training's stage 1" (0 when it is read from the stage-1 cache);
* the rest: start-up, imports, reading the data, writing outputs (the process less the stages).

Prints each process's seconds, the mean ratio, the load average before and after, and the stages.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_auto_select_cost
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .harness import add_json, add_rounds, write_json

DEFAULT_PUBLIC = ["mnist-b", "digits", "mnist-inverted", "textures", "faces", "noise"]


def _run(argv: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall


def breakdown(path: Path, total: float) -> dict:
    """The stages' seconds of one advised process (its ``$GSD_STAGE_TIMES`` file) and the rest of its ``total``."""
    st = json.loads(path.read_text()) if path.is_file() else {}
    stages = {k: st.get(k, 0.0) for k in ("rankings", "probe stage 1", "probe fits", "training", "training's stage 1")}
    stages["the rest (start-up, imports, data, outputs)"] = max(0.0, total - stages["rankings"] - stages["probe stage 1"]
                                                                - stages["probe fits"] - stages["training"])
    return {k: round(v, 2) for k, v in stages.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--private", default="mnist-a")
    ap.add_argument("--public", nargs="+", default=DEFAULT_PUBLIC)
    ap.add_argument("--epsilon", default="2")
    add_rounds(ap, 2, help="pairs of whole processes (alternating order)")
    ap.add_argument("--extra", default="", help="more gsd train options for both runs, one string")
    ap.add_argument("--warm", action="store_true", help="also `gsd train --auto-select --warm-cache` (the public work ahead, "
                    "into a cache of its own) and the first advised run after it")
    ap.add_argument("--select-epsilon", help="also the private advice: --auto-select --select-epsilon E at the same total "
                    "--epsilon (the DP feature probe), first run and again with its own cache")
    add_json(ap)
    a = ap.parse_args(argv)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    work = Path(tempfile.mkdtemp(prefix="gsd-auto-cost-"))
    env["GSD_LEDGER"] = str(work / "ledger.sqlite")
    env["XDG_CONFIG_HOME"] = str(work / "config")
    gsd = [sys.executable, "-m", "gsd_cli.cli"]
    common = ["train", "--private", a.private, "--epsilon", a.epsilon, "-q", *a.extra.split()]
    dpsgd = [*gsd, *common, "--method", "dpsgd"]
    auto = [*gsd, *common, "--auto-select", "--public", *a.public]
    modes = [("auto", auto, "np"), ("auto-again", auto, "np")]
    if a.warm:  # the public part ahead (a CI image's build), then a first advised run on the private set
        modes += [("warm-cache", [*auto, "--warm-cache"], "warm"), ("auto-warmed", auto, "warm")]
    if a.select_epsilon:  # the private advice at the same total epsilon, with a cache of its own
        dp = [*auto, "--select-epsilon", a.select_epsilon]
        modes += [("dp-auto", dp, "dp"), ("dp-auto-again", dp, "dp")]
    names = ["dpsgd", *(m[0] for m in modes)]
    rows = []
    try:
        # untimed: one DP-SGD run first, so no timed process pays what only a machine's first run pays (the sigma
        # calibration cache, a new ledger, cold files): otherwise the first timed run, DP-SGD's, is the slow one
        _run([*dpsgd, "--out", str(work / "warm-up")], {**env, "GSD_CACHE_DIR": str(work / "cache-warm-up")})
        shutil.rmtree(work / "warm-up", ignore_errors=True)
        load0 = os.getloadavg()
        for r in range(a.rounds):
            # "auto": a first --auto-select with an empty cache; "auto-again": the same candidates again, the cache
            # (public subspaces, stage-1 models) kept, as for a new private set of the same task
            order = [("dpsgd", dpsgd, "base"), *modes] if r % 2 == 0 else [*modes, ("dpsgd", dpsgd, "base")]
            for name, argv, family in order:
                out, times = work / f"{name}-{r}", work / f"{name}-{r}.stages.json"
                cache = work / f"cache-{r}-{family}"
                folder = [] if name == "warm-cache" else ["--out", str(out)]  # --warm-cache writes no run folder
                wall = _run([*argv, *folder], {**env, "GSD_CACHE_DIR": str(cache), "GSD_STAGE_TIMES": str(times)})
                row = {"run": name, "round": r, "seconds": round(wall, 2), "load1": round(os.getloadavg()[0], 2)}
                if name not in ("dpsgd", "warm-cache"):
                    row["stages"] = breakdown(times, wall)
                rows.append(row)
                print(f"round {r} {name}: {wall:.1f} s (load {os.getloadavg()[0]:.2f})" +
                      (f"; stages {row['stages']}" if "stages" in row else ""), flush=True)
                shutil.rmtree(out, ignore_errors=True)
        mean = {n: sum(x["seconds"] for x in rows if x["run"] == n) / a.rounds for n in names}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratio = mean["auto"] / mean["dpsgd"]
    again = mean["auto-again"] / mean["dpsgd"]
    print(f"gsd train --method dpsgd {mean['dpsgd']:.1f} s, --auto-select {mean['auto']:.1f} s: {ratio:.2f}x; again with the same "
          f"candidates (cache kept) {mean['auto-again']:.1f} s: {again:.2f}x (load {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after)")
    if a.warm:
        print(f"--warm-cache {mean['warm-cache']:.1f} s, then the first --auto-select {mean['auto-warmed']:.1f} s: "
              f"{mean['auto-warmed'] / mean['dpsgd']:.2f}x")
    if a.select_epsilon:
        print(f"private advice (--select-epsilon {a.select_epsilon}, the same total epsilon): {mean['dp-auto']:.1f} s: "
              f"{mean['dp-auto'] / mean['dpsgd']:.2f}x; again {mean['dp-auto-again']:.1f} s: {mean['dp-auto-again'] / mean['dpsgd']:.2f}x")
    doc = {"command": "python benchmarks/bench_auto_select_cost.py " + " ".join(sys.argv[1:]), "private": a.private, "public": a.public,
           "threads": os.environ.get("OMP_NUM_THREADS"), "cpus": os.cpu_count(), "loadavg_before": load0, "loadavg_after": os.getloadavg(),
           "runs": rows, "mean_seconds": {k: round(v, 2) for k, v in mean.items()}, "ratio": round(ratio, 2),
           "ratio_again": round(again, 2),
           **({"ratio_warmed": round(mean["auto-warmed"] / mean["dpsgd"], 2)} if a.warm else {}),
           **({"select_epsilon": a.select_epsilon, "ratio_dp": round(mean["dp-auto"] / mean["dpsgd"], 2),
               "ratio_dp_again": round(mean["dp-auto-again"] / mean["dpsgd"], 2)} if a.select_epsilon else {})}
    write_json(a.json, doc, loadavg_before=load0)


if __name__ == "__main__":
    main()
