"""``gsd rank``: one call of ``gsd_cli.rank`` (or of a catalogue's jobs), its tables, files and checks."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import typer
from rich.markup import escape

from ..defaults import DEFAULT_PUBLIC
from ..errors import GSDError
from .app import app
from .common import err, out, print_error, progress_bar, public_names
from .options import DpRepeats, with_options
from .rank_options import RANK_OPTIONS


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


#: the options only a DP ranking reads, and what each is (said when given without --dp): by value (given at all)...
DP_ONLY_VALUES = {
    "epsilon": "--epsilon is only used with --dp; add --dp for DP-GSD",
    "dp_repeats": "--dp-repeats is only used with --dp; add --dp for DP-GSD",
    "insecure_seed": "--insecure-seed seeds DP-GSD's private randomness; it is only used with --dp",
}
#: ... and typed on the command line (they have defaults), checked where no catalogue job may set --dp
DP_ONLY_TYPED = {
    "mechanism": "--mechanism is only used with --dp (DP-GSD's sampler); add --dp (and --epsilon), or drop it",
    "gibbs_sweeps": "--gibbs-sweeps is only used with --dp (the matrix sampler's sweeps); add --dp (and --epsilon), or drop it",
    "clip": "--clip is only used with --dp (the private rows' clip norm); add --dp (and --epsilon), or drop it",
    "top": "--top is a setting of the DP selection; add --dp (and --epsilon)",
    "regret_clip": "--regret-clip is a setting of the DP selection; add --dp (and --epsilon)",
    "score_share": "--score-share is a setting of the DP selection; add --dp (and --epsilon)",
}


def _typed(ctx, name: str) -> bool:
    return getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"


def _check(ctx, a, publics: list):
    """The options' combinations, before any work: one line (exit 2) for the first that cannot work. Returns the
    ``--metric``'s registered distance (None: the default)."""
    from ..distance.registry import metric_distance

    for name, message in DP_ONLY_VALUES.items():
        if not a.dp and getattr(a, name) is not None:
            raise GSDError(message)
    if a.ray_address is not None and a.executor != "ray":
        raise GSDError("--ray-address is only used with --executor ray; add --executor ray")
    if a.catalog is not None and publics:
        raise GSDError("--catalog takes its candidates from the catalogue; drop --public (or drop --catalog)")
    distance = metric_distance(a.metric, a.dp)  # gsd_cli.rank(..., distance=NAME); a baseline is refused with --dp
    if distance is not None and a.catalog is not None:
        raise GSDError("--metric with --catalog is not supported; rank one private set with --private and --public")
    return distance


def _outputs(a, publics: list) -> dict:
    """The output files (``--json``, ``--csv``, ``--markdown``, ``--plot``), checked: writable, distinct, not an input,
    not an existing file without ``--force``."""
    from ..ranking.checks import check_options
    from ..report import check_output_path, check_plot_path
    from ..report.outputs import check_distinct, check_not_inputs, run_inputs
    from .common import catalog_inputs

    plot_file = check_plot_path(a.plot_path, a.force)
    outputs = {"--json": check_output_path(a.json_path, "--json", a.force), "--csv": check_output_path(a.csv_path, "--csv", a.force),
               "--markdown": check_output_path(a.markdown_path, "--markdown", a.force), "--plot": plot_file}
    check_distinct(outputs)
    check_not_inputs(outputs, run_inputs([a.private, *publics], a.catalog, a.weights, a.model) + catalog_inputs(a.catalog))  # before any work
    check_options(a.fail_above, a.expect_best)
    return outputs


def _options(ctx, a, distance) -> dict:
    """The ranking's flat options (:meth:`gsd_cli.ranking.RankConfig.from_options`); a DP-only setting typed without
    --dp (and no catalogue) is one line."""
    for name, message in DP_ONLY_TYPED.items():
        if not a.dp and a.catalog is None and _typed(ctx, name):
            raise GSDError(message)
    names = ("k", "examples", "seed", "model", "params", "chunk_size", "dp", "epsilon", "clip", "mechanism", "dp_sketch", "gibbs_sweeps",
             "gram", "memory_budget", "subspace_method", "repeats", "insecure_seed", "classes", "top", "regret_clip", "score_share",
             "weights", "peft")
    options = {n: getattr(a, n) for n in names}
    options.update(labels=a.labels.value, row_norm=a.row_norm.value, device=a.device.value, engine=a.engine.value,
                   dp_repeats=(a.dp_repeats or DpRepeats.shared).value, batchnorm=a.batchnorm.value)
    if distance is not None:
        options.update(distance=distance)
    return options


