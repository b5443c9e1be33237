"""python -m benchmarks validity.heldout.round6 (from the repository's root; python -m validity.heldout.round6 from
benchmarks/): split6 | tune | run | score."""

from __future__ import annotations

import argparse
import os


def _part(text: str) -> tuple[int, int]:
    i, n = (int(x) for x in text.split("/"))
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(f"--part I/N with 1 <= I <= N (got {text})")
    return i, n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog=f"python -m {__package__}", description="round 6 of the held-out benchmark (issue 52)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("split6", help="write split6.json: the protocol, once, before any run")
    for name, what in (("tune", "the tuning grid on the selection tasks -> tuned6.json"), ("run", "every cell of round 6")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--part", type=_part, default=(1, 1), help="I/N: only every N-th job from the I-th (parallel processes)")
    sc = sub.add_parser("score", help="figures and verdicts: benchmarks/results/heldout6_scores.{json,md}")
    sc.add_argument("--update-package", action="store_true", help="also write gsd_cli/report/heldout6.json (gsd rank's validity note)")
    a = ap.parse_args(argv)
    from ..prepare import data_dir

    os.environ.setdefault("GSD_LEDGER", str(data_dir() / "ledger.sqlite"))  # the benchmark's bookings, not the user's ledger
    if a.cmd == "split6":
        from .protocol import write_split6

        doc = write_split6()
        print(f"wrote split6.json: {len(doc['held_out'])} tasks, gsd under test {doc['gsd_cli_commit']}")
    elif a.cmd == "tune":
        from .run6 import run_tune

        print("tuned:", run_tune(a.part))
    elif a.cmd == "run":
        from .run6 import run

        run(part=a.part)
    else:
        from .score6 import main as score

        score(update_package=a.update_package)


if __name__ == "__main__":
    main()
