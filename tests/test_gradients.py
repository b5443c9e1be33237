"""Per-sample gradients against a brute-force per-example autograd loop, for both engines."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from gsd_cli import GSDError, ModelError, per_sample_gradients, select_parameters
from gsd_cli.gradients import default_loss
from probes import get_model_spec


class AllLayers(nn.Module):
    """Every layer type the probes use: Conv2d (with and without bias), GroupNorm (affine and
    not), ReLU, tanh, max- and average-pooling, Linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, stride=2)
        self.gn1 = nn.GroupNorm(2, 6)
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(6, 8, 3, padding=1, bias=False)
        self.gn2 = nn.GroupNorm(4, 8, affine=False)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.gn1(self.conv1(x))))
        x = self.avg(torch.tanh(self.gn2(self.conv2(x))))
        return self.fc(x.flatten(1))


def brute_force(model, x, y, names):
    params = dict(model.named_parameters())
    rows = []
    for i in range(x.shape[0]):
        loss = default_loss(model(x[i : i + 1]), y[i : i + 1]).sum()
        grads = torch.autograd.grad(loss, [params[n] for n in names])
        rows.append(torch.cat([g.reshape(-1) for g in grads]))
    return torch.stack(rows)


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    return torch.randn(13, 3, 12, 12, generator=g), torch.randint(0, 5, (13,), generator=g)


@pytest.mark.parametrize("engine", ["vmap", "hooks", "auto"])
def test_all_layers_match_brute_force(batch, engine):
    torch.manual_seed(0)
    model = AllLayers()
    x, y = batch
    names = [n for n, _ in model.named_parameters()]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    G = per_sample_gradients(model, x, y, chunk_size=5, engine=engine, device="cpu")
    ref = brute_force(model, x, y, names)
    assert G.shape == ref.shape == (13, sum(p.numel() for p in model.parameters()))
    assert torch.allclose(G, ref, atol=1e-5, rtol=1e-4)
    for n, p in model.named_parameters():
        assert p.requires_grad and torch.equal(p, before[n]) and p.grad is None


@pytest.mark.parametrize("engine", ["vmap", "hooks"])
def test_selected_parameters_and_unit_rows(batch, engine):
    torch.manual_seed(1)
    model = AllLayers()
    x, y = batch
    G = per_sample_gradients(model, x, y, params=["fc.*", "conv2.weight"], engine=engine, device="cpu")
    ref = brute_force(model, x, y, ["conv2.weight", "fc.weight", "fc.bias"])  # named_parameters order
    assert torch.allclose(G, ref, atol=1e-5, rtol=1e-4)
    assert all(p.requires_grad for p in model.parameters())  # flags restored
    U = per_sample_gradients(model, x, y, params="fc.*", engine=engine, device="cpu", row_norm="unit")
    assert torch.allclose(U.norm(dim=1), torch.ones(13), atol=1e-6)


@pytest.mark.parametrize("name,size,ch", [("resnet20", 32, 3), ("fmnist-cnn", 28, 1)])
def test_probe_models_match_brute_force(name, size, ch):
    spec = get_model_spec(name)
    model = spec.build(num_classes=10, seed=3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, ch, size, size, generator=g), torch.randint(0, 10, (5,), generator=g)
    ref = brute_force(model, x, y, [n for n, _ in model.named_parameters()])
    for engine in ("vmap", "hooks"):
        G = per_sample_gradients(model, x, y, chunk_size=2, engine=engine, device="cpu")
        assert torch.allclose(G, ref, atol=1e-5, rtol=1e-4), engine


def test_probe_network_shape_and_size():
    model = get_model_spec("probe").build(num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 30202  # paper 004: "around 30,000"
    assert model(torch.zeros(1, 3, 224, 224)).shape == (1, 10)


def test_multilabel_targets_use_bce(batch):
    model = AllLayers()
    x, _ = batch
    y = (torch.rand(13, 5, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    G = per_sample_gradients(model, x, y, params="fc.bias", device="cpu")
    # d/d bias of sum_j BCE(z_j, y_j) = sigmoid(z) - y
    expected = torch.sigmoid(model(x)) - y
    assert torch.allclose(G, expected.detach(), atol=1e-6)


def test_bad_selection_and_shapes():
    model = AllLayers()
    with pytest.raises(ModelError, match="matches no parameter"):
        select_parameters(model, ["classifier.*"])
    assert select_parameters(model, "fc.*,conv1.bias") == ["conv1.bias", "fc.weight", "fc.bias"]
    with pytest.raises(GSDError):
        per_sample_gradients(model, torch.zeros(3, 3, 12, 12), torch.zeros(2, dtype=torch.long))
    with pytest.raises(GSDError, match="engine"):
        per_sample_gradients(model, torch.zeros(3, 3, 12, 12), torch.zeros(3, dtype=torch.long), engine="jax")
