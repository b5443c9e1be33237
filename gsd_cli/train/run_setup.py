"""The stages of a training run before its first step (:func:`gsd_cli.train.loop.train` runs them in order).

1. :func:`open_run`: the run folder, a resumed run's saved settings and selection, a DP selection's booking check;
2. :func:`read_private`: the private parts, their declared classes, the public rows and the private examples they
   hold, and the mechanism's size (q, T) from public inputs or a DP estimate, never from N itself;
3. :func:`build_mechanism`: the model (stage 1 of the second phase first), GEP's anchors, sigma, the method's chain,
   and the run's epsilon, confirmed by a second accountant;
4. :func:`start_state`: the optimiser, the private randomness (OS entropy, or a resumed run's), the ledger booking
   and the warnings, and the privacy block every checkpoint and the summary carry.

Each stage fills a :class:`Run`, the run's state between stages; the order of the side effects (the ledger
checked first, the booking before the first step, the folder created once the model is built) is the one the
module docstring of :mod:`gsd_cli.train.loop` states.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .. import data as gdata
from ..data.published import notes_of
from ..errors import GSDError, PrivateError
from ..gradients import default_chunk_size
from ..privacy import Ledger, calibrate_noise, confirmed_epsilon, effective_noise_multiplier, training_event
from ..privacy.randomness import randomness_statement
from . import checkpoint as ckpt
from .config import TrainConfig, check_resume_settings
from .gep import anchor_for
from .methods import build_method
from .overlap import public_rows
from .release import PrivateNote, composition, delta_notes
from .size import Info, check_plan, run_size
from .splits import private_parts
from .transforms import chain_step_event


@dataclass
class Run:
    """A training run's state between its stages (module docstring); ``world`` is its process group
    (:mod:`gsd_cli.train.distributed`), ``meta`` a resumed run's checkpoint metadata (None: a new run)."""

    cfg: TrainConfig
    world: Any
    out: Path
    resume: bool
    selection: dict | None
    meta: dict | None = None
    ledger: Ledger = field(default_factory=Ledger)
    selection_dp: bool = False
    t_start: float = 0.0
    dev: Any = None
    cat: Any = None
    train_src: Any = None
    test_src: Any = None
    n_train: int = 0
    private_notes: list = field(default_factory=list)
    public_notes: list = field(default_factory=list)
    pub_sample: Any = None
    left_out: Any = None
    size_booking: Any = None
    size: Any = None
    total_steps: int = 0
    spec: Any = None
    model: Any = None
    names: list = field(default_factory=list)
    model_info: dict = field(default_factory=dict)
    stage1: dict | None = None
    num_params: int = 0
    chunk: int = 0
    anchor: Any = None
    sigma: float = 0.0
    method: Any = None
    event: Any = None
    final_eps: float = 0.0
    opt: Any = None
    noise_seed: int = 0
    booking_nonce: str | None = None
    start_epoch: int = 0
    rows: list = field(default_factory=list)
    privacy_static: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    @property
    def q(self) -> float:
        return self.size.q

    @property
    def steps_per_epoch(self) -> int:
        return self.size.steps_per_epoch


def _same_event(a, b) -> bool:
    return abs(effective_noise_multiplier(a) - effective_noise_multiplier(b)) <= 1e-12 * max(1.0, effective_noise_multiplier(b))


def open_run(cfg: TrainConfig, out, resume: bool, selection: dict | None, world) -> Run:
    """Stage 1: the ledger usable, the run folder ready (created later), a resumed run's settings checked and its
    selection kept, and a selection's DP guarantee checked before any work (one without a proven one is refused)."""
    from ..models.spec import resolve_model
    from ..privacy.budget import ready_ledger  # the privacy ledger (gsd budget)

    world.from_main(lambda: ready_ledger() and None)  # before any work: the ledger this run books into is usable (exit 2 otherwise)
    out = world.from_main(lambda: ckpt.prepare_run_dir(Path(out), resume, create=False))  # created once the model
    # is built: a bad --peft, --weights or dataset leaves no empty folder behind
    meta = None
    if resume:
        from .second_phase import run_settings

        meta = world.from_main(lambda: ckpt.load_meta(out) if (out / ckpt.CKPT_META).is_file() else None)  # None: in stage 1
        saved = meta.get("settings", {}) if meta is not None else world.from_main(lambda: run_settings(out))
        check_resume_settings(cfg, saved, out)
        selection = meta.get("selection", selection) if meta is not None else selection
    run = Run(cfg, world, out, resume, selection, meta=meta)
    run.selection_dp = selection is not None and selection.get("reads_private") is False  # chosen from public facts alone
    if selection is not None and selection.get("privacy"):
        run.ledger.add_selection(selection["privacy"])  # refuses a selection with no proven guarantee, before any work
        run.selection_dp = bool(selection.get("dp", True))  # False: drawn with --insecure-seed
    run.t_start = time.perf_counter()
    run.dev = world.device
    resolve_model(cfg.model)  # a bad --model fails before any data is read
    return run


