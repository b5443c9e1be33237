"""The relative claims of the source papers, checked on two offline tasks at fixed epsilon.

Claims (issue 7): RGP (paper 001) and GEP (paper 000) ahead of DP-SGD; random sparsification
(paper 003) adding a little, most at small epsilon; TopAgg (paper 002) near DP-SGD.

Tasks (both embedded, no download):
* ``mnist``: private mnist-a (the embedded default: its fixed train part trains, its test part
  evaluates), public mnist-b (the best-ranked candidate of ``gsd rank``, GSD 0.15);
* ``digits``: private scikit-learn digits (8x8, resized to 28x28; its fixed per-example 80/20 split;
  the figures in the README were measured with the stratified split of 0.2),
  public mnist-b.

Every run: fmnist-cnn, Poisson batches of 250 expected (digits: 100, it has 1437 training
examples), SGD lr 0.1 (``--lr``) momentum 0.9, lr / 10 from the middle, clip 1 (GEP: S1 2, S2 0.4,
k 50, 1000 anchors), RGP rank 4 with 20 warm-up steps, TopAgg K 0.7, RS final rate 0.5,
delta 1e-5, seeds 0..n-1 (deterministic noise). Each (task, epsilon) is one
:func:`gsd_cli.train.compare.compare` call.

    OMP_NUM_THREADS=1 python benchmarks/bench_methods.py --json benchmarks/results/methods_cpu.json
    OMP_NUM_THREADS=1 python benchmarks/bench_methods.py --epsilons 2 --methods dpsgd,rgp,topagg --lr 0.4 \
        --json benchmarks/results/methods_cpu_lr04.json                                 # the larger lr of paper 001's code
    python benchmarks/bench_methods.py --tasks mnist --epsilons 2 --seeds 1 --epochs 3   # a quick look
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_methods
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import dataclasses
import os
import platform
import tempfile
import time

import torch

from gsd_cli.train.compare import compare
from gsd_cli.train import TrainConfig

from .harness import add_json, write_json

TASKS = {"mnist": ("mnist-a", "mnist-b", 250), "digits": ("digits", "mnist-b", 100)}  # private, public, batch size
ALL = "dpsgd,dpsgd+rs,gep,gep+rs,rgp,topagg"
SMALL_EPS = "dpsgd,dpsgd+rs"  # RS's claim is strongest at small epsilon


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--epsilons", nargs="+", type=float, default=[2.0, 0.5])
    ap.add_argument("--methods", default=ALL, help="methods at the first epsilon")
    ap.add_argument("--small-methods", default=SMALL_EPS, help="methods at the other epsilons")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--sparsify", type=float, default=0.5)
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate of every run (paper 001's code uses 0.4)")
    add_json(ap)
    args = ap.parse_args(argv)
    t0 = time.time()
    base = TrainConfig(epochs=args.epochs, batch_size=250, lr=args.lr, clip=1.0, k=50, public_examples=1000, rgp_rank=4,
                       rgp_warmup=20, topk_fraction=0.7, deterministic_noise=True)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            private, public, batch = TASKS[task]
            for j, eps in enumerate(args.epsilons):
                methods = args.methods if j == 0 else args.small_methods
                print(f"== {task} ({private}, public {public}) epsilon {eps}: {methods}", flush=True)
                res = compare(private, public, methods, eps, args.seeds, os.path.join(tmp, f"{task}-{eps}"), sparsify=args.sparsify,
                              base=dataclasses.replace(base, batch_size=batch), device="cpu",
                              on_run=lambda r: print(f"  {r['method']:9s} seed {r['seed']}: acc {r['accuracy']:.4f} eps {r['epsilon']:.3f} "
                                                     f"({r['seconds']:.0f} s)", flush=True))
                res["task"] = task
                for r in res["runs"]:
                    r.pop("folder", None)
                results.append(res)
                for r in res["table"]:
                    sd = f" +- {100 * r['accuracy_sd']:.2f}" if r["accuracy_sd"] is not None else ""
                    print(f"  | {r['method']} | {100 * r['accuracy_mean']:.2f}{sd} | sigma {r['sigma']:.3f} | {r['seconds_mean']:.0f} s |", flush=True)
    doc = {
        "settings": {**vars(args), "base": base.to_dict()}, "results": results,
        "torch": torch.__version__, "platform": platform.platform(), "threads": torch.get_num_threads(),
        "loadavg": os.getloadavg(), "seconds": round(time.time() - t0, 1),
    }
    if args.json:
        write_json(args.json, doc, indent=2)
        print(f"wrote {args.json}")
    print(f"total {doc['seconds']:.0f} s, load average {doc['loadavg']}")


if __name__ == "__main__":
    main()
