"""A round's frozen results, in the repository beside the scores (``benchmarks/results/<results>/``):

* ``runs.jsonl``: every training, one line each, keyed by a hash of (task, method, candidate, every training
  setting, seed) (:func:`run_key`); each line records its settings, its accuracy and the gsd commit that made it;
* ``rankings/<task>-s<seed>[-<step>].json``: what each cell's steps computed (the rankings, the feature probe, the
  DP advice);
* ``decisions.jsonl``: each deciding arm's (method, public set[, epsilon, delta]) per cell, keyed by (task, arm,
  seed), recorded when the arm decided (rounds 1-6: the decisions their scorers re-applied, moved here).

A run or a step already recorded is reused whatever its commit, so an interrupted round resumes where it stopped.
Nothing here imports gsd.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from functools import cache
from pathlib import Path

from .spec import RESULTS, Round

REPO = RESULTS.parents[1]
#: what changed a method's runs since round 1 (part of their key: earlier runs are not reused)
METHOD_VERSION = {"second-phase": "head shared only with private classes by name (round 2)"}


@cache
def gsd_commit() -> str:
    """The commit of the checkout that runs gsd (``+dirty`` when gsd_cli/ has uncommitted changes)."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "gsd_cli"], capture_output=True, text=True, check=False).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def first_commit(path: Path) -> str:
    """The commit that added ``path`` (a frozen file), or "uncommitted"."""
    added = subprocess.run(["git", "-C", str(path.parent), "log", "--format=%H", "--diff-filter=A", "--", path.name],
                           capture_output=True, text=True, check=False).stdout.split()
    return added[-1] if added else "uncommitted"


def run_key(task: str, method: str, candidate: str | None, settings: dict, seed: int) -> str:
    doc = {"task": task, "method": method, "public": candidate, "settings": settings, "seed": int(seed)}
    if method in METHOD_VERSION:
        doc["version"] = METHOD_VERSION[method]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def append_line(path: Path, record: dict) -> None:
    """Append one record to a JSON-lines file (under an exclusive lock: parallel processes share the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
        fcntl.flock(f, fcntl.LOCK_UN)


def save_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def load_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def tuned(spec: Round, size: int | None = None) -> dict:
    """Each method's tuned grid point (the spec's tuning ``out`` file); a round tuned per private size (its file has
    ``sizes``) gives the points of ``size``."""
    path = RESULTS / spec.tuning["out"]
    if not path.is_file():
        raise SystemExit(f"{path} is missing: python -m benchmarks validity --round {spec.round} tune")
    doc = json.loads(path.read_text())
    if "sizes" in doc:
        if str(size) not in doc["sizes"]:
            raise SystemExit(f"{path} has no tuned points for {size} private examples (it has {sorted(doc['sizes'])})")
        doc = doc["sizes"][str(size)]
    return {m: d["chosen"] for m, d in doc["methods"].items()}


def step_file(steps_dir: Path, task: str, seed: int, step: str) -> Path:
    """A step's record of a cell (the plain ranking, ``rank``: ``<task>-s<seed>.json``)."""
    return steps_dir / f"{task}-s{seed}{'' if step in ('', 'rank') else '-' + step}.json"


class Results:
    """One round's results, read: the runs at the tuned settings by (task, method, public, seed, epsilon), the
    steps' files and the decisions by (task, arm, seed)."""

    def __init__(self, spec: Round):
        self.spec, self.dir = spec, spec.results_dir
        self.runs_file, self.decisions_file, self.steps_dir = (self.dir / "runs.jsonl", self.dir / "decisions.jsonl",
                                                               self.dir / "rankings")
        sizes = sorted({t.size for t in spec.tasks.values()}, key=lambda n: n or 0)
        self.by_size = {n: tuned(spec, n) for n in sizes}
        self.tuned = self.by_size[sizes[0]] if sizes == [None] else {str(n): v for n, v in self.by_size.items()}
        self.runs = {r["key"]: r for r in read_lines(self.runs_file)}
        self.accuracy, self.commits = {}, set()
        for r in self.runs.values():  # a later run of the same cell and settings replaces an earlier one
            if r["task"] in spec.tasks and self._tuned(r):
                self.accuracy[(r["task"], r["method"], r["public"], r["seed"], float(r["settings"]["epsilon"]))] = 100.0 * r["accuracy"]
                self.commits.add(r["commit"])
        self.decisions = {(d["task"], d["arm"], d["seed"]): d for d in read_lines(self.decisions_file)}
        self._steps: dict = {}

    def _tuned(self, record: dict) -> bool:
        hp = self.by_size[self.spec.tasks[record["task"]].size]
        want = {**({"epochs": self.spec.base["epochs"]} if "epochs" in self.spec.base else {}), **hp.get(record["method"], {})}
        return all(record["settings"].get(k) == v for k, v in want.items())

    def acc(self, task: str, method: str, public: str | None, seed: int, epsilon: float | None = None) -> float | None:
        """A run's test accuracy in points (None if it is not recorded)."""
        return self.accuracy.get((task, method, public, seed, float(self.spec.epsilon if epsilon is None else epsilon)))

    def step(self, task: str, seed: int, step: str) -> dict | None:
        """What a step recorded for a cell (None if it has not run)."""
        key = (task, seed, step)
        if key not in self._steps:
            self._steps[key] = load_json(step_file(self.steps_dir, task, seed, step))
        return self._steps[key]

    def decision(self, task: str, arm: str, seed: int) -> dict | None:
        return self.decisions.get((task, arm, seed))
