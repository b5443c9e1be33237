"""``gsd audit``: one call of ``gsd_cli.audit.audit``, its table and ``--json``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import typer

from .app import app
from .common import err, out
from .options import force_option, insecure_seed_option


#: upper bounds of the audit's sizes (each is far above what a tight audit needs: README, Privacy audit)
MAX_STEPS, MAX_EXAMPLES, MAX_STEP_TRIALS = 100_000, 1_000_000, 10_000_000
#: the most draws per neighbour of ``--method dp-probe`` (each runs the mechanism end to end: 4 x 200,000 is about 15 minutes)
MAX_PROBE_DRAWS = 200_000


def _check_bounds(canaries: int, steps: int, examples: int, step_trials: int | None, synthetic: bool) -> None:
    """Refuse sizes that are negative, or that would run for days or not fit in memory, before any work."""
    from ..errors import GSDError
    from ..memory import check_fits

    if examples < 0 or examples > MAX_EXAMPLES:
        raise GSDError(f"--examples {examples}: give 0..{MAX_EXAMPLES:,} real examples beside the canaries")
    if steps > MAX_STEPS:
        raise GSDError(f"--steps {steps}: at most {MAX_STEPS:,} (each step is a full private step; 1 to a few "
                       "thousand steps is what a one-run audit uses)")
    if step_trials is not None and not 1 <= step_trials <= MAX_STEP_TRIALS:
        raise GSDError(f"--step-trials {step_trials}: give 1..{MAX_STEP_TRIALS:,} (200000 flags halved noise)")
    if synthetic and canaries > 0:  # the synthetic model is as wide as the canaries: per-example gradients c x (c + n)
        check_fits(8.0 * canaries * (canaries + examples), f"--canaries {canaries:,} (per-example gradients of the "
                   "audit model, which has one input per canary)", "give fewer --canaries (1000 to 20000 is usual)")


def _warn_unused(ctx, method: str) -> None:
    """One warning line naming the settings given on the command line that ``method`` does not use."""
    from rich.markup import escape

    from ..train.config import METHOD_SETTINGS, unused_note

    given = [n for n in (*METHOD_SETTINGS, "sparsify") if getattr(ctx.get_parameter_source(n), "name", None) == "COMMANDLINE"]
    if method in ("dpgsd", "dp-energy", "dp-select", "dp-probe"):  # a ranking's mechanism: only the row clip of the trainers' settings
        unused = [n for n in given if n != "clip" or method == "dp-probe"]  # the DP probe: none of them
        note = (f"{', '.join('--' + n.replace('_', '-') for n in unused)} {'is' if len(unused) == 1 else 'are'} not used by "
                f"--method {method} (settings of the trainers): ignored") if unused else None
    else:
        note = unused_note(method.removesuffix("+rs"), [n for n in given if n != "sparsify"])
        if "sparsify" in given and not method.endswith("+rs"):
            note = (note + "; " if note else "") + f"--sparsify is not used by --method {method} (a setting of the +rs methods): ignored"
    if method != "dp-probe" and getattr(ctx.get_parameter_source("models"), "name", None) == "COMMANDLINE":
        note = (note + "; " if note else "") + f"--models is not used by --method {method} (a setting of dp-probe): ignored"
    if note:
        err.print("[yellow]warning:[/] " + escape(note), highlight=False, soft_wrap=True)


def epsilon_text(epsilon: float, digits: int = 3) -> str:
    """An epsilon of the audit's output: ``digits`` decimals, or as many significant digits below 0.01 (a
    claim of 1e-9 is not 0.000)."""
    return f"{epsilon:.{digits}f}" if epsilon == 0 or abs(epsilon) >= 0.01 else f"{epsilon:.{digits}g}"


@app.command()
def audit(
    ctx: typer.Context,
    method: str = typer.Option(..., "--method", help="dpsgd, gep, rgp, topagg, second-phase (its DP-SGD stage 2), dpsgd+rs, gep+rs, dpgsd, dp-select (gsd rank --dp's default: the DP selection), dp-energy (--metric dp-energy's noisy order) or dp-probe (gsd train's DP feature probe, run end to end: its fit releases and its selection, each against its own claim)."),
    epsilon: float = typer.Option(2.0, "--epsilon", help="Claimed epsilon: the trainer's sigma is calibrated to it (dpgsd, dp-select, dp-energy: the ranking's epsilon; dp-probe: the probe's, as --select-epsilon)."),
    delta: float = typer.Option(1e-5, "--delta", help="Claimed delta (dpgsd, dp-select and dp-energy are pure DP: unused; dp-probe: its delta)."),
    canaries: int = typer.Option(1000, "--canaries", help="Gradient canaries (dpgsd, dp-select, dp-energy: the mechanism audit's draws under each neighbour; dp-probe: its end-to-end runs under each neighbour of each of its two pairs, default 5,000)."),
    models: int = typer.Option(4, "--models", help="dp-probe: the number of models M the probe chooses among (the untrained one and M - 1 candidates; 2 to 8)."),
    trials: Optional[int] = typer.Option(None, "--trials", help="dpgsd, dp-select, dp-energy: rankings per neighbour of the end-to-end audit of gsd rank --dp (3 tiny rankings a trial; default: the fewest that would flag a replayed pipeline at --epsilon, at most 100).", min=5, max=10000),
    steps: int = typer.Option(1, "--steps", help="Training steps of the audited run."),
    sampling_rate: float = typer.Option(1.0, "--sampling-rate", help="Poisson sampling rate q of every step."),
    examples: int = typer.Option(64, "--examples", help="Real (private or synthetic) examples beside the canaries (dp-select, dp-energy: rows of the pipeline audit's private file, at least 200)."),
    model: Optional[str] = typer.Option(None, "--model", help="Audit this probes model on --private (default: a Linear model on synthetic inputs)."),
    private: Optional[str] = typer.Option(None, "--private", help="Private dataset whose examples train beside the canaries (with --model)."),
    public: Optional[str] = typer.Option(None, "--public", help="gep with --model: the public anchor set."),
    clip: float = typer.Option(1.0, "--clip", help="dpsgd, rgp, topagg: clip norm C; dpgsd, dp-select, dp-energy: row clip."),
    clip_embedding: float = typer.Option(1.0, "--clip-embedding", help="gep: S1 (as gsd train's default)."),
    clip_residual: float = typer.Option(0.5, "--clip-residual", help="gep: S2 (as gsd train's default)."),
    k: int = typer.Option(16, "--k", help="gep: anchor subspace dimension."),
    rgp_rank: int = typer.Option(4, "--rgp-rank", help="rgp: carrier rank r."),
    topk_fraction: float = typer.Option(0.7, "--topk-fraction", help="topagg: K."),
    sparsify: float = typer.Option(0.5, "--sparsify", help="+rs methods: final sparsification rate."),
    accountant: str = typer.Option("rdp", "--accountant", help="rdp or pld."),
    seed: int = typer.Option(0, "--seed", help="Public randomness: synthetic inputs, anchors, masks, carriers."),
    insecure_seed: Optional[int] = insecure_seed_option("which canaries are in, the sampling and the noise"),
    step_trials: Optional[int] = typer.Option(
        None, "--step-trials",
        help="dpsgd, second-phase: instead of the one-run audit, release one full-batch step this many times on D and on "
        "D + one canary and bound epsilon by a threshold test (tight enough to flag halved noise; e.g. 200000).",
    ),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the result as JSON to this file (- for stdout)."),
    force: bool = force_option(),
) -> None:
    """Audit a private trainer or DP-GSD empirically: a lower bound on epsilon at 95% confidence
    (Steinke, Nasr, Jagielski 2023 one-run canary audit; DP-GSD: a distinguishing test), beside the
    claimed epsilon. A lower bound above the claim is a privacy bug (exit 1); one below it proves nothing."""
    from ..errors import GSDError
    from ..report.outputs import check_not_inputs, check_output_path, run_inputs, write_output

    json_file = check_output_path(json_path, "--json", force)
    check_not_inputs({"--json": json_file}, run_inputs([d for d in (private, public) if d], None, None, model))
    if private is not None and model is None:
        raise GSDError("--private needs --model (the model trained on it)")
    if method == "dp-probe":
        canaries = _probe_draws(ctx, canaries)
    _check_bounds(canaries, steps, examples, step_trials, model is None and method != "dp-probe")
    _warn_unused(ctx, method)  # another method's setting, given: said, not silently ignored
    options = SimpleNamespace(
        method=method, epsilon=epsilon, delta=delta, canaries=canaries, trials=trials, steps=steps, sampling_rate=sampling_rate,
        examples=examples, model=model, private=private, public=public, clip=clip, clip_embedding=clip_embedding,
        clip_residual=clip_residual, k=k, rgp_rank=rgp_rank, topk_fraction=topk_fraction, sparsify=sparsify,
        accountant=accountant, seed=seed, insecure_seed=insecure_seed, step_trials=step_trials, models=models,
    )
    result = _run_audit(options)
    # a distinguishing test (DP-GSD, the DP energy distance, the DP selection, --step-trials) draws releases under
    # each of two neighbours and classifies each draw: its counts are draws, not canaries
    _print_result(result, method, epsilon, delta, distinguishing=step_trials is not None or method in _DISTINGUISHING)
    if insecure_seed is not None:
        err.print(f"--insecure-seed {insecure_seed}: repeatable audit (its randomness is not secret)")
    if json_file is not None:
        write_output(json_file, json.dumps(result.to_dict(), indent=2, default=float) + "\n")
        err.print(f"wrote {json_file}")
    if not result.consistent:  # PRIVACY BUG: a failed check, as gsd rank --catalog's (the JSON is written first)
        from ..ranking.checks import EXIT_CHECK_FAILED

        raise typer.Exit(EXIT_CHECK_FAILED)


def _probe_draws(ctx, canaries: int) -> int:
    """``--method dp-probe``'s draws per neighbour: ``--canaries`` as given, or (not given)
    :data:`gsd_cli.audit.dpprobe.DRAWS`; at most :data:`MAX_PROBE_DRAWS` (each draw runs the mechanism)."""
    from ..audit.dpprobe import DRAWS
    from ..errors import GSDError

    if getattr(ctx.get_parameter_source("canaries"), "name", None) != "COMMANDLINE":
        canaries = DRAWS  # each draw runs the whole mechanism (about a millisecond): 5,000 per neighbour and pair
    if canaries > MAX_PROBE_DRAWS:
        raise GSDError(f"--canaries {canaries}: the DP probe audit takes at most {MAX_PROBE_DRAWS:,} draws per neighbour "
                       "(each runs the whole mechanism, about a millisecond; 5,000 flag the three mutants of its docs)")
    return canaries


def _dpgsd_kwargs(o: SimpleNamespace) -> dict:
    """``--method dpgsd``: the sampler's row clip and the pipeline audit's trials."""
    return {"clip": o.clip, "trials": o.trials}


def _probe_kwargs(o: SimpleNamespace) -> dict:
    """``--method dp-probe``: its number of models (beyond epsilon, delta, draws and the seed)."""
    return {"models": o.models}


def _energy_kwargs(o: SimpleNamespace) -> dict:
    """``--method dp-energy`` and ``dp-select``: row clip, trials and the pipeline audit's rows."""
    return {"clip": o.clip, "trials": o.trials, "examples": max(o.examples, 200)}  # clamped releases need a few hundred rows


