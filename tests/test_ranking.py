"""GSD between batches (gradient_subspace_distance), the labels of a side, and rank() over datasets."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import gsd_cli
from gsd_cli import GSDError, gradient_subspace_distance, per_sample_gradients, projection_metric, top_k_subspace
from gsd_cli.data import DEFAULT_PRIVATE, DEFAULT_PUBLIC
from gsd_cli.report import to_csv, to_json

TOP_KEYS = {"private", "model", "k", "examples", "seed", "labels", "row_norm", "results"}
RESULT_KEYS = {"public", "distance", "rank"}


def check_ranking(r, n):
    """What every ranking must be: sorted by distance, ranks 1..n, exactly one winner, first."""
    assert len(r) == n
    d = [row.distance for row in r]
    assert d == sorted(d)
    assert [row.rank for row in r] == list(range(1, n + 1))
    assert [row.winner for row in r] == [True] + [False] * (n - 1)
    assert r.winner is r[0]
    for row in r:
        assert 0.0 <= row.distance <= 1.0
        assert len(row.principal_angles_deg) == r.k
        assert row.principal_angles_deg == sorted(row.principal_angles_deg)
        # the distance is the RMS sine of the reported principal angles
        rms = math.sqrt(sum(math.sin(math.radians(a)) ** 2 for a in row.principal_angles_deg) / r.k)
        assert row.distance == pytest.approx(rms, abs=1e-4)
    doc = json.loads(to_json(r))
    assert TOP_KEYS <= set(doc)
    assert [x["public"] for x in doc["results"]] == [row.public for row in r]
    for x in doc["results"]:
        assert RESULT_KEYS <= set(x)
        assert isinstance(x["distance"], float) and isinstance(x["rank"], int)
    assert doc == r.to_dict()
    return doc


# ------------------------------------------------------------------------ gradient_subspace_distance


@pytest.fixture
def gsd_batch(make_all_layers):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(24, 3, 12, 12, generator=g)
    y = torch.randint(0, 4, (24,), generator=g)
    return make_all_layers(seed=8), x, y


@pytest.mark.parametrize("engine", ["vmap", "hooks", "layers"])
def test_gsd_of_a_batch_to_itself_is_zero(gsd_batch, engine):
    model, x, y = gsd_batch
    for row_norm in ("unit", "none"):
        d = gradient_subspace_distance(model, (x, y), (x, y), k=6, engine=engine, device="cpu", row_norm=row_norm)
        assert d == pytest.approx(0.0, abs=1e-6)
    # the order of the examples does not matter either
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    d = gradient_subspace_distance(model, (x, y), (x[perm], y[perm]), k=6, engine=engine, device="cpu", chunk_size=7)
    assert d == pytest.approx(0.0, abs=1e-6)


def test_gsd_with_tensors_only(gsd_batch):
    model, x, _ = gsd_batch
    d = gradient_subspace_distance(model, x, x, k=6, device="cpu")
    assert 0.0 <= d <= 1.0
    # seeded: the same call gives the same number
    assert gradient_subspace_distance(model, x, x, k=6, device="cpu", engine="vmap") == pytest.approx(d, abs=1e-6)
    other = torch.randn(24, 3, 12, 12, generator=torch.Generator().manual_seed(6))
    assert 0.0 < gradient_subspace_distance(model, x, other, k=6, device="cpu") <= 1.0


def test_gsd_is_the_composition_of_its_parts(gsd_batch):
    model, x, y = gsd_batch
    g = torch.Generator().manual_seed(9)
    x2, y2 = torch.rand(20, 3, 12, 12, generator=g) * 4, torch.randint(0, 4, (20,), generator=g)
    d = gradient_subspace_distance(model, (x, y), (x2, y2), k=5, params="fc*", device="cpu", engine="vmap")
    V1 = top_k_subspace(per_sample_gradients(model, x, y, params="fc*", row_norm="unit", device="cpu"), 5)[0]
    V2 = top_k_subspace(per_sample_gradients(model, x2, y2, params="fc*", row_norm="unit", device="cpu"), 5)[0]
    assert d == pytest.approx(projection_metric(V1, V2), abs=1e-6)
    assert 0.05 < d <= 1.0  # different data: clearly not the same subspace
    raw = gradient_subspace_distance(model, (x, y), (x2, y2), k=5, params="fc*", device="cpu", row_norm="none")
    W1 = top_k_subspace(per_sample_gradients(model, x, y, params="fc*", device="cpu"), 5)[0]
    W2 = top_k_subspace(per_sample_gradients(model, x2, y2, params="fc*", device="cpu"), 5)[0]
    assert raw == pytest.approx(projection_metric(W1, W2), abs=1e-6)


def test_gsd_user_errors(gsd_batch):
    model, x, y = gsd_batch
    with pytest.raises(GSDError):
        gradient_subspace_distance(model, (x, y), (x, y), k=6, row_norm="l2", device="cpu")
    with pytest.raises(GSDError):
        gradient_subspace_distance(model, (x[:4], y[:4]), (x, y), k=6, device="cpu")  # k > examples
    with pytest.raises(GSDError):
        gradient_subspace_distance(model, [x], (x, y), k=2, device="cpu")


# ------------------------------------------------------------------------ labels


def test_random_labels_depend_on_seed_and_dataset_name():
    from gsd_cli.data import ArraySource, draw
    from gsd_cli.ranking import sample_labels

    def sample(name, n=400, y_max=3):
        rng = np.random.default_rng(0)
        src = ArraySource(name, rng.uniform(size=(n, 4, 4)), rng.integers(0, y_max + 1, size=n))
        return draw(src, None, seed=0)

    a, a2, b = sample("set-a"), sample("set-a"), sample("set-b")
    la = sample_labels(a, "random", 7, seed=0)
    assert la.dtype == torch.int64 and la.shape == (400,)
    assert int(la.min()) == 0 and int(la.max()) == 6  # the model's label space, not the data's (0..3)
    assert np.bincount(la.numpy(), minlength=7).min() > 30  # ~57 each
    assert torch.equal(la, sample_labels(a2, "random", 7, seed=0))  # same name and seed: same labels
    assert not torch.equal(la, sample_labels(b, "random", 7, seed=0))  # another dataset: others
    assert not torch.equal(la, sample_labels(a, "random", 7, seed=1))  # another seed: others
    own = sample_labels(a, "own", 7, seed=0)
    assert torch.equal(own, torch.from_numpy(a.labels()))
    with pytest.raises(GSDError, match="labels up to 3"):
        sample_labels(a, "own", 2, seed=0)
    with pytest.raises(GSDError):
        sample_labels(a, "mine", 7, seed=0)


# ------------------------------------------------------------------------ rank on the embedded default


def test_embedded_default_ranks_mnist_b_first():
    """End to end on the shipped data with every default (probe network at 224 x 224, k=16, seed 0,
    the device) but the number of examples: the other MNIST half is the closest candidate."""
    r = gsd_cli.rank(examples=150)
    doc = check_ranking(r, len(DEFAULT_PUBLIC))
    assert r.winner.public == "mnist-b" and r.winner.winner
    assert sorted(row.public for row in r) == sorted(DEFAULT_PUBLIC)
    assert r.private == DEFAULT_PRIVATE == "mnist-a"
    assert (doc["model"], doc["k"], doc["examples"], doc["seed"], doc["labels"], doc["row_norm"]) == (
        "probe", 16, 150, 0, "random", "unit"
    )
    assert doc["num_params"] == 30202  # the probe network of paper 004, Table 7b
    assert doc["private_examples"] == 150
    assert {row.public: row.examples for row in r}["faces"] == 150  # 200 faces, 150 drawn
    assert set(doc["results"][0]) >= {"public", "distance", "rank", "examples"}
    json.dumps(r.to_dict())
    assert doc["uniform_baseline"] == pytest.approx(math.sqrt(1 - 16 / doc["num_params"]))
    # a clear margin, not a coin toss: from the runner-up and from random subspaces
    assert r[1].distance - r[0].distance > 0.05
    assert r.winner.distance < r.uniform_baseline - 0.3


def _distances(r):
    return {row.public: row.distance for row in r}


def test_rank_is_deterministic_and_seeded():
    kw = dict(examples=40, k=4, model="fmnist-cnn", device="cpu", engine="hooks")
    r1 = gsd_cli.rank("mnist-a", ["mnist-b", "noise"], **kw)
    r2 = gsd_cli.rank("mnist-a", ["mnist-b", "noise"], **kw)
    assert _distances(r1) == _distances(r2)  # bit for bit
    d1, d2 = r1.to_dict(), r2.to_dict()
    for d in (d1, d2):
        d.pop("seconds")
        for row in d["results"]:
            row.pop("seconds")
    assert d1 == d2
    check_ranking(r1, 2)
    # another seed: other examples, labels and w0, so other distances
    r3 = gsd_cli.rank("mnist-a", ["mnist-b", "noise"], seed=1, **kw)
    assert all(abs(_distances(r3)[n] - _distances(r1)[n]) > 1e-4 for n in ("mnist-b", "noise"))
    # adding a candidate does not change the others' examples, labels or distances, nor does their order
    r4 = gsd_cli.rank("mnist-a", ["noise"], **kw)
    assert _distances(r4)["noise"] == _distances(r1)["noise"]
    r6 = gsd_cli.rank("mnist-a", ["noise", "mnist-b"], **kw)
    assert [(x.public, x.distance) for x in r6] == [(x.public, x.distance) for x in r1]
    assert r1.winner.public == "mnist-b"
    # auto engine: whichever it picks, the same numbers up to float rounding
    r5 = gsd_cli.rank("mnist-a", ["mnist-b", "noise"], **{**kw, "engine": "auto"})
    assert r5.engine in ("vmap", "hooks", "layers")
    for n, d in _distances(r5).items():
        assert d == pytest.approx(_distances(r1)[n], abs=1e-6)


def test_rank_private_against_itself_is_refused():
    # it would score 0 and win with no word (issue 17): the private set is never a public candidate
    with pytest.raises(gsd_cli.GSDError, match="private"):
        gsd_cli.rank("mnist-a", ["mnist-a", "noise"], examples=30, k=4, model="fmnist-cnn", device="cpu", engine="vmap")
    with pytest.raises(gsd_cli.GSDError, match="private"):
        gsd_cli.rank("mnist-a", ["mnist-a:test", "noise"], examples=30, k=4, model="fmnist-cnn", device="cpu", engine="vmap")
    r = gsd_cli.rank("mnist-a:train", ["mnist-a:test", "noise"], examples=30, k=4, model="fmnist-cnn", device="cpu", engine="vmap")
    check_ranking(r, 2)
    assert r.winner.public == "mnist-a:test" and r[1].distance > r.winner.distance


def test_rank_npz_near_beats_far_and_records_settings(npz_pair):
    priv, near, far = (f"npz:{npz_pair[n]}" for n in ("priv", "near", "far"))
    r = gsd_cli.rank(
        priv, [far, near], examples=40, k=4, model="fmnist-cnn", device="cpu", labels="own", row_norm="none",
        params=["conv2.*", "fc*"], seed=3,
    )
    doc = check_ranking(r, 2)
    assert r.winner.public == near
    assert (doc["labels"], doc["row_norm"], doc["seed"], doc["examples"]) == ("own", "none", 3, 40)
    assert doc["params"] == ["conv2.*", "fc*"]
    assert doc["private"] == priv
    # num_params counts only the selected parameters
    from probes import get_model_spec

    model = get_model_spec("fmnist-cnn").build(num_classes=4)
    expected = sum(p.numel() for n, p in model.named_parameters() if n.startswith(("conv2.", "fc")))
    assert doc["num_params"] == expected
    csv_lines = to_csv(r).strip().splitlines()
    assert csv_lines[0].startswith("rank,public,distance")
    assert len(csv_lines) == 1 + 2 and csv_lines[1].startswith(f"1,{near},")


def test_rank_user_errors(npz_pair, write_npz):
    priv = f"npz:{npz_pair['priv']}"
    kw = dict(model="fmnist-cnn", device="cpu")
    with pytest.raises(GSDError, match="unknown dataset"):
        gsd_cli.rank(priv, ["no-such-set"], examples=20, k=2, **kw)
    with pytest.raises(GSDError, match="k=30"):
        gsd_cli.rank(priv, [f"npz:{npz_pair['near']}"], examples=20, k=30, **kw)
    with pytest.raises(GSDError, match="twice"):
        gsd_cli.rank(priv, [f"npz:{npz_pair['near']}"] * 2, examples=20, k=2, **kw)
    with pytest.raises(GSDError):
        gsd_cli.rank(priv, [], examples=20, k=2, **kw)
    with pytest.raises(GSDError, match="unknown model"):
        gsd_cli.rank(priv, [f"npz:{npz_pair['near']}"], examples=20, k=2, model="vgg", device="cpu")
    with pytest.raises(GSDError):
        gsd_cli.rank(priv, [f"npz:{npz_pair['near']}"], examples=20, k=2, labels="mine", **kw)
    with pytest.raises(GSDError):
        gsd_cli.rank(priv, [f"npz:{npz_pair['near']}"], examples=20, k=2, row_norm="l1", **kw)
    many = write_npz("many", x=np.zeros((10, 8, 8), np.uint8) + np.arange(10)[:, None, None], y=np.arange(10))
    with pytest.raises(GSDError, match="labels up to 9"):
        gsd_cli.rank(priv, [f"npz:{many}"], examples=10, k=2, labels="own", **kw)


# ------------------------------------------------------------------------ DP-GSD


def test_dp_ranking_large_epsilon_matches_and_tiny_epsilon_warns():
    # the private side: all of a 150-example set with its own labels, so the secret draw of the DP
    # ranking holds the same rows (in another order) as the plain one
    from gsd_cli.data import ArraySource, resolve

    full = resolve("mnist-a")
    idx = np.arange(0, 2500, 2500 // 150)[:150]
    priv = ArraySource("mnist-a-150", np.stack(full.images(idx)), full.labels(idx), num_classes=10)
    kw = dict(private=priv, publics=["mnist-b", "noise", "textures"], examples=150, k=4, model="fmnist-cnn", params="fc*", labels="own")
    plain = gsd_cli.rank(**kw)
    dp = gsd_cli.rank(**kw, dp=True, epsilon=1e9, clip=1.0, distance="dp-gsd")
    assert [r.public for r in dp] == [r.public for r in plain]
    for a, b in zip(sorted(dp, key=lambda r: r.public), sorted(plain, key=lambda r: r.public)):
        assert a.distance == pytest.approx(b.distance, abs=0.02)
    assert dp.privacy["epsilon"] == 1e9 and dp.privacy["delta"] == 0.0 and dp.privacy["exact"]
    assert not dp.warnings
    tiny = gsd_cli.rank(**kw, dp=True, epsilon=1e-3, distance="dp-gsd")
    assert tiny.warnings and "uniform" in " ".join(tiny.warnings)
    assert "uniform_distance_99" in tiny.to_dict()["privacy"]
    # the DP energy order at a huge epsilon: the same winner, and its value the noise-free energy
    # distance sqrt(1 - sum_i |V_j^T g_i|^2 / m), here checked against GSD's order
    energy = gsd_cli.rank(**kw, dp=True, epsilon=1e9, clip=1.0, distance="dp-energy")
    assert energy.to_dict()["metric"] == "dp-energy" and energy.results[0].public == plain.results[0].public
    # the default DP distance (the DP selection): the same winner, alone, with the same released distance
    chosen = gsd_cli.rank(**kw, dp=True, epsilon=1e9, clip=1.0)
    assert chosen.to_dict()["metric"] == "dp-select" and [r.public for r in chosen] == [plain.results[0].public]
    assert chosen.results[0].distance == pytest.approx(energy.results[0].distance, abs=1e-6)
    assert sorted(chosen.not_selected) == sorted(r.public for r in plain.results[1:])
    with pytest.raises(GSDError, match="epsilon"):
        gsd_cli.rank(**kw, dp=True)
