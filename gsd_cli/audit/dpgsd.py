"""Audit of DP-GSD's exponential mechanism (:func:`gsd_cli.subspace.dppca.private_top_k_subspace`, k = 1):
a distinguishing test on two neighbouring low-dimensional gradient matrices, and the exact privacy
loss of that pair by numerical integration.

Neighbours (add/remove one row, the relation DP-GSD claims): D = one zero row (the default; or
``rows`` copies of C e_2) in p = 2 or 3 dimensions, D' = D plus the row C e_1. Under D the draw is
uniform (or concentrated near +-e_2); the added row tilts the density towards e_1 by
exp(epsilon (v . e_1)^2 / 2) (B = epsilon / (2 C^2) G^T G). The privacy loss of the pair,
log f_D'(v) / f_D(v) = (epsilon / 2) (v . e_1)^2 - log(Z_D' / Z_D), lies in an interval of width
epsilon / 2, so the exact loss is below epsilon / 2 (the exponential mechanism's factor 2 is for
replace-one neighbours; under add/remove the score is monotone and the mechanism is tighter than
claimed): :func:`exact_privacy_loss` computes it on a fine grid of the circle (p = 2) or the sphere
(p = 3, uniform in (z, phi)). The zero-row pair puts its largest loss (near v . e_1 = 0) where D
has probability, so counts can see it; the rows-of-e_2 pair comes closer to epsilon / 2 but in a tail
that no affordable number of draws reaches.

Draws: ``draws`` under each of D and D', every one through the real path with secret randomness (one
generator from the OS for the whole audit, or ``insecure_seed``). Statistics, fixed in advance:
(v . e_1)^2 against the quantiles of its exact law under D (:func:`thresholds`), and a *replay* statistic |<v, M(D; s_i)>| where M(D; s_i) is
the draw the code would make from D with the public seed s_i = i of trial i: it has no power
against correct code and wins every trial against the old bug (the draw seeded from the public
``--seed``, the same for D and D', so the output is a deterministic function of the data).
:func:`~.bound.distinguishing_epsilon` turns the counts into a 95% lower bound (Clopper-Pearson).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from ..errors import GSDError
from .bound import AuditResult, best_of_tests

QUANTILES = (0.01, 0.03, 0.1, 0.3, 0.5, 0.7, 0.9)
BUGS = ("public-seed",)


def check_draw_audit(epsilon: float, draws: int, insecure_seed: int | None, bug: str | None, bugs, label: str) -> None:
    """The arguments of a distinguishing audit by draws under two neighbours (one-line errors)."""
    from ..privacy.randomness import check_insecure_seed

    check_insecure_seed(insecure_seed)
    if bug is not None and bug not in bugs:
        raise GSDError(f"unknown {label} bug {bug!r}; use one of {', '.join(bugs)}")
    if draws < 10:
        raise GSDError(f"--canaries (draws per neighbour) must be at least 10 (got {draws})")
    if not epsilon > 0:
        raise GSDError(f"--epsilon must be positive (got {epsilon})")


def neighbours(p: int = 2, rows: int = 0, clip: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """D (``rows`` x p, every row C e_2; ``rows=0``: one zero row, a gradient that says nothing) and
    D' = D plus the row C e_1."""
    if p not in (2, 3):
        raise GSDError(f"the DP-GSD audit works in p = 2 or 3 dimensions (got {p})")
    D = torch.zeros(max(rows, 1), p, dtype=torch.float64)
    D[:, 1] = clip if rows else 0.0
    extra = torch.zeros(1, p, dtype=torch.float64)
    extra[0, 0] = clip
    return D, torch.cat([D, extra])


def _grid(p: int, n: int) -> np.ndarray:
    """Points of the unit circle (p = 2) or sphere (p = 3) equally weighted under the uniform law."""
    if p == 2:
        t = (np.arange(n) + 0.5) * (2 * np.pi / n)
        return np.stack([np.cos(t), np.sin(t)], 1)
    z = -1 + (np.arange(n) + 0.5) * (2.0 / n)  # Archimedes: z is uniform on [-1, 1]
    phi = (np.arange(2 * n) + 0.5) * (np.pi / n)
    Z, P = np.meshgrid(z, phi, indexing="ij")
    r = np.sqrt(1 - Z**2)
    return np.stack([r * np.cos(P), r * np.sin(P), Z], -1).reshape(-1, 3)


