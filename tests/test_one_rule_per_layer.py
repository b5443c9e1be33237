"""One per-sample rule per layer kind (issue 51): the ``layers`` engine and ghost clipping take their
per-example gradients of a Conv2d, a Linear and a frozen BatchNorm from the same functions
(``gsd_cli.gradients.layers.PER_SAMPLE_RULES``, filled by a decorator), a Conv2d's patches-or-kernel
choice is made in one place with one set of constants, and no second BatchNorm formula or Conv2d
threshold comes back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import gsd_cli
import gsd_cli.gradients.layers as L
from gsd_cli.gradients import _only_trainable, default_loss
from gsd_cli.gradients.layers import LayersEngine
from gsd_cli.train.clipsum import ClippedSum

ROOT = Path(gsd_cli.__file__).parent


def _functions():
    """(module path, function node) of every function in gsd_cli."""
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(ROOT).as_posix(), node


def _attrs_in_arithmetic(fn) -> set[str]:
    return {a.attr for b in ast.walk(fn) if isinstance(b, ast.BinOp) for a in ast.walk(b) if isinstance(a, ast.Attribute)}


def _calls(fn) -> set[str]:
    out = set()
    for c in ast.walk(fn):
        if isinstance(c, ast.Call):
            f = c.func
            out.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return out


def test_one_batchnorm_formula_in_the_package():
    """Arithmetic on a BatchNorm's running statistics (a per-sample BatchNorm rule) happens in one function."""
    found = sorted(f"{p}:{fn.name}" for p, fn in _functions() if _attrs_in_arithmetic(fn) & {"running_mean", "running_var"})
    assert found == ["gradients/layers.py:batchnorm_per_sample"], found


def test_one_conv2d_dispatch_and_one_set_of_thresholds():
    """Only ``conv2d_per_sample`` picks between the patches and the grouped kernel, only ``patches_fit``
    reads the thresholds, and only gradients/layers.py defines a threshold constant for it."""
    callers = sorted(f"{p}:{fn.name}" for p, fn in _functions() if _calls(fn) & {"conv2d_patches", "conv2d_grouped", "patches_fit"})
    assert callers == ["gradients/layers.py:conv2d_per_sample"], callers
    readers, constants = set(), set()
    for path in sorted(ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(t, ast.Name) and ("PATCHES" in t.id or "GROUPED" in t.id):
                        constants.add(f"{path.relative_to(ROOT).as_posix()}:{t.id}")
        for p, fn in [(path.relative_to(ROOT).as_posix(), f) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)]:
            if {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)} & {"PATCHES_MAX", "GROUPED_MIN_CHANNELS"}:
                readers.add(f"{p}:{fn.name}")
    assert constants == {"gradients/layers.py:PATCHES_MAX", "gradients/layers.py:GROUPED_MIN_CHANNELS"}, constants
    assert readers == {"gradients/layers.py:patches_fit"}, readers


