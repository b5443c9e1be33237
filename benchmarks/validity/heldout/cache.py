"""The held-out benchmark's caches, in the repository beside the results: every training run as one
line of ``benchmarks/results/heldout/runs.jsonl`` and every ranking as one JSON file under
``rankings/``, so that an interrupted stage resumes where it stopped.

A run's key is a hash of (task, method, candidate, every training setting, seed); each line also
records the gsd commit that made it (``git rev-parse HEAD``, ``+dirty`` when ``gsd_cli/`` had
uncommitted changes). A run is reused whatever its commit (the commits are listed by ``score``): other
work lands on gsd while the benchmark runs, and none of it may silently restart the benchmark.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "benchmarks" / "results" / "heldout"
RUNS = RESULTS / "runs.jsonl"
RANKINGS = RESULTS / "rankings"


@cache
def gsd_commit() -> str:
    """The commit of the checkout that runs gsd (``+dirty`` when gsd_cli/ has uncommitted changes)."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "gsd_cli"], capture_output=True, text=True, check=False).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


#: what changed a method's runs since round 1 (part of their key: earlier runs are not reused)
METHOD_VERSION = {"second-phase": "head shared only with private classes by name (round 2)"}


def run_key(task: str, method: str, candidate: str | None, settings: dict, seed: int) -> str:
    doc = {"task": task, "method": method, "public": candidate, "settings": settings, "seed": int(seed)}
    if method in METHOD_VERSION:
        doc["version"] = METHOD_VERSION[method]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def load_runs(path: Path = RUNS) -> dict[str, dict]:
    """Every cached run of the runs file ``path`` by key (a later line of the same key wins)."""
    out: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                out[d["key"]] = d
    return out


def append_run(record: dict, path: Path = RUNS) -> None:
    """Append one run to the runs file ``path`` (one line, under an exclusive lock: processes may share the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(json.dumps(record, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
        fcntl.flock(f, fcntl.LOCK_UN)


def ranking_file(task: str, seed: int, kind: str = "") -> Path:
    """``kind`` "": auto-select's ranking; "advised": gsd_cli.train.select.advised_selection's (with the
    in-run noise reference and repeats)."""
    return RANKINGS / f"{task}-s{seed}{'-' + kind if kind else ''}.json"


def load_ranking(task: str, seed: int, kind: str = "") -> dict | None:
    f = ranking_file(task, seed, kind)
    return json.loads(f.read_text()) if f.is_file() else None


def save_ranking(task: str, seed: int, doc: dict, kind: str = "") -> None:
    f = ranking_file(task, seed, kind)
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, f)
