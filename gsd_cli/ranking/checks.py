"""CI checks on a ranking and the exit codes of ``gsd rank``.

Exit codes: 0 every check passed, 1 a check failed (``--fail-above``, ``--expect-best``), 2 bad usage
or input (unknown dataset, missing file, bad option, a full disk; one ``error:`` line), 3 an internal
error (a bug: one ``error: internal error: ...`` line; the traceback with ``gsd --debug`` or
``GSD_DEBUG=1``).
"""

from __future__ import annotations

import math
from typing import Sequence

from ..errors import GSDError

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def check_options(fail_above: float | None = None, expect_best: str | None = None,
                  candidates: Sequence[str] | None = None) -> None:
    """Refuse a check that can never mean anything, before any work: ``--fail-above`` NaN, infinite
    or negative; ``--expect-best`` naming none of ``candidates`` (when they are known)."""
    if fail_above is not None and not (math.isfinite(fail_above) and fail_above >= 0):
        raise GSDError(f"--fail-above {fail_above:g}: give a finite distance >= 0 (distances lie in [0, 1])")
    if expect_best is not None and not str(expect_best).strip():
        raise GSDError("--expect-best needs the name of a public candidate")
    if expect_best is not None and candidates is not None and expect_best not in candidates:
        names = list(dict.fromkeys(candidates))
        raise GSDError(f"--expect-best {expect_best} is not a candidate; give one of {', '.join(names)}")


def check_ranking(ranking, fail_above: float | None = None, expect_best: str | None = None) -> list[str]:
    """What failed, one line each (empty: all passed). ``fail_above``: the best distance must be at
    most this; ``expect_best``: this candidate must rank first."""
    failures = []
    best = ranking.winner
    if fail_above is not None and best.distance > fail_above:
        failures.append(f"{ranking.private}: best distance {best.distance:.4f} ({best.public}) is above {fail_above:g}")
    if expect_best is not None and best.public != expect_best:
        names = [r.public for r in ranking]
        where = f"ranks {names.index(expect_best) + 1}" if expect_best in names else "is not a candidate"
        failures.append(f"{ranking.private}: expected {expect_best} to rank first, but {best.public} wins ({expect_best} {where})")
    return failures
