"""Training step time with 1 and N processes (torch.distributed; gloo on CPU, NCCL on GPUs).

For each method (DP-SGD, GEP) and each process count, one ``gsd train`` run (one epoch of the
embedded mnist-a private set, mnist-b as GEP's public anchors, ``--insecure-seed`` so that every run
draws the same subsamples and noise) is started through :func:`gsd_cli.train.distributed.launch.spawn` (the
1-process run too, so start-up is alike), with ``--threads`` intra-op threads per process. Process 0
stamps the end of every step; the step time is the median gap between consecutive steps of the epoch
(the first step, which pays for warm-up, and the epoch end's evaluation and checkpoint are outside
those gaps). Also recorded: the wall time of the whole run in the worker, the largest weight
difference from the 1-process run (float rounding: the sums are added in another order), and the load
average (the figures are only comparable on an idle machine).

    python benchmarks/scale_out_training.py                                   # dpsgd, gep; 1 and 2 processes
    python benchmarks/scale_out_training.py --methods gep --anchors 2000 --nprocs 1 2 4 --json benchmarks/results/scale_out_training_cpu.json

``run(args) -> dict`` is what ``benchmarks/bench_scale_out.py --part training`` calls; ``args`` is
the namespace of :func:`parser` (``run(None)``: the defaults).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.scale_out_training
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from .harness import add_json, write_json


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", nargs="+", default=["dpsgd", "gep"], choices=["dpsgd", "gep", "topagg", "rgp"])
    ap.add_argument("--nprocs", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--model", default="fmnist-cnn")
    ap.add_argument("--private", default="mnist-a")
    ap.add_argument("--public", default="mnist-b")
    ap.add_argument("--batch", type=int, default=250, help="expected batch size (Poisson)")
    ap.add_argument("--anchors", type=int, default=500, help="GEP's public anchor examples")
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--anchor-every", type=int, default=1, help="GEP: recompute the anchor basis every N steps")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    ap.add_argument("--device", default="cpu")
    add_json(ap)
    return ap


def _timed_train(cfg, out: str, device: str, threads: int) -> dict:
    """In each process: ``train`` with process 0 stamping every step; process 0's figures."""
    import torch

    from gsd_cli.train import train

    torch.set_num_threads(threads)
    stamps: list[float] = []
    t0 = time.perf_counter()
    summary = train(cfg, out, device=device, progress=lambda kind, done, total: stamps.append(time.perf_counter()) if kind == "step" else None)
    return {"wall_s": time.perf_counter() - t0, "stamps": stamps, "steps": summary["steps"] if summary else None}


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "checkpoint.safetensors"))


def run(args: argparse.Namespace | None = None) -> dict:
    """Step times of every method x process count (see the module docstring); returns the document
    written by ``--json``."""
    import torch

    from gsd_cli.train import TrainConfig
    from gsd_cli.train.distributed.launch import spawn

    args = args if args is not None else parser().parse_args([])
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="gsd-scale-out-") as tmp:
        for method in args.methods:
            cfg = TrainConfig(private=args.private, public=args.public if method == "gep" else None, method=method,
                              model=args.model, epochs=1, batch_size=args.batch, epsilon=2.0, k=args.k,
                              public_examples=args.anchors, insecure_seed=1, lr=0.1,
                              **({"anchor_every": args.anchor_every} if args.anchor_every != 1 else {}))
            ref = None
            for n in args.nprocs:
                out = Path(tmp) / f"{method}-{n}"
                t = time.perf_counter()
                res = spawn(_timed_train, n, (cfg, str(out), args.device, args.threads), device=args.device)
                launch_s = time.perf_counter() - t
                gaps = [b - a for a, b in zip(res["stamps"], res["stamps"][1:])]
                w = _weights(out)
                ref = ref if ref is not None else w
                diff = max(float((w[k] - ref[k]).abs().max()) for k in w)
                row = {"method": method, "processes": n, "threads_per_process": args.threads, "steps": res["steps"],
                       "step_s": statistics.median(gaps) if gaps else None, "step_s_all": gaps,
                       "run_wall_s": res["wall_s"], "launch_wall_s": launch_s, "max_weight_diff_vs_first": diff,
                       "loadavg_after": os.getloadavg()}
                rows.append(row)
                print(f"{method:6s} {n} process(es) x {args.threads} thread(s): step {row['step_s']:.3f} s (median of {len(gaps)}), "
                      f"run {res['wall_s']:.1f} s, launch {launch_s:.1f} s, |w - w_1proc| <= {diff:.2e}", flush=True)
        for row in rows:
            base = next(r for r in rows if r["method"] == row["method"] and r["processes"] == args.nprocs[0])
            row["speedup_vs_first"] = base["step_s"] / row["step_s"] if row["step_s"] else None
    return {
        "benchmark": "scale_out_training", "device": args.device, "model": args.model, "private": args.private,
        "public": args.public, "batch": args.batch, "anchors": args.anchors, "k": args.k, "anchor_every": args.anchor_every, "cpu_count": os.cpu_count(),
        "platform": platform.platform(), "torch": torch.__version__, "loadavg_start": load_start,
        "results": rows,
    }


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    doc = run(args)
    write_json(args.json, doc, indent=2, loadavg_before=doc["loadavg_start"])


if __name__ == "__main__":
    main()
