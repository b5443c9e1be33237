"""``gsd train``: one call of ``gsd_cli.train`` (after ``auto_select`` with --auto-select), its summary."""

from __future__ import annotations

import os
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import typer
from rich.markup import escape

from ..errors import GSDError
from .app import app
from .train_options import TRAIN_OPTIONS
from .train_select import dp_probe_selection, uses_dp_probe, warn
from .common import PrivateConsole, err, new_run_dir, out, print_private, public_names, with_progress
from .options import Method, with_options


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


#: the options that only --auto-select reads (its ranking, advice and feature probe)
AUTO_SELECT_OPTIONS = {"rank_model": "--rank-model", "rank_k": "--rank-k", "rank_examples": "--rank-examples",
                       "select_epsilon": "--select-epsilon", "probe_repeats": "--probe-repeats", "probe_stage1": "--probe-stage1",
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


def _source(ctx, name: str) -> str | None:
    return getattr(ctx.get_parameter_source(name), "name", None)


def _trainer(a):
    """``gsd_cli.train.train``, or with ``--log`` :func:`gsd_cli.integrations.tracking.train_tracked` (a missing extra
    fails here, before any work); under torchrun every process runs the command and process 0 reports."""
    from ..train import train as plain
    from ..train.distributed import launched_by_torchrun

    if a.log_dir is not None and not a.log:
        raise GSDError("--log-dir is only used with --log tensorboard or --log mlflow")
    train_fn = plain
    if a.log:
        from ..integrations.tracking import check_backends, train_tracked

        train_fn = partial(train_tracked, log=check_backends(a.log), log_dir=a.log_dir)
    if launched_by_torchrun():
        if a.auto_select:
            raise GSDError("--auto-select under torchrun would rank once per process: rank first (gsd rank), then train with --public, or use --nproc")
        a.quiet = a.quiet or os.environ.get("RANK", "0") != "0"
    return train_fn


def _fields(ctx, a) -> tuple[dict, set]:
    """The run's settings as given (``--method`` decided: auto with --auto-select, else gep; --lr, --epochs and
    --batch-size the earlier defaults until the method is decided, the rate scaled to a given or size-bound batch,
    gsd_cli.train.tuned) and the tuned names given."""
    from ..train.tuned import FIELDS, training_settings

    if a.method is None:
        a.method = Method.auto if a.auto_select else Method.gep
    if a.probe_repeats == 1:
        raise GSDError("--probe-repeats 1 gives the probe no confidence (its test pairs 2 or more draws): give 0 (no probe) or at least 2")
    if a.method is Method.auto and not a.auto_select:
        raise GSDError("--method auto picks the method from the ranking: add --auto-select (or name a method: gep, dpsgd, rgp, topagg, second-phase)")
    given = {n for n in FIELDS if _source(ctx, n) in ("COMMANDLINE", "ENVIRONMENT")}
    first = training_settings(a.model, a.method.value, expected_size=a.expected_size, weights=a.weights, peft=a.peft,  # auto: earlier
                              **{n: getattr(a, n) for n in FIELDS})  # until the advice decides (then fill_defaults)
    a.lr, a.epochs, a.batch_size = (first[n] for n in ("lr", "epochs", "batch_size"))
    names = ("private", "epsilon", "delta", "private_test", "model", "epochs", "batch_size", "lr", "momentum", "expected_size",
             "sampling_rate", "size_epsilon", "max_steps", "weight_decay", "seed", "clip", "clip_engine", "k", "public_examples",
             "power_iters", "groups", "clip_embedding", "clip_residual", "residual", "anchor_every", "anchor_warm", "anchor_batch",
             "physical_batch", "deterministic_noise", "insecure_seed", "classes", "rgp_rank", "rgp_warmup", "topk_fraction",
             "sparsify", "weights", "peft", "public_epochs", "public_lr", "public_batch_size", "public_val", "public_patience",
             "public_augment", "probe_stage1")
    fields = {n: getattr(a, n) for n in names}
    fields.update(method=a.method.value, params=list(a.params) if a.params else None, lr_schedule=a.lr_schedule.value,
                  accountant=a.accountant.value, batchnorm=a.batchnorm.value,
                  catalog=str(a.catalog_path.expanduser().resolve()) if a.catalog_path is not None else None)
    return fields, given


def _resumed(ctx, a, fields: dict, publics: list):
    """``--resume DIR``: the run's own settings, with those typed again (the training checks them)."""
    from ..train.config import resumed_config

    if a.out_dir is not None:
        raise GSDError("give either --out (a new run) or --resume (an interrupted one), not both")
    explicit = {n: fields[n] for n in fields if _source(ctx, "catalog_path" if n == "catalog" else n) in ("COMMANDLINE", "ENVIRONMENT")}
    if publics:
        explicit["public"] = publics[0]
    return resumed_config(a.resume, explicit)


def _candidates(a, publics: list) -> tuple:
    """``(catalogue or None, candidates)``: with --auto-select and no --public, the catalogue's candidates for the
    private set, else gsd rank's default candidates (the built-in public sets)."""
    cat = None
    if a.catalog_path is not None:
        from ..ranking.catalog import load_catalog, select_jobs

        cat = load_catalog(a.catalog_path)
        if a.auto_select and not publics:
            publics = list(select_jobs(cat, a.private)[0].candidates)
    if a.auto_select and len(publics) < 1:
        from ..defaults import DEFAULT_PUBLIC

        publics = list(DEFAULT_PUBLIC)
    return cat, publics


def _rank_options(a) -> dict:
    """--auto-select's ranking options. Public subspaces (the candidates' and the noise references') are functions of
    public data and settings: reused across runs from gsd's cache folder (gsd cache), as gsd rank does."""
    from ..ranking.cache import SubspaceCache
    from ..advice.select import RANK_MODEL

    opts = dict(k=a.rank_k, examples=a.rank_examples, seed=a.seed, model=a.rank_model or RANK_MODEL, device=a.device.value,
                cache=SubspaceCache())
    if (a.weights is not None or a.peft is not None) and a.rank_model is None:
        opts.update(model=a.model, weights=a.weights, peft=a.peft, batchnorm=a.batchnorm.value)  # GSD on exactly the parameters to be trained
    return opts


def _warm(ctx, a, fields: dict, publics: list) -> None:
    """--warm-cache: the advice's public work into gsd's cache (:func:`gsd_cli.advice.warm.warm_advice`), then stop: no
    run folder, nothing booked, no private example read."""
    from ..train import TrainConfig
    from ..train.config import validate
    from ..advice.warm import warm_advice

    if not a.auto_select or a.resume is not None or a.out_dir is not None:
        raise GSDError("--warm-cache prepares --auto-select's advice and trains nothing: give it with --auto-select, "
                       "without --out or --resume")
    cat, publics = _candidates(a, publics)
    check_auto_select(ctx, a.method.value, a.rank_k, a.rank_examples, a.rank_repeats, a.select_epsilon)
    cfg = TrainConfig(**fields, public=publics[0])
    validate(TrainConfig(**{**fields, "method": "gep"}, public=cfg.public) if cfg.method == "auto" else cfg)
    report = with_progress(a.quiet, lambda pr: warm_advice(
        cfg, a.private, publics, probe_repeats=a.probe_repeats, rank_repeats=a.rank_repeats, catalog=cat, classes=a.classes,
        progress=pr, dp=a.select_epsilon is not None, **_rank_options(a)),
        doing=f"--warm-cache: stage 1 and the public subspaces of {len(publics)} candidate(s) into gsd's cache (minutes on a CPU)...")
    out.print(escape(report.line()), highlight=False, soft_wrap=True)


def _new_run(ctx, a, fields: dict, publics: list, held: ExitStack):
    """A new run: its settings checked, its folder locked in ``held`` (for the command's life) and the ledger ready,
    then (--auto-select) the advice decided. Returns ``(config, run folder, selection record or None)``."""
    from ..privacy.budget import ready_ledger
    from ..report.outputs import check_not_inputs, run_inputs
    from ..train import TrainConfig
    from ..train.config import validate
    from ..train.runlock import check_run_dir, lock_run
    from .common import catalog_inputs

    cat, publics = _candidates(a, publics)
    if not a.auto_select:
        warn_unused_rank(ctx)
    if a.auto_select:
        check_auto_select(ctx, a.method.value, a.rank_k, a.rank_examples, a.rank_repeats, a.select_epsilon)
    elif len(publics) > 1:
        raise GSDError("several --public sets: add --auto-select to rank them and train with the closest")
    cfg = TrainConfig(**fields, public=publics[0] if publics else None)
    run = new_run_dir(a.out_dir, "gsd-train")
    if cfg.method == "auto":  # checked as GEP with a public set until the ranking decides
        validate(TrainConfig(**{**fields, "method": "gep"}, public=cfg.public))
    else:
        validate(cfg)
        warn_unused(ctx, cfg.method)  # a setting of another method, given on the command line: said, not silently ignored
    check_run_dir(run)  # in use by another gsd train, or not empty: before the ranking, not after it
    check_not_inputs({"--out": run}, run_inputs([a.private, *publics], a.catalog_path, None, None) + catalog_inputs(a.catalog_path))
    held.enter_context(lock_run(run))  # created and locked (another gsd train's: exit 2), before the ledger and the ranking
    ready_ledger()  # the privacy ledger this run books into, before any work (exit 2 if unusable)
    selection = None
    if a.auto_select and a.select_epsilon is not None:  # --epsilon is the run's total: the selection's share comes off it
        from ..advice.dp_probe import split_budget

        cfg.epsilon = split_budget(a.epsilon, a.delta, a.select_epsilon)[0]  # the DP selection on GSD: pure, delta 0
        if uses_dp_probe(cfg.method, a.probe_repeats):
            chosen = dp_probe_selection(cfg, a.private, publics, private_test=a.private_test, catalog=cat,
                                        select_epsilon=a.select_epsilon, total=(a.epsilon, a.delta), fallback=a.fallback,
                                        device=a.device.value, quiet=a.quiet, classes=a.classes)
            if chosen is not None:
                cfg, selection = chosen
    if a.auto_select and selection is None:
        cfg, selection = _advised(a, cfg, publics, cat)
    return cfg, run, selection


def advice_line(publics: list) -> str:
    """What --auto-select's non-private advice is doing (said at its start under -q, which shows no progress)."""
    return (f"--auto-select: the feature probe and the ranking of {len(publics)} candidate(s) against the private set "
            "(minutes on a CPU; the decision follows)...")


def _advised(a, cfg, publics: list, cat):
    """--auto-select's ranking and advice (:func:`gsd_cli.advice.select.plan`), printed: a non-private selection's
    figures (statistics of the private data) on lines labelled private."""
    from ..report import print_ranking
    from ..report.table import left_out_lines
    from ..advice.decide import reference_line
    from ..train.config import validate
    from ..advice.select import plan

    opts = _rank_options(a)
    p = with_progress(a.quiet, lambda pr: plan(cfg, a.private, publics, fallback=a.fallback, select_epsilon=a.select_epsilon,
                                               rank_repeats=a.rank_repeats, probe_repeats=a.probe_repeats, private_test=a.private_test,
                                               catalog=cat, classes=a.classes, notify=warn, progress=pr, **opts),
                      private=True, doing=advice_line(publics))  # the ranking's time grows with the private set: labelled private
    tell = (lambda text: out.print(text, highlight=False, soft_wrap=True)) if p.public else partial(print_private, out)
    if len(p.ranking.results) or not (p.ranking.not_ranked or p.ranking.stopped):
        print_ranking(p.ranking, out if p.public else PrivateConsole(out))
    else:  # the feature probe went first and no candidate could be chosen: no table, nothing was ranked over every draw
        for line in left_out_lines(p.ranking):
            tell(escape(line))
    if p.ranking.references:
        tell(escape(reference_line(p.ranking)))
    if p.decision is not None:
        tell(escape(p.decision.message))
    if p.error:
        raise GSDError(p.error)
    if p.warning:  # as --help promises: the advice differs, is refused or (under --select-epsilon) absent
        warn(p.warning)
    cfg = p.config
    validate(cfg)
    if cfg.public is not None:
        shown = (f"DP energy distance, released {cfg.public_distance:.4f}, "
                 if cfg.public_distance is not None and p.public else "")  # non-private: in the private table
        out.print(f"training with [bold]{escape(cfg.public)}[/] ({shown}--method {cfg.method})")
    else:
        out.print(f"training without public data (--method {cfg.method})")
    return cfg, p.selection


def _report(summary: dict, cfg, run, a) -> None:
    from ..train.report import print_summary

    print_summary(summary, out)
    chosen_privately = summary.get("selection") is not None and not summary["selection"].get("privacy")  # its statistics: private-summary.json
    err.print(f"wrote {run}/summary.json ({'publishable' if summary.get('dp') else 'public settings; the run is NOT DP'}), "
              "private-summary.json, metrics.jsonl, curves.png (not publishable: test metrics of private data"
              + (", the selection's statistics" if chosen_privately else "") + "), checkpoint.safetensors"
              + (", stage1.safetensors" if cfg.method == "second-phase" else ""))
    if a.log:
        err.print(f"logged to {' and '.join(dict.fromkeys(a.log))} under {a.log_dir or run} (mlflow: $MLFLOW_TRACKING_URI when set)")


@app.command()
@with_options(TRAIN_OPTIONS)
def train(ctx: typer.Context, **options) -> None:
    """Train privately (DP-SGD, GEP, RGP, TopAgg, random sparsification, or the second phase then DP-SGD)
    with the chosen public data, writing checkpoints, metrics.jsonl, summary.json and curves.png to the run folder.

    Every step is a Poisson-subsampled Gaussian mechanism under add/remove-one neighbours, accounted with
    dp-accounting; lines that start with 'private:' carry private figures. Each method's privacy and every
    option in full: docs/train.md.
    """
    from ..timing import stage
    from ..train.runlock import lock_run
    from ..train.tuned import fill_defaults

    a = SimpleNamespace(**options)
    publics = public_names(a.public, a.extra)
    train_fn = _trainer(a)
    if a.data_root is not None:
        _use_data_root(ctx, a.data_root)
    fields, given = _fields(ctx, a)
    if a.warm_cache:
        return _warm(ctx, a, fields, publics)
    with ExitStack() as held:  # the run folder's lock (gsd_cli.train.runlock), from before the ledger to the end
        if a.resume is not None:
            cfg, run, selection = _resumed(ctx, a, fields, publics), a.resume, None  # reads the folder, writes nothing
            held.enter_context(lock_run(run, resume=True))
        else:
            cfg, run, selection = _new_run(ctx, a, fields, publics, held)
            fill_defaults(cfg, given)  # the decided method's tuned settings, where the user gave none (gsd_cli.train.tuned)
        with stage("training"):  # its stage 1 apart: "training's stage 1"
            summary = with_progress(a.quiet, lambda pr: train_fn(cfg, run, resume=a.resume is not None, device=a.device.value,
                                                                 progress=pr, selection=selection, notify=notify_note, nproc=a.nproc),
                                    width=8, eta=True, private=True)  # an epoch's time grows with N: progress lines are private
    if summary is not None:  # None: a process other than 0 of a distributed run (process 0 writes and reports)
        _report(summary, cfg, run, a)
