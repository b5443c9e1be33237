"""Ghost clipping and book-keeping for DP-SGD (issue 37, :mod:`gsd_cli.train.clipsum`): the clipped sum
equals a brute-force per-example loop (one backward per example, then clip_C and sum) for every layer
rule and both per-layer paths, the release equals today's materialised path, and the models it cannot
treat fall back (auto) or are refused (ghost)."""

from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gsd_cli.train.clipsum as cs
from gsd_cli.errors import GSDError
from gsd_cli.gradients import _only_trainable
from gsd_cli.train import StepContext, TrainConfig, build_method, private_step
from gsd_cli.train.clipsum import ClippedSum
from gsd_cli.train.clipsum.step import LazyClipSum, fusable


def _clipped_brute(brute_force, model, x, y, names, C):
    """sum_i g_i min(1, C / ||g_i||) in float64 from per-example autograd, and the squared norms."""
    G = brute_force(model, x, y, names).double()
    ok = torch.isfinite(G).all(1, keepdim=True)
    G = torch.where(ok, G, torch.zeros((), dtype=G.dtype))
    nrm = G.norm(dim=1, keepdim=True)
    return (G * (C / nrm.clamp_min(1e-12)).clamp(max=1.0)).sum(0), nrm.squeeze(1) ** 2


class _Scale(nn.Module):
    """A leaf layer no rule knows (torch.func on the layer alone)."""

    def __init__(self, c):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, c).view(1, c, 1, 1))

    def forward(self, x):
        return x * self.w