def _trainer_kwargs(o: SimpleNamespace) -> dict:
    """The trainers (dpsgd, gep, rgp, topagg, second-phase, the +rs methods): their training settings and
    the run's sizes; with ``--model``, the real model on ``--private`` examples, booked in the privacy
    ledger."""
    from ..errors import GSDError

    settings = {"clip": o.clip, "clip_embedding": o.clip_embedding, "clip_residual": o.clip_residual, "k": o.k, "rgp_rank": o.rgp_rank,
                "rgp_warmup": 0, "topk_fraction": o.topk_fraction, "accountant": o.accountant, "seed": o.seed}
    if o.method.endswith("+rs"):
        settings["sparsify"] = o.sparsify
    kw = {"settings": settings, "steps": o.steps, "sampling_rate": o.sampling_rate, "examples": o.examples}
    if o.model is not None:
        from ..audit import audit_config
        from ..audit.setup import real_setup

        if o.private is None:
            raise GSDError("--model needs --private (the data it trains on)")
        cfg = audit_config(o.method, o.epsilon, o.delta, **settings, model=o.model, private=o.private, public=o.public)
        m, names, data, public_x, classes = real_setup(cfg, o.examples, o.insecure_seed)
        kw.update(model=m, names=names, data=data, public_x=public_x, classes=classes)
        from ..privacy.budget import audit_booking

        kw["book"] = audit_booking(cfg, o.insecure_seed)  # real private examples: booked in the privacy ledger
        settings.update(model=o.model, private=o.private, public=o.public)
    return kw


