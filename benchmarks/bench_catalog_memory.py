"""Peak driver memory and throughput of a ranking against many small public candidates (issue 37).

Each run is a fresh process: it generates (once, in ``--data``) K public npz sets of ``--examples``
random 28x28 images and a private one, ranks them with the FMNIST CNN at k = ``--k``, and reports its
peak resident memory (``ru_maxrss``) and candidates per minute. ``streamed``: the default, each public
side compared with the private one as it arrives and dropped; ``held``: every public subspace kept
until the end (a ``memo`` dict, which is what every ranking did before), for comparison.

    python benchmarks/bench_catalog_memory.py --candidates 20 100 500 --json benchmarks/results/cpu_catalog_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import gsd_cli
data, K, k, m, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
pubs = [f"npz:{data}/pub{i}.npz" for i in range(K)]
t = time.perf_counter()
rk = gsd_cli.rank(f"npz:{data}/priv.npz", pubs, model="fmnist-cnn", k=k, examples=m, seed=0,
                  memo={} if mode == "held" else None)
sec = time.perf_counter() - t
print(json.dumps({"seconds": sec, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "winner": rk.winner.public, "candidates": len(rk.results)}))
"""


def make_data(folder: Path, K: int, m: int) -> None:
    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    if not (folder / "priv.npz").exists():
        np.savez(folder / "priv.npz", x=rng.integers(0, 256, (m, 28, 28), dtype=np.uint8), y=np.arange(m) % 10,
                 classes=np.array([str(i) for i in range(10)]))
    for i in range(K):
        f = folder / f"pub{i}.npz"
        if not f.exists():
            np.savez(f, x=rng.integers(0, 256, (m, 28, 28), dtype=np.uint8), y=np.arange(m) % 10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, nargs="+", default=[20, 100, 500])
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["streamed", "held"])
    ap.add_argument("--data", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "gsd-bench-catalog"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    data = Path(args.data)
    make_data(data, max(args.candidates), args.examples)
    rows = []
    env = {**os.environ, "GSD_CACHE_DIR": str(data / "no-cache-here"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for K in args.candidates:
        for mode in args.modes:
            t = time.perf_counter()
            r = subprocess.run([sys.executable, "-c", CHILD, str(data), str(K), str(args.k), str(args.examples), mode],
                               capture_output=True, text=True, env=env)
            if r.returncode:
                print(r.stderr[-2000:])
                raise SystemExit(1)
            row = {"candidates": K, "mode": mode, **json.loads(r.stdout.strip().splitlines()[-1]),
                   "wall_seconds": round(time.perf_counter() - t, 1)}
            row["candidates_per_minute"] = round(60 * K / row["seconds"], 1)
            rows.append(row)
            print(f"K={K:4d} {mode:8s} peak {row['peak_mb']:7.0f} MB  {row['candidates_per_minute']:6.1f} candidates/min", flush=True)
    doc = {"rows": rows, "args": vars(args), "platform": platform.platform(), "cpus": os.cpu_count(), "load": os.getloadavg()}
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
