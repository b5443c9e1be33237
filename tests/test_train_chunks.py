"""The chunk of a ghost-engine DP-SGD step on a CPU (issue 45, gsd_cli.train.chunks): larger for a
model whose activations are small, the default otherwise, compute only (the same update)."""

from __future__ import annotations

import numpy as np
import torch

from gsd_cli.train import TrainConfig, train
from gsd_cli.train.chunks import MOST, activation_bytes, ghost_cpu_chunk
from probes import get_model_spec


def _built(name):
    spec = get_model_spec(name)
    model = spec.build(num_classes=10, seed=0)
    return model, (spec.channels, spec.input_size, spec.input_size), sum(p.numel() for p in model.parameters())


def test_activation_bytes_counts_the_leaf_outputs_of_one_example():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 5))
    # conv 4x8x8, relu 4x8x8, flatten 256, linear 5 floats
    assert activation_bytes(model, (1, 8, 8)) == 4 * (256 + 256 + 256 + 5)


def test_a_small_model_gets_a_larger_chunk_and_a_large_one_the_default():
    model, shape, p = _built("fmnist-cnn")
    assert ghost_cpu_chunk(model, shape, p, 64) == MOST
    model, shape, p = _built("resnet20")  # 3.5 MB of activations and gradients an example: the default
    assert ghost_cpu_chunk(model, shape, p, 64) == 64


def test_the_count_leaves_torchs_random_state_and_a_failing_forward_gives_the_default():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(16, 2))
    state = torch.get_rng_state()
    ghost_cpu_chunk(model, (1, 4, 4), 34, 64)
    assert torch.equal(state, torch.get_rng_state())  # the dropout drew from a forked state
    assert ghost_cpu_chunk(model, (1, 5, 5), 34, 64) == 64  # 25 inputs into a Linear of 16: the default


def test_the_default_chunk_gives_the_update_of_small_chunks(tiny, tmp_path):
    """The same run (its private randomness from --insecure-seed) with the chosen chunk and with chunks
    of 7: the same weights to float rounding, the same sigma and epsilon."""
    from safetensors.torch import load_file

    def run(pb, out):
        cfg = TrainConfig(private=tiny["private"], model="fmnist-cnn@16", method="dpsgd", epsilon=4.0, epochs=2, batch_size=30,
                          insecure_seed=3, physical_batch=pb, lr_schedule="constant")
        s = train(cfg, tmp_path / out)
        return s, load_file(str(tmp_path / out / "checkpoint.safetensors"))

    s1, w1 = run(None, "auto")
    s2, w2 = run(7, "small")
    assert (s1["sigma"], s1["epsilon"]) == (s2["sigma"], s2["epsilon"])
    for k in w2:
        if w2[k].is_floating_point():
            np.testing.assert_allclose(w1[k].numpy(), w2[k].numpy(), rtol=1e-4, atol=1e-6)
