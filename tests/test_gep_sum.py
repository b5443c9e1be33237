"""GEP's clipped sums without the residual vectors (issue 37, :mod:`gsd_cli.train.gep.sums`): the same
embedding and residual sums as the chain's per-example path (GEPProject, then the two clips), near
B's span too (cancellation), with non-finite rows, for B-GEP, through ``private_step`` with the same
noise, on a frozen BatchNorm and a LoRA model; and each example moves the residual sum by at most S2."""

from collections import OrderedDict

import pytest
import torch
import torch.nn as nn

from gsd_cli.train import Anchor, StepContext, TrainConfig, build_method, private_step
from gsd_cli.train.gep import GEPProject, power_basis, split_groups
from gsd_cli.train.gep.sums import EXACT_BELOW, GEPClipSum, gep_clipped_sums
from gsd_cli.train.transforms import Chain, clip


def _anchor(p, ks=(3, 2), seed=0):
    """An Anchor over two column groups with orthonormal bases (no model: bases set directly)."""
    g = torch.Generator().manual_seed(seed)
    cut = p // 3
    groups = [list(range(cut)), list(range(cut, p))]
    a = Anchor(torch.zeros(10, 1), 2, sum(ks), groups, 1, 0, lambda *a: None)
    a.ks = list(ks)
    a.bases = [power_basis(torch.randn(8, len(c), generator=g), k, 2, g) for c, k in zip(groups, ks)]
    return a


def _rows(anchor, n, p, seed=1):
    """Gradient rows: generic ones, ones almost in B's span (residual 1e-3 and 0.2 of the norm), one
    exactly in it, one large, one zero."""
    g = torch.Generator().manual_seed(seed)
    G = torch.randn(n, p, generator=g) * torch.logspace(-2, 1, n).view(-1, 1)
    inside = anchor.back(torch.randn(4, anchor.k, generator=g))
    noise = torch.randn(4, p, generator=g)
    noise -= anchor.back(anchor.embed(noise))  # orthogonal to B's rows
    for j, eps in enumerate((1e-3, 0.2, 0.0, 0.5)):
        G[j] = inside[j] + eps * noise[j] * inside[j].norm() / noise[j].norm()
    G[-1] = 0
    G[-2] *= 1e4
    return G


def _reference(G, anchor, s1, s2):
    ctx = StepContext(step=0)
    parts = [GEPProject(anchor, residual=s2 is not None), clip(s1, "embedding")] + ([clip(s2, "residual")] if s2 else [])
    out = Chain(*parts).per_example({"grad": G}, ctx)
    return {k: v.sum(0, dtype=torch.float64) for k, v in out.items()}, ctx.info


@pytest.mark.parametrize("s2", [1e-3, 0.5, 1e6, None])
def test_sums_equal_the_per_example_path(s2):
    p = 301
    anchor = _anchor(p)
    G = _rows(anchor, 12, p)
    ctx = StepContext(step=0)
    got = gep_clipped_sums(G, anchor, 0.7, s2, ctx)
    ref, info = _reference(G, anchor, 0.7, s2)
    assert set(got) == set(ref)
    torch.testing.assert_close(got["embedding"], ref["embedding"], rtol=1e-5, atol=1e-7)
    if s2 is not None:  # both against the float64 computation: as accurate as the per-example path
        W = anchor.embed(G).double()
        R = G.double() - anchor.back(W)
        nr = R.norm(dim=1, keepdim=True)
        truth = (R * (s2 / nr).clamp(max=1.0)).sum(0)
        err_ref, err_got = float((ref["residual"] - truth).norm()), float((got["residual"] - truth).norm())
        assert err_got <= 2 * err_ref + 1e-6 * float(truth.norm()), (err_got, err_ref)
        assert float((got["residual"] - ref["residual"]).norm()) <= 1e-4 * float(ref["residual"].norm())
    for k in ("clipped_embedding", "clipped_residual"):
        if k in info:
            assert ctx.info[k] == info[k]
    if s2 is not None:
        assert ctx.info["residual_ratio"][0] == pytest.approx(info["residual_ratio"][0], rel=1e-4)


