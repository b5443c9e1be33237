"""The epsilon a training spends on the DP estimate of the private set's size, when no size is declared
(``--size-epsilon``, else :data:`SIZE_EPSILON_SHARE` of ``--epsilon``). Here, below the trainers, so
that the privacy ledger (:func:`gsd_cli.privacy.budget.book_size_estimate`) books the same epsilon that
:mod:`gsd_cli.train.size` spends (the estimate and its composition with the training: that module)."""

from __future__ import annotations

import math

from ..errors import GSDError

#: Share of ``--epsilon`` spent on the DP estimate of N when no size is declared.
SIZE_EPSILON_SHARE = 0.02


def size_epsilon(epsilon: float, declared: float | None) -> float:
    """The epsilon of the size estimate: ``declared`` (``--size-epsilon``), or
    :data:`SIZE_EPSILON_SHARE` of the run's ``epsilon``."""
    eps_n = SIZE_EPSILON_SHARE * float(epsilon) if declared is None else float(declared)
    if not (math.isfinite(eps_n) and 0 < eps_n < float(epsilon)):
        raise GSDError(f"--size-epsilon must be positive and below --epsilon {epsilon:g} (got {declared!r}); "
                       "or declare the size with --expected-size N or --sampling-rate q")
    return eps_n
