"""gsd: choose public data for differentially private training by Gradient Subspace Distance.

The Python API uses the same words as the CLI:

>>> import gsd_cli
>>> ranking = gsd_cli.rank("mnist-a", ["mnist-b", "noise"], examples=200)   # doctest: +SKIP
>>> ranking.winner.public                                                     # doctest: +SKIP
'mnist-b'
"""

from __future__ import annotations

__version__ = "0.1.0"

from .dppca import bingham_dense, private_top_k_subspace, sample_matrix_gibbs, sample_sequential
from .errors import DatasetError, GSDError, ModelError
from .gradients import default_loss, per_sample_gradients, select_parameters
from .ranking import RankConfig, RankResult, Ranking, RepeatRanking, RepeatResult, gradient_subspace_distance, rank, rank_repeats
from .subspace import principal_angles, projection_metric, top_k_subspace, uniform_baseline

__all__ = [
    "__version__", "GSDError", "DatasetError", "ModelError", "per_sample_gradients", "select_parameters",
    "default_loss", "top_k_subspace", "projection_metric", "principal_angles", "uniform_baseline",
    "gradient_subspace_distance", "rank", "RankConfig", "Ranking", "RankResult", "rank_repeats", "RepeatRanking", "RepeatResult",
    "private_top_k_subspace", "sample_sequential", "sample_matrix_gibbs", "bingham_dense",
]
