"""What the feature probe adds to gsd train --auto-select's selection (issue 42): the advised selection
(`gsd_cli.advice.advised_selection`: the GSD ranking with its noise references over 3 repeats) with and
without the probe (`train_settings`), alternated in one process, on the embedded default data.

    OMP_NUM_THREADS=1 python benchmarks/bench_probe_cost.py --repeats 3 --json benchmarks/results/probe_cost_cpu.json

Prints the wall time of each, the ratio, the load average, and each run's decision.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_probe_cost
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import os
import time

from .harness import add_json, write_json


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--private", default="mnist-a")
    ap.add_argument("--public", nargs="+", default=["mnist-b", "digits", "faces", "noise", "textures", "mnist-inverted"])
    ap.add_argument("--model", default="fmnist-cnn", help="the trained model (the probe's)")
    ap.add_argument("--repeats", type=int, default=3)
    add_json(ap)
    a = ap.parse_args(argv)
    import torch

    from gsd_cli.advice import advised_selection
    from gsd_cli.train import TrainConfig

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = TrainConfig(private=a.private, public=a.public[0], method="auto", model=a.model)
    rows = []
    for r in range(a.repeats):
        for probe in ((False, True) if r % 2 == 0 else (True, False)):
            t0 = time.perf_counter()
            _, dec = advised_selection(a.private, a.public, "auto", seed=r, device="cpu", train_settings=cfg if probe else None)
            wall = time.perf_counter() - t0
            rows.append({"probe": probe, "seed": r, "seconds": round(wall, 2), "decision": [dec.method, dec.public],
                         "loadavg": [round(x, 2) for x in os.getloadavg()]})
            print(f"seed {r} probe {probe}: {wall:.1f} s -> {dec.method} {dec.public} (load {os.getloadavg()[0]:.2f})", flush=True)
    on = sum(x["seconds"] for x in rows if x["probe"]) / a.repeats
    off = sum(x["seconds"] for x in rows if not x["probe"]) / a.repeats
    doc = {"command": "OMP_NUM_THREADS=1 python benchmarks/bench_probe_cost.py " + " ".join(f"--{k} {v}" for k, v in vars(a).items() if v and k != "json"),
           "private": a.private, "public": a.public, "model": a.model, "runs": rows,
           "mean_seconds": {"with_probe": round(on, 2), "without": round(off, 2)}, "ratio": round(on / off, 2)}
    print(f"with the probe {on:.1f} s, without {off:.1f} s: {on / off:.2f}x")
    write_json(a.json, doc, indent=1)


if __name__ == "__main__":
    main()
