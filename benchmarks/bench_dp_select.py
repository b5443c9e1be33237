"""Does the DP selection (gsd rank --dp's default) pick the non-private winner? Issue 43, point 1.

A ladder of candidates around the private set ``mnist-a`` (embedded, m=500 examples, probe network
at w0, k=16, unit rows, clip 1, random labels: ``gsd rank --dp``'s defaults), with one candidate of
the same distribution (``mnist-b``, the other half of MNIST-5k), rotations of it (15, 30, 45, 90
degrees), mixtures with Gaussian noise (25, 50, 75 %), pure noise and inverted digits: 10
candidates by default.

For each seed (w0, the public examples and their labels; the private rows drawn with an insecure
seed: a benchmark, not a release) the utilities are computed **once**, through the real pipeline
(``gsd_cli.ranking.rank(..., dp=True)``, whose call of :func:`gsd_cli.distance.dpselect.release`
is intercepted to keep its inputs: the clipped regret u, the energies s and the public subspaces W),
and the mechanism is then redrawn ``--draws`` times per epsilon with the library's own
:func:`~gsd_cli.distance.dpselect.release` (cheap: K numbers). Reported per epsilon (0.5, 1, 2, 4 by
default), pooled over the seeds, with 95% Wilson intervals:

* ``select``: the fraction of draws whose DP winner is the non-private winner of the same utility
  (argmax u), at gsd's defaults (regret clip 0.02 C^2, half of epsilon for the winner's score);
* ``select_vs_gsd``: the same against the non-private GSD winner (``gsd rank`` without --dp);
* ``energy_utility``: permute-and-flip on the plain energy (``--regret-clip 1``, sensitivity C^2),
  what the selection would do without the clipped regret, against the energy's non-private winner;
* ``laplace_order``: the winner of ``--metric dp-energy``'s noisy order (Laplace noise of scale
  2 C^2 Lambda / epsilon on every energy, Lambda from the candidates' subspaces), against the same;
* ``regret_clip=T``: the selection with another clip of the regret (``--regret-clips``), against the same;
* the winner's released DP energy distance against its exact value (mean absolute error), and the
  decision of the shipped ``rule_dp`` thresholds (gsd_cli/report/validity.json) on the released
  distance against the one on the exact distance (a proxy only: that rule is calibrated at m=2000).

    OMP_NUM_THREADS=1 python benchmarks/bench_dp_select.py --seeds 0 1 2 --draws 1000 \\
        --json benchmarks/results/cpu_dp_select.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_dp_select
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import math
import os
import sys
import time

import numpy as np

from .harness import add_json, write_json

EPSILONS = (0.5, 1.0, 2.0, 4.0)


def wilson(k: int, n: int, z: float = 1.959964) -> list[float]:
    """The 95% Wilson score interval of a binomial proportion k / n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [max(0.0, mid - half), min(1.0, mid + half)]


def ladder():
    """The candidates: ``mnist-b`` and its rotations, noise mixtures, noise and inverted digits."""
    import scipy.ndimage as ndi

    from gsd_cli import data as gdata
    from gsd_cli.data.base import ArraySource

    b = gdata.resolve("mnist-b")
    idx = np.arange(len(b))
    x, y = np.stack(b.images(idx)), b.labels(idx)
    noise = np.clip(np.random.default_rng(4343).normal(0.5, 0.25, size=x.shape), 0, 1).astype(np.float32)
    out = [b]
    for deg in (15, 30, 45, 90):
        out.append(ArraySource(f"mnist-b-rot{deg}", np.clip(ndi.rotate(x, deg, axes=(1, 2), reshape=False, order=1), 0, 1).astype(np.float32),
                               y, 10, f"mnist-b turned {deg} degrees"))
    for a in (25, 50, 75):
        out.append(ArraySource(f"mnist-b-noise{a}", ((1 - a / 100) * x + a / 100 * noise).astype(np.float32), y, 10,
                               f"mnist-b mixed with {a}% Gaussian noise"))
    out += [gdata.resolve("noise"), gdata.resolve("mnist-inverted")]
    return out


