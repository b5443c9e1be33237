"""``gsd train``: private training on the chosen public data, with exact accounting.

One loop serves every method; a method is a :class:`~gsd_cli.train.transforms.Chain` of per-sample
gradient transforms plus the dp-accounting event of one of its steps
(:func:`~gsd_cli.train.methods.build_method`); the settings are a :class:`~gsd_cli.train.config.TrainConfig`.

Each step t (paper 000, Algorithm 2; Abadi et al. 2016):

1. a Poisson subsample of the private training set: every example independently with probability
   q = batch_size / N (the sampling the accountant assumes; the batch size varies, its mean is
   ``batch_size``);
2. per-sample gradients of that subsample at the current weights, in chunks of ``physical_batch``
   (virtual steps: memory does not grow with the batch);
3. the method's chain: clip, (project), sum, add noise, (reconstruct);
4. the noisy sum divided by the *expected* batch size, handed to SGD with momentum and weight decay.

The noise multiplier sigma is the smallest for which T = epochs * round(N / batch_size) steps are
(epsilon, delta)-DP under add/remove-one neighbours (:func:`gsd_cli.privacy.calibrate_noise`).

The private randomness (which examples each step samples, and the noise) comes from a secret seed
drawn from the operating system for every new run (``insecure_seed=N`` derives it from N instead, for
experiments: every output then says ``"dp": false``; the older ``deterministic_noise=True`` is the
same with N = ``seed``). It is stored in the run's checkpoint, so a resumed run replays exactly the
same samples and noise: the released sequence is one draw of the mechanism and no budget is spent twice.

What the run writes, and which of it may be published: :mod:`gsd_cli.train.release`. The private
set's class list comes from its declared metadata (``classes`` where the source declares none), its
train/test split is decided per example (:mod:`gsd_cli.data.splits`), public data that is the private
set by name or path is refused, and private examples the public data holds are left out of the private
training set (:mod:`gsd_cli.train.overlap`): each would otherwise make the released model depend on the
private data outside the mechanism; a run left with no private training example is refused first (a private output).
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .. import data as gdata
from ..data.published import notes_of
from ..errors import GSDError, PrivateError
from ..privacy.randomness import INSECURE_NOTE, randomness_statement
from ..gradients import default_chunk_size, resolve_device
from ..privacy import Ledger, calibrate_noise, confirmed_epsilon, effective_noise_multiplier, epsilon_of, training_event
from . import checkpoint as ckpt
from .config import TrainConfig, changed_settings, check_resume_settings, lr_at, unused_note, validate
from .evaluate import evaluate, metric_row, summary_block
from .gep import anchor_for
from .methods import build_method
from .overlap import public_rows, refuse_shared_public  # noqa: F401 (refuse_shared_public re-exported)
from .size import Info, check_plan, run_size as _mechanism_size
from .release import PRIVATE_SUMMARY, PrivateNote, composition, delta_notes, not_dp_fields, split_summary
from .splits import private_parts
from .distributed import current_world
from .step import flat_to_grads as _flat_to_grads, private_randomness, private_step  # noqa: F401 (re-exported)
from .transforms import StepContext, chain_step_event

Progress = Callable[[str, int, int], None]


def _chosen_paths(clip_sum) -> dict | None:
    """The clipping paths the run's first step chose (kept in the checkpoint for ``--resume``), None if none yet."""
    return getattr(clip_sum, "chosen_paths", None) if clip_sum is not None else None


