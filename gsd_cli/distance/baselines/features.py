"""What the baseline metrics share: a sample's representation, the model's penultimate features,
and the :class:`BaselineDistance` base class (non-private, labelled so in every output).

Features. Every baseline looks at the ranking's model at its initial weights w0 (the same model and
seed as GSD, so the comparison is fair): the *input of its classification head* (the last
``nn.Linear``, :func:`gsd_cli.models.weights.head_prefix`), i.e. the penultimate activations: 144 numbers for
the probe network, 32 for fmnist-cnn. A random-weight network is a fixed random-feature map; it is
what the ranking has without training anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from ... import data as gdata
from ...errors import GSDError
from ..side import Subspace
from ..registry import Distance, SideContext

#: What every output of a non-private metric says (JSON "metric", "dp": false; the table's note).
NOT_PRIVATE = ("not differentially private: {name} reads the private data without noise; do not publish its "
               "output where the private data must stay private")


@dataclass
class Features(Subspace):
    """A sample's representation for a baseline metric. ``V`` holds the features (m x d, float64) or
    another vector (Task2Vec's Fisher diagonal), ``labels`` the sample's own labels (or None), and
    ``extra`` what a metric needs beyond them (LogME: the public-trained weights; the sample)."""

    labels: np.ndarray | None = None
    extra: dict = field(default_factory=dict)


def own_labels(sample: gdata.Sample) -> np.ndarray:
    """The sample's own single-label classes (baselines that use labels need them)."""
    if sample.source.multilabel:
        raise GSDError(f"{sample.source.name} is multi-label; this metric needs single-label classes (use --metric gsd)")
    return np.asarray(sample.labels(), dtype=np.int64)


def head_input_features(model: nn.Module, x_batches, device: torch.device) -> torch.Tensor:
    """The input of the model's classification head for every example of ``x_batches`` (an iterable
    of input tensors), stacked: m x d, float64, on the CPU."""
    from ...models.weights import head_prefix

    head = model.get_submodule(head_prefix(model))
    got: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda mod, inp, out: got.append(inp[0].detach().flatten(1).to("cpu", torch.float64)))
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            for x in x_batches:
                model(x.to(device))
    finally:
        hook.remove()
        model.train(was)
    return torch.cat(got)


def engine_of(ctx: SideContext) -> str:
    """The per-sample-gradient engine setting to record (the pipeline reuses the private side's)."""
    return str(ctx.common.get("engine") or "auto")


def sample_features(model: nn.Module, sample: gdata.Sample, common: dict, chunk: int = 256) -> torch.Tensor:
    """:func:`head_input_features` of a sample, read in chunks at the model's input size."""
    dev = common.get("device") or torch.device("cpu")
    xs = (x for _, x in sample.batches(common["input_size"], common["channels"], chunk, dev))
    return head_input_features(model, xs, dev)


class BaselineDistance(Distance):
    """A measure of dataset similarity that users would otherwise reach for, beside GSD. Not private:
    refused with ``--dp``, labelled ``"dp": false`` with its ``metric`` in every output. Its
    representations are not gradient subspaces, so the disk cache of public subspaces is not used."""

    private = False
    disk_cache = False
    #: how to read the value (one line, for the table)
    reading: str = "lower is closer"
    #: whether (and how) it could be computed under differential privacy
    privately: str = "no"

    def __init__(self, config) -> None:
        super().__init__(config)
        if config.privacy.dp:
            raise GSDError(f"--metric {self.name} is not differentially private and cannot run with --dp; "
                           f"drop --dp, or use --dp without --metric for a private ranking")

    def side(self, ctx: SideContext, sample: gdata.Sample, seed: int) -> Features:
        """The representation of one sample (private or public alike unless a metric says otherwise)."""
        t0 = time.perf_counter()
        feats = sample_features(ctx.model, sample, ctx.common)
        return Features(sample.source.name, feats, torch.empty(0), len(sample), time.perf_counter() - t0,
                        engine_of(ctx), labels=own_labels(sample))

    def private_side(self, ctx: SideContext, sample: gdata.Sample) -> Features:
        return self.side(ctx, sample, self.config.seed)

    def public_side(self, ctx: SideContext, sample: gdata.Sample, seed: int) -> Features:
        return self.side(ctx, sample, seed)

    def value(self, private: Features, public: Features) -> float:  # pragma: no cover - abstract in spirit
        raise NotImplementedError

    def compare(self, private: Features, public: Features) -> tuple[float, list[float]]:
        """``(value, [])``: no principal angles for a baseline."""
        return float(self.value(private, public)), []

    def memo_key(self) -> tuple:
        return (self.name,)

    def public_key(self) -> tuple:
        """What, beyond the shared settings, a public side depends on (its metric)."""
        return ("metric", self.name)

    def report(self, ctx: SideContext, rows: list) -> tuple[dict | None, list[str], bool]:
        return None, [NOT_PRIVATE.format(name=self.name)], False


def gaussian_fit(X: np.ndarray, ridge: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance (maximum likelihood, plus ``ridge`` times the mean variance on the
    diagonal, so that a set with fewer examples than dimensions still gives a definite matrix)."""
    X = np.asarray(X, dtype=np.float64)
    mu = X.mean(0)
    C = np.cov(X, rowvar=False, bias=True) if len(X) > 1 else np.zeros((X.shape[1], X.shape[1]))
    C = np.atleast_2d(C)
    C += ridge * max(float(np.trace(C)) / len(C), 1e-12) * np.eye(len(C))
    return mu, C
