"""Scale study of the top-k step: exact (float64 Gram + eigh) against randomized (block Krylov in
float32, certified in float64), time and accuracy, as m grows.

For each m, on the same m x p matrix G (k=16 by default):

* exact      : ``top_k_subspace(G, k, "exact")``: Gram O(m^2 p) + eigh O(m^3) + V = G^T U / s;
* randomized : ``top_k_subspace(G, k, "randomized")``: float32 Krylov passes, float64 passes (their
               counts and the certificate are recorded; ``fallback`` when it took the exact path);
* accuracy   : d(V_fast, V_exact) (the most any distance can move), the change of the distance to a
               random subspace and to the exact subspace of the first m/2 rows (a nearby one), the
               largest relative error of s, and s_k / s_{k+1} (how close the k-th gap is to a tie).

G is either real per-sample gradients (``--model``, unit rows, random labels, as ``gsd rank``; the
examples come from ``--datasets`` in turns of 64, so every prefix mixes them; computed once for the
largest m), or ``--synthetic-p P``: a gradient-like matrix (64 strong directions with a
decaying spectrum, an isotropic bulk, unit rows), generated in float32 by blocks from a fixed seed.

    python benchmarks/bench_subspace.py --model probe --m 500 1000 2000 4000 8000 \\
        --json benchmarks/results/cpu_subspace_probe.json
    python benchmarks/bench_subspace.py --synthetic-p 262144 --m 500 1000 2000 \\
        --json benchmarks/results/cpu_subspace_synthetic.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_subspace
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import math
import os
import platform
import time

import numpy as np
import torch

from .harness import add_json, write_json


def real_gradients(model: str, datasets: list[str], m: int, seed: int = 0, chunk: int = 64) -> torch.Tensor:
    """m per-sample gradients of ``model`` at w0 (``seed``), unit rows, uniform random labels; chunks
    of ``chunk`` examples taken from the datasets in turn (every prefix mixes them), decoded lazily."""
    from probes import get_model_spec

    from gsd_cli import data as gdata
    from gsd_cli.gradients import gradient_matrix
    from gsd_cli.models.peft import build_model

    spec = get_model_spec(model)
    _, net, names, _ = build_model(model, 10, seed)
    per = math.ceil(m / len(datasets))
    streams = [gdata.draw(gdata.resolve(n), per, seed).batches(spec.input_size, spec.channels, chunk, torch.device("cpu"))
               for n in datasets]
    y = torch.randint(0, 10, (m,), generator=torch.Generator().manual_seed(seed + 1))

    def chunks():
        done, before = 0, -1
        while before < done < m:  # stops when a round yields nothing (cannot happen: per * len >= m)
            before = done
            for it in streams:
                x = next(it, (None, None))[1]
                if x is None or done >= m:
                    continue
                x = x[: m - done]
                yield x, y[done : done + x.shape[0]]
                done += x.shape[0]

    return gradient_matrix(net, chunks(), m, names, None, "auto", torch.device("cpu"), "unit")


def synthetic(m: int, p: int, seed: int = 0, strong: int = 64, block: int = 16384) -> torch.Tensor:
    """A gradient-like m x p float32 matrix: ``strong`` directions with singular values ~ i^-0.8 over
    an isotropic bulk carrying about half of each row's norm; rows normalised to 1."""
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(m, strong, generator=g) * (torch.arange(1, strong + 1, dtype=torch.float32) ** -0.8)
    G = torch.empty(m, p)
    for j in range(0, p, block):
        w = min(block, p - j)
        H = torch.randn(strong, w, generator=g)
        G[:, j : j + w] = Z @ H * (2.0 / math.sqrt(p)) + torch.randn(m, w, generator=g) / math.sqrt(p)
    return G / G.norm(dim=1, keepdim=True)


def timed(f, repeats: int):
    """(result of the last call, the fastest of ``repeats`` wall times)."""
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t)
    return out, round(best, 3)


