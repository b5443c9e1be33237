"""Per-sample gradients (both engines) against a brute-force per-example autograd loop; the probe
networks; regressions of the hooks engine and of the argument checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from gsd_cli import GSDError, ModelError, per_sample_gradients, select_parameters
from probes import get_model_spec

ENGINES = ["vmap", "hooks", "layers"]


def assert_rows_close(G, ref):
    assert G.shape == ref.shape
    assert G.dtype == torch.float32
    scale = float(ref.abs().max())
    assert scale > 0
    torch.testing.assert_close(G, ref, rtol=1e-4, atol=1e-5 * scale)


def snapshot(model):
    return {n: (p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()}


def assert_untouched(model, before):
    for n, p in model.named_parameters():
        value, flag = before[n]
        assert p.requires_grad == flag, f"requires_grad of {n} changed"
        assert torch.equal(p.detach(), value), f"value of {n} changed"
        assert p.grad is None, f"{n}.grad was left set"


def no_hooks_left(model):
    for mod in model.modules():
        assert not mod._forward_hooks and not mod._forward_pre_hooks, type(mod).__name__
        assert not mod._backward_hooks and not getattr(mod, "_backward_pre_hooks", {}), type(mod).__name__


@pytest.mark.parametrize("engine", ENGINES)
def test_all_layer_types_match_brute_force(engine, make_all_layers, small_batch, brute_force):
    model = make_all_layers(seed=0)
    x, y = small_batch
    names = [n for n, _ in model.named_parameters()]
    ref = brute_force(model, x, y, names)
    before = snapshot(model)
    G = per_sample_gradients(model, x, y, chunk_size=5, engine=engine, device="cpu")  # 13 = 5 + 5 + 3
    assert G.shape == (13, sum(p.numel() for p in model.parameters()))
    assert_rows_close(G, ref)
    assert_untouched(model, before)
    no_hooks_left(model)
    # every parameter's block is really there (not, e.g., a GroupNorm block of zeros)
    col = 0
    for n, p in model.named_parameters():
        assert G[:, col : col + p.numel()].abs().max() > 0, n
        col += p.numel()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_chunk_size_does_not_change_rows(engine, chunk_size, make_all_layers, small_batch, brute_force):
    model = make_all_layers(seed=1)
    x, y = small_batch
    ref = brute_force(model, x, y, [n for n, _ in model.named_parameters()])
    G = per_sample_gradients(model, x, y, chunk_size=chunk_size, engine=engine, device="cpu")
    assert_rows_close(G, ref)


@pytest.mark.parametrize("engine", ENGINES)
def test_frozen_flags_and_eval_mode_are_restored(engine, make_all_layers, small_batch, brute_force):
    model = make_all_layers(seed=2)
    model.conv1.bias.requires_grad_(False)
    model.fc1.weight.requires_grad_(False)
    model.eval()
    x, y = small_batch
    before = snapshot(model)
    G = per_sample_gradients(model, x, y, chunk_size=5, engine=engine, device="cpu")
    # default selection: every *trainable* parameter, in named_parameters order
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert "conv1.bias" not in names and "fc1.weight" not in names
    assert G.shape == (13, sum(dict(model.named_parameters())[n].numel() for n in names))
    assert_rows_close(G, brute_force(model, x, y, names))
    assert_untouched(model, before)
    assert model.training is False


@pytest.mark.parametrize("engine", ENGINES)
def test_params_selection_columns(engine, make_all_layers, small_batch, brute_force):
    model = make_all_layers(seed=3)
    x, y = small_batch
    before = snapshot(model)
    G = per_sample_gradients(model, x, y, params=["fc.*"], chunk_size=5, engine=engine, device="cpu")
    assert G.shape == (13, 10 * 4 + 4)
    assert_rows_close(G, brute_force(model, x, y, ["fc.weight", "fc.bias"]))
    # the columns follow named_parameters order, not the order of the patterns
    G2 = per_sample_gradients(model, x, y, params=["fc.bias", "gn1.*", "conv2.weight"], chunk_size=5, engine=engine, device="cpu")
    order = ["gn1.weight", "gn1.bias", "conv2.weight", "fc.bias"]
    assert select_parameters(model, ["fc.bias", "gn1.*", "conv2.weight"]) == order
    assert_rows_close(G2, brute_force(model, x, y, order))
    # a comma-separated string works the same
    G3 = per_sample_gradients(model, x, y, params="fc.bias,gn1.*,conv2.weight", chunk_size=5, engine=engine, device="cpu")
    torch.testing.assert_close(G3, G2)
    assert_untouched(model, before)


@pytest.mark.parametrize("engine", ENGINES)
def test_unit_rows(engine, make_all_layers, small_batch):
    model = make_all_layers(seed=4)
    x, y = small_batch
    raw = per_sample_gradients(model, x, y, chunk_size=5, engine=engine, device="cpu")
    U = per_sample_gradients(model, x, y, chunk_size=5, engine=engine, device="cpu", row_norm="unit")
    torch.testing.assert_close(U.norm(dim=1), torch.ones(13), rtol=0, atol=1e-6)
    torch.testing.assert_close(U, raw / raw.norm(dim=1, keepdim=True), rtol=1e-5, atol=1e-7)
    assert not torch.allclose(raw.norm(dim=1), torch.ones(13), atol=1e-3)  # the raw rows are not unit
    Ufc = per_sample_gradients(model, x, y, params=["fc.*"], chunk_size=5, engine=engine, device="cpu", row_norm="unit")
    torch.testing.assert_close(Ufc.norm(dim=1), torch.ones(13), rtol=0, atol=1e-6)


def test_engines_agree_and_hooks_leave_the_model_usable(make_all_layers, small_batch, brute_force):
    """Opacus' hooks must be gone after the call: vmap on the same model afterwards still works."""
    model = make_all_layers(seed=5)
    x, y = small_batch
    ref = brute_force(model, x, y, [n for n, _ in model.named_parameters()])
    before = snapshot(model)
    H = per_sample_gradients(model, x, y, chunk_size=5, engine="hooks", device="cpu")
    V = per_sample_gradients(model, x, y, chunk_size=5, engine="vmap", device="cpu")
    A = per_sample_gradients(model, x, y, chunk_size=5, engine="auto", device="cpu")
    for G in (H, V, A):
        assert_rows_close(G, ref)
    assert_untouched(model, before)
    no_hooks_left(model)
    out = model(x)
    assert out.shape == (13, 4) and torch.isfinite(out).all()


