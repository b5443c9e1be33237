"""Regression tests for library bugs found while writing the suite (16-bit PNGs, unused parameters
with the hooks engine, model mode restored on bad input, --chunk-size 0); all fixed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image

from gsd_cli import GSDError, per_sample_gradients
from gsd_cli.data import resolve


def test_bug_16bit_grey_png_is_saturated_by_folder_source(tmp_path):
    """files._pil_to_array converts any mode other than L/RGB with img.convert("RGB"). For a 16-bit
    greyscale PNG (mode "I;16", usual for X-rays) Pillow clips every value above 255 to 255, so
    the image arrives as almost all 1.0 (here 99.6% of the pixels) and as three channels."""
    (tmp_path / "xray" / "normal").mkdir(parents=True)
    ramp = np.linspace(0, 65535, 32 * 32).reshape(32, 32).astype(np.uint16)
    Image.fromarray(ramp).save(tmp_path / "xray" / "normal" / "a.png")
    assert Image.open(tmp_path / "xray" / "normal" / "a.png").mode == "I;16"
    img = resolve(f"folder:{tmp_path / 'xray'}").images([0])[0]
    grey = img if img.ndim == 2 else img[..., 0]
    assert np.mean(grey >= 1.0) < 0.01, "the 16-bit image is saturated"
    np.testing.assert_allclose(grey, ramp / 65535.0, atol=1 / 255 + 1e-6)


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
