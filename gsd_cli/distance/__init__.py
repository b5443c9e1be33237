"""Distances between a private and a public dataset: the interface, its registry, GSD and DP-GSD.

>>> from gsd_cli.distance import distance_names
>>> distance_names()
['dp-energy', 'dp-gsd', 'dp-select', 'frechet', 'gsd', 'logme', 'otdd', 'task2vec']

A new distance is one new module here with a :class:`Distance` subclass decorated by
:func:`register_distance`, imported below so that it registers. The baselines beside GSD (OTDD, Frechet, Task2Vec, LogME) are
in :mod:`.baselines`.
"""

from .registry import Distance, SideContext, distance_flag, distance_names, is_private, make_distance, register_distance
from . import dpgsd, gsd  # noqa: F401  (they register themselves)
from . import dpenergy  # noqa: F401,E402  (DP energy distance, --metric dp-energy)
from . import dpselect  # noqa: F401,E402  (DP selection, gsd rank --dp's default)
from . import baselines  # noqa: F401,E402  (the baselines register themselves)
from .gsd import GSD, gradient_subspace_distance
from .dpgsd import DPGSD

__all__ = ["Distance", "SideContext", "register_distance", "make_distance", "distance_names", "distance_flag", "is_private", "GSD", "DPGSD",
           "gradient_subspace_distance"]
