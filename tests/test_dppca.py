"""DP-GSD's mechanism: the exponent, clipping, and the sampled distribution against exact integrals."""

import math

import numpy as np
import pytest
import torch

from gsd_cli import GSDError
from gsd_cli.subspace.dppca import (
    bingham_dense,
    bingham_scale,
    clip_rows,
    private_top_k_subspace,
    sample_sequential,
)


def sphere_moments(B, n_theta=600, n_phi=1200):
    """E[x x^T] under exp(x^T B x) on S^2, by quadrature in spherical coordinates (independent of
    any sampler)."""
    th = (np.arange(n_theta) + 0.5) * math.pi / n_theta
    ph = (np.arange(n_phi) + 0.5) * 2 * math.pi / n_phi
    T, P = np.meshgrid(th, ph, indexing="ij")
    x = np.stack([np.sin(T) * np.cos(P), np.sin(T) * np.sin(P), np.cos(T)], -1)
    w = np.exp(np.einsum("...i,ij,...j->...", x, B, x)) * np.sin(T)
    w /= w.sum()
    return np.einsum("ab,abi,abj->ij", w, x, x)


def test_exponent_is_epsilon_over_two_c_squared():
    # B = epsilon / (2 C^2) G^T G: check the scale, and that the sampler's density uses exactly it
    assert bingham_scale(2.0, 0.5) == pytest.approx(2.0 / (2 * 0.25))
    G = torch.tensor([[math.sqrt(5.0), 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    eps, C = 4.0, math.sqrt(5.0)  # no row is clipped; B = 4 / 10 * diag(5, 1, 0) = diag(2, .4, 0)
    B = bingham_scale(eps, C) * (G.T @ G)
    assert torch.allclose(B, torch.diag(torch.tensor([2.0, 0.4, 0.0], dtype=torch.float64)))
    exact = sphere_moments(B.numpy())
    rng = np.random.default_rng(1)
    xs = torch.stack([private_top_k_subspace(G, 1, eps, C, generator=rng)[:, 0] for _ in range(6000)])
    got = (xs**2).mean(0).numpy()
    se = np.sqrt(np.diag(exact) * (1 - np.diag(exact)) / 6000)  # conservative
    assert np.all(np.abs(got - np.diag(exact)) < 5 * se + 2e-3), (got, np.diag(exact))
    # the paper's printed scale (epsilon / 2 without C^2, here 2x larger) is rejected by the same test
    wrong = np.diag(sphere_moments(2.5 * B.numpy()))
    assert np.abs(got - wrong).max() > 5 * se.max()


def test_clipping():
    G = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    Gc = clip_rows(G, 1.0)
    assert torch.allclose(Gc[0], torch.tensor([0.6, 0.8]))
    assert torch.equal(Gc[1], G[1]) and torch.equal(Gc[2], G[2])
    assert (clip_rows(torch.randn(50, 7) * 10, 2.0).norm(dim=1) <= 2.0 + 1e-6).all()


def test_low_rank_sampler_matches_exact_density_and_sign():
    # DESIGN.md: p=3, B=diag(5,1,0): diag E[x x^T] = (.73, .15, .12); the wrong sign gives (.11, .35, .55)
    B = np.diag([5.0, 1.0, 0.0])
    exact = np.diag(sphere_moments(B))
    assert exact == pytest.approx([0.73, 0.15, 0.12], abs=0.01)
    G = torch.tensor([[math.sqrt(5.0), 0, 0], [0, 1.0, 0]], dtype=torch.float64)  # G^T G = B
    rng = np.random.default_rng(0)
    n = 8000
    low = torch.stack([sample_sequential(G, 1, 1.0, rng)[:, 0] for _ in range(n)]).numpy()
    dense = bingham_dense(torch.from_numpy(B), n, rng).numpy()
    se = np.sqrt(exact * (1 - exact) / n)
    for xs in (low, dense):
        m2 = (xs**2).mean(0)
        assert np.all(np.abs(m2 - exact) < 5 * se), m2
        # a real sampler with random signs: odd moments vanish (a sign-less one would not)
        assert np.all(np.abs(xs.mean(0)) < 5 / math.sqrt(n))
        assert abs((xs[:, 0] * xs[:, 1]).mean()) < 5 / math.sqrt(n)
    wrong_sign = np.diag(sphere_moments(-B))
    assert np.abs(low.__pow__(2).mean(0) - wrong_sign).max() > 0.3


def test_low_rank_and_dense_agree_in_higher_dimension():
    rng = np.random.default_rng(3)
    p, m = 6, 3
    G = torch.from_numpy(rng.normal(size=(m, p)))
    B = (G.T @ G).numpy()
    n = 6000
    low = torch.stack([sample_sequential(G, 1, 1.0, rng)[:, 0] for _ in range(n)]).numpy()
    dense = bingham_dense(torch.from_numpy(B), n, rng).numpy()
    M_low = np.einsum("ni,nj->ij", low, low) / n
    M_dense = np.einsum("ni,nj->ij", dense, dense) / n
    assert np.abs(M_low - M_dense).max() < 0.03
    assert np.trace(M_low) == pytest.approx(1.0)


def test_sequential_second_vector_is_restricted_bingham():
    # p=3, k=2: given v1, v2 must follow exp(v^T B v) on the unit circle of v1's complement. So
    # v2 v2^T - E_exact[v2 v2^T | v1] (by quadrature on that circle, for each drawn v1) has mean 0.
    B = np.diag([3.0, 1.0, 0.0])
    G = torch.from_numpy(np.sqrt(B[:2]))
    rng = np.random.default_rng(5)
    n = 3000
    diffs = []
    for _ in range(n):
        V = sample_sequential(G, 2, 1.0, rng).numpy()
        v1, v2 = V[:, 0], V[:, 1]
        assert abs(v1 @ v2) < 1e-10
        # basis of v1's complement; exact E[v2 v2^T | v1] by quadrature on the circle
        Q = np.linalg.svd(np.eye(3) - np.outer(v1, v1))[0][:, :2]
        ang = (np.arange(720) + 0.5) * 2 * math.pi / 720
        pts = (Q @ np.stack([np.cos(ang), np.sin(ang)])).T
        w = np.exp(np.einsum("ni,ij,nj->n", pts, B, pts))
        w /= w.sum()
        exact = np.einsum("n,ni,nj->ij", w, pts, pts)
        diffs.append(np.outer(v2, v2) - exact)
    mean_diff = np.mean(diffs, axis=0)
    assert np.abs(mean_diff).max() < 5 / math.sqrt(n)


def test_explicit_generator_reproduces_default_is_secret_and_input_checks():
    """The sampler is a pure function of an *explicit* generator (what the tests and --insecure-seed
    use); without one it draws from the OS. The pipeline never passes one built from --seed (see
    tests/test_dp_release.py)."""
    G = torch.randn(20, 50)
    a = private_top_k_subspace(G, 3, 1.0, 1.0, generator=7)
    b = private_top_k_subspace(G, 3, 1.0, 1.0, generator=7)
    assert torch.equal(a, b)
    assert not torch.equal(private_top_k_subspace(G, 3, 1.0, 1.0), private_top_k_subspace(G, 3, 1.0, 1.0))
    assert torch.allclose(a.T @ a, torch.eye(3, dtype=torch.float64), atol=1e-10)
    for bad in (dict(epsilon=0.0), dict(epsilon=-1.0), dict(clip=0.0), dict(epsilon=float("nan"))):
        kw = dict(epsilon=1.0, clip=1.0) | bad
        with pytest.raises(GSDError):
            private_top_k_subspace(G, 3, generator=0, **kw)
    with pytest.raises(GSDError):
        private_top_k_subspace(G, 30, 1.0, 1.0)
    # a non-finite row is zeroed by the clip (it would otherwise make the release NaN and so reveal
    # itself): the draw equals the draw with that row set to zero
    G[0, 0] = float("nan")
    Z = G.clone()
    Z[0] = 0.0
    assert torch.equal(private_top_k_subspace(G, 3, 1.0, 1.0, generator=5), private_top_k_subspace(Z, 3, 1.0, 1.0, generator=5))


def test_large_epsilon_recovers_top_subspace_small_epsilon_is_uniform():
    from gsd_cli.subspace import projection_metric, top_k_subspace, uniform_baseline

    rng = np.random.default_rng(0)
    m, p, k = 60, 400, 3
    G = torch.from_numpy(rng.normal(size=(m, p)) @ np.diag(np.r_[[30.0, 25, 20], np.ones(p - 3)]))
    G = G / G.norm(dim=1, keepdim=True)
    V0, _ = top_k_subspace(G, k)
    d_big = projection_metric(private_top_k_subspace(G, k, 1e7, 1.0, generator=1), V0)
    d_small = projection_metric(private_top_k_subspace(G, k, 1e-3, 1.0, generator=1), V0)
    assert d_big < 0.05
    assert abs(d_small - uniform_baseline(k, p)) < 0.05


def test_sketch_is_data_independent_seeded_and_preserves_geometry():
    from gsd_cli.distance.side import sketch

    rng = np.random.default_rng(0)
    G = torch.from_numpy(rng.normal(size=(30, 40000))).float()
    a, b = sketch(G, 256, seed=3), sketch(G, 256, seed=3)
    assert torch.equal(a, b) and a.shape == (30, 256)
    assert not torch.equal(a, sketch(G, 256, seed=4))
    # the same S for any matrix: sketch is linear, (G1 + G2) S = G1 S + G2 S
    H = torch.from_numpy(rng.normal(size=(30, 40000))).float()
    assert torch.allclose(sketch(G + H, 256, 3), a + sketch(H, 256, 3), atol=1e-3)
    # Johnson-Lindenstrauss: norms kept to within a few 1/sqrt(D)
    ratio = a.norm(dim=1) / G.norm(dim=1)
    assert (ratio - 1).abs().max() < 5 / math.sqrt(256)
    with pytest.raises(GSDError):
        sketch(G, 0, seed=0)


def test_rank_with_sketch(npz_pair):
    from gsd_cli import rank

    p = {k: f"npz:{v}" for k, v in npz_pair.items()}
    r = rank(p["priv"], [p["near"], p["far"]], model="fmnist-cnn", examples=60, k=3, dp_sketch=24, engine="vmap", labels="own")  # all examples, own labels: no dependence on the tmp path (draws and random labels are seeded by the name)
    assert r.sketch == 24 and r.uniform_baseline == pytest.approx(math.sqrt(1 - 3 / 24))
    assert r.winner.public == p["near"] and r[1].distance > r.winner.distance
    with pytest.raises(GSDError, match="at least k"):
        rank(p["priv"], [p["far"]], model="fmnist-cnn", examples=40, k=8, dp_sketch=4)


def test_matrix_gibbs_matches_exact_matrix_bingham_p3_k2():
    # For p=3, k=2: V V^T = I - n n^T with n the unit normal of span(V), and tr(V^T B V) = tr B - n^T B n,
    # so under the matrix Bingham n follows exp(-n^T B n): E[V V^T] = I - E[n n^T] exactly.
    from gsd_cli.subspace.dppca import sample_matrix_gibbs

    B = np.diag([3.0, 1.0, 0.0])
    exact = np.eye(3) - sphere_moments(-B)
    G = torch.from_numpy(np.sqrt(B[:2]))
    rng = np.random.default_rng(11)
    n = 1500
    P = np.mean([(lambda V: V @ V.T)(sample_matrix_gibbs(G, 2, 1.0, rng, sweeps=3).numpy()) for _ in range(n)], axis=0)
    assert np.abs(np.diag(P) - np.diag(exact)).max() < 0.035
    # the same check rejects a sampler with the wrong sign (or the uniform law, diag 2/3)
    wrong = np.eye(3) - sphere_moments(B)
    assert np.abs(np.diag(P) - np.diag(wrong)).max() > 0.2
    assert np.abs(np.diag(P) - 2 / 3).max() > 0.1


def test_matrix_mechanism_reports_no_guarantee():
    from gsd_cli.distance.dp_report import mechanism_guarantee

    g = mechanism_guarantee("matrix", 10)
    assert g["exact"] is False and g["delta"] is None and g["guarantee"].startswith("NONE PROVEN")
    assert mechanism_guarantee("sequential")["exact"] is True


def test_sequential_budget_split_and_composition(monkeypatch):
    # each of the k steps uses B_j = (epsilon/k) / (2 C^2) G^T G restricted: check the first step's exponent
    import gsd_cli.subspace.dppca as dppca
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    rng = np.random.default_rng(0)
    G = torch.from_numpy(rng.normal(size=(6, 10)))
    G = G / G.norm(dim=1, keepdim=True) * 0.5  # inside the clip: untouched
    eps, C, k = 3.0, 0.5, 3
    seen = []
    real = dppca._reduced_kgm
    monkeypatch.setattr(dppca, "_reduced_kgm", lambda mu, q, g, **kw: (seen.append((mu.copy(), q)), real(mu, q, g, **kw))[1])
    private_top_k_subspace(G, k, eps, C, generator=0)
    assert len(seen) == k and [q for _, q in seen] == [10, 9, 8]
    expected = np.sort(np.linalg.eigvalsh((eps / k) / (2 * C * C) * (G.T @ G).numpy()))[-6:]
    assert np.allclose(np.sort(seen[0][0]), expected, rtol=1e-9)
    # k pure (epsilon/k)-DP steps compose to at most epsilon: an independent accountant (PLD) agrees,
    # modelling each step as a Laplace mechanism with the same pure guarantee (worst case of pure DP)
    acc = pld_privacy_accountant.PLDAccountant()
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(noise_multiplier=k / eps), k))
    assert 0.8 * eps < acc.get_epsilon(1e-12) <= eps * (1 + 1e-3)
    acc2 = pld_privacy_accountant.PLDAccountant()  # and the whole budget in one step would not fit
    acc2.compose(dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(noise_multiplier=1 / eps), k))
    assert acc2.get_epsilon(1e-12) > 2 * eps
