"""Claimed against empirical epsilon for every trainer and DP-GSD (issue 20), and the audits' teeth.

Trainers: the one-run white-box canary audit (``gsd_cli.audit.audit_training``; Steinke,
Nasr, Jagielski 2023) at each claimed epsilon, with m canaries, T steps at Poisson rate q, on the
default Linear audit model beside 64 synthetic examples; every audit draws its secret randomness
from the OS unless ``--insecure-seed``. Bugs: the same audits with an injected bug (noise halved,
noise quartered, clip removed, GEP's residual noise dropped). DP-GSD: the distinguishing audit with
``--draws`` draws per neighbour (p = 2 and 3) and the exact loss of the pair, correct and with the
old public-seed bug. Each row records its wall time.

    python benchmarks/bench_audit.py --json benchmarks/results/cpu_audit.json
    python benchmarks/bench_audit.py --epsilons 8 --methods dpsgd --canaries 1000 5000 20000    # tightness against m
    python benchmarks/bench_audit.py --table benchmarks/results/cpu_audit.json                    # README table
    python benchmarks/bench_audit.py --methods dp-energy --epsilons 0.5 2 8 --json benchmarks/results/cpu_audit_dp_energy.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_audit
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import platform
import time

from gsd_cli.audit import audit

from .harness import add_json, write_json

GEP = {"k": 8, "clip_embedding": 1.0, "clip_residual": 1.0}
SETTINGS = {"gep": GEP, "gep+rs": GEP, "rgp": {"rgp_warmup": 0}}
BUGS = [("dpsgd", "noise-halved"), ("dpsgd", "noise-quartered"), ("dpsgd", "no-clip"), ("topagg", "no-clip"), ("gep", "gep-no-residual-noise"),
        ("dp-energy", "half-scale"), ("dp-energy", "public-seed")]
RANKINGS = ("dpgsd", "dp-energy")  # audited by draws per neighbour (--draws), not canaries


def run(args) -> dict:
    rows = []

    def one(method, eps, m, bug=None, **kw):
        t = time.perf_counter()
        r = audit(method, eps, args.delta, canaries=m, insecure_seed=args.insecure_seed, bug=bug,
                  **({} if method in RANKINGS else {"settings": SETTINGS.get(method, {}), "steps": args.steps,
                                                     "sampling_rate": args.sampling_rate}), **kw)
        row = {**r.to_dict(), "seconds": round(time.perf_counter() - t, 2)}
        rows.append(row)
        print(f"{method:13s} bug={str(bug):22s} m={m:6d} claimed {r.claimed_epsilon:6.3f} empirical {r.epsilon_lower_bound:6.3f} "
              f"({r.correct}/{r.guesses}) {row['seconds']:.1f}s", flush=True)

    for eps in args.epsilons:
        for method in args.methods:
            for m in args.canaries:
                for _ in range(args.repeats):
                    if method == "dpgsd":
                        for p in (2, 3):
                            one(method, eps, args.draws, p=p)
                    elif method == "dp-energy":  # the Laplace mechanism and gsd rank --dp end to end
                        one(method, eps, args.draws, trials=args.trials)
                    else:
                        one(method, eps, m)
    if args.bugs:
        for method, bug in BUGS:
            if method in args.methods:
                one(method, 2.0, args.draws if method in RANKINGS else 1000, bug, **({"trials": args.trials} if method == "dp-energy" else {}))
        if "dpgsd" in args.methods:
            one("dpgsd", 2.0, 300, "public-seed")
    return {"rows": rows, "platform": platform.platform(), "cpus": os.cpu_count(), "load": os.getloadavg(), "args": vars(args)}


def table(paths) -> str:
    lines = ["| method | bug | claimed epsilon | empirical lower bound (95%) | canaries / draws | correct | exact loss | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for path in paths:
        for r in json.load(open(path))["rows"]:
            d = r.get("details") or {}
            exact = (f"{d['exact_loss']:.3f}" + (f" (p={d['p']})" if "p" in d else "")) if "exact_loss" in d else ""
            lines.append(f"| {r['method']} | {d.get('bug') or ''} | {r['claimed_epsilon']:.2f} | {r['epsilon_lower_bound']:.2f} | "
                         f"{r['canaries']} | {r['correct']}/{r['guesses']} | {exact} | {r['seconds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", nargs="+", default=["dpsgd", "gep", "rgp", "topagg", "second-phase", "dpsgd+rs", "gep+rs", "dpgsd", "dp-energy"])
    ap.add_argument("--epsilons", nargs="+", type=float, default=[2.0, 8.0])
    ap.add_argument("--canaries", nargs="+", type=int, default=[1000])
    ap.add_argument("--draws", type=int, default=4000, help="DP-GSD, dp-energy: draws per neighbour")
    ap.add_argument("--trials", type=int, default=15, help="dp-energy: rankings per neighbour of the pipeline audit")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--sampling-rate", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--insecure-seed", type=int, default=None)
    ap.add_argument("--no-bugs", dest="bugs", action="store_false")
    add_json(ap)
    ap.add_argument("--table", nargs="+")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return
    res = run(args)
    if args.json:
        write_json(args.json, res, indent=2, default=float)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
