"""Top-k subspace, projection metric and principal angles against independent computations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from gsd_cli import GSDError, principal_angles, projection_metric, top_k_subspace, uniform_baseline


def orth(p, k, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(p, k, generator=g, dtype=torch.float64))[0].to(dtype)


def proj(V):
    V = V.to(torch.float64)
    return V @ V.T


def scipy_distance(V1, V2):
    theta = scipy.linalg.subspace_angles(V1.numpy(), V2.numpy())
    return math.sqrt(np.mean(np.sin(theta) ** 2))


# ------------------------------------------------------------------------------ top_k_subspace


@pytest.mark.parametrize("m,p", [(30, 200), (40, 40), (200, 30)], ids=["m<p", "m=p", "m>p"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_top_k_matches_svd(m, p, dtype):
    g = torch.Generator().manual_seed(m + p)
    # decaying column scales give distinct singular values (a well-defined top-k subspace)
    G = (torch.randn(m, p, generator=g, dtype=torch.float64) * torch.linspace(3, 0.1, p, dtype=torch.float64)).to(dtype)
    k = 6
    V, s = top_k_subspace(G, k)
    _, S, Vh = torch.linalg.svd(G.to(torch.float64), full_matrices=False)
    assert V.shape == (p, k) and s.shape == (k,)
    assert V.dtype == torch.float64
    torch.testing.assert_close(V.T @ V, torch.eye(k, dtype=torch.float64), rtol=0, atol=1e-10)
    torch.testing.assert_close(s, S[:k], rtol=1e-8, atol=0)
    assert bool((s[:-1] >= s[1:]).all())  # descending
    torch.testing.assert_close(proj(V), proj(Vh[:k].T), rtol=0, atol=1e-8)
    assert projection_metric(V, Vh[:k].T) < 1e-7
    # not the bottom-k (eigh returns ascending order) nor any other k directions
    assert projection_metric(V, Vh[-k:].T) > 0.9


@pytest.mark.parametrize("m,p", [(40, 300), (300, 40)], ids=["m<p", "m>p"])
def test_ill_conditioned_float32(m, p):
    """Singular values 1 .. 1e-4 (the k-th is 1e-4 of the first), G stored in float32: the
    float64 Gram keeps the subspace right; a float32 one would be off by ~0.1."""
    k, r = 8, min(m, p)
    U, W = orth(m, r, 1), orth(p, r, 2)
    s = torch.cat([torch.logspace(0, -4, k, dtype=torch.float64), torch.zeros(r - k, dtype=torch.float64)])
    G = ((U * s) @ W.T).float()
    V, sv = top_k_subspace(G, k)
    assert projection_metric(V, W[:, :k]) < 1e-3
    # every principal angle small, including the one of the weakest (1e-4) direction
    assert float(principal_angles(V, W[:, :k]).max()) < 1e-3
    torch.testing.assert_close(sv, s[:k], rtol=1e-3, atol=0)
    torch.testing.assert_close(V.T @ V, torch.eye(k, dtype=torch.float64), rtol=0, atol=1e-10)


@pytest.mark.parametrize("m,p", [(12, 50), (60, 20)], ids=["m<p", "m>p"])
def test_rank_deficient_raises(m, p):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, p, generator=g)
    G = torch.cat([base] * (m // 3))  # m rows, only 3 independent
    with pytest.raises(GSDError, match="independent"):
        top_k_subspace(G, 5)
    V, _ = top_k_subspace(G, 3)  # k = rank is fine and gives the row space
    Q = torch.linalg.qr(base.T.double())[0]
    assert projection_metric(V, Q) < 1e-6
    # rank 3 up to float32 rounding (a product of m x 3 and 3 x p factors)
    A = torch.randn(m, 3, generator=g, dtype=torch.float64)
    B = torch.randn(3, p, generator=g, dtype=torch.float64)
    with pytest.raises(GSDError, match="independent"):
        top_k_subspace((A @ B).float(), 4)


def test_zero_and_impossible_k_raise():
    with pytest.raises(GSDError):
        top_k_subspace(torch.zeros(10, 30), 2)
    with pytest.raises(GSDError, match="larger"):
        top_k_subspace(torch.randn(4, 50), 5)  # k > m
    with pytest.raises(GSDError):
        top_k_subspace(torch.randn(50, 4), 5)  # k > p
    with pytest.raises(GSDError):
        top_k_subspace(torch.randn(10, 30), 0)
    with pytest.raises(GSDError):
        top_k_subspace(torch.randn(10), 1)


def test_duplicate_rows_do_not_change_the_subspace():
    """Repeating every example doubles s by sqrt(2) and leaves the subspace as it is."""
    G = torch.randn(20, 80, generator=torch.Generator().manual_seed(3))
    V1, s1 = top_k_subspace(G, 5)
    V2, s2 = top_k_subspace(torch.cat([G, G]), 5)
    assert projection_metric(V1, V2) < 1e-7
    torch.testing.assert_close(s2, s1 * math.sqrt(2), rtol=1e-6, atol=0)


# ------------------------------------------------------------------------------ projection metric


def test_projection_metric_matches_scipy():
    p, k = 40, 5
    for seed in range(6):
        V1, V2 = orth(p, k, seed), orth(p, k, 100 + seed)
        d = projection_metric(V1, V2)
        assert d == pytest.approx(scipy_distance(V1, V2), abs=1e-12)
        assert 0 < d <= 1
        # the formula of the design: sqrt(1 - ||V1^T V2||_F^2 / k)
        assert d == pytest.approx(math.sqrt(1 - float((V1.T @ V2).pow(2).sum()) / k), abs=1e-12)


def test_projection_metric_partial_overlap_matches_scipy():
    E = torch.eye(12, dtype=torch.float64)
    V1 = E[:, :4]
    # two directions shared, one at 30 degrees, one orthogonal
    c, s_ = math.cos(math.radians(30)), math.sin(math.radians(30))
    V2 = torch.stack([E[:, 0], E[:, 1], c * E[:, 2] + s_ * E[:, 8], E[:, 9]], dim=1)
    expected = math.sqrt((0 + 0 + s_**2 + 1) / 4)
    assert projection_metric(V1, V2) == pytest.approx(expected, abs=1e-12)
    assert projection_metric(V1, V2) == pytest.approx(scipy_distance(V1, V2), abs=1e-12)
    angles = principal_angles(V1, V2)
    assert np.allclose(np.degrees(angles.numpy()), [0, 0, 30, 90], atol=1e-6)


def test_projection_metric_extremes_symmetry_rotation():
    p, k = 30, 4
    V = orth(p, k, 1)
    assert projection_metric(V, V) == pytest.approx(0.0, abs=1e-7)
    Q = orth(k, k, 2)
    assert projection_metric(V, V @ Q) == pytest.approx(0.0, abs=1e-7)
    assert projection_metric(V, -V) == pytest.approx(0.0, abs=1e-7)
    E = torch.eye(p, dtype=torch.float64)
    assert projection_metric(E[:, :k], E[:, k : 2 * k]) == pytest.approx(1.0, abs=1e-12)
    # orthogonal but not axis-aligned: V and its rotation into the complement
    W = torch.linalg.qr(torch.cat([V, orth(p, k, 3)], dim=1))[0][:, k:]
    assert projection_metric(V, W) == pytest.approx(1.0, abs=1e-12)
    for s1, s2 in [(4, 5), (6, 7)]:
        A, B = orth(p, k, s1), orth(p, k, s2)
        d = projection_metric(A, B)
        assert projection_metric(B, A) == pytest.approx(d, abs=1e-13)
        Q1, Q2 = orth(k, k, 10 + s1), orth(k, k, 20 + s2)
        assert projection_metric(A @ Q1, B) == pytest.approx(d, abs=1e-12)
        assert projection_metric(A, B @ Q2) == pytest.approx(d, abs=1e-12)
        assert projection_metric(A @ Q1, B @ Q2) == pytest.approx(d, abs=1e-12)
    # float32 bases are accepted and give the same number
    A, B = orth(p, k, 4), orth(p, k, 5)
    assert projection_metric(A.float(), B.float()) == pytest.approx(projection_metric(A, B), abs=1e-6)


def test_principal_angles_match_scipy():
    p, k = 25, 5
    for seed in range(4):
        V1, V2 = orth(p, k, seed), orth(p, k, 50 + seed)
        ours = principal_angles(V1, V2).numpy()
        theirs = scipy.linalg.subspace_angles(V1.numpy(), V2.numpy())  # descending
        assert np.all(np.diff(ours) >= 0)  # ascending
        np.testing.assert_allclose(ours, np.sort(theirs), atol=1e-8)
        # the metric is the RMS of the sines of these angles
        assert projection_metric(V1, V2) == pytest.approx(math.sqrt(np.mean(np.sin(ours) ** 2)), abs=1e-10)


def test_shape_mismatch_is_user_error():
    with pytest.raises(GSDError):
        projection_metric(orth(10, 2, 0), orth(10, 3, 0))
    with pytest.raises(GSDError):
        projection_metric(orth(10, 2, 0), orth(11, 2, 0))
    with pytest.raises(GSDError):
        principal_angles(orth(10, 2, 0), orth(10, 3, 0))


def test_random_subspaces_mean_square_distance():
    """Independent uniform k-subspaces of R^p (QR of a Gaussian): E[d^2] = 1 - k/p."""
    p, k, n = 20, 4, 4000
    g = torch.Generator().manual_seed(0)
    A = torch.linalg.qr(torch.randn(n, p, k, generator=g, dtype=torch.float64))[0]
    B = torch.linalg.qr(torch.randn(n, p, k, generator=g, dtype=torch.float64))[0]
    d2 = np.array([projection_metric(A[i], B[i]) ** 2 for i in range(n)])
    se = d2.std(ddof=1) / math.sqrt(n)
    assert 0 < se < 0.01
    assert abs(d2.mean() - (1 - k / p)) < 4 * se
    assert uniform_baseline(k, p) == pytest.approx(math.sqrt(1 - k / p), abs=1e-15)
    assert math.sqrt(d2.mean()) == pytest.approx(uniform_baseline(k, p), abs=4 * se)


def test_uniform_baseline_values():
    assert uniform_baseline(16, 16) == 0.0
    assert uniform_baseline(1, 2) == pytest.approx(math.sqrt(0.5))
    assert uniform_baseline(16, 30202) == pytest.approx(math.sqrt(1 - 16 / 30202))
