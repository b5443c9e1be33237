"""Peak memory of `gsd rank` with --no-cache, on a cold cache and on a warm one (issue 37: a warm rank
must peak no higher than one that computes the public basis).

Each run is a fresh process (the `gsd rank` command run in-process by `gsd_cli.cli.main`) that reports
its own peak resident set size (``ru_maxrss``); the three share one temporary cache folder
(``GSD_CACHE_DIR``), so the warm run reads the basis the cold run stored.

    OMP_NUM_THREADS=1 python benchmarks/bench_cache_memory.py --model resnet18 --examples 64 \\
        --json benchmarks/results/cache_memory_cpu.json
    OMP_NUM_THREADS=1 python benchmarks/bench_cache_memory.py --model resnet50 --examples 64 \\
        --json benchmarks/results/cache_memory_resnet50_cpu.json     # the Gram path, a float32 basis
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_cache_memory
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import os
import subprocess
import sys
import tempfile
import time

from .harness import add_json, write_json

CHILD = (
    "import resource, sys, time\n"
    "from gsd_cli.cli import main\n"
    "t0 = time.perf_counter()\n"
    "rc = main(sys.argv[1:])\n"
    "print('PEAK', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rc, time.perf_counter() - t0)\n"
)


def run(args: list[str], env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True)
    line = next((l for l in out.stdout.splitlines() if l.startswith("PEAK ")), None)
    if line is None:
        raise SystemExit(f"run failed: {out.stderr[-2000:]}")
    _, kb, rc, secs = line.split()
    return {"peak_mb": int(kb) / 1024, "rc": int(rc), "seconds": float(secs)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--params", default="*")
    ap.add_argument("--examples", type=int, default=64)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--private", default="mnist-a")
    ap.add_argument("--public", default="mnist-b")
    add_json(ap)
    a = ap.parse_args(argv)
    base = ["rank", "--private", a.private, "--public", a.public, "--model", a.model, "--params", a.params,
            "-m", str(a.examples), "-k", str(a.k), "-q", "--device", "cpu"]
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "GSD_CACHE_DIR": d}
        res = {"no_cache": run(base + ["--no-cache"], env), "cold": run(base, env), "warm": run(base, env)}
    for k, v in res.items():
        print(f"{k:9s} peak {v['peak_mb']:8.0f} MB  {v['seconds']:6.1f} s  (exit {v['rc']})")
    doc = {"command": "python benchmarks/bench_cache_memory.py " + " ".join(sys.argv[1:]), "args": base,
           "loadavg_before": load_before, "loadavg": os.getloadavg(), "shared_machine": True,
           "time": time.strftime("%Y-%m-%d %H:%M"), "results": res,
           "warm_over_no_cache": res["warm"]["peak_mb"] / res["no_cache"]["peak_mb"]}
    print(f"warm / no-cache peak: {doc['warm_over_no_cache']:.2f}; load {load_before} -> {doc['loadavg']}")
    write_json(a.json, doc, indent=2, loadavg_before=load_before)


if __name__ == "__main__":
    main()