def utilities(seed: int, cands, m: int, k: int, model: str):
    """(u, s, W, names, exact distances, GSD winner): one seed's utilities through the real pipeline."""
    import gsd_cli.distance.dpselect as ds
    from gsd_cli.privacy.budget import unbooked
    from gsd_cli.ranking import rank

    got = {}
    real, real_regret = ds.release, ds.clipped_regret

    def spy(u, s, W, *a, **kw):
        got.update(u=np.array(u), s=np.array(s), W=list(W))
        return real(u, s, W, *a, **kw)

    def spy_regret(A, tau):
        got.update(A=np.array(A))  # the rows' energies a_ij (m x K), for other regret clips
        return real_regret(A, tau)

    ds.release, ds.clipped_regret = spy, spy_regret
    try:
        with unbooked("benchmark: the embedded mnist-a, not a user's private data"):
            rank("mnist-a", cands, examples=m, k=k, model=model, dp=True, epsilon=1.0, insecure_seed=seed, seed=seed)
    finally:
        ds.release, ds.clipped_regret = real, real_regret
    names = [c.name for c in cands]  # u, s and W are in the candidates' given order
    g = rank("mnist-a", cands, examples=m, k=k, model=model, seed=seed)
    return got["u"], got["s"], got["W"], got["A"], names, g.winner.public, {x.public: x.distance for x in g}


def rule_decision(d: float, rule: dict) -> str:
    """The method the shipped private rule picks for a winner at released distance ``d`` (best gain first)."""
    for meth in sorted(rule, key=lambda m_: -(rule[m_].get("gain") or 0)):
        if d <= float(rule[meth]["threshold"]):
            return meth
    return "dpsgd"