def _rank_one(a, publics: list, options: dict, outputs: dict, progress, cache, runner):
    """One private set against its candidates (:func:`gsd_cli.ranking.rank`), with ``--references``: ``(results,
    checks, verdicts)``."""
    from ..data import resolve
    from ..integrations.tracking import log_ranking
    from ..ranking import RankConfig, rank as rank_fn
    from ..ranking.checks import check_options
    from ..ranking.reference import closer_than_noise, split_references
    from ..report.outputs import check_not_example_files

    sources = [resolve(n, root=a.data_root, download=a.download) for n in [a.private, *(publics or DEFAULT_PUBLIC)]]
    check_not_example_files(outputs, sources)  # a CSV's images may live anywhere
    config = RankConfig.from_options(**options)  # the settings, built once and passed whole
    check_options(a.fail_above, a.expect_best, [*(publics or DEFAULT_PUBLIC), *(s.name for s in sources[1:])])
    refs = with_references(a.references, a.dp, config, sources[0])
    ranking = rank_fn(sources[0], [*sources[1:], *refs], config, progress=progress, cache=cache, executor=runner)
    verdicts = closer_than_noise(ranking) if refs else {}
    if refs:
        split_references(ranking)
    log_ranking(ranking, a.private, a.log, a.log_dir)
    return [(a.private, ranking)], [{}], verdicts


def _rank_catalog(ctx, a, options: dict, outputs: dict, progress, cache, runner):
    """A catalogue's jobs (:func:`gsd_cli.ranking.catalog.run_jobs`), each finished one written at once: ``(results,
    checks, run)``."""
    from ..integrations.tracking import track_catalog
    from ..ranking.catalog import OPTIONS, run_jobs
    from ..report.catalog_files import write_partial

    given = {o: options[o] for o in OPTIONS if _typed(ctx, o)}
    picked = a.private if _typed(ctx, "private") else None
    files = (outputs["--json"], outputs["--csv"], outputs["--markdown"])
    ran = run_jobs(  # each finished job is kept: the outputs are rewritten after each
        a.catalog, picked, download=a.download, overrides=given, fail_fast=a.fail_fast, progress=progress, cache=cache, executor=runner,
        on_job=track_catalog(a.log, a.log_dir, lambda run: write_partial(run, *files, a.fail_above, a.expect_best)))
    return [(job.name, rk) for job, rk in ran.results], [job.checks for job, _ in ran.results], ran


def _show(a, results, checks, verdicts, shown_on, ran) -> list[str]:
    """Each ranking's table (and references), the checks' failures (returned), the catalogue's privacy totals."""
    from ..ranking.checks import check_ranking
    from ..ranking.reference import reference_line
    from ..report import print_ranking, print_repeats

    failures = []
    for (_, result), job_checks in zip(results, checks):
        (print_repeats if getattr(result, "repeats", 1) > 1 else print_ranking)(result, shown_on, validity=a.validity)
        if getattr(result, "references", None):
            shown_on.print(escape(reference_line(result)), highlight=False, soft_wrap=True)
            for name, (closer, how) in verdicts.items():
                shown_on.print(escape(f"{name}: {'closer than noise' if closer else 'not shown closer than noise'} ({how})"),
                               highlight=False, soft_wrap=True)
        failures += check_ranking(result, a.fail_above if a.fail_above is not None else job_checks.get("fail_above"),
                                  a.expect_best if a.expect_best is not None else job_checks.get("expect_best"))
    if a.catalog is None and not (bool(results) and getattr(results[0][1], "repeats", 1) > 1):
        shown_on.print("[dim]One draw: no interval and no tie test; --repeats 5 shows which candidates are tied.[/]")
    if a.catalog is not None:
        from ..report.catalog_files import catalog_privacy_total

        for tot in catalog_privacy_total(ran.results).values():  # what the DP jobs spent together, per private set
            shown_on.print(f"privacy total for {escape(tot['private'])}: epsilon={tot['total_epsilon']:.4g} over "
                           f"{len(tot['jobs'])} DP job(s) (basic composition)" + ("" if tot["dp"] else "; NOT DP (see each job)"),
                           highlight=False)
    return failures


