"""DP-GSD's public-basis sketch (--dp-sketch public): the basis depends on public data only, the
mechanism runs exactly in the sketch space on projected-then-clipped rows, and the CLI path works."""

import json
import math

import numpy as np
import pytest
import torch

from gsd_cli import GSDError
from gsd_cli.subspace.dppca import bingham_scale, clip_rows, private_top_k_subspace, square_factor
from gsd_cli.subspace.public_basis import parse_dp_sketch, project_rows, public_basis, resolve_dp_sketch

from test_dppca import sphere_moments  # the quadrature of E[x x^T] under the Bingham density (tests/)


def _orthonormal(rng, p, k):
    return torch.linalg.qr(torch.from_numpy(rng.normal(size=(p, k))))[0]


def test_public_basis_spans_the_candidates_drops_overlap_and_adds_seeded_directions():
    rng = np.random.default_rng(0)
    V1, V2 = _orthonormal(rng, 40, 3), _orthonormal(rng, 40, 3)
    Q = public_basis([V1, V2])
    assert Q.shape == (40, 6) and torch.allclose(Q.T @ Q, torch.eye(6, dtype=torch.float64), atol=1e-12)
    for V in (V1, V2):  # each candidate lies in the span: Q Q^T V = V
        assert torch.allclose(Q @ (Q.T @ V), V, atol=1e-12)
    # a candidate repeated (or inside another's span) adds no direction
    assert public_basis([V1, V2, V1.flip(1)]).shape == (40, 6)
    Qx = public_basis([V1, V2], extra=4, seed=7)
    assert Qx.shape == (40, 10) and torch.allclose(Qx.T @ Qx, torch.eye(10, dtype=torch.float64), atol=1e-12)
    assert torch.equal(Qx, public_basis([V1, V2], extra=4, seed=7))
    assert not torch.allclose(Qx[:, 6:], public_basis([V1, V2], extra=4, seed=8)[:, 6:])
    with pytest.raises(GSDError):
        public_basis([])


def test_dp_sketch_values():
    assert parse_dp_sketch(None) is None and parse_dp_sketch("none") == 0 and parse_dp_sketch(32) == 32
    assert parse_dp_sketch("32") == 32 and parse_dp_sketch("Public") == "public" and parse_dp_sketch("public+0") == "public"
    assert parse_dp_sketch("public+16") == "public+16"
    for bad in ("publik", "public+", "public+x", -1, "3.5", True):
        with pytest.raises(GSDError):
            parse_dp_sketch(bad)
    assert resolve_dp_sketch("public", 16, True) == "public"
    with pytest.raises(GSDError, match="--dp"):
        resolve_dp_sketch("public", 16, False)
    with pytest.raises(GSDError, match="at least k"):
        resolve_dp_sketch(8, 16, True)
    assert resolve_dp_sketch("0", 16, True) is None


def test_mechanism_in_the_sketch_space_matches_the_exact_density_of_projected_clipped_rows():
    # p=6 parameters, a public basis of D=3 directions; 40 private rows (m > D: the sampler runs on the
    # square factor R, R^T R = (GQ)^T (GQ)). Some rows project to norm > C and must be clipped *after*
    # the projection: the draw's second moments, in the basis's coordinates, equal those of the exact
    # Bingham density with B = epsilon / (2 C^2) (clip(GQ))^T clip(GQ) on S^2.
    rng = np.random.default_rng(4)
    Q = public_basis([_orthonormal(rng, 6, 2), _orthonormal(rng, 6, 1)])
    assert Q.shape == (6, 3)
    G = torch.from_numpy(rng.normal(size=(40, 6)) * np.array([1.2, 0.8, 0.3, 0.2, 0.2, 0.1]))
    P = project_rows(G, Q)
    assert (P.norm(dim=1) > 1.0).any() and (P.norm(dim=1) < 1.0).any()
    eps, C = 0.6, 1.0
    Pc = clip_rows(P, C)
    B = bingham_scale(eps, C) * (Pc.T @ Pc).numpy()
    assert torch.allclose(square_factor(Pc).T @ square_factor(Pc), Pc.T @ Pc, atol=1e-10)
    exact = np.diag(sphere_moments(B))
    n = 5000
    gen = np.random.default_rng(9)
    xs = torch.stack([(Q @ private_top_k_subspace(P, 1, eps, C, generator=gen))[:, 0] for _ in range(n)])
    coords = (xs @ Q).numpy()  # back in the basis: every draw lies in span(Q)
    assert torch.allclose(xs, xs @ Q @ Q.T, atol=1e-10)
    got = (coords**2).mean(0)
    se = np.sqrt(exact * (1 - exact) / n)
    assert np.all(np.abs(got - exact) < 5 * se + 2e-3), (got, exact)
    # the same test rejects the unclipped rows' density (the clip must act on the projected rows)
    B_unclipped = bingham_scale(eps, C) * (P.T @ P).numpy()
    assert np.abs(got - np.diag(sphere_moments(B_unclipped))).max() > 5 * se.max()


