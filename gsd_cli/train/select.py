"""``gsd train --auto-select``: rank the candidates first, train with the closest."""

from __future__ import annotations

from typing import Sequence

from ..ranking import Ranking, rank
from .splits import private_parts


def auto_select(private: str, candidates: Sequence[str], *, private_test: str | None = None, **rank_options) -> Ranking:
    """Rank ``candidates`` by GSD to the private *training* part (the test part is never looked at)
    with :func:`gsd_cli.ranking.rank` and its options (``dp=True, epsilon=...`` for DP-GSD, whose
    budget the trainer adds to its ledger). The winner is ``ranking.results[0]``."""
    train_part, _ = private_parts(private, private_test)
    return rank(train_part, list(candidates), **rank_options)
