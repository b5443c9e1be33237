"""RGP (paper 001), random sparsification (paper 003), TopAgg (paper 002) and gsd compare: the
reductions each method must satisfy, their sensitivities and noise scales against independent
computations, and the end-to-end runs."""

import itertools
import json
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.privacy import effective_noise_multiplier, epsilon_of, training_event
from gsd_cli.train import StepContext, TrainConfig, build_method, chain_step_event, private_step, train
from gsd_cli.train.loop import _flat_to_grads
from gsd_cli.train.rgp import RGP, power_carriers
from gsd_cli.train.sparsify import random_mask, sparsity_rate
from gsd_cli.train.topagg import norm_top_k


def _net(seed=0):
    """Conv (bias) -> ReLU -> conv (no bias, stride 2, padding 1) -> flatten -> Linear (bias), float64."""
    torch.manual_seed(seed)
    return nn.Sequential(OrderedDict(
        c1=nn.Conv2d(2, 5, 3), r1=nn.ReLU(), c2=nn.Conv2d(5, 4, 3, stride=2, padding=1, bias=False), r2=nn.Tanh(),
        flat=nn.Flatten(), fc=nn.Linear(4 * 3 * 3, 3),
    )).double()


def _data(n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 7, 7, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g)


def _per_example_full(model, x, y):
    """Brute force: one backward per example, the gradient of every parameter."""
    rows = []
    for i in range(x.shape[0]):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
    return rows


# ---------------------------------------------------------------------------------------------- RGP


def test_rgp_full_rank_without_noise_or_clipping_is_the_plain_gradient():
    model, (x, y) = _net(), _data()
    names = [n for n, _ in model.named_parameters()]
    cfg = TrainConfig(method="rgp", clip=1e9, rgp_rank=1000, rgp_warmup=0)
    method = build_method(cfg, 0.0, model=model, names=names)
    rgp = method.details["rgp_state"]
    with torch.no_grad():  # a nonzero historical update (warm-up 0: D = W_t - W_0)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ctx = StepContext(step=3, model=model, names=names, generator=torch.Generator().manual_seed(0))
    v = private_step(method.chain, model, names, [(x[:4], y[:4]), (x[4:], y[4:])], 0, ctx, method.per_sample)["grad"]
    assert all(l.r == min(l.p, l.d) for l in rgp.layers)
    rows = _per_example_full(model, x, y)
    full = torch.cat([sum(r[n] for r in rows).reshape(-1) for n in names])
    assert torch.allclose(v, full, atol=1e-10)


