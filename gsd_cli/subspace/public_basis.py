"""DP-GSD's public-basis sketch: the span of the public candidates' own top-k gradient subspaces.

``--dp-sketch public`` projects the private per-sample gradients onto an orthonormal basis Q (p x D)
of span(V_1, ..., V_K) (the K public candidates' top-k subspaces at the ranking's w0), plus
``extra`` seeded Gaussian directions orthogonal to it, before the clip and the Bingham mechanism.

Privacy. Q is a function of public inputs only: the public examples and their random labels (from
``--seed``), w0 (from ``--seed``), the candidates named, and ``--seed`` for the extra directions.
It does not look at the private examples, their gradients or their number, nor at which candidate
wins. Each private row g (one example's gradient, after ``--row-norm``) becomes Q^T g, a function of
that example alone, and is then clipped to C; the score v^T (G Q)^T (G Q) v with the clipped rows
changes by at most C^2 when one row is added, removed or replaced, exactly as without the sketch, so
the exponential mechanism in R^D keeps its guarantee (:mod:`gsd_cli.subspace.dppca`), and mapping its draw
back (V = Q V_D) and comparing it with every candidate is post-processing.

Utility. The Bingham draw now lives in D = K k (+ extra) dimensions instead of p, so each step's
eigenvalue bound epsilon m / (2k) is compared with D / 2, not p / 2; and every candidate's subspace
lies in span(Q), so the distance d(Q V_D, V_j) = sqrt(1 - ||(Q^T V_j)^T V_D||_F^2 / k) is measured
within the sketch space, where a uniformly random k-subspace has distance about sqrt(1 - k/D).
The private subspace's part outside span(Q) is invisible; the ``extra`` random directions let a
private subspace unlike every candidate show as far from all of them rather than be forced inside.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from ..errors import GSDError

#: the value of ``--dp-sketch`` that selects this sketch (``public+R``: with R extra random directions)
PUBLIC = "public"


def parse_dp_sketch(value) -> int | str | None:
    """``--dp-sketch``: None (the default), ``none``/0 (no sketch), a whole number D >= 1 (Gaussian
    sketch to D dimensions), ``public`` or ``public+R`` (the public basis, with R >= 0 extra random
    directions). Returns None for the default, 0 for none, an int D, or the normalised ``public[+R]``."""
    if value is None or isinstance(value, bool):
        if isinstance(value, bool):
            raise GSDError(f"--dp-sketch must be none, a whole number of dimensions, public or public+R (got {value!r})")
        return None
    if isinstance(value, (int, np.integer)):
        if value < 0:
            raise GSDError(f"--dp-sketch must be at least 1 dimension, none, public or public+R (got {value})")
        return int(value)
    s = str(value).strip().lower()
    if s in ("none", "0", "off"):
        return 0
    if s.isdigit():
        return parse_dp_sketch(int(s))
    if s == PUBLIC:
        return PUBLIC
    if s.startswith(PUBLIC + "+") and s[len(PUBLIC) + 1:].isdigit():
        extra = int(s[len(PUBLIC) + 1:])
        return PUBLIC if extra == 0 else f"{PUBLIC}+{extra}"
    raise GSDError(f"--dp-sketch must be none, a whole number of dimensions (a Gaussian sketch), public or "
                   f"public+R (the public candidates' subspaces plus R random directions); got {value!r}")


#: the sketch under ``--dp`` when ``--dp-sketch`` is not given (None: no sketch)
DP_DEFAULT = None


def resolve_dp_sketch(value, k: int, private: bool) -> int | str | None:
    """The sketch a ranking uses: None (none), a Gaussian dimension D >= k, or ``public[+R]`` (DP only).
    ``value`` as :func:`parse_dp_sketch` takes it; not given: :data:`DP_DEFAULT` under DP, else none."""
    v = parse_dp_sketch(value)
    if v is None:
        v = DP_DEFAULT if private else None
    if not v:
        return None
    if isinstance(v, int):
        if not 1 <= k <= v:
            raise GSDError(f"--dp-sketch {v} must be at least k={k}")
        return v
    if not private:
        raise GSDError(f"--dp-sketch {v} builds the basis for DP-GSD's mechanism; use it with --dp (without --dp the full GSD is exact)")
    return v


def public_extra(value) -> int | None:
    """The number of extra random directions of a ``public[+R]`` sketch, None for any other sketch."""
    if not (isinstance(value, str) and value.startswith(PUBLIC)):
        return None
    return int(value[len(PUBLIC) + 1:]) if "+" in value else 0


def public_basis(subspaces: Sequence[torch.Tensor], extra: int = 0, seed: int = 0, tol: float = 1e-6,
                 block: int = 16384) -> torch.Tensor:
    """An orthonormal basis Q (p x D, float64) of span(V_1, ..., V_K) plus ``extra`` random directions.

    ``subspaces``: the public candidates' bases (p x k_j, orthonormal columns), in the ranking's
    order of candidates. The span's basis is the left singular vectors of [V_1 ... V_K] whose singular
    values exceed ``tol`` times the largest (candidates whose subspaces overlap give fewer than K k
    dimensions; D is then smaller, and it is still a function of public data only). The extra
    directions are Gaussian, drawn from ``seed`` alone in row blocks (as :func:`gsd_cli.distance.side.sketch`),
    and orthonormalised against the span. Deterministic: the same public inputs give the same Q bit
    for bit, whatever the private data."""
    if not subspaces:
        raise GSDError("--dp-sketch public needs at least one public candidate")
    if extra < 0:
        raise GSDError(f"the public basis's extra random directions must be >= 0 (got {extra})")
    p = subspaces[0].shape[0]
    if any(V.shape[0] != p for V in subspaces):
        raise GSDError("the public subspaces of one ranking must have the same number of parameters")
    M = torch.cat([V.detach().to("cpu", torch.float64) for V in subspaces], dim=1)
    U, s, _ = torch.linalg.svd(M, full_matrices=False)
    Q = U[:, s > tol * s[0]] if len(s) and s[0] > 0 else U[:, :0]
    if extra:
        R = torch.zeros(p, extra, dtype=torch.float64)
        for b, j in enumerate(range(0, p, block)):
            w = min(block, p - j)
            gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 0x70756262, b]).generate_state(1)[0]))
            R[j : j + w] = torch.randn(w, extra, generator=gen, dtype=torch.float64)
        for _ in range(2):  # twice: classical Gram-Schmidt against Q loses orthogonality once
            R = R - Q @ (Q.T @ R)
        Qr = torch.linalg.qr(R)[0]
        Q = torch.cat([Q, Qr], dim=1)
    if Q.shape[1] > p:
        raise GSDError(f"the public basis has {Q.shape[1]} directions but only {p} parameters; use fewer extra directions")
    return Q.contiguous()


def project_rows(G: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """G Q (m x D, float64): each private row g becomes its coordinates Q^T g in the public basis, a
    function of that row alone (the clip comes after)."""
    return G.to(torch.float64) @ Q.to(G.device)


def uniform_in_basis(k: int, D: int) -> float:
    """sqrt(1 - k/D): the root-mean-square distance, within a D-dimensional sketch space, between a
    fixed k-subspace and a uniformly random one (DESIGN.md, E[d^2] = 1 - k/p with p = D)."""
    return math.sqrt(max(0.0, 1.0 - k / D))