class _Mixed(nn.Module):
    """Conv2d (stride, padding) -> GroupNorm -> grouped dilated conv -> frozen BatchNorm -> custom scale ->
    conv (no bias) -> Linear on a sequence (T > 1) -> Linear; with an Embedding branch."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.c2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.bn = nn.BatchNorm2d(8)
        self.sc = _Scale(8)
        self.c3 = nn.Conv2d(8, 12, 3, stride=2, padding=1, bias=False)
        self.c4 = nn.Conv2d(12, 12, 3, padding=1)  # stride 1: its ghost norm by the pixel Gram
        self.seq = nn.Linear(12, 6)  # on the 16 positions of c3's output: T = 16
        self.emb = nn.Embedding(5, 6)
        self.fc = nn.Linear(6 * 16 + 6, 4)
        with torch.no_grad():
            self.bn.running_mean.copy_(torch.linspace(-1, 1, 8))
            self.bn.running_var.copy_(torch.linspace(0.5, 2, 8))
            self.bn.weight.copy_(torch.linspace(0.5, 1.5, 8))
        self.bn.eval()

    def forward(self, x):
        h = torch.tanh(self.gn(self.c1(x)))
        h = self.sc(self.bn(torch.tanh(self.c2(h))))
        h = torch.tanh(self.c4(torch.tanh(self.c3(h))))  # n x 12 x 4 x 4
        s = torch.tanh(self.seq(h.flatten(2).transpose(1, 2)))  # n x 16 x 6
        tok = (x[:, 0, 0, :2].abs() * 3).long().clamp(max=4)  # two tokens per example
        e = self.emb(tok).sum(1)
        return self.fc(torch.cat([s.flatten(1), e], 1))


def _data(n=7, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 4, (n,), generator=g)


RULES = {"fastdp": cs.ghost_cheaper, "ghost": lambda T, D, C: True, "materialise": lambda T, D, C: False}


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("C", [1e-3, 0.3, 1e6])
def test_clipped_sum_equals_brute_force_on_every_layer_rule(rule, C, brute_force, monkeypatch):
    monkeypatch.setattr(cs, "ghost_cheaper", RULES[rule])
    torch.manual_seed(0)
    model = _Mixed().train()
    model.bn.eval()
    names = [n for n, _ in model.named_parameters()]
    x, y = _data()
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        eng.check(x, y)
        s, sq = eng(x, y, C)
    ref, rsq = _clipped_brute(brute_force, model, x, y, names, C)
    torch.testing.assert_close(sq, rsq, rtol=2e-5, atol=0)
    torch.testing.assert_close(s.double(), ref, rtol=2e-5, atol=2e-6 * float(ref.abs().max()))
    kinds = {l.prefix: l.kind for l in eng.layers}
    assert kinds["sc"] == "func" and kinds["gn"] == kinds["bn"] == kinds["emb"] == "rule"
    if rule == "ghost":
        assert eng.plan["c1"] == eng.plan["c2"] == eng.plan["c3"] == eng.plan["c4"] == eng.plan["seq"] == "ghost"
        assert cs._pixels_cheaper(model.c4, torch.zeros(1, 12, 4, 4), 16) and not cs._pixels_cheaper(model.c1, torch.zeros(1, 3, 16, 16), 64)
    if rule == "materialise":
        assert set(eng.plan.values()) == {"materialised"}


@pytest.mark.parametrize("kernel,stride,padding,dilation", [(3, 1, 1, 1), (3, 2, 1, 1), ((3, 2), (1, 2), (2, 0), (1, 2)), (1, 1, 0, 1), (5, 1, 2, 1)])
def test_ghost_norm_by_pixel_gram_equals_the_patches_one(kernel, stride, padding, dilation):
    """A convolution's ghost norm from the Gram of its input's pixels (shifted by each kernel offset)
    equals the one from its patches, ||g_i||^2 of the per-example gradient."""
    torch.manual_seed(0)
    m = nn.Conv2d(5, 7, kernel, stride=stride, padding=padding, dilation=dilation, bias=False)
    x = torch.randn(3, 5, 9, 8, dtype=torch.float64)
    out = m.double()(x)
    g = torch.randn_like(out)
    T = out.shape[2] * out.shape[3]
    B = g.reshape(3, 7, T).transpose(1, 2)
    sq = cs._conv_ghost_by_pixels(m, x, B, out.shape[2], out.shape[3])
    ref = torch.stack([torch.autograd.grad(m(x[i:i + 1]), m.weight, g[i:i + 1])[0].pow(2).sum() for i in range(3)])
    A = cs._patches(m, x)
    via_patches = (torch.bmm(A, A.transpose(1, 2)) * torch.bmm(B, B.transpose(1, 2))).sum((1, 2))
    torch.testing.assert_close(sq, ref, rtol=1e-10, atol=0)
    torch.testing.assert_close(via_patches, ref, rtol=1e-10, atol=0)


def test_subset_of_parameters_and_non_finite_examples(brute_force, monkeypatch):
    """Only some parameters selected (a bias alone, a weight alone); an example with a NaN input
    contributes zero, as the Clip transform zeroes its row, and the others are untouched."""
    monkeypatch.setattr(cs, "ghost_cheaper", RULES["ghost"])
    torch.manual_seed(1)
    model = _Mixed().train()
    model.bn.eval()
    names = ["c1.bias", "c2.weight", "seq.weight", "fc.weight", "fc.bias"]
    x, y = _data()
    x[2, 1, 3, 3] = float("nan")
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        s, sq = eng(x, y, 0.5)
    keep = [i for i in range(x.shape[0]) if i != 2]
    ref, rsq = _clipped_brute(brute_force, model, x[keep], y[keep], names, 0.5)
    assert torch.isnan(sq[2]) and torch.isfinite(s).all()
    torch.testing.assert_close(s.double(), ref, rtol=2e-5, atol=2e-6 * float(ref.abs().max()))
    torch.testing.assert_close(sq[keep], rsq, rtol=2e-5, atol=0)


@pytest.mark.parametrize("name", ["fmnist-cnn", "resnet20"])
def test_registered_models_match_brute_force(name, brute_force):
    from probes import get_model_spec

    spec = get_model_spec(name)
    model = spec.build(num_classes=10, seed=0).train()
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(2)
    x = torch.rand(3, spec.channels, spec.input_size, spec.input_size, generator=g)
    y = torch.randint(0, 10, (3,), generator=g)
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        eng.check(x, y)
        s, _ = eng(x, y, 0.1)
    ref, _ = _clipped_brute(brute_force, model, x, y, names, 0.1)
    torch.testing.assert_close(s.double(), ref, rtol=1e-4, atol=1e-5 * float(ref.abs().max()))
    assert "ghost" in eng.plan.values()


def test_frozen_batchnorm_backbone_by_batchnorm_freeze(brute_force):
    """--batchnorm freeze on a model with BatchNorm layers in training mode (made exact by make_exact)."""
    from gsd_cli.models.exact import make_exact

    torch.manual_seed(0)
    net = nn.Sequential(OrderedDict(c=nn.Conv2d(3, 6, 3, stride=2), bn=nn.BatchNorm2d(6), r=nn.ReLU(), f=nn.Flatten(),
                                    fc=nn.Linear(6 * 9, 3), bn1=nn.BatchNorm1d(3)))
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1), net.bn.running_var.uniform_(0.5, 2)
    seq = nn.Sequential(OrderedDict(c=nn.Conv1d(2, 4, 3), bn=nn.BatchNorm1d(4), f=nn.Flatten(), fc=nn.Linear(4 * 6, 3)))
    with torch.no_grad():
        seq.bn.running_mean.uniform_(-1, 1), seq.bn.running_var.uniform_(0.5, 2), seq.bn.weight.uniform_(0.5, 1.5)
    for net, shape in ((net, (5, 3, 7, 7)), (seq, (5, 2, 8))):  # BatchNorm2d and BatchNorm1d on 2-d and 3-d inputs
        model, _ = make_exact(net, "freeze")
        model.train()
        names = [n for n, _ in model.named_parameters()]
        x, y = torch.randn(*shape) + 0.7, torch.randint(0, 3, (5,))
        eng = ClippedSum(model, names)
        with _only_trainable(model, names):
            eng.check(x, y)
            s, _ = eng(x, y, 0.2)
        ref, _ = _clipped_brute(brute_force, model, x, y, names, 0.2)
        torch.testing.assert_close(s.double(), ref, rtol=2e-5, atol=2e-6 * float(ref.abs().max()))


def test_lora_adapters_via_peft(brute_force):
    pytest.importorskip("peft")
    from gsd_cli.models.peft import build_model

    _, model, names, _ = build_model("fmnist-cnn", 10, 0, peft="lora:r=2,targets=fc1|fc2")
    with torch.no_grad():  # B adapters start at zero: move them so every adapter has a gradient
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    model.train()
    assert any("lora_A" in n for n in names)
    x, y = torch.rand(4, 1, 28, 28), torch.randint(0, 10, (4,))
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        eng.check(x, y)
        s, _ = eng(x, y, 0.05)
    ref, _ = _clipped_brute(brute_force, model, x, y, names, 0.05)
    torch.testing.assert_close(s.double(), ref, rtol=2e-5, atol=2e-6 * float(ref.abs().max()))


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(OrderedDict(c1=nn.Conv2d(1, 4, 3), r1=nn.ReLU(), p=nn.MaxPool2d(2), c2=nn.Conv2d(4, 8, 3, groups=2),
                                     r2=nn.ReLU(), f=nn.Flatten(), fc=nn.Linear(8 * 2 * 2, 3)))


def test_the_release_equals_the_materialised_path():
    """private_step with the ghost engine and with materialised per-sample gradients: the same noisy
    sum (same noise generator) to float rounding, the same clipped counts, several chunks."""
    model = _cnn()
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(11, 1, 10, 10, generator=g), torch.randint(0, 3, (11,), generator=g)
    chunks = [(x[:4], y[:4]), (x[4:8], y[4:8]), (x[8:], y[8:])]
    p = sum(q.numel() for q in model.parameters())
    out = {}
    for engine in ("ghost", "materialise"):
        m = build_method(TrainConfig(method="dpsgd", clip=0.05, clip_engine=engine), 1.3)
        assert (m.clip_sum is None) == (engine == "materialise")
        ctx = StepContext(step=0, model=model, names=names, generator=torch.Generator().manual_seed(9))
        v = private_step(m.chain, model, names, chunks, p, ctx, m.per_sample, clip_sum=m.clip_sum)["grad"]
        out[engine] = (v, ctx.info["clipped_grad"])
    assert out["ghost"][1] == out["materialise"][1] and out["ghost"][1][1] == 11
    torch.testing.assert_close(out["ghost"][0], out["materialise"][0], rtol=1e-5, atol=1e-6)
    assert out["ghost"][0].dtype == torch.float32
    # an empty subsample still releases noise only, on either path
    m = build_method(TrainConfig(method="dpsgd", clip=0.05), 1.3)
    ctx = StepContext(step=0, model=model, names=names, generator=torch.Generator().manual_seed(9))
    v = private_step(m.chain, model, names, [], p, ctx, m.per_sample, clip_sum=m.clip_sum)["grad"]
    assert v.shape == (p,) and float(v.std()) == pytest.approx(1.3 * 0.05, rel=0.3)


class _Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.d, self.fc2 = nn.Linear(6, 5), nn.Dropout(0.5), nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(self.d(torch.tanh(self.fc1(x))))


class _Tied(nn.Module):
    """The output layer reuses fc1's weight through F.linear (outside fc1's forward)."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(F.linear(torch.tanh(self.fc1(x)), self.fc1.weight)))


