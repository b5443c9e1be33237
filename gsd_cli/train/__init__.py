"""Private trainers built from per-sample gradient transforms (DP-SGD, GEP, RGP, TopAgg, random
sparsification), and their plumbing. Which public set and which method to train with is decided above
this package, in :mod:`gsd_cli.advice`, which imports it (never the reverse).

>>> from gsd_cli.train import TrainConfig, train
>>> summary = train(TrainConfig(method="gep", public="mnist-b", epsilon=2.0), "runs/gep")  # doctest: +SKIP
"""

from .gep import Anchor, GEPProject, GEPReconstruct, power_basis, share_quota, split_groups
from .config import METHODS, TrainConfig
from .loop import private_step, train
from .methods import build_method
from .rgp import RGP, power_carriers
from .sparsify import RandomSparsify, random_mask, sparsity_rate
from .topagg import NormTopK, norm_top_k
from .transforms import Chain, Clip, GaussianNoise, Release, StepContext, Transform, chain, chain_step_event, clip, gaussian_noise

__all__ = [
    "METHODS", "TrainConfig", "train", "private_step", "build_method", "Anchor", "GEPProject", "GEPReconstruct", "power_basis",
    "share_quota", "split_groups", "Chain", "Clip", "GaussianNoise", "Release", "StepContext", "Transform", "chain",
    "chain_step_event", "clip", "gaussian_noise", "RGP", "power_carriers", "RandomSparsify", "random_mask", "sparsity_rate",
    "NormTopK", "norm_top_k",
]


def __getattr__(name: str):
    """Names and submodules that moved to :mod:`gsd_cli.advice` (``auto_select``, ``advised_selection``,
    ``select``, ``probe``, ...): served with a DeprecationWarning for one release (:func:`gsd_cli.moved_attribute`)."""
    from .. import moved_attribute

    return moved_attribute(__name__, name)