def one_seed(seed, cands, a) -> dict:
    from gsd_cli.distance.dpenergy import energy_sensitivity
    from gsd_cli.distance.dpselect import clipped_regret, release
    from gsd_cli.report.validity import figures

    t0 = time.time()
    u, s, W, A, names, gsd_winner, gsd_dist = utilities(seed, cands, a.examples, a.k, a.model)
    K, m, C = len(names), a.examples, 1.0
    win, win_e = int(np.argmax(u)), int(np.argmax(s))  # the non-private winners of the clipped regret and of the energy
    lam = energy_sensitivity(W)
    d_exact = math.sqrt(max(0.0, 1 - s[win] / (m * C * C)))
    rule = ((figures() or {}).get("rule_dp") or {}).get("rule") or {}
    exact_decision = rule_decision(d_exact, rule) if rule else None
    gaps = np.sort(u)[::-1]
    out = {"seed": seed, "names": names, "nonprivate_winner": names[win], "energy_winner": names[int(np.argmax(s))],
           "gsd_winner": gsd_winner, "gsd_distances": gsd_dist, "lambda": lam, "energy_share": dict(zip(names, (s / m).tolist())),
           "regret_gap_over_tau": float((gaps[0] - gaps[1]) / (0.02 * C * C)),
           "energy_gap": float(np.sort(s)[::-1][0] - np.sort(s)[::-1][1]), "seconds_utilities": round(time.time() - t0, 1), "cells": {}}
    rng = np.random.default_rng([seed, 0xD5E1])  # a benchmark: seeded draws of the mechanism
    for eps in a.epsilon:
        sel, sel_gsd, energy, lap, err, same = 0, 0, 0, 0, 0.0, 0
        for _ in range(a.draws):
            r = release(u, s, W, eps, C, rng=rng)
            j = r.chosen[0]
            sel += j == win
            sel_gsd += names[j] == gsd_winner
            d = math.sqrt(min(1.0, max(0.0, 1 - r.scores[0] / (m * C * C))))
            err += abs(d - math.sqrt(max(0.0, 1 - s[j] / (m * C * C))))
            if rule:
                same += rule_decision(d, rule) == exact_decision and names[j] == names[win]
            e = release(s, s, W, eps, C, regret_clip=1.0, rng=rng).chosen[0]  # the plain energy, sensitivity C^2
            energy += e == win_e
            lap += int(np.argmax(s + rng.laplace(0.0, 2 * C * C * lam / eps, size=K))) == win_e
        out["cells"][f"{eps:g}"] = {"select": sel, "select_vs_gsd": sel_gsd, "energy_utility": energy, "laplace_order": lap,
                                    "winner_distance_abs_error": err / a.draws, "rule_decision_same": same if rule else None,
                                    "draws": a.draws}
        # other regret clips tau (in C^2): the winner of argmax of the plain energy is the reference
        for tau in a.regret_clips:
            ut = clipped_regret(A, tau * C * C)
            hit = sum(release(ut, s, W, eps, C, regret_clip=tau, rng=rng).chosen[0] == win_e for _ in range(a.draws))
            out["cells"][f"{eps:g}"][f"regret_clip={tau:g}"] = int(hit)
    out["regret_clip_winners"] = {f"{tau:g}": names[int(np.argmax(clipped_regret(A, tau * C * C)))] for tau in a.regret_clips}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--epsilon", type=float, nargs="+", default=list(EPSILONS))
    ap.add_argument("--examples", "-m", type=int, default=500)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--model", default="probe")
    ap.add_argument("--regret-clips", type=float, nargs="*", default=[0.3, 0.1, 0.05, 0.01, 0.005],
                    help="other regret clips (in C^2) to redraw at, against the non-private winner of the energy")
    add_json(ap)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    t0 = time.time()
    cands = ladder()
    per_seed = []
    for seed in a.seeds:
        r = one_seed(seed, cands, a)
        per_seed.append(r)
        print(f"seed {seed}: non-private winner {r['nonprivate_winner']} (energy: {r['energy_winner']}, GSD: {r['gsd_winner']}), "
              f"Lambda {r['lambda']:.2f}, regret gap {r['regret_gap_over_tau']:.1f} tau, energy gap {r['energy_gap']:.2f} C^2 "
              f"({r['seconds_utilities']} s)", flush=True)
    summary = {}
    for eps in a.epsilon:
        key = f"{eps:g}"
        n = sum(r["cells"][key]["draws"] for r in per_seed)
        cell = {"draws": n}
        for what in ("select", "select_vs_gsd", "energy_utility", "laplace_order", "rule_decision_same",
                     *(f"regret_clip={t:g}" for t in a.regret_clips)):
            if per_seed[0]["cells"][key][what] is None:
                continue
            k_ = sum(r["cells"][key][what] for r in per_seed)
            cell[what] = {"fraction": k_ / n, "wilson95": wilson(k_, n)}
        cell["winner_distance_abs_error"] = float(np.mean([r["cells"][key]["winner_distance_abs_error"] for r in per_seed]))
        summary[key] = cell
        print(f"epsilon {key}: " + "  ".join(f"{w} {c['fraction']:.3f} [{c['wilson95'][0]:.3f}, {c['wilson95'][1]:.3f}]"
                                             for w, c in cell.items() if isinstance(c, dict))
              + f"  |d~ - d| {cell['winner_distance_abs_error']:.4f}", flush=True)
    doc = {"command": "OMP_NUM_THREADS=%s python benchmarks/bench_dp_select.py %s" % (os.environ.get("OMP_NUM_THREADS", ""), " ".join(sys.argv[1:])),
           "private": "mnist-a", "candidates": [c.name for c in cands], "examples": a.examples, "k": a.k, "model": a.model,
           "regret_clip": 0.02, "score_share": 0.5, "clip": 1.0, "seeds": a.seeds, "draws_per_seed": a.draws,
           "summary": summary, "per_seed": per_seed, "seconds": round(time.time() - t0, 1)}
    if a.json:
        write_json(a.json, doc)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
