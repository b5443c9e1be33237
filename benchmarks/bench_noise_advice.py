"""Does ``gsd train --auto-select --public noise`` ever train with noise? The advice (gsd_cli.advice.decide)
on a grid of ranking settings: models, k, m, with and without a private selection.

For every cell, ``gsd_cli.advice.select.advised_selection(private, ["noise"], "auto", ...)`` (the same call
``gsd train --auto-select`` makes, no training) on the embedded private set, and the decision: the
method and the public set it would train with. Non-private cells are deterministic (a non-private ranking
draws from ``--seed``); private cells draw from the OS, so each is run ``--dp-draws`` times.

    python benchmarks/bench_noise_advice.py --json benchmarks/results/noise_advice_cpu.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_noise_advice
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import itertools
import json
import os
import time

from .harness import add_json, add_seed, write_json


def cell(model: str, k: int, m: int, epsilon: float | None, seed: int, public=("noise",)) -> dict:
    from gsd_cli.advice.select import advised_selection

    opts = dict(k=k, examples=m, seed=seed, model=model, device="cpu")
    if epsilon is not None:
        opts.update(dp=True, epsilon=epsilon)
    t0 = time.perf_counter()
    _, d = advised_selection("mnist-a", list(public), "auto", **opts)
    return {"model": model, "k": k, "m": m, "epsilon": epsilon, "seed": seed, "method": d.method, "public": d.public,
            "message": d.message, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["probe", "fmnist-cnn", "resnet20"])
    ap.add_argument("--k", nargs="+", type=int, default=[4, 16])
    ap.add_argument("--m", nargs="+", type=int, default=[100, 500])
    ap.add_argument("--epsilons", nargs="+", type=float, default=[1.0])
    ap.add_argument("--dp-draws", type=int, default=5)
    add_seed(ap, 0, help="seed of the non-private rankings (default 0)")
    ap.add_argument("--private-only", action="store_true", help="only the cells with a private selection")
    ap.add_argument("--public", nargs="+", default=["noise"],
                    help="the candidates (default: noise alone; with a useful one among them, the advice's power)")
    add_json(ap)
    a = ap.parse_args(argv)
    import tempfile

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    os.environ.setdefault("GSD_LEDGER", os.path.join(tempfile.mkdtemp(prefix="gsd-bench-"), "ledger.sqlite"))  # not the user's
    rows = []
    for model, k, m in itertools.product(a.models, a.k, a.m):
        if not a.private_only:
            rows.append(cell(model, k, m, None, a.seed, a.public))
            print(json.dumps(rows[-1]), flush=True)
        for eps in a.epsilons:
            for _ in range(a.dp_draws):
                rows.append(cell(model, k, m, eps, a.seed, a.public))
                print(json.dumps(rows[-1]), flush=True)
    used = [r for r in rows if r["public"] == "noise"]
    summary = {"cells": len(rows), "trained_with_noise": len(used),
               "trained_with": {p: sum(r["public"] == p for r in rows) for p in {r["public"] for r in rows}},
               "loadavg": os.getloadavg(),
               "command": "python benchmarks/bench_noise_advice.py " + " ".join(
                   f"--{n.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                   for n, v in vars(a).items() if n not in ("json", "private_only") and v is not None)
                   + (" --private-only" if a.private_only else "")}
    print(json.dumps(summary))
    write_json(a.json, {"summary": summary, "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
