"""``gsd train --auto-select``: rank the candidates first, train with the closest."""

from __future__ import annotations

from typing import Sequence

from ..ranking import Ranking, rank
from .splits import private_parts


def auto_select(private: str, candidates: Sequence[str], *, private_test: str | None = None, catalog=None, **rank_options) -> Ranking:
    """Rank ``candidates`` by GSD to the private *training* part (the test part is never looked at)
    with :func:`gsd_cli.ranking.rank` and its options (``dp=True, epsilon=...`` for DP-GSD, whose
    budget the trainer adds to its ledger). The winner is ``ranking.results[0]``. ``catalog``
    (a :class:`gsd_cli.ranking.catalog.Catalog`) resolves the names it defines."""
    train_part, _ = private_parts(private, private_test, catalog)
    pubs = [catalog.resolve(c) for c in candidates] if catalog is not None else list(candidates)
    return rank(train_part, pubs, **rank_options)
