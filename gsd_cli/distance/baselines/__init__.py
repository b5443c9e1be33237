"""Baselines beside GSD: measures of dataset similarity users would otherwise reach for, behind the
same interface (``gsd rank --metric NAME``, ``RankConfig(distance=NAME)``).

| metric | what | labels | private? |
|---|---|---|---|
| ``otdd`` | OT dataset distance, Gaussian label cost, exact OT by POT (:mod:`.otdd`) | own | no |
| ``frechet`` | Frechet distance of penultimate features (:mod:`.frechet`) | none | not implemented (possible) |
| ``task2vec`` | Task2Vec-style Fisher embedding distance (:mod:`.task2vec`) | model's own predictive | not implemented (possible) |
| ``logme`` | -LogME of private labels on features trained on each public set (:mod:`.logme`) | own | no |

None is differentially private: each is refused with ``--dp`` and every output says ``"dp": false``
with its ``"metric"``. POT is an optional extra (``pip install 'gsd-cli[ot]'``), imported only by otdd.
"""

from . import frechet, logme, otdd, task2vec  # noqa: F401  (they register themselves)
from .features import NOT_PRIVATE, BaselineDistance

BASELINES = ("otdd", "frechet", "task2vec", "logme")

__all__ = ["BaselineDistance", "NOT_PRIVATE", "BASELINES"]
