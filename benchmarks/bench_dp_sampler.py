"""Time of DP-GSD's sequential Bingham sampler (k exact vector draws, low-rank, never p x p).

G is a synthetic m x p matrix of unit rows with a decaying spectrum (its content does not change
the work: two passes over G and one m x m eigh per vector). The Gram matrix G G^T, shared with the
non-private path, is timed separately.

    python benchmarks/bench_dp_sampler.py --m 2000 --p 30202 1000000 --k 16
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_dp_sampler
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import time

import numpy as np
import torch

from gsd_cli.subspace.dppca import bingham_scale, sample_sequential
from gsd_cli.gradients import resolve_device
from gsd_cli.subspace import gram, projection_metric, top_k_subspace

from .harness import add_json, write_json


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=2000)
    ap.add_argument("--p", type=int, nargs="+", default=[30202, 1_000_000])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 1e4])
    ap.add_argument("--device", default="auto")
    add_json(ap)
    a = ap.parse_args(argv)
    dev = resolve_device(a.device)
    out = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "threads": torch.get_num_threads(), "runs": []}
    print(f"device {out['device']}, threads {out['threads']}, m={a.m}, k={a.k}")
    for p in a.p:
        gen = torch.Generator(device="cpu").manual_seed(0)
        G = torch.empty(a.m, p, device=dev)
        for j in range(0, p, 65536):  # decaying column scales, built in blocks
            w = min(65536, p - j)
            scale = (1.0 + torch.arange(j, j + w, dtype=torch.float32)) ** -0.5
            G[:, j : j + w] = (torch.randn(a.m, w, generator=gen) * scale).to(dev)
        G /= G.norm(dim=1, keepdim=True)
        sync(dev)
        t0 = time.perf_counter()
        K = gram(G)
        sync(dev)
        t_gram = time.perf_counter() - t0
        V0 = top_k_subspace(G, a.k)[0] if p <= 100_000 else None
        for eps in a.epsilon:
            sync(dev)
            t0 = time.perf_counter()
            V = sample_sequential(G, a.k, bingham_scale(eps, 1.0) / a.k, np.random.default_rng(0), K=K)
            sync(dev)
            t = time.perf_counter() - t0
            d = projection_metric(V, V0) if V0 is not None else float("nan")
            print(f"  p={p:>9,}  epsilon={eps:<8g} gram {t_gram:7.2f} s   sampler {t:7.2f} s   distance to exact top-{a.k}: {d:.4f}")
            out["runs"].append({"p": p, "epsilon": eps, "gram_s": t_gram, "sampler_s": t, "distance_to_exact": d})
        del G, K
    write_json(a.json, out, indent=2)


if __name__ == "__main__":
    main()