def test_the_registry_holds_the_rules_and_refuses_a_second_one():
    assert L.own_rule(nn.Conv2d(2, 3, 3)) is L.conv2d_per_sample
    assert L.own_rule(nn.Conv2d(4, 4, 3, groups=2)) is L.conv2d_per_sample
    assert L.own_rule(nn.Conv2d(2, 3, 3, padding="same")) is None  # string padding: Opacus's or torch.func
    assert L.own_rule(nn.Linear(2, 3)) is L.linear_per_sample
    assert L.own_rule(nn.BatchNorm2d(3).eval()) is L.batchnorm_per_sample
    assert L.own_rule(nn.BatchNorm1d(3).eval()) is L.batchnorm_per_sample
    assert L.own_rule(nn.BatchNorm2d(3).train()) is None  # mixes the examples of a batch
    assert L.own_rule(nn.GroupNorm(1, 3)) is None and L._rule(nn.GroupNorm(1, 3)) is not None  # Opacus's sampler

    class Custom(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    assert L.own_rule(Custom(2, 3)) is None
    with pytest.raises(ValueError, match="already registered"):
        L.register_per_sample(nn.Conv2d, applies=lambda m: True)(lambda m, x, g: {})
    assert L.PER_SAMPLE_RULES[nn.Conv2d][1] is L.conv2d_per_sample


def test_the_patch_bound_is_one_constant(monkeypatch):
    """T kh kw C = PATCHES_MAX takes the patches, one more entry the grouped kernel; 16 channels the kernel."""
    picked = []
    monkeypatch.setattr(L, "conv2d_patches", lambda *a: picked.append("patches") or {})
    monkeypatch.setattr(L, "conv2d_grouped", lambda *a: picked.append("grouped") or {})
    monkeypatch.setattr(L, "PATCHES_MAX", 3 * 9 * 4 * 4)
    layer = nn.Conv2d(3, 2, 3)
    L.conv2d_per_sample(layer, torch.zeros(1, 3, 6, 6), torch.zeros(1, 2, 4, 4))  # 432 entries
    L.conv2d_per_sample(layer, torch.zeros(1, 3, 6, 7), torch.zeros(1, 2, 4, 5))  # 540
    L.conv2d_per_sample(nn.Conv2d(4, 4, 1, groups=2), torch.zeros(1, 4, 2, 2), torch.zeros(1, 4, 2, 2))  # groups
    assert picked == ["patches", "grouped", "grouped"]


class _Net(nn.Module):
    """Conv2d, grouped Conv2d, frozen BatchNorm2d and BatchNorm1d, Linear."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 6, 3, padding=1)
        self.b1 = nn.BatchNorm2d(6)
        self.c2 = nn.Conv2d(6, 6, 3, groups=3)
        self.fc = nn.Linear(6 * 4 * 4, 5)
        self.b2 = nn.BatchNorm1d(5)
        self.out = nn.Linear(5, 3)
        with torch.no_grad():
            for b in (self.b1, self.b2):
                b.running_mean.uniform_(-0.5, 0.5)
                b.running_var.uniform_(0.5, 2.0)
                b.weight.uniform_(0.5, 1.5)
        self.eval()

    def forward(self, x):
        h = torch.tanh(self.c2(torch.tanh(self.b1(self.c1(x)))))
        return self.out(torch.tanh(self.b2(self.fc(h.flatten(1)))))


def test_both_engines_call_the_same_registered_rules(brute_force, monkeypatch):
    """The layers engine and ghost clipping's materialised path go through PER_SAMPLE_RULES (a spy on
    each entry sees both), and agree with per-example autograd."""
    seen: dict[str, list] = {}
    for t, (applies, fn) in list(L.PER_SAMPLE_RULES.items()):
        def spy(layer, x, g, fn=fn, t=t):
            seen.setdefault(t.__name__, []).append(engine)
            return fn(layer, x, g)
        monkeypatch.setitem(L.PER_SAMPLE_RULES, t, (applies, spy))
    import gsd_cli.train.clipsum as cs

    monkeypatch.setattr(cs, "ghost_cheaper", lambda T, D, C: False)  # every layer materialised
    torch.manual_seed(0)
    model = _Net()
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 3, 6, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
    ref = brute_force(model, x, y, names).double()
    out = torch.empty(5, ref.shape[1])
    with _only_trainable(model, names):
        engine = "layers"
        LayersEngine(model, names, default_loss)(x, y, out)
        engine = "ghost"
        C = float(ref.norm(dim=1).median())
        s, sq = ClippedSum(model, names)(x, y, C)
    assert {k: sorted(set(v)) for k, v in seen.items()} == {k: ["ghost", "layers"] for k in ("Conv2d", "Linear", "_BatchNorm")}
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sq, ref.pow(2).sum(1), rtol=1e-5, atol=0)
    w = (C / ref.norm(dim=1)).clamp(max=1.0)
    torch.testing.assert_close(s.double(), (w.view(-1, 1) * ref).sum(0), rtol=1e-5, atol=1e-6)


def test_conv_path_choice_gives_the_same_gradients():
    """Patches and the grouped kernel agree on a layer under the bound, so moving the bound only moves time."""
    torch.manual_seed(0)
    layer = nn.Conv2d(3, 4, 5, stride=2, padding=2)
    x = torch.randn(3, 3, 20, 20, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    g = torch.randn(3, 4, 10, 10, dtype=torch.float64)
    layer = layer.double()
    a, b = L.conv2d_patches(layer, x, g), L.conv2d_grouped(layer, x, g)
    for p in (layer.weight, layer.bias):
        torch.testing.assert_close(a[p], b[p], rtol=1e-12, atol=1e-12)
