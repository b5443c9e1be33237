"""The default datasets of ``gsd rank`` and ``gsd train``, and the settings of ``gsd train --auto-select``'s advice,
in a module that imports nothing, so that the CLI's help text can name them without loading torch
(:mod:`gsd_cli.data.embedded` defines the sets) and every layer that states the advice reads one home."""

from dataclasses import dataclass

DEFAULT_PRIVATE = "mnist-a"
DEFAULT_PUBLIC = ("mnist-b", "digits", "mnist-inverted", "textures", "faces", "noise")


@dataclass(frozen=True)
class AdviceSettings:
    """The advice's fixed settings (set before any benchmark run; :mod:`gsd_cli.advice.decide`): the one-sided
    significance level of its tests, the ranking's draws (the paired test against the noise references,
    :func:`gsd_cli.ranking.reference.closer_than_reference`), the feature probe's draws
    (:mod:`gsd_cli.advice.probe`), and the public examples per private class the second phase needs."""

    alpha: float = 0.05
    rank_repeats: int = 3
    probe_draws: int = 3
    per_class: int = 100


ADVICE = AdviceSettings()