@pytest.mark.parametrize("engine", ENGINES)
def test_resnet20_matches_brute_force(engine, brute_force):
    model = get_model_spec("resnet20").build(num_classes=10, seed=3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 3, 32, 32, generator=g), torch.randint(0, 10, (6,), generator=g)
    names = [n for n, _ in model.named_parameters()]
    ref = brute_force(model, x, y, names)
    before = snapshot(model)
    G = per_sample_gradients(model, x, y, chunk_size=4, engine=engine, device="cpu")
    assert G.shape == (6, sum(p.numel() for p in model.parameters()))
    assert_rows_close(G, ref)
    assert_untouched(model, before)
    no_hooks_left(model)


@pytest.mark.parametrize("engine", ENGINES)
def test_fmnist_cnn_relu_and_tanh_match_brute_force(engine, brute_force):
    """The registered probe (ReLU) and the GEP code's tanh variant."""
    from probes import fmnist_cnn

    torch.manual_seed(7)
    tanh = fmnist_cnn(num_classes=10, activation="tanh")
    relu = get_model_spec("fmnist-cnn").build(num_classes=10, seed=3)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(7, 1, 28, 28, generator=g), torch.randint(0, 10, (7,), generator=g)
    for model in (relu, tanh):
        ref = brute_force(model, x, y, [n for n, _ in model.named_parameters()])
        assert_rows_close(per_sample_gradients(model, x, y, chunk_size=3, engine=engine, device="cpu"), ref)


def test_custom_loss_is_used(make_all_layers, small_batch, brute_force):
    model = make_all_layers(seed=6)
    x, y = small_batch

    def loss(logits, target):  # per-example squared error against a one-hot target (up to a constant)
        return (logits**2).sum(-1) - 2 * logits.gather(1, target[:, None]).squeeze(1)

    names = ["fc.weight", "fc.bias"]
    ref = brute_force(model, x, y, names, loss)
    for engine in ENGINES:
        G = per_sample_gradients(model, x, y, loss=loss, params="fc.*", chunk_size=5, engine=engine, device="cpu")
        assert_rows_close(G, ref)


