"""Which public set, which method, or none: the advice of ``gsd train --auto-select``, private and non-private.

One entry point per mode, in :mod:`gsd_cli.advice.select`: :func:`plan` (the non-private advice, and the DP
selection on GSD) and :func:`dp_plan` (the DP feature probe). Beside them, each module decides one thing:
:mod:`~gsd_cli.advice.decide` (the rules: noise references, the probe's test), :mod:`~gsd_cli.advice.probe` (the
feature probe), :mod:`~gsd_cli.advice.dp_probe` (the DP feature probe), :mod:`~gsd_cli.advice.gate` (the
probe-first gate's ranking), :mod:`~gsd_cli.advice.fallback` (the previous rule, a benchmark arm) and
:mod:`~gsd_cli.advice.warm` (the public work, done ahead). The advice sits above :mod:`gsd_cli.train`: it imports
the trainers' settings and the second phase's stage 1; the trainers never import it.

>>> from gsd_cli.advice import plan
>>> from gsd_cli.train import TrainConfig
>>> advice = plan(TrainConfig(method="auto"), "mnist-a", ["mnist-b", "digits"])  # doctest: +SKIP
>>> advice.config.public  # the set it trains with, or None                        # doctest: +SKIP
"""

from .select import Plan, advised_selection, auto_select, dp_plan, plan
from .decide import Decision
from .warm import WarmReport, warm_advice

__all__ = ["plan", "dp_plan", "Plan", "Decision", "auto_select", "advised_selection", "warm_advice", "WarmReport"]