def test_rgp_carriers_are_orthonormal_and_follow_the_historical_update():
    gen = torch.Generator().manual_seed(0)
    for p, d, r, rank in [(20, 30, 4, 30), (30, 20, 5, 2), (8, 8, 8, 8), (10, 40, 3, 0)]:
        D = torch.randn(p, rank, generator=gen, dtype=torch.float64) @ torch.randn(rank, d, generator=gen, dtype=torch.float64) if rank else torch.zeros(p, d)
        L, R = power_carriers(D, r, 1, gen)
        assert L.shape == (p, min(r, p, d)) and R.shape == (min(r, p, d), d)
        assert torch.allclose(L.T @ L, torch.eye(L.shape[1], dtype=L.dtype), atol=1e-12)
        assert torch.allclose(R @ R.T, torch.eye(R.shape[0], dtype=R.dtype), atol=1e-12)
    # a rank-2 update is recovered exactly by rank-2 carriers (Algorithm 2 with K = 1)
    U = torch.linalg.qr(torch.randn(12, 2, generator=gen, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(9, 2, generator=gen, dtype=torch.float64))[0]
    D = U @ torch.diag(torch.tensor([5.0, 2.0], dtype=torch.float64)) @ V.T
    L, R = power_carriers(D, 2, 1, gen)
    assert torch.allclose(L @ L.T @ D @ R.T @ R, D, atol=1e-10)
    # warm-up: carriers of W_t; afterwards of W_t - W_0
    model = _net()
    names = [n for n, _ in model.named_parameters()]
    rgp = RGP(model, names, rank=1, warmup=2, seed=0)
    with torch.no_grad():
        model.fc.weight.add_(torch.outer(torch.ones(3, dtype=torch.float64), torch.arange(36, dtype=torch.float64)))
    fc = [l for l in rgp.layers if l.mname == "fc"][0]
    rgp.compute(model, 5)  # past the warm-up: D = W_t - W_0 = 1 a^T, rank 1
    assert abs(float(fc.L[:, 0].abs() @ torch.ones(3, dtype=torch.float64))) == pytest.approx(math.sqrt(3), rel=1e-9)
    rgp.compute(model, 0)  # warm-up: D = W_t, not rank 1 along 1
    assert float(fc.L[:, 0].abs().sum()) != pytest.approx(math.sqrt(3), rel=1e-6)


def test_rgp_carrier_per_sample_gradients_equal_a_brute_force_loop():
    model, (x, y) = _net(), _data(5)
    names = [n for n, _ in model.named_parameters()]
    rgp = RGP(model, names, rank=2, warmup=10, seed=3)
    rgp.compute(model, 0)
    G = rgp.per_sample(model, names, x, y)["grad"]
    assert G.shape == (5, rgp.width)
    assert rgp.width == sum(l.r * (l.p + l.d) for l in rgp.layers) + 5 + 3  # + c1.bias, fc.bias
    full = _per_example_full(model, x, y)
    for i in range(5):
        # an explicit reparametrized forward with L, R as leaves, one example at a time
        leaves = {}
        h = x[i : i + 1]
        for mname, mod in model.named_children():
            layer = next((l for l in rgp.layers if l.mname == mname), None)
            if layer is None:
                h = mod(h)
                continue
            L = layer.L.clone().requires_grad_(True)
            R = layer.R.clone().requires_grad_(True)
            leaves[mname] = (L, R)
            W = (L @ R + (mod.weight.detach().reshape(layer.p, layer.d) - layer.L @ layer.R)).reshape(mod.weight.shape)
            h = F.linear(h, W, mod.bias) if isinstance(mod, nn.Linear) else F.conv2d(h, W, mod.bias, mod.stride, mod.padding)
        loss = F.cross_entropy(h, y[i : i + 1])
        grads = torch.autograd.grad(loss, [t for pair in leaves.values() for t in pair])
        col, k = 0, 0
        for layer in rgp.layers:
            dL, dR = grads[k], grads[k + 1]
            k += 2
            gL = G[i, col : col + dL.numel()].reshape(dL.shape)
            col += dL.numel()
            gR = G[i, col : col + dR.numel()].reshape(dR.shape)
            col += dR.numel()
            assert torch.allclose(gL, dL, atol=1e-12) and torch.allclose(gR, dR, atol=1e-12)
            dW = full[i][layer.weight_name].reshape(layer.p, layer.d)  # Theorem 2.1
            assert torch.allclose(gL, dW @ layer.R.T, atol=1e-12) and torch.allclose(gR, layer.L.T @ dW, atol=1e-12)
        assert torch.allclose(G[i, col:], torch.cat([full[i]["c1.bias"], full[i]["fc.bias"]]), atol=1e-12)
    # the model is left as it was
    assert isinstance(model.fc, nn.Linear) and isinstance(model.c1, nn.Conv2d)


def test_rgp_sensitivity_and_noise_scale():
    model = _net()
    names = [n for n, _ in model.named_parameters()]
    sigma, C = 1.3, 0.7
    method = build_method(TrainConfig(method="rgp", clip=C, rgp_rank=2), sigma, model=model, names=names)
    rgp = method.details["rgp_state"]
    assert effective_noise_multiplier(chain_step_event(method.chain)) == pytest.approx(sigma)
    # clipped per-example vector (the whole carrier vector) has norm <= C
    x, y = _data(8)
    parts = method.chain.per_example(rgp.per_sample(model, names, 100 * x, y), StepContext(0))
    assert parts["grad"].norm(dim=1).max() <= C * (1 + 1e-12)
    # noise: N(0, (sigma C)^2) on each of the width carrier coordinates; after Eq. 3 each layer's
    # noise lies in the r (p + d - r)-dimensional tangent space of the rank-r matrices
    gen = torch.Generator().manual_seed(0)
    ctx = StepContext(0, model=model, names=names, generator=gen)
    energy = {l.weight_name: [] for l in rgp.layers}
    for _ in range(300):
        v = private_step(method.chain, model, names, [], 0, ctx, method.per_sample)["grad"]
        col = 0
        for n, p in model.named_parameters():
            if n in energy:
                energy[n].append(float(v[col : col + p.numel()].pow(2).sum()))
            col += p.numel()
    for l in rgp.layers:
        expected = (sigma * C) ** 2 * l.r * (l.p + l.d - l.r)
        assert np.mean(energy[l.weight_name]) == pytest.approx(expected, rel=0.12)


# ----------------------------------------------------------------------------------------------- RS


def test_rs_mask_is_independent_of_the_data_and_follows_the_schedule():
    assert [sparsity_rate(0.8, e, 5) for e in range(5)] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8])
    assert sparsity_rate(0.5, 0, 1) == 0.5
    with pytest.raises(GSDError):
        sparsity_rate(1.0, 0, 3)
    m = random_mask(1000, 0.37, seed=4, epoch=2)
    assert int((m == 0).sum()) == 370
    assert torch.equal(m, random_mask(1000, 0.37, seed=4, epoch=2))
    assert not torch.equal(m, random_mask(1000, 0.37, seed=4, epoch=3)) and not torch.equal(m, random_mask(1000, 0.37, seed=5, epoch=2))
    # inside the chain: same seed, different data -> the same zero pattern
    method = build_method(TrainConfig(method="dpsgd", sparsify=0.6), 1.0)
    ctx = StepContext(step=7, epoch=3, epochs=4, generator=torch.Generator().manual_seed(0))
    method.chain.begin_step(ctx)
    a = method.chain.per_example({"grad": torch.randn(5, 200) + 3}, ctx)["grad"]
    b = method.chain.per_example({"grad": torch.rand(9, 200) + 1}, ctx)["grad"]
    assert torch.equal(a[0] == 0, b[0] == 0) and torch.equal(a[0] == 0, b[-1] == 0)
    assert int((a[0] == 0).sum()) == int(0.6 * 200) and ctx.info["epoch_metrics"]["sparsity"] == pytest.approx(0.6)


