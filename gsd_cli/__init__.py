"""gsd: choose public data for differentially private training by Gradient Subspace Distance.

The Python API uses the same words as the CLI:

>>> import gsd_cli
>>> ranking = gsd_cli.rank("mnist-a", ["mnist-b", "noise"], examples=200)   # doctest: +SKIP
>>> ranking.winner.public                                                     # doctest: +SKIP
'mnist-b'

The names below are imported on first use (PEP 562), so that ``import gsd_cli`` (and ``gsd --help``)
does not load torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "GSDError": "errors", "DatasetError": "errors", "ModelError": "errors",
    "per_sample_gradients": "gradients", "select_parameters": "gradients", "default_loss": "gradients",
    "top_k_subspace": "subspace", "projection_metric": "subspace", "principal_angles": "subspace",
    "uniform_baseline": "subspace",
    "gradient_subspace_distance": "ranking", "rank": "ranking", "RankConfig": "ranking", "Ranking": "ranking",
    "RankResult": "ranking", "rank_repeats": "ranking", "RepeatRanking": "ranking", "RepeatResult": "ranking",
    "private_top_k_subspace": "dppca", "sample_sequential": "dppca", "sample_matrix_gibbs": "dppca",
    "bingham_dense": "dppca", "keep_freed_memory": "allocator",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gsd_cli' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
