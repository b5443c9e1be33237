"""The power of each privacy audit: the smallest noise reduction it detects at 95% (issue 32).

For each audit and each injected noise factor f (every Gaussian noise std times f; f = 1 is the
correct code), ``--repeats`` independent audits with secret randomness; a detection is an audit
whose 95% lower bound exceeds the claimed epsilon. The smallest reduction an audit "detects at 95%"
is the largest f < 1 whose detection rate is at least 95% (and the rate at f = 1 is the audit's false
alarm rate, at most 5% by construction). DP-GSD's audits are run against the bug they target (the
private draw seeded from the public --seed), with their detection rate.

    python benchmarks/bench_audit_power.py --json benchmarks/results/cpu_audit_power.json
    python benchmarks/bench_audit_power.py --table benchmarks/results/cpu_audit_power.json     # README table
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_audit_power
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import platform
import time

from gsd_cli.audit import audit, audit_config, audit_dpgsd, audit_dpgsd_pipeline, audit_step

from .harness import add_json, write_json

FACTORS = {1.0: None, 0.9: "noise-x0.9", 0.8: "noise-x0.8", 0.7: "noise-x0.7", 0.5: "noise-halved", 0.25: "noise-quartered"}


def run(args) -> dict:
    rows = []

    def record(name, factor, results, seconds):
        det = sum(not r.consistent for r in results) / len(results)
        rows.append({"audit": name, "noise_factor": factor, "repeats": len(results), "detection_rate": det,
                     "lower_bounds": [r.epsilon_lower_bound for r in results], "claimed": results[0].claimed_epsilon,
                     "seconds_per_audit": round(seconds / len(results), 3)})
        print(f"{name:38s} f={factor!s:5s} detected {det:5.0%} of {len(results)}  "
              f"({seconds / len(results):.2f} s each)", flush=True)

    cfg = audit_config("dpsgd", args.epsilon, args.delta)
    for trials in args.step_trials:
        for f, bug in FACTORS.items():
            t = time.perf_counter()
            res = [audit_step(cfg, trials=trials, bug=bug) for _ in range(args.repeats)]
            record(f"dpsgd step, {trials} trials", f, res, time.perf_counter() - t)
    for f, bug in FACTORS.items():
        t = time.perf_counter()
        res = [audit("dpsgd", args.epsilon, args.delta, canaries=args.canaries, bug=bug, steps=1, sampling_rate=1.0)
               for _ in range(args.one_run_repeats)]
        record(f"dpsgd one-run, {args.canaries} canaries", f, res, time.perf_counter() - t)
    for bug in (None, "public-seed"):
        t = time.perf_counter()
        res = [audit_dpgsd(args.epsilon, draws=args.draws, bug=bug) for _ in range(args.repeats)]
        record(f"dpgsd sampler, {args.draws} draws" + (" [public-seed bug]" if bug else ""), 1.0, res, time.perf_counter() - t)
    for bug in (None, "public-seed"):
        t = time.perf_counter()
        res = [audit_dpgsd_pipeline(args.pipeline_epsilon, trials=args.pipeline_trials, bug=bug) for _ in range(args.pipeline_repeats)]
        record(f"dpgsd pipeline, {args.pipeline_trials} trials" + (" [public-seed bug]" if bug else ""), 1.0, res,
               time.perf_counter() - t)
    return {"rows": rows, "platform": platform.platform(), "cpus": os.cpu_count(), "load": os.getloadavg(), "args": vars(args)}


def table(path) -> str:
    doc = json.load(open(path))
    by = {}
    for r in doc["rows"]:
        by.setdefault(r["audit"], []).append(r)
    lines = ["| audit | false alarms (f = 1) | detection at f = 0.9 / 0.8 / 0.7 / 0.5 / 0.25 | smallest reduction detected at 95% |",
             "|---|---|---|---|"]
    for name, rs in by.items():
        if "dpgsd" in name:
            continue
        rate = {r["noise_factor"]: r["detection_rate"] for r in rs}
        found = [f for f in sorted(rate, reverse=True) if f < 1 and rate[f] >= 0.95]
        cells = " / ".join(f"{rate.get(f, float('nan')):.0%}" for f in (0.9, 0.8, 0.7, 0.5, 0.25))
        lines.append(f"| {name} | {rate.get(1.0, 0):.0%} | {cells} | {'noise x %g' % found[0] if found else 'none of these'} |")
    for name, rs in by.items():
        if "dpgsd" in name:
            lines.append(f"| {name} | - | detected in {rs[0]['detection_rate']:.0%} of {rs[0]['repeats']} | - |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--step-trials", type=int, nargs="+", default=[20_000, 200_000])
    ap.add_argument("--canaries", type=int, default=1000)
    ap.add_argument("--one-run-repeats", type=int, default=10)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--pipeline-epsilon", type=float, default=0.5)
    ap.add_argument("--pipeline-trials", type=int, default=12)
    ap.add_argument("--pipeline-repeats", type=int, default=3)
    add_json(ap)
    ap.add_argument("--table", default=None, help="print the README table of a results JSON and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return
    doc = run(args)
    if args.json:
        write_json(args.json, doc, indent=1)
        print(table(args.json))


if __name__ == "__main__":
    main()