@pytest.mark.parametrize("method", ["dpsgd", "gep"])
def test_rs_step_leaves_coordinates_outside_the_mask_unchanged(method, tiny):
    from gsd_cli.train.gep import Anchor

    model = _net()
    names = [n for n, _ in model.named_parameters()]
    p = sum(q.numel() for q in model.parameters())
    x, y = _data(10)
    cfg = TrainConfig(method=method, public="x", sparsify=0.5, k=3, clip=1.0, clip_embedding=1.0, clip_residual=0.5)
    anchor = None
    if method == "gep":
        from gsd_cli.gradients import gradient_matrix

        def anchor_grads(model_, xa, ya, names_):
            return gradient_matrix(model_, [(xa, ya)], xa.shape[0], names_, None, "vmap", "cpu", "none").double()

        anchor = Anchor(torch.randn(8, 2, 7, 7, dtype=torch.float64), 3, 3, [list(range(p))], 1, 0, anchor_grads)
    m = build_method(cfg, 2.0, anchor)
    before = torch.cat([q.detach().reshape(-1) for q in model.parameters()]).clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.0, weight_decay=0.0)
    ctx = StepContext(step=0, model=model, names=names, generator=torch.Generator().manual_seed(1), epoch=1, epochs=2)
    v = private_step(m.chain, model, names, [(x, y)], p, ctx)["grad"]
    _flat_to_grads(model, names, v / 10)
    opt.step()
    after = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    mask = random_mask(p, 0.5, 0, 1).bool()
    assert torch.equal(after[~mask], before[~mask])  # dropped: untouched, no noise either
    assert bool((after[mask] != before[mask]).all())  # kept: noisy update everywhere
    # the accounted event is the method's own (RS costs nothing)
    assert effective_noise_multiplier(chain_step_event(m.chain)) == pytest.approx(2.0 / (math.sqrt(2) if method == "gep" else 1))