def study(G: torch.Tensor, k: int, skip_exact_above: int | None, repeats: int = 1) -> dict:
    from gsd_cli.subspace import _exact_top_k, projection_metric, top_k_subspace

    m, p = G.shape
    row: dict = {"m": m, "p": p, "k": k}
    info: dict = {}
    (Vf, sf), row["randomized_s"] = timed(lambda: top_k_subspace(G, k, "randomized", info), repeats)
    kr = info.get("krylov")
    row.update(randomized_used=info["method"], fallback=info["fallback"],
               passes32=getattr(kr, "passes32", 0), passes64=getattr(kr, "passes64", 0),
               certified_bound=getattr(kr, "bound", None))
    if kr is not None and kr.converged:  # certified Ritz values: the k-th gap, how close to a tie
        row["s_k_over_s_k1"] = math.sqrt(kr.values[k - 1] / kr.values[k])
    if skip_exact_above is not None and m > skip_exact_above:
        return row
    (Ve, se), row["exact_s"] = timed(lambda: top_k_subspace(G, k, "exact"), repeats)
    row["speedup"] = round(row["exact_s"] / row["randomized_s"], 2)
    P = torch.linalg.qr(torch.randn(p, k, generator=torch.Generator().manual_seed(7), dtype=torch.float64))[0]
    H = _exact_top_k(G[: m // 2].contiguous(), k)[0]
    row.update(
        subspace_distance=float((Vf - Ve @ (Ve.T @ Vf)).norm()) / math.sqrt(k),  # ||sin Theta||_F / sqrt(k), no sqrt(1 - x) floor
        distance_change_random=abs(projection_metric(Vf, P) - projection_metric(Ve, P)),
        distance_change_nearby=abs(projection_metric(Vf, H) - projection_metric(Ve, H)),
        distance_nearby=projection_metric(Ve, H),
        s_rel_error=float(((sf - se).abs() / se).max()),
    )
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, nargs="+", default=[500, 1000, 2000, 4000, 8000])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--model", default="probe")
    ap.add_argument("--datasets", nargs="+", default=["mnist-a", "mnist-b", "mnist-inverted", "noise"])
    ap.add_argument("--synthetic-p", type=int, default=None, help="a synthetic gradient-like matrix with this p instead")
    ap.add_argument("--gradients", default=None, help="load G from / save it to this .pt file (the largest m)")
    ap.add_argument("--skip-exact-above", type=int, default=None, help="time only the randomized method above this m")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=1, help="time each method this many times, keep the fastest")
    add_json(ap)
    a = ap.parse_args(argv)
    np.seterr(all="ignore")
    if a.threads:
        torch.set_num_threads(a.threads)
    mmax = max(a.m)
    t = time.perf_counter()
    if a.gradients and os.path.exists(a.gradients):
        G = torch.load(a.gradients)
    elif a.synthetic_p:
        G = synthetic(mmax, a.synthetic_p)
    else:
        G = real_gradients(a.model, a.datasets, mmax)
        if a.gradients:
            torch.save(G, a.gradients)
    source = f"synthetic p={a.synthetic_p}" if a.synthetic_p else f"{a.model} gradients on {'+'.join(a.datasets)}"
    print(f"G: {tuple(G.shape)} ({source}) in {time.perf_counter() - t:.1f} s", flush=True)
    from gsd_cli.subspace import top_k_subspace

    for method in ("exact", "randomized"):  # warm-up: BLAS/LAPACK thread pools and first-call costs
        top_k_subspace(G[:300, :4096].contiguous(), a.k, method)
    rows = []
    for m in sorted(a.m):
        Gm = G[:m].contiguous()
        row = study(Gm, a.k, a.skip_exact_above, a.repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = {
        "source": source, "k": a.k, "rows": rows, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(), "loadavg_end": list(os.getloadavg()), "repeats": a.repeats,
        "note": "wall seconds on a shared CPU under load from other processes; compare within a row",
    }
    print("| m | p | exact s | randomized s | speedup | float32 / float64 passes | max distance change | s_k/s_k+1 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        change = max(r.get("distance_change_random", float("nan")), r.get("distance_change_nearby", float("nan")))
        print(f"| {r['m']} | {r['p']} | {r.get('exact_s', '-')} | {r['randomized_s']} | {r.get('speedup', '-')} | "
              f"{r['passes32']} / {r['passes64']} | {change:.1e} | {r.get('s_k_over_s_k1') or float('nan'):.4f} |")
    if a.json:
        write_json(a.json, out, indent=1)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
