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
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from .. import data as gdata
from ..errors import GSDError  # noqa: F401 (re-exported)
from ..gradients import resolve_device
from ..privacy import epsilon_of, training_event
from ..privacy.randomness import INSECURE_NOTE
from . import checkpoint as ckpt
from .config import METHOD_SETTINGS, TrainConfig, changed_settings, lr_at, unused_note, validate
from .evaluate import evaluate, metric_row, summary_block
from .overlap import refuse_shared_public  # noqa: F401 (re-exported)
from .release import PRIVATE_SUMMARY, not_dp_fields, split_summary
from .distributed import current_world
from .run_setup import Run, build_mechanism, open_run, read_private, start_state
from .runlock import held_by_launcher, lock_run
from .step import flat_to_grads as _flat_to_grads, private_randomness, private_step  # noqa: F401 (re-exported)
from .transforms import StepContext
from .tuned import small_set_note

Progress = Callable[[str, int, int], None]


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

    The run folder is locked for the whole run (:mod:`gsd_cli.train.runlock`): another writer to it (a second
    run with the same ``out``, a ``resume`` of a run still going) is refused with
    :class:`~gsd_cli.train.runlock.RunInUse` before it reads the ledger, books or writes anything.
    The stages before the first step are :mod:`gsd_cli.train.run_setup`'s; then the epochs
    (:func:`run_epoch`) and the summary (:func:`finish`).
    """
    cfg = config
    validate(cfg)
    if nproc != 1:  # N processes of one process group, each running this function (launch.py)
        from .distributed.launch import check_nproc, spawn

        check_nproc(nproc, resolve_device(device))
        with lock_run(out, resume):  # held here for the N processes (runlock.py)
            return spawn(_launched, nproc, (cfg, out), dict(resume=resume, device=device, selection=selection),
                         device=resolve_device(device), progress=progress, notify=notify)
    world = current_world(resolve_device(device))  # torchrun's or an initialised process group, else one process
    with lock_run(out, resume, world):  # one writer per run folder, from before the ledger to the end (runlock.py)
        return _train(cfg, out, resume, world, progress, selection, notify)


def _launched(cfg: TrainConfig, out, **kwargs):
    """One of the processes of ``train(nproc=N)``, whose caller holds the run folder's lock."""
    with held_by_launcher(out):
        return train(cfg, out, **kwargs)


def _train(cfg: TrainConfig, out, resume: bool, world, progress, selection, notify) -> dict | None:
    """:func:`train`'s stages and epochs in this process of ``world``, the run folder locked."""
    run = open_run(cfg, out, resume, selection, world)
    read_private(run)
    build_mechanism(run, progress, notify)
    start_state(run, notify)
    if run.stage1 is not None and run.meta is None:  # theta_0 is the run's first checkpoint: --resume never redoes stage 1
        save_checkpoint(run, 0, 0, 0.0)
    if progress:
        progress("epoch", run.start_epoch, cfg.epochs)
    for epoch in range(run.start_epoch, cfg.epochs):
        run_epoch(run, epoch, progress)
    return finish(run) if world.is_main else None


def _chosen_paths(clip_sum) -> dict | None:
    """The clipping paths the run's first step chose (kept in the checkpoint for ``--resume``), None if none yet."""
    return getattr(clip_sum, "chosen_paths", None) if clip_sum is not None else None


def save_checkpoint(run: Run, epochs_done: int, steps_done: int, spent: float) -> None:
    """The run's checkpoint after ``epochs_done`` epochs (process 0 writes): weights, optimiser, settings, privacy
    block with the epsilon spent, the secret seed of the private randomness, the selection, the clipping paths."""
    if run.world.is_main:
        ckpt.save(run.out, run.model, run.opt, {
            "settings": run.settings, "epoch": epochs_done, "step": steps_done,
            "privacy": {**run.privacy_static, "steps_done": steps_done, "epsilon_spent": spent},
            "secret": {"noise_seed": str(run.noise_seed), "note": "seed of the private randomness: keep this file private",
                       **({"booking_nonce": run.booking_nonce} if run.booking_nonce is not None else {})},
            "selection": run.selection,
            **({"clip_paths": paths} if (paths := _chosen_paths(run.method.clip_sum)) is not None else {}),
        })


