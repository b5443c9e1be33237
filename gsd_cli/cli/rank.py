"""``gsd rank``: one call of ``gsd_cli.rank`` (or of a catalogue's jobs), its tables, files and checks."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from ..defaults import DEFAULT_PRIVATE, DEFAULT_PUBLIC
from ..errors import GSDError
from .app import app
from .common import err, out, print_error, progress_bar, public_names
from .options import (
    MODEL_FORMS, BatchNorm, Device, DpRepeats, Engine, Labels, RowNorm, batchnorm_option, classes_option, data_root_option, device_option, extra_argument,
    insecure_seed_option, json_option, force_option, peft_option, public_list_option, quiet_option, weights_option,
)


def _any_dp_job(catalog: Path) -> bool:
    """Whether a catalogue has a DP job (its progress is then labelled private); False for one that does
    not load (the run reports its error)."""
    from ..ranking.catalog import load_catalog

    try:
        return any(bool(job.options.get("dp")) for job in load_catalog(catalog).jobs)
    except GSDError:
        return False


def with_references(wanted: bool, dp: bool, config, private) -> list:
    """``gsd rank --references``: the noise references of :mod:`gsd_cli.data.reference` at the ranking
    model's input (refused under --dp: a private selection's references are auto-select's affair)."""
    if not wanted:
        return []
    if dp:
        raise GSDError("--references compares a non-private ranking with noise; under --dp use gsd train --auto-select --select-epsilon")
    from ..data.reference import reference_sources
    from ..models.spec import resolve_model

    spec = resolve_model(config.model.model)
    m = config.gradients.examples or len(private)
    return reference_sources(spec.input_size, spec.channels, m, private.num_classes, config.seed)


