"""Memory of RGP's per-sample gradients against DP-SGD's on the same model (paper 001, Table 1).

For each model (``fmnist-cnn``, ``resnet20``, and a wide MLP ``mlp-1024``) and method, a fresh Python process builds the model and one chunk of n random
examples, then computes that chunk's per-sample gradients exactly as ``gsd train`` does (DP-SGD: the
full per-sample gradients by ``torch.func`` vmap, n x p; RGP: the carrier gradients of the
reparametrized forward, n x width) and clips them. Reported: the peak resident memory (``ru_maxrss``)
of the process above what it held before the computation, the per-example floats (p against
width = sum r (p_l + d_l) + the parameters not reparametrized) and the time. Each figure is the median
of ``--repeats`` fresh processes.

    OMP_NUM_THREADS=1 python benchmarks/bench_rgp_memory.py --json benchmarks/results/rgp_memory_cpu.json
    python benchmarks/bench_rgp_memory.py --models fmnist-cnn --n 64 --ranks 4
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_rgp_memory
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import time

from .harness import add_json, child_env, module_command, write_json


def child(model_name: str, method: str, rank: int, n: int) -> dict:
    import torch

    from gsd_cli.gradients import gradient_matrix
    from gsd_cli.train.rgp import RGP
    from probes import get_model_spec

    torch.manual_seed(0)
    if model_name.startswith("mlp-"):  # a wide MLP on 28x28 inputs: where Table 1's d^2 against r d shows
        w = int(model_name.split("-")[1])
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, w), torch.nn.ReLU(), torch.nn.Linear(w, w),
                                    torch.nn.ReLU(), torch.nn.Linear(w, 10))
        channels, size = 1, 28
    else:
        spec = get_model_spec(model_name)
        model = spec.build(num_classes=10, seed=0)
        channels, size = spec.channels, spec.input_size
    names = [k for k, _ in model.named_parameters()]
    x = torch.randn(n, channels, size, size)
    y = torch.randint(0, 10, (n,))
    p = sum(q.numel() for q in model.parameters())
    rgp = RGP(model, names, rank=rank, seed=0) if method == "rgp" else None
    if rgp is not None:
        rgp.compute(model, 0)
    # warm-up on 2 examples (one-time allocations, kernel set-up) before the baseline is read
    if rgp is not None:
        rgp.per_sample(model, names, x[:2], y[:2])
    else:
        gradient_matrix(model, [(x[:2], y[:2])], 2, names, None, "vmap", "cpu", "none")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if rgp is not None:
        G = rgp.per_sample(model, names, x, y)["grad"]
    else:
        G = gradient_matrix(model, [(x, y)], n, names, None, "vmap", "cpu", "none")
    G = G * (1.0 / G.norm(dim=1, keepdim=True).clamp_min(1.0))  # clip to 1
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"model": model_name, "method": method, "rank": rank if rgp else None, "n": n, "params": p,
            "per_example_floats": G.shape[1], "gradient_matrix_mib": G.numel() * 4 / 2**20,
            "peak_increase_mib": (peak - base) / 1024, "seconds": seconds}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["fmnist-cnn", "resnet20", "mlp-1024"],
                    help="probes model names, or mlp-WIDTH (784 -> WIDTH -> WIDTH -> 10)")
    ap.add_argument("--ranks", nargs="+", type=int, default=[1, 4, 16])
    ap.add_argument("--n", type=int, default=128, help="examples per chunk")
    ap.add_argument("--repeats", type=int, default=3)
    add_json(ap)
    ap.add_argument("--child", nargs=4, metavar=("MODEL", "METHOD", "RANK", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        m, meth, r, n = args.child
        print(json.dumps(child(m, meth, int(r), int(n))))
        return
    rows = []
    t0 = time.time()
    for model in args.models:
        for method, rank in [("dpsgd", 0)] + [("rgp", r) for r in args.ranks]:
            reps = []
            for _ in range(args.repeats):
                out = subprocess.run(module_command(__spec__.name, "--child", model, method, str(rank), str(args.n)),
                                     capture_output=True, text=True, check=True, env=child_env())
                reps.append(json.loads(out.stdout.strip().splitlines()[-1]))
            row = dict(reps[0])
            row["peak_increase_mib"] = statistics.median(r["peak_increase_mib"] for r in reps)
            row["seconds"] = statistics.median(r["seconds"] for r in reps)
            row["repeats"] = [round(r["peak_increase_mib"], 1) for r in reps]
            rows.append(row)
            label = method if method == "dpsgd" else f"rgp r={rank}"
            print(f"| {model} | {label} | {row['per_example_floats']} of {row['params']} | {row['gradient_matrix_mib']:.1f} MiB "
                  f"| {row['peak_increase_mib']:.1f} MiB | {row['seconds']:.2f} s |", flush=True)
    doc = {"settings": vars(args), "rows": rows, "platform": platform.platform(), "loadavg": os.getloadavg(),
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "seconds": round(time.time() - t0, 1)}
    if args.json:
        write_json(args.json, doc, indent=2)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
