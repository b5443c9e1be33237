"""Does the ranking predict utility? The validity benchmark of issue 24.

Three private tasks from data that ships in installed packages (``benchmarks/validity/tasks.py``:
mnist-a, scikit-learn digits, scikit-image texture patches), each with six or seven public candidates
from the same distribution to unrelated. Downstream truth (``validity/truth.py``): GEP accuracy and
second-phase accuracy for every (task, candidate, seed), DP-SGD without public data per (task, seed),
at epsilon 2, seeds 0-4, each training cached as a JSON under ``benchmarks/results/validity/runs``.
Predictors (``validity/predictors.py``): GSD as today, its variants, DP-GSD, and the baselines of
``gsd_cli.distance.baselines``; each scored (``validity/scores.py``) by Spearman and Kendall against
the mean accuracy per task with bootstrap intervals over seeds, by "picked the best" and by "picked
one worse than no public data".

    python benchmarks/bench_validity.py train [--shard 0/2]     # the trainings (cached; resumable)
    python benchmarks/bench_validity.py predict                  # every predictor's values (cached)
    python benchmarks/bench_validity.py score                    # tables, plot, summary JSON

The held-out benchmark's rounds run and score under the same name: ``python -m benchmarks validity --round N
prepare|freeze|tune|run|status|score`` (``validity/heldout``).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_validity
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "validity"


def cmd_train(args) -> None:
    import torch

    from .validity.truth import jobs, run_file, train_one

    torch.set_num_threads(args.threads)
    i, n = (int(x) for x in args.shard.split("/"))
    todo = [j for k, j in enumerate(jobs(args.tasks, args.seeds)) if k % n == i]
    t0 = time.time()
    for k, job in enumerate(todo):
        if run_file(*job).is_file():
            continue
        d = train_one(*job)
        print(f"[{k + 1}/{len(todo)} {time.time() - t0:.0f}s] {job}: accuracy {d['accuracy']:.4f} "
              f"({d['seconds']:.0f} s, load {os.getloadavg()[0]:.1f})", flush=True)


def cmd_predict(args) -> None:
    from .validity.predictors import compute_all

    compute_all(args.tasks, args.seeds)


def cmd_score(args) -> None:
    from .validity.report import build, tables, write

    doc = build()
    write(doc)
    print(tables(doc))
    print(json.dumps(doc["selection"], indent=1))


def main(argv: list[str] | None = None) -> int | None:
    if argv and argv[0].startswith("--round"):  # the held-out benchmark's rounds (validity/heldout)
        from .validity.heldout.__main__ import main as rounds

        return rounds(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="python -m benchmarks validity --round N "
                                 "{prepare,freeze,tune,run,status,score}: the held-out benchmark's rounds (validity/heldout)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="run (or reuse) every downstream training")
    t.add_argument("--shard", default="0/1", help="I/N: this process runs every N-th job from the I-th")
    t.add_argument("--tasks", nargs="+", default=None)
    t.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    t.add_argument("--threads", type=int, default=1)
    p = sub.add_parser("predict", help="compute (or reuse) every predictor's values")
    p.add_argument("--tasks", nargs="+", default=None)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    sub.add_parser("score", help="score the predictors on the cached trainings: tables, plot, summary")
    args = ap.parse_args(argv)
    {"train": cmd_train, "predict": cmd_predict, "score": cmd_score}[args.cmd](args)


if __name__ == "__main__":
    main()
