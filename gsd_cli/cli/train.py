"""``gsd train``: one call of ``gsd_cli.train`` (after ``auto_select`` with --auto-select), its summary."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from ..defaults import DEFAULT_PRIVATE
from ..errors import GSDError
from .app import app
from .train_select import dp_probe_selection, uses_dp_probe, warn
from .common import PrivateConsole, err, new_run_dir, out, print_private, public_names, with_progress
from .options import (
    MODEL_FORMS, Accountant, BatchNorm, Device, Method, Schedule, batchnorm_option, classes_option, deterministic_noise_option, device_option, extra_argument,
    data_root_option, insecure_seed_option, peft_option, public_list_option, quiet_option, weights_option,
)


def _panel(option, panel: str):
    """A shared option (``options.py``) shown under the help panel ``panel`` of ``gsd train --help``."""
    option.rich_help_panel = panel
    return option


def _use_data_root(ctx: typer.Context, root: Path) -> None:
    """``--data-root`` for every built-in name the command resolves (ranking, training, test set): set as
    ``$GSD_DATA_ROOT`` for the command, restored when it ends. Not a setting of the run: a moved data
    root is given again with ``--resume``."""
    import os

    from ..data.roots import ENV

    old = os.environ.get(ENV)
    os.environ[ENV] = str(root.expanduser().resolve())
    ctx.call_on_close(lambda: os.environ.__setitem__(ENV, old) if old is not None else os.environ.pop(ENV, None))


def notify_note(message: str) -> None:
    """A training run's note (``gsd_cli.train(notify=...)``): one line on stderr, labelled private when it
    names a private fact (a :class:`gsd_cli.train.release.PrivateNote`: the exact N, the private
    examples the public data holds), else public (:func:`warn`)."""
    from ..train.release import PrivateNote

    if isinstance(message, PrivateNote):
        print_private(err, "warning: " + escape(" ".join(str(message).split())))
    else:
        warn(message)


def warn_unused(ctx, method: str) -> None:
    """One warning line naming the options given on the command line that ``method`` does not use
    (:func:`gsd_cli.train.config.unused_note`)."""
    from ..train.config import METHOD_SETTINGS, unused_note

    given = [n for n in METHOD_SETTINGS if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE"]
    note = unused_note(method, given)
    if note:
        warn(note)


def private_refusal(decision) -> str:
    """The public error of a refused explicit method after a non-private selection: its reasons (distances,
    p-values, the probe's figures) were told on the ``private:`` line of the advice."""
    return (f"--method {decision.method}: no candidate it can use passed the advice (the figures are on the private: line "
            "above); train with --method dpsgd, or add --no-fallback to train with the closest anyway")


#: the options that only --auto-select reads (its ranking, advice and feature probe)
#: where --lr, --epochs and --batch-size come from when not given (gsd_cli.train.tuned)
TUNED_NOTE = "default {v} for dpsgd and second-phase on fmnist-cnn (tuned on the held-out benchmark's selection tasks), else {u}."
AUTO_SELECT_OPTIONS = {"rank_model": "--rank-model", "rank_k": "--rank-k", "rank_examples": "--rank-examples",
                       "select_epsilon": "--select-epsilon", "probe_repeats": "--probe-repeats",
                       "rank_repeats": "--rank-repeats", "fallback": "--fallback/--no-fallback"}


def warn_unused_rank(ctx) -> None:
    """One warning line naming the --auto-select options given on the command line of a run without it."""
    given = [flag for name, flag in AUTO_SELECT_OPTIONS.items() if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]
    if given:
        warn(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} only read with --auto-select: ignored (add --auto-select "
             "to rank the --public candidates first)")


#: the ranking's settings as --auto-select names them (the library's messages name gsd rank's options otherwise)
RANK_OPTION_NAMES = {"k": "--rank-k", "examples": "--rank-examples", "repeats": "--rank-repeats", "epsilon": "--select-epsilon"}


def check_auto_select(ctx, method: str, rank_k: int, rank_examples: int, rank_repeats: Optional[int],
                      select_epsilon: Optional[float]) -> None:
    """--auto-select's ranking settings, checked before any work (the ledger included) by the ranking's own
    checks, each error naming the option typed (:data:`RANK_OPTION_NAMES`); and one warning line when
    --probe-repeats is given to a run that does not run the feature probe."""
    from ..ranking.config import RankConfig, check_settings

    check_settings(RankConfig.from_options(k=rank_k, examples=rank_examples, repeats=1 if rank_repeats is None else rank_repeats,
                                           dp=select_epsilon is not None, epsilon=select_epsilon), names=RANK_OPTION_NAMES)
    if getattr(ctx.get_parameter_source("probe_repeats"), "name", None) == "COMMANDLINE":
        if select_epsilon is not None and ctx.params.get("probe_repeats"):
            warn("--probe-repeats is not used with --select-epsilon (the DP feature probe draws once; --probe-repeats 0 "
                 "chooses by the DP selection on GSD instead): ignored")
        elif method not in ("auto", "second-phase"):
            warn(f"--probe-repeats is not used with --method {method} (the feature probe scores the second phase: --method "
                 "auto or second-phase): ignored")


@app.command()
def train(
    ctx: typer.Context,
    private: str = typer.Option(DEFAULT_PRIVATE, "--private", help="Private dataset: trains on NAME:train, tests on NAME:test.", rich_help_panel="Data"),
    public: Optional[List[str]] = _panel(public_list_option("Public dataset; with --auto-select, the candidates (default: gsd rank's)."), "Data"),
    auto_select: bool = typer.Option(False, "--auto-select", help="Rank the --public candidates first and train as the advice decides.", rich_help_panel="Data"),
    catalog_path: Optional[Path] = typer.Option(None, "--catalog", help="TOML catalogue of datasets, whose --private job gives --auto-select's candidates.", rich_help_panel="Data"),
    method: Optional[Method] = typer.Option(None, "--method", show_default=False, help="Training method (default: auto with --auto-select, else gep).", rich_help_panel="Privacy"),
    epsilon: float = typer.Option(2.0, "--epsilon", help="Target epsilon of the run.", rich_help_panel="Privacy"),
    delta: float = typer.Option(1e-5, "--delta", help="Target delta, below 1/N.", rich_help_panel="Privacy"),
    private_test: Optional[str] = typer.Option(None, "--private-test", help="Test set for evaluation (default: the private dataset's test part).", rich_help_panel="Data"),
    model: str = typer.Option("fmnist-cnn", "--model", help="Model to train: fmnist-cnn, resnet20, probe, a torchvision backbone (gsd models list)" + MODEL_FORMS, rich_help_panel="Model"),
    batchnorm: BatchNorm = batchnorm_option("refuse", "Model"),
    params: Optional[List[str]] = typer.Option(None, "--params", help="Glob patterns of the parameters to train (default: all).", rich_help_panel="Model"),
    weights: Optional[str] = _panel(weights_option(), "Model"),
    peft: Optional[str] = _panel(peft_option(), "Model"),
    public_epochs: int = typer.Option(5, "--public-epochs", help="Epochs of stage 1, the --peft parameters' training on public data.", rich_help_panel="Second phase (--method second-phase)"),
    public_lr: Optional[float] = typer.Option(None, "--public-lr", help="Adam learning rate of stage 1 (default 3e-3; with --weights, 5e-5 for CNNs).", rich_help_panel="Second phase (--method second-phase)"),
    public_batch_size: int = typer.Option(64, "--public-batch-size", help="Minibatch size of stage 1.", rich_help_panel="Second phase (--method second-phase)"),
    epochs: Optional[int] = typer.Option(None, "--epochs", show_default=False, help="Epochs; " + TUNED_NOTE.format(v="12", u="20"), rich_help_panel="Optimisation"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", show_default=False, help="Expected (Poisson) batch size; " + TUNED_NOTE.format(v="500", u="250"), rich_help_panel="Optimisation"),
    expected_size: Optional[int] = typer.Option(None, "--expected-size", help="Declared (public) size N0 of the private set (default: a DP estimate of N).", rich_help_panel="Optimisation"),
    sampling_rate: Optional[float] = typer.Option(None, "--sampling-rate", help="Declared (public) Poisson sampling rate q, instead of --expected-size.", rich_help_panel="Optimisation"),
    max_steps: int = typer.Option(100_000, "--max-steps", help="Most steps the run may plan (larger plans are refused).", rich_help_panel="Optimisation"),
    size_epsilon: Optional[float] = typer.Option(None, "--size-epsilon", help="Epsilon of the DP estimate of N when no size is declared (default 2% of --epsilon).", rich_help_panel="Privacy"),
    lr: Optional[float] = typer.Option(None, "--lr", show_default=False, help="SGD learning rate; " + TUNED_NOTE.format(v="0.5", u="0.1"), rich_help_panel="Optimisation"),
    momentum: float = typer.Option(0.9, "--momentum", help="SGD momentum.", rich_help_panel="Optimisation"),
    weight_decay: float = typer.Option(1e-4, "--weight-decay", help="SGD weight decay.", rich_help_panel="Optimisation"),
    lr_schedule: Schedule = typer.Option(Schedule.step, "--lr-schedule", help="step: lr / 10 from mid-training (paper 000); constant.", rich_help_panel="Optimisation"),
    seed: int = typer.Option(0, "--seed", help="Public seed: initial weights, public anchors and their labels.", rich_help_panel="Optimisation"),
    clip: float = typer.Option(1.0, "--clip", help="dpsgd: per-sample clip norm C.", rich_help_panel="Privacy"),
    clip_engine: str = typer.Option("auto", "--clip-engine", help="dpsgd, second-phase: how the clipped sum is computed (ghost, materialise or auto).", rich_help_panel="Privacy"),
    k: int = typer.Option(32, "--k", help="Anchor subspace dimension (shared by the groups).", rich_help_panel="GEP (--method gep)"),
    public_examples: int = typer.Option(2000, "--public-examples", help="Public anchor examples, or stage 1's (second-phase).", rich_help_panel="GEP (--method gep)"),
    power_iters: int = typer.Option(1, "--power-iters", help="Power iterations per step (the paper uses 1).", rich_help_panel="GEP (--method gep)"),
    groups: str = typer.Option("auto", "--groups", help="Parameter groups, ';' between groups, ',' between globs (auto, none).", rich_help_panel="GEP (--method gep)"),
    clip_embedding: float = typer.Option(1.0, "--clip-embedding", help="Clip norm S1 of the embedding (noise std sigma*S1).", rich_help_panel="GEP (--method gep)"),
    clip_residual: float = typer.Option(0.5, "--clip-residual", help="Clip norm S2 of the residual (noise std sigma*S2).", rich_help_panel="GEP (--method gep)"),
    residual: bool = typer.Option(True, "--residual/--no-residual", help="Release (GEP) or drop (B-GEP) the residual.", rich_help_panel="GEP (--method gep)"),
    anchor_every: int = typer.Option(4, "--anchor-every", help="Recompute the anchor basis every N steps (same epsilon).", rich_help_panel="GEP (--method gep)"),
    anchor_warm: bool = typer.Option(True, "--anchor-warm/--anchor-cold", help="Start each power iteration from the previous basis, or a random one.", rich_help_panel="GEP (--method gep)"),
    anchor_batch: int = typer.Option(128, "--anchor-batch", help="Anchors per recomputation (0: all --public-examples).", rich_help_panel="GEP (--method gep)"),
    rgp_rank: int = typer.Option(4, "--rgp-rank", help="rgp: rank r of the gradient carriers of each Linear/Conv2d weight.", rich_help_panel="RGP, TopAgg, sparsification"),
    rgp_warmup: int = typer.Option(20, "--rgp-warmup", help="rgp: warm-up steps whose carriers decompose the weight itself.", rich_help_panel="RGP, TopAgg, sparsification"),
    topk_fraction: float = typer.Option(0.7, "--topk-fraction", help="topagg: NormTopK keeps K in (0, 1] of each gradient's squared norm.", rich_help_panel="RGP, TopAgg, sparsification"),
    sparsify: float = typer.Option(0.0, "--sparsify", help="dpsgd, gep: random sparsification's final rate in [0, 1) (paper 003).", rich_help_panel="RGP, TopAgg, sparsification"),
    accountant: Accountant = typer.Option(Accountant.rdp, "--accountant", help="dp-accounting's accountant.", rich_help_panel="Privacy"),
    physical_batch: Optional[int] = typer.Option(None, "--physical-batch", help="Examples per per-sample-gradient chunk (default 64 on CPU, 256 on GPU).", rich_help_panel="Optimisation"),
    insecure_seed: Optional[int] = _panel(insecure_seed_option("sampling, noise, DP draws"), "Privacy"),
    deterministic_noise: bool = _panel(deterministic_noise_option(), "Privacy"),
    classes: Optional[str] = _panel(classes_option(), "Data"),
    data_root: Optional[Path] = _panel(data_root_option(), "Data"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="New run folder (default gsd-train-<time>); its parent must exist.", rich_help_panel="Run folder and output"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the interrupted run in this folder, with its own settings.", rich_help_panel="Run folder and output"),
    rank_model: str | None = typer.Option(None, "--rank-model", help="Model of the ranking (default: probe, or the trained one with --weights or --peft).", rich_help_panel="Auto-select ranking (--auto-select)"),
    rank_k: int = typer.Option(16, "--rank-k", help="Subspace dimension of the ranking.", rich_help_panel="Auto-select ranking (--auto-select)"),
    rank_examples: int = typer.Option(2000, "--rank-examples", help="Examples per dataset in the ranking.", rich_help_panel="Auto-select ranking (--auto-select)"),
    select_epsilon: Optional[float] = typer.Option(None, "--select-epsilon", help="Make the selection private at this epsilon, part of --epsilon (default: not private).", rich_help_panel="Auto-select ranking (--auto-select)"),
    probe_repeats: int = typer.Option(3, "--probe-repeats", min=0, max=100, help="Draws of the feature probe (0: no probe).", rich_help_panel="Auto-select ranking (--auto-select)"),
    rank_repeats: Optional[int] = typer.Option(None, "--rank-repeats", help="Ranking draws (default 3; 1 with --select-epsilon).", rich_help_panel="Auto-select ranking (--auto-select)"),
    fallback: bool = typer.Option(True, "--fallback/--no-fallback", help="Follow the advice, or the closest candidate anyway.", rich_help_panel="Auto-select ranking (--auto-select)"),
    device: Device = _panel(device_option(), "Run folder and output"),
    nproc: int = typer.Option(1, "--nproc", help="Processes to train with on this machine (not under torchrun).", rich_help_panel="Run folder and output"),
    quiet: bool = _panel(quiet_option("No progress bars."), "Run folder and output"),
    log: Optional[List[str]] = typer.Option(None, "--log", help="Also log the run to tensorboard or mlflow (repeat the option for both).", rich_help_panel="Run folder and output"),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="With --log: the folder of tb/ and mlruns/ instead of the run folder.", rich_help_panel="Run folder and output"),
    extra: Optional[List[str]] = extra_argument(),
) -> None:
    """Train privately (DP-SGD, GEP, RGP, TopAgg, random sparsification, or the second phase then DP-SGD)
    with the chosen public data, writing checkpoints, metrics.jsonl, summary.json and curves.png to the run folder.

    Every step is a Poisson-subsampled Gaussian mechanism under add/remove-one neighbours, accounted with
    dp-accounting; lines that start with 'private:' carry private figures. Each method's privacy and every
    option in full: docs/train.md.
    """
    from ..train import TrainConfig, advised_selection as advised_fn, train as train_fn
    from ..train.checkpoint import load_meta

    publics = public_names(public, extra)
    if log_dir is not None and not log:
        raise GSDError("--log-dir is only used with --log tensorboard or --log mlflow")
    if log:  # gsd_cli.integrations.tracking.train_tracked: train() plus the trackers; a missing extra fails here, before any work
        from ..integrations.tracking import check_backends, train_tracked

        train_fn = partial(train_tracked, log=check_backends(log), log_dir=log_dir)
    from ..train.distributed import launched_by_torchrun

    if launched_by_torchrun():  # every process runs this command; process 0 reports
        if auto_select:
            raise GSDError("--auto-select under torchrun would rank once per process: rank first (gsd rank), then train with --public, or use --nproc")
        quiet = quiet or os.environ.get("RANK", "0") != "0"
    if data_root is not None:
        _use_data_root(ctx, data_root)
    if method is None:
        method = Method.auto if auto_select else Method.gep
    if probe_repeats == 1:
        raise GSDError("--probe-repeats 1 gives the probe no confidence (its test pairs 2 or more draws): give 0 (no probe) or at least 2")
    if method is Method.auto and not auto_select:
        raise GSDError("--method auto picks the method from the ranking: add --auto-select (or name a method: gep, dpsgd, rgp, topagg, second-phase)")
    from ..train.tuned import FIELDS, fill_defaults, training_defaults

    given = {n for n in FIELDS if getattr(ctx.get_parameter_source(n), "name", None) in ("COMMANDLINE", "ENVIRONMENT")}
    first = training_defaults(model, method.value)  # --method auto: the earlier defaults until the advice decides
    lr, epochs, batch_size = (first[n] if v is None else v for n, v in (("lr", lr), ("epochs", epochs), ("batch_size", batch_size)))
    fields = dict(
        private=private, method=method.value, epsilon=epsilon, delta=delta, private_test=private_test, model=model,
        params=list(params) if params else None, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
        expected_size=expected_size, sampling_rate=sampling_rate, size_epsilon=size_epsilon, max_steps=max_steps,
        weight_decay=weight_decay, lr_schedule=lr_schedule.value, seed=seed, clip=clip, clip_engine=clip_engine, k=k,
        public_examples=public_examples, power_iters=power_iters, groups=groups, clip_embedding=clip_embedding,
        clip_residual=clip_residual, residual=residual, anchor_every=anchor_every, anchor_warm=anchor_warm, anchor_batch=anchor_batch,
        accountant=accountant.value, physical_batch=physical_batch,
        deterministic_noise=deterministic_noise, insecure_seed=insecure_seed, classes=classes, rgp_rank=rgp_rank, rgp_warmup=rgp_warmup, topk_fraction=topk_fraction,
        sparsify=sparsify, weights=weights, peft=peft, batchnorm=batchnorm.value, public_epochs=public_epochs,
        public_lr=public_lr, public_batch_size=public_batch_size,
        catalog=str(catalog_path.expanduser().resolve()) if catalog_path is not None else None,
    )
    selection = None
    if resume is not None:
        if out_dir is not None:
            raise GSDError("give either --out (a new run) or --resume (an interrupted one), not both")
        from ..train.checkpoint import prepare_run_dir
        from ..train.second_phase import run_settings

        prepare_run_dir(resume, resume=True)  # "no gsd run in DIR: ..." before any setting is read
        saved = load_meta(resume).get("settings", {}) if (resume / "checkpoint.json").is_file() else run_settings(resume)
        sources = {n: ctx.get_parameter_source("catalog_path" if n == "catalog" else n) for n in fields}
        explicit = {n for n, src in sources.items() if src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")}
        if publics:
            explicit.add("public")
        from ..train.config import SAVED_BEFORE

        cfg_dict = {**SAVED_BEFORE, **saved}  # a run saved before a setting's default changed keeps its old value
        for n in explicit:
            cfg_dict[n] = fields[n] if n != "public" else publics[0]
        cfg = TrainConfig(**{k_: v for k_, v in cfg_dict.items() if k_ in TrainConfig.__dataclass_fields__})
        run = resume
    else:
        cat = None
        if catalog_path is not None:
            from ..ranking.catalog import load_catalog, select_jobs

            cat = load_catalog(catalog_path)
            if auto_select and not publics:
                publics = list(select_jobs(cat, private)[0].candidates)
        if not auto_select:
            warn_unused_rank(ctx)
        if auto_select:
            if len(publics) < 1:
                from ..defaults import DEFAULT_PUBLIC

                publics = list(DEFAULT_PUBLIC)  # gsd rank's default candidates, the built-in public sets
            check_auto_select(ctx, method.value, rank_k, rank_examples, rank_repeats, select_epsilon)
        elif len(publics) > 1:
            raise GSDError("several --public sets: add --auto-select to rank them and train with the closest")
        cfg = TrainConfig(**fields, public=publics[0] if publics else None)
        run = new_run_dir(out_dir, "gsd-train")
        from ..train.checkpoint import prepare_run_dir
        from ..train.config import validate

        if auto_select:
            cfg.public = publics[0]
        if cfg.method == "auto":  # checked as GEP with a public set until the ranking decides
            validate(TrainConfig(**{**fields, "method": "gep"}, public=cfg.public))
        else:
            validate(cfg)
            warn_unused(ctx, cfg.method)  # a setting of another method, given on the command line: said, not silently ignored
        prepare_run_dir(run, resume=False, create=False)  # fail before the ranking, not after it
        from ..privacy.budget import ready_ledger

        ready_ledger()  # the privacy ledger this run books into, before any work (exit 2 if unusable)
        from ..report.outputs import check_not_inputs, run_inputs
        from .common import catalog_inputs

        check_not_inputs({"--out": run}, run_inputs([private, *publics], catalog_path, None, None) + catalog_inputs(catalog_path))  # not inside a folder: source
        if auto_select and select_epsilon is not None:  # --epsilon is the run's total: the selection's share comes off it
            from ..train.dp_advice import split_budget

            cfg.epsilon = split_budget(epsilon, delta, select_epsilon)[0]  # the DP selection on GSD: pure, delta 0
            if uses_dp_probe(cfg.method, probe_repeats):
                selection = dp_probe_selection(cfg, private, publics, private_test=private_test, catalog=cat, select_epsilon=select_epsilon,
                                               total=(epsilon, delta), fallback=fallback, device=device.value, quiet=quiet,
                                               classes=classes)
        if auto_select and selection is None:
            from ..report import print_ranking

            from ..ranking.cache import SubspaceCache
            from ..train.select import RANK_MODEL

            # public subspaces (the candidates' and the noise references') are functions of public data and settings:
            # reused across runs from gsd's cache folder (gsd cache), as gsd rank does
            rank_opts = dict(k=rank_k, examples=rank_examples, seed=seed, model=rank_model or RANK_MODEL, device=device.value,
                             cache=SubspaceCache())
            if (weights is not None or peft is not None) and rank_model is None:
                rank_opts.update(model=model, weights=weights, peft=peft, batchnorm=batchnorm.value)  # GSD on exactly the parameters to be trained
            if select_epsilon is not None:
                rank_opts.update(dp=True, epsilon=select_epsilon, insecure_seed=cfg.private_seed)
            if classes is not None:
                rank_opts.update(classes=classes)
            ranking, decision = with_progress(
                quiet, lambda pr: advised_fn(private, publics, cfg.method, private_test=private_test, catalog=cat, progress=pr,
                                             repeats=rank_repeats, references=fallback or select_epsilon is None,
                                             train_settings=cfg if probe_repeats else None, probe_repeats=probe_repeats or None,
                                             notify=warn, gate="helping" if fallback else "all", **rank_opts),
                private=True)  # the ranking's time grows with the private set: labelled private
            # a non-private selection's figures (distances, references, probe accuracies, p-values, the private
            # examples drawn) are statistics of the private data: on lines labelled private
            public_selection = select_epsilon is not None
            tell = (lambda text: out.print(text, highlight=False, soft_wrap=True)) if public_selection else partial(print_private, out)
            print_ranking(ranking, out if public_selection else PrivateConsole(out))
            if ranking.references:
                from ..train.advice import reference_line

                tell(escape(reference_line(ranking)))
            selection = ranking.to_dict()
            if select_epsilon is not None:  # the DP winner and its released score: what a decision may read (DP releases only)
                from ..distance.dpselect import released_winner

                selection["dp_winner"] = released_winner(ranking)
            from ..train.advice import is_reference

            if decision is not None:
                tell(escape(decision.message))
                selection["advice"] = decision.to_dict()
            closest = next((r for r in ranking if not is_reference(r.public)), None)
            if fallback:
                if decision.refused:
                    raise GSDError(decision.message if public_selection else private_refusal(decision))
                cfg.method, cfg.public = decision.method, decision.public
                cfg.public_distance = decision.distance if decision.public is not None else None
            else:  # --no-fallback: the closest candidate whatever the advice, said in a warning when the advice differs
                if cfg.method == "auto":
                    cfg.method = decision.method if decision is not None and decision.public is not None else "gep"
                cfg.public, cfg.public_distance = closest.public, closest.distance
                from ..train.select import forced_note

                note = forced_note(private, closest.public, cfg.method, decision, private_test=private_test, catalog=cat,
                                   classes=classes, advice=None if public_selection else "on the private: line above")
                if note:  # as --help promises: the advice differs, is refused or (under --select-epsilon) absent
                    warn(note)
            validate(cfg)
            if cfg.public is not None:
                shown = (f"DP energy distance, released {cfg.public_distance:.4f}, "
                         if cfg.public_distance is not None and public_selection else "")  # non-private: in the private table
                out.print(f"training with [bold]{escape(cfg.public)}[/] ({shown}--method {cfg.method})")
            else:
                out.print(f"training without public data (--method {cfg.method})")

    if resume is None:
        fill_defaults(cfg, given)  # the decided method's tuned settings, where the user gave none (gsd_cli.train.tuned)
    from ..timing import stage

    with stage("training"):  # its stage 1 apart: "training's stage 1"
        summary = with_progress(quiet, lambda pr: train_fn(cfg, run, resume=resume is not None, device=device.value, progress=pr,
                                                           selection=selection, notify=notify_note, nproc=nproc), width=8, eta=True,
                                private=True)  # an epoch's time grows with N: the progress lines are labelled private
    if summary is None:  # a process other than 0 of a distributed run: process 0 writes and reports
        return
    from ..train.report import print_summary

    print_summary(summary, out)
    chosen_privately = summary.get("selection") is not None and not summary["selection"].get("privacy")  # its statistics: private-summary.json
    err.print(f"wrote {run}/summary.json ({'publishable' if summary.get('dp') else 'public settings; the run is NOT DP'}), "
              "private-summary.json, metrics.jsonl, curves.png (not publishable: test metrics of private data"
              + (", the selection's statistics" if chosen_privately else "") + "), checkpoint.safetensors"
              + (", stage1.safetensors" if cfg.method == "second-phase" else ""))
    if log:
        err.print(f"logged to {' and '.join(dict.fromkeys(log))} under {log_dir or run} (mlflow: $MLFLOW_TRACKING_URI when set)")
