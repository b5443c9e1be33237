"""Frechet distance of probe features (as FID does with Inception features): Gaussians fitted to the
private and the public features, then

    FD^2 = ||mu_1 - mu_2||^2 + tr(S_1 + S_2 - 2 (S_1 S_2)^{1/2})

(Dowson and Landau 1982; Heusel et al. 2017), the matrix square root by ``scipy.linalg.sqrtm``.
The value reported is FD (the square root), in the features' units. Labels are not used.
Privately: possible in principle (a DP mean and covariance, e.g. by the Gaussian mechanism on clipped
features), not implemented here.
"""

from __future__ import annotations

import numpy as np

from ..registry import register_distance
from .features import BaselineDistance, Features, gaussian_fit


def frechet_distance(mu1, S1, mu2, S2) -> float:
    """sqrt(||mu1 - mu2||^2 + tr(S1 + S2 - 2 sqrtm(S1 S2))), clipped at 0 (rounding)."""
    from scipy.linalg import sqrtm

    mu1, mu2 = np.asarray(mu1, float), np.asarray(mu2, float)
    S1, S2 = np.atleast_2d(np.asarray(S1, float)), np.atleast_2d(np.asarray(S2, float))
    root = sqrtm(S1 @ S2)
    root = np.real(root)  # tiny imaginary parts from rounding (S1 S2 is similar to a PSD matrix)
    d2 = float(np.sum((mu1 - mu2) ** 2) + np.trace(S1) + np.trace(S2) - 2.0 * np.trace(root))
    return float(np.sqrt(max(d2, 0.0)))


@register_distance("frechet")
class Frechet(BaselineDistance):
    """Frechet distance between Gaussians fitted to the two sets' probe features."""

    reading = "Frechet distance of the model's penultimate features at w0 (as FID); lower is closer"
    privately = "not implemented (possible: a DP mean and covariance of clipped features)"

    def value(self, private: Features, public: Features) -> float:
        return frechet_distance(*gaussian_fit(private.V.numpy()), *gaussian_fit(public.V.numpy()))