def _write(a, outputs: dict, results, checks, failures, ran) -> None:
    """The files asked for (``--json``, ``--csv``, ``--plot``, ``--markdown``), each said on stderr."""
    from ..report.catalog_files import run_json, run_markdown
    from ..report import jobs_to_csv, to_markdown, write_csv, write_json, write_plot, write_repeats_csv, write_text

    rankings = [rk for _, rk in results]
    many = bool(results) and getattr(results[0][1], "repeats", 1) > 1
    json_file, csv_file, md_file, plot_file = (outputs[k] for k in ("--json", "--csv", "--markdown", "--plot"))
    if json_file:
        write_json(rankings[0], json_file) if a.catalog is None else write_text(json_file, run_json(ran, failures))
        err.print(f"wrote {json_file}")
    if csv_file:
        if a.catalog is None:
            (write_repeats_csv if many else write_csv)(rankings[0], csv_file)
        else:
            write_text(csv_file, jobs_to_csv(results))
        err.print(f"wrote {csv_file}")
    if plot_file and results:  # a catalogue whose every job failed has nothing to plot
        write_plot(rankings[0] if a.catalog is None else [(name, rk) for name, rk in results], plot_file)
        err.print(f"wrote {plot_file}")
    if md_file:
        shown = failures if (a.fail_above is not None or a.expect_best is not None or any(checks)) else None
        write_text(md_file, to_markdown(rankings, shown) if a.catalog is None else run_markdown(ran, shown))
        err.print(f"wrote {md_file}")


@app.command()
@with_options(RANK_OPTIONS)
def rank(ctx: typer.Context, **options) -> None:
    """Rank public datasets by their Gradient Subspace Distance to the private one (lowest first).

    With no options, ranks the embedded public candidates for the embedded private task (MNIST-5k half A).
    Exit codes: 0 ok, 1 a check (--fail-above, --expect-best) failed, 2 bad usage or input. Every option in
    full: docs/rank.md.
    """
    from ..integrations.tracking import check_backends
    from ..ranking import get_executor
    from ..ranking.cache import SubspaceCache
    from ..ranking.checks import EXIT_CHECK_FAILED, EXIT_USAGE
    from ..report.outputs import is_stdout

    a = SimpleNamespace(**options)
    publics = public_names(a.public, a.extra)
    a.log = check_backends(a.log)  # a missing extra fails before any work
    distance = _check(ctx, a, publics)
    outputs = _outputs(a, publics)
    shown_on = err if any(is_stdout(f) for f in outputs.values()) else out  # stdout is a file
    cache = None if a.no_cache else SubspaceCache()
    runner = get_executor(a.executor, **({"address": a.ray_address} if a.ray_address else {}))  # gsd_cli.ranking.get_executor
    dp_times = a.dp or (a.catalog is not None and _any_dp_job(a.catalog))
    if dp_times:  # the privacy ledger the DP draws book into, before any data is read (exit 2 if unusable)
        from ..privacy.budget import ready_ledger

        ready_ledger()
    bar, progress = progress_bar(a.quiet, private=dp_times)  # under DP the times (and so the plain lines) are private
    verdicts, ran = {}, None
    try:
        opts = _options(ctx, a, distance)
        if a.catalog is None:
            results, checks, verdicts = _rank_one(a, publics, opts, outputs, progress, cache, runner)
        else:
            results, checks, ran = _rank_catalog(ctx, a, opts, outputs, progress, cache, runner)
    finally:
        bar.stop()
        if hasattr(runner, "close"):
            runner.close()
    failures = _show(a, results, checks, verdicts, shown_on, ran)
    if cache is not None and cache.hits and not a.quiet:
        err.print(f"cache: reused {cache.hits} public subspace(s) from {cache.directory}")
    _write(a, outputs, results, checks, failures, ran)
    for f in failures:
        err.print(f"[bold red]check failed:[/] {escape(f)}", highlight=False, soft_wrap=True)
    if ran is not None and ran.error_lines():  # a failed job (2) wins over a failed check (1)
        for line in ran.error_lines():
            print_error(line)
        raise typer.Exit(EXIT_USAGE)
    if failures:
        raise typer.Exit(EXIT_CHECK_FAILED)
