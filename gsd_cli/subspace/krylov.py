"""Top-k subspace by randomized block Krylov, certified in float64 (issue 21, "speed").

The exact path (:func:`gsd_cli.subspace.top_k_subspace`, ``method="exact"``) forms the float64 Gram
matrix of the m x p gradient matrix G, O(m^2 p), then eigh, O(m^3). Here K = A A^T with A = G when
m <= p (n = m, N = p), else A = G^T (n = p, N = m), and K is only ever applied to thin blocks:

1. Rough phase, float32. A block Krylov space [X0, K X0, ..., K^q X0] (q at most :data:`DEPTH`; the phase
   stops once the Ritz pairs of the space so far, certified as below but from the float32 products, reach
   :data:`ROUGH_TOL` or stop improving: float32 rounding allows no better) from a Gaussian start X0
   (n x b, b = k + oversample), each product K X = A (A^T X) in float32, each block orthonormalised in
   float64 against the earlier ones; Rayleigh-Ritz there keeps the top ``keep`` Ritz vectors Q.
   X0 comes from a fixed generator (``START_SEED``): the start is data-independent and the result
   reproducible. It is not private randomness and needs none: the non-private subspace is no DP
   release (DP-GSD draws its private subspace by its own mechanism, :mod:`gsd_cli.subspace.dppca`).
2. Exact phase, float64. Z = K Q with the column blocks of A converted to float64 on the fly (a G
   of at most HOLD64_BYTES in float64 is converted once and kept), Rayleigh-Ritz on span(Q): Ritz values theta_1 >= theta_2 >= ..., vectors
   U = Q Y, residuals R = K U - U diag(theta), all exact to float64 rounding. Until certified (below),
   Q grows by the orthonormalised residuals of its top ``keep`` Ritz vectors (one block-Krylov step,
   in float64), at most ``max_refine`` times; then it gives up (``None``: the caller takes the exact path).
   The same passes give A^T Q, so V = A^T U_k diag(1/s) costs no further pass while A^T Q (p x dim,
   float64) takes at most half of G's memory; past that it is one more pass, as in the exact path.

Certificate. The sin-theta theorem (Davis & Kahan, SIAM J. Numer. Anal. 7, 1970): "for orthonormal U_k
with residual R_k = K U_k - U_k Theta_k, if the eigenvalues of Theta_k lie in [a, b] and every other
eigenvalue of K lies outside (a - delta, b + delta), then ||sin Theta(U_k, X_k)||_F <= ||R_k||_F / delta",
X_k the eigenspace of those eigenvalues. Kahan's residual bound for Ritz values (Parlett, The Symmetric
Eigenvalue Problem, ch. 11) puts eigenvalues of K within ||R_{k+1}||_2 of theta_1..theta_{k+1};
assuming the random start missed none of the top k+1 eigenvectors (it has b > k Gaussian columns, and
the float32 rounding adds components in every direction), lambda_{k+1} <= theta_{k+1} + ||R_{k+1}||_F,
so delta = theta_k - theta_{k+1} - ||R_{k+1}||_F. V = A^T U_k diag(1/s) is no farther from the right
singular subspace: with U_k = U C + U_perp E, A^T U_k = V S C + V_perp S_perp E, so tan Theta_V <=
(s_{k+1} / s_k) tan Theta_U (and tan = sin to first order at 1e-7). The normalised projection metric is
a metric with d(V, V') = ||sin Theta||_F / sqrt(k), so by the triangle inequality a distance moves by
at most :func:`certificate` = ||R_k||_F / delta / sqrt(k); ``tol`` caps it (1e-7 by default: a
distance between two such subspaces is within 2e-7 of the exact one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: Float32 Krylov steps, at most (depth + 1 passes over G). With ``adaptive`` (the default) the phase
#: stops earlier, once the float32 Ritz certificate is below :data:`ROUGH_TOL` or stalls (measured on the
#: six default candidates' probe gradients, m = 2000, k = 16, ``benchmarks/bench_krylov_depth.py``: that
#: certificate reaches the float32 floor, 2e-6 to 7e-6, after 5 or 6 steps where s16/s17 >= 1.038,
#: and after 9 where s16/s17 = 1.015, the near tie; a fixed depth of 8 spent 2 or 3 steps too many on
#: five of them and was just enough on the sixth).
DEPTH = 12
#: Float32 steps before the first check (the certificate is infinite before about k / b + 2 steps).
MIN_DEPTH = 3
#: Float32 certificate (:func:`certificate` of the float32 Ritz pairs) at which the rough phase stops:
#: near float32's floor for these matrices, so the float64 phase starts from the best float32 can give.
ROUGH_TOL = 1e-5
#: ... or when a step improves the certificate by less than this factor (it has reached its floor).
STALL = 0.5
#: Ritz vectors carried into float64 beyond k (also the width of each refinement): k + 16 took 20% less
#: CPU than 2k + 16 on the same six matrices, with at most one more float64 pass.
KEEP_EXTRA = 16
#: Seed of the Gaussian start block (fixed, public: reproducible results, no private randomness).
START_SEED = 20_260_521
#: Bound on the change of a projection-metric distance, per subspace, that certifies convergence.
TOL = 1e-7
#: Bytes of the float64 block of A that the exact phase converts at a time (n x block): larger blocks
#: are faster (measured: p = 262144, m = 1000, 5.2 s a pass with 2048 columns, 3.5 s with 8192).
BLOCK_BYTES = 64 << 20
#: Largest G (in float64 bytes) that the exact phase converts once and keeps across its passes instead of
#: converting block by block on every pass (the default rank's 2000 x 30202: 483 MB; larger models keep
#: the blockwise path and never hold a float64 copy).
HOLD64_BYTES = 512 << 20
#: Columns (rows) of A per float32 partial product in the rough phase (partial sums added in float64).
ROUGH_BLOCK = 8192


@dataclass
class KrylovInfo:
    """How the randomized method went: ``converged`` (certified), ``bound`` (on ||sin Theta||_F /
    sqrt(k), the most a distance can move), passes over G in float32 and float64, final basis size,
    and the top k+1 Ritz values (eigenvalues of G G^T: squared singular values); ``depth``: the float32
    Krylov steps taken."""

    converged: bool = False
    bound: float = math.inf
    passes32: int = 0
    passes64: int = 0
    depth: int = 0
    dim: int = 0
    values: tuple = ()


class GramOperator:
    """K = A A^T for a dense m x p matrix G, A = G (m <= p) or G^T: products on thin n x w blocks,
    in float32 (``rough``) or float64 (``exact``, which also returns A^T X when ``keep_w``)."""

    def __init__(self, G: torch.Tensor, block: int | None = None):
        self.G = G if G.dtype in (torch.float32, torch.float64) else G.float()
        self._G64: torch.Tensor | None = None
        self.t = G.shape[0] > G.shape[1]  # A = G^T
        self.n, self.N = min(G.shape), max(G.shape)
        self.block = block or min(16384, max(1024, 1 << ((BLOCK_BYTES // (8 * self.n)).bit_length() - 1)))
        self.device = G.device

    def rough(self, X: torch.Tensor) -> torch.Tensor:
        """K X with products in G's own precision (float32 for gradients), returned in float64. The
        long sums (over N) are split into blocks of ``ROUGH_BLOCK`` whose partial products add up in
        float64, so the rounding does not grow with N (it sets how close the float32 phase gets)."""
        G, Xr = self.G, X.to(self.G.dtype)
        Z = torch.zeros(X.shape[1], self.n, dtype=torch.float64, device=self.device)
        if self.t:  # K X = G^T (G X), the sum over G's rows by blocks
            Y = G @ Xr
            for j in range(0, self.N, ROUGH_BLOCK):
                Z += (Y[j : j + ROUGH_BLOCK].T @ G[j : j + ROUGH_BLOCK]).to(torch.float64)
        else:  # K X = G (G^T X), the sum over G's columns by blocks
            Yt = Xr.T @ G
            for j in range(0, self.N, ROUGH_BLOCK):
                Z += (Yt[:, j : j + ROUGH_BLOCK] @ G[:, j : j + ROUGH_BLOCK].T).to(torch.float64)
        return Z.T

    def exact(self, X: torch.Tensor, keep_w: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(K X, A^T X or None)`` in float64, one pass over G by blocks of ``block`` columns of A;
        a G of at most :data:`HOLD64_BYTES` in float64 is converted once and kept for the next passes."""
        if self.G.numel() * 8 <= HOLD64_BYTES:
            if self._G64 is None:
                self._G64 = self.G.to(torch.float64)
            G64 = self._G64
            if self.t:  # A = G^T: A^T X = G X, K X = G^T (G X)
                W = G64 @ X
                return G64.T @ W, (W if keep_w else None)
            Wt = X.T @ G64  # (A^T X)^T = X^T G
            return (Wt @ G64.T).T, (Wt.T if keep_w else None)
        Xt = X.T.contiguous()
        Zt = torch.zeros(X.shape[1], self.n, dtype=torch.float64, device=self.device)
        W = []
        for j in range(0, self.N, self.block):
            if self.t:  # A's columns j.. are G's rows j..: A_j^T X = G_j X, Z += G_j^T (G_j X)
                Gj = self.G[j : j + self.block].to(torch.float64)
                Wt = (Gj @ X).T
                Zt.addmm_(Wt, Gj)
            else:  # A_j = G[:, j..]: W_j^T = X^T A_j, Z^T += W_j^T A_j^T
                Aj = self.G[:, j : j + self.block].to(torch.float64)
                Wt = Xt @ Aj
                Zt.addmm_(Wt, Aj.T)
            if keep_w:
                W.append(Wt)
        return Zt.T, (torch.cat(W, 1).T if keep_w else None)

    def rmat(self, U: torch.Tensor) -> torch.Tensor:
        """A^T U in float64 for A = G (U m x w), by column blocks, each as (U^T G_j)^T."""
        Ut = U.T.contiguous()
        return torch.cat([(Ut @ self.G[:, j : j + self.block].to(torch.float64)).T for j in range(0, self.N, self.block)])


