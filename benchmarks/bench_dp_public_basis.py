"""Does DP-GSD keep the non-private order? Today's Gaussian sketch against the public-basis sketch (issue 33, item 4).

For every task of ``bench_dp_sketch.py`` (the embedded default: mnist-a against the six default
candidates, probe, m=2000) and of the validity benchmark (``validity/tasks.py``: mnist, digits,
textures; probe at m=250 and fmnist-cnn at m=500, as its predictors), and every seed (w0, the
examples and their random labels), the per-sample gradients are computed once (unit rows, as
``gsd rank``), the non-private GSD order of the candidates is taken in the full parameter space, and
each sketch's DP-GSD is drawn ``--draws`` times per epsilon (sequential mechanism, clip 1, k=16; the
draws seeded: a benchmark, not a DP release). Kendall's tau of each DP order with the non-private
order, per cell: mean, 95% t-interval over all (seed, draw) values, min and max. Sketches:

* ``gauss32``: today's ``--dp-sketch 32`` (both sides projected by one seeded Gaussian matrix; the
  DP draw compared with each candidate's top-k of its sketched gradients).
* ``public``: ``--dp-sketch public``: private rows projected onto the orthonormal span Q of the
  candidates' own top-k subspaces (D <= K k), clipped, the draw mapped back (Q V_D) and compared with
  each candidate's full top-k subspace.
* ``public+16``: the same with 16 extra random directions orthogonal to the span.
* ``public-k4``: the public basis, but the private side drawn with k'=4 directions (epsilon/4 each),
  compared with each candidate's top-16 (sqrt(1 - |V^T V_j|_F^2 / 4)).
* ``energy-laplace``: ``--metric dp-energy`` (:mod:`gsd_cli.distance.dpenergy`): no subspace, each
  candidate's energy of the projected, clipped private rows with Laplace noise of scale
  2 C^2 Lambda / epsilon, through the library's own functions.
``eps=inf``: the non-private order of the sketch (its ceiling), or of the noise-free energies.

    OMP_NUM_THREADS=1 python benchmarks/bench_dp_public_basis.py --seeds 0 1 2 --draws 4 \\
        --json benchmarks/results/cpu_dp_public_basis.json
    OMP_NUM_THREADS=1 python benchmarks/bench_dp_public_basis.py --tasks large-mnist large-animal large-mnist-neg \\
        --seeds 0 --draws 8 --json benchmarks/results/cpu_dp_public_basis_large_s0.json   # issue 33's tasks
    ... --seeds 1 2 ... --json benchmarks/results/cpu_dp_public_basis_large_s12.json
    python benchmarks/bench_dp_public_basis.py --merge benchmarks/results/cpu_dp_public_basis_large_s*.json \\
        --json benchmarks/results/cpu_dp_public_basis_large.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_dp_public_basis
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau, t as student_t

from .harness import add_json, write_json

K = 16
SKETCHES = ("gauss32", "public", "public+16", "public-k4", "energy-laplace")


def groups(which):
    """(name, private source, candidate sources, model, m) of every task."""
    from gsd_cli import data as gdata
    from gsd_cli.defaults import DEFAULT_PRIVATE, DEFAULT_PUBLIC
    from .validity.tasks import TASKS, private_train, register, source

    register()
    out = []
    if "default" in which:
        out.append(("default (probe, m=2000)", gdata.resolve(DEFAULT_PRIVATE), [(n, gdata.resolve(n)) for n in DEFAULT_PUBLIC], "probe", 2000))
    for task, (_, cands) in TASKS.items():
        for model, m in (("probe", 250), ("fmnist-cnn", 500)):
            if f"{task}-{model}" in which or task in which:
                out.append((f"{task} ({model}, m={m})", private_train(task), [(c, source(c)) for c in cands], model, m))
    large = [w[len("large-"):] for w in which if w.startswith("large-")]
    if large:  # issue 33's downstream tasks (benchmark-only data: validity/prepare_large.py), auto-select's ranking
        from .validity.large import TASKS as LARGE, register as register_large

        register_large()
        for task in large:
            priv, _, cands = LARGE[task]
            out.append((f"large {task} (probe, m=2000)", gdata.resolve(priv), [(c, gdata.resolve(c)) for c in cands], "probe", 2000))
    return out


def unit(G):
    n = G.norm(dim=1, keepdim=True)
    return G / torch.where(n > 0, n, torch.ones_like(n))


def tau(order_ref, dist):
    names = sorted(dist, key=dist.get)
    return float(kendalltau([order_ref.index(n) for n in names], range(len(names))).statistic)


def overlap_distance(V, W):
    """sqrt(1 - |V^T W|_F^2 / k_V): the projection metric normalised by V's k (V may have fewer columns)."""
    C = V.T @ W
    return math.sqrt(max(0.0, 1.0 - float((C * C).sum()) / V.shape[1]))