def _log_densities(D: torch.Tensor, D2: torch.Tensor, epsilon: float, clip: float, n: int | None = None):
    """Grid points V of the circle or sphere and the log densities (w.r.t. the uniform law) of the
    k = 1 mechanism on D and D' there."""
    from ..subspace.dppca import bingham_scale, clip_rows

    scale = bingham_scale(epsilon, clip)
    V = _grid(D.shape[1], n or (20000 if D.shape[1] == 2 else 600))
    logs = []
    for G in (D, D2):
        Gc = clip_rows(G.double(), clip).numpy()
        q = scale * ((V @ Gc.T) ** 2).sum(1)  # v^T B v
        top = q.max()
        logs.append(q - (top + math.log(np.mean(np.exp(q - top)))))
    return V, logs


def exact_privacy_loss(D: torch.Tensor, D2: torch.Tensor, epsilon: float, clip: float, n: int | None = None) -> float:
    """max_v |log f_D(v) - log f_D'(v)| for the k = 1 exponential mechanism with density proportional
    to exp(v^T B v), B = epsilon / (2 C^2) G^T G (rows clipped to C), by numerical integration of
    the normalisers on a grid of the unit circle or sphere (Riemann sums; error far below 1e-6 here)."""
    _, logs = _log_densities(D, D2, epsilon, clip, n)
    return float(np.max(np.abs(logs[0] - logs[1])))


def thresholds(D: torch.Tensor, D2: torch.Tensor, epsilon: float, clip: float) -> list[float]:
    """The thresholds of the (v . e_1)^2 test, fixed before any draw from public quantities only: the
    quantiles :data:`QUANTILES` of (v . e_1)^2 under D, from the exact density on the grid."""
    V, logs = _log_densities(D, D2, epsilon, clip)
    x = V[:, 0] ** 2
    w = np.exp(logs[0]) / len(x)
    order = np.argsort(x)
    cdf = np.cumsum(w[order])
    return [float(x[order][min(np.searchsorted(cdf, q), len(x) - 1)]) for q in QUANTILES]


def _draws(G: torch.Tensor, epsilon: float, clip: float, draws: int, rng, bug: str | None, offset: int) -> np.ndarray:
    from ..subspace.dppca import private_top_k_subspace

    out = np.empty((draws, G.shape[1]))
    for i in range(draws):
        # the bug: the generator reproduced from a public seed (trial i's --seed), the same for D and D'
        gen = (offset + i) if bug == "public-seed" else rng
        out[i] = private_top_k_subspace(G, 1, epsilon, clip, generator=gen)[:, 0].numpy()
    return out


def audit_dpgsd(
    epsilon: float = 2.0,
    *,
    draws: int = 2000,
    p: int = 2,
    rows: int = 0,
    clip: float = 1.0,
    insecure_seed: int | None = None,
    bug: str | None = None,
    confidence: float = 0.95,
    replay: Callable | None = None,
) -> AuditResult:
    """Audit DP-GSD's k = 1 mechanism at ``epsilon`` (pure DP, delta = 0) with ``draws`` draws under
    each neighbour. ``bug="public-seed"`` draws from a generator seeded by the public trial seed (the
    old bug). ``details["exact_loss"]``: the exact privacy loss of the pair."""
    from ..subspace.dppca import private_top_k_subspace
    from ..privacy.randomness import private_rng

    check_draw_audit(epsilon, draws, insecure_seed, bug, BUGS, "DP-GSD")
    D, D2 = neighbours(p, rows, clip)
    rng = private_rng("audit-dpgsd", insecure_seed)
    # the public trial seeds s_i are the same under D and D' (offset 0): that is what the bug shares
    a = _draws(D, epsilon, clip, draws, rng, bug, 0)
    b = _draws(D2, epsilon, clip, draws, rng, bug, 0)
    replay = replay or (lambda i: private_top_k_subspace(D, 1, epsilon, clip, generator=i)[:, 0].numpy())
    ref = np.stack([replay(i) for i in range(draws)])
    ts = thresholds(D, D2, epsilon, clip)
    tests = [("(v.e1)^2", a[:, 0] ** 2, b[:, 0] ** 2, ts), ("replay", np.abs((a * ref).sum(1)), np.abs((b * ref).sum(1)), (1 - 1e-9,))]
    best, how = best_of_tests(tests, confidence)  # Bonferroni over every threshold of both statistics
    exact = exact_privacy_loss(D, D2, epsilon, clip)
    details = {"p": p, "rows": rows, "clip": clip, "draws_per_neighbour": draws, "exact_loss": exact, "best_test": how,
               "bug": bug, "neighbours": (f"D = {rows} x C e2" if rows else "D = one zero row") + ", D' = D + C e1 (add/remove one row)",
               "dp_randomness": "insecure seed" if insecure_seed is not None else "operating system"}
    # "correct": trials the best test classified right (in its region under one neighbour, out under the other)
    return AuditResult("dpgsd", float(epsilon), 0.0, best, 2 * draws, 2 * draws, int(how.get("correct", draws)), confidence, details)
