"""Wall time per stage of a command, for benchmarks only: with ``$GSD_STAGE_TIMES`` set to a file, the
process adds each stage's seconds (``with stage(name):``, summed over calls and threads) and writes them
there as JSON when it exits. Unset (the default), :func:`stage` costs one dictionary lookup and nothing is
written. The times of stages that read private data grow with its size: they are never printed or put in
a run's outputs, only in that file (``benchmarks/bench_auto_select_cost.py`` reads it)."""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager

ENV = "GSD_STAGE_TIMES"
_TIMES: dict[str, float] = {}
_LOCK = threading.Lock()
_REGISTERED = {"done": False}


def _write() -> None:
    path = os.environ.get(ENV)
    if path:
        with open(path, "w") as f:
            json.dump({k: round(v, 3) for k, v in _TIMES.items()}, f, indent=1)


@contextmanager
def stage(name: str):
    """Time the block as ``name`` when ``$GSD_STAGE_TIMES`` is set; otherwise do nothing."""
    if not os.environ.get(ENV):
        yield
        return
    if not _REGISTERED["done"]:
        import atexit

        _REGISTERED["done"] = True
        atexit.register(_write)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        with _LOCK:
            _TIMES[name] = _TIMES.get(name, 0.0) + time.perf_counter() - t0
