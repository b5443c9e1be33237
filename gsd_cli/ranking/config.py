"""A ranking's settings as objects: what the CLI, catalogues and the Python API build and pass whole.

>>> from gsd_cli.ranking import RankConfig
>>> cfg = RankConfig.from_options(k=8, examples=500, dp=True, epsilon=2.0)
>>> cfg.gradients.k, cfg.privacy.epsilon, cfg.distance_name
(8, 2.0, 'dp-select')

Four small frozen groups: the probe model and its parameters (:class:`ModelSettings`), how the
gradients and subspaces are computed (:class:`GradientSettings`), what is private and how
(:class:`PrivacySettings`), and the ranking itself (:class:`RankConfig`: seed, repeats, distance).
:meth:`RankConfig.from_options` takes the flat keyword names of 0.1 (those of ``gsd rank``'s options
and of a catalogue job's ``[jobs.options]``); :meth:`RankConfig.options` gives them back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import GSDError
from ..gradients import LossFn
from ..privacy.randomness import check_seed


@dataclass(frozen=True)
class ModelSettings:
    """The model whose gradients are compared, at its initial weights w0 (from the ranking's seed)."""

    model: object = "probe"  # a registry name (gsd models list), timm:NAME, PATH.py:FACTORY, or an nn.Module (gsd_cli.models.spec)
    params: Sequence[str] | str | None = None  # glob patterns of the parameters that get gradients
    weights: str | None = None  # pre-trained weights (new head), as gsd train --weights
    peft: str | None = None  # the trainable set, as gsd train --peft
    classes: int | str | None = None  # the private set's classes where its source declares none
    batchnorm: str = "freeze"  # BatchNorm layers: freeze, groupnorm or refuse (gsd_cli.models.exact)


@dataclass(frozen=True)
class GradientSettings:
    """How each side's per-sample gradients and top-k subspace are computed."""

    k: int = 16  # subspace dimension
    examples: int | None = 2000  # examples drawn per dataset (None: all)
    labels: str = "random"  # random (the authors') or own
    row_norm: str = "unit"  # unit (the authors' experiment code) or none
    device: str = "auto"
    chunk_size: int | None = None
    engine: str = "auto"  # per-sample gradients: auto, vmap, hooks
    loss: LossFn | None = None
    gram: str = "auto"  # materialize, ghost, auto
    memory_budget: int | str | None = None
    dp_sketch: int | str | None = None  # D: Gaussian sketch of every gradient (both sides); "public[+R]": DP-GSD's public basis (gsd_cli.subspace.public_basis)
    subspace_method: str = "auto"  # top-k of a materialised matrix: exact, randomized, auto (gsd_cli.subspace)


@dataclass(frozen=True)
class PrivacySettings:
    """DP-GSD: whether the private side is released under DP, and with what."""

    dp: bool = False
    epsilon: float | None = None
    clip: float = 1.0
    mechanism: str = "sequential"  # sequential (exact, proven) or matrix (Gibbs, no guarantee)
    gibbs_sweeps: int = 10
    dp_repeats: str = "shared"  # with repeats: shared (one private draw) or fresh (R draws, R x epsilon)
    insecure_seed: int | None = None  # experiments only: private randomness from a seed, output not DP
    top: int = 1  # DP selection (dp-select): how many candidates it chooses (1: permute-and-flip; k > 1: peeling)
    regret_clip: float = 0.02  # DP selection: each row's regret clipped at this many C^2 (the utility's sensitivity)
    score_share: float = 0.5  # DP selection: the part of epsilon that releases the chosen candidates' scores


_GROUPS = {"model": ModelSettings, "gradients": GradientSettings, "privacy": PrivacySettings}


@dataclass(frozen=True)
class RankConfig:
    """Every setting of a ranking. ``distance``: a registered distance (:mod:`gsd_cli.distance`);
    default ``gsd``, and with ``privacy.dp`` ``dp-select`` (``dp-gsd`` where a DP-GSD-only setting is
    given: ``dp_sketch``, ``mechanism="matrix"``)."""

    model: ModelSettings = field(default_factory=ModelSettings)
    gradients: GradientSettings = field(default_factory=GradientSettings)
    privacy: PrivacySettings = field(default_factory=PrivacySettings)
    seed: int = 0  # public randomness: w0, public examples and labels, sketch
    repeats: int = 1
    distance: str | None = None

    def __post_init__(self) -> None:
        check_seed("--seed", self.seed)
        check_seed("--insecure-seed", self.privacy.insecure_seed)

    @property
    def distance_name(self) -> str:
        if self.distance:
            return self.distance
        if not self.privacy.dp:
            return "gsd"
        # under DP, the DP selection (gsd_cli.distance.dpselect): the winner (or --top k) and its score, at a
        # cost that does not grow with the number of candidates (issue 43; docs/dp-gsd.md). The noisy order
        # of all candidates is --metric dp-energy. Settings that only DP-GSD has (a sketch, the matrix
        # sampler) ask for DP-GSD.
        bingham = self.gradients.dp_sketch is not None or self.privacy.mechanism != "sequential"
        return "dp-gsd" if bingham else "dp-select"

    @classmethod
    def from_options(cls, **options) -> "RankConfig":
        """A config from flat keyword options (``k=16, dp=True, epsilon=2, model="resnet20"``...)."""
        return cls().replace(**options)

    def replace(self, **options) -> "RankConfig":
        """A copy with flat keyword options changed; an unknown option is a one-line error."""
        groups: dict[str, dict] = {g: {} for g in _GROUPS}
        top = {}
        for name, value in options.items():
            group = next((g for g, kind in _GROUPS.items() if name in kind.__dataclass_fields__), None)
            if group is not None:
                groups[group][name] = value
            elif name in ("seed", "repeats", "distance"):
                top[name] = value
            else:
                raise GSDError(f"unknown ranking option {name!r}; use one of {', '.join(option_names())}")
        parts = {g: dataclasses.replace(getattr(self, g), **kw) for g, kw in groups.items() if kw}
        return dataclasses.replace(self, **parts, **top)

    def options(self) -> dict:
        """The flat keyword options of this config (the inverse of :meth:`from_options`)."""
        out = {}
        for g in _GROUPS:
            out.update({f.name: getattr(getattr(self, g), f.name) for f in dataclasses.fields(getattr(self, g))})
        out.update(seed=self.seed, repeats=self.repeats, distance=self.distance)
        return out


#: the most repeats a ranking runs (each is a full ranking; the interval's width falls as 1/sqrt(R))
MAX_REPEATS = 1000

#: the option that sets each checked setting on gsd rank's command line: what the checks' messages name
#: unless a caller names its own (gsd train --auto-select: --rank-k, --rank-examples, --rank-repeats, --select-epsilon)
CHECKED_OPTIONS = {"k": "--k", "examples": "--examples", "repeats": "--repeats", "epsilon": "--epsilon"}


def check_k(k: int, name: str = "--k") -> None:
    """The subspace dimension: a whole number >= 1."""
    if k < 1:
        raise GSDError(f"{name} must be at least 1 (got {k})")


def check_repeats(repeats: int, name: str = "--repeats") -> None:
    """The draws of a ranking: a whole number in 1..:data:`MAX_REPEATS`."""
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise GSDError(f"{name} must be a whole number >= 1 (got {repeats!r})")
    if repeats > MAX_REPEATS:  # each repeat is a full ranking of every candidate
        raise GSDError(f"{name} {repeats}: at most {MAX_REPEATS:,} (each repeat ranks every candidate again; 5 to 30 "
                       "give a tight interval)")


def check_settings(config: "RankConfig", names: dict[str, str] | None = None) -> None:
    """One-line errors for a ranking's k, examples, repeats and (under DP) epsilon, before any work (the
    privacy ledger included). Each names the option the user typed: ``names`` maps a setting to it where
    a command calls it otherwise than gsd rank (:data:`CHECKED_OPTIONS`)."""
    from .. import data as gdata
    from ..distance import distance_flag

    n = {**CHECKED_OPTIONS, **(names or {})}
    check_k(config.gradients.k, n["k"])
    gdata.check_examples(config.gradients.examples, n["examples"])
    check_repeats(config.repeats, n["repeats"])
    if config.privacy.dp:
        if config.privacy.epsilon is None:
            raise GSDError(f"--dp needs {n['epsilon']} (the privacy budget of the ranking, > 0)")
        from ..subspace.dppca import check_dp_epsilon

        check_dp_epsilon(config.privacy.epsilon, n["epsilon"])
    if int(config.repeats) > 1 and distance_flag(config.distance_name, "selection"):
        rank_cli = n["repeats"] == "--repeats"  # gsd rank's options, which another command may not have
        hint = ("drop --repeats (--top 3 for a short list), or use --metric dp-energy for a noisy order of all candidates"
                if rank_cli else f"drop {n['repeats']}")
        raise GSDError(f"{n['repeats']} with the DP selection: it releases the winner{' (--top k: a short list)' if rank_cli else ''}, "
                       f"not a distance per candidate to average; {hint}")


def option_names() -> list[str]:
    """Every flat option name :meth:`RankConfig.from_options` accepts."""
    names = [f for kind in _GROUPS.values() for f in kind.__dataclass_fields__]
    return names + ["seed", "repeats", "distance"]
