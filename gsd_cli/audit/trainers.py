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
from .canaries import AuditedRun, likelihood_ratio, place_canaries, run_trials

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


def _check_arguments(canaries: int, steps: int, sampling_rate: float, model, data, insecure_seed: int | None) -> None:
    """Refuse an audit that cannot run, before any work."""
    from ..privacy.randomness import check_insecure_seed

    check_insecure_seed(insecure_seed)
    if canaries < 2:
        raise GSDError(f"--canaries must be at least 2 (got {canaries})")
    if steps < 1:
        raise GSDError(f"--steps must be at least 1 (got {steps})")
    if not 0 < sampling_rate <= 1:
        raise GSDError(f"--sampling-rate must be in (0, 1] (got {sampling_rate})")
    if (model is None) != (data is None):
        raise GSDError("give both the model and its data, or neither (the default Linear model on synthetic inputs)")


def _audited_model(cfg, canaries: int, spread: int, model, names, data, examples: int, classes: int) -> AuditedRun:
    """The audited model (default: :func:`audit_model`, wide enough for the canaries), its trained
    parameters ``names`` (default: all) and its data (default: ``examples`` synthetic inputs)."""
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
    return AuditedRun(model, names, params, num_params, x_data, y_data)


def _anchor_grads(model_, x, y, names_):
    """GEP's anchor gradients (per example, on the CPU)."""
    from ..gradients import gradient_matrix

    return gradient_matrix(model_, [(x, y)], x.shape[0], names_, None, "vmap", "cpu", "none")


def _calibrate(run: AuditedRun, cfg, public_x, classes: int, sampling_rate: float, steps: int, bug: str | None, book) -> None:
    """Build the method at the sigma :func:`~gsd_cli.privacy.calibrate_noise` gives for (epsilon, delta,
    q, T), check its chain's noise is the accounted one (as ``gsd train``), book the run (``book``),
    inject ``bug`` and put the RGP tap in: fills in ``run``'s method, sigma, claim and chain."""
    from ..train.gep import Anchor, split_groups
    from ..train.methods import build_method
    from ..train.rgp import RGPReconstruct
    from ..train.transforms import Chain, chain_step_event

    model, names, params = run.model, run.names, run.params
    anchor = None
    if cfg.method == "gep":
        if public_x is None:
            public_x = _synthetic(max(cfg.k, 32), run.x_data.shape[1], classes, cfg.seed + 1)[0]
        sizes = [params[n].numel() for n in names]
        anchor = Anchor(public_x, classes, cfg.k, split_groups(names, sizes, None), cfg.power_iters, cfg.seed, _anchor_grads)
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
    run.method, run.sigma, run.claimed, run.claimed_releases = method, sigma, claimed, claimed_releases
    run.chain, run.transforms, run.tap = Chain(*transforms), transforms, tap


def _secrets(canaries: int, insecure_seed: int | None) -> tuple[np.ndarray, int]:
    """Secret randomness: who is in, and the training's seed (as gsd train draws its noise seed)."""
    from ..privacy.randomness import private_rng

    rng = private_rng("audit", insecure_seed)
    included = rng.random(canaries) < 0.5
    noise_seed = int(rng.integers(2**63)) if insecure_seed is not None else secrets.randbits(128)
    return included, noise_seed


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
    examples: :func:`gsd_cli.privacy.budget.audit_booking` books it in the privacy ledger).

    The stages: the audited run (:func:`_audited_model`, :func:`_calibrate`), the secret draws
    (:func:`_secrets`), the canaries (:func:`~.canaries.place_canaries`), the trials
    (:func:`~.canaries.run_trials`) and the bound (:func:`~.bound.audit_epsilon`)."""
    _check_arguments(canaries, steps, sampling_rate, model, data, insecure_seed)
    method_name = cfg.method + ("+rs" if cfg.sparsify else "")
    spread = TOPAGG_SPREAD if cfg.method == "topagg" else 1
    run = _audited_model(cfg, canaries, spread, model, names, data, examples, classes)
    _calibrate(run, cfg, public_x, classes, sampling_rate, steps, bug, book)
    included, noise_seed = _secrets(canaries, insecure_seed)
    can = place_canaries(cfg, run, canaries, spread, canary_norm)
    llr = likelihood_ratio(cfg, run, can, sampling_rate)
    scores = run_trials(run, can, included, noise_seed, steps=steps, sampling_rate=sampling_rate, llr=llr, chunk=chunk, lr=lr)
    eps, guesses, correct = audit_epsilon(scores.numpy(), included, cfg.delta, confidence)
    details = {"sigma": run.sigma, "steps": steps, "score": "sum" if llr is None else "log-likelihood ratio", "sampling_rate": sampling_rate, "examples": run.n_data, "canary_norm": can.norm,
               "bug": bug, "parameters": run.num_params, "canary_width": can.width, "canaries_in": int(included.sum()),
               "dp_randomness": "insecure seed" if insecure_seed is not None else "operating system"}
    return AuditResult(method_name, run.claimed, cfg.delta, eps, canaries, guesses, correct, confidence, details)


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
