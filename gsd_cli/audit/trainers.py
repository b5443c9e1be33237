"""One-run white-box audit of the private trainers (Steinke, Nasr, Jagielski 2023, Sec. 6 "white-box":
gradient canaries), through the trainers' own code path.

m canaries, each included in the private set independently with probability 1/2 (secret). T steps of
the method as ``gsd train`` runs them: :func:`gsd_cli.train.loop.private_randomness` draws each
step's Poisson subsample (over the real examples and the included canaries) and its noise
generator, :func:`gsd_cli.train.loop.private_step` runs the method's transform
:class:`~gsd_cli.train.transforms.Chain` from :func:`gsd_cli.train.methods.build_method` with the
sigma :func:`gsd_cli.privacy.calibrate_noise` gives for (epsilon, delta, q, T). A canary's
per-example gradient row enters the per-example parts *before the chain* (so before every clip,
projection and mask): the per-sample function handed to ``private_step`` returns real per-sample
gradients for real chunks and canary rows for canary chunks. A canary's score is the inner product
of the released updates, summed over the steps, with its direction; :mod:`.bound` turns the scores
into epsilon_emp.

The canary of each method (a row of the per-example parts the chain starts from):

* dpsgd, second-phase (stage 2 is DP-SGD from the stage-1 weights; stage 1 sees no private data, so
  it is left out): a Dirac gradient ``norm * e_j`` on its own coordinate j; norm > C, so the clip
  is what bounds it. Score: coordinate j of the release.
* gep: the same Dirac rows in parameter space. Each enters GEPProject, which splits it into its
  embedding B e_j and its residual e_j - B^T B e_j; both are clipped (S1, S2) and noised, and the
  released update w~ B + r~ is read at coordinate j, so the score carries the embedding release
  (through (B^T w~)_j) and the residual release. With k << p most of the canary is residual: the
  audit then sees essentially the residual release (multiplier sigma, not GEP's effective sigma/sqrt 2).
* rgp: a Dirac row in the *carrier* space (the per-example vector of dL, dR and the other
  parameters' gradients that RGP clips as one vector); the score is read on the noisy carrier sum,
  before the reconstruction (which is post-processing of it), by a tap put before RGPReconstruct.
* topagg: a Dirac row would be zeroed by NormTopK (one coordinate holds all the energy, more than K),
  so the canary is ``norm`` spread evenly over s = 10 coordinates of its own; NormTopK keeps the
  first floor(K s) of them and the score is the release along what it keeps (the auditor knows it).
* --sparsify: Dirac rows on coordinates the (public, data-independent) mask keeps.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..errors import GSDError
from ..privacy import calibrate_noise, epsilon_of, training_event
from .bound import AuditResult, audit_epsilon

BUGS = ("noise-halved", "noise-quartered", "no-clip", "gep-no-residual-noise", "noise-x0.9", "noise-x0.8", "noise-x0.7")
#: the factor of every noise std under each noise bug
NOISE_FACTORS = {"noise-halved": 0.5, "noise-quartered": 0.25, "noise-x0.9": 0.9, "noise-x0.8": 0.8, "noise-x0.7": 0.7}
TOPAGG_SPREAD = 10


class _Tap:
    """A transform that records the aggregated parts it sees (placed before RGPReconstruct)."""

    def __init__(self):
        self.seen = None

    def begin_step(self, ctx):
        pass

    def per_example(self, parts, ctx):
        return parts

    def aggregated(self, parts, ctx):
        self.seen = parts["grad"].detach().clone()
        return parts

    def releases(self):
        return []

    def norm_bounds(self, bounds):
        return bounds


def audit_model(p_needed: int, classes: int = 10) -> nn.Module:
    """The default audited model: one Linear layer with at least ``p_needed`` parameters."""
    d_in = max(4, math.ceil(p_needed / classes))
    return nn.Sequential(nn.Flatten(), nn.Linear(d_in, classes))


def inject_bug(chain, bug: str | None) -> None:
    """Break ``chain`` on purpose (the audit's teeth): scale every noise std by a factor
    (:data:`NOISE_FACTORS`: 0.9, 0.8, 0.7, halved, quartered), remove every clip, or drop GEP's
    residual noise."""
    from ..train.transforms import Clip, GaussianNoise

    if bug is None:
        return
    if bug not in BUGS:
        raise GSDError(f"unknown bug {bug!r}; use one of {', '.join(BUGS)}")
    hit = False
    for t in chain.transforms:
        if isinstance(t, GaussianNoise) and bug in NOISE_FACTORS:
            t.std *= NOISE_FACTORS[bug]
            hit = True
        elif isinstance(t, GaussianNoise) and bug == "gep-no-residual-noise" and t.part == "residual":
            t.std, hit = 0.0, True
        elif isinstance(t, Clip) and bug == "no-clip":
            t.max_norm, hit = math.inf, True
    if not hit:
        raise GSDError(f"bug {bug!r} does not apply to this method's chain")


def _synthetic(n: int, d_in: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d_in, generator=g), torch.randint(0, classes, (n,), generator=g)


def audit_training(
    cfg,
    *,
    canaries: int = 1000,
    steps: int = 1,
    sampling_rate: float = 1.0,
    examples: int = 64,
    model: nn.Module | None = None,
    names: list[str] | None = None,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
    public_x: torch.Tensor | None = None,
    canary_norm: float | None = None,
    insecure_seed: int | None = None,
    bug: str | None = None,
    confidence: float = 0.95,
    lr: float = 0.0,
    chunk: int = 512,
    classes: int = 10,
    book=None,
) -> AuditResult:
    """Audit ``cfg.method`` (a :class:`~gsd_cli.train.TrainConfig`: method, epsilon, delta, clip norms,
    GEP/RGP/TopAgg/--sparsify settings) with ``canaries`` gradient canaries over ``steps`` steps at
    Poisson rate ``sampling_rate``, beside ``examples`` real examples (``data``: (x, y); default
    synthetic inputs from ``cfg.seed``) of ``model`` (default :func:`audit_model`, trained parameters
    ``names``: all). ``lr``: SGD step on the released update between steps (0: weights fixed).
    ``bug``: one of :data:`BUGS`, injected after the noise is calibrated and checked (so the claim
    is the correct code's). Private randomness from the OS unless ``insecure_seed``. ``book(event,
    epsilon)``: called with the audited run's dp-accounting event before any step (real private
    examples: :func:`gsd_cli.privacy.budget.audit_booking` books it in the privacy ledger)."""
    from ..gradients import gradient_matrix
    from ..train.gep import Anchor, split_groups
    from ..train.loop import private_randomness, private_step
    from ..train.methods import build_method
    from ..train.rgp import RGPReconstruct
    from ..train.sparsify import RandomSparsify
    from ..train.transforms import Chain, StepContext, chain_step_event
    from ..privacy.randomness import check_insecure_seed, private_rng

    check_insecure_seed(insecure_seed)
    if canaries < 2:
        raise GSDError(f"--canaries must be at least 2 (got {canaries})")
    if steps < 1:
        raise GSDError(f"--steps must be at least 1 (got {steps})")
    if not 0 < sampling_rate <= 1:
        raise GSDError(f"--sampling-rate must be in (0, 1] (got {sampling_rate})")
    method_name = cfg.method + ("+rs" if cfg.sparsify else "")
    if (model is None) != (data is None):
        raise GSDError("give both the model and its data, or neither (the default Linear model on synthetic inputs)")
    spread = TOPAGG_SPREAD if cfg.method == "topagg" else 1
    if model is None:
        need = canaries * spread
        if cfg.sparsify:
            need = math.ceil(need / (1 - cfg.sparsify)) + 8
        if cfg.method == "rgp":  # the carrier vector r (p_out + d_in) + p_out must hold the canaries
            need = classes * (math.ceil(canaries / max(1, cfg.rgp_rank)) + 1)
        model = audit_model(need, classes)
    names = list(names) if names is not None else [n for n, p in model.named_parameters() if p.requires_grad]
    params = dict(model.named_parameters())
    num_params = sum(params[n].numel() for n in names)
    if data is None:
        d_in = model[1].in_features
        data = _synthetic(examples, d_in, classes, cfg.seed)
    x_data, y_data = data
    n_data = x_data.shape[0]

    def grads(model_, x, y, names_):
        return gradient_matrix(model_, [(x, y)], x.shape[0], names_, None, "vmap", "cpu", "none")

    anchor = None
    if cfg.method == "gep":
        if public_x is None:
            public_x = _synthetic(max(cfg.k, 32), x_data.shape[1], classes, cfg.seed + 1)[0]
        sizes = [params[n].numel() for n in names]
        anchor = Anchor(public_x, classes, cfg.k, split_groups(names, sizes, None), cfg.power_iters, cfg.seed, grads)
    probe = build_method(cfg, 1.0, anchor, model=model, names=names)
    sigma = calibrate_noise(probe.step_event, cfg.epsilon, cfg.delta, sampling_rate, steps, cfg.accountant)
    method = build_method(cfg, sigma, anchor, model=model, names=names, rgp=probe.details.get("rgp_state"))
    chain_step_event(method.chain)  # the same check as gsd train: the chain's noise is the accounted one
    claimed = epsilon_of(training_event(method.step_event(sigma), sampling_rate, steps), cfg.delta, cfg.accountant)
    if book is not None:  # before any step: refused past the data set's budget
        book(training_event(method.step_event(sigma), sampling_rate, steps), claimed)
    claimed_releases = method.chain.releases()  # what the auditor knows: the claimed noise, not a bug's
    inject_bug(method.chain, bug)
    tap = None
    transforms = list(method.chain.transforms)
    if cfg.method == "rgp":
        tap = _Tap()
        at = next(i for i, t in enumerate(transforms) if isinstance(t, RGPReconstruct))
        transforms.insert(at, tap)
    chain = Chain(*transforms)

    # secret randomness: who is in, and the training's seed (as gsd train draws its noise seed)
    rng = private_rng("audit", insecure_seed)
    included = rng.random(canaries) < 0.5
    noise_seed = int(rng.integers(2**63)) if insecure_seed is not None else secrets.randbits(128)

    # canary directions: coordinates of the per-example parts the chain starts from
    width = method.per_sample.width if method.per_sample is not None else num_params
    ctx0 = StepContext(step=0, model=model, names=names, epoch=0, epochs=1)
    allowed = np.arange(width)
    if cfg.sparsify:
        rs = next(t for t in transforms if isinstance(t, RandomSparsify))
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

    def canary_rows(ids: torch.Tensor) -> torch.Tensor:
        rows = torch.zeros(ids.shape[0], width)
        rows.scatter_(1, coords[ids], value)
        return rows

    def per_sample(model_, names_, x, y, ctx):
        if y is None:  # a chunk of canaries (x: their ids)
            return {"grad": canary_rows(x)}
        if method.per_sample is not None:
            return method.per_sample(model_, names_, x, y, ctx)
        return {"grad": gradient_matrix(model_, [(x, y)], x.shape[0], names_, None, "vmap", ctx.device, "none")}

    per_sample.width = width
    # the score: with q = 1 the sum over steps of the release along each canary's direction (the
    # likelihood-ratio statistic of a Gaussian); with q < 1 and one released part, the sum over steps
    # of the per-step log-likelihood ratio of the subsampled Gaussian, from the *claimed* noise std and
    # the canary's clipped signal (what a white-box auditor knows; a bug changes neither)
    n_kept = float(weights[0].sum())
    rel = claimed_releases
    llr = None
    if sampling_rate < 1 and len(rel) == 1 and rel[0].part == "grad":
        llr = (min(canary_norm, cfg.clip) * math.sqrt(n_kept / spread), rel[0].std)
    in_ids = np.flatnonzero(included)
    scores = torch.zeros(canaries, dtype=torch.float64)
    info: dict = {}
    for step in range(steps):
        idx, gen = private_randomness(n_data + canaries, sampling_rate, noise_seed, step)
        data_idx = idx[idx < n_data]
        can_idx = np.intersect1d(idx[idx >= n_data] - n_data, in_ids)  # only the included canaries exist
        ctx = StepContext(step=step, model=model, names=names, generator=gen, info=info, epoch=0, epochs=1)

        def batches(data_idx=data_idx, can_idx=can_idx):
            for s in range(0, len(data_idx), chunk):
                part = torch.as_tensor(data_idx[s : s + chunk])
                yield x_data[part], y_data[part]
            for s in range(0, len(can_idx), chunk):
                yield torch.as_tensor(can_idx[s : s + chunk]), None

        release = private_step(chain, model, names, batches(), num_params, ctx, per_sample)
        seen = tap.seen if tap is not None else release["grad"]
        obs = (seen.double()[coords] * weights.double()).sum(1) / math.sqrt(n_kept)  # release along the unit direction
        if llr is None:
            scores += obs
        else:  # log-likelihood ratio of "took part with probability q" against "absent", per step
            signal, tau = llr
            scores += torch.log1p(sampling_rate * torch.expm1(((signal * obs - signal**2 / 2) / tau**2).clamp(max=60.0)))
        if lr:
            with torch.no_grad():
                col = 0
                for n in names:
                    p = params[n]
                    p -= lr * release["grad"][col : col + p.numel()].view_as(p).to(p.dtype) / max(1.0, sampling_rate * (n_data + canaries / 2))
                    col += p.numel()
    eps, guesses, correct = audit_epsilon(scores.numpy(), included, cfg.delta, confidence)
    details = {"sigma": sigma, "steps": steps, "score": "sum" if llr is None else "log-likelihood ratio", "sampling_rate": sampling_rate, "examples": n_data, "canary_norm": canary_norm,
               "bug": bug, "parameters": num_params, "canary_width": width, "canaries_in": int(included.sum()),
               "dp_randomness": "insecure seed" if insecure_seed is not None else "operating system"}
    return AuditResult(method_name, claimed, cfg.delta, eps, canaries, guesses, correct, confidence, details)


def audit_config(method: str, epsilon: float, delta: float, **settings):
    """A :class:`~gsd_cli.train.TrainConfig` for an audit of ``method`` (``dpsgd+rs``/``gep+rs``: with
    ``sparsify``, default 0.5)."""
    from ..train import TrainConfig

    sparsify = settings.pop("sparsify", None)
    if method.endswith("+rs"):
        method = method[:-3]
        sparsify = 0.5 if sparsify in (None, 0) else sparsify
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    bad = sorted(set(settings) - fields)
    if bad:
        raise GSDError(f"unknown training setting(s) {', '.join(bad)}")
    return TrainConfig(method=method, epsilon=epsilon, delta=delta, sparsify=sparsify or 0.0, **settings)


Audit = Callable[..., AuditResult]