#: the keywords of ``gsd_cli.audit.audit`` for each --method family (any other method: the trainers')
_FAMILY_KWARGS = {"dpgsd": _dpgsd_kwargs, "dp-probe": _probe_kwargs, "dp-energy": _energy_kwargs, "dp-select": _energy_kwargs}
#: the methods audited by a distinguishing test (so is --step-trials)
_DISTINGUISHING = ("dpgsd", "dp-energy", "dp-select", "dp-probe")


def _run_audit(o: SimpleNamespace):
    """The audit the options ``o`` ask for: ``gsd_cli.audit.audit`` with the keywords of the method's
    family (:data:`_FAMILY_KWARGS`), or with ``--step-trials`` the one-step audit ``audit_step``."""
    from ..audit import audit as audit_fn
    from ..errors import GSDError

    kw = _FAMILY_KWARGS.get(o.method, _trainer_kwargs)(o)
    if o.step_trials is not None:
        from ..audit import STEP_METHODS, audit_config, audit_step

        if o.method not in STEP_METHODS or o.model is not None:
            raise GSDError(f"--step-trials audits --method {' or '.join(STEP_METHODS)} on synthetic gradients (no --model)")
        cfg = audit_config(o.method, o.epsilon, o.delta, clip=o.clip, accountant=o.accountant, seed=o.seed)
        return audit_step(cfg, trials=o.step_trials, insecure_seed=o.insecure_seed)
    return audit_fn(o.method, o.epsilon, o.delta, canaries=o.canaries, insecure_seed=o.insecure_seed, **kw)


