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

__version__ = "0.2.0"

#: public name -> the module that defines it
_EXPORTS = {
    "GSDError": "errors", "DatasetError": "errors", "ModelError": "errors",
    "per_sample_gradients": "gradients", "select_parameters": "gradients", "default_loss": "gradients",
    "top_k_subspace": "subspace", "projection_metric": "subspace", "principal_angles": "subspace",
    "uniform_baseline": "subspace",
    "gradient_subspace_distance": "ranking", "rank": "ranking", "RankConfig": "ranking", "Ranking": "ranking",
    "RankResult": "ranking", "rank_repeats": "ranking", "RepeatRanking": "ranking", "RepeatResult": "ranking",
    "private_top_k_subspace": "subspace.dppca", "sample_sequential": "subspace.dppca", "sample_matrix_gibbs": "subspace.dppca",
    "bingham_dense": "subspace.dppca", "keep_freed_memory": "allocator",
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


# --- old import paths (gsd 0.1): modules moved into packages in 0.2 keep working -----------------------
#: old module -> new module (``import gsd_cli.opacus`` is ``gsd_cli.integrations.opacus``, the same object)
MOVED = {
    "gsd_cli.engines": "gsd_cli.gradients.engines",
    "gsd_cli.engine_layers": "gsd_cli.gradients.layers",
    "gsd_cli.cache": "gsd_cli.ranking.cache",
    "gsd_cli.catalog": "gsd_cli.ranking.catalog",
    "gsd_cli.model_spec": "gsd_cli.models.spec",
    "gsd_cli.model_digest": "gsd_cli.models.digest",
    "gsd_cli.model_exact": "gsd_cli.models.exact",
    "gsd_cli.weights": "gsd_cli.models.weights",
    "gsd_cli.peft": "gsd_cli.models.peft",
    "gsd_cli.models_info": "gsd_cli.models.info",
    "gsd_cli.subspace_krylov": "gsd_cli.subspace.krylov",
    "gsd_cli.dppca": "gsd_cli.subspace.dppca",
    "gsd_cli.side": "gsd_cli.distance.side",
    "gsd_cli.subspace.side": "gsd_cli.distance.side",  # 0.6: above the ghost engine it dispatches to
    "gsd_cli.public_basis": "gsd_cli.subspace.public_basis",
    "gsd_cli.opacus": "gsd_cli.integrations.opacus",
    "gsd_cli.tracking": "gsd_cli.integrations.tracking",
    "gsd_cli.checks": "gsd_cli.ranking.checks",
    "gsd_cli.compare": "gsd_cli.train.compare",
    "gsd_cli.outputs": "gsd_cli.report.outputs",
    "gsd_cli.privacy.audit": "gsd_cli.audit",
}


#: old module -> new module, moved after 0.2 (issue 63: the advice in a package of its own; the trainers' units
#: grouped): the old path works for one more release and warns (DeprecationWarning) on its first import
DEPRECATED = {
    "gsd_cli.train.select": "gsd_cli.advice.select",
    "gsd_cli.train.advice": "gsd_cli.advice.decide",
    "gsd_cli.train.dp_advice": "gsd_cli.advice.dp_probe",
    "gsd_cli.train.probe": "gsd_cli.advice.probe",
    "gsd_cli.train.gate": "gsd_cli.advice.gate",
    "gsd_cli.train.fallback": "gsd_cli.advice.fallback",
    "gsd_cli.train.warm": "gsd_cli.advice.warm",
    "gsd_cli.train.clipsum_rules": "gsd_cli.train.clipsum.rules",
    "gsd_cli.train.clipsum_step": "gsd_cli.train.clipsum.step",
    "gsd_cli.train.clipsum_tune": "gsd_cli.train.clipsum.tune",
    "gsd_cli.train.gep_sum": "gsd_cli.train.gep.sums",
    "gsd_cli.train.stage1_fit": "gsd_cli.train.second_phase.stage1_fit",
    "gsd_cli.train.stage1_cache": "gsd_cli.train.second_phase.stage1_cache",
    "gsd_cli.train.augment": "gsd_cli.train.second_phase.augment",
    "gsd_cli.train.launch": "gsd_cli.train.distributed.launch",
}

#: package -> {old attribute: the module that now defines it}: names a package exported before they moved, served
#: (with a DeprecationWarning) by :func:`moved_attribute`, which the package's ``__getattr__`` calls
DEPRECATED_NAMES = {
    "gsd_cli.train": {"auto_select": "gsd_cli.advice.select", "advised_selection": "gsd_cli.advice.select"},
}


def _warn_moved(old: str, new: str) -> None:
    """A DeprecationWarning that ``old`` is now ``new``, attributed to the code that named ``old`` (the first frame
    outside the import system and this module, so that Python's default filters show it where a script imports it)."""
    import os
    import sys
    import warnings

    def shim(path: str) -> bool:  # the import system, or this package's __init__ files (the shims' frames)
        return (path.startswith("<frozen importlib") or os.path.dirname(path) == os.path.dirname(importlib.__file__)
                or (path.startswith(os.path.dirname(__file__)) and path.endswith("__init__.py")))

    frame, level = sys._getframe(1), 2
    while frame is not None and shim(frame.f_code.co_filename):
        internal = "importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename
        frame, level = frame.f_back, level + (not internal)  # warnings.warn skips those itself
    warnings.warn(f"{old} has moved to {new}; the old name goes in the next release", DeprecationWarning, stacklevel=level)


def moved_attribute(package: str, name: str):
    """``package``'s attribute ``name`` that has moved (:data:`DEPRECATED_NAMES`), or a moved submodule
    (:data:`DEPRECATED`), with a DeprecationWarning; AttributeError for any other name."""
    new = DEPRECATED_NAMES.get(package, {}).get(name)
    if new is not None:
        _warn_moved(f"{package}.{name}", f"{new}.{name}")
        return getattr(importlib.import_module(new), name)
    if f"{package}.{name}" in DEPRECATED:
        return importlib.import_module(f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")


class _MovedFinder:
    """A meta-path finder that answers an old module path with its new module (one module object
    under two names, so ``isinstance`` checks and monkeypatching agree)."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        moves = {**MOVED, **DEPRECATED}
        new = next((n + fullname[len(o):] for o, n in moves.items() if fullname == o or fullname.startswith(o + ".")), None)
        if new is None:
            return None
        import importlib.util

        if fullname in DEPRECATED:
            _warn_moved(fullname, new)
        return importlib.util.spec_from_loader(fullname, _MovedLoader(new))


class _MovedLoader:
    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        import sys

        sys.modules[spec.name] = module
        self.spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self.spec  # the import system set the old name's; the module keeps its own


def _install_finder() -> None:
    import sys

    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())  # first: an old path must never find a stale file elsewhere


_install_finder()