# ------------------------------------------------------------------------------------------- TopAgg


def test_norm_top_k_bound_and_largest_coordinates():
    gen = torch.Generator().manual_seed(0)
    for K in (0.1, 0.5, 0.7, 0.95, 1.0):
        G = torch.randn(50, 40, generator=gen, dtype=torch.float64) * torch.rand(50, 40, generator=gen, dtype=torch.float64) ** 3
        out = norm_top_k(G, K)
        assert bool((out.norm(dim=1) <= math.sqrt(K) * G.norm(dim=1) * (1 + 1e-12)).all())
        for g, o in zip(G, out):
            kept = o != 0
            assert torch.equal(o[kept], g[kept])
            order = torch.argsort(g.abs(), descending=True)
            n = int(kept.sum())
            assert set(order[:n].tolist()) == set(torch.nonzero(kept).flatten().tolist())  # the n largest
            if n < g.numel():  # one more would cross K ||g||^2
                assert float(g[order[: n + 1]].pow(2).sum()) > K * float(g.pow(2).sum()) * (1 - 1e-12)
    # brute force over every subset of 8 coordinates: the kept set is the largest prefix that fits
    g = torch.tensor([3.0, -2.5, 0.1, 1.0, -0.4, 2.0, 0.05, -1.5], dtype=torch.float64)
    for K in (0.3, 0.6, 0.9):
        best = max((s for n in range(9) for s in itertools.combinations(range(8), n)
                    if sum(g[list(s)].pow(2)) <= K * g.pow(2).sum() and all(abs(g[i]) >= abs(g[j]) for i in s for j in range(8) if j not in s)),
                   key=len)
        assert set(best) == set(torch.nonzero(norm_top_k(g[None], K)[0]).flatten().tolist())
    with pytest.raises(GSDError):
        norm_top_k(g[None], 0.0)


def test_topagg_sensitivity_by_brute_force_and_noise_scale():
    sigma, C, K = 1.1, 0.8, 0.6
    method = build_method(TrainConfig(method="topagg", clip=C, topk_fraction=K), sigma)
    rel = method.chain.releases()[0]
    assert rel.sensitivity == pytest.approx(math.sqrt(K) * C) and rel.std == pytest.approx(math.sqrt(K) * sigma * C)
    assert effective_noise_multiplier(chain_step_event(method.chain)) == pytest.approx(sigma)
    # brute force: the L2 sensitivity of the compressed sum over add/remove-one neighbours
    gen = torch.Generator().manual_seed(2)
    G = torch.cat([10 * torch.randn(200, 30, generator=gen), torch.full((1, 30), 5.0), 1e-3 * torch.randn(20, 30, generator=gen)])
    ctx = StepContext(0)
    parts = method.chain.per_example({"grad": G}, ctx)["grad"]
    total = parts.sum(0)
    sens = max(float((total - (total - parts[i])).norm()) for i in range(G.shape[0]))
    assert sens <= math.sqrt(K) * C * (1 + 1e-6)
    assert sens >= 0.97 * math.sqrt(K) * C  # nearly attained (the flat row): sqrt(K) C is the sensitivity
    # noise of an empty step: std sqrt(K) sigma C per coordinate
    noise = torch.stack([method.chain.aggregated({"grad": torch.zeros(2000)}, StepContext(0, generator=gen))["grad"] for _ in range(10)])
    assert noise.std().item() == pytest.approx(math.sqrt(K) * sigma * C, rel=0.02)
    # a chain that declares the DP-SGD sensitivity after NormTopK is refused, and vice versa
    from gsd_cli.train import chain, clip, gaussian_noise
    from gsd_cli.train.topagg import NormTopK

    with pytest.raises(GSDError, match="sensitivity"):
        chain_step_event(chain(clip(C), NormTopK(K), gaussian_noise(sigma * C, "grad", C)))


