"""Rank stability of the embedded default over independent repeats, and the cost of repeats.

Stability (``--models``, ``--m``, ``--k``, ``--repeats``): for each model and m, R independent draws
(repeat r uses gsd's ``repeat_seed(seed, r)`` for the examples, the random labels and w0, exactly as
``gsd rank --repeats R``). Each dataset's top-kmax subspace is computed once per repeat and its first
k columns give the top-k subspace for every smaller k (the columns are in descending singular-value
order), so the k grid costs one gradient pass. Per (model, m, k): Kendall's tau between the orders
of every pair of repeats (single draws), Kendall's tau between the orders of the means of two
disjoint halves of the repeats (what a ranking by the mean of R/2 repeats would reproduce), how
often the same-distribution candidate (mnist-b) wins, and each candidate's mean and sd.

Cost (``--timing-model``, ``--timing-m``): wall time of ``rank_repeats(repeats=R)`` for R = 1 and 5.

    python benchmarks/bench_repeats.py --models fmnist-cnn --m 250 500 1000 2000 --k 8 16 32 --repeats 10
    python benchmarks/bench_repeats.py --models probe --m 250 500 1000 --k 8 16 32 --repeats 4
    python benchmarks/bench_repeats.py --models --timing-model fmnist-cnn --timing-m 2000

    python benchmarks/bench_repeats.py --table benchmarks/results/cpu_repeats_*.json    # README tables

Results: JSON (``--json``), with ``os.getloadavg()`` before and after (the machine may be shared).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_repeats
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import itertools
import json
import os
import platform
import time

import numpy as np
import torch
from scipy.stats import kendalltau

from gsd_cli import data as gdata
from gsd_cli.gradients import resolve_device, select_parameters
from gsd_cli.ranking import repeat_seed, sample_subspace
from gsd_cli.subspace import projection_metric
from probes import get_model_spec

from .harness import add_json, add_seed, write_json


def tau(a, b) -> float:
    return float(kendalltau(a, b).statistic)


def stability(model: str, m: int, ks: list[int], repeats: int, seed: int, device: str, engine: str) -> dict:
    spec = get_model_spec(model)
    priv = gdata.resolve(gdata.DEFAULT_PRIVATE)
    pubs = [gdata.resolve(n) for n in gdata.DEFAULT_PUBLIC]
    kmax = max(ks)
    dev = resolve_device(device)
    dist = {k: np.zeros((repeats, len(pubs))) for k in ks}
    seconds = []
    for r in range(repeats):
        t0 = time.perf_counter()
        s = repeat_seed(seed, r)
        net = spec.build(num_classes=priv.num_classes, seed=s)
        names = select_parameters(net, None)
        common = dict(k=kmax, input_size=spec.input_size, channels=spec.channels, num_classes=priv.num_classes,
                      names=names, seed=s, engine=engine, device=dev)
        Vp = sample_subspace(net, gdata.draw(priv, m, s), **common).V
        for j, src in enumerate(pubs):
            V = sample_subspace(net, gdata.draw(src, m, s), **common).V
            for k in ks:
                dist[k][r, j] = projection_metric(Vp[:, :k], V[:, :k])
        seconds.append(time.perf_counter() - t0)
        print(f"  {model} m={m} repeat {r}: {seconds[-1]:.1f} s", flush=True)
    out = {"model": model, "m": m, "repeats": repeats, "seconds_per_repeat": seconds, "by_k": {}}
    names_pub = [p.name for p in pubs]
    for k in ks:
        D = dist[k]
        pair = [tau(D[a], D[b]) for a, b in itertools.combinations(range(repeats), 2)]
        h = repeats // 2
        half = tau(D[:h].mean(0), D[h : 2 * h].mean(0)) if h >= 1 else None
        winners = [names_pub[int(i)] for i in D.argmin(1)]
        out["by_k"][str(k)] = {
            "tau_single_pairs_mean": float(np.mean(pair)),
            "tau_single_pairs_min": float(np.min(pair)),
            "tau_half_means": half,
            "half_size": h,
            "mnist_b_win_fraction": winners.count("mnist-b") / repeats,
            "candidates": {
                n: {"mean": float(D[:, j].mean()), "sd": float(D[:, j].std(ddof=1)), "distances": D[:, j].round(6).tolist()}
                for j, n in enumerate(names_pub)
            },
        }
        c = out["by_k"][str(k)]
        print(f"  k={k}: tau pairs {c['tau_single_pairs_mean']:.2f} (min {c['tau_single_pairs_min']:.2f}), "
              f"tau half-means {half if half is None else round(half, 2)}, mnist-b wins {c['mnist_b_win_fraction']:.2f}; "
              + ", ".join(f"{n} {v['mean']:.3f}+-{v['sd']:.3f}" for n, v in c["candidates"].items()), flush=True)
    return out


def timing(model: str, m: int, k: int, seed: int, device: str, engine: str, rs: list[int]) -> dict:
    from gsd_cli.ranking import rank_repeats

    out = {"model": model, "m": m, "k": k, "engine": engine, "seconds": {}}
    for R in rs:
        t0 = time.perf_counter()
        rank_repeats(repeats=R, k=k, examples=m, seed=seed, model=model, device=device, engine=engine)
        out["seconds"][str(R)] = time.perf_counter() - t0
        print(f"  timing {model} m={m} R={R}: {out['seconds'][str(R)]:.1f} s", flush=True)
    return out


def table(paths: list[str]) -> None:
    """Markdown tables of saved results (what the README shows)."""
    print("| model | m | R | k | tau, single draws (mean / min) | tau, means of R/2 | mnist-b wins | sd of each candidate's distance | s per repeat | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        doc = json.load(open(path))
        load = f"{doc['loadavg_before'][0]:.1f}-{doc.get('loadavg_after', doc['loadavg_before'])[0]:.1f}"
        for st in doc["stability"]:
            for k, c in st["by_k"].items():
                sds = [v["sd"] for v in c["candidates"].values()]
                half = "-" if c["tau_half_means"] is None else f"{c['tau_half_means']:.2f}"
                print(f"| {st['model']} | {st['m']} | {st['repeats']} | {k} | {c['tau_single_pairs_mean']:.2f} / "
                      f"{c['tau_single_pairs_min']:.2f} | {half} | {c['mnist_b_win_fraction']:.2f} | "
                      f"{min(sds):.3f}-{max(sds):.3f} | {np.mean(st['seconds_per_repeat']):.0f} | {load} |")
        for t in doc["timing"]:
            print(f"timing {t['model']} m={t['m']} k={t['k']}: " + ", ".join(f"R={r}: {v:.1f} s" for r, v in t["seconds"].items()) + f" (load {load})")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=["fmnist-cnn", "probe"])
    ap.add_argument("--m", type=int, nargs="+", default=[250, 500, 1000, 2000])
    ap.add_argument("--k", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--repeats", type=int, default=5)
    add_seed(ap, 0, help="base seed: repeat r draws from gsd's repeat_seed(seed, r) (default 0)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--engine", default="vmap")
    ap.add_argument("--timing-model", nargs="*", default=[])
    ap.add_argument("--timing-m", type=int, default=500)
    ap.add_argument("--timing-k", type=int, default=16)
    ap.add_argument("--timing-repeats", type=int, nargs="+", default=[1, 5])
    add_json(ap)
    ap.add_argument("--table", nargs="+", default=None, help="print markdown tables of saved JSON results and exit")
    a = ap.parse_args(argv)
    if a.table:
        return table(a.table)
    res = {
        "loadavg_before": os.getloadavg(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "machine": platform.processor() or platform.machine(),
        "device": str(resolve_device(a.device)), "seed": a.seed, "stability": [], "timing": [],
    }

    def save():
        if a.json:
            res["loadavg_after"] = os.getloadavg()
            write_json(a.json, res, indent=2, loadavg_before=res["loadavg_before"])  # a temporary file, then renamed

    for model in a.models:
        for m in a.m:
            res["stability"].append(stability(model, m, a.k, a.repeats, a.seed, a.device, a.engine))
            save()
    for model in a.timing_model:
        res["timing"].append(timing(model, a.timing_m, a.timing_k, a.seed, a.device, a.engine, a.timing_repeats))
        save()
    save()


if __name__ == "__main__":
    main()