def _same_event(a, b) -> bool:
    return abs(effective_noise_multiplier(a) - effective_noise_multiplier(b)) <= 1e-12 * max(1.0, effective_noise_multiplier(b))


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    resume: bool = False,
    device: str = "auto",
    progress: Progress | None = None,
    selection: dict | None = None,
    notify: Callable[[str], None] | None = None,
    nproc: int = 1,
) -> dict | None:
    """Train ``config.model`` on ``config.private`` with ``config.method`` under (epsilon, delta)-DP.

    Writes checkpoints, ``metrics.jsonl``, ``summary.json`` (publishable), ``private-summary.json``
    (not: test metrics, exact sizes, a non-private selection's figures) and ``curves.png`` into ``out`` and returns the full summary
    (both halves, and ``"dp"``: whether the run as a whole is differentially private).
    ``resume=True`` continues the run in ``out`` (the settings must be the checkpoint's).
    ``selection``: the ranking that chose the public set (``Ranking.to_dict()``): a DP-GSD ranking is
    booked in the ledger at its total (R x epsilon for fresh repeats), one without a proven guarantee
    is refused, a non-private one makes the whole result not DP. ``progress(kind, done, total)`` with
    kind ``"epoch"`` or ``"step"``. ``notify(message)`` gets each warning once the run is booked, before
    the first step: a public one as a plain ``str`` (``--delta`` at or above 1/N for the size that sets
    the mechanism, declared or DP-estimated; also in ``summary.json``), and a
    :class:`~gsd_cli.train.release.PrivateNote` for each that names private facts (the exact N against
    ``--delta``, listed images missing, private examples the public data holds): those go to
    ``private-summary.json`` (and ``"private_notes"``), never to ``summary.json``, and a caller prints
    them only on a line that says it is private (``gsd train``: ``private: warning: ...``).

    Several processes (:mod:`gsd_cli.train.distributed`: the same mechanism, accounting and result
    as one process): ``nproc=N`` starts N on this machine; under ``torchrun`` or in an initialised
    torch.distributed process group the run uses that group. Process 0 writes and returns the
    summary; the others write nothing and return None.
    """
    from ..models.spec import model_label, resolve_model

    cfg = config
    validate(cfg)
    if nproc != 1:  # N processes of one process group, each running this function (launch.py)
        from .launch import check_nproc, spawn

        check_nproc(nproc, resolve_device(device))
        ckpt.prepare_run_dir(Path(out), resume, create=False)
        return spawn(train, nproc, (cfg, out), dict(resume=resume, device=device, selection=selection),
                     device=resolve_device(device), progress=progress, notify=notify)
    world = current_world(resolve_device(device))  # torchrun's or an initialised process group, else one process
    from ..privacy.budget import book_size_estimate, book_training_run, ready_ledger  # the privacy ledger (gsd budget)

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
    ledger = Ledger()
    selection_dp = selection is not None and selection.get("reads_private") is False  # chosen from public facts alone
    if selection is not None and selection.get("privacy"):
        ledger.add_selection(selection["privacy"])  # refuses a selection with no proven guarantee, before any work
        selection_dp = bool(selection.get("dp", True))  # False: drawn with --insecure-seed
    t_start = time.perf_counter()
    dev = world.device
    resolve_model(cfg.model)  # a bad --model fails before any data is read

    from ..ranking.catalog import load_catalog

    cat = load_catalog(cfg.catalog) if cfg.catalog else None
    train_src, test_src = private_parts(cfg.private, cfg.private_test, cat)
    if cfg.classes is not None:
        train_src, test_src = gdata.with_classes(train_src, cfg.classes), gdata.with_classes(test_src, cfg.classes)
    gdata.require_declared_classes(train_src)  # the model's output size must not be read off the private labels
    n_train = len(train_src)
    if n_train < 1:  # an empty set: a documented private output (DESIGN.md, docs/train.md), on a private: line
        raise PrivateError(f"{train_src.name} has no examples; private training needs data")
    # Declared classes only: a refusal that read the private labels (every example in one class) would
    # make the run's happening at all depend on the private data outside the mechanism.
    if not train_src.multilabel and train_src.num_classes < 2:
        raise GSDError(f"{train_src.name}: a one-class set (one declared class); a classifier needs at least 2 classes "
                       "(--classes N; as a public candidate of gsd rank it is fine)")
    # private facts (the exact N, the private set's missing files): told after the booking, as PrivateNote
    private_notes = notes_of(train_src) + ([f"--delta {cfg.delta:g} is at or above 1/N = {1 / n_train:.3g} for the N = {n_train} private "
                                            "training examples: delta should be well below 1/N"] if cfg.delta >= 1 / n_train else [])
    # the public examples the method uses and the private examples they hold, left out (overlap.py), before any booking
    pub_sample, left_out, overlap_notes = public_rows(cfg, train_src, test_src, cat, world)
    private_notes += overlap_notes  # how many private examples the public set holds: private, told after the booking
    # q and T from public inputs or a DP estimate of N, never from N itself (gsd_cli.train.size)
    size_booking = world.from_main(lambda: book_size_estimate(cfg, train_src, meta))  # the DP size estimate is booked before it is drawn
    size = world.from_main(lambda: _mechanism_size(cfg, n_train, meta))
    q, steps_per_epoch = size.q, size.steps_per_epoch
    total_steps = check_plan(cfg.epochs, steps_per_epoch, cfg.max_steps, size.how)  # refused above --max-steps, before any booking
    train_epsilon = cfg.epsilon - size.epsilon  # basic composition with the size estimate (size.py)
    public_notes = delta_notes(cfg.delta, size, cfg.batch_size)  # on the size that sets the mechanism, never N (release.py)

    from ..models.peft import build_model

    spec, model, names, model_info = build_model(cfg.model, train_src.num_classes, cfg.seed, weights=cfg.weights, peft=cfg.peft, params=cfg.params,
                                                batchnorm=cfg.batchnorm)
    model = model.to(dev)
    if world.is_main:  # the only process that writes
        out.mkdir(exist_ok=True)
    stage1 = None
    if cfg.method == "second-phase" and world.is_main:  # stage 1 on process 0, its weights to the others
        from .second_phase import run_second_phase

        stage1 = run_second_phase(model, names, cfg, spec, out, dev, num_classes=train_src.num_classes,
                                  multilabel=train_src.multilabel, catalog=cat, progress=progress,
                                  private_classes=getattr(train_src, "classes", None))
    world.broadcast_module(model)
    num_params = sum(dict(model.named_parameters())[n].numel() for n in names)
    chunk = cfg.physical_batch or default_chunk_size(dev, num_params)

    anchor = None
    if cfg.method == "gep":  # public anchors; reusing their basis (--anchor-every, --anchor-warm) costs no privacy (gep.py)
        anchor = anchor_for(cfg, pub_sample.tensor(spec.input_size, spec.channels, dev), model, names,
                            train_src.num_classes, train_src.multilabel, chunk, dev)
        public_notes += anchor.notes  # a --k or --anchor-batch GEP cannot take as given (public numbers)

    # sigma: the smallest noise multiplier meeting (epsilon, delta) over all T steps
    probe_method = build_method(cfg, 1.0, anchor, model=model, names=names)
    sigma = world.from_main(lambda: calibrate_noise(probe_method.step_event, train_epsilon, cfg.delta, q, total_steps, cfg.accountant))
    method = build_method(cfg, sigma, anchor, model=model, names=names, rgp=probe_method.details.get("rgp_state"))
    if method.clip_sum is not None and cfg.physical_batch is None and dev.type == "cpu":  # ghost sums: chunks by activations
        from .chunks import ghost_cpu_chunk

        chunk = ghost_cpu_chunk(model, (spec.channels, spec.input_size, spec.input_size), num_params, chunk)
    if method.clip_sum is not None:  # the paths are timed on a chunk of public size, not the first Poisson chunk's
        method.clip_sum.tune_examples = min(chunk, cfg.batch_size)
        if meta is not None and isinstance(meta.get("clip_paths"), dict):  # the paths the run measured: the same bits on resume
            method.clip_sum.fixed_paths = meta["clip_paths"]
    declared = chain_step_event(method.chain)
    if not _same_event(declared, method.step_event(sigma)):
        raise GSDError("internal: the method's noise does not match its accounted event; refusing to train")
    event = training_event(method.step_event(sigma), q, total_steps)
    final_eps = size.epsilon + world.from_main(lambda: confirmed_epsilon(event, cfg.delta, cfg.accountant))  # once, by process 0; a second computation confirms it
    if notify and world.is_main:  # the plan, public: steps from public settings or the DP size, time from synthetic data
        from .plan import announce

        notify(Info(announce(model, names, spec, chunk, dev, cfg, total_steps, steps_per_epoch,
                             int(meta["epoch"]) * steps_per_epoch if meta else 0, q, sigma, final_eps)))
    world.distribute(method, anchor)  # GEP: anchor gradients sharded, bases broadcast (no change to the mechanism)

    opt = torch.optim.SGD([dict(model.named_parameters())[n] for n in names], lr=cfg.lr,
                          momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    # the run's booking in the privacy ledger: one id per run, kept across --resume. A fresh random nonce
    # (OS entropy) with the secret seed, so that two runs with the same --insecure-seed are two bookings;
    # a run checkpointed before 0.3 has none and keeps its old id (the seed's alone).
    if meta is not None:
        world.load_state(out, model, opt)
        noise_seed = int(meta["secret"]["noise_seed"])
        booking_nonce = meta["secret"].get("booking_nonce")
        start_epoch = int(meta["epoch"])
        rows = ckpt.read_metrics(out, start_epoch) if world.is_main else []
    else:
        noise_seed = (
            int(np.random.default_rng([cfg.private_seed, 0x5EC2E7]).integers(2**63)) if cfg.private_seed is not None
            else secrets.randbits(128)
        )
        booking_nonce = secrets.token_hex(16)
        start_epoch = 0
        rows = []
    noise_seed = world.share_seed(noise_seed)  # process 0's secret: every process draws the same subsamples
    # the privacy ledger, by process 0, before the first step; refused past the budget
    booking_secret = noise_seed if booking_nonce is None else f"{noise_seed}:{booking_nonce}"
    world.from_main(lambda: book_training_run(cfg, train_src, event, final_eps, method.description, booking_secret, out, resume,
                                              pure_epsilon=size.epsilon, size_booking=size_booking))  # the size estimate: booked apart, or composed here
    for note in public_notes + [PrivateNote(n) for n in private_notes] if notify and world.is_main else ():
        notify(note)  # once the run is booked (N~ is released with it); private facts as PrivateNote

    selection_epsilon = sum(e["epsilon"] for e in ledger.entries)  # the DP selection's, booked above (else 0)
    privacy_static = {
        "accountant": cfg.accountant, "neighbouring": "add or remove one example",
        "private_randomness": randomness_statement(cfg.private_seed), "sampling": "Poisson", "sampling_rate": q,
        "size": size.statement(), "expected_batch_size": cfg.batch_size, "steps": total_steps, "noise_multiplier": sigma,
        "effective_noise_multiplier": effective_noise_multiplier(method.step_event(sigma)),
        "target_epsilon": cfg.epsilon,
        "delta": cfg.delta,
        "epsilon": final_eps,
        "epsilon_training": final_eps - size.epsilon,
        **composition(selection_epsilon, size.epsilon, final_eps - size.epsilon, selection is not None),
        "mechanism": method.description,
    }
    settings = cfg.to_dict()

    def save_checkpoint(epochs_done: int, steps_done: int, spent: float) -> None:
        if world.is_main:
            ckpt.save(out, model, opt, {
                "settings": settings, "epoch": epochs_done, "step": steps_done,
                "privacy": {**privacy_static, "steps_done": steps_done, "epsilon_spent": spent},
                "secret": {"noise_seed": str(noise_seed), "note": "seed of the private randomness: keep this file private",
                           **({"booking_nonce": booking_nonce} if booking_nonce is not None else {})},
                "selection": selection,
                **({"clip_paths": paths} if (paths := _chosen_paths(method.clip_sum)) is not None else {}),
            })

    if stage1 is not None and meta is None:  # theta_0 is the run's first checkpoint: --resume never redoes stage 1
        save_checkpoint(0, 0, 0.0)

    if progress:
        progress("epoch", start_epoch, cfg.epochs)
    for epoch in range(start_epoch, cfg.epochs):
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, epoch)
        info: dict = {}
        sizes_seen = []
        for s in range(steps_per_epoch):
            step = epoch * steps_per_epoch + s
            idx, gen = private_randomness(n_train, q, noise_seed, step)
            if left_out is not None:  # Poisson over the set, then the per-example rule: Poisson over the filtered set
                idx = idx[~left_out[idx]]
            ctx = StepContext(step=step, model=model, names=names, generator=gen, device=dev, info=info, epoch=epoch, epochs=cfg.epochs)

            def batches(idx=world.shard(idx)):  # this process's examples of the subsample
                for start in range(0, len(idx), chunk):
                    part = idx[start : start + chunk]
                    x = gdata.to_model_input(gdata.read_images(train_src, part, spec.input_size), spec.input_size, spec.channels, dev)
                    yield x, torch.as_tensor(train_src.labels(part)).to(dev)

            noisy = private_step(method.chain, model, names, batches(), num_params, ctx, method.per_sample, world=world,
                                 clip_sum=method.clip_sum)
            _flat_to_grads(model, names, noisy["grad"] / cfg.batch_size)
            opt.step()
            opt.zero_grad(set_to_none=True)
            sizes_seen.append(len(idx))
            if progress:
                progress("step", s + 1, steps_per_epoch)
        done = (epoch + 1) * steps_per_epoch
        world.reduce_info(info)  # each process counted its shard's examples (fraction clipped...)
        if not world.is_main:  # process 0 evaluates and writes; the others go on
            continue
        spent = size.epsilon + epsilon_of(training_event(method.step_event(sigma), q, done), cfg.delta, cfg.accountant)
        test = evaluate(model, test_src, spec.input_size, spec.channels, dev, batch=chunk)  # the steps' memory bound holds here too
        row = {
            "epoch": epoch + 1, "step": done, "lr": lr_at(cfg, epoch), "epsilon_spent": spent,
            **metric_row(test),
            "mean_batch": float(np.mean(sizes_seen)),
        }
        for key, (a, b) in ((k, v) for k, v in info.items() if k.startswith("clipped_")):
            row[f"fraction_{key}"] = a / b if b else 0.0
        if "residual_ratio" in info and info["residual_ratio"][1] > 0:
            row["residual_energy"] = info["residual_ratio"][0] / info["residual_ratio"][1]
        if info.get("topk_kept") and info["topk_kept"][1] > 0:
            row["topk_fraction_kept"] = info["topk_kept"][0] / info["topk_kept"][1]
        row.update(info.get("epoch_metrics", {}))
        row["not_dp"] = not_dp_fields(row)
        rows.append(row)
        ckpt.write_metrics(out, rows)
        save_checkpoint(epoch + 1, done, spent)
        if progress:
            progress("epoch", epoch + 1, cfg.epochs)
    if not world.is_main:
        return None
    if cfg.method not in ("gep", "second-phase") and cfg.public:
        notes_unused = [f"--public {cfg.public} is not used by --method {cfg.method}"]
    else:
        notes_unused = []
    notes_unused += [n for n in [unused_note(cfg.method, changed_settings(cfg))] if n]  # another method's settings: ignored, said

    notes = list(notes_unused) + public_notes
    if size.how == "dp-estimate" and size.q >= 1:  # N~ is DP (public): saying so reveals nothing more
        notes.append(f"the DP estimate of the private set's size is at most --batch-size {cfg.batch_size}: every step used all "
                     "examples (q = 1); lower --batch-size, or declare the size with --expected-size")
    dp = cfg.private_seed is None
    if cfg.private_seed is not None:
        notes.append(INSECURE_NOTE.format(seed=cfg.private_seed) if cfg.insecure_seed is not None else
                     f"--deterministic-noise: the private sampling and noise come from --seed {cfg.seed}, so this run is NOT "
                     "differentially private; use it for experiments only")
    if selection is not None and not selection_dp:
        dp = False
        notes.append("the public data was chosen by a non-private ranking of the private data: the end-to-end result is NOT differentially private")
    ledger.add(f"training ({cfg.method})", final_eps, cfg.delta, method.description)
    last = rows[-1]
    summary = {
        "dp": dp,
        "method": cfg.method,
        "private": train_src.name,
        "private_train_examples": n_train,
        "private_test": test_src.name,
        "private_test_examples": len(test_src),
        "public": cfg.to_dict()["public"] if cfg.method in ("gep", "second-phase") else None,  # a source object: its name
        "public_distance": cfg.public_distance,
        "public_examples": anchor.x.shape[0] if anchor else 0,
        "model": model_label(cfg.model),
        "num_params": num_params,
        "gep": (
            {"k": anchor.k, "k_per_group": anchor.ks, "groups": len(anchor.ks), **anchor.settings(),
             "clip_embedding": cfg.clip_embedding, "clip_residual": cfg.clip_residual, "residual": cfg.residual}
            if anchor else None
        ),
        "clip": cfg.clip if cfg.method != "gep" else None,
        "clip_engine": (method.clip_sum.reason or cfg.clip_engine) if method.clip_sum is not None else "materialise",
        **{k: v for k, v in method.details.items() if k != "rgp_state"},
        **({"sparsity_reached": rows[-1].get("sparsity", 0.0),
            "mean_sparsity": float(np.mean([r.get("sparsity", 0.0) for r in rows]))} if cfg.sparsify else {}),
        "sigma": sigma,
        "steps": total_steps,
        "epochs": cfg.epochs,
        "sampling_rate": q,
        "epsilon": final_eps,
        "delta": cfg.delta,
        "privacy": privacy_static,
        "budget": ledger.to_dict(),
        "notes": notes,
        "test": summary_block(last),
        "settings": settings,
        "selection": selection,
        "seconds": round(time.perf_counter() - t_start, 2),
        "processes": world.size,
    }
    from .second_phase import stages

    summary["peft"] = model_info.get("peft")
    summary["stages"] = stages(model_info, stage1, summary)
    summary["private_notes"] = private_notes  # private facts (N): kept out of summary.json below
    publishable, private = split_summary({k: v for k, v in summary.items() if k != "private_notes"})
    private["notes"] = private_notes
    ckpt.atomic_write(out / ckpt.SUMMARY, json.dumps(publishable, indent=2) + "\n")
    ckpt.atomic_write(out / PRIVATE_SUMMARY, json.dumps(private, indent=2) + "\n")
    from .curves import plot_curves

    plot_curves(rows, out / "curves.png", title=f"{cfg.method} on {train_src.name}" + (f" with {cfg.public}" if anchor else ""))
    return summary
