"""Time and peak memory of the GSD rank work against a plain forward+backward and the authors' pipeline.

In one process and on the same examples (default: m=2000 each from mnist-a and mnist-b, the probe
network at 224x224, k=16), measures:

* gsd      : per-sample gradients (gsd's engine: auto, hooks or vmap) + top-k subspace by eigh of
             the float64 Gram matrix + projection metric (what ``gsd rank`` does per dataset pair);
* floor    : one plain batched forward+backward over the same examples (no per-sample anything);
* authors  : Opacus GradSampleModule per-sample gradients + full ``torch.linalg.svd`` + metric.

and the per-sample gradient matrix alone (m x p, per engine, and Opacus' GradSampleModule with its
per-layer samplers and the rows stacked as the authors' code does), for the probe and ResNet20. Peak memory is the
peak resident set above the level before each step (CPU, sampled every 2 ms) or
``torch.cuda.max_memory_allocated`` (CUDA).

    python benchmarks/bench_rank.py                       # m=2000, probe + resnet20, auto device
    python benchmarks/bench_rank.py --m 500 --device cpu --json benchmarks/results/cpu.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_rank
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import os
import platform
import threading
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from gsd_cli.data import draw
from gsd_cli.gradients import gradient_matrix, resolve_device, select_parameters
from gsd_cli.subspace import projection_metric, top_k_subspace
from probes import get_model_spec

from .harness import add_json, write_json


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextmanager
def measure(dev: torch.device, out: dict):
    """Wall time and peak memory (bytes above the starting level) of the block."""
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base, peak, stop = _rss(), [0], threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], _rss())
                time.sleep(0.002)

        th = threading.Thread(target=sample, daemon=True)
        th.start()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        out["seconds"] = time.perf_counter() - t0
        if dev.type == "cuda":
            out["peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        else:
            stop.set()
            th.join()
            out["peak_mb"] = max(0, max(peak[0], _rss()) - base) / 2**20


def chunks(x, y, cs):
    for i in range(0, x.shape[0], cs):
        yield x[i : i + cs], y[i : i + cs]


def floor(model, xs, ys, cs, dev):
    for x, y in zip(xs, ys):
        for xb, yb in chunks(x, y, cs):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb.to(dev)), yb.to(dev), reduction="sum").backward()
    model.zero_grad(set_to_none=True)


def gsd_path(model, xs, ys, cs, dev, k, engine):
    names = select_parameters(model)
    bases = []
    for x, y in zip(xs, ys):
        G = gradient_matrix(model, chunks(x, y, cs), x.shape[0], names, None, engine, dev, "unit")
        bases.append(top_k_subspace(G, k)[0])
        del G
    return projection_metric(*bases)


def _opacus_matrix(gsm, model, x, y, cs, dev):
    """The m x p per-sample gradient matrix from an Opacus GradSampleModule, rows stacked."""
    rows = []
    for xb, yb in chunks(x, y, cs):
        gsm.zero_grad(set_to_none=True)
        F.cross_entropy(gsm(xb.to(dev)), yb.to(dev), reduction="sum").backward()
        rows.append(torch.cat([p.grad_sample.flatten(1) for p in model.parameters()], 1))
        for p in model.parameters():
            p.grad_sample = None
    return torch.cat(rows)


def authors_path(model, xs, ys, cs, dev, k):
    """Opacus GradSampleModule, G stacked, full SVD (their code: torch.linalg.svd / np.linalg.svd)."""
    from opacus import GradSampleModule

    gsm = GradSampleModule(model, loss_reduction="sum")
    bases = []
    try:
        for x, y in zip(xs, ys):
            G = _opacus_matrix(gsm, model, x, y, cs, dev)
            G = G / G.norm(dim=1, keepdim=True)
            _, _, Vh = torch.linalg.svd(G, full_matrices=False)
            bases.append(Vh[:k].T.contiguous())
            del G, Vh
    finally:
        gsm._close()
    return projection_metric(*bases)


def per_sample_only(model, x, y, cs, dev, engine):
    names = select_parameters(model)
    G = gradient_matrix(model, chunks(x, y, cs), x.shape[0], names, None, engine, dev, "none")
    del G


def opacus_only(model, x, y, cs, dev):
    """Opacus GradSampleModule per-sample gradients, stacked into the m x p matrix as the authors do."""
    from opacus import GradSampleModule

    gsm = GradSampleModule(model, loss_reduction="sum")
    try:
        _opacus_matrix(gsm, model, x, y, cs, dev)
    finally:
        gsm._close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=2000)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--chunk-size", type=int, default=None)
    ap.add_argument("--models", default="probe,resnet20")
    ap.add_argument("--skip-authors", action="store_true")
    add_json(ap)
    a = ap.parse_args(argv)
    import logging
    import warnings

    logging.getLogger("opacus").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    dev = resolve_device(a.device)
    cs = a.chunk_size or (256 if dev.type == "cuda" else 64)
    report = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})",
              "torch": torch.__version__, "threads": torch.get_num_threads(), "m": a.m, "k": a.k, "chunk_size": cs, "models": {}}
    print(f"device {report['device']}, torch {torch.__version__}, threads {report['threads']}, m={a.m}, k={a.k}, chunk {cs}")
    for name in a.models.split(","):
        spec = get_model_spec(name)
        model = spec.build(num_classes=10, seed=0).to(dev)
        xs, ys = [], []
        for ds in ("mnist-a", "mnist-b"):
            smp = draw(ds, a.m, 0)
            xs.append(smp.tensor(spec.input_size, spec.channels))
            ys.append(torch.randint(0, 10, (len(smp),), generator=torch.Generator().manual_seed(1)))
        p = sum(q.numel() for q in model.parameters())
        rows = {}
        # warm-up on a small slice so one-time costs (kernels, allocator) are not timed
        gsd_path(model, [x[: 2 * a.k] for x in xs], [y[: 2 * a.k] for y in ys], cs, dev, a.k, "auto")
        with measure(dev, rows.setdefault("floor (plain fwd+bwd)", {})):
            floor(model, xs, ys, cs, dev)
        for engine in ("hooks", "vmap"):
            with measure(dev, rows.setdefault(f"per-sample grads, gsd {engine}", {})):
                for x, y in zip(xs, ys):
                    per_sample_only(model, x, y, cs, dev, engine)
        with measure(dev, rows.setdefault("per-sample grads, Opacus GSM + stack", {})):
            for x, y in zip(xs, ys):
                opacus_only(model, x, y, cs, dev)
        r = rows.setdefault("gsd rank work (auto engine + eigh)", {})
        with measure(dev, r):
            r["distance"] = gsd_path(model, xs, ys, cs, dev, a.k, "auto")
        if not a.skip_authors:
            r2 = rows.setdefault("authors (Opacus GSM + full SVD)", {})
            with measure(dev, r2):
                r2["distance"] = authors_path(model, xs, ys, cs, dev, a.k)
        base = rows["floor (plain fwd+bwd)"]["seconds"]
        print(f"\n{name}: p={p:,}, {len(xs)} x {a.m} examples at {spec.input_size}x{spec.input_size}x{spec.channels}")
        print(f"  {'step':<40} {'seconds':>9} {'x floor':>8} {'peak MB':>9}  distance")
        for step, v in rows.items():
            v["ratio_to_floor"] = v["seconds"] / base
            dist = f"{v['distance']:.6f}" if "distance" in v else ""
            print(f"  {step:<40} {v['seconds']:9.2f} {v['ratio_to_floor']:8.2f} {v['peak_mb']:9.0f}  {dist}")
        report["models"][name] = {"params": p, "input": [spec.channels, spec.input_size, spec.input_size], "steps": rows}
        del xs, ys, model
    if a.json:
        write_json(a.json, report, indent=2)
        print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