def test_every_method_is_accounted_with_its_own_multiplier():
    """Independent computation: epsilon of the trainer's event = epsilon of a Poisson-subsampled
    Gaussian with multiplier (noise std / L2 sensitivity) computed by hand for each method."""
    from dp_accounting import dp_event as ev

    from gsd_cli.train import Anchor

    model = _net()
    names = [n for n, _ in model.named_parameters()]
    anchor = Anchor(torch.zeros(3, 1), 2, 4, [list(range(10))], 1, 0, None)
    sigma, C, K, q, T, delta = 1.5, 0.9, 0.5, 0.05, 200, 1e-5
    hand = {"dpsgd": (sigma * C) / C, "topagg": (math.sqrt(K) * sigma * C) / (math.sqrt(K) * C), "rgp": sigma * C / C,
            "dpsgd+rs": sigma, "gep": (sigma ** -2 + sigma ** -2) ** -0.5, "gep+rs": sigma / math.sqrt(2)}
    for label, z in hand.items():
        meth, _, rs = label.partition("+")
        cfg = TrainConfig(method=meth, public="x", clip=C, topk_fraction=K, sparsify=0.3 if rs else 0.0)
        m = build_method(cfg, sigma, anchor, model=model, names=names)
        declared = chain_step_event(m.chain)
        assert effective_noise_multiplier(declared) == pytest.approx(z, rel=1e-12), label
        eps = epsilon_of(training_event(m.step_event(sigma), q, T), delta)
        ref = epsilon_of(ev.SelfComposedDpEvent(ev.PoissonSampledDpEvent(q, ev.GaussianDpEvent(z)), T), delta)
        assert eps == pytest.approx(ref, rel=1e-9), label


# ------------------------------------------------------------------------------------- end to end


def _cfg(tiny, **kw):
    base = dict(private=tiny["private"], public=tiny["public"], method="gep", epsilon=4.0, epochs=2, batch_size=30,
                k=8, public_examples=40, deterministic_noise=True, physical_batch=16)
    base.update(kw)
    return TrainConfig(**base)


