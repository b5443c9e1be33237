"""Peak driver memory and throughput of a ranking against many small public candidates (issue 37).

Each run is a fresh process: it generates (once, in ``--data``) K public npz sets of ``--examples``
random 28x28 images and a private one, ranks them with the FMNIST CNN at k = ``--k``, and reports its
peak resident memory (``ru_maxrss``) and candidates per minute. ``streamed``: the default, each public
side compared with the private one as it arrives and dropped; ``held``: every public subspace kept
until the end (a ``memo`` dict, which is what every ranking did before), for comparison.

``--executors local ray``: each size also under ``--executor ray`` on a local Ray instance that the
child starts (``ray.init(num_cpus=--ray-cpus)``; its workers, one CPU each, are warmed up, i.e. have
imported torch and gsd_cli, before the clock starts). The peak is the *driver's* (the Ray processes
are others); the row also says how many models the workers built (one per worker process: they keep
it between tasks) and the most tasks the driver had in flight.

    python benchmarks/bench_catalog_memory.py --candidates 20 100 500 --json benchmarks/results/cpu_catalog_memory.json
    python benchmarks/bench_catalog_memory.py --candidates 20 100 500 --modes streamed --executors local ray \\
        --json benchmarks/results/cpu_catalog_memory_ray.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_catalog_memory
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from .harness import add_json, write_json

CHILD = r"""
import json, resource, sys, time
import gsd_cli
data, K, k, m, mode, executor, cpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6], int(sys.argv[7])
pubs = [f"npz:{data}/pub{i}.npz" for i in range(K)]
extra, ex = {}, None
if executor == "ray":
    import ray
    from gsd_cli.ranking.ray_executor import RayExecutor
    t = time.perf_counter()
    ex = RayExecutor(init={"num_cpus": cpus})
    ex.connect()

    @ray.remote(num_cpus=1)
    def warm():
        import os, time
        import gsd_cli.ranking  # noqa: F401 (each worker imports torch and gsd_cli once, here)
        time.sleep(0.5)  # so that every worker gets one
        return os.getpid()

    assert len(set(ray.get([warm.remote() for _ in range(cpus)]))) == cpus
    extra = {"executor": ex, "ray_start_seconds": time.perf_counter() - t}
t = time.perf_counter()
rk = gsd_cli.rank(f"npz:{data}/priv.npz", pubs, model="fmnist-cnn", k=k, examples=m, seed=0,
                  memo={} if mode == "held" else None, executor=ex)
sec = time.perf_counter() - t
row = {"seconds": sec, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
       "winner": rk.winner.public, "candidates": len(rk.results), "workers": cpus if ex else 1}
if ex is not None:
    built = getattr(ex, "models_built", {})  # (not counted before the executor kept these)
    row.update(ray_start_seconds=extra["ray_start_seconds"], tasks=ex.submitted,
               models_built=sum(built.values()) if built else None, worker_processes=len(built) if built else None,
               most_in_flight=getattr(ex, "most_in_flight", None))
    ex.close()
print(json.dumps(row))
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, nargs="+", default=[20, 100, 500])
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--modes", nargs="+", default=["streamed", "held"])
    ap.add_argument("--executors", nargs="+", default=["local"], choices=["local", "ray"])
    ap.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray instance (one per worker)")
    ap.add_argument("--data", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "gsd-bench-catalog"))
    add_json(ap)
    args = ap.parse_args(argv)
    data = Path(args.data)
    make_data(data, max(args.candidates), args.examples)
    rows = []
    env = {**os.environ, "GSD_CACHE_DIR": str(data / "no-cache-here"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    load_before = os.getloadavg()
    for K in args.candidates:
        for executor in args.executors:
            for mode in args.modes:
                t = time.perf_counter()
                r = subprocess.run([sys.executable, "-c", CHILD, str(data), str(K), str(args.k), str(args.examples), mode,
                                    executor, str(args.ray_cpus)], capture_output=True, text=True, env=env)
                if r.returncode:
                    print(r.stderr[-2000:])
                    raise SystemExit(1)
                row = {"candidates": K, "executor": executor, "mode": mode, **json.loads(r.stdout.strip().splitlines()[-1]),
                       "wall_seconds": round(time.perf_counter() - t, 1)}
                row["candidates_per_minute"] = round(60 * K / row["seconds"], 1)
                row["per_worker_per_minute"] = round(row["candidates_per_minute"] / row["workers"], 1)
                rows.append(row)
                more = f"  models built {row['models_built']} on {row['worker_processes']} workers, at most {row['most_in_flight']} in flight" if executor == "ray" else ""
                print(f"K={K:4d} {executor:5s} {mode:8s} peak {row['peak_mb']:7.0f} MB  {row['candidates_per_minute']:6.1f} candidates/min"
                      f" ({row['per_worker_per_minute']:.1f} per worker){more}", flush=True)
    doc = {"command": "python benchmarks/bench_catalog_memory.py " + " ".join(sys.argv[1:]), "rows": rows, "args": vars(args),
           "platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_before": load_before, "load": os.getloadavg(),
           "shared_machine": True, "time": time.strftime("%Y-%m-%d %H:%M")}
    write_json(args.json, doc, loadavg_before=load_before)


if __name__ == "__main__":
    main()