def run_epoch(run: Run, epoch: int, progress: Progress | None = None) -> None:
    """One epoch's private steps (module docstring), then (process 0) its test metrics and checkpoint."""
    cfg, world, model, names, dev, train_src, spec = run.cfg, run.world, run.model, run.names, run.dev, run.train_src, run.spec
    method, chunk, opt, steps_per_epoch = run.method, run.chunk, run.opt, run.steps_per_epoch
    for group in opt.param_groups:
        group["lr"] = lr_at(cfg, epoch)
    info: dict = {}
    sizes_seen = []
    for s in range(steps_per_epoch):
        step = epoch * steps_per_epoch + s
        idx, gen = private_randomness(run.n_train, run.q, run.noise_seed, step)
        if run.left_out is not None:  # Poisson over the set, then the per-example rule: Poisson over the filtered set
            idx = idx[~run.left_out[idx]]
        ctx = StepContext(step=step, model=model, names=names, generator=gen, device=dev, info=info, epoch=epoch, epochs=cfg.epochs)

        def batches(idx=world.shard(idx)):  # this process's examples of the subsample
            for start in range(0, len(idx), chunk):
                part = idx[start : start + chunk]
                x = gdata.to_model_input(gdata.read_images(train_src, part, spec.input_size), spec.input_size, spec.channels, dev)
                yield x, torch.as_tensor(train_src.labels(part)).to(dev)

        noisy = private_step(method.chain, model, names, batches(), run.num_params, ctx, method.per_sample, world=world,
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
        return
    spent = run.size.epsilon + epsilon_of(training_event(method.step_event(run.sigma), run.q, done), cfg.delta, cfg.accountant)
    test = evaluate(model, run.test_src, spec.input_size, spec.channels, dev, batch=chunk)  # the steps' memory bound holds here too
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
    run.rows.append(row)
    ckpt.write_metrics(run.out, run.rows)
    save_checkpoint(run, epoch + 1, done, spent)
    if progress:
        progress("epoch", epoch + 1, cfg.epochs)


#: the note of a run whose public data a non-private ranking chose, with the way to a DP one (issue 64: nothing said it)
NOT_DP_SELECTION_NOTE = ("the public data was chosen by a non-private ranking of the private data: the end-to-end result is NOT "
                         "differentially private; --auto-select --select-epsilon E chooses it privately instead (E of the total "
                         "--epsilon), and the run is then DP")


def _notes(run: Run) -> tuple[list[str], bool]:
    """The run's public notes (settings it ignored, the size estimate's, the private randomness's, a non-private
    selection's) and whether the run as a whole is DP."""
    cfg, size = run.cfg, run.size
    if cfg.method not in ("gep", "second-phase") and cfg.public:
        notes_unused = [f"--public {cfg.public} is not used by --method {cfg.method}"]
    else:
        notes_unused = []
    changed = changed_settings(cfg)
    if run.selection is not None:  # --auto-select's feature probe ran stage 1 with the second phase's settings: used
        changed = [n for n in changed if "second-phase" not in METHOD_SETTINGS[n]]
    notes_unused += [n for n in [unused_note(cfg.method, changed)] if n]  # another method's settings: ignored, said

    notes = list(notes_unused) + run.public_notes
    if size.how == "dp-estimate" and size.q >= 1:  # N~ is DP (public): saying so reveals nothing more
        notes.append(small_set_note(cfg.batch_size))
    dp = cfg.private_seed is None
    if cfg.private_seed is not None:
        notes.append(INSECURE_NOTE.format(seed=cfg.private_seed) if cfg.insecure_seed is not None else
                     f"--deterministic-noise: the private sampling and noise come from --seed {cfg.seed}, so this run is NOT "
                     "differentially private; use it for experiments only")
    if run.selection is not None and not run.selection_dp:
        dp = False
        notes.append(NOT_DP_SELECTION_NOTE)
    return notes, dp


def finish(run: Run) -> dict:
    """The run's summary (process 0): ``summary.json`` (publishable), ``private-summary.json`` and ``curves.png``."""
    from ..models.spec import model_label
    from .second_phase import stages

    cfg, anchor, method, rows = run.cfg, run.anchor, run.method, run.rows
    notes, dp = _notes(run)
    run.ledger.add(f"training ({cfg.method})", run.final_eps, cfg.delta, method.description)
    last = rows[-1]
    summary = {
        "dp": dp,
        "method": cfg.method,
        "private": run.train_src.name,
        "private_train_examples": run.n_train,
        "private_test": run.test_src.name,
        "private_test_examples": len(run.test_src),
        "public": cfg.to_dict()["public"] if cfg.method in ("gep", "second-phase") else None,  # a source object: its name
        "public_distance": cfg.public_distance,
        "public_examples": anchor.x.shape[0] if anchor else 0,
        "model": model_label(cfg.model),
        "num_params": run.num_params,
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
        "sigma": run.sigma,
        "steps": run.total_steps,
        "epochs": cfg.epochs,
        "sampling_rate": run.q,
        "epsilon": run.final_eps,
        "delta": cfg.delta,
        "privacy": run.privacy_static,
        "budget": run.ledger.to_dict(),
        "notes": notes,
        "test": summary_block(last),
        "settings": run.settings,
        "selection": run.selection,
        "seconds": round(time.perf_counter() - run.t_start, 2),
        "processes": run.world.size,
    }
    summary["peft"] = run.model_info.get("peft")
    summary["stages"] = stages(run.model_info, run.stage1, summary)
    summary["private_notes"] = run.private_notes  # private facts (N): kept out of summary.json below
    publishable, private = split_summary({k: v for k, v in summary.items() if k != "private_notes"})
    private["notes"] = run.private_notes
    ckpt.atomic_write(run.out / ckpt.SUMMARY, json.dumps(publishable, indent=2) + "\n")
    ckpt.atomic_write(run.out / PRIVATE_SUMMARY, json.dumps(private, indent=2) + "\n", private=True)
    from .curves import plot_curves

    plot_curves(rows, run.out / "curves.png", title=f"{cfg.method} on {run.train_src.name}" + (f" with {cfg.public}" if anchor else ""))
    return summary
