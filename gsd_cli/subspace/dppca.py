"""DP-GSD's private side: clipping and an exact, low-rank real Bingham sampler (exponential mechanism).

Privacy statement (paper 004 Sec. 4.3, Algorithm 3; Chaudhuri, Sarwate, Sinha 2013; DESIGN.md).
Each private per-sample gradient is clipped to L2 norm C. For a unit vector v the score
q(v) = v^T G^T G v = sum_i (g_i . v)^2 changes by at most C^2 when one example is replaced (one term
(g_i . v)^2 in [0, C^2] changes). The exponential mechanism with sensitivity C^2 therefore samples v
with density proportional to exp(epsilon * q(v) / (2 C^2)) = exp(v^T B v), B = epsilon / (2 C^2) G^T G,
and is epsilon-DP on the matrix G under replace-one-row; adding or removing one row changes q(v) by
(g . v)^2 in [0, C^2], also within the sensitivity, so it is epsilon-DP under add/remove-one-row too.
How the rows of G are drawn from the private *dataset* (secretly, without replacement) and why the
whole pipeline is then epsilon-DP under add/remove-one-example: :mod:`gsd_cli.distance.dpgsd`.
Paper 004 writes the scale as (m epsilon / 2) A with A = G^T G / m and states epsilon / c^2-DP; with
that scale the mechanism is (epsilon c^2)-DP. As DESIGN.md says, the c^2 belongs in B; the paper's
scale is not used.

Mechanism ``sequential`` (the one implemented): k unit vectors drawn one after another, the j-th
from the vector Bingham density proportional to exp(v^T B_j v) on the unit sphere of the orthogonal
complement of v_1..v_{j-1}, with B_j = (epsilon / k) / (2 C^2) G^T G. Each step is an exponential
mechanism whose score has sensitivity C^2 (restricting the sphere does not change that), so each is
(epsilon / k)-DP given the earlier outputs, and the k-step adaptive composition is epsilon-DP (basic
composition of pure DP). Each draw is *exact* (rejection sampling), so the guarantee holds as stated.

The vector sampler is Kent, Ganeiber and Mardia (2018): for the density exp(-x^T A x) with A positive
semidefinite (here A = mu_max I - B, which defines the same density on the sphere), the angular
central Gaussian envelope with Omega = I + 2A/b, where b solves sum_i 1 / (b + 2 lambda_i(A)) = 1,
and acceptance probability exp(-x^T A x) (x^T Omega x)^(q/2) / M(b), M(b) = exp(-(q - b)/2) (q/b)^(q/2).
B has rank r <= m, so the proposal is simulated in reduced coordinates: its r coefficients on B's
eigenvectors and the squared norm of its component in the (q - r)-dimensional rest (a chi-square),
which is all the acceptance test needs; only the accepted draw is assembled in R^p, with products by
G and G^T. Memory O(p m); no p x p matrix is ever formed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import GSDError
from . import gram

MECHANISMS = ("sequential", "matrix")


class DenseOperator:
    """A dense G (m x p) behind the operator interface the samplers use: ``shape``, ``device``,
    ``gram()`` (G G^T, float64), ``matvec(X)`` = G X and ``rmatvec(Y)`` = G^T Y (float64), ``scaled(f)``
    (rows times f). :class:`gsd_cli.ghost.GhostOperator` provides the same without G."""

    def __init__(self, G: torch.Tensor):
        self.G = G
        self.shape = tuple(G.shape)
        self.device = G.device
        self._K = None

    def gram(self) -> torch.Tensor:
        if self._K is None:
            self._K = gram(self.G)
        return self._K

    def matvec(self, X: torch.Tensor) -> torch.Tensor:
        return (self.G @ X.to(self.G.dtype)).to(torch.float64)

    def rmatvec(self, Y: torch.Tensor, out_dtype: torch.dtype = torch.float64) -> torch.Tensor:
        # written (Y^T G)^T: with G row-major this is ~7x faster than G^T Y
        return (Y.T.to(self.G.dtype) @ self.G).T.to(out_dtype)

    def scaled(self, f: torch.Tensor) -> "DenseOperator":
        return DenseOperator(self.G * f.to(self.G.dtype)[:, None])


def as_operator(G) -> "DenseOperator":
    """A tensor becomes a :class:`DenseOperator`; an operator is returned as it is."""
    return DenseOperator(G) if isinstance(G, torch.Tensor) else G


def zero_nonfinite_rows(G: torch.Tensor) -> torch.Tensor:
    """G with every row that holds a NaN or an infinity set to zero (other rows unchanged)."""
    ok = torch.isfinite(G).all(dim=1, keepdim=True)
    return G if bool(ok.all()) else torch.where(ok, G, torch.zeros((), dtype=G.dtype, device=G.device))


def clip_rows(G: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row of G with norm above ``clip`` down to norm ``clip``; rows inside are untouched.
    A row with a NaN or infinite entry becomes zero (a second line of defence behind the data check:
    one such row would otherwise turn the whole release into NaN, which shows its presence)."""
    _check_positive(clip, "--clip")
    G = zero_nonfinite_rows(G)
    norms = G.norm(dim=1, keepdim=True)
    factor = torch.where(norms > clip, clip / norms, torch.ones_like(norms))
    return G * factor


