"""The settings of a training run: :class:`TrainConfig`, their checks (:func:`validate`) and the
helpers that read them (:func:`parse_groups`, :func:`lr_at`).

Nothing here touches data or models; :mod:`gsd_cli.train.methods` turns the settings into a
trainer, :mod:`gsd_cli.train.loop` runs it.
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from pathlib import Path

from .. import data as gdata
from ..errors import GSDError
from ..models.exact import POLICIES
from ..privacy import check_delta, check_epsilon
from ..privacy.randomness import check_insecure_seed, check_seed

METHODS = ("dpsgd", "gep", "rgp", "topagg", "second-phase")
SPARSIFIABLE = ("dpsgd", "gep")  # --sparsify (random sparsification, paper 003)
SCHEDULES = ("step", "constant")
#: GEP's anchors per basis recomputation by default (all of fewer public examples, said nowhere: that is the default)
DEFAULT_ANCHOR_BATCH = 128

# Paper 000 splits ResNet20 into the input layer, the three stages and the output layer.
DEFAULT_GROUPS = {
    "resnet20": [["conv1.*", "gn1.*"], ["layer1.*"], ["layer2.*"], ["layer3.*"], ["fc.*"]],
}


@dataclass
class TrainConfig:
    """Every setting of a run (what ``--resume`` checks). See ``gsd train --help`` for each.

    Flat on purpose: a checkpoint stores the settings as one dict (:meth:`to_dict`) and ``--resume``
    compares them name by name. The fields are grouped by what they set, each method's own settings
    beside it."""

    # --- data: the private set, its parts, the public set ---
    private: str = gdata.DEFAULT_PRIVATE  # private dataset: trains on NAME:train, evaluates on NAME:test
    private_test: str | None = None  # test set of the evaluation (None: the private dataset's test part)
    classes: str | None = None  # the private set's classes (a count or names) where its source declares none
    catalog: str | None = None  # TOML catalogue whose datasets resolve by name (None: built-in names only)
    public: str | None = None  # public dataset: GEP's anchors, the second phase's stage 1 (unused by the others)
    public_examples: int | None = None  # public examples drawn (None: the method's default, :func:`public_count`): GEP's anchors, stage 1's set
    public_distance: float | None = None  # distance of ``public`` in the ranking that chose it (recorded only)

    # --- model and trainable parameters ---
    model: str = "fmnist-cnn"  # model to train: a registry name (gsd models list), timm:NAME, PATH.py:FACTORY or an nn.Module (gsd_cli.models.spec)
    params: list[str] | None = None  # glob patterns of the parameters to train (None: all)
    weights: str | None = None  # initial weights (--weights: safetensors or a weights-only state dict)
    peft: str | None = None  # parameter-efficient subset to train (--peft: preset or patterns, gsd_cli.models.peft)
    batchnorm: str = "refuse"  # BatchNorm layers: refuse, freeze or groupnorm (gsd_cli.models.exact)

    # --- optimisation: SGD on Poisson-subsampled steps ---
    epochs: int = 20  # epochs; one epoch is round(N / batch_size) steps
    batch_size: int = 250  # expected batch size: every step samples each example with probability q = batch_size / size
    lr: float = 0.1  # SGD learning rate
    momentum: float = 0.9  # SGD momentum
    weight_decay: float = 1e-4  # SGD weight decay
    lr_schedule: str = "step"  # one of SCHEDULES (:func:`lr_at`)
    seed: int = 0  # initial weights, public anchors and their labels, sparsification masks (not the private randomness)
    physical_batch: int | None = None  # examples per per-sample-gradient chunk (None: by device)
    # what sets q and the step count (gsd_cli.train.size): a declared size or rate (public), else a DP estimate of N
    expected_size: int | None = None  # declared private set size N0: q = batch_size / N0 (public)
    sampling_rate: float | None = None  # declared sampling rate q (public); steps per epoch round(1 / q)
    size_epsilon: float | None = None  # epsilon of the Laplace estimate of N when neither is declared (None: 2% of epsilon)
    max_steps: int = 100_000  # the most steps the run may plan (epochs x steps per epoch); a guard, not part of the mechanism

    # --- privacy: the method and its guarantee ---
    method: str = "gep"  # one of METHODS
    epsilon: float = 2.0  # target epsilon; sigma is calibrated so the final epsilon is never above it
    delta: float = 1e-5  # target delta
    accountant: str = "rdp"  # dp-accounting's "rdp" or "pld"
    clip: float = 1.0  # L2 clip norm C of each per-sample gradient (every method but GEP)
    clip_engine: str = "auto"  # DP-SGD's clipped sums: auto, ghost (ghost norms + book-keeping) or materialise (gsd_cli.train.clipsum)
    insecure_seed: int | None = None  # private sampling and noise from this seed: NOT DP (experiments only)
    deterministic_noise: bool = False  # deprecated: insecure_seed = seed

    # --- GEP (paper 000) ---
    k: int = 32  # anchor subspace dimension (shared by the groups by sqrt of their size); GEP's defaults: issue 33's benchmark (docs/validity.md)
    groups: str = "auto"  # parameter groups (:func:`parse_groups`)
    power_iters: int = 1  # power iterations per step (also RGP's K)
    clip_embedding: float = 1.0  # clip norm S1 of the embedding
    clip_residual: float = 0.5  # clip norm S2 of the residual (S1/2: issue 33's benchmark; paper 000's S1/5 lost 7-12 points there)
    residual: bool = True  # release the residual (GEP) or drop it (B-GEP)
    anchor_every: int = 4  # recompute the anchor subspace every N steps and at each epoch's start (1: every step, paper 000)
    anchor_warm: bool = True  # start each recomputation's power iteration from the previous basis (cold at epoch starts)
    anchor_batch: int | None = DEFAULT_ANCHOR_BATCH  # anchors per recomputation (at least k), drawn from the public_examples (None or 0: all)

    # --- RGP (paper 001) ---
    rgp_rank: int = 4  # rank r of the gradient carriers of each Linear/Conv2d weight
    rgp_warmup: int = 20  # warm-up steps whose carriers decompose the weight itself

    # --- TopAgg (paper 002) ---
    topk_fraction: float = 0.7  # K in (0, 1]: NormTopK keeps the largest coordinates up to K ||g||^2

    # --- random sparsification (paper 003; dpsgd and gep) ---
    sparsify: float = 0.0  # final rate R in [0, 1) of the coordinates dropped (0: off)

    # --- second phase (paper 004): stage 1 on public data (gsd_cli.models.peft, gsd_cli.train.second_phase) ---
    public_epochs: int = 20  # most epochs of stage 1 per learning rate (it stops early on its validation split)
    public_lr: float | None = None  # Adam learning rate of stage 1 (None: chosen on validation from a grid around the model's default)
    public_batch_size: int = 64  # minibatch size of stage 1
    public_val: float = 0.1  # fraction of stage 1's public examples held out for validation (0: none, one lr, every epoch)
    public_patience: int = 3  # stage 1 stops this many epochs after its best validation accuracy (0: never early)
    public_augment: str = "auto"  # stage 1's augmentation of its training batches (gsd_cli.train.second_phase.augment.AUGMENTS)
    probe_stage1: str = "quick"  # the feature probes' stage 1: quick (one lr) or same (the run's; gsd_cli.advice.probe)

    def to_dict(self) -> dict:
        """The settings as JSON values; a source object given as a dataset (a Python API user's
        ``from_torch_dataset(...)``) is recorded by its name."""
        named = {f.name: getattr(self, f.name).name for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), gdata.ImageSource)}
        if not isinstance(self.model, str):  # an nn.Module or factory of the Python API: its label (and digest)
            from ..models.spec import model_label

            named["model"] = model_label(self.model)
        return {**dataclasses.asdict(dataclasses.replace(self, **dict.fromkeys(named))), **named}

    @property
    def private_seed(self) -> int | None:
        """The seed of the private randomness, when the user made it reproducible (not DP); None: secret."""
        if self.insecure_seed is not None:
            return int(self.insecure_seed)
        return int(self.seed) if self.deterministic_noise else None


# Settings whose default changed after runs were saved without them: a checkpoint that lacks one was
# made with this value, so --resume goes on with it (not with today's default).
SAVED_BEFORE = {"anchor_every": 1, "anchor_warm": False, "anchor_batch": None,  # 0.x runs: paper 000's basis at every step, from all anchors
                "public_val": 0.0, "public_patience": 0, "public_augment": "none"}  # stage 1 before its validation split
#: the feature probes' stage 1 (gsd_cli.advice.probe._Settings): one lr, or the run's own
PROBE_STAGE1 = ("quick", "same")
#: GEP's anchors when ``public_examples`` is None
ANCHOR_EXAMPLES = 2000


def public_count(cfg: "TrainConfig") -> int:
    """The public examples ``cfg``'s method draws (``gdata.draw`` takes at most the set's size): ``--public-examples``
    where given, else :data:`ANCHOR_EXAMPLES` GEP anchors or all of stage 1's set up to
    :data:`gsd_cli.train.second_phase.stage1_fit.STAGE1_CAP` (the second phase)."""
    from .second_phase.stage1_fit import STAGE1_CAP

    if cfg.public_examples is not None:
        return int(cfg.public_examples)
    return STAGE1_CAP if cfg.method == "second-phase" else ANCHOR_EXAMPLES


#: how the clipped sums are computed and how far the run may plan, not what is released (the update
#: equals the per-example path's to float rounding, tested): a resumed run may change these
COMPUTE_ONLY = frozenset({"clip_engine", "physical_batch", "max_steps", "probe_stage1"})  # probe_stage1: the advice's, before the run


def check_resume_settings(cfg: "TrainConfig", saved: dict, out) -> None:
    """Refuse ``--resume`` with settings other than the run's own (but :data:`COMPUTE_ONLY`); a setting
    added after the run started has its default (or its :data:`SAVED_BEFORE` value) there."""
    defaults = {**TrainConfig().to_dict(), **SAVED_BEFORE}
    diff = sorted(k for k, v in cfg.to_dict().items() if k not in COMPUTE_ONLY and saved.get(k, defaults.get(k)) != v)
    if diff:
        shown = ", ".join(f"{k}: run has {saved.get(k, defaults.get(k))!r}, asked {getattr(cfg, k)!r}" for k in diff[:4])
        raise GSDError(f"--resume {out}: settings differ from the checkpoint's ({shown}); resume with the run's own settings")


def parse_groups(spec: str, model: str) -> list[list[str]] | None:
    """``auto`` (the paper's split for resnet20, one group otherwise), ``none`` (one group), or
    groups separated by ``;`` each a comma-separated list of glob patterns."""
    if spec == "auto":
        return DEFAULT_GROUPS.get(model)
    if spec in ("none", ""):
        return None
    groups = [[p.strip() for p in g.split(",") if p.strip()] for g in spec.split(";")]
    if any(not g for g in groups):
        raise GSDError(f"--groups {spec!r} has an empty group; separate groups by ';' and patterns by ','")
    return groups


def lr_at(cfg: TrainConfig, epoch: int) -> float:
    """``step``: divided by 10 at the middle of training (paper 000, Sec. 5); ``constant``."""
    if cfg.lr_schedule == "step" and epoch >= cfg.epochs // 2 and cfg.epochs > 1:
        return cfg.lr * 0.1
    return cfg.lr


def check_anchor_every(every) -> None:
    """``--anchor-every`` must be a whole number >= 1 (1: the paper's basis at every step)."""
    if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
        raise GSDError(f"--anchor-every must be a whole number of steps, at least 1 (got {every!r}); "
                       "1 recomputes the GEP anchor subspace at every step")


def check_anchor_batch(batch) -> None:
    """``--anchor-batch`` must be None or 0 (all anchors) or a whole number >= 1."""
    if batch is None:
        return
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 0:
        raise GSDError(f"--anchor-batch must be a whole number of anchors (got {batch!r}); "
                       "0 uses all --public-examples at each recomputation, as paper 000")


#: the settings only some methods read (gsd_cli.train.methods, gep.anchor_for, second_phase); the others ignore them
METHOD_SETTINGS = {
    "k": ("gep",), "groups": ("gep",), "clip_embedding": ("gep",), "clip_residual": ("gep",), "residual": ("gep",),
    "anchor_every": ("gep",), "anchor_warm": ("gep",), "anchor_batch": ("gep",), "power_iters": ("gep", "rgp"),
    "public_examples": ("gep", "second-phase"), "rgp_rank": ("rgp",), "rgp_warmup": ("rgp",), "topk_fraction": ("topagg",),
    "public_epochs": ("second-phase",), "public_lr": ("second-phase",), "public_batch_size": ("second-phase",),
    "public_val": ("second-phase",), "public_patience": ("second-phase",), "public_augment": ("second-phase",),
    "clip": ("dpsgd", "rgp", "topagg", "second-phase"),
}


def unused_settings(method: str, given) -> list[str]:
    """The names in ``given`` (settings the user set) that ``method`` does not read (:data:`METHOD_SETTINGS`)."""
    return [n for n in given if n in METHOD_SETTINGS and method not in METHOD_SETTINGS[n]]


def unused_note(method: str, names) -> str | None:
    """One line saying which of ``names`` --method ``method`` ignores, and whose settings they are; None if none."""
    names = unused_settings(method, names)
    if not names:
        return None
    opts = ", ".join(f"--{n.replace('_', '-')}" for n in names)
    owners = sorted({m for n in names for m in METHOD_SETTINGS[n]})
    return (f"{opts} {'is' if len(names) == 1 else 'are'} not used by --method {method} (settings of --method "
            f"{' or '.join(owners)}): ignored")


def changed_settings(cfg: TrainConfig) -> list[str]:
    """The method-specific settings of ``cfg`` that differ from their defaults (what a caller set)."""
    base = TrainConfig()
    return [n for n in METHOD_SETTINGS if getattr(cfg, n) != getattr(base, n)]


def validate(cfg: TrainConfig) -> None:
    """User errors in the settings, before any data is touched."""
    import dataclasses
    import math

    for f in dataclasses.fields(cfg):  # a NaN or infinite number passes every `x > 0` test below (or fails obscurely later)
        v = getattr(cfg, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise GSDError(f"--{f.name.replace('_', '-')} must be a finite number (got {v})")
    if cfg.method not in METHODS:
        raise GSDError(f"unknown --method {cfg.method!r}; use one of {', '.join(METHODS)}")
    from .clipsum import check_clip_engine

    check_clip_engine(cfg.clip_engine)
    if cfg.batchnorm not in POLICIES:
        raise GSDError(f"--batchnorm must be one of {', '.join(POLICIES)} (got {cfg.batchnorm!r})")
    check_epsilon(cfg.epsilon)
    check_delta(cfg.delta)
    check_seed("--seed", cfg.seed)
    check_insecure_seed(cfg.insecure_seed)
    if cfg.epochs < 1:
        raise GSDError(f"--epochs must be at least 1 (got {cfg.epochs})")
    if cfg.batch_size < 1:
        raise GSDError(f"--batch-size must be at least 1 (got {cfg.batch_size})")
    if not cfg.lr > 0:
        raise GSDError(f"--lr must be positive (got {cfg.lr})")
    if not 0 <= cfg.momentum < 1:
        raise GSDError(f"--momentum must be in [0, 1) (got {cfg.momentum})")
    if cfg.weight_decay < 0:
        raise GSDError(f"--weight-decay must be >= 0 (got {cfg.weight_decay})")
    if cfg.lr_schedule not in SCHEDULES:
        raise GSDError(f"unknown --lr-schedule {cfg.lr_schedule!r}; use one of {', '.join(SCHEDULES)}")
    for what, v in (("--clip", cfg.clip), ("--clip-embedding", cfg.clip_embedding), ("--clip-residual", cfg.clip_residual)):
        if not v > 0:
            raise GSDError(f"{what} must be positive (got {v})")
    from .size import check_size_settings

    check_size_settings(cfg.batch_size, cfg.expected_size, cfg.sampling_rate, cfg.size_epsilon, cfg.epsilon)
    from .size import check_max_steps, check_plan, declared_steps_per_epoch

    check_max_steps(cfg.max_steps)
    declared = declared_steps_per_epoch(cfg.batch_size, cfg.expected_size, cfg.sampling_rate)
    if declared is not None:  # a declared size or rate: the plan is known before any data is read
        check_plan(cfg.epochs, declared, cfg.max_steps, "--expected-size" if cfg.expected_size is not None else "--sampling-rate")
    if cfg.physical_batch is not None and cfg.physical_batch < 1:
        raise GSDError(f"--physical-batch must be at least 1 (got {cfg.physical_batch})")
    if cfg.sparsify and cfg.method not in SPARSIFIABLE:
        raise GSDError(f"--sparsify works with --method {' or '.join(SPARSIFIABLE)} (got --method {cfg.method})")
    if not 0 <= cfg.sparsify < 1:
        raise GSDError(f"--sparsify must be in [0, 1) (got {cfg.sparsify}); it is the final fraction of coordinates dropped")
    if not 0 < cfg.topk_fraction <= 1:
        raise GSDError(f"--topk-fraction must be in (0, 1] (got {cfg.topk_fraction})")
    if cfg.rgp_rank < 1 or cfg.rgp_warmup < 0:
        raise GSDError(f"--rgp-rank must be at least 1 and --rgp-warmup at least 0 (got {cfg.rgp_rank}, {cfg.rgp_warmup})")
    if cfg.method == "rgp" and cfg.power_iters < 1:
        raise GSDError("--power-iters must be at least 1")
    if cfg.method == "second-phase":
        if not cfg.public:
            raise GSDError("--method second-phase needs public data: --public NAME (or --auto-select with candidates)")
        if public_count(cfg) < 2:
            raise GSDError("--public-examples must be at least 2 for the second phase's stage 1")
    if cfg.method == "gep":
        if not cfg.public:
            raise GSDError("--method gep needs public data: --public NAME (or --auto-select with candidates)")
        if cfg.k < 1 or public_count(cfg) < 1 or cfg.power_iters < 1:
            raise GSDError("--k, --public-examples and --power-iters must be at least 1")
    check_anchor_every(cfg.anchor_every)
    check_anchor_batch(cfg.anchor_batch)
    _check_stage1(cfg)  # for any method: --method auto may train the second phase (checked as gep until decided)


def _check_stage1(cfg: TrainConfig) -> None:
    """The second phase's stage-1 settings and the feature probe's (one line each, exit 2)."""
    from .second_phase.augment import AUGMENTS

    if cfg.public_epochs < 1 or cfg.public_batch_size < 1:
        raise GSDError("--public-epochs and --public-batch-size must be at least 1")
    if cfg.public_lr is not None and not cfg.public_lr > 0:
        raise GSDError(f"--public-lr must be positive (got {cfg.public_lr})")
    if not 0 <= cfg.public_val <= 0.5:
        raise GSDError(f"--public-val must be in [0, 0.5] (got {cfg.public_val}): the fraction of stage 1's public examples "
                       "held out for validation (0: none)")
    if cfg.public_patience < 0:
        raise GSDError(f"--public-patience must be 0 (never stop early) or more epochs (got {cfg.public_patience})")
    if cfg.public_augment not in AUGMENTS:
        raise GSDError(f"unknown --public-augment {cfg.public_augment!r}; use one of {', '.join(AUGMENTS)}")
    if cfg.probe_stage1 not in PROBE_STAGE1:
        raise GSDError(f"--probe-stage1 must be one of {', '.join(PROBE_STAGE1)} (got {cfg.probe_stage1!r})")


def resumed_config(run: Path, given: dict) -> TrainConfig:
    """The settings of the interrupted run in folder ``run`` (its checkpoint's, or stage 1's before the first
    checkpoint; a run saved before a setting's default changed keeps its old value, :data:`SAVED_BEFORE`), with
    ``given`` (the settings typed again, e.g. another ``--clip-engine``) instead: the training checks them against the
    run's (:func:`check_resume_settings` refuses any that changes the mechanism). A folder with no run: one line."""
    from .checkpoint import load_meta, prepare_run_dir
    from .second_phase import run_settings

    prepare_run_dir(run, resume=True)  # "no gsd run in DIR: ..." before any setting is read
    saved = load_meta(run).get("settings", {}) if (run / "checkpoint.json").is_file() else run_settings(run)
    merged = {**SAVED_BEFORE, **saved, **given}
    return TrainConfig(**{k: v for k, v in merged.items() if k in TrainConfig.__dataclass_fields__})