def read_private(run: Run) -> None:
    """Stage 2: the private parts and what the mechanism's size is set from (module docstring)."""
    from ..privacy.budget import book_size_estimate
    from ..ranking.catalog import load_catalog

    cfg, world = run.cfg, run.world
    run.cat = load_catalog(cfg.catalog) if cfg.catalog else None
    train_src, test_src = private_parts(cfg.private, cfg.private_test, run.cat, classes=cfg.classes)  # a --private-test's classes by name
    gdata.require_declared_classes(train_src)  # the model's output size must not be read off the private labels
    n_train = len(train_src)
    if n_train < 1:  # an empty set: a documented private output (DESIGN.md, docs/train.md), on a private: line
        raise PrivateError(f"{train_src.name} has no examples; private training needs data")
    # Declared classes only: a refusal that read the private labels (every example in one class) would
    # make the run's happening at all depend on the private data outside the mechanism.
    if not train_src.multilabel and train_src.num_classes < 2:
        raise GSDError(f"{train_src.name}: a one-class set (one declared class); a classifier needs at least 2 classes "
                       "(--classes N; as a public candidate of gsd rank it is fine)")
    run.train_src, run.test_src, run.n_train = train_src, test_src, n_train
    # private facts (the exact N, the private set's missing files): told after the booking, as PrivateNote
    run.private_notes = notes_of(train_src) + ([f"--delta {cfg.delta:g} is at or above 1/N = {1 / n_train:.3g} for the N = {n_train} private "
                                                "training examples: delta should be well below 1/N"] if cfg.delta >= 1 / n_train else [])
    # the public examples the method uses and the private examples they hold, left out (overlap.py), before any booking
    run.pub_sample, run.left_out, overlap_notes = public_rows(cfg, train_src, test_src, run.cat, world)
    run.private_notes += overlap_notes  # how many private examples the public set holds: private, told after the booking
    # q and T from public inputs or a DP estimate of N, never from N itself (gsd_cli.train.size)
    run.size_booking = world.from_main(lambda: book_size_estimate(cfg, train_src, run.meta))  # the DP size estimate is booked before it is drawn
    run.size = world.from_main(lambda: run_size(cfg, n_train, run.meta))
    run.total_steps = check_plan(cfg.epochs, run.steps_per_epoch, cfg.max_steps, run.size.how)  # refused above --max-steps, before any booking
    run.public_notes = delta_notes(cfg.delta, run.size, cfg.batch_size)  # on the size that sets the mechanism, never N (release.py)


def build_mechanism(run: Run, progress=None, notify: Callable | None = None) -> None:
    """Stage 3: the model, stage 1 of the second phase, GEP's anchors, sigma and the method (module docstring)."""
    from ..models.peft import build_model

    cfg, world, dev, train_src = run.cfg, run.world, run.dev, run.train_src
    train_epsilon = cfg.epsilon - run.size.epsilon  # basic composition with the size estimate (size.py)
    spec, model, names, run.model_info = build_model(cfg.model, train_src.num_classes, cfg.seed, weights=cfg.weights, peft=cfg.peft,
                                                     params=cfg.params, batchnorm=cfg.batchnorm)
    model = model.to(dev)
    if world.is_main:  # the only process that writes: a folder of private files, 0700 when gsd owns it
        ckpt.make_run_dir(run.out)
    if cfg.method == "second-phase" and world.is_main:  # stage 1 on process 0, its weights to the others
        from .second_phase import run_second_phase

        run.stage1 = run_second_phase(model, names, cfg, spec, run.out, dev, num_classes=train_src.num_classes,
                                      multilabel=train_src.multilabel, catalog=run.cat, progress=progress,
                                      private_classes=getattr(train_src, "classes", None))
        if notify:  # what stage 1 chose: public (it reads public data only)
            notify(Info(run.stage1["line"]))
    world.broadcast_module(model)
    num_params = sum(dict(model.named_parameters())[n].numel() for n in names)
    chunk = cfg.physical_batch or default_chunk_size(dev, num_params)

    anchor = None
    if cfg.method == "gep":  # public anchors; reusing their basis (--anchor-every, --anchor-warm) costs no privacy (gep.py)
        anchor = anchor_for(cfg, run.pub_sample.tensor(spec.input_size, spec.channels, dev), model, names,
                            train_src.num_classes, train_src.multilabel, chunk, dev)
        run.public_notes += anchor.notes  # a --k or --anchor-batch GEP cannot take as given (public numbers)

    # sigma: the smallest noise multiplier meeting (epsilon, delta) over all T steps
    probe_method = build_method(cfg, 1.0, anchor, model=model, names=names)
    q, total_steps = run.q, run.total_steps
    sigma = world.from_main(lambda: calibrate_noise(probe_method.step_event, train_epsilon, cfg.delta, q, total_steps, cfg.accountant))
    method = build_method(cfg, sigma, anchor, model=model, names=names, rgp=probe_method.details.get("rgp_state"))
    if method.clip_sum is not None and cfg.physical_batch is None and dev.type == "cpu":  # ghost sums: chunks by activations
        from .chunks import ghost_cpu_chunk

        chunk = ghost_cpu_chunk(model, (spec.channels, spec.input_size, spec.input_size), num_params, chunk)
    if method.clip_sum is not None:  # the paths are timed on a chunk of public size, not the first Poisson chunk's
        method.clip_sum.tune_examples = min(chunk, cfg.batch_size)
        if run.meta is not None and isinstance(run.meta.get("clip_paths"), dict):  # the paths the run measured: the same bits on resume
            method.clip_sum.fixed_paths = run.meta["clip_paths"]
    declared = chain_step_event(method.chain)
    if not _same_event(declared, method.step_event(sigma)):
        raise GSDError("internal: the method's noise does not match its accounted event; refusing to train")
    run.event = training_event(method.step_event(sigma), q, total_steps)
    run.final_eps = run.size.epsilon + world.from_main(lambda: confirmed_epsilon(run.event, cfg.delta, cfg.accountant))  # once, by process 0; a second computation confirms it
    if notify and world.is_main:  # the plan, public: steps from public settings or the DP size, time from synthetic data
        from .plan import announce

        notify(Info(announce(model, names, spec, chunk, dev, cfg, total_steps, run.steps_per_epoch,
                             int(run.meta["epoch"]) * run.steps_per_epoch if run.meta else 0, q, sigma, run.final_eps)))
    world.distribute(method, anchor)  # GEP: anchor gradients sharded, bases broadcast (no change to the mechanism)
    run.spec, run.model, run.names, run.num_params, run.chunk = spec, model, names, num_params, chunk
    run.anchor, run.sigma, run.method = anchor, sigma, method