def bingham_scale(epsilon: float, clip: float) -> float:
    """The exponent's scale: B = scale * G^T G with scale = epsilon / (2 C^2) (exponential mechanism,
    score v^T G^T G v with sensitivity C^2 under replace-one)."""
    check_dp_epsilon(epsilon)
    _check_positive(clip, "--clip")
    if not 1e-150 <= clip <= 1e150:  # C^2 must be a normal float64 number
        raise GSDError(f"--clip {clip:g}: give a clip norm between 1e-150 and 1e150 (C^2 underflows or overflows float64)")
    return epsilon / (2.0 * clip * clip)


#: the largest --epsilon DP-GSD samples with (float64 keeps exp(tr(V^T B V)) meaningful below it)
MAX_EPSILON = 1e12


def check_dp_epsilon(epsilon: float, name: str = "--epsilon") -> None:
    """A DP ranking's epsilon: positive, finite and at most :data:`MAX_EPSILON`; ``name``: the option the
    user gave it with (``gsd train --auto-select``: ``--select-epsilon``)."""
    _check_positive(epsilon, name)
    if epsilon > MAX_EPSILON:  # B's top eigenvalue is up to epsilon m / 2: beyond, exp() of the density overflows
        raise GSDError(f"{name} {epsilon:g}: at most {MAX_EPSILON:g} (a pure-DP epsilon that large protects nothing; "
                       f"for the non-private ranking drop {'--dp' if name == '--epsilon' else name})")


def _check_positive(x: float, name: str) -> None:
    if not (isinstance(x, (int, float)) and math.isfinite(x) and x > 0):
        raise GSDError(f"{name} must be a positive finite number (got {x})")


