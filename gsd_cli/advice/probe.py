"""Whether the second phase helps and from which candidate: the feature probe, measured before training.

What the second phase would give the private model, measured on private examples without noise.

The second phase (paper 004, Section 5.1, equation 13) pretrains the model on the public set's own
labels; stage 2 then fine-tunes it with DP-SGD on the private set. What stage 2 receives from stage 1
is a feature map. GSD compares gradient subspaces at the untrained model, which says nothing about
the public *labels* or the public set's size; on gsd's held-out benchmark (issue 42) GSD's order did
not predict the second phase's accuracy on realistic tasks. The probe scores exactly what the method
uses:

1. For each of ``repeats`` draws r: build the model that ``gsd train`` would start from (seed ``seed + r``)
   and draw ``examples`` private training examples (seed ``seed + r``; the private test part is never
   looked at).
2. The *reference*: a linear probe's accuracy on the untrained model's features (the input of its
   classification head), i.e. the starting point of DP-SGD without public data.
3. Each candidate: stage 1 exactly as ``gsd train --method second-phase`` runs it
   (:func:`gsd_cli.train.second_phase.run_second_phase`, the same settings), then the same probe on
   the pretrained model's features. The candidate's gain in that draw is the difference (paired: the
   same initial model and the same private examples).
4. The linear probe: ridge regression on one-hot labels over standardised features, fitted on one half
   of the draw and scored on the other, both ways (2-fold cross-fitting), with the penalty
   :data:`RIDGE` times the number of fitted examples, fixed before any benchmark run.

A candidate *helps the second phase* when its gain is above 0 with confidence: a one-sided paired
t-test over the repeats at the advice's ``ALPHA`` (:mod:`gsd_cli.advice.decide`). No threshold is
calibrated: the bar is the untrained model, measured in the same run.

The probe reads private data without noise: it is part of the non-private advice, like the non-private
ranking (``gsd train --auto-select`` without ``--select-epsilon``). A private selection
(``--select-epsilon``) does not run it (:func:`gsd_cli.advice.select.advised_selection`).
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import data as gdata
from ..defaults import ADVICE
from .decide import UNTRAINED

#: draws of the probe (of the initial model, the private examples and stage 1's shuffles): :data:`gsd_cli.defaults.ADVICE`
DRAWS = ADVICE.probe_draws
#: the ridge penalty per fitted example (features standardised); set before any benchmark run
RIDGE = 0.1


@dataclass
class ProbeResult:
    """Per repeat: the starting model's probe accuracy (``baseline``: the untrained model, or the base alone where the run
    starts from ``--weights``) and each candidate's gain over it; ``start`` names it (:func:`start_of`)."""

    baseline: list[float]
    gains: dict[str, list[float]]
    examples: int
    model: str
    stage1: dict = field(default_factory=dict)
    #: the candidates whose draws stopped early (their test was decided, :func:`gsd_cli.ranking.reference.can_still_pass`)
    #: and how many draws they had; the draws planned are ``repeats``
    stopped: dict = field(default_factory=dict)
    #: the draws planned (0: as many as ``baseline`` has); fewer are run when every candidate's test is decided
    planned: int = 0
    #: the contestant without a candidate, in words (:func:`start_of`)
    start: str = UNTRAINED

    @property
    def repeats(self) -> int:
        return self.planned or len(self.baseline)

    def draws(self, name: str) -> int:
        """The draws ``name`` had: :attr:`repeats`, fewer where its test was decided early (:attr:`stopped`)."""
        return len(self.gains[name])

    def mean_gain(self, name: str) -> float:
        return float(np.mean(self.gains[name]))

    def test(self, name: str, alpha: float) -> tuple[bool, float]:
        """(helps, p): the one-sided paired t-test of "mean gain > 0" over the repeats."""
        from ..ranking.reference import one_sided_p

        g = np.asarray(self.gains[name], dtype=np.float64)
        if len(g) < 2:
            return False, 1.0
        p = one_sided_p(g)
        return p < alpha and name not in self.stopped, p  # stopped: decided to fail over the planned draws

    def phrase(self, name: str, alpha: float) -> str:
        helps, p = self.test(name, alpha)
        gain = 100 * self.mean_gain(name)
        draws = self.draws(name)
        how = (f"{draws} repeats, one-sided paired t-test p = {p:.3g}{' <' if helps else ' >='} {alpha:g}" if name not in self.stopped else
               f"stopped after {draws} of {self.repeats} draws: no later draw could make the one-sided paired t-test pass at {alpha:g}")
        return (f"its pretrained features separate the private classes {abs(gain):.1f} points {'better' if gain >= 0 else 'worse'} "
                f"than those of {self.start} ({100 * float(np.mean(self.baseline[:draws])):.1f}%; linear probe, {how})")

    def to_dict(self) -> dict:
        return {"what": f"linear-probe accuracy of the features of {self.start} (baseline) and each candidate's gain after "
                        "the second phase's stage 1 (gsd_cli.advice.probe)", "start": self.start,
                "model": self.model, "examples": self.examples, "repeats": self.repeats, "ridge": RIDGE,
                "baseline": self.baseline, "gains": self.gains, "stage1": self.stage1, "stopped": self.stopped}