def test_cancellation_rows_are_formed_and_the_identity_is_accurate_elsewhere():
    """||g||^2 - ||w||^2 against the formed residual's norm: within 1e-5 relative for every example whose
    residual holds at least EXACT_BELOW of its squared norm; the others take the formed vector."""
    p = 4000
    anchor = _anchor(p, ks=(30, 20))
    G = _rows(anchor, 40, p)
    W = anchor.embed(G)
    R = G - anchor.back(W)
    sqg, sqw = G.double().pow(2).sum(1), W.double().pow(2).sum(1)
    exact = R.double().pow(2).sum(1)
    est = (torch.linalg.vector_norm(G, dim=1).double() ** 2 - sqw).clamp_min(0)
    far = est >= EXACT_BELOW * sqg
    assert 0 < int(far.sum()) < G.shape[0]
    assert torch.allclose(est[far], exact[far], rtol=1e-5, atol=0)


def test_non_finite_rows_contribute_nothing():
    p = 60
    anchor = _anchor(p)
    G = _rows(anchor, 8, p)
    G[2, 5] = float("nan")
    G[6, 0] = float("inf")
    ctx = StepContext(step=0)
    got = gep_clipped_sums(G, anchor, 0.5, 0.3, ctx)
    keep = [i for i in range(8) if i not in (2, 6)]
    ref, _ = _reference(G[keep], anchor, 0.5, 0.3)
    for k in ref:
        assert torch.isfinite(got[k]).all()
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-7)


def test_one_example_moves_each_sum_by_at_most_its_clip_norm():
    """Add/remove one example (near B's span, exactly in it, large, generic): the embedding sum moves by at
    most S1 and the residual sum by at most S2 (exactly S2 when its residual is larger)."""
    p = 500
    anchor = _anchor(p, ks=(6, 4))
    G = _rows(anchor, 10, p)
    s1, s2 = 0.4, 0.05
    full = gep_clipped_sums(G, anchor, s1, s2, StepContext(step=0))
    R = G - anchor.back(anchor.embed(G))
    for i in range(G.shape[0]):
        keep = [j for j in range(G.shape[0]) if j != i]
        without = gep_clipped_sums(G[keep], anchor, s1, s2, StepContext(step=0))
        assert float((full["embedding"] - without["embedding"]).norm()) <= s1 * (1 + 1e-6)
        moved = float((full["residual"] - without["residual"]).norm())
        assert moved <= s2 * (1 + 1e-5)
        if float(R[i].norm()) > 1.01 * s2:
            assert moved == pytest.approx(s2, rel=1e-4)


def _frozen_bn_cnn():
    from gsd_cli.models.exact import make_exact

    m = nn.Sequential(OrderedDict(c1=nn.Conv2d(1, 4, 3), bn=nn.BatchNorm2d(4), r=nn.ReLU(), pool=nn.MaxPool2d(2),
                                  flat=nn.Flatten(), fc=nn.Linear(4 * 4 * 4, 3)))
    with torch.no_grad():
        m.bn.running_mean.copy_(torch.linspace(-0.5, 0.5, 4))
        m.bn.running_var.copy_(torch.linspace(0.5, 2, 4))
    return make_exact(m, "freeze")[0]  # --batchnorm freeze


def _lora_mlp():
    peft = pytest.importorskip("peft")
    base = nn.Sequential(OrderedDict(flat=nn.Flatten(), fc1=nn.Linear(100, 16), act=nn.Tanh(), fc2=nn.Linear(16, 3)))
    return peft.get_peft_model(base, peft.LoraConfig(r=2, target_modules=["fc1"], lora_alpha=4, init_lora_weights="gaussian"))


