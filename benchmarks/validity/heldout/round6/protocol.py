"""Round 6's protocol (issue 52, item 3): the tasks, the split, the tuning, the arms, the metrics and the
pass/fail rule, written to ``split6.json`` by :func:`write_split6` and committed before the first run of the
round (the tuning on the selection tasks included). Nothing here may change after a result is seen: no task,
seed, arm or threshold is added or moved; a missed target is the result.

The tasks come from sources no earlier round used (:mod:`.prepare6`, ``SOURCES.md``): eight tasks of five kinds
(emoji, desktop icons, game sprites, planetary maps, brain MRI), each with six public candidates from other
sources; in one of them (``planets-grey``, an eighth: at most a quarter is allowed) a candidate is a transformed
copy of the private source. All eight are held out: nothing is chosen on them.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

SPLIT6 = Path(__file__).with_name("split6.json")
SEEDS = (0, 1, 2, 3, 4)
#: the run's total privacy budget, every DP arm (selection included)
EPSILON, DELTA = 2.0, 1e-5
#: the DP advice's share of the total: --auto-select --select-epsilon 0.5 --epsilon 2 (training: 1.5)
SELECT_EPSILON = 0.5
#: the tuning grid, the same for DP-SGD and for the second phase (the issue: the same effort): learning rate x
#: training length (epochs of the private training at batch 500). Three epochs is rounds 1-5's fixed length.
LRS = (0.5, 1.0, 2.0, 4.0)
EPOCHS = (3, 6, 12)
GRID = tuple({"lr": lr, "epochs": e} for e in EPOCHS for lr in LRS)
TUNE_METHODS = ("dpsgd", "second-phase")
TUNE_SEEDS = (0, 1, 2)

TUNING = ("DP-SGD and the second phase are each tuned over the same grid (learning rate 0.5, 1, 2, 4 x 3, 6, 12 epochs, "
          "12 points) on split.json's four selection tasks with seeds 0-2 (rounds 1-5's settings otherwise: epsilon 2, "
          "delta 1e-5, Poisson batches of 500, clip 1, momentum 0.9, step schedule; the second phase's stage 1: 2,000 "
          "public examples, 2 epochs, batch 64, Adam 3e-3, with each seed's ranking winner as in rounds 1-5). Each "
          "method takes the grid point with the best mean accuracy over those 12 runs (tuned6.json), and keeps it on "
          "every round-6 task and arm, the DP arms' trainings included")

ARMS = {
    "dpsgd": "DP-SGD alone at epsilon 2 (tuned)",
    "auto:probe": ("the non-private advice: gsd train --auto-select's decision at the commit under test "
                   "(gsd_cli.train.select.advised_selection with the default ranking model gsd_cli.train.select.RANK_MODEL, "
                   "the probe network at 224, k 16, 2,000 examples, 3 repeats, with the in-run noise references; then the "
                   "feature probe gsd_cli.train.probe, 3 draws), trained at epsilon 2 with the tuned settings. It reads the "
                   "private data without noise: not DP, its total epsilon is unbounded"),
    "auto:dp": ("the DP advice at equal total epsilon: gsd train --auto-select --select-epsilon 0.5 --epsilon 2 "
                "(gsd_cli.train.select.dp_advised_selection: the DP feature probe at epsilon 0.5 and delta 1e-6, then "
                "the training its decision names at epsilon 1.5 and delta 9e-6, tuned settings)"),
    "oracle": "the (method, candidate) among DP-SGD alone and the second phase with each candidate with the best mean "
              "accuracy over the task's seeds at epsilon 2 (an upper bound that reads the test sets; not an arm one can run)",
    "probe-pick": "the second phase with the candidate of the largest mean feature-probe gain (auto:probe's probe, "
                  "whatever its test), at epsilon 2",
    "random": "the second phase with a candidate drawn uniformly: the mean over the six candidates' accuracies, at epsilon 2",
}

METRICS = {
    "cell": "(task, seed); accuracy on the task's test part, in points",
    "no_harm": "cells where the arm's accuracy >= DP-SGD's - 0.5 points, over all 40 cells; reported with the cells "
               "where the arm chose DP-SGD itself and with always-DP-SGD's count (40/40)",
    "task_gain": "per task, the mean over seeds of (arm - DP-SGD); the mean over the 8 tasks with a 95% bootstrap "
                 "interval resampling tasks (2,000 draws, numpy default_rng keyed by the figure's name), the median "
                 "and the two largest tasks' share",
    "oracle_share": "mean task gain of the arm / mean task gain of the oracle, with the same task bootstrap "
                    "(the ratio of means in each draw)",
    "agreement": "cells where auto:dp's (method, public set) equals auto:probe's",
    "pick_vs_random": "per task, mean over seeds of (probe-pick - random); mean over tasks with the task-bootstrap interval",
}

#: the pass/fail rule (the issue's "Done when", on this round only)
TARGETS = {
    "auto:probe": {"no_harm_share": 0.90, "task_gain_ci_low_above": 0.0, "oracle_share": 0.50},
    "auto:dp": {"no_harm_share": 0.90, "oracle_share": 0.40, "agreement_share": 0.80},
    "probe-pick": {"vs_random_ci_low_above": 0.0},
}
RULE = ("Each target passes or misses on its own, as written in targets, computed by python -m validity.heldout.round6 "
        "score from the cached runs of all 40 cells; a target misses if its figure is below the threshold (an interval's "
        "low end not above 0). No task, seed, arm, threshold or grid point is added or changed after the first run; "
        "a miss is reported as the result")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _commit(paths: tuple[str, ...]) -> str:
    return subprocess.run(["git", "-C", str(SPLIT6.parent), "log", "-1", "--format=%H", "--", *paths],
                          capture_output=True, text=True, check=False).stdout.strip()


#: the gsd files whose last commit is the advice under test (their decisions; the defaults of gsd train do not
#: enter: every setting is explicit)
UNDER_TEST = ("../../../../gsd_cli/train/advice.py", "../../../../gsd_cli/train/probe.py", "../../../../gsd_cli/train/select.py",
              "../../../../gsd_cli/train/second_phase.py", "../../../../gsd_cli/train/dp_advice.py",
              "../../../../gsd_cli/privacy/probe_mechanism.py", "../../../../gsd_cli/ranking/reference.py")


def write_split6() -> dict:
    """Write ``split6.json`` (refuses to overwrite: the round is frozen before its first run): the tasks and their
    candidates, the SHA-256 of every npz file (the data cannot change after), the tuning, the arms, the metrics,
    the targets and the rule, and the gsd commit under test."""
    from ..tasks import split
    from .prepare6 import NAMES, TASKS, data_dir

    if SPLIT6.is_file():
        raise SystemExit(f"{SPLIT6} exists: round 6 is frozen")
    missing = [n for n in NAMES if not (data_dir() / f"{n}.npz").is_file()]
    if missing:
        raise SystemExit(f"missing {missing[:3]}...: python -m validity.heldout.round6.prepare6")
    doc = {
        "held_out": list(TASKS),
        "rule": ("round 6: every task is held out, from sources no earlier round used; defined, and this file committed, "
                 "before any training, ranking or probe run on them and before the round's tuning"),
        "gsd_cli_commit": _commit(UNDER_TEST),
        "seeds": list(SEEDS),
        "epsilon": EPSILON, "delta": DELTA, "select_epsilon": SELECT_EPSILON,
        "tuning": {"rule": TUNING, "selection_tasks": split()["selection"], "grid": list(GRID), "methods": list(TUNE_METHODS),
                   "seeds": list(TUNE_SEEDS)},
        "arms": ARMS, "metrics": METRICS, "targets": TARGETS, "pass_fail": RULE,
        "tasks": {n: {"kind": t.kind, "realistic": t.realistic, "transformed_source_candidate": t.source,
                      "private_train": t.train, "private_test": t.test, "model": t.model, "candidates": list(t.candidates)}
                  for n, t in TASKS.items()},
        "data_sha256": {n: _sha(data_dir() / f"{n}.npz") for n in NAMES},
        "note": "the commit that froze it: git log -1 --format=%H -- split6.json",
    }
    SPLIT6.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def read_split6() -> dict:
    if not SPLIT6.is_file():
        raise SystemExit(f"{SPLIT6} is missing: python -m validity.heldout.round6 split6 (before any run)")
    return json.loads(SPLIT6.read_text())
