"""GSD between batches and the ranking of candidates."""

import json

import numpy as np
import pytest
import torch

import gsd_cli
from gsd_cli import GSDError, gradient_subspace_distance, rank
from probes import get_model_spec


def test_distance_of_a_batch_to_itself_is_zero():
    model = get_model_spec("fmnist-cnn").build(seed=0)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 1, 28, 28, generator=g), torch.randint(0, 10, (40,), generator=g)
    assert gradient_subspace_distance(model, (x, y), (x, y), k=8) == pytest.approx(0.0, abs=1e-6)
    d = gradient_subspace_distance(model, x, torch.randn(40, 1, 28, 28, generator=g), k=8)
    assert 0.0 < d <= 1.0


def test_embedded_default_ranks_same_distribution_first():
    r = rank(examples=200, seed=0)  # the probe network at 224x224, the CLI's defaults but m
    assert [x.public for x in r][0] == "mnist-b"
    assert r.winner.public == "mnist-b" and r.winner.winner
    assert [x.rank for x in r] == list(range(1, len(r) + 1))
    assert [x.distance for x in r] == sorted(x.distance for x in r)
    assert sum(x.winner for x in r) == 1
    assert {x.public for x in r} == set(gsd_cli.data.DEFAULT_PUBLIC)
    assert r.winner.distance < r.uniform_baseline - 0.3
    d = r.to_dict()
    for key in ("private", "model", "k", "examples", "seed", "labels", "row_norm", "results"):
        assert key in d
    assert set(d["results"][0]) >= {"public", "distance", "rank", "examples"}
    json.dumps(d)


def test_rank_is_deterministic_and_independent_of_other_candidates(npz_pair):
    p = {k: f"npz:{v}" for k, v in npz_pair.items()}
    kw = dict(model="fmnist-cnn", examples=50, k=4, seed=5, engine="vmap")
    a = rank(p["priv"], [p["near"], p["far"]], **kw)
    b = rank(p["priv"], [p["far"], p["near"]], **kw)
    c = rank(p["priv"], [p["near"]], **kw)
    assert [(x.public, x.distance) for x in a] == [(x.public, x.distance) for x in b]
    assert c[0].distance == a[[x.public for x in a].index(p["near"])].distance
    assert a.winner.public == p["near"]


def test_own_labels_and_param_selection(npz_pair):
    p = {k: f"npz:{v}" for k, v in npz_pair.items()}
    r = rank(p["priv"], [p["near"]], model="fmnist-cnn", examples=40, k=4, labels="own", params="fc2.*")
    assert r.num_params == 32 * 4 + 4  # fc2 sized to the private set's 4 classes
    assert 0 <= r[0].distance <= 1


def test_rank_user_errors(npz_pair, tmp_path):
    p = {k: f"npz:{v}" for k, v in npz_pair.items()}
    with pytest.raises(GSDError, match="k=100"):
        rank(p["priv"], [p["near"]], model="fmnist-cnn", k=100)
    with pytest.raises(GSDError, match="unknown model"):
        rank(p["priv"], [p["near"]], model="vgg99")
    with pytest.raises(GSDError, match="twice"):
        rank(p["priv"], [p["near"], p["near"]], model="fmnist-cnn", k=2, examples=10)
    import numpy as np

    np.savez(tmp_path / "many.npz", x=np.zeros((10, 8, 8), np.uint8) + np.arange(10)[:, None, None], y=np.arange(10))
    with pytest.raises(GSDError, match="labels up to 9"):
        rank(p["priv"], [f"npz:{tmp_path / 'many.npz'}"], model="fmnist-cnn", k=2, examples=10, labels="own")


def test_dp_ranking_large_epsilon_matches_and_tiny_epsilon_warns():
    # the private side: all of a 150-example set with its own labels, so the secret draw of the DP
    # ranking holds the same rows (in another order) as the plain one
    from gsd_cli.data import ArraySource, resolve

    full = resolve("mnist-a")
    idx = np.arange(0, 2500, 2500 // 150)[:150]
    priv = ArraySource("mnist-a-150", np.stack(full.images(idx)), full.labels(idx), num_classes=10)
    kw = dict(private=priv, publics=["mnist-b", "noise", "textures"], examples=150, k=4, model="fmnist-cnn", params="fc*", labels="own")
    plain = rank(**kw)
    dp = rank(**kw, dp=True, epsilon=1e9, clip=1.0)
    assert [r.public for r in dp] == [r.public for r in plain]
    for a, b in zip(sorted(dp, key=lambda r: r.public), sorted(plain, key=lambda r: r.public)):
        assert a.distance == pytest.approx(b.distance, abs=0.02)
    assert dp.privacy["epsilon"] == 1e9 and dp.privacy["delta"] == 0.0 and dp.privacy["exact"]
    assert not dp.warnings
    tiny = rank(**kw, dp=True, epsilon=1e-3)
    assert tiny.warnings and "uniform" in " ".join(tiny.warnings)
    assert "uniform_distance_99" in tiny.to_dict()["privacy"]
    with pytest.raises(GSDError, match="epsilon"):
        rank(**kw, dp=True)
