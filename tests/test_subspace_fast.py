"""The randomized (block Krylov, float64-certified) top-k subspace against the exact float64 Gram + eigh:
the same V and s, distances within 1e-6 (certified 1e-7) on small-gap spectra and real gradients,
the exact path when it cannot certify, rank deficiency refused, results reproducible."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gsd_cli import GSDError, projection_metric, top_k_subspace
from gsd_cli.subspace import SUBSPACE_METHODS, _exact_top_k, choose_method
from gsd_cli.subspace.krylov import KrylovInfo, certificate, krylov_top_k


def orth(n, r, gen):
    return torch.linalg.qr(torch.randn(n, r, generator=gen, dtype=torch.float64))[0]


def spectrum_matrix(m, p, k, ratio, seed=0, decay=0.5, rank=None):
    """float32 G = A diag(s) B^T with s_i = 20 i^-decay and s_k / s_{k+1} = ``ratio`` (the tail scaled)."""
    g = torch.Generator().manual_seed(seed)
    r = rank or min(m, p)
    s = 20 * torch.arange(1, r + 1, dtype=torch.float64) ** -decay
    if k < r:
        s[k:] *= s[k - 1] / ratio / s[k]
    return ((orth(m, r, g) * s) @ orth(p, r, g).T).float(), s


def probes(V0, p, k, seed=5):
    """Subspaces to measure distances to: a random one, and ones near V0 (where d is most sensitive)."""
    g = torch.Generator().manual_seed(seed)
    P = orth(p, k, g)
    return [P, torch.linalg.qr(V0 + 0.3 * P)[0], torch.linalg.qr(V0 + 0.03 * P)[0]]


def assert_same_subspace(G, k, tol=1e-6):
    info = {}
    V, s = top_k_subspace(G, k, "randomized", info)
    V0, s0 = _exact_top_k(G, k)
    assert info["method"] == "randomized" and not info["fallback"], info
    assert info["krylov"].converged and info["krylov"].bound <= 1e-7
    assert V.shape == V0.shape and V.dtype == torch.float64 and s.dtype == torch.float64
    torch.testing.assert_close(V.T @ V, torch.eye(k, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(s, s0, rtol=1e-9, atol=0)
    for P in probes(V0, V0.shape[0], k):
        assert abs(projection_metric(V, P) - projection_metric(V0, P)) <= tol
    return info, V, V0


# ------------------------------------------------------------------------------ accuracy


@pytest.mark.parametrize("ratio", [1.001, 1.0001])
@pytest.mark.parametrize("m,p", [(400, 3000), (3000, 400)], ids=["m<p", "m>p"])
def test_small_eigengap_matches_exact(m, p, ratio):
    """s_16 / s_17 = 1.001 (the README's ResNet20 case) and 1.0001: the k-th direction is nearly
    tied with the (k+1)-th, the hard case for an iterative method; still the exact subspace."""
    G, s = spectrum_matrix(m, p, 16, ratio)
    info = assert_same_subspace(G, 16)[0]
    assert info["krylov"].passes64 >= 2  # the float32 phase alone could not have separated them


def test_ill_conditioned_float32_matches_exact():
    """Singular values 1 .. 1e-4 then zeros (rank k): the float32 phase cannot see the small ones
    (float32 rounding of K is 1e-7 of s_1^2 = 1e-8 / s_k^2 * s_k^2); the float64 phase must."""
    m, p, k = 400, 3000, 8
    g = torch.Generator().manual_seed(3)
    s = torch.logspace(0, -4, k, dtype=torch.float64)
    G = ((orth(m, k, g) * s) @ orth(p, k, g).T).float()
    info = {}
    V, sv = top_k_subspace(G, k, "randomized", info)
    V0, s0 = _exact_top_k(G, k)
    torch.testing.assert_close(sv, s0, rtol=1e-7, atol=0)
    for P in probes(V0, p, k):
        assert abs(projection_metric(V, P) - projection_metric(V0, P)) <= 1e-6


def test_real_gradients_match_exact():
    """Per-sample gradients of the MNIST CNN (paper 004, Table 7a) on 500 MNIST images, unit rows,
    random labels, as gsd rank computes them, split into two sets of 250; k is where the spectrum's
    neighbouring singular values are closest (a near tie, as the README's ResNet20 case)."""
    from gsd_cli import data as gdata
    from gsd_cli.gradients import per_sample_gradients
    from gsd_cli.models.peft import build_model
    from gsd_cli.subspace import gram

    _, net, names, _ = build_model("fmnist-cnn", 10, 0)
    smp = gdata.draw(gdata.resolve("mnist-a"), 500, 0)
    x = torch.cat([xb for _, xb in smp.batches(28, 1, 250, torch.device("cpu"))])
    y = torch.randint(0, 10, (500,), generator=torch.Generator().manual_seed(0))
    G = per_sample_gradients(net, x, y, params=names, row_norm="unit", device="cpu", engine="vmap")
    Gs = [G[:250].contiguous(), G[250:].contiguous()]
    lam = torch.linalg.eigvalsh(gram(Gs[0])).flip(0)
    ratios = (lam[:40] / lam[1:41]).sqrt()
    k = int(ratios[7:24].argmin()) + 8  # s_k / s_{k+1} smallest for k in 8..24
    assert float(ratios[k - 1]) < 1.02
    (_, fast1, exact1), (_, fast2, exact2) = (assert_same_subspace(G, k) for G in Gs)
    d0, d1 = projection_metric(exact1, exact2), projection_metric(fast1, fast2)
    assert 0.05 < d0 < 0.99 and abs(d1 - d0) <= 1e-6


def test_gram_path_top_k_matches_eigh():
    """top_k_eigh on an explicit Gram matrix (what the ghost path forms): the top-k eigenvectors of a
    small-gap spectrum as a full eigh's, and the exact eigh on a tie."""
    from gsd_cli.subspace import gram, top_k_eigh

    G, _ = spectrum_matrix(400, 3000, 16, 1.001)
    K = gram(G)
    info = {}
    U, s = top_k_eigh(K, 16, "randomized", info)
    evals, W = torch.linalg.eigh(K)
    U0, s0 = W.flip(1)[:, :16], evals.flip(0)[:16].sqrt()
    assert info["method"] == "randomized" and U.shape == (400, 16)
    torch.testing.assert_close(s, s0, rtol=1e-10, atol=0)
    assert float((U - U0 @ (U0.T @ U)).norm()) < 1e-7 * 4  # ||sin Theta||_F <= tol sqrt(k)
    Kt = gram(spectrum_matrix(400, 3000, 8, 1.0)[0])
    info = {}
    U, s = top_k_eigh(Kt, 8, "randomized", info)
    assert info["fallback"] and torch.equal(s, torch.linalg.eigh(Kt)[0].flip(0)[:8].sqrt())


# ------------------------------------------------------------------------------ fallback


def test_a_tie_is_not_certified_and_falls_back_to_the_exact_path():
    """s_k = s_{k+1} exactly: the top-k subspace is not determined; nothing can certify it, so the
    randomized method gives up (None) and top_k_subspace returns the exact path's answer, bit for bit."""
    G, _ = spectrum_matrix(300, 2000, 8, 1.0)
    kinfo = KrylovInfo()
    assert krylov_top_k(G, 8, info=kinfo) is None
    assert not kinfo.converged and kinfo.bound > 1e-7 and kinfo.passes64 == 6  # 1 + max_refine passes
    info = {}
    V, s = top_k_subspace(G, 8, "randomized", info)
    V0, s0 = _exact_top_k(G, 8)
    assert info == {"method": "exact", "fallback": True, "krylov": info["krylov"]}
    assert torch.equal(V, V0) and torch.equal(s, s0)


def test_too_few_refinements_give_up_instead_of_an_uncertified_answer():
    G, _ = spectrum_matrix(400, 3000, 16, 1.001)
    info = KrylovInfo()
    assert krylov_top_k(G, 16, max_refine=0, info=info) is None  # 1.001 needs more than one float64 pass
    assert info.bound > 1e-7 and info.passes64 == 1


def test_certificate_against_a_direct_computation():
    """The bound ||R_k||_F / (theta_k - theta_{k+1} - ||R_{k+1}||_F) / sqrt(k), and infinite without a gap."""
    theta = torch.tensor([5.0, 4.0, 3.0, 1.0], dtype=torch.float64)
    R = torch.zeros(6, 4, dtype=torch.float64)
    R[0, 0], R[1, 1], R[2, 2] = 0.3, 0.4, 0.1
    assert certificate(theta, R, 2) == pytest.approx(0.5 / (4.0 - 3.0 - math.sqrt(0.26)) / math.sqrt(2))
    assert certificate(theta, R * 10, 2) == math.inf


def test_adaptive_depth_stops_early_on_a_clear_gap_and_goes_deeper_near_a_tie():
    """The float32 phase stops once its own Ritz certificate reaches float32's floor: few steps where
    s_k / s_{k+1} is large, more where it is small; both certified and equal to the exact answer."""
    from gsd_cli.subspace.krylov import DEPTH, MIN_DEPTH

    depths = {}
    for ratio in (1.5, 1.01):
        G, _ = spectrum_matrix(1500, 3000, 16, ratio, decay=0.3)
        V, s = top_k_subspace(G, 16, "randomized", info := {})
        kinfo = info["krylov"]
        assert info["method"] == "randomized" and kinfo.converged
        assert kinfo.passes32 == kinfo.depth + 1 and MIN_DEPTH <= kinfo.depth <= DEPTH
        V0, _ = _exact_top_k(G, 16)
        for P in probes(V0, 3000, 16):
            assert abs(projection_metric(V, P) - projection_metric(V0, P)) <= 1e-6
        depths[ratio] = kinfo.depth
    assert depths[1.5] < depths[1.01]
    assert depths[1.5] < DEPTH  # stopped before the cap


def test_fixed_depth_takes_every_step():
    G, _ = spectrum_matrix(1500, 3000, 16, 1.5, decay=0.3)
    info = KrylovInfo()
    assert krylov_top_k(G, 16, depth=7, adaptive=False, info=info) is not None
    assert info.depth == 7 and info.passes32 == 8


# ------------------------------------------------------------------------------ rank, determinism, choice


def test_rank_deficient_input_is_refused():
    """Rank 3 < k = 5: the same one-line error as the exact path's, whichever method."""
    G, _ = spectrum_matrix(300, 2000, 3, 1.5, rank=3)
    for method in SUBSPACE_METHODS:
        with pytest.raises(GSDError, match="span only 3 independent directions, fewer than k=5"):
            top_k_subspace(G, 5, method)
    V, _ = top_k_subspace(G, 3, "randomized")  # k = rank is fine
    assert projection_metric(V, _exact_top_k(G, 3)[0]) < 1e-7


def test_deterministic_and_independent_of_the_global_generator():
    """The start block comes from a fixed generator: the same G gives the same bits, whatever the
    global torch seed (the public --seed) or earlier draws."""
    G, _ = spectrum_matrix(300, 2000, 8, 1.01)
    torch.manual_seed(1)
    V1, s1 = top_k_subspace(G, 8, "randomized")
    torch.manual_seed(2)
    torch.randn(10)
    V2, s2 = top_k_subspace(G, 8, "randomized")
    assert torch.equal(V1, V2) and torch.equal(s1, s2)
    V3, _ = krylov_top_k(G, 8, seed=7)  # another start: the same subspace, other rounding
    assert projection_metric(V1, V3) < 1e-7


def test_auto_choice_and_bad_method():
    assert choose_method("auto", 2000, 30202, 16) == "randomized"
    assert choose_method("auto", 8000, 30202, 16) == "randomized"
    assert choose_method("auto", 500, 30202, 16) == "exact"
    assert choose_method("auto", 1000, 30202, 16) == "exact"
    assert choose_method("auto", 30202, 500, 16) == "exact"  # n = min(m, p)
    assert choose_method("auto", 2000, 30202, 200) == "exact"  # Krylov space too large for n
    assert choose_method("exact", 8000, 30202, 16) == "exact"
    assert choose_method("randomized", 100, 300, 4) == "randomized"
    with pytest.raises(GSDError, match="--subspace-method must be one of auto, exact, randomized"):
        top_k_subspace(torch.randn(20, 30), 2, "svd")


def test_small_n_takes_the_exact_path():
    """n too small for a Krylov space of two blocks, or for the refinements a near tie needs (the
    basis never grows past n): the exact path, no error."""
    G = torch.randn(30, 300)  # k = 4: blocks of k + 16 = 20 columns, no room for a second in R^30
    info = {}
    V, _ = top_k_subspace(G, 4, "randomized", info)
    assert info["method"] == "exact" and info["fallback"]
    assert projection_metric(V, _exact_top_k(G, 4)[0]) == 0.0
    G, _ = spectrum_matrix(120, 600, 8, 1.0)  # a tie: refines by 24 columns until the basis fills n = 120
    kinfo = KrylovInfo()
    assert krylov_top_k(G, 8, info=kinfo) is None and kinfo.dim == 120 and kinfo.passes64 == 5


# ------------------------------------------------------------------------------ settings, JSON, cache, DP

KW = dict(examples=60, k=3, model="fmnist-cnn", params="fc*", engine="vmap", device="cpu")


def test_setting_reaches_the_ranking_json_and_the_cache_key(tmp_path):
    from gsd_cli.ranking.cache import SubspaceCache
    from gsd_cli.ranking import RankConfig, rank

    assert RankConfig().gradients.subspace_method == "auto"
    cache = SubspaceCache(tmp_path)
    a = rank("mnist-a", ["mnist-b"], subspace_method="exact", cache=cache, **KW)
    b = rank("mnist-a", ["mnist-b"], subspace_method="randomized", cache=cache, **KW)
    assert cache.hits == 0  # the method is part of the public cache key
    assert a.to_dict()["subspace_method"] == "exact" and json.loads(json.dumps(b.to_dict()))["subspace_method"] == "randomized"
    assert abs(a[0].distance - b[0].distance) <= 1e-6
    rank("mnist-a", ["mnist-b"], subspace_method="randomized", cache=cache, **KW)
    assert cache.hits == 1
    with pytest.raises(GSDError, match="--subspace-method must be one of"):
        rank("mnist-a", ["mnist-b"], subspace_method="fast", **KW)


def test_dp_gsd_private_draw_does_not_use_it():
    """DP-GSD's private subspace is drawn by its mechanism from the Gram matrix, whatever the method:
    with the same (insecure) private seed both methods give the same private draw, so the distances
    differ only by the public sides' certified error."""
    from gsd_cli.ranking import rank

    kw = dict(KW, dp=True, epsilon=50.0, insecure_seed=3, distance="dp-gsd")  # DP-GSD by name (the DP selection is the default)
    a = rank("mnist-a", ["mnist-b", "noise"], subspace_method="exact", **kw)
    b = rank("mnist-a", ["mnist-b", "noise"], subspace_method="randomized", **kw)
    c = rank("mnist-a", ["mnist-b", "noise"], subspace_method="exact", **dict(kw, insecure_seed=4))
    da, db, dc = ({r.public: r.distance for r in x} for x in (a, b, c))
    assert all(abs(da[n] - db[n]) <= 1e-7 for n in da)  # only the public side's certified error
    assert all(abs(da[n] - dc[n]) > 1e-6 for n in da)  # another private draw does move them


def test_cli_option(capsys, tmp_path):
    from gsd_cli.cli import main

    out = tmp_path / "r.json"
    code = main(["rank", "--public", "mnist-b", "-m", "60", "-k", "3", "--model", "fmnist-cnn", "--params", "fc*",
                 "--device", "cpu", "-q", "--subspace-method", "randomized", "--json", str(out)])
    assert code == 0
    assert json.loads(out.read_text())["subspace_method"] == "randomized"
    code = main(["rank", "--public", "mnist-b", "-m", "60", "-q", "--model", "fmnist-cnn", "--subspace-method", "lanczos"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "--subspace-method must be one of" in err
