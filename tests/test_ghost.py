"""The Gram/ghost path (gsd_cli.ghost) gives the materialised path's subspaces and distances."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

from gsd_cli.subspace.dppca import DenseOperator, private_top_k_subspace
from gsd_cli.errors import GSDError
from gsd_cli.ghost import GhostOperator, choose_gram, parse_bytes, top_k_from_operator
from gsd_cli.gradients import per_sample_gradients
from gsd_cli.subspace import gram, projection_metric, top_k_subspace

K = 4
N = 24


class SeqLinear(nn.Module):  # Linear on a sequence: <A_i A_j^T, B_i B_j^T>
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)).mean(1))


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 8, 3, padding=1, bias=False)
        self.gn = nn.GroupNorm(2, 8)
        self.ln = nn.LayerNorm(8 * 5 * 5)
        self.fc = nn.Linear(8 * 5 * 5, 3)

    def forward(self, x):
        return self.fc(self.ln(torch.relu(self.gn(self.conv(x))).flatten(1)))


class Tok(nn.Module):  # Embedding (with a padding index) + a transformer block
    def __init__(self, block: bool):
        super().__init__()
        self.emb = nn.Embedding(30, 8, padding_idx=0)
        self.block = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True) if block else nn.Identity()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.block(self.emb(x)).mean(1))


class Scale(nn.Module):  # no ghost rule and no Opacus sampler: falls back to torch.func for this layer
    def __init__(self, n):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x):
        return x * self.w


def _img(c, s):
    return lambda n, g: torch.randn(n, c, s, s, generator=g)


MODELS = {
    "linear": (lambda: nn.Sequential(nn.Linear(10, 6), nn.Tanh(), nn.Linear(6, 3)), lambda n, g: torch.randn(n, 10, generator=g)),
    "linear-seq": (SeqLinear, lambda n, g: torch.randn(n, 5, 6, generator=g)),
    "conv": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 6, 3, stride=2, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=3), nn.ReLU(),
            nn.Conv2d(6, 4, (1, 2), stride=(1, 2), bias=False), nn.Flatten(), nn.Linear(4 * 4 * 2, 3),
        ),
        _img(3, 8),
    ),
    "conv-materialised": (  # large T against the layer's size: this conv takes per-sample gradients
        lambda: nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Flatten(), nn.Linear(2 * 12 * 12, 3)), _img(1, 12),
    ),
    "norms": (Norms, _img(2, 5)),
    "embedding": (lambda: Tok(False), lambda n, g: torch.randint(0, 30, (n, 4), generator=g)),
    "transformer": (lambda: Tok(True), lambda n, g: torch.randint(0, 30, (n, 5), generator=g)),
    "mixed+fallback": (
        lambda: nn.Sequential(nn.Conv2d(1, 4, 3, stride=2), nn.GroupNorm(2, 4), nn.Flatten(), Scale(36), nn.Linear(36, 3)), _img(1, 7),
    ),
}


def _data(gen, seed):
    g = torch.Generator().manual_seed(seed)
    x = gen(N, g)
    return x, torch.randint(0, 3, (N,), generator=g)


def _op(net, x, y, **kw):
    return GhostOperator(net, lambda c: ((x[i : i + c], y[i : i + c]) for i in range(0, N, c)), N, **kw)


@pytest.mark.parametrize("name", list(MODELS))
def test_ghost_distance_equals_materialised(name):
    build, gen = MODELS[name]
    torch.manual_seed(0)
    net = build()
    data = [_data(gen, 1), _data(gen, 2)]
    Gs = [per_sample_gradients(net, x, y, engine="vmap", device="cpu") for x, y in data]
    ops = [_op(net, x, y, chunk_size=7) for x, y in data]
    assert torch.allclose(ops[0].gram(), gram(Gs[0]), rtol=1e-5, atol=1e-6 * float(gram(Gs[0]).abs().max()))
    for row_norm in ("none", "unit"):
        dense = [top_k_subspace(G / G.norm(dim=1, keepdim=True) if row_norm == "unit" else G, K) for G in Gs]
        ghost = [top_k_from_operator(op, K, row_norm) for op in ops]
        d_mat = projection_metric(dense[0][0], dense[1][0])
        d_gh = projection_metric(ghost[0][0], ghost[1][0])
        assert d_gh == pytest.approx(d_mat, rel=1e-5)
        assert torch.allclose(ghost[0][1], dense[0][1], rtol=1e-5)
        assert projection_metric(dense[0][0], ghost[0][0]) < 1e-3  # the same subspace
        assert torch.allclose(ghost[0][0].T @ ghost[0][0], torch.eye(K, dtype=torch.float64), atol=1e-10)


def test_fallback_only_for_the_layer_without_a_rule():
    build, gen = MODELS["mixed+fallback"]
    torch.manual_seed(0)
    op = _op(build(), *_data(gen, 1))
    rules = {u.prefix: u.rule for u in op.units}
    assert rules == {"0": "conv2d", "1": "opacus", "3": "func", "4": "linear"}


def test_products_match_dense():
    build, gen = MODELS["transformer"]
    torch.manual_seed(0)
    net = build()
    x, y = _data(gen, 3)
    G = per_sample_gradients(net, x, y, engine="vmap", device="cpu").double()
    for budget in (2**30, 2**20):  # one stored group, and several passes
        op = _op(net, x, y, memory_budget=budget, chunk_size=5)
        op.gram()
        X = torch.randn(G.shape[1], 3, dtype=torch.float64)
        Y = torch.randn(N, 3, dtype=torch.float64)
        assert torch.allclose(op.matvec(X), G @ X, atol=1e-5)
        assert torch.allclose(op.rmatvec(Y), G.T @ Y, atol=1e-5)
        f = torch.linspace(0.5, 2.0, N, dtype=torch.float64)
        assert torch.allclose(op.scaled(f).gram(), (G * f[:, None]) @ (G * f[:, None]).T, rtol=1e-5, atol=1e-6)


def test_memory_budget_honoured():
    """The budget sets the chunk size and splits the layers into groups whose stored factors fit half of it."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 5),
    )  # stores ~14k floats per example: 1.4 MB for 24 examples
    x, y = torch.randn(N, 3, 16, 16), torch.randint(0, 5, (N,))
    seen = []

    def batches(c):
        for i in range(0, N, c):
            seen.append(min(c, N - i))
            yield x[i : i + c], y[i : i + c]

    small, big = 2 * 2**20, 2**30
    ops = {}
    for budget in (small, big):
        seen.clear()
        op = GhostOperator(net, batches, N, memory_budget=budget)
        K = op.gram()
        ops[budget] = (op, K, max(seen[1:]))
        assert op.info["stored_bytes_max"] <= budget // 2
    op_s, K_s, chunk_s = ops[small]
    op_b, K_b, chunk_b = ops[big]
    assert chunk_s < chunk_b and chunk_s == op_s.info["chunk_size"]
    per_chunk = 4 * chunk_s * (3 * op_s.info["activation_floats_per_example"] + op_s.info["factor_floats_per_example"])
    assert per_chunk <= small // 4
    assert op_s.info["groups"] > 1 and op_b.info["groups"] == 1
    assert torch.allclose(K_s, K_b, rtol=1e-6)
    with pytest.raises(GSDError, match="memory-budget"):
        GhostOperator(net, batches, 100_000, memory_budget=2**20).gram()