class _BatchStat(nn.Module):
    """Subtracts the batch mean: the examples of a batch interact."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc1(x)
        return self.fc2(h - h.mean(0, keepdim=True))


@pytest.mark.parametrize("make,shape", [(_Dropout, (5, 6)), (_Tied, (5, 4)), (_BatchStat, (5, 4)),
                                        (lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)), (5, 4))])
def test_models_it_cannot_treat_fall_back_under_auto_and_are_refused_under_ghost(make, shape):
    model = make()
    names = [n for n, _ in model.named_parameters()]
    x, y = torch.randn(*shape), torch.randint(0, 3, (shape[0],))
    auto = LazyClipSum("auto", 1.0)
    assert auto.hook(model, names, x, y) is None and auto.reason.startswith("materialise (")
    with pytest.raises(GSDError, match="--clip-engine ghost: .*use --clip-engine auto or materialise"):
        LazyClipSum("ghost", 1.0).hook(model, names, x, y)


def test_the_choice_reads_no_private_example(monkeypatch):
    """The first-use check runs on a synthetic batch: the path is the same for any private chunk."""
    model = _cnn()
    names = [n for n, _ in model.named_parameters()]
    seen = []
    real = ClippedSum.check

    def spy(self, x, y):
        seen.append(x.clone())
        return real(self, x, y)

    monkeypatch.setattr(ClippedSum, "check", spy)
    x = torch.full((3, 1, 10, 10), 7.0)
    lazy = LazyClipSum("auto", 1.0)
    assert lazy.hook(model, names, x, torch.zeros(3, dtype=torch.long)) is not None
    assert lazy.hook(model, names, x + 1, torch.zeros(3, dtype=torch.long)) is lazy.step  # decided once
    assert len(seen) == 1
    calls = []
    monkeypatch.setattr(ClippedSum, "__call__", lambda self, xs, ys, C: calls.append(xs) or (_ for _ in ()).throw(RuntimeError("stop")))
    with pytest.raises(RuntimeError):
        LazyClipSum("auto", 1.0).hook(_cnn(), names, x, torch.zeros(3, dtype=torch.long))
    assert calls and not any(bool((c == 7.0).any()) for c in calls)


def test_fusable_chains():
    assert fusable(build_method(TrainConfig(method="dpsgd"), 1.0).chain)
    assert not fusable(build_method(TrainConfig(method="topagg"), 1.0).chain)
    rs = build_method(TrainConfig(method="dpsgd", sparsify=0.5), 1.0)
    assert not fusable(rs.chain) and rs.clip_sum.max_norm is None  # per-sample rows only (the mask comes before the clip)
    assert build_method(TrainConfig(method="dpsgd", sparsify=0.5, clip_engine="materialise"), 1.0).clip_sum is None
    assert build_method(TrainConfig(method="second-phase", public="x"), 1.0).clip_sum is not None
    with pytest.raises(GSDError, match="--clip-engine"):
        from gsd_cli.train.config import validate

        validate(TrainConfig(method="dpsgd", clip_engine="fast"))


def test_train_with_either_engine_gives_the_same_weights(tiny, tmp_path):
    from safetensors.torch import load_file

    from gsd_cli.train import train

    base = dict(private=tiny["private"], method="dpsgd", epsilon=4.0, epochs=1, batch_size=30, insecure_seed=5,
                physical_batch=16, clip=0.5)
    sa = train(TrainConfig(**base, clip_engine="ghost"), tmp_path / "g")
    sb = train(TrainConfig(**base, clip_engine="materialise"), tmp_path / "m")
    assert sa["clip_engine"].startswith("ghost: ") and sb["clip_engine"] == "materialise"
    assert sa["sigma"] == sb["sigma"] and sa["epsilon"] == sb["epsilon"]
    wa, wb = load_file(str(tmp_path / "g" / "checkpoint.safetensors")), load_file(str(tmp_path / "m" / "checkpoint.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method", ["gep", "topagg", "dpsgd+rs"])
def test_methods_that_need_every_vector_take_the_rows_of_the_layer_rules(method):
    """GEP (embedding and residual of each g_i), TopAgg (a top-k of each g_i) and DP-SGD with random
    sparsification (a mask before the clip) need each example's vector: the ghost trick does not apply,
    but their rows come from the per-layer rules (one batched forward and backward) and the release
    equals the vmap path's."""
    from gsd_cli.train import Anchor
    from gsd_cli.train.gep import split_groups

    model = _cnn()
    names = [n for n, _ in model.named_parameters()]
    p = sum(q.numel() for q in model.parameters())
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(9, 1, 10, 10, generator=g), torch.randint(0, 3, (9,), generator=g)
    chunks = [(x[:5], y[:5]), (x[5:], y[5:])]
    out = {}
    for engine in ("auto", "materialise"):
        kw = dict(clip_engine=engine, clip=0.05)
        if method == "gep":
            from gsd_cli.gradients import gradient_matrix

            def grads(m_, xa, ya, n_):
                return gradient_matrix(m_, [(xa, ya)], xa.shape[0], n_, None, "vmap", "cpu", "none")

            anchor = Anchor(torch.randn(12, 1, 10, 10, generator=torch.Generator().manual_seed(1)), 3, 4,
                            split_groups(names, [q.numel() for q in model.parameters()], None), 1, 0, grads)
            m = build_method(TrainConfig(method="gep", public="x", k=4, **kw), 1.1, anchor)
        elif method == "topagg":
            m = build_method(TrainConfig(method="topagg", topk_fraction=0.5, **kw), 1.1, model=model, names=names)
        else:
            m = build_method(TrainConfig(method="dpsgd", sparsify=0.5, **kw), 1.1)
        assert not fusable(m.chain) and (m.clip_sum is None) == (engine == "materialise")
        ctx = StepContext(step=0, model=model, names=names, generator=torch.Generator().manual_seed(9))
        out[engine] = private_step(m.chain, model, names, chunks, p, ctx, m.per_sample, clip_sum=m.clip_sum)["grad"]
        if engine == "auto":  # GEP: "GEP residual by the orthogonal split; rows: layers ..." (gep.sums)
            assert m.clip_sum.reason.startswith("layers") or m.clip_sum.reason.startswith("GEP residual by the orthogonal split; rows: layers")
    torch.testing.assert_close(out["auto"], out["materialise"], rtol=1e-4, atol=1e-6)


