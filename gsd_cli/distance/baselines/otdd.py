"""An optimal-transport dataset distance in the manner of OTDD (Alvarez-Melis and Fusi, NeurIPS 2020),
computed with POT (``pip install 'gsd-cli[ot]'``).

Each example is a pair (feature x, label y); the ground cost between a private and a public example is

    c((x, y), (x', y')) = ||x - x'||^2 + W_2(alpha_y, alpha'_y')^2,

where alpha_y is the distribution of the features of class y in its dataset, approximated by a
Gaussian (OTDD's Gaussian approximation), so W_2 is the Bures-Wasserstein distance (closed form by
eigendecompositions; ``ot.gaussian.bures_wasserstein_distance`` gives the same, more slowly). The distance is the square root of the exact optimal
transport cost between the two uniform empirical measures (``ot.emd2``, network simplex). Labels of
different label sets compare through their feature distributions, as in OTDD; the datasets' own
labels are used. Features: the model's penultimate activations at w0 (:mod:`.features`).
Privately: not implemented (an exact OT plan between individual private and public examples has no
bounded sensitivity; a DP version would need DP class statistics and a DP private sample).
"""

from __future__ import annotations

import numpy as np

from ...errors import GSDError
from ..registry import register_distance
from .features import BaselineDistance, Features, gaussian_fit

HINT = "install it with: pip install 'gsd-cli[ot]'"


def _ot():
    try:
        import ot
    except ImportError:
        raise GSDError(f"--metric otdd needs the POT package (optimal transport); {HINT}") from None
    return ot


def class_gaussians(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(classes, means (c x d), covariances (c x d x d))`` of the features of each class present."""
    classes = np.unique(y)
    fits = [gaussian_fit(X[y == c]) for c in classes]
    return classes, np.stack([f[0] for f in fits]), np.stack([f[1] for f in fits])


def _psd_sqrt(S: np.ndarray) -> np.ndarray:
    w, Q = np.linalg.eigh(S)
    return (Q * np.sqrt(np.clip(w, 0.0, None))) @ Q.T


def bures_wasserstein_sq(m1, S1, m2, S2) -> np.ndarray:
    """W_2^2 between every Gaussian N(m1[i], S1[i]) and every N(m2[j], S2[j]):
    ||m1 - m2||^2 + tr(S1) + tr(S2) - 2 tr((S1^1/2 S2 S1^1/2)^1/2), by symmetric eigendecompositions
    (what ``ot.gaussian.bures_wasserstein_distance`` computes, squared; the tests compare the two)."""
    out = np.empty((len(m1), len(m2)))
    roots = [_psd_sqrt(S) for S in S1]
    for i, (mi, Si, Ri) in enumerate(zip(m1, S1, roots)):
        for j, (mj, Sj) in enumerate(zip(m2, S2)):
            cross = np.sqrt(np.clip(np.linalg.eigvalsh(Ri @ Sj @ Ri), 0.0, None)).sum()
            out[i, j] = max(float(np.sum((mi - mj) ** 2) + np.trace(Si) + np.trace(Sj) - 2.0 * cross), 0.0)
    return out


def label_cost(X1, y1, X2, y2) -> np.ndarray:
    """W_2(alpha_y, alpha'_y')^2 between every private class y and public class y' (Gaussian
    approximation), indexed by example: (n1 x n2)."""
    c1, m1, S1 = class_gaussians(X1, y1)
    c2, m2, S2 = class_gaussians(X2, y2)
    W2 = bures_wasserstein_sq(m1, S1, m2, S2)
    return W2[np.ix_(np.searchsorted(c1, y1), np.searchsorted(c2, y2))]


def otdd_distance(X1, y1, X2, y2, *, labels: bool = True) -> float:
    """sqrt of the exact OT cost between the uniform measures on (X1, y1) and (X2, y2) under the cost
    above (``labels=False``: the feature term alone, plain W_2 between the feature clouds)."""
    ot = _ot()
    X1, X2 = np.asarray(X1, np.float64), np.asarray(X2, np.float64)
    M = ot.dist(X1, X2, metric="sqeuclidean")
    if labels:
        M = M + label_cost(X1, np.asarray(y1), X2, np.asarray(y2))
    a = np.full(len(X1), 1.0 / len(X1))
    b = np.full(len(X2), 1.0 / len(X2))
    cost = float(ot.emd2(a, b, M, numItermax=10_000_000))
    return float(np.sqrt(max(cost, 0.0)))


@register_distance("otdd")
class OTDD(BaselineDistance):
    """OTDD with the Gaussian approximation of the label-to-label cost (POT)."""

    reading = "OTDD (features + label-aware cost, exact OT by POT) of the model's penultimate features at w0; lower is closer"
    privately = "no (exact OT couples individual private examples; not implemented)"

    def __init__(self, config) -> None:
        super().__init__(config)
        _ot()  # a missing POT fails before any gradient or feature is computed

    def value(self, private: Features, public: Features) -> float:
        return otdd_distance(private.V.numpy(), private.labels, public.V.numpy(), public.labels)