def test_multilabel_targets_use_bce(make_all_layers, small_batch):
    model = make_all_layers(num_classes=5)
    x, _ = small_batch
    y = (torch.rand(13, 5, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    G = per_sample_gradients(model, x, y, params="fc.bias", device="cpu")
    # d/d bias of sum_j BCE(z_j, y_j) = sigmoid(z) - y
    expected = torch.sigmoid(model(x)) - y
    assert torch.allclose(G, expected.detach(), atol=1e-6)


def test_probe_network_shape_and_size():
    model = get_model_spec("probe").build(num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 30202  # paper 004: "around 30,000"
    assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 10)


def test_user_errors(make_all_layers):
    model = make_all_layers()
    x, y = torch.zeros(3, 3, 12, 12), torch.zeros(3, dtype=torch.long)
    with pytest.raises(ModelError, match="matches no parameter"):
        per_sample_gradients(model, x, y, params=["classifier.*"], device="cpu")
    with pytest.raises(ModelError, match="matches no parameter"):
        select_parameters(model, ["classifier.*"])
    assert select_parameters(model, "fc.*,conv1.bias") == ["conv1.bias", "fc.weight", "fc.bias"]
    with pytest.raises(GSDError):
        per_sample_gradients(model, x, y[:2], device="cpu")
    with pytest.raises(GSDError, match="engine"):
        per_sample_gradients(model, x, y, engine="jax", device="cpu")
    with pytest.raises(GSDError, match="row-norm"):
        per_sample_gradients(model, x, y, row_norm="l2", device="cpu")


# ------------------------------------------------------------------------------ regressions (fixed)


class _UnusedHead(nn.Module):
    """A trainable parameter that the forward pass does not use (an auxiliary head, say)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)
        self.aux = nn.Linear(5, 2)

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("engine", ["hooks", "auto"])
def test_bug_hooks_engine_crashes_on_an_unused_parameter(engine):
    """vmap gives zero columns for a parameter the loss does not depend on; the hooks engine (and
    therefore engine="auto", which runs hooks on the first chunk) dies in gradients._scatter with
    TypeError: 'NoneType' object is not subscriptable (p.grad_sample is None), a raw traceback
    rather than a result or a GSDError."""
    torch.manual_seed(0)
    model = _UnusedHead()
    x, y = torch.randn(7, 5), torch.randint(0, 3, (7,))
    ref = per_sample_gradients(model, x, y, chunk_size=3, engine="vmap", device="cpu")
    assert ref.shape == (7, 18 + 12) and torch.count_nonzero(ref[:, 18:]) == 0
    G = per_sample_gradients(model, x, y, chunk_size=3, engine=engine, device="cpu")
    torch.testing.assert_close(G, ref, rtol=1e-5, atol=1e-6)


def test_bug_bad_engine_name_leaves_model_in_train_mode():
    """gradients.gradient_matrix calls model.train() *before* validating ``engine`` and outside the
    try/finally that restores the mode, so a user error flips an eval-mode model to train mode."""
    model = nn.Sequential(nn.Linear(5, 3), nn.Dropout(0.5))
    model.eval()
    with pytest.raises(GSDError, match="engine"):
        per_sample_gradients(model, torch.randn(4, 5), torch.zeros(4, dtype=torch.long), engine="jax", device="cpu")
    assert model.training is False


def test_bug_chunk_size_zero_is_silently_replaced_by_the_default():
    """``cs = chunk_size or default_chunk_size(...)`` turns 0 into the default, so the
    "--chunk-size must be at least 1" check only ever sees negative numbers: `gsd rank
    --chunk-size 0` runs instead of failing like `--chunk-size -1` does."""
    model = nn.Sequential(nn.Linear(5, 3))
    x, y = torch.randn(4, 5), torch.zeros(4, dtype=torch.long)
    with pytest.raises(GSDError, match="chunk-size"):
        per_sample_gradients(model, x, y, chunk_size=-1, device="cpu")
    with pytest.raises(GSDError, match="chunk-size"):
        per_sample_gradients(model, x, y, chunk_size=0, device="cpu")
