"""A disk cache of calibrated noise multipliers: :func:`gsd_cli.privacy.calibrate_noise` runs Brent's
method over the accountant (1-3 s with RDP, 3-20 s with PLD on a 2-core CPU); the same
(epsilon, delta, q, T, mechanism, accountant) always gives the same sigma, so it is kept.

An entry is a JSON file ``<sha256 of the key>.json`` in ``calibration/`` under the cache folder
(:func:`gsd_cli.ranking.cache.default_cache_dir`: ``$GSD_CACHE_DIR``, else ``$XDG_CACHE_HOME/gsd/subspaces``,
else ``~/.cache/gsd/subspaces``). The key holds every input of the calibration: the target epsilon,
delta, sampling rate, steps, accountant, the per-step event at two noise multipliers (its shape as a
function of sigma), the RDP orders, the calibration's own version and the installed dp-accounting
version, each float written exactly (``repr``).

**A cached sigma is never trusted.** On read the entry must parse, have this schema and exactly this
key, and hold a finite positive sigma; then the accountant is run once at that sigma, and the entry is
used only when the epsilon it gives is at most the target (so a wrong value, whatever its cause, can
never weaken privacy) and within :data:`TIGHT` of it (so a sigma far too large, which would only cost
accuracy, is not used either: calibration lands within 3e-5 of the target). Anything else is ignored,
recalibrated and rewritten. Writes are atomic (a temporary file, then a rename); a folder that cannot
be written costs nothing but the time (the sigma is calibrated again next time).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Callable

SCHEMA = 1
#: a cached sigma is used only when its epsilon is in [target * (1 - TIGHT), target]
TIGHT = 1e-3


def calibration_dir() -> Path | None:
    """``calibration/`` under the cache folder of :func:`gsd_cli.ranking.cache.default_cache_dir` (None: there
    is no usable cache folder, and then nothing is cached)."""
    from ..data.roots import CALIBRATION_SUBFOLDER, default_cache_dir

    base = default_cache_dir()
    return None if base is None else base / CALIBRATION_SUBFOLDER


def dp_accounting_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dp-accounting")
    except PackageNotFoundError:  # pragma: no cover - installed from source
        return "unknown"


class CalibrationCache:
    """Calibrated sigmas on disk under ``directory`` (default :func:`calibration_dir`)."""

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory).expanduser() if directory is not None else calibration_dir()

    def path(self, key: dict) -> Path | None:
        if self.directory is None:  # no usable cache folder: nothing is read or written
            return None
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
        return self.directory / f"{digest}.json"

    def get(self, key: dict, epsilon_at: Callable[[float], float], target: float) -> float | None:
        """The cached sigma for ``key`` when the entry is sound and ``epsilon_at(sigma)`` (one
        accountant evaluation) is within [target (1 - TIGHT), target]; else None."""
        if self.directory is None:
            return None
        try:
            entry = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # absent, unreadable, not JSON (UnicodeDecodeError is a ValueError)
            return None
        if not isinstance(entry, dict) or entry.get("schema") != SCHEMA or entry.get("key") != key:
            return None
        sigma = entry.get("sigma")
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not math.isfinite(sigma) or sigma <= 0:
            return None
        sigma = float(sigma)
        eps = epsilon_at(sigma)
        if not (target * (1 - TIGHT) <= eps <= target):
            return None
        return sigma

    def put(self, key: dict, sigma: float, epsilon: float) -> bool:
        """Write the entry atomically; False (and nothing raised) when the folder cannot be written."""
        entry = {"schema": SCHEMA, "key": key, "sigma": float(sigma), "epsilon": float(epsilon)}
        if self.directory is None:
            return False
        target = self.path(key)
        tmp = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=target.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entry, f, sort_keys=True)
            os.replace(tmp, target)
            return True
        except OSError:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            return False
