"""The distance interface and its registry.

A :class:`Distance` turns a private side and a public side into a number: it says how the private
rows are drawn, computes each side's representation at the ranking's model, compares the two, and
states what the private side cost. GSD (:mod:`.gsd`) and DP-GSD (:mod:`.dpgsd`) are the first two;
a new measure of dataset similarity is one new module with a class decorated by
:func:`register_distance`, imported in :mod:`gsd_cli.distance` (as Opacus registers its per-layer grad
samplers and dp-accounting its events), and the ranking pipeline (:mod:`gsd_cli.ranking`) is not
touched.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import torch.nn as nn

from .. import data as gdata
from ..errors import GSDError
from ..registry import Registry
from .side import Subspace, sample_subspace
from ..subspace import principal_angles, projection_metric

_DISTANCES = Registry("distance")


@dataclass
class SideContext:
    """What every side of one ranking shares: the model at w0 and :func:`gsd_cli.distance.side.sample_subspace`'s
    settings (k, labels, row norm, engine, device, sketch...). ``dims``: the dimension the subspaces live in."""

    model: nn.Module
    common: dict = field(default_factory=dict)
    dims: int = 0

    def subspace(self, sample: gdata.Sample, **overrides) -> Subspace:
        return sample_subspace(self.model, sample, **{**self.common, **overrides})


class Distance(ABC):
    """A distance between a private and a public dataset, built from one ranking's settings
    (a :class:`gsd_cli.ranking.RankConfig`). Lower is closer."""

    #: the registered name (``gsd``, ``dp-gsd``, ...)
    name: str = ""
    #: whether the private side is released under differential privacy
    private: bool = False
    #: whether public sides are gradient subspaces that the disk cache of public subspaces may keep
    disk_cache: bool = True
    #: whether it releases a choice of candidates rather than a distance for each (DP selection):
    #: :meth:`arrange` then keeps the chosen ones, and repeats are refused
    selection: bool = False
    #: whether its released numbers stay the same in every repeat that shares one private release
    #: (the private side fixes every distance): the tie test of such repeats is not run
    fixed_release: bool = False

    def __init__(self, config) -> None:
        self.config = config

    def private_rows(self, sample: gdata.Sample, publics=()) -> gdata.Sample:
        """The private examples the distance looks at (default: the ranking's draw as it is; the
        ranking refuses public candidates that share examples with it). ``publics``: the public
        samples of the ranking, drawn before the private rows (a private distance leaves out the
        private examples among them, :class:`gsd_cli.data.identity.PublicRows`)."""
        return sample

    @abstractmethod
    def private_side(self, ctx: SideContext, sample: gdata.Sample) -> Subspace:
        """The private sample's representation (the private data is touched here only)."""

    def public_side(self, ctx: SideContext, sample: gdata.Sample, seed: int) -> Subspace:
        """A public sample's representation; ``seed`` seeds its random labels."""
        return ctx.subspace(sample, label_seed=seed)

    def compare(self, private: Subspace, public: Subspace) -> tuple[float, list[float]]:
        """``(distance, principal angles in degrees)``: the normalised projection metric
        sqrt(1 - ||V1^T V2||_F^2 / k) (paper 004, Definition 3, normalised; DESIGN.md)."""
        angles = principal_angles(private.V, public.V)
        return projection_metric(private.V, public.V), [round(math.degrees(a), 4) for a in angles.tolist()]

    def arrange(self, private: Subspace, rows: list) -> tuple[list, list[str]]:
        """``(rows in rank order, names of candidates with nothing released)``: by distance, lowest first
        (a selection keeps the chosen candidates in the order chosen)."""
        return sorted(rows, key=lambda r: r.distance), []

    def memo_key(self) -> tuple:
        """What, beyond the shared settings, a cached private side depends on."""
        return (self.name,)

    def public_key(self) -> tuple:
        """What, beyond the shared settings, a public side depends on (GSD and DP-GSD share theirs)."""
        return ()

    def report(self, ctx: SideContext, rows: list) -> tuple[dict | None, list[str], bool]:
        """``(privacy block, warnings, dp)`` of the finished ranking: what the private side spent."""
        return None, [], False


def register_distance(name: str) -> Callable[[type[Distance]], type[Distance]]:
    """Class decorator: make ``name`` a distance of ``gsd rank`` (``RankConfig(distance=name)``)."""
    return _DISTANCES.register(name)


def distance_names() -> list[str]:
    return _DISTANCES.names()


def distance_reading(name: str) -> str:
    """How to read the values of the registered distance ``name`` (its ``reading``; "" for GSD's own)."""
    return getattr(_DISTANCES.get(name), "reading", "") if name in _DISTANCES else ""


def metric_distance(metric: str | None, dp: bool) -> str | None:
    """The ``distance`` of a ranking for ``gsd rank --metric NAME`` (None: the default, GSD, or with
    ``--dp`` :attr:`gsd_cli.ranking.RankConfig.distance_name`'s: DP energy, or DP-GSD where a sketch or
    the matrix sampler is asked for). ``dp-gsd`` names the Bingham mechanism. A metric that is not
    private is refused with ``--dp``; an unknown one lists the known ones."""
    if metric in (None, "gsd", "dp-gsd"):
        if metric == "dp-gsd" and not dp:
            raise GSDError("--metric dp-gsd needs --dp (and --epsilon); or drop --metric for the non-private GSD")
        return "dp-gsd" if metric == "dp-gsd" else None
    if metric not in _DISTANCES:
        raise GSDError(f"unknown --metric {metric!r}; use one of {', '.join(n for n in distance_names() if n != 'dp-gsd')}")
    if dp and not _DISTANCES.get(metric).private:
        raise GSDError(f"--metric {metric} is not differentially private and cannot run with --dp; "
                       f"drop --dp, or use --dp without --metric for a private ranking")
    return metric


def distance_flag(name: str, flag: str) -> bool:
    """A class attribute (``private``, ``selection``, ``fixed_release``) of the registered distance ``name``."""
    return name in _DISTANCES and bool(getattr(_DISTANCES.get(name), flag, False))


def is_private(name: str) -> bool:
    """Whether the registered distance ``name`` releases its private side under DP."""
    return name in _DISTANCES and _DISTANCES.get(name).private


def make_distance(name: str, config) -> Distance:
    """The registered distance ``name`` for one ranking's ``config``."""
    return _DISTANCES.get(name)(config)