def one_seed(name, priv_src, cands, model, m, seed, epsilons, draws):
    from gsd_cli import data as gdata
    from gsd_cli.subspace.dppca import private_top_k_subspace
    from gsd_cli.models.peft import build_model
    from gsd_cli.subspace.public_basis import project_rows, public_basis
    from gsd_cli.distance.side import sketch
    from gsd_cli.subspace import projection_metric, top_k_subspace
    from .validity.predictors import gradients

    nc = priv_src.num_classes
    spec, net, names, _ = build_model(model, nc, seed)
    Gp = unit(gradients(net, gdata.draw(priv_src, m, seed), "random", nc, seed, spec, names))
    Vp = top_k_subspace(Gp, K)[0]
    pubV, pubS = {}, {}
    for c, src in cands:
        U = unit(gradients(net, gdata.draw(src, m, seed), "random", nc, seed, spec, names))
        pubV[c] = top_k_subspace(U, K)[0]
        pubS[c] = top_k_subspace(sketch(U, 32, seed), K)[0]
        del U
    d_full = {c: projection_metric(Vp, V) for c, V in pubV.items()}
    ref = sorted(d_full, key=d_full.get)
    Q0 = public_basis([pubV[c] for c, _ in cands])
    Q16 = public_basis([pubV[c] for c, _ in cands], extra=16, seed=seed)
    P0, P16 = project_rows(Gp, Q0), project_rows(Gp, Q16)
    rows = {"gauss32": (sketch(Gp, 32, seed), None, pubS), "public": (P0, Q0, pubV), "public+16": (P16, Q16, pubV)}
    out = {"seed": seed, "nonprivate_order": ref, "D_public": Q0.shape[1],
           "private_energy_in_public_span": float((P0.norm(dim=1) ** 2).mean()), "cells": {}}
    for sk, (M, Q, pubs) in rows.items():
        back = (lambda V: V) if Q is None else (lambda V, Q=Q: Q @ V)
        Vnp = back(top_k_subspace(M, K)[0])
        out["cells"][f"{sk}|inf"] = [tau(ref, {c: projection_metric(Vnp, V) for c, V in pubs.items()})]
        for eps in epsilons:
            ts = []
            for d in range(draws):
                rng = np.random.default_rng([seed, d, int(eps * 10), 4242])
                V = back(private_top_k_subspace(M, K, eps, 1.0, "sequential", rng))
                ts.append(tau(ref, {c: projection_metric(V, W) for c, W in pubs.items()}))
            out["cells"][f"{sk}|{eps:g}"] = ts
    # two leads beyond the brief: (a) the private side drawn with k'=4 directions (epsilon/4 each) in the
    # public span, compared with each candidate's top-16; (b) gsd's --metric dp-energy
    # (gsd_cli.distance.dpenergy): no subspace at all, each candidate's energy s_j = sum_i |V_j^T g_i|^2
    # of the projected, clipped rows, released with Laplace noise of scale 2 C^2 Lambda / epsilon
    from gsd_cli.distance.dpenergy import energy_sensitivity, private_energies

    W = [Q0.T @ pubV[c] for c, _ in cands]
    lam = energy_sensitivity([pubV[c] for c, _ in cands])
    out["energy_lambda"] = lam
    Vnp4 = Q0 @ top_k_subspace(P0, 4)[0]
    out["cells"]["public-k4|inf"] = [tau(ref, {c: overlap_distance(Vnp4, V) for c, V in pubV.items()})]
    exact = [float(((P0 @ w) ** 2).sum()) for w in W]  # noise-free energies (unit rows: the clip leaves them)
    out["cells"]["energy-laplace|inf"] = [tau(ref, {c: -e for (c, _), e in zip(cands, exact)})]
    for eps in epsilons:
        t4, te = [], []
        for d in range(draws):
            rng = np.random.default_rng([seed, d, int(eps * 10), 4343])
            V = Q0 @ private_top_k_subspace(P0, 4, eps, 1.0, "sequential", rng)
            t4.append(tau(ref, {c: overlap_distance(V, W_) for c, W_ in pubV.items()}))
            s = private_energies(P0, W, eps, 1.0, lam, rng)
            te.append(tau(ref, {c: -e for (c, _), e in zip(cands, s)}))
        out["cells"][f"public-k4|{eps:g}"] = t4
        out["cells"][f"energy-laplace|{eps:g}"] = te
    return out