def _solve_b(lam_top: np.ndarray, n_rest: int, lam_rest: float, q: int) -> float:
    """Root b in (0, q] of sum_i 1/(b + 2 lambda_i) = 1 over the q eigenvalues of A: ``lam_top`` (the
    r eigenvalues on B's range, smallest is 0) and ``lam_rest`` with multiplicity ``n_rest``."""

    def f(b: float) -> float:
        return float(np.sum(1.0 / (b + 2.0 * lam_top))) + n_rest / (b + 2.0 * lam_rest) - 1.0

    lo, hi = 1e-300, float(q)  # f(lo) > 0 (the smallest lambda is 0), f(q) <= 0
    if f(hi) >= 0:  # only when A = 0 (uniform): b = q, Omega = I
        return hi
    for _ in range(200):  # bisection in log space: f is decreasing in b
        mid = math.sqrt(lo * hi)
        if f(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return hi


@dataclass
class _Reduced:
    """The Bingham parameter on the current sphere: eigenvalues mu (r,) of B there, the eigen-
    coordinates U, sigma of G_j G_j^T (B's eigenvectors are G_j^T U / sigma)."""

    mu: np.ndarray
    U: torch.Tensor
    sigma: torch.Tensor


def _reduced_kgm(mu: np.ndarray, q: int, rng: np.random.Generator, batch: int = 256, max_tries: int = 10_000_000):
    """Exact draw of the reduced coordinates of x ~ Bingham(exp(x^T B x)) on the unit sphere of R^q,
    where B has eigenvalues ``mu`` (r of them, >= 0) and 0 on the other q - r directions.

    Returns ``(c, rest)``: x's coefficients on B's r eigenvectors and the norm of its component in the
    rest (whose direction is uniform, independent of everything else)."""
    r = len(mu)
    n_rest = q - r
    mu_max = float(mu.max()) if r else 0.0
    lam_top = mu_max - mu  # A = mu_max I - B
    b = _solve_b(lam_top, n_rest, mu_max, q)
    omega_top = 1.0 + 2.0 * lam_top / b
    omega_rest = 1.0 + 2.0 * mu_max / b
    log_m = -(q - b) / 2.0 + (q / 2.0) * math.log(q / b)
    tries = 0
    while tries < max_tries:
        z = rng.standard_normal((batch, r)) / np.sqrt(omega_top)  # N(0, Omega^-1) on B's range
        rest2 = rng.chisquare(n_rest, size=batch) / omega_rest if n_rest > 0 else np.zeros(batch)
        norm2 = (z * z).sum(axis=1) + rest2
        t = ((z * z) @ omega_top + omega_rest * rest2) / norm2  # x^T Omega x for x = y / |y|
        log_ratio = -b * (t - 1.0) / 2.0 + (q / 2.0) * np.log(t) - log_m  # <= 0 (KGM's bound)
        accept = np.log(rng.uniform(size=batch)) < log_ratio
        tries += batch
        if accept.any():
            i = int(np.argmax(accept))
            scale = 1.0 / math.sqrt(norm2[i])
            return z[i] * scale, math.sqrt(rest2[i]) * scale
    raise RuntimeError("Bingham rejection sampler did not accept; please report this as a bug")


def _reduce(K: torch.Tensor, scale: float, tol_rel: float = 1e-12) -> _Reduced:
    """Eigen-decomposition of K_j; eigenvalues at rounding level are zero (they join the rest)."""
    evals, U = torch.linalg.eigh(K)
    top = float(evals[-1]) if len(evals) else 0.0
    keep = evals > max(top, 0.0) * tol_rel
    evals, U = evals[keep], U[:, keep]
    return _Reduced(mu=(scale * evals).cpu().numpy().astype(np.float64), U=U, sigma=evals.sqrt())


def _checked_gram(G, k: int, K: torch.Tensor | None) -> torch.Tensor:
    m, p = G.shape
    if not 1 <= k <= min(m, p):
        raise GSDError(f"k must lie in 1..min(m, p) = {min(m, p)} (got {k})")
    K = G.gram() if K is None else K.to(torch.float64)
    if not torch.isfinite(K).all():  # a NaN or inf gradient entry makes its row and column of K non-finite
        raise GSDError("the private gradients contain NaN or inf; check the model and inputs")
    return K


def _gmul(G, v: torch.Tensor) -> torch.Tensor:  # G @ v for float64 v (p x c)
    return G.matvec(v)


def _restricted_draw(G, K, X, GX, scale, g, Gg, generator):
    """One exact draw x from exp(x^T (scale G^T G) x) on the unit sphere of span(X)^perp (X p x r
    orthonormal, GX = G X), and G x. ``g`` is a standard normal p-vector (``Gg`` = G g) that supplies
    the uniform direction of the part outside B's range. One pass over G (G^T times two vectors); G x
    comes from m x m products, G (G P)^T a = K_j a."""
    p = G.shape[1]
    q = p - X.shape[1]
    Kj = K - GX @ GX.T  # (G P)(G P)^T with P the projector onto span(X)^perp
    red = _reduce(Kj, scale)
    c, rest = _reduced_kgm(red.mu, q, generator)
    c = torch.from_numpy(c).to(G.device)
    # uniform direction u in span(X)^perp ∩ span(W)^perp, W = (G P)^T U / sigma
    Xg = X.T @ g
    g_perp = g - X @ Xg
    GPg = Gg - GX @ Xg  # (G P) g = G g_perp
    A = torch.stack([red.U @ ((red.U.T @ GPg) / red.sigma**2), red.U @ (c / red.sigma)], dim=1)
    # (G P)^T A = [W W^T g, W c]
    GPtA = G.rmatvec(A) - X @ (GX.T @ A)
    KA = Kj @ A  # G (G P)^T A
    u = g_perp - GPtA[:, 0]
    un = u.norm()
    w = rest / un if un > 0 else 0.0
    x = GPtA[:, 1] + w * u
    Gx = KA[:, 1] + w * (GPg - KA[:, 0])
    Xx = X.T @ x  # one Gram-Schmidt pass against rounding, then normalise
    x, Gx = x - X @ Xx, Gx - GX @ Xx
    nrm = x.norm()
    return x / nrm, Gx / nrm


def sample_sequential(
    G: torch.Tensor, k: int, scale: float, generator: np.random.Generator, K: torch.Tensor | None = None
) -> torch.Tensor:
    """k orthonormal vectors, the j-th exactly from the vector Bingham exp(v^T (scale G^T G) v) on the
    unit sphere of the orthogonal complement of the earlier ones. Returns V (p x k, float64).

    Uses only products with G and G^T and m x m matrices (``K`` = G G^T in float64 may be passed in):
    one pass over G per vector, plus one for all k random directions up front.
    """
    G = as_operator(G)
    m, p = G.shape
    K = _checked_gram(G, k, K)
    gs = torch.from_numpy(generator.standard_normal((p, k))).to(G.device)
    Ggs = _gmul(G, gs)
    X = torch.zeros(p, 0, dtype=torch.float64, device=G.device)
    GX = torch.zeros(m, 0, dtype=torch.float64, device=G.device)
    for j in range(k):
        x, Gx = _restricted_draw(G, K, X, GX, scale, gs[:, j], Ggs[:, j], generator)
        X = torch.cat([X, x.unsqueeze(1)], dim=1)
        GX = torch.cat([GX, Gx.unsqueeze(1)], dim=1)
    return X


def sample_matrix_gibbs(
    G: torch.Tensor, k: int, scale: float, generator: np.random.Generator, sweeps: int = 10,
    K: torch.Tensor | None = None,
) -> torch.Tensor:
    """Hoff's (2009) Gibbs sampler for the matrix Bingham exp(tr(V^T (scale G^T G) V)) on the Stiefel
    manifold: each sweep redraws every column, exactly, from its conditional (the vector Bingham on
    the sphere orthogonal to the other columns). Started from :func:`sample_sequential`'s draw.

    A Markov chain: after finitely many sweeps its output is *not* an exact matrix-Bingham sample, and
    no bound on its distance to the stationary law is known, so the exponential mechanism's epsilon-DP
    (which holds for the exact law) is not proven for this output.
    """
    if sweeps < 1:
        raise GSDError(f"--gibbs-sweeps must be at least 1 (got {sweeps})")
    G = as_operator(G)
    m, p = G.shape
    K = _checked_gram(G, k, K)
    V = sample_sequential(G, k, scale, generator, K)
    GV = _gmul(G, V)
    for _ in range(sweeps):
        gs = torch.from_numpy(generator.standard_normal((p, k))).to(G.device)
        Ggs = _gmul(G, gs)
        for j in range(k):
            others = [i for i in range(k) if i != j]
            x, Gx = _restricted_draw(G, K, V[:, others], GV[:, others], scale, gs[:, j], Ggs[:, j], generator)
            V[:, j], GV[:, j] = x, Gx
    return V


def bingham_dense(B: torch.Tensor, n: int, generator: np.random.Generator) -> torch.Tensor:
    """Reference sampler for tests and small p: n exact draws from exp(x^T B x) on the unit sphere of
    R^p, by Kent-Ganeiber-Mardia with the dense p x p parameter (B symmetric). Returns (n, p)."""
    Bn = B.detach().to(torch.float64).cpu().numpy()
    p = Bn.shape[0]
    lam, Q = np.linalg.eigh(Bn)
    A = lam.max() - lam
    b = _solve_b(A, 0, 0.0, p)
    omega = 1.0 + 2.0 * A / b
    log_m = -(p - b) / 2.0 + (p / 2.0) * math.log(p / b)
    out = []
    while len(out) < n:
        y = generator.standard_normal((4 * n, p)) / np.sqrt(omega)
        x = y / np.linalg.norm(y, axis=1, keepdims=True)
        xAx = (x * x) @ A
        t = (x * x) @ omega
        log_ratio = -xAx + (p / 2.0) * np.log(t) - log_m
        acc = np.log(generator.uniform(size=len(x))) < log_ratio
        out.extend(list(x[acc] @ Q.T))
    return torch.from_numpy(np.array(out[:n]))


def private_top_k_subspace(
    G: torch.Tensor,
    k: int,
    epsilon: float,
    clip: float,
    mechanism: str = "sequential",
    generator: np.random.Generator | int | None = None,
    sweeps: int = 10,
) -> torch.Tensor:
    """A DP estimate of the top-k right singular subspace of G (rows = per-example gradients).

    ``G`` is a tensor (m x p) or an operator with ``shape``, ``gram()``, ``matvec``, ``rmatvec`` and
    ``scaled`` (:class:`DenseOperator`, :class:`gsd_cli.ghost.GhostOperator`).

    Rows are clipped to norm ``clip``, then ``mechanism`` samples V (p x k, orthonormal, float64):

    * ``sequential``: k exact vector-Bingham draws with epsilon/k each: pure epsilon-DP (one row
      added, removed or replaced).
    * ``matrix``: paper 004's matrix Bingham exp(tr(V^T B V)), B = epsilon / (2 C^2) G^T G, by
      ``sweeps`` sweeps of Hoff's Gibbs sampler. Not an exact sample: no DP guarantee is proven for
      it (see :func:`mechanism_guarantee`).
    """
    if mechanism not in MECHANISMS:
        raise GSDError(f"unknown DP mechanism {mechanism!r}; use one of {', '.join(MECHANISMS)}")
    scale = bingham_scale(epsilon, clip)
    rng = generator if isinstance(generator, np.random.Generator) else np.random.default_rng(generator)
    if isinstance(G, torch.Tensor):
        Gc = clip_rows(G, clip)
    else:  # an operator: the row norms come from the Gram diagonal
        _check_positive(clip, "--clip")
        diag = G.gram().diagonal()
        if not bool(torch.isfinite(diag).all()):
            # A NaN/inf row: raising here would reveal that one private example is bad. Recompute with
            # such examples' factors zeroed (per example, as clip_rows zeroes a materialised row).
            G.zero_nonfinite, G._K, G._store = True, None, None
            diag = G.gram().diagonal()
        norms = diag.clamp_min(0).sqrt()
        Gc = G.scaled(torch.where(norms > clip, clip / norms, torch.ones_like(norms)))
    if isinstance(Gc, torch.Tensor) and Gc.shape[0] > Gc.shape[1]:
        Gc = square_factor(Gc)
    if mechanism == "matrix":
        return sample_matrix_gibbs(Gc, k, scale, rng, sweeps)
    return sample_sequential(Gc, k, scale / k, rng)


def square_factor(G: torch.Tensor) -> torch.Tensor:
    """R (p x p, float64, upper triangular) with R^T R = G^T G, for a clipped G with m > p rows (a
    sketched matrix): the Bingham parameter B = scale * G^T G, hence the exponential mechanism's
    density and every draw's law, depends on G only through G^T G, so the samplers may run on R
    instead: each step's eigen-decomposition is then p x p instead of m x m. R comes from the QR
    decomposition of G (no G^T G is formed, so no precision is lost to squaring)."""
    return torch.linalg.qr(G.to(torch.float64), mode="r")[1]