def _print_result(result, method: str, epsilon: float, delta: float, distinguishing: bool) -> None:
    """The audit's table (``distinguishing``: counts of draws per neighbour, not canaries), the lines of
    its details (:func:`_print_details`) and its verdict."""
    from rich.table import Table

    table = Table(title="privacy audit (95% confidence)")
    for col in ("method", "claimed epsilon", "empirical lower bound", "draws per neighbour" if distinguishing else "canaries",
                "correct guesses"):
        table.add_column(col)
    table.add_row(result.method, epsilon_text(result.claimed_epsilon), epsilon_text(result.epsilon_lower_bound),
                  str(result.guesses // 2 if distinguishing else result.canaries), f"{result.correct}/{result.guesses}")
    out.print(table)
    _print_details(result.details or {}, method, epsilon, delta)
    verdict = ("the audit found nothing (a lower bound never proves the claim)" if result.consistent else
               "PRIVACY BUG: the empirical lower bound exceeds the claimed epsilon")
    (out if result.consistent else err).print(verdict)


def _print_details(d: dict, method: str, epsilon: float, delta: float) -> None:
    """The lines of the details an audit gives: the exact loss of the audited pair, the DP probe's parts
    (:func:`_print_probe`), the mechanism and end-to-end audits of gsd rank --dp, the Gaussian-DP fit."""
    if method == "dp-probe" and "parts" in d:
        return _print_probe(d, epsilon, delta)
    if "exact_loss" in d:
        out.print(f"exact privacy loss of the audited pair (numerical integration): {epsilon_text(d['exact_loss'], 4)}")
    if "pipeline" in d:
        sam, pipe = d["sampler"], d["pipeline"]
        mech = {"dpgsd": "sampler", "dp-select": "selection mechanism"}.get(method, "Laplace mechanism")
        counted = mech if d.get("best_audit") == sam["method"] else "end-to-end"
        out.print(f"{mech} audit: {epsilon_text(sam['epsilon_lower_bound'])}; gsd rank --dp end to end ({pipe['details']['trials']} "
                  f"trials, replay test): {epsilon_text(pipe['epsilon_lower_bound'])} (each at half the error probability; "
                  f"the table's counts are the {counted} audit's)")
        if not d.get("pipeline_can_flag_replay", True):
            err.print(f"note: {pipe['details']['trials']} trials cannot flag even a fully replayed pipeline at epsilon {epsilon:g}; "
                      "a replay bug does not depend on epsilon: audit the pipeline at --epsilon 1 (or give more --trials)")
    if "gdp" in d:
        g = d["gdp"]
        out.print(f"Gaussian-DP fit: mu {g['mu_hat']:.4f} (95% lower bound {g['mu_lower']:.4f}) against the claimed "
                  f"mechanism's {g['mu_claimed']:.4f}" + ("; the noise is BELOW the claimed sigma" if g["noise_below_claim"] else ""))


def _print_probe(d: dict, epsilon: float, delta: float) -> None:
    """``--method dp-probe``'s lines: the plan, each part's claim, exact loss and bound, the Gaussian-DP fit,
    and which part the table shows."""
    fit, sel = d["parts"]["fit"], d["parts"]["selection"]

    def mark(p: dict) -> str:
        return " ABOVE ITS CLAIM" if p["epsilon_lower_bound"] > p["claim"] else ""

    out.print(f"the DP probe at --epsilon {epsilon:g}, --delta {delta:g}, M = {d['models']} models (--models): noise multiplier "
              f"{d['noise_multiplier']:.4g}, permute-and-flip epsilon {epsilon_text(d['epsilon_pf'])}, whole claim "
              f"{epsilon_text(d['claim_whole_mechanism'])}; run end to end (fit, score, selection), each part against its own "
              "claim (an example is in the fit half or the score half, never both)")
    out.print(f"fit part (canary in the fit half): claim {epsilon_text(fit['claim'])} (the {d['models']} Gaussian releases), exact "
              f"loss of the pair {epsilon_text(fit['exact_loss'], 4)} (closed form, Gaussian trade-off), lower bound "
              f"{epsilon_text(fit['epsilon_lower_bound'])}{mark(fit)}")
    n, won, won2 = d["draws_per_neighbour"], sel["frequencies_D"][1], sel["frequencies_D'"][1]
    out.print(f"selection part (canary in the score half): claim {epsilon_text(sel['claim'])} (permute-and-flip on counts that move "
              f"one way: epsilon_pf / 2), exact loss of the pair {epsilon_text(sel['exact_loss'], 4)} (its law enumerated), lower "
              f"bound {epsilon_text(sel['epsilon_lower_bound'])}{mark(sel)}; the canary's model won {won} of {n} "
              f"under D, {won2} under D'")
    g = fit["gdp"]
    out.print(f"Gaussian-DP fit (fit part): mu {g['mu_hat']:.4f} (95% lower bound {g['mu_lower']:.4f}) against the claimed "
              f"mechanism's {g['mu_claimed']:.4f}" + ("; the noise is BELOW the claimed sigma" if g["noise_below_claim"] else ""))
    out.print(f"the table shows the {d['reported_part']} part (its bound is the larger fraction of its claim)"
              + (f"; mutant: {d['mutant']}" if d.get("mutant") else ""))