def test_dp_sampler_on_the_operator_equals_dense():
    build, gen = MODELS["conv"]
    torch.manual_seed(0)
    net = build()
    x, y = _data(gen, 4)
    G = per_sample_gradients(net, x, y, engine="vmap", device="cpu")
    for mech in ("sequential", "matrix"):
        Vd = private_top_k_subspace(G, 3, 5.0, 0.5, mech, np.random.default_rng(0), sweeps=1)
        Vg = private_top_k_subspace(_op(net, x, y), 3, 5.0, 0.5, mech, np.random.default_rng(0), sweeps=1)
        Vo = private_top_k_subspace(DenseOperator(G), 3, 5.0, 0.5, mech, np.random.default_rng(0), sweeps=1)
        assert torch.allclose(Vd, Vo, atol=1e-6)  # clipping in float32 (tensor) or float64 (operator)
        assert projection_metric(Vd, Vg) < 1e-4


def test_choose_and_parse():
    assert parse_bytes("4G") == 4 * 2**30 and parse_bytes("512M") == 512 * 2**20 and parse_bytes("1.5GiB") == int(1.5 * 2**30)
    with pytest.raises(GSDError):
        parse_bytes("lots")
    with pytest.raises(GSDError):
        parse_bytes("10k")
    assert choose_gram("auto", 2000, 30_000, "4G") == "materialize"
    assert choose_gram("auto", 2000, 25_000_000, "4G") == "ghost"
    assert choose_gram("ghost", 10, 10, None) == "ghost"
    assert choose_gram("auto", 2000, 25_000_000, "4G", sketch_dim=64) == "materialize"
    with pytest.raises(GSDError):
        choose_gram("fast", 1, 1, None)


def test_rank_ghost_equals_materialise():
    from gsd_cli.ranking import rank

    kw = dict(k=3, examples=40, model="fmnist-cnn", params="fc*")
    a = rank("mnist-a", ["mnist-b"], gram="materialize", **kw)
    b = rank("mnist-a", ["mnist-b"], gram="ghost", memory_budget="64M", **kw)
    assert b.engine == "ghost"
    assert b.results[0].distance == pytest.approx(a.results[0].distance, rel=1e-5)


def test_cli_gram_ghost_and_bad_budget(capsys, tmp_path):
    from gsd_cli.cli import main

    j = tmp_path / "r.json"
    code = main(["rank", "--public", "mnist-b", "--model", "fmnist-cnn", "--params", "fc*", "-m", "30", "--k", "3",
                 "--gram", "ghost", "--memory-budget", "256M", "--json", str(j), "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"engine": "ghost"' in j.read_text()
    code = main(["rank", "--public", "mnist-b", "-m", "30", "--memory-budget", "lots", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().startswith("error:") and "memory-budget" in err


def test_dp_rank_on_the_gram_path_equals_materialised():
    from gsd_cli.ranking import rank

    kw = dict(k=3, examples=40, model="fmnist-cnn", params="fc*", dp=True, epsilon=50.0, insecure_seed=5)  # same private draw
    a = rank("mnist-a", ["mnist-b"], gram="materialize", **kw)
    b = rank("mnist-a", ["mnist-b"], gram="ghost", **kw)
    assert b.results[0].distance == pytest.approx(a.results[0].distance, rel=1e-6)
    # the DP selection's released shares and scales: from float sums that the two paths round differently
    floats = {k for k, v in a.privacy.items() if isinstance(v, (float, dict))}
    assert {k: v for k, v in b.privacy.items() if k not in floats} == {k: v for k, v in a.privacy.items() if k not in floats}
    assert all(b.privacy[k] == pytest.approx(a.privacy[k], rel=1e-6) for k in floats)
