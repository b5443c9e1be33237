"""What every benchmark shares (issue 51): the environment record its results carry, the results file,
and the options most of them take.

    from .harness import add_json, loadavg, write_json

    def main(argv: list[str] | None = None) -> None:
        ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        add_json(ap)                                      # --json PATH
        a = ap.parse_args(argv)
        before = loadavg()
        doc = {...}                                       # the benchmark's own keys, as before
        write_json(a.json, doc, loadavg_before=before)    # doc plus "env": env_record(before)

The record (:func:`env_record`) is one key, ``env``, beside the benchmark's own keys, so a result file
written before it stays comparable key for key. Standard library only at import: ``python -m benchmarks
--help`` and the benchmarks' child processes import this module; torch and gsd_cli are read when a record
is made.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

#: the repository (the folder that holds ``benchmarks/``, ``gsd_cli/`` and ``probes/``)
ROOT = Path(__file__).resolve().parents[1]
#: where the committed results live
RESULTS = ROOT / "benchmarks" / "results"


def loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages now (None where the platform has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


#: the load when this module was first imported, i.e. when the benchmark started: the record's
#: ``loadavg_before`` unless the benchmark gives its own
_LOAD_AT_START = loadavg()


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def gpu_name() -> str | None:
    """The name of the first CUDA device (``mps`` on Apple silicon), or None."""
    torch = _torch()
    if torch is None:
        return None
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            return "mps"
    except Exception:  # a broken driver is not the benchmark's failure
        return None
    return None


def git_commit() -> str | None:
    """HEAD of the checkout the benchmarks run from, ``+dirty`` when its code (gsd_cli/, probes/,
    benchmarks/ but its results) has uncommitted changes; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--",
                                "gsd_cli", "probes", "benchmarks", ":(exclude)benchmarks/results"],
                               capture_output=True, text=True, check=False).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def gsd_version() -> str | None:
    try:
        import gsd_cli
    except ImportError:
        return None
    return getattr(gsd_cli, "__version__", None)


def env_record(loadavg_before: list[float] | tuple | None = None) -> dict:
    """Where and how a result was measured: the load average before (``loadavg_before``, else the load
    when the benchmark started) and now, the threads (``OMP_NUM_THREADS``, torch's intra-op threads), the
    cores, the Python, torch and gsd versions, the git commit, the GPU (None without one), the platform,
    the command line and the time (UTC)."""
    torch = _torch()
    return {
        "loadavg_before": [round(float(x), 2) for x in loadavg_before] if loadavg_before is not None else _LOAD_AT_START,
        "loadavg_after": loadavg(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": getattr(torch, "__version__", None),
        "gsd": gsd_version(),
        "git_commit": git_commit(),
        "gpu": gpu_name(),
        "platform": platform.platform(),
        "argv": list(sys.argv),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def write_json(path: str | os.PathLike | None, doc: dict, *, loadavg_before: list[float] | tuple | None = None,
               indent: int = 1, default=None) -> Path | None:
    """Write ``doc`` and its environment record (key ``env``) to ``path`` as JSON (one write: a
    temporary file beside it, then renamed; its folder made if missing). ``path`` None or empty: nothing
    is written (a benchmark without ``--json``). Returns the path written."""
    if not path:
        return None
    p = Path(path)
    out = {**doc, "env": env_record(loadavg_before)}
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(out, indent=indent, default=default) + "\n")
    os.replace(tmp, p)
    return p


# ---------------------------------------------------------------------------------- common options


def add_json(ap: argparse.ArgumentParser, default: str | None = None, help: str | None = None) -> argparse.ArgumentParser:
    """``--json PATH``: where the results go (with the environment record)."""
    ap.add_argument("--json", default=default, metavar="PATH",
                    help=help or "write the results, with the environment record (benchmarks/harness.py), to this JSON file")
    return ap


def add_seed(ap: argparse.ArgumentParser, default: int = 0, help: str | None = None) -> argparse.ArgumentParser:
    """``--seed N``: the seed of the benchmark's draws."""
    ap.add_argument("--seed", type=int, default=default, help=help or f"seed of the draws (default {default})")
    return ap


def add_rounds(ap: argparse.ArgumentParser, default: int, help: str | None = None) -> argparse.ArgumentParser:
    """``--rounds N``: how many times the measured runs are repeated."""
    ap.add_argument("--rounds", type=int, default=default, help=help or f"rounds of the measured runs (default {default})")
    return ap


# ---------------------------------------------------------------------------------- child processes


def child_env(env: dict | None = None) -> dict:
    """``env`` (default: this process's environment) with the repository first on ``PYTHONPATH``, so that
    a child started by :func:`module_command` imports this checkout's ``benchmarks`` package (not
    another one installed under that name) wherever it is started from."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def module_command(module: str, *args: str) -> list[str]:
    """The command that runs ``module`` (a dotted name, e.g. a benchmark's ``__spec__.name``) in a fresh
    Python: ``python -m MODULE ARGS``; start it with :func:`child_env`."""
    return [sys.executable, "-m", module, *args]