def start_state(run: Run, notify: Callable | None = None) -> None:
    """Stage 4: the optimiser and the private randomness (a resumed run's, else new), the run's ledger booking
    before the first step (refused past the budget), then the warnings, and the privacy block (module docstring)."""
    from ..privacy.budget import book_training_run

    cfg, world, model, names, meta = run.cfg, run.world, run.model, run.names, run.meta
    run.opt = torch.optim.SGD([dict(model.named_parameters())[n] for n in names], lr=cfg.lr,
                              momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    # the run's booking in the privacy ledger: one id per run, kept across --resume. A fresh random nonce
    # (OS entropy) with the secret seed, so that two runs with the same --insecure-seed are two bookings;
    # a run checkpointed before 0.3 has none and keeps its old id (the seed's alone).
    if meta is not None:
        world.load_state(run.out, model, run.opt)
        noise_seed = int(meta["secret"]["noise_seed"])
        run.booking_nonce = meta["secret"].get("booking_nonce")
        run.start_epoch = int(meta["epoch"])
        run.rows = ckpt.read_metrics(run.out, run.start_epoch) if world.is_main else []
    else:
        noise_seed = (
            int(np.random.default_rng([cfg.private_seed, 0x5EC2E7]).integers(2**63)) if cfg.private_seed is not None
            else secrets.randbits(128)
        )
        run.booking_nonce = secrets.token_hex(16)
        run.start_epoch = 0
        run.rows = []
    run.noise_seed = noise_seed = world.share_seed(noise_seed)  # process 0's secret: every process draws the same subsamples
    # the privacy ledger, by process 0, before the first step; refused past the budget
    booking_secret = noise_seed if run.booking_nonce is None else f"{noise_seed}:{run.booking_nonce}"
    size = run.size
    world.from_main(lambda: book_training_run(cfg, run.train_src, run.event, run.final_eps, run.method.description, booking_secret,
                                              run.out, run.resume, pure_epsilon=size.epsilon, size_booking=run.size_booking,  # the
                                              selection_dp=run.selection is None or run.selection_dp))  # size estimate: booked apart, or composed here
    for note in run.public_notes + [PrivateNote(n) for n in run.private_notes] if notify and world.is_main else ():
        notify(note)  # once the run is booked (N~ is released with it); private facts as PrivateNote

    selection_epsilon = run.ledger.epsilon  # the DP selection's, booked above (else 0)
    run.privacy_static = {
        "accountant": cfg.accountant, "neighbouring": "add or remove one example",
        "private_randomness": randomness_statement(cfg.private_seed), "sampling": "Poisson", "sampling_rate": run.q,
        "size": size.statement(), "expected_batch_size": cfg.batch_size, "steps": run.total_steps, "noise_multiplier": run.sigma,
        "effective_noise_multiplier": effective_noise_multiplier(run.method.step_event(run.sigma)),
        "target_epsilon": cfg.epsilon,
        "delta": cfg.delta,
        "epsilon": run.final_eps,
        "epsilon_training": run.final_eps - size.epsilon,
        **composition(selection_epsilon, size.epsilon, run.final_eps - size.epsilon, run.selection is not None),
        "mechanism": run.method.description,
    }
    run.settings = cfg.to_dict()