def start_of(settings) -> str:
    """The contestant that uses no candidate, in words: the base alone where the run starts from ``--weights`` (issue 61:
    the advice chooses among the candidates and the base alone; the probe's baseline is then the base's features, and
    stage 1 starts from the base), else the untrained model (DP-SGD from scratch)."""
    weights = getattr(settings, "weights", None)
    return f"the base alone (--weights {weights})" if weights else UNTRAINED


def linear_probe_accuracy(feats: torch.Tensor, labels: torch.Tensor, num_classes: int, seed: int) -> float:
    """2-fold cross-fitted accuracy of a ridge classifier (one-hot targets, standardised features,
    penalty :data:`RIDGE` per fitted example) on ``feats`` (n, d) with ``labels`` (n,)."""
    f = feats.detach().to(torch.float64).cpu()
    y = labels.detach().to(torch.int64).cpu()
    n = len(y)
    if n < 4:
        raise ValueError("the probe needs at least 4 examples")
    perm = torch.from_numpy(np.random.default_rng([seed, 0x9E0B]).permutation(n))
    folds = (perm[: n // 2], perm[n // 2:])
    correct = 0
    for fit, score in ((folds[0], folds[1]), (folds[1], folds[0])):
        mu, sd = f[fit].mean(0), f[fit].std(0) + 1e-6
        x = torch.cat([(f[fit] - mu) / sd, torch.ones(len(fit), 1, dtype=f.dtype)], 1)
        xs = torch.cat([(f[score] - mu) / sd, torch.ones(len(score), 1, dtype=f.dtype)], 1)
        target = torch.nn.functional.one_hot(y[fit], num_classes).to(f.dtype)
        a = x.T @ x + RIDGE * len(fit) * torch.eye(x.shape[1], dtype=f.dtype)
        w = torch.linalg.solve(a, x.T @ target)
        correct += int((torch.argmax(xs @ w, 1) == y[score]).sum())
    return correct / n


#: above this many bytes as float32, the probe keeps the private examples in float16 (2,000 RGB images at 224
#: are 1.2 GB as float32); each chunk goes to the model's device as float32
HOLD_FLOAT32 = 256 * 2**20


@torch.no_grad()
def head_features(model: torch.nn.Module, x: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """The input of the model's classification head (:func:`gsd_cli.models.weights.head_prefix`) for
    the images ``x`` (any float dtype, any device: each chunk is moved to the model's device as
    float32), in eval mode."""
    from ..models.weights import head_prefix

    head = model.get_submodule(head_prefix(model))
    seen: list[torch.Tensor] = []
    hook = head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach().flatten(1)))
    was = model.training
    model.eval()
    try:
        dev = next(model.parameters()).device
        for i in range(0, len(x), chunk):
            model(x[i: i + chunk].to(dev, torch.float32))
    finally:
        hook.remove()
        model.train(was)
    return torch.cat(seen).cpu()


class _Settings:
    """The settings :func:`run_second_phase` reads (a :class:`TrainConfig`'s stage-1 fields). ``probe_stage1``
    ``quick`` (the default): one learning rate (``--public-lr`` or the model's default), not the grid, at a third of
    the cost; ``same``: the run's stage 1 exactly, which the training that follows then reads from the stage-1 cache."""

    def __init__(self, base, public: str, seed: int):
        from ..train.second_phase import STAGE1_KEYS

        self._d = {k: getattr(base, k, None) for k in STAGE1_KEYS}
        self._d.update(public=public, seed=seed, private=str(getattr(base, "private", "private")))
        self._d["public_grid"] = (getattr(base, "probe_stage1", None) or "quick") == "same"
        for k, v in self._d.items():
            setattr(self, k, v)

    def to_dict(self) -> dict:
        return dict(self._d)


class _Named:
    def __init__(self, sources: dict):
        self.sources = sources

    def resolve(self, name: str):
        return self.sources[name]


def draw_model(settings, num_classes: int, seed: int, device) -> tuple:
    """The training model at a probe draw's initialisation (``seed``) on ``device``: ``(spec, model, trained names)``,
    as :func:`gsd_cli.models.peft.build_model` builds it from ``settings`` (a :class:`gsd_cli.train.TrainConfig`)."""
    from ..models.peft import build_model

    spec, model, names, _ = build_model(settings.model, num_classes, seed, weights=getattr(settings, "weights", None),
                                        peft=getattr(settings, "peft", None), params=getattr(settings, "params", None),
                                        batchnorm=getattr(settings, "batchnorm", "freeze") or "freeze")
    return spec, model.to(device), names


def stage1_of(model0, names: list, spec, settings, name: str, sources: dict, seed: int, private, device) -> tuple:
    """Stage 1 of the second phase on candidate ``name`` (of ``sources``, by name) from a copy of ``model0``, with
    ``settings``' stage-1 fields and ``seed``, for the label space ``private`` declares (its class count, names and
    whether it is multi-label: no example of it is read), read from the stage-1 cache where it was trained before
    (:mod:`gsd_cli.train.second_phase.stage1_cache`). Returns ``(model, record)``; ``record["reused"]``: read from the cache."""
    from ..timing import stage
    from ..train.second_phase import run_second_phase

    model = copy.deepcopy(model0)
    with tempfile.TemporaryDirectory() as tmp, stage("probe stage 1"):
        rec = run_second_phase(model, names, _Settings(settings, name, seed), spec, Path(tmp), device,
                               num_classes=int(private.num_classes), multilabel=bool(private.multilabel), catalog=_Named(sources),
                               private_classes=getattr(private, "classes", None), timed=None)
    return model, rec


def probe_second_phase(private, candidates: list, settings, *, examples: int = 2000, repeats: int = DRAWS, seed: int = 0,
                       device: str | torch.device | None = "auto", progress=None, stop_decided: bool = True) -> ProbeResult:
    """The feature probe (module docstring) of each of ``candidates`` (sources) for the second phase on
    ``private`` (the private *training* source), with the stage-1 and model settings of ``settings``
    (a :class:`gsd_cli.train.TrainConfig` or anything with its fields: ``model``, ``weights``, ``peft``,
    ``params``, ``batchnorm``, ``public_examples``, ``public_epochs``, ``public_lr``, ``public_batch_size``).

    ``stop_decided`` (issue 53, "spend repeats where they decide something"): a candidate whose test is decided
    after a draw, failing whatever the remaining draws give (:func:`gsd_cli.ranking.reference.can_still_pass`, a
    gain is a difference of accuracies: in [-1, 1]), gets no more stage-1 trainings (``ProbeResult.stopped``); the
    draws stop when no candidate is left. Each candidate's draws do not depend on the others', so the candidates
    that help with confidence, and their gains, are those of the full draws: the same decision. ``False``: every
    draw of every candidate (a benchmark that reads every candidate's mean gain)."""
    from ..ranking.reference import can_still_pass
    from ..timing import stage

    from ..gradients import resolve_device

    dev = resolve_device(device)
    named = {getattr(c, "name", str(c)): c for c in candidates}
    num_classes = int(private.num_classes)
    baseline: list[float] = []
    gains: dict[str, list[float]] = {n: [] for n in named}
    stage1: dict = {}
    stopped: dict[str, int] = {}
    total, done = repeats * (1 + len(named)), 0
    for r in range(repeats):
        if named and len(stopped) == len(named):  # every test decided: no draw left decides anything
            break
        s = int(seed) + r
        spec, model0, names = draw_model(settings, num_classes, s, dev)
        sample = gdata.draw(private, examples, s)
        parts = []
        for i in range(0, len(sample.indices), 256):  # decoded chunk by chunk, held on the CPU
            part = gdata.to_model_input(gdata.read_images(private, sample.indices[i: i + 256], spec.input_size), spec.input_size,
                                        spec.channels, "cpu")
            parts.append(part if len(sample) * part[0].numel() * 4 <= HOLD_FLOAT32 else part.half())
        x = torch.cat(parts)
        y = torch.from_numpy(np.asarray(sample.labels(), dtype=np.int64))
        with stage("probe fits"):
            base = linear_probe_accuracy(head_features(model0, x), y, num_classes, s)
        baseline.append(base)
        done += 1
        if progress:
            progress("probe", done, total)
        for name, src in named.items():
            if name in stopped:
                continue
            model, rec = stage1_of(model0, names, spec, settings, name, named, s, private, dev)
            stage1.setdefault(name, {"head": rec["head"], "public_examples": rec["public_examples"], "lr": rec["lr"]})
            with stage("probe fits"):
                gains[name].append(linear_probe_accuracy(head_features(model, x), y, num_classes, s) - base)
            if stop_decided and not can_still_pass(gains[name], repeats, ADVICE.alpha):
                stopped[name] = len(gains[name])
                total -= repeats - len(gains[name])  # its stage-1 trainings not run
            done += 1
            if progress:
                progress("probe", done, total)
        if named and len(stopped) == len(named):
            total = done  # the baselines of the draws not run
    return ProbeResult(baseline, gains, examples=min(int(examples), len(private)), model=str(settings.model), stage1=stage1,
                       stopped=stopped, planned=int(repeats), start=start_of(settings))