def test_train_rgp_topagg_and_rs_end_to_end(tiny, tmp_path):
    s = train(_cfg(tiny, method="rgp", public=None, rgp_rank=2, rgp_warmup=1, epochs=1, batch_size=48), tmp_path / "rgp")
    assert s["epsilon"] <= 4.0 and s["rgp"]["per_example_floats"] < s["rgp"]["full_per_example_floats"]
    assert "RGP" in s["privacy"]["mechanism"] and 0 <= s["test"]["accuracy"] <= 1
    s = train(_cfg(tiny, method="topagg", public=None, topk_fraction=0.5, epochs=1, batch_size=48), tmp_path / "topagg")
    assert s["topagg"]["sensitivity"] == pytest.approx(math.sqrt(0.5)) and s["epsilon"] <= 4.0
    rows = [json.loads(l) for l in (tmp_path / "topagg" / "metrics.jsonl").read_text().splitlines()]
    assert 0 < rows[-1]["topk_fraction_kept"] < 1
    s = train(_cfg(tiny, method="dpsgd", public=None, sparsify=0.4, epochs=3, batch_size=48), tmp_path / "dpsgd_rs")
    rows = [json.loads(l) for l in (tmp_path / "dpsgd_rs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["sparsify_rate"] for r in rows] == pytest.approx([0.0, 0.2, 0.4])
    assert s["sparsity_reached"] == pytest.approx(0.4, abs=1e-3) and s["sparsify"]["final_rate"] == 0.4


def test_compare_runs_tabulates_and_never_overwrites(tiny, tmp_path, capsys):
    from gsd_cli.train.compare import compare, parse_methods

    assert [m[0] for m in parse_methods("dpsgd, GEP+rs")] == ["dpsgd", "gep+rs"]
    for bad in ("dpsgd,sgd", "", "rgp+rs", "dpsgd,dpsgd"):
        with pytest.raises(GSDError):
            parse_methods(bad)
    base = TrainConfig(epochs=1, batch_size=48, k=4, public_examples=20, deterministic_noise=True, physical_batch=32)
    res = compare(tiny["private"], tiny["public"], "dpsgd,topagg", 3.0, seeds=2, out=tmp_path / "cmp", base=base, device="cpu")
    assert [r["method"] for r in res["table"]] == ["dpsgd", "topagg"] and len(res["runs"]) == 4
    accs = [r["accuracy"] for r in res["runs"] if r["method"] == "dpsgd"]
    assert res["table"][0]["accuracy_mean"] == pytest.approx(np.mean(accs))
    assert res["table"][0]["accuracy_sd"] == pytest.approx(np.std(accs, ddof=1))
    assert all(r["epsilon"] <= 3.0 for r in res["runs"]) and res["seeds"] == [0, 1]
    # four releases about one private set: together they spent the sum (issue 17)
    tot = res["privacy_total"]
    assert tot["runs"] == 4 and tot["total_epsilon"] == pytest.approx(sum(r["epsilon"] for r in res["runs"]))
    assert tot["total_delta"] == pytest.approx(4 * base.delta) and tot["dp"] is False  # deterministic noise: not DP
    saved = json.loads((tmp_path / "cmp" / "comparison.json").read_text())
    assert saved["privacy_total"] == tot and saved["publishable"] is False
    for f in ("comparison.json", "comparison.csv", "comparison.png", "dpsgd/seed0/summary.json", "topagg/seed1/summary.json"):
        assert (tmp_path / "cmp" / f).stat().st_size > 0
    assert (tmp_path / "cmp" / "comparison.csv").read_text().splitlines()[0].startswith("method,seeds,accuracy_mean")
    with pytest.raises(GSDError, match="not empty"):
        compare(tiny["private"], None, "dpsgd", 3.0, 1, tmp_path / "cmp", base=base)
    # the CLI: one-line errors, exit 2, nothing written
    assert main(["compare", "--private", tiny["private"], "--methods", "dpsgd,nope", "--out", str(tmp_path / "x")]) == 2
    assert main(["compare", "--private", tiny["private"], "--methods", "gep", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'nope'" in err and "needs public data" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_rgp_resume_bit_for_bit(tiny, tmp_path, interrupt):
    """RGP's W_0 and carriers depend only on the settings and the weights: an interrupted run resumed
    equals an uninterrupted one (RS's masks depend on the seed and the epoch only)."""
    from safetensors.torch import load_file

    cfg = _cfg(tiny, public=None, epochs=2, batch_size=48, method="rgp", rgp_rank=2, rgp_warmup=2)

    with pytest.raises(interrupt.error):
        train(cfg, tmp_path / "a", progress=interrupt("epoch", 1))
    train(cfg, tmp_path / "a", resume=True)
    train(cfg, tmp_path / "b")
    a, b = load_file(tmp_path / "a" / "checkpoint.safetensors"), load_file(tmp_path / "b" / "checkpoint.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_of_a_run_saved_before_the_new_settings_existed(tiny, tmp_path, interrupt):
    """A checkpoint without rgp_rank, rgp_warmup, topk_fraction and sparsify (older runs) resumes
    with their defaults; a non-default value is still refused."""
    cfg = _cfg(tiny, method="dpsgd", public=None, epochs=2, batch_size=48)
    with pytest.raises(interrupt.error):
        train(cfg, tmp_path / "old", progress=interrupt("epoch", 1))
    meta_path = tmp_path / "old" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    for k in ("rgp_rank", "rgp_warmup", "topk_fraction", "sparsify"):
        del meta["settings"][k]
    meta.pop("weights_sha256", None)  # an older run's checkpoint has no weights digest
    meta.pop("weights_sha256", None)  # older runs did not record the weights' SHA-256 either (issue 36)
    meta_path.write_text(json.dumps(meta))
    from safetensors.torch import load_file, save_file
    from gsd_cli.train import checkpoint as ckpt

    wfile = tmp_path / "old" / "checkpoint.safetensors"  # as such a run's own weights would be: with its digest
    save_file(load_file(str(wfile)), str(wfile), metadata={**ckpt.tensor_metadata(wfile), "gsd_digest": ckpt.state_digest(meta)})
    with pytest.raises(GSDError, match="sparsify"):
        train(TrainConfig(**{**cfg.to_dict(), "sparsify": 0.5}), tmp_path / "old", resume=True)
    assert train(cfg, tmp_path / "old", resume=True)["epochs"] == 2


def test_compare_second_phase_gets_the_public_set_and_its_privacy(tiny, tmp_path):
    """``gsd compare`` runs second-phase with --public (stage 1) and states its privacy; dpsgd in the same
    comparison trains without public data, at the same sigma and epsilon."""
    from gsd_cli.train.compare import compare

    base = TrainConfig(epochs=1, batch_size=48, public_examples=20, public_epochs=1, deterministic_noise=True, physical_batch=32)
    res = compare(tiny["private"], tiny["public"], "dpsgd,second-phase", 3.0, seeds=1, out=tmp_path / "cmp", base=base, device="cpu")
    sp = next(r for r in res["table"] if r["method"] == "second-phase")
    assert "stage 1 trains on public data only" in sp["privacy"]
    s1 = json.loads((tmp_path / "cmp" / "second-phase" / "seed0" / "summary.json").read_text())
    s0 = json.loads((tmp_path / "cmp" / "dpsgd" / "seed0" / "summary.json").read_text())
    assert s1["public"] == tiny["public"] and s0["public"] is None
    assert s1["sigma"] == s0["sigma"] and s1["epsilon"] == s0["epsilon"] <= 3.0


def test_rgp_on_lora_adapters(tmp_path):
    """RGP on a LoRA model (--method rgp --peft lora): the adapters' A and B are the reparametrized
    weights; peft's layers read ``lora_A.weight`` (to cast their input), which the wrapper provides as
    L R + W~, so the swapped model computes the same function and the carrier gradients exist."""
    pytest.importorskip("peft")
    from gsd_cli.models.peft import build_model
    from gsd_cli.train.rgp import RGP

    _, model, names, _ = build_model("fmnist-cnn", 10, seed=0, peft="lora:r=2")
    model = model.double()
    with torch.no_grad():  # B starts at zero; give it values so the adapters matter
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    x = torch.randn(5, 1, 28, 28, dtype=torch.float64)
    y = torch.arange(5)
    rgp = RGP(model, names, rank=1)
    adapters = [l.weight_name for l in rgp.layers if "lora_" in l.weight_name]
    assert len(adapters) >= 2 and len(rgp.layers) == len(adapters) + 1  # the adapters and the new head
    before = model(x)
    with rgp.swapped(model):
        assert torch.allclose(model(x), before, atol=1e-10)
        wrapped = {l.mname: model.get_submodule(l.mname) for l in rgp.layers}
        for l in rgp.layers:
            assert torch.allclose(wrapped[l.mname].weight, l.module.weight, atol=1e-12)
    G = rgp.per_sample(model, names, x, y)["grad"]
    assert G.shape == (5, rgp.width) and torch.isfinite(G).all() and G.abs().sum() > 0
