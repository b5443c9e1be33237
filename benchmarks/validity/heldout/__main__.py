"""python -m benchmarks validity.heldout (from the repository's root; python -m validity.heldout from benchmarks/):
prepare | split | rank | run | score | all."""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    from .tasks import ROUND_STAGES, ROUNDS

    ap = argparse.ArgumentParser(prog=f"python -m {__package__}", description="the held-out benchmark of issue 42")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="build the npz files (benchmark-only packages)").add_argument("--force", action="store_true")
    sub.add_parser("split", help="write split.json (once, before any run)")
    for n in ROUNDS:
        sub.add_parser(f"split{n}", help=f"write split{n}.json: round {n}'s tasks, all held out (once, before any run on them)")
    r = sub.add_parser("rank", help="auto-select's ranking of each task's candidates, per seed (cached)")
    r.add_argument("--stage", choices=("selection", "held-out", *ROUND_STAGES), required=True)
    r.add_argument("--advised", action="store_true", help="gsd_cli.train.select.advised_selection's ranking and decision (noise reference, repeats)")
    r.add_argument("--probe", action="store_true", help="the feature probe of the second phase (gsd_cli.train.probe)")
    r.add_argument("--native", action="store_true", help="with --advised: the probe network at the training model's side "
                   "(arms.native_model: probe@73 here), not at 224 (issue 53's proposal)")
    r = sub.add_parser("run", help="the trainings of a stage (cached, resumable)")
    r.add_argument("--stage", choices=("tune", "selection", "held-out", *ROUND_STAGES), required=True)
    r.add_argument("--methods", nargs="+", choices=("dpsgd", "gep", "second-phase"), help="only these methods' runs")
    sub.add_parser("stops", help="issue 53's repeat rule replayed on every held-out cell's cached draws (no training)")
    s = sub.add_parser("score", help="tables and figures: benchmarks/results/heldout_*.{json,md}")
    s.add_argument("--partial", action="store_true", help="score whatever cells are complete")
    s.add_argument("--update-package", action="store_true",
                   help="also write gsd_cli/report/heldout.json (the validity note under gsd rank's GSD tables)")
    sub.add_parser("all", help="rank, tune, run and score both stages in order")
    a = ap.parse_args(argv)
    import os

    from .prepare import data_dir

    os.environ.setdefault("GSD_LEDGER", str(data_dir() / "ledger.sqlite"))  # the benchmark's bookings, not the user's ledger
    if a.cmd == "prepare":
        from .prepare import build, data_dir

        for n, k in build(a.force).items():
            print(f"{data_dir() / (n + '.npz')}: {k} examples")
    elif a.cmd == "split":
        from .tasks import write_split

        print(write_split())
    elif a.cmd in {f"split{n}" for n in ROUNDS}:
        from .tasks import write_round

        print(write_round(int(a.cmd[-1])))
    elif a.cmd == "rank":
        from .arms import rank_stage

        rank_stage(a.stage, a.advised, a.probe, a.native)
    elif a.cmd == "run":
        from .arms import run_stage, tuned

        run_stage(a.stage, a.methods)
        if a.stage == "tune":
            print("tuned:", tuned())
    elif a.cmd == "stops":
        from .stops import main as stops

        stops([])
    elif a.cmd == "score":
        from .score import main as score

        score(partial=a.partial, update_package=a.update_package)
    elif a.cmd == "all":
        from .arms import rank_stage, run_stage, tuned
        from .score import main as score

        rank_stage("selection")
        run_stage("tune")
        print("tuned:", tuned(), flush=True)
        run_stage("selection")
        score(partial=True)
        rank_stage("held-out")
        run_stage("held-out")
        score(partial=False)


if __name__ == "__main__":
    main()
