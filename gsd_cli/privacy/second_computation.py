"""The second, independent computation of a training run's epsilon that :func:`gsd_cli.privacy.accountant.confirm_epsilon`
compares with dp-accounting's: Opacus's RDP analysis of the subsampled Gaussian, run from its file."""

from __future__ import annotations

import functools

from .orders import RDP_ORDERS


@functools.cache
def _opacus_rdp():
    """Opacus's RDP analysis, ``opacus/accountants/analysis/rdp.py`` (it imports math, warnings, typing,
    numpy and scipy.special only), run from its file without the ``opacus`` package's ``__init__``, which
    imports Opacus's privacy engine, optimizers and grad samplers: 1.1-1.4 s of a ``gsd train`` run on the
    2-core CPU, for two calls that take milliseconds. Where the file is not there (another layout) or does
    not run alone, the package import. The same code either way: the second computation stays Opacus's."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("opacus")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(root, "accountants", "analysis", "rdp.py")
        if os.path.isfile(path):
            file_spec = importlib.util.spec_from_file_location("gsd_cli._opacus_rdp", path)
            module = importlib.util.module_from_spec(file_spec)
            try:
                file_spec.loader.exec_module(module)
                return module
            except ImportError:  # a later rdp.py that needs its package (a relative import): import that
                break
    from opacus.accountants.analysis import rdp

    return rdp


def second_epsilon(sampling_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    """The same run's epsilon by a second, independent implementation: Opacus's RDP analysis of the
    subsampled Gaussian (Mironov, Talwar, Zhang 2019, Sec. 3.3, its integer and fractional orders) and its
    RDP-to-(epsilon, delta) conversion (Balle et al. 2020, Theorem 21), on the orders used here.
    Remembered in this process (a pure function of its four numbers): a run confirms the same epsilon
    at its calibration and at its total, and computes it once."""
    return _second_epsilon(float(sampling_rate), float(noise_multiplier), int(steps), float(delta))


@functools.lru_cache(maxsize=256)
def _second_epsilon(sampling_rate: float, noise_multiplier: float, steps: int, delta: float) -> float:
    import warnings

    opacus_rdp = _opacus_rdp()
    with warnings.catch_warnings():  # "optimal order is the smallest alpha": a looser bound, still a bound
        warnings.simplefilter("ignore")
        orders = list(RDP_ORDERS)
        rdp = opacus_rdp.compute_rdp(q=float(sampling_rate), noise_multiplier=float(noise_multiplier), steps=int(steps), orders=orders)
        eps, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=float(delta))
    return float(eps)