@pytest.mark.parametrize("make", [_frozen_bn_cnn, _lora_mlp])
@pytest.mark.parametrize("residual", [True, False])
def test_the_release_equals_the_materialised_path(make, residual):
    """A GEP step (the same noise generator) by ``--clip-engine auto`` (rows by the per-layer rules, the
    residual by the orthogonal split) and by ``materialise`` (vmap rows, GEPProject and the clips)."""
    from gsd_cli.gradients import gradient_matrix

    torch.manual_seed(0)
    model = make()
    model.train()
    names = [n for n, q in model.named_parameters() if q.requires_grad]
    sizes = [dict(model.named_parameters())[n].numel() for n in names]
    p = sum(sizes)
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(9, 1, 10, 10, generator=g), torch.randint(0, 3, (9,), generator=g)
    chunks = [(x[:5], y[:5]), (x[5:], y[5:])]

    def grads(m_, xa, ya, n_):
        return gradient_matrix(m_, [(xa, ya)], xa.shape[0], n_, None, "vmap", "cpu", "none")

    out = {}
    for engine in ("auto", "materialise"):
        anchor = Anchor(torch.randn(12, 1, 10, 10, generator=torch.Generator().manual_seed(1)), 3, 4,
                        split_groups(names, sizes, None), 1, 0, grads)
        cfg = TrainConfig(method="gep", public="x", k=4, clip_engine=engine, clip_embedding=0.05, clip_residual=0.02,
                          residual=residual)
        m = build_method(cfg, 1.1, anchor)
        assert isinstance(m.clip_sum, GEPClipSum) == (engine == "auto")
        ctx = StepContext(step=0, model=model, names=names, generator=torch.Generator().manual_seed(9))
        out[engine] = (private_step(m.chain, model, names, chunks, p, ctx, m.per_sample, clip_sum=m.clip_sum)["grad"], ctx.info)
        if engine == "auto":
            assert "layers" in m.clip_sum.reason
    torch.testing.assert_close(out["auto"][0], out["materialise"][0], rtol=1e-4, atol=1e-6)
    for k in ("clipped_embedding", "clipped_residual"):
        assert out["auto"][1].get(k) == out["materialise"][1].get(k)


def test_anchor_gradients_by_the_rules_checked_once(monkeypatch):
    """``anchor_for``'s anchor gradients: the per-layer rules' rows (equal to vmap's), their synthetic
    check run once for all recomputations, never the engine's per-recomputation independence check."""
    import gsd_cli.train.clipsum as cs
    from gsd_cli.gradients import gradient_matrix
    from gsd_cli.gradients.layers import LayersEngine
    from gsd_cli.train.gep import anchor_for

    model = _frozen_bn_cnn().train()
    names = [n for n, _ in model.named_parameters()]
    calls = {"check": 0, "independence": 0}
    check, indep = cs.ClippedSum.check, LayersEngine._check
    monkeypatch.setattr(cs.ClippedSum, "check", lambda self, x, y: (calls.__setitem__("check", calls["check"] + 1), check(self, x, y))[1])
    monkeypatch.setattr(LayersEngine, "_check", lambda self, *a: (calls.__setitem__("independence", calls["independence"] + 1), indep(self, *a))[1])
    pub = torch.randn(11, 1, 10, 10, generator=torch.Generator().manual_seed(4))
    anchor = anchor_for(TrainConfig(method="gep", public="x", k=3), pub, model, names, 3, False, 4, torch.device("cpu"))
    y = torch.randint(0, 3, (11,), generator=torch.Generator().manual_seed(5))
    for _ in range(3):
        G = anchor.gradients(model, pub, y, names)
    ref = gradient_matrix(model, [(pub, y)], 11, names, None, "vmap", "cpu", "none")
    torch.testing.assert_close(G, ref, rtol=1e-4, atol=1e-6)
    assert calls == {"check": 1, "independence": 0}
