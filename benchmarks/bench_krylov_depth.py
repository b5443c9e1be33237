"""How deep the float32 Krylov phase of ``--subspace-method randomized`` should be (``DEPTH`` in
:mod:`gsd_cli.subspace.krylov`), measured on the gradient matrices of the default ``gsd rank``.

Runs the default ranking once (``-m M``, probe, random labels, unit rows; an empty cache folder) and
keeps every gradient matrix with at least ``--min-rows`` rows (the private set and the public sets of
``-m`` examples), then runs :func:`~gsd_cli.subspace.krylov.krylov_top_k` on each for each depth and
records the float32 / float64 passes, whether it was certified (else ``gsd`` takes the exact path,
whose CPU time is recorded too) and the CPU seconds (steadier than wall time on a shared machine).
Each ``--depths`` value is a fixed depth (``adaptive=False``); the row ``adaptive`` is the default:
at most ``DEPTH`` steps, stopping when the float32 certificate reaches its floor.

    python benchmarks/bench_krylov_depth.py --depths 6 8 10 12 --json benchmarks/results/cpu_krylov_depth.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_krylov_depth
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import os
import platform
import tempfile
import time

import torch

from .harness import add_json, write_json


def default_rank_matrices(m: int, min_rows: int) -> list[tuple[int, int]]:
    """The gradient matrices (float32, m x p) of ``gsd rank -m M`` on the default data, in the order computed."""
    os.environ["GSD_CACHE_DIR"] = tempfile.mkdtemp(prefix="gsd-bench-cache-")
    import gsd_cli.distance.side as side
    from gsd_cli.cli.app import main

    real, kept = side.top_k_subspace, []

    def keep(G, k, method="auto", info=None):
        if G.shape[0] >= min_rows:
            kept.append(G.clone())
        return real(G, k, method, info)

    side.top_k_subspace = keep
    try:
        code = main(["rank", "-q", "-m", str(m), "--json", os.devnull])
    finally:
        side.top_k_subspace = real
    if code not in (0, None):
        raise SystemExit(f"gsd rank failed ({code})")
    return kept


def main(argv: list[str] | None = None) -> None:
    from gsd_cli.subspace import _exact_top_k
    from gsd_cli.allocator import keep_freed_memory
    from gsd_cli.subspace.krylov import DEPTH, KrylovInfo, krylov_top_k

    keep_freed_memory()  # as the gsd command runs

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", type=int, default=2000)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--depths", type=int, nargs="+", default=[6, 8, 10, 12])
    ap.add_argument("--min-rows", type=int, default=1500)
    add_json(ap)
    args = ap.parse_args(argv)
    mats = default_rank_matrices(args.m, args.min_rows)
    print(f"{len(mats)} matrices of shapes {sorted({tuple(G.shape) for G in mats})}")
    exact_cpu = []
    for G in mats:
        t = time.process_time()
        _exact_top_k(G, args.k)
        exact_cpu.append(time.process_time() - t)
    rows = []
    for depth in [*args.depths, "adaptive"]:
        runs = []
        for G in mats:
            info = KrylovInfo()
            t = time.process_time()
            opts = {"depth": DEPTH} if depth == "adaptive" else {"depth": depth, "adaptive": False}
            out = krylov_top_k(G, args.k, info=info, **opts)
            cpu = time.process_time() - t
            runs.append({"depth": info.depth, "passes32": info.passes32, "passes64": info.passes64, "certified": out is not None,
                         "bound": info.bound, "cpu_s": round(cpu, 3),
                         "gap": info.values[args.k - 1] / info.values[args.k] if len(info.values) > args.k else None})
        with_fallback = sum(r["cpu_s"] + (0 if r["certified"] else e) for r, e in zip(runs, exact_cpu))
        rows.append({"depth": depth, "runs": runs, "cpu_s_with_fallback": round(with_fallback, 2)})
        print(f"depth {depth!s:>8}: CPU {with_fallback:6.1f} s with fallbacks; passes (f32/f64) "
              + ", ".join(f"{r['passes32']}/{r['passes64']}{'' if r['certified'] else ' not certified'}" for r in runs), flush=True)
    print(f"exact path: CPU {sum(exact_cpu):.1f} s")
    if args.json:
        doc = {"m": args.m, "k": args.k, "rows": rows, "exact_cpu_s": [round(e, 3) for e in exact_cpu],
               "torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform(),
               "loadavg": os.getloadavg()}
        write_json(args.json, doc, indent=1)


if __name__ == "__main__":
    main()
