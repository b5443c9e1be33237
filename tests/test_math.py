"""Top-k subspace, projection metric and principal angles against independent computations."""

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from gsd_cli import GSDError, principal_angles, projection_metric, top_k_subspace, uniform_baseline


def _orth(p, k, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(p, k, generator=g, dtype=torch.float64))[0]


def _proj(V):
    return V @ V.T


@pytest.mark.parametrize("m,p", [(30, 200), (200, 30)])
def test_top_k_matches_svd(m, p):
    g = torch.Generator().manual_seed(m)
    G = torch.randn(m, p, generator=g) * torch.linspace(3, 0.1, p)
    k = 5
    V, s = top_k_subspace(G, k)
    _, S, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    assert V.shape == (p, k)
    assert torch.allclose(V.T @ V, torch.eye(k, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(s, S[:k], rtol=1e-8)
    assert torch.allclose(_proj(V), _proj(Vh[:k].T), atol=1e-8)


def test_top_k_ill_conditioned_float32_input():
    # singular values from 1 down to 1e-4 at the k-th: float64 Gram keeps the subspace exact
    m, p, k = 40, 500, 8
    U = _orth(m, m, 1)
    W = _orth(p, m, 2)
    s = torch.logspace(0, -4, k, dtype=torch.float64)
    s = torch.cat([s, torch.full((m - k,), 1e-6, dtype=torch.float64)])
    G = (U * s) @ W.T
    V, _ = top_k_subspace(G.float(), k)
    assert projection_metric(V, W[:, :k]) < 1e-3


def test_rank_deficient_is_refused():
    G = torch.randn(3, 50).repeat(4, 1)  # 12 rows, rank 3
    with pytest.raises(GSDError, match="independent"):
        top_k_subspace(G, 5)
    with pytest.raises(GSDError, match="larger"):
        top_k_subspace(torch.randn(4, 50), 5)


def test_projection_metric_matches_scipy_and_properties():
    p, k = 60, 6
    for seed in range(5):
        V1, V2 = _orth(p, k, seed), _orth(p, k, 100 + seed)
        theta = scipy.linalg.subspace_angles(V1.numpy(), V2.numpy())
        expected = math.sqrt(np.mean(np.sin(theta) ** 2))
        d = projection_metric(V1, V2)
        assert d == pytest.approx(expected, abs=1e-10)
        assert projection_metric(V2, V1) == pytest.approx(d, abs=1e-12)
        Q = _orth(k, k, 7 + seed)
        assert projection_metric(V1 @ Q, V2) == pytest.approx(d, abs=1e-10)
        assert projection_metric(V1, V2 @ Q) == pytest.approx(d, abs=1e-10)
        assert np.allclose(np.sort(principal_angles(V1, V2).numpy()), np.sort(theta), atol=1e-8)
    V = _orth(p, k, 9)
    assert projection_metric(V, V @ _orth(k, k, 3)) == pytest.approx(0.0, abs=1e-7)
    E = torch.eye(p, dtype=torch.float64)
    assert projection_metric(E[:, :k], E[:, k : 2 * k]) == pytest.approx(1.0)
    # partly overlapping: 2 of 6 directions shared -> d^2 = 1 - 2/6
    assert projection_metric(E[:, :k], E[:, k - 2 : 2 * k - 2]) == pytest.approx(math.sqrt(1 - 2 / 6))


def test_random_subspaces_expected_distance():
    p, k, n = 20, 4, 4000
    g = torch.Generator().manual_seed(0)
    d2 = []
    for _ in range(n):
        V1 = torch.linalg.qr(torch.randn(p, k, generator=g, dtype=torch.float64))[0]
        V2 = torch.linalg.qr(torch.randn(p, k, generator=g, dtype=torch.float64))[0]
        d2.append(projection_metric(V1, V2) ** 2)
    d2 = np.array(d2)
    se = d2.std() / math.sqrt(n)
    assert abs(d2.mean() - (1 - k / p)) < 4 * se
    assert uniform_baseline(k, p) == pytest.approx(math.sqrt(1 - k / p))


def test_shape_mismatch_is_user_error():
    with pytest.raises(GSDError):
        projection_metric(_orth(10, 2, 0), _orth(10, 3, 0))