@app.command()
def rank(
    private: str = typer.Option(DEFAULT_PRIVATE, "--private", help="Private dataset: a name (gsd datasets list), folder:PATH, csv:PATH, npz:PATH or hf:PATH, with :train or :test."),
    public: Optional[List[str]] = public_list_option(
        f"Public candidates, repeated or listed after it (default: {' '.join(DEFAULT_PUBLIC)})."
    ),
    references: bool = typer.Option(False, "--references", help="Rank noise references beside the candidates and say which are closer than noise (not with --dp or --catalog)."),
    k: int = typer.Option(16, "--k", "-k", help="Gradient subspace dimension (paper 004 uses 16)."),
    examples: int = typer.Option(2000, "--examples", "-m", help="Examples per dataset (all of a smaller set)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and draws (under --dp, public ones only)."),
    insecure_seed: Optional[int] = insecure_seed_option("the --dp draws"),
    classes: Optional[str] = classes_option(),
    model: str = typer.Option("probe", "--model", help="Model: probe, fmnist-cnn, resnet20, resnet50" + MODEL_FORMS),
    batchnorm: BatchNorm = batchnorm_option("freeze"),
    params: Optional[List[str]] = typer.Option(
        None, "--params", help="Glob patterns of the parameters that get gradients, e.g. 'fc.*' (default: all trainable)."
    ),
    weights: Optional[str] = weights_option(),
    peft: Optional[str] = peft_option(),
    labels: Labels = typer.Option(
        Labels.random, "--labels", help="random: uniform, as the authors do; own: the datasets' labels."
    ),
    row_norm: RowNorm = typer.Option(
        RowNorm.unit, "--row-norm",
        help="unit: each per-sample gradient scaled to norm 1 (the authors' experiment code); none: raw (the authors' demo notebook).",
    ),
    device: Device = device_option(),
    chunk_size: Optional[int] = typer.Option(None, "--chunk-size", help="Examples per gradient chunk (default: 64 on CPU, 256 on CUDA)."),
    engine: Engine = typer.Option(Engine.auto, "--engine", help="Per-sample gradient engine (auto: layers, else vmap)."),
    json_path: Optional[Path] = json_option("Write the ranking as JSON to this file."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write the ranking as CSV to this file."),
    dp: bool = typer.Option(
        False, "--dp",
        help="A pure epsilon-DP ranking, one release for all candidates: the DP selection, or --metric dp-energy or dp-gsd.",
    ),
    top: int = typer.Option(1, "--top", help="With --dp: how many candidates to choose."),
    regret_clip: float = typer.Option(0.02, "--regret-clip", help="With --dp: clip of each private row's shortfall, in C^2."),
    score_share: float = typer.Option(0.5, "--score-share", help="With --dp: the share of --epsilon for the scores."),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="With --dp: the privacy budget (> 0)."),
    clip: float = typer.Option(1.0, "--clip", help="With --dp: per-sample clip norm C."),
    mechanism: str = typer.Option(
        "sequential", "--mechanism",
        help="DP-GSD: sequential (pure DP) or matrix (NO proven guarantee).",
    ),
    gibbs_sweeps: int = typer.Option(10, "--gibbs-sweeps", help="With --mechanism matrix: Gibbs sweeps."),
    dp_sketch: Optional[str] = typer.Option(
        None, "--dp-sketch", metavar="D|public[+R]|none",
        help="Project the gradients to D random dimensions, or (public, with --dp) onto the candidates' subspaces plus R random ones.",
    ),
    repeats: int = typer.Option(
        1, "--repeats", "-R",
        help="Independent repeats (R > 1: intervals and a tie test).",
    ),
    dp_repeats: Optional[DpRepeats] = typer.Option(
        None, "--dp-repeats",
        help="With --dp and --repeats: shared (default, one private DP sample) or fresh (one per repeat, R x --epsilon).",
    ),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of each candidate's distances with their intervals."),
    gram: str = typer.Option(
        "auto", "--gram",
        help="materialize, ghost (Gram matrices) or auto (--memory-budget).",
    ),
    memory_budget: str = typer.Option("4G", "--memory-budget", help="Memory the gradient work may use (e.g. 512M)."),
    subspace_method: str = typer.Option(
        "auto", "--subspace-method",
        help="Top-k subspaces: exact, randomized (certified) or auto.",
    ),
    quiet: bool = quiet_option("No progress bar."),
    data_root: Optional[Path] = data_root_option(
        "Folder of the built-in datasets such as cifar10 (default: $GSD_DATA_ROOT, else $XDG_DATA_HOME/gsd).",
    ),
    download: bool = typer.Option(False, "--download", help="Let torchvision download its datasets into the data root."),
    catalog: Optional[Path] = typer.Option(
        None, "--catalog", help="Run the jobs of this TOML catalogue (all, or those whose private dataset is --private)."
    ),
    fail_fast: bool = typer.Option(
        False, "--fail-fast", help="With --catalog: stop at the first job that fails (default: run the others, exit 2 at the end)."
    ),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", help="Write the ranking(s) as a Markdown table to this file."),
    force: bool = force_option(),
    fail_above: Optional[float] = typer.Option(None, "--fail-above", help="Exit 1 when the best distance is above this."),
    expect_best: Optional[str] = typer.Option(None, "--expect-best", help="Exit 1 when another candidate ranks first."),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Recompute every public subspace, not reusing the cache."
    ),
    executor: str = typer.Option(
        "local", "--executor", help="Where public subspaces run: local or ray ('gsd-cli[ray]')."
    ),
    metric: str = typer.Option(
        "gsd", "--metric", help="The distance: gsd, dp-energy or dp-gsd (with --dp), or a baseline: otdd ('gsd-cli[ot]'), frechet, task2vec, logme."
    ),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", help="With --executor ray: the cluster (default: $RAY_ADDRESS, else a local Ray instance)."
    ),
    log: Optional[List[str]] = typer.Option(
        None, "--log", help="Also log each ranking to tensorboard or mlflow (or both)."
    ),
    log_dir: Path = typer.Option(Path("."), "--log-dir", help="With --log: the folder of tb/ and mlruns/."),
    extra: Optional[List[str]] = extra_argument(),
    ctx: typer.Context = typer.Option(None, hidden=True),
) -> None:
    """Rank public datasets by their Gradient Subspace Distance to the private one (lowest first).

    With no options, ranks the embedded public candidates for the embedded private task (MNIST-5k half A).
    Exit codes: 0 ok, 1 a check (--fail-above, --expect-best) failed, 2 bad usage or input. Every option in
    full: docs/rank.md.
    """
    from ..ranking.cache import SubspaceCache
    from ..ranking.catalog import OPTIONS, run_jobs, run_json, run_markdown, write_partial
    from ..ranking.checks import EXIT_CHECK_FAILED, EXIT_USAGE, check_options, check_ranking
    from ..report.outputs import check_distinct, check_not_example_files, check_not_inputs, is_stdout, run_inputs
    from .common import catalog_inputs
    from ..data import resolve
    from ..ranking import RankConfig, get_executor, rank as rank_fn
    from ..report import (
        check_output_path, check_plot_path, jobs_to_csv, print_ranking, print_repeats, to_markdown,
        write_csv, write_json, write_plot, write_repeats_csv, write_text,
    )

    publics = public_names(public, extra)
    from ..integrations.tracking import check_backends, log_ranking, track_catalog  # gsd_cli.integrations.tracking: --log, --log-dir

    log = check_backends(log)  # a missing extra fails before any work
    if not dp and epsilon is not None:
        raise GSDError("--epsilon is only used with --dp; add --dp for DP-GSD")
    if dp_repeats is not None and not dp:
        raise GSDError("--dp-repeats is only used with --dp; add --dp for DP-GSD")
    if insecure_seed is not None and not dp:
        raise GSDError("--insecure-seed seeds DP-GSD's private randomness; it is only used with --dp")
    if ray_address is not None and executor != "ray":
        raise GSDError("--ray-address is only used with --executor ray; add --executor ray")
    if catalog is not None and publics:
        raise GSDError("--catalog takes its candidates from the catalogue; drop --public (or drop --catalog)")
    from ..distance.registry import metric_distance

    distance = metric_distance(metric, dp)  # gsd_cli.rank(..., distance=NAME); a baseline is refused with --dp
    if distance is not None and catalog is not None:
        raise GSDError("--metric with --catalog is not supported; rank one private set with --private and --public")

    plot_file = check_plot_path(plot_path, force)
    json_file = check_output_path(json_path, "--json", force)
    csv_file = check_output_path(csv_path, "--csv", force)
    md_file = check_output_path(markdown_path, "--markdown", force)
    outputs = {"--json": json_file, "--csv": csv_file, "--markdown": md_file, "--plot": plot_file}
    check_distinct(outputs)
    check_not_inputs(outputs, run_inputs([private, *publics], catalog, weights, model) + catalog_inputs(catalog))  # before any work
    check_options(fail_above, expect_best)
    shown_on = err if any(is_stdout(f) for f in (json_file, csv_file, md_file, plot_file)) else out  # stdout is a file
    cache = None if no_cache else SubspaceCache()
    runner = get_executor(executor, **({"address": ray_address} if ray_address else {}))  # gsd_cli.ranking.get_executor
    dp_times = dp or (catalog is not None and _any_dp_job(catalog))
    if dp_times:  # the privacy ledger the DP draws book into, before any data is read (exit 2 if unusable)
        from ..privacy.budget import ready_ledger

        ready_ledger()
    bar, progress = progress_bar(quiet, private=dp_times)  # under DP the times (and so the plain lines) are private

    for name, what in (("mechanism", "DP-GSD's sampler"), ("gibbs_sweeps", "the matrix sampler's sweeps"), ("clip", "the private rows' clip norm")):
        if not dp and catalog is None and getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE":
            raise GSDError(f"--{name.replace('_', '-')} is only used with --dp ({what}); add --dp (and --epsilon), or drop it")
    options = dict(
        k=k, examples=examples, seed=seed, model=model, params=params, labels=labels.value, row_norm=row_norm.value,
        device=device.value, chunk_size=chunk_size, engine=engine.value, dp=dp, epsilon=epsilon, clip=clip,
        mechanism=mechanism, dp_sketch=dp_sketch, gibbs_sweeps=gibbs_sweeps, gram=gram, memory_budget=memory_budget,
        subspace_method=subspace_method,
        repeats=repeats, dp_repeats=(dp_repeats or DpRepeats.shared).value, insecure_seed=insecure_seed, classes=classes,
    )
    options.update(top=top, regret_clip=regret_clip, score_share=score_share)  # the DP selection's settings
    for name in ("top", "regret_clip", "score_share"):
        if not dp and catalog is None and ctx.get_parameter_source(name).name == "COMMANDLINE":
            raise GSDError(f"--{name.replace('_', '-')} is a setting of the DP selection; add --dp (and --epsilon)")
    options.update(weights=weights, peft=peft, batchnorm=batchnorm.value)
    if distance is not None:
        options.update(distance=distance)
    try:
        if catalog is None:
            sources = [resolve(n, root=data_root, download=download) for n in [private, *(publics or DEFAULT_PUBLIC)]]
            check_not_example_files(outputs, sources)  # a CSV's images may live anywhere
            config = RankConfig.from_options(**options)  # the settings, built once and passed whole
            check_options(fail_above, expect_best, [*(publics or DEFAULT_PUBLIC), *(s.name for s in sources[1:])])
            from ..ranking.reference import closer_than_noise, reference_line, split_references

            refs = with_references(references, dp, config, sources[0])
            results = [(private, rank_fn(sources[0], [*sources[1:], *refs], config, progress=progress, cache=cache, executor=runner))]
            verdicts = closer_than_noise(results[0][1]) if refs else {}
            if refs:
                split_references(results[0][1])
            checks = [{}]
            log_ranking(results[0][1], private, log, log_dir)
        else:
            given = {o: options[o] for o in OPTIONS if ctx.get_parameter_source(o).name == "COMMANDLINE"}
            picked = private if ctx.get_parameter_source("private").name == "COMMANDLINE" else None
            ran = run_jobs(  # each finished job is kept: the outputs are rewritten after each
                catalog, picked, download=download, overrides=given, fail_fast=fail_fast, progress=progress, cache=cache, executor=runner,
                on_job=track_catalog(log, log_dir, lambda run: write_partial(run, json_file, csv_file, md_file, fail_above, expect_best)))
            results = [(job.name, rk) for job, rk in ran.results]
            checks = [job.checks for job, _ in ran.results]
    finally:
        bar.stop()
        if hasattr(runner, "close"):
            runner.close()
    failures = []
    many = bool(results) and getattr(results[0][1], "repeats", 1) > 1
    for (_, result), job_checks in zip(results, checks):
        if getattr(result, "repeats", 1) > 1:
            print_repeats(result, shown_on)
        else:
            print_ranking(result, shown_on)
        if getattr(result, "references", None):
            shown_on.print(escape(reference_line(result)), highlight=False, soft_wrap=True)
            for name, (closer, how) in verdicts.items():
                shown_on.print(escape(f"{name}: {'closer than noise' if closer else 'not shown closer than noise'} ({how})"),
                               highlight=False, soft_wrap=True)
        failures += check_ranking(
            result,
            fail_above if fail_above is not None else job_checks.get("fail_above"),
            expect_best if expect_best is not None else job_checks.get("expect_best"),
        )
    if catalog is None and not many:
        shown_on.print("[dim]One draw: no interval and no tie test; --repeats 5 shows which candidates are tied.[/]")
    if catalog is not None:
        from ..ranking.catalog import catalog_privacy_total

        for tot in catalog_privacy_total(ran.results).values():  # what the DP jobs spent together, per private set
            shown_on.print(f"privacy total for {escape(tot['private'])}: epsilon={tot['total_epsilon']:.4g} over "
                           f"{len(tot['jobs'])} DP job(s) (basic composition)" + ("" if tot["dp"] else "; NOT DP (see each job)"),
                           highlight=False)
    if cache is not None and cache.hits and not quiet:
        err.print(f"cache: reused {cache.hits} public subspace(s) from {cache.directory}")
    rankings = [rk for _, rk in results]
    if json_file:
        write_json(rankings[0], json_file) if catalog is None else write_text(json_file, run_json(ran, failures))
        err.print(f"wrote {json_file}")
    if csv_file:
        if catalog is None:
            (write_repeats_csv if many else write_csv)(rankings[0], csv_file)
        else:
            write_text(csv_file, jobs_to_csv(results))
        err.print(f"wrote {csv_file}")
    if plot_file:
        if results:  # a catalogue whose every job failed has nothing to plot
            write_plot(rankings[0] if catalog is None else [(name, rk) for name, rk in results], plot_file)
            err.print(f"wrote {plot_file}")
    if md_file:
        has_checks = fail_above is not None or expect_best is not None or any(checks)
        shown = failures if has_checks else None
        write_text(md_file, to_markdown(rankings, shown) if catalog is None else run_markdown(ran, shown))
        err.print(f"wrote {md_file}")
    for f in failures:
        err.print(f"[bold red]check failed:[/] {escape(f)}", highlight=False, soft_wrap=True)
    if catalog is not None and ran.error_lines():  # a failed job (2) wins over a failed check (1)
        for line in ran.error_lines():
            print_error(line)
        raise typer.Exit(EXIT_USAGE)
    if failures:
        raise typer.Exit(EXIT_CHECK_FAILED)