def summary(vals):
    x = np.asarray(vals, float)
    mean = float(x.mean())
    if len(x) < 2:
        return dict(mean=mean, n=len(x))
    half = float(student_t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return dict(mean=mean, ci=[mean - half, mean + half], min=float(x.min()), max=float(x.max()), n=len(x))


def merge(files, out) -> None:
    """One results file from several runs (e.g. seeds run apart): per-seed cells pooled, summaries recomputed."""
    docs = [json.loads(Path(f).read_text()) for f in files]
    doc = {**docs[0], "command": [d["command"] for d in docs], "seeds": [s for d in docs for s in d["seeds"]],
           "seconds": sum(d.get("seconds", 0) for d in docs), "loadavg": [[d.get("loadavg_start"), d.get("loadavg_end")] for d in docs],
           "tasks": {}}
    for name in docs[0]["tasks"]:
        per_seed = [r for d in docs for r in d["tasks"][name]["per_seed"]]
        cells = {key: summary([v for r in per_seed for v in r["cells"][key]]) for key in per_seed[0]["cells"]}
        doc["tasks"][name] = {"per_seed": per_seed, "summary": cells, "D_public": [r["D_public"] for r in per_seed],
                              "private_energy_in_public_span": [r["private_energy_in_public_span"] for r in per_seed]}
        print(name, "  ".join(f"{sk} eps4 {cells[f'{sk}|4']['mean']:+.2f} [{cells[f'{sk}|4']['ci'][0]:+.2f},{cells[f'{sk}|4']['ci'][1]:+.2f}]"
                               for sk in SKETCHES if f"{sk}|4" in cells))
    if any("env" in d for d in docs):  # each merged file's environment record, in order
        doc["env"] = [d.get("env") for d in docs]
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=["default", "mnist", "digits", "textures"])
    ap.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--draws", type=int, default=4)
    add_json(ap)
    ap.add_argument("--merge", nargs="+", default=None, help="merge the per-seed results of these JSON files into --json (summaries over all their seeds)")
    a = ap.parse_args(argv)
    if a.merge:
        merge(a.merge, a.json)
        return
    torch.set_num_threads(1)
    t0 = time.time()
    load0 = open("/proc/loadavg").read().split()[:3]
    doc = {"command": "OMP_NUM_THREADS=%s python benchmarks/bench_dp_public_basis.py %s" % (os.environ.get("OMP_NUM_THREADS", ""), " ".join(sys.argv[1:])),
           "k": K, "seeds": a.seeds, "draws": a.draws, "epsilons": a.epsilon, "tasks": {}}
    for name, priv, cands, model, m in groups(a.tasks):
        per_seed = [one_seed(name, priv, cands, model, m, s, a.epsilon, a.draws) for s in a.seeds]
        cells = {}
        for key in per_seed[0]["cells"]:
            cells[key] = summary([v for r in per_seed for v in r["cells"][key]])
        doc["tasks"][name] = {"per_seed": per_seed, "summary": cells, "D_public": [r["D_public"] for r in per_seed],
                              "private_energy_in_public_span": [r["private_energy_in_public_span"] for r in per_seed]}
        print(f"\n{name}  (D public = {doc['tasks'][name]['D_public']}, private energy in span "
              f"{np.round(doc['tasks'][name]['private_energy_in_public_span'], 3).tolist()}; {time.time() - t0:.0f} s)", flush=True)
        for sk in SKETCHES:
            line = "  ".join(f"eps {e}: {cells[f'{sk}|{e}']['mean']:+.2f} [{cells[f'{sk}|{e}'].get('ci', [math.nan]*2)[0]:+.2f},{cells[f'{sk}|{e}'].get('ci', [math.nan]*2)[1]:+.2f}]"
                             for e in [f"{x:g}" for x in a.epsilon] + ["inf"])
            print(f"  {sk:>12}  {line}", flush=True)
    doc["seconds"] = round(time.time() - t0, 1)
    doc["loadavg_start"] = load0
    doc["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    write_json(a.json, doc)


if __name__ == "__main__":
    main()