def _capture_bases(monkeypatch, cls=None):
    from gsd_cli.distance.dpgsd import DPGSD

    DPGSD = cls or DPGSD
    seen, calls = [], []
    real_use, real_side = DPGSD.use_public_sides, DPGSD.private_side

    def use(self, ctx, publics):
        real_use(self, ctx, publics)
        seen.append(self.basis.clone())

    def side(self, ctx, sample):
        calls.append(len(seen))
        return real_side(self, ctx, sample)

    monkeypatch.setattr(DPGSD, "use_public_sides", use)
    monkeypatch.setattr(DPGSD, "private_side", side)
    return seen, calls


def test_basis_is_bit_identical_for_two_private_sets_and_shared_repeats_draw_once(npz_pair, write_npz, monkeypatch):
    from gsd_cli import rank

    seen, calls = _capture_bases(monkeypatch)
    pubs = [f"npz:{npz_pair['near']}", f"npz:{npz_pair['far']}"]
    kw = dict(model="fmnist-cnn", examples=30, k=3, params="fc2.*", dp=True, epsilon=4.0, dp_sketch="public", engine="vmap", device="cpu")
    r1 = rank(f"npz:{npz_pair['priv']}", pubs, **kw)
    rng = np.random.default_rng(5)  # a different private set, same declared classes
    other = write_npz("other", x=(rng.uniform(size=(50, 16, 16)) * 255).astype(np.uint8), y=rng.integers(0, 4, 50),
                      classes=np.array(["0", "1", "2", "3"]))
    r2 = rank(f"npz:{other}", pubs, **kw)
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # the mechanism's input basis ignores the private set
    assert calls == [1, 2]  # the basis is built before each private side is computed
    D = seen[0].shape[1]
    assert D == 6 and r1.privacy["sketch"] == "public" and r1.privacy["sketch_dims"] == D
    assert r1.uniform_baseline == pytest.approx(math.sqrt(1 - 3 / D)) == r2.uniform_baseline
    assert "public data only" in r1.privacy["sketch_description"]
    # shared repeats: one private draw (one release) for every repeat
    seen.clear(), calls.clear()
    rr = rank(f"npz:{npz_pair['priv']}", pubs, repeats=3, dp_repeats="shared", **kw)
    assert len(calls) == 1 and rr.privacy["total_epsilon"] == 4.0 and rr.uniform_baseline == pytest.approx(math.sqrt(1 - 3 / D))


def test_cli_public_sketch_end_to_end(capsys, npz_pair, tmp_path):
    from gsd_cli.cli import main

    j = tmp_path / "dp.json"
    argv = ["rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}", f"npz:{npz_pair['far']}",
            "--model", "fmnist-cnn", "-m", "30", "--k", "2", "--params", "fc2.*", "--dp", "--epsilon", "4",
            "--dp-sketch", "public+4", "--json", str(j), "-q"]
    assert main(argv) == 0, capsys.readouterr().err
    doc = json.loads(j.read_text())
    pv = doc["privacy"]
    assert doc["dp"] is True and pv["sketch"] == "public+4" and pv["sketch_dims"] == 2 * 2 + 4
    assert "plus 4 random directions" in pv["sketch_description"] and doc["sketch"] == "public+4"
    assert doc["uniform_baseline"] == pytest.approx(math.sqrt(1 - 2 / 8))
    capsys.readouterr()
    for bad in (["--dp-sketch", "public"], ["--dp", "--epsilon", "1", "--dp-sketch", "publik"]):
        code = main(["rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
                     "--model", "fmnist-cnn", "-m", "30", "--k", "2", *bad])
        out, err = capsys.readouterr()
        assert code == 2 and "Traceback" not in err and "--dp-sketch" in (out + err)


# ------------------------------------------------------------------------------ --metric dp-energy