def test_cli_clip_engine_option(tiny, tmp_path, capsys):
    from gsd_cli.cli import main

    base = ["train", "--private", tiny["private"], "--method", "dpsgd", "--epochs", "1", "--batch-size", "30", "-q"]
    assert main([*base, "--clip-engine", "fast", "--out", str(tmp_path / "bad")]) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 1 and "--clip-engine" in err[0] and not (tmp_path / "bad").exists()
    assert main([*base, "--clip-engine", "ghost", "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    import json

    assert json.loads((tmp_path / "run" / "summary.json").read_text())["clip_engine"].startswith("ghost: ")


@pytest.mark.parametrize("rule", ["ghost", "materialise"])
def test_sensitivity_of_the_clipped_sum_is_the_clip_norm(rule, monkeypatch):
    """Add/remove one example: the released sum moves by that example's clipped gradient, of norm at most
    C (and exactly C when its gradient is larger), whatever the other examples (one with inputs scaled
    by 1e3 among them)."""
    monkeypatch.setattr(cs, "ghost_cheaper", RULES[rule])
    torch.manual_seed(2)
    model = _Mixed().train()
    model.bn.eval()
    names = [n for n, _ in model.named_parameters()]
    x, y = _data(6, seed=8)
    x[3] *= 1e3
    eng = ClippedSum(model, names)
    C = 0.05
    with _only_trainable(model, names):
        full, sq = eng(x, y, C)
        for i in range(x.shape[0]):
            keep = [j for j in range(x.shape[0]) if j != i]
            without, _ = eng(x[keep], y[keep], C)
            moved = float((full - without).norm())
            assert moved <= C * (1 + 1e-5)
            if float(sq[i]) > (C * 1.01) ** 2:
                assert moved == pytest.approx(C, rel=1e-4)


@pytest.mark.parametrize("C", [0.02, 1e6])
def test_rgp_carrier_clipped_sums_by_ghost_clipping_equal_its_vmap_path(C):
    """RGP's clipped carrier gradients (dL, dR of each layer and the other parameters, one vector per
    example) by the ghost engine on the model with its layers as leaf carriers: the same release as
    RGP's own vmap path, before and after the warm-up (carriers from W_t, then from W_t - W_0)."""
    torch.manual_seed(0)
    model = nn.Sequential(OrderedDict(c1=nn.Conv2d(2, 5, 3), r1=nn.ReLU(), c2=nn.Conv2d(5, 4, 3, stride=2, padding=1, bias=False),
                                      r2=nn.Tanh(), flat=nn.Flatten(), fc=nn.Linear(4 * 3 * 3, 3)))
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(7, 2, 7, 7, generator=g), torch.randint(0, 3, (7,), generator=g)
    chunks = [(x[:4], y[:4]), (x[4:], y[4:])]
    for step in (0, 5):
        if step:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
        out = {}
        for engine in ("auto", "materialise"):
            m = build_method(TrainConfig(method="rgp", clip=C, rgp_rank=2, rgp_warmup=3, clip_engine=engine), 0.7, model=model, names=names)
            ctx = StepContext(step=step, model=model, names=names, generator=torch.Generator().manual_seed(3))
            out[engine] = private_step(m.chain, model, names, chunks, 0, ctx, m.per_sample, clip_sum=m.clip_sum)["grad"]
            if engine == "auto":
                assert m.clip_sum.reason.startswith("ghost (RGP carriers)"), m.clip_sum.reason
            assert ctx.info["clipped_grad"][1] == 7
        torch.testing.assert_close(out["auto"], out["materialise"], rtol=1e-4, atol=1e-6)
    assert [n for n, _ in model.named_parameters()] == names  # the swap is undone


def test_max_pool_runs_channels_last_after_a_one_channel_input():
    """A 1-channel chunk is channels-first and channels-last at once, so the first convolution's output
    stays channels-first: the engines hand every MaxPool2d its input in channels-last order (the fast
    CPU kernel) and the hooks are gone afterwards."""
    from gsd_cli.gradients.layers import LayersEngine
    from probes import get_model_spec

    model = get_model_spec("fmnist-cnn").build(num_classes=10, seed=0).train()
    names = [n for n, _ in model.named_parameters()]
    seen = []
    spy = model.pool1.register_forward_hook(lambda m, a, o: seen.append(a[0].is_contiguous(memory_format=torch.channels_last)
                                                                         and not a[0].is_contiguous()))
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    with _only_trainable(model, names):
        ClippedSum(model, names)(x, y, 1.0)
        LayersEngine(model, names, cs.ClippedSum(model, names).loss)(x, y, torch.empty(4, sum(p.numel() for p in model.parameters())))
    model(x)
    spy.remove()
    assert seen[:2] == [True, True] and seen[-1] is False
    assert not model.pool1._forward_pre_hooks and not model.pool2._forward_pre_hooks


def _tiny_vit():
    """torchvision's VisionTransformer, tiny, with gsd's LinearSelfAttention (as the registered
    vit_b_16): class_token and pos_embedding belong to modules with sub-layers."""
    from torchvision.models.vision_transformer import VisionTransformer

    from probes.backbones import LinearSelfAttention

    torch.manual_seed(0)
    net = VisionTransformer(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3)
    for block in net.encoder.layers:
        block.self_attention = LinearSelfAttention(block.self_attention)
    with torch.no_grad():  # not the zero init: every example's class-token gradient differs
        net.class_token.normal_()
        net.heads.head.weight.normal_(std=0.5)
    return net.train()


@pytest.mark.parametrize("subset", ["all", "tokens"])
def test_vit_class_token_and_pos_embedding_by_their_input_gradient(subset, brute_force, monkeypatch):
    """A ViT trained in full (class_token on the model, pos_embedding on the encoder: parameters of
    modules with sub-layers) takes the ghost engine: their per-example gradients come from the gradient
    of the encoder's input, and the clipped sum equals the brute-force loop."""
    monkeypatch.setattr(cs, "ghost_cheaper", RULES["ghost"])
    model = _tiny_vit()
    names = [n for n, _ in model.named_parameters()] if subset == "all" else ["class_token", "encoder.pos_embedding", "heads.head.weight"]
    x = torch.randn(5, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    y = torch.tensor([0, 1, 2, 0, 1])
    eng = ClippedSum(model, names)
    with _only_trainable(model, names):
        eng.check(x, y)
        s, sq = eng(x, y, 0.05)
    ref, rsq = _clipped_brute(brute_force, model, x, y, names, 0.05)
    torch.testing.assert_close(sq, rsq, rtol=2e-5, atol=0)
    torch.testing.assert_close(s.double(), ref, rtol=2e-5, atol=2e-6 * float(ref.abs().max()))
    assert eng.plan["class_token"] == eng.plan["encoder.pos_embedding"] == "materialised"


def test_a_changed_forward_of_a_parameter_owner_is_refused():
    from torchvision.models.vision_transformer import VisionTransformer

    class Mine(VisionTransformer):
        def forward(self, x):
            return super().forward(x) * 2

    torch.manual_seed(0)
    net = Mine(image_size=8, patch_size=4, num_layers=1, num_heads=2, hidden_dim=8, mlp_dim=16, num_classes=3)
    with pytest.raises(NotImplementedError, match="class_token belongs to the model"):
        ClippedSum(net, ["class_token"])


def test_vit_in_full_takes_the_layers_engine_rows(brute_force):
    """The same input-gradient rule gives the `layers` engine (gsd rank, GEP's rows) a ViT in full."""
    from gsd_cli.gradients import default_loss
    from gsd_cli.gradients.layers import LayersEngine

    model = _tiny_vit()
    names = [n for n, _ in model.named_parameters()]
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 1, 2, 0])
    eng = LayersEngine(model, names, default_loss)
    out = torch.empty(4, sum(p.numel() for p in model.parameters()))
    with _only_trainable(model, names):
        eng(x, y, out)
    torch.testing.assert_close(out.double(), brute_force(model, x, y, names).double(), rtol=1e-4, atol=1e-6)
    assert eng.checked