def orthonormalise(X: torch.Tensor, Q: torch.Tensor | None = None) -> torch.Tensor:
    """Orthonormal basis of the part of span(X) orthogonal to span(Q) (Q orthonormal): block
    Gram-Schmidt and Householder QR, twice ("twice is enough"), so even a block that lies almost in
    span(Q) comes back orthonormal and orthogonal to Q to float64 rounding."""
    for _ in range(2):
        if Q is not None:
            X = X - Q @ (Q.T @ X)
        X = torch.linalg.qr(X)[0]
    return X


def _ritz(Q: torch.Tensor, Z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rayleigh-Ritz: eigenpairs of Q^T K Q (Z = K Q), largest first."""
    T = Q.T @ Z
    theta, Y = torch.linalg.eigh((T + T.T) / 2)
    return theta.flip(0), Y.flip(1)


def certificate(theta: torch.Tensor, R: torch.Tensor, k: int) -> float:
    """Bound on ||sin Theta||_F / sqrt(k) between span(U_k) and the top-k eigenspace (module docstring):
    ||R_k||_F / (theta_k - theta_{k+1} - ||R_{k+1}||_F) / sqrt(k); infinite when that gap is not positive."""
    delta = float(theta[k - 1] - theta[k]) - float(R[:, : k + 1].norm())
    if not delta > 0:
        return math.inf
    return float(R[:, :k].norm()) / delta / math.sqrt(k)


class MatrixOperator:
    """An explicit symmetric positive semi-definite n x n matrix K (the Gram path's G G^T), as an
    operator of :func:`krylov_eig`: both products in float64 (they cost O(n^2 w), not O(n^2 N))."""

    t = False

    def __init__(self, K: torch.Tensor):
        self.K = K.to(torch.float64)
        self.n = self.N = K.shape[0]
        self.device = K.device

    def rough(self, X: torch.Tensor) -> torch.Tensor:
        return self.K @ X

    def exact(self, X: torch.Tensor, keep_w: bool = False) -> tuple[torch.Tensor, None]:
        return self.K @ X, None


def krylov_eig(
    op,
    k: int,
    *,
    oversample: int = 16,
    depth: int = DEPTH,
    keep: int | None = None,
    max_refine: int = 5,
    tol: float = TOL,
    seed: int = START_SEED,
    info: KrylovInfo | None = None,
    keep_w: int = 0,
    adaptive: bool = True,
):
    """The top-k eigenpairs of the operator's K, certified (module docstring): ``(theta, U, Y, Ws)``
    with theta the Ritz values (descending), U = Q Y the Ritz vectors of the final basis Q, and Ws the
    blocks of A^T Q while Q has at most ``keep_w`` columns (else None); ``None`` when not certified to
    ``tol`` within ``max_refine`` float64 refinements or when n is too small for a Krylov space of
    ``depth`` >= 1 blocks.

    ``oversample``: start block b = k + oversample; ``depth``: float32 Krylov steps, at most (``adaptive``:
    fewer when the float32 phase has converged as far as float32 allows, see :data:`ROUGH_TOL`) or
    exactly (``adaptive=False``); ``keep``: Ritz vectors carried into float64 (default k +
    :data:`KEEP_EXTRA`), also the width of each refinement."""
    info = info if info is not None else KrylovInfo()
    n = op.n
    b = k + oversample
    depth = min(depth, n // b - 1)
    keep = min(keep or k + KEEP_EXTRA, b * (depth + 1))
    if depth < 1 or keep <= k:
        return None
    gen = torch.Generator().manual_seed(seed)
    blocks = [orthonormalise(torch.randn(n, b, generator=gen, dtype=torch.float64).to(op.device))]
    images = []
    last = math.inf
    for i in range(depth + 1):
        images.append(op.rough(blocks[-1]))
        info.passes32 += 1
        Q = torch.cat(blocks, 1)
        if adaptive and MIN_DEPTH <= i < depth:
            # stop when the Ritz vectors of the space so far are as good as float32 makes them:
            # the certificate from the float32 products (no extra pass) is below ROUGH_TOL or stalls
            theta, Y = _ritz(Q, torch.cat(images, 1))
            R = torch.cat(images, 1) @ Y[:, : k + 1] - (Q @ Y[:, : k + 1]) * theta[: k + 1]
            bound = certificate(theta, R, k)
            if bound <= ROUGH_TOL or bound > STALL * last:
                break
            last = bound
        if i < depth:
            blocks.append(orthonormalise(images[-1], Q))
    info.depth = len(images) - 1
    theta, Y = _ritz(Q, torch.cat(images, 1))
    Q = orthonormalise(Q @ Y[:, :keep])
    del blocks, images
    Z, W = op.exact(Q, keep_w=keep <= keep_w)
    info.passes64 += 1
    Ws = [W] if W is not None else None
    for r in range(max_refine + 1):
        theta, Y = _ritz(Q, Z)
        U = Q @ Y
        R = Z @ Y - U * theta
        info.bound, info.dim, info.values = certificate(theta, R, k), Q.shape[1], tuple(theta[: k + 1].tolist())
        if info.bound <= tol:
            info.converged = True
            return theta, U, Y, Ws
        if r == max_refine or Q.shape[1] + keep > n:  # out of refinements, or of room for them in R^n
            return None
        X = orthonormalise(R[:, :keep], Q)
        Ws = Ws if Ws is not None and Q.shape[1] + X.shape[1] <= keep_w else None
        Zx, Wx = op.exact(X, keep_w=Ws is not None)
        info.passes64 += 1
        Q, Z = torch.cat([Q, X], 1), torch.cat([Z, Zx], 1)
        if Ws is not None:
            Ws.append(Wx)


def krylov_top_k(G: torch.Tensor, k: int, **options) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Top-k right singular subspace ``(V, s)`` of G (m x p), as :func:`gsd_cli.subspace.top_k_subspace`:
    V p x k orthonormal float64, s the k largest singular values, descending, float64; ``None`` when
    not certified (take the exact path then). ``options``: those of :func:`krylov_eig`."""
    op = GramOperator(G)
    # A^T Q (p x dim, float64) is kept while it takes at most half of G's memory: 8 p dim <= 2 m p
    out = krylov_eig(op, k, keep_w=0 if op.t else op.n // 4, **options)
    if out is None:
        return None
    theta, U, Y, Ws = out
    s = theta[:k].clamp_min(0).sqrt()
    if op.t:  # A = G^T: the eigenvectors of K = G^T G are V itself
        return U[:, :k].contiguous(), s
    # V = A^T U_k diag(1/s) = (A^T Q) Y_k diag(1/s): from the stored A^T Q, else one more pass over G
    ATU = torch.cat(Ws, 1) @ Y[:, :k] if Ws is not None else op.rmat(U[:, :k])
    V = ATU / s.clamp_min(torch.finfo(torch.float64).tiny)
    return torch.linalg.qr(V)[0], s


def krylov_top_k_gram(K: torch.Tensor, k: int, **options) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Top-k eigenvectors U (n x k, orthonormal) and ``s`` = sqrt of the top-k eigenvalues of an explicit
    n x n Gram matrix K, certified as :func:`krylov_top_k` (``None`` when not), instead of a full
    O(n^3) eigh: what the Gram ("ghost") path needs before V = G^T U diag(1/s)."""
    out = krylov_eig(MatrixOperator(K), k, **options)
    if out is None:
        return None
    theta, U = out[0], out[1]
    return U[:, :k].contiguous(), theta[:k].clamp_min(0).sqrt()
