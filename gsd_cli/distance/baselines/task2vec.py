"""A Task2Vec-style embedding distance (Achille et al., ICCV 2019): each dataset is embedded as the
diagonal of the Fisher information of the probe network on it,

    F_j = E_x E_{y ~ p_w(y|x)} [ (d log p_w(y|x) / d w_j)^2 ],

estimated from per-sample gradients (``gsd_cli.gradients.per_sample_gradients``, the same engine as
GSD) at the ranking's w0 with one label drawn per example from the model's own predictive
distribution (seeded), over the parameters the ranking selects. Two embeddings are compared by
Task2Vec's symmetric normalised cosine distance

    d(F_a, F_b) = 1 - cos(F_a / (F_a + F_b), F_b / (F_a + F_b)),

in [0, 1]. Labels of the datasets are not used (as Task2Vec's Fisher, which samples y from the model).
Differences from Task2Vec: no trained probe head, no robust (variational) Fisher.
Privately: possible in principle (per-coordinate sums of clipped squared gradients have bounded
sensitivity; the Gaussian mechanism would release them), not implemented.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ... import data as gdata
from ...gradients import per_sample_gradients
from ..registry import SideContext, register_distance
from .features import BaselineDistance, Features, engine_of


def fisher_diagonal(model, sample: gdata.Sample, common: dict, seed: int, chunk: int = 64) -> torch.Tensor:
    """Mean over the sample of the squared per-sample gradients of log p(y|x), y ~ p_w(.|x)."""
    dev = common.get("device") or torch.device("cpu")
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence([seed, 0x7A5C]).generate_state(1)[0]))
    total, n = None, 0
    for _, x in sample.batches(common["input_size"], common["channels"], common.get("chunk_size") or chunk, dev):
        with torch.no_grad():
            probs = torch.softmax(model(x).double(), -1).cpu()
        y = torch.multinomial(probs, 1, generator=gen)[:, 0].to(dev)
        G = per_sample_gradients(model, x, y, common.get("loss"), list(common["names"]), engine=common.get("engine", "auto"),
                                 device=dev, row_norm="none").double()
        part = G.pow(2).sum(0).cpu()
        total = part if total is None else total + part
        n += x.shape[0]
    return total / max(n, 1)


def task2vec_distance(Fa, Fb, eps: float = 1e-30) -> float:
    """Task2Vec's symmetric normalised cosine distance between two Fisher diagonals."""
    Fa, Fb = np.asarray(Fa, np.float64), np.asarray(Fb, np.float64)
    s = Fa + Fb + eps
    a, b = Fa / s, Fb / s
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + eps))
    return 1.0 - cos


@register_distance("task2vec")
class Task2Vec(BaselineDistance):
    """Task2Vec-style distance between diagonal Fisher embeddings of the probe at w0."""

    reading = "Task2Vec-style distance: 1 - cosine of the normalised Fisher diagonals of the model at w0; lower is closer"
    privately = "not implemented (possible: Gaussian mechanism on clipped squared gradients)"

    def side(self, ctx: SideContext, sample: gdata.Sample, seed: int) -> Features:
        t0 = time.perf_counter()
        F = fisher_diagonal(ctx.model, sample, ctx.common, seed)
        return Features(sample.source.name, F[None, :], torch.empty(0), len(sample), time.perf_counter() - t0, engine_of(ctx))

    def value(self, private: Features, public: Features) -> float:
        return task2vec_distance(private.V[0].numpy(), public.V[0].numpy())
