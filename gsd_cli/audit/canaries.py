"""The one-run trainer audit's canaries and trials (:func:`~gsd_cli.audit.trainers.audit_training`'s
second and third stages): where each canary lies in the per-example parts the chain starts from, the
per-sample function that hands the chain real gradients and canary rows, and the ``steps`` private
steps that score every canary. The first stage (the audited model, its data and its calibrated chain)
is :mod:`.trainers`; it fills in an :class:`AuditedRun`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import GSDError


@dataclasses.dataclass
class AuditedRun:
    """The audited run as the trials see it: the model and its trained parameters ``names``, the real
    examples (``x_data``, ``y_data``), the method built at the calibrated ``sigma`` (``claimed``: its
    epsilon; ``claimed_releases``: its chain's releases before any bug), and ``chain``, the chain that
    runs (with the bug, and for RGP the ``tap`` before the reconstruction; ``transforms``: its parts)."""

    model: nn.Module
    names: list[str]
    params: dict
    num_params: int
    x_data: torch.Tensor
    y_data: torch.Tensor
    method: Any = None
    sigma: float = 0.0
    claimed: float = 0.0
    claimed_releases: list = dataclasses.field(default_factory=list)
    chain: Any = None
    transforms: list = dataclasses.field(default_factory=list)
    tap: Any = None

    @property
    def n_data(self) -> int:
        return self.x_data.shape[0]


@dataclasses.dataclass
class Canaries:
    """Each canary's coordinates (``coords``: canaries x ``spread``) in per-example rows of ``width``,
    the value on each (``value``: ``norm`` spread evenly), and ``weights``, the part of a row the
    score reads (TopAgg: what NormTopK keeps; otherwise all of it)."""

    width: int
    coords: torch.Tensor
    norm: float
    value: float
    weights: torch.Tensor
    spread: int

    @property
    def n_kept(self) -> float:
        return float(self.weights[0].sum())

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The per-example rows of the canaries ``ids``."""
        rows = torch.zeros(ids.shape[0], self.width)
        rows.scatter_(1, self.coords[ids], self.value)
        return rows


def place_canaries(cfg, run: AuditedRun, canaries: int, spread: int, canary_norm: float | None) -> Canaries:
    """Canary directions: coordinates of the per-example parts the chain starts from (--sparsify: on
    coordinates the public mask keeps); ``canary_norm`` (None: 10 times the largest clip norm)."""
    from ..train.sparsify import RandomSparsify
    from ..train.transforms import StepContext

    width = run.method.per_sample.width if run.method.per_sample is not None else run.num_params
    ctx0 = StepContext(step=0, model=run.model, names=run.names, epoch=0, epochs=1)
    allowed = np.arange(width)
    if cfg.sparsify:
        rs = next(t for t in run.transforms if isinstance(t, RandomSparsify))
        rs.begin_step(ctx0)
        allowed = np.flatnonzero(rs.mask(width).numpy() > 0)
    if canaries * spread > allowed.size:
        raise GSDError(f"{canaries} canaries need {canaries * spread} free coordinates; the model has {allowed.size}: "
                       "use fewer canaries or a larger model")
    coords = torch.as_tensor(allowed[: canaries * spread].reshape(canaries, spread))
    if canary_norm is None:
        bound = max([cfg.clip] + ([cfg.clip_embedding, cfg.clip_residual] if cfg.method == "gep" else []))
        canary_norm = 10.0 * bound
    value = canary_norm / math.sqrt(spread)
    weights = torch.ones(canaries, spread)
    if cfg.method == "topagg":  # the part NormTopK keeps of one canary row: what the score reads
        from ..train.topagg import norm_top_k

        kept = norm_top_k(torch.full((1, spread), value), cfg.topk_fraction)[0] != 0
        if not bool(kept.any()):
            raise GSDError(f"--topk-fraction {cfg.topk_fraction} keeps nothing of a canary spread over {spread} coordinates")
        weights = weights * kept.float()
    return Canaries(width, coords, canary_norm, value, weights, spread)


def canary_per_sample(run: AuditedRun, can: Canaries):
    """The per-sample function handed to ``private_step``: canary rows for a chunk of canaries (x: their
    ids, y: None), the method's (or plain) per-sample gradients for a chunk of real examples."""
    from ..gradients import gradient_matrix

    method = run.method

    def per_sample(model_, names_, x, y, ctx):
        if y is None:  # a chunk of canaries (x: their ids)
            return {"grad": can.rows(x)}
        if method.per_sample is not None:
            return method.per_sample(model_, names_, x, y, ctx)
        return {"grad": gradient_matrix(model_, [(x, y)], x.shape[0], names_, None, "vmap", ctx.device, "none")}

    per_sample.width = can.width
    return per_sample


def likelihood_ratio(cfg, run: AuditedRun, can: Canaries, sampling_rate: float) -> tuple[float, float] | None:
    """The score: with q = 1 the sum over steps of the release along each canary's direction (the
    likelihood-ratio statistic of a Gaussian; None here); with q < 1 and one released part, the sum over
    steps of the per-step log-likelihood ratio of the subsampled Gaussian, from the *claimed* noise std
    and the canary's clipped signal (what a white-box auditor knows; a bug changes neither): (signal,
    std) here."""
    n_kept = can.n_kept
    rel = run.claimed_releases
    llr = None
    if sampling_rate < 1 and len(rel) == 1 and rel[0].part == "grad":
        llr = (min(can.norm, cfg.clip) * math.sqrt(n_kept / can.spread), rel[0].std)
    return llr


def _batches(run: AuditedRun, data_idx, can_idx, chunk: int):
    """One step's chunks: the sampled real examples (x, y), then the sampled included canaries (ids, None)."""
    for s in range(0, len(data_idx), chunk):
        part = torch.as_tensor(data_idx[s : s + chunk])
        yield run.x_data[part], run.y_data[part]
    for s in range(0, len(can_idx), chunk):
        yield torch.as_tensor(can_idx[s : s + chunk]), None


def _sgd_step(run: AuditedRun, release: dict, lr: float, sampling_rate: float, canaries: int) -> None:
    """An SGD step of ``lr`` on the released update (``--lr``; 0: the weights stay fixed)."""
    with torch.no_grad():
        col = 0
        for n in run.names:
            p = run.params[n]
            p -= lr * release["grad"][col : col + p.numel()].view_as(p).to(p.dtype) / max(1.0, sampling_rate * (run.n_data + canaries / 2))
            col += p.numel()


def run_trials(run: AuditedRun, can: Canaries, included: np.ndarray, noise_seed: int, *, steps: int, sampling_rate: float,
               llr: tuple[float, float] | None, chunk: int, lr: float) -> torch.Tensor:
    """The ``steps`` private steps, as ``gsd train`` runs them (Poisson subsample over the real
    examples and the ``included`` canaries, noise from ``noise_seed``), and each canary's score
    (:func:`likelihood_ratio`: the release along its direction, or its log-likelihood ratio), summed."""
    from ..train.loop import private_randomness, private_step
    from ..train.transforms import StepContext

    canaries, n_data = included.size, run.n_data
    per_sample = canary_per_sample(run, can)
    in_ids = np.flatnonzero(included)
    scores = torch.zeros(canaries, dtype=torch.float64)
    info: dict = {}
    for step in range(steps):
        idx, gen = private_randomness(n_data + canaries, sampling_rate, noise_seed, step)
        data_idx = idx[idx < n_data]
        can_idx = np.intersect1d(idx[idx >= n_data] - n_data, in_ids)  # only the included canaries exist
        ctx = StepContext(step=step, model=run.model, names=run.names, generator=gen, info=info, epoch=0, epochs=1)
        release = private_step(run.chain, run.model, run.names, _batches(run, data_idx, can_idx, chunk), run.num_params, ctx,
                               per_sample)
        seen = run.tap.seen if run.tap is not None else release["grad"]
        obs = (seen.double()[can.coords] * can.weights.double()).sum(1) / math.sqrt(can.n_kept)  # release along the unit direction
        if llr is None:
            scores += obs
        else:  # log-likelihood ratio of "took part with probability q" against "absent", per step
            signal, tau = llr
            scores += torch.log1p(sampling_rate * torch.expm1(((signal * obs - signal**2 / 2) / tau**2).clamp(max=60.0)))
        if lr:
            _sgd_step(run, release, lr, sampling_rate, canaries)
    return scores