def test_energy_sensitivity_and_laplace_scale_against_independent_computation():
    from gsd_cli.distance.dpenergy import energy_sensitivity, laplace_scale, private_energies

    rng = np.random.default_rng(2)
    p, k, C = 12, 2, 0.7
    Vs = [_orthonormal(rng, p, k) for _ in range(3)]
    Vs.append(Vs[0][:, :1].clone())  # overlapping candidates: Lambda > 1
    lam = energy_sensitivity(Vs)
    S = sum((V @ V.T).numpy() for V in Vs)
    assert lam == pytest.approx(np.linalg.eigvalsh(S)[-1], rel=1e-10) and 1 < lam <= len(Vs)
    Q = public_basis(Vs)
    W = [Q.T @ V for V in Vs]

    def s_of(G):  # noise-free energies of clipped projected rows
        Pc = clip_rows(project_rows(G, Q), C)
        return np.array([float(((Pc @ w) ** 2).sum()) for w in W])

    G = torch.from_numpy(rng.normal(size=(20, p)))
    base = s_of(G)
    top = torch.from_numpy(np.linalg.eigh(S)[1][:, -1]) * 5  # the worst row: along S's top eigenvector, clipped to C
    worst_add = s_of(torch.cat([G, top[None]])) - base
    assert worst_add.min() >= 0 and worst_add.sum() == pytest.approx(C * C * lam, rel=1e-9)  # add/remove: C^2 Lambda, attained
    for _ in range(200):  # replace one row by any other: L1 <= 2 C^2 Lambda
        H = G.clone()
        H[rng.integers(20)] = torch.from_numpy(rng.normal(size=p) * rng.uniform(0.1, 5))
        assert np.abs(s_of(H) - base).sum() <= 2 * C * C * lam + 1e-9
    assert laplace_scale(2.0, C, lam) == pytest.approx(2 * C * C * lam / 2.0)

    class Spy:
        def laplace(self, loc, scale, size):
            self.scale = scale
            return np.zeros(size)

    spy = Spy()
    assert np.allclose(private_energies(project_rows(G, Q), W, 2.0, C, lam, spy), base)
    assert spy.scale == pytest.approx(2 * C * C * lam / 2.0)
    # the noise itself: Laplace(b) (mean 0, mean absolute deviation b)
    draws = np.stack([private_energies(project_rows(G, Q), W, 2.0, C, lam, rng) for _ in range(4000)]) - base
    b = laplace_scale(2.0, C, lam)
    assert np.abs(draws.mean(0)).max() < 5 * b * math.sqrt(2 / 4000)
    assert np.abs(np.abs(draws).mean(0) / b - 1).max() < 0.08


def test_dp_energy_rank_and_cli(capsys, npz_pair, tmp_path, monkeypatch):
    from gsd_cli.cli import main

    from gsd_cli.distance.dpenergy import DPEnergy

    seen, calls = _capture_bases(monkeypatch, DPEnergy)
    j = tmp_path / "e.json"
    common = ["rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}", f"npz:{npz_pair['far']}",
              "--model", "fmnist-cnn", "-m", "40", "--k", "3"]
    assert main([*common, "--metric", "dp-energy", "--dp", "--epsilon", "1000", "--json", str(j), "-q"]) == 0, capsys.readouterr().err
    doc = json.loads(j.read_text())
    pv = doc["privacy"]
    assert doc["dp"] is True and doc["metric"] == "dp-energy" and pv["mechanism"] == "laplace-energy" and pv["delta"] == 0
    assert pv["laplace_scale"] == pytest.approx(2 * pv["sensitivity_lambda"] / 1000) and 1 <= pv["sensitivity_lambda"] <= 2
    assert calls == [1]  # public sides (and the basis) before the private rows
    res = {r["public"]: r["distance"] for r in doc["results"]}  # as the non-private order here (checked: 0.41 < 0.46)
    assert res[f"npz:{npz_pair['near']}"] < res[f"npz:{npz_pair['far']}"]
    capsys.readouterr()
    assert main([*common, "--metric", "dp-energy", "--dp", "--epsilon", "4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "DP energy (epsilon=4)" in out and "Laplace mechanism" in out and "DP-GSD" not in out
    for bad in (["--metric", "dp-energy"], ["--metric", "dp-energy", "--dp", "--epsilon", "1", "--dp-sketch", "32"]):
        code = main([*common, *bad])
        out, err = capsys.readouterr()
        assert code == 2 and "Traceback" not in err and "dp-energy" in (out + err)


def test_uniform_quantiles_below_twice_k_and_a_basis_of_only_k_directions_is_refused(npz_pair):
    # a sketch space with D < 2k (a small public basis, --dp-sketch 20 with k=16) had no Bartlett
    # factorisation: the direct QR draw is used there; both agree at D = 2k, and E[d^2] = 1 - k/D
    from gsd_cli import rank
    from gsd_cli.distance.dp_report import uniform_distance_quantiles

    lo, med, hi = uniform_distance_quantiles(4, 7, draws=20000)
    assert 0 < lo < med < hi < 1
    rng = np.random.default_rng(0)
    Q = np.linalg.qr(rng.standard_normal((20000, 6, 3)))[0]
    d = np.sqrt(np.clip(1 - (Q[:, :3, :] ** 2).sum((1, 2)) / 3, 0, 1))
    assert np.allclose(uniform_distance_quantiles(3, 6, draws=20000), np.quantile(d, [0.005, 0.5, 0.995]), atol=0.02)
    assert np.allclose(uniform_distance_quantiles(3, 5, draws=20000)[1] ** 2, 1 - 3 / 5, atol=0.05)
    with pytest.raises(GSDError, match="not more than k"):
        rank(f"npz:{npz_pair['priv']}", [f"npz:{npz_pair['near']}"], model="fmnist-cnn", examples=30, k=3, params="fc2.*",
             dp=True, epsilon=4.0, dp_sketch="public", engine="vmap", device="cpu")
