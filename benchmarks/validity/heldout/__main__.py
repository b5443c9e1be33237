"""python -m benchmarks validity --round N prepare | freeze | tune | run | status | score (from the repository's
root; ``python -m benchmarks validity.heldout --round N ...`` is the same): the held-out benchmark's rounds, each
run and scored from its spec (``benchmarks/validity/heldout/rounds/round<N>.json``)."""

from __future__ import annotations

import argparse

PROG = "python -m benchmarks validity"


def _part(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--part I/N, two integers (got {text})") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"--part I/N with 1 <= I <= N (got {text})")
    return i, n


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=PROG, description="the held-out benchmark's rounds: one runner and one scorer, "
                                 "each round a spec (benchmarks/validity/heldout/rounds/round<N>.json) and its frozen results")
    ap.add_argument("--round", type=int, required=True, help="the round (a spec rounds/round<N>.json)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("prepare", help="the round's npz files (benchmark-only packages)").add_argument("--force", action="store_true")
    sub.add_parser("freeze", help="the round's frozen file (once, committed before its first run)")
    for name, what in (("tune", "the tuning grid, then the tuned file"), ("run", "every cell: trainings, steps, decisions")):
        sub.add_parser(name, help=what).add_argument("--part", type=_part, default=(1, 1),
                                                     help="I/N: every N-th job from the I-th (N parallel processes)")
    sub.add_parser("status", help="the complete and missing cells, from the results alone")
    s = sub.add_parser("score", help="figures and targets: benchmarks/results/<out>.{json,md}")
    s.add_argument("--partial", action="store_true", help="score the complete cells of an unfinished round")
    s.add_argument("--update-package", action="store_true", help="also write the figures gsd rank --validity quotes (gsd_cli/report/)")
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    from . import run
    from .spec import load

    if a.cmd in ("status", "score"):
        from . import report, score

        spec = load(a.round)
        if a.cmd == "status":
            print("\n".join(score.status(spec)))
        else:
            print(report.write(spec, score.build(spec, a.partial), a.update_package))
    elif a.cmd == "prepare":
        for name, n in run.prepare(a.round, a.force).items():
            print(f"{name}: {n} examples")
    elif a.cmd == "freeze":
        run.freeze(a.round)
        print(f"wrote {load(a.round).frozen_path}: commit it before the round's first run")
    elif a.cmd == "tune":
        from . import tuning

        print("tuned:", tuning.tune(a.round, a.part))
    else:
        run.run(a.round, a.part)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
