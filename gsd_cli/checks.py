"""CI checks on a ranking and the exit codes of ``gsd rank``.

Exit codes: 0 every check passed, 1 a check failed (``--fail-above``, ``--expect-best``), 2 bad usage
or input (unknown dataset, missing file, bad option; one ``error:`` line).
"""

from __future__ import annotations

EXIT_OK, EXIT_CHECK_FAILED, EXIT_USAGE = 0, 1, 2


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
