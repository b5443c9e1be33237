"""The ``gsd`` command: a thin layer over the library (every command is one library call)."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import __version__
from .data import DEFAULT_PRIVATE, DEFAULT_PUBLIC
from .errors import GSDError

app = typer.Typer(
    help="Choose public data for differentially private training by Gradient Subspace Distance (GSD).",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
)
out = Console()
err = Console(stderr=True)

# Typer >= 0.26 vendors click (typer._click), older Typer uses click itself: find the base class of
# usage errors from an exception Typer exports in both.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _choices(name: str, *values: str) -> type[Enum]:
    """A str Enum whose members are ``values`` (Typer shows them as the option's choices)."""
    return Enum(name, [(v, v) for v in values], type=str)


Labels = _choices("Labels", "random", "own")
RowNorm = _choices("RowNorm", "unit", "none")
Device = _choices("Device", "auto", "cpu", "cuda")
DpRepeats = _choices("DpRepeats", "shared", "fresh")
Engine = _choices("Engine", "auto", "vmap", "hooks")
Method = _choices("Method", "gep", "dpsgd", "rgp", "topagg", "second-phase")
Accountant = _choices("Accountant", "rdp", "pld")
WEIGHTS_HELP = ("Pre-trained weights: a .safetensors file or a PyTorch state dict (loaded with weights_only=True, never an "
                "arbitrary pickle), or a torchvision weight name such as IMAGENET1K_V1 (downloads; needs internet). The head is "
                "new, sized to the private task.")
PEFT_HELP = ("Trainable parameters: a model preset (gsd models show NAME, e.g. paper = paper 004 Table 8), head, bitfit, "
             "lora[:r=8,alpha=8,targets=REGEX], or names/glob patterns ('fc,layer3.32.conv1.weight'); all else frozen. The "
             "same choice in gsd rank and gsd train gives distances on the trained parameters.")
Schedule = _choices("Schedule", "step", "constant")


def _progress(quiet: bool, width: int = 24, eta: bool = False):
    """A rich progress bar on stderr and its callback ``progress(name, done, total)``: one task per
    name, started on the first call (so input errors print no empty progress line); the total may grow
    (the Gram path adds passes); a finished ``epoch`` restarts the ``step`` task."""
    from rich.progress import TimeRemainingColumn

    cols = [TextColumn(f"{{task.description:<{width}}}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    bar = Progress(*cols, *([TimeRemainingColumn()] if eta else []), console=err, transient=True, disable=quiet)
    tasks: dict[str, int] = {}

    def progress(name: str, done: int, total: int) -> None:
        if not tasks:
            bar.start()
        if name not in tasks:
            tasks[name] = bar.add_task(name, total=total)
        bar.update(tasks[name], completed=done, total=total)
        if name == "epoch" and "step" in tasks:
            bar.reset(tasks["step"])

    return bar, progress


def _version(value: bool) -> None:
    if value:
        out.print(f"gsd {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Choose public data for differentially private training by Gradient Subspace Distance."""


INSECURE_HELP = ("Experiments only: draw the private randomness ({what}) from this seed instead of the operating "
                 "system, so that a run can be repeated exactly. Every output is then marked NOT differentially private.")
CLASSES_HELP = ("The private set's classes, a count (10) or comma-separated names, where its source declares none "
                "(npz without a 'classes' array, CSV label values): a private model's shape must not be read off the private labels.")


@app.command()
def rank(
    private: str = typer.Option(DEFAULT_PRIVATE, "--private", help="Private dataset: an embedded or built-in name (gsd datasets list), folder:PATH, csv:PATH, npz:PATH or hf:PATH; add :train or :test for a split."),
    public: Optional[List[str]] = typer.Option(
        None, "--public", help=f"Public candidates (repeat the option or list names after it). Default: {' '.join(DEFAULT_PUBLIC)}."
    ),
    k: int = typer.Option(16, "--k", "-k", help="Dimension of the gradient subspaces (paper 004 uses 16)."),
    examples: int = typer.Option(2000, "--examples", "-m", help="Examples drawn per dataset (all of a smaller set)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the public randomness: the initial weights w0, the public examples and their random labels (and, without --dp, the private ones: a non-private ranking is reproducible)."),
    insecure_seed: Optional[int] = typer.Option(None, "--insecure-seed", help=INSECURE_HELP.format(what="with --dp: the private examples drawn, their labels and the DP draw")),
    classes: Optional[str] = typer.Option(None, "--classes", help=CLASSES_HELP),
    model: str = typer.Option("probe", "--model", help="Model: probe (paper 004 Table 7b), fmnist-cnn (Table 7a), resnet20, resnet50 (GroupNorm, 32x32)."),
    params: Optional[List[str]] = typer.Option(
        None, "--params", help="Glob patterns over parameter names that get gradients, e.g. 'fc.*' (default: all trainable)."
    ),
    weights: Optional[str] = typer.Option(None, "--weights", help=WEIGHTS_HELP),
    peft: Optional[str] = typer.Option(None, "--peft", help=PEFT_HELP),
    labels: Labels = typer.Option(
        Labels.random, "--labels", help="random: uniform labels in the model's label space, as the authors do; own: the datasets' labels."
    ),
    row_norm: RowNorm = typer.Option(
        RowNorm.unit, "--row-norm",
        help="unit: scale each per-sample gradient to norm 1 before the SVD (the authors' experiment code; "
        "gives every example one vote); none: raw gradients (the authors' demo notebook).",
    ),
    device: Device = typer.Option(Device.auto, "--device", help="auto uses CUDA when there is a GPU."),
    chunk_size: Optional[int] = typer.Option(None, "--chunk-size", help="Examples per per-sample-gradient chunk (default: 64 on CPU, 256 on CUDA)."),
    engine: Engine = typer.Option(Engine.auto, "--engine", help="Per-sample gradients: hooks (Opacus per-layer samplers), vmap (torch.func); auto picks by device."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the ranking as JSON to this file."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Write the ranking as CSV to this file."),
    dp: bool = typer.Option(
        False, "--dp",
        help="DP-GSD: draw the private subspace with a pure epsilon-DP exponential mechanism (rows clipped to --clip; "
        "add/remove-one-example neighbours, delta=0; the private examples, labels and draw come from the operating "
        "system, never from --seed); one private sample serves all candidates, so epsilon is spent once.",
    ),
    epsilon: Optional[float] = typer.Option(None, "--epsilon", help="With --dp: the privacy budget (> 0)."),
    clip: float = typer.Option(1.0, "--clip", help="With --dp: L2 clip norm C of each private per-sample gradient."),
    mechanism: str = typer.Option(
        "sequential", "--mechanism",
        help="With --dp: sequential = k exact vector-Bingham draws exp(v^T B v), B = (epsilon/k)/(2 C^2) G^T G, "
        "each on the complement of the earlier ones: pure epsilon-DP by composition. matrix = the paper's "
        "exp(tr(V^T B V)), B = epsilon/(2 C^2) G^T G, by a Gibbs sampler (a Markov chain): NO guarantee is proven.",
    ),
    gibbs_sweeps: int = typer.Option(10, "--gibbs-sweeps", help="With --mechanism matrix: Gibbs sweeps over the k columns."),
    dp_sketch: Optional[int] = typer.Option(
        None, "--dp-sketch",
        help="Project every per-sample gradient (private and public alike) by one data-independent Gaussian matrix to "
        "this many dimensions before the subspaces (and before clipping): the DP sample is informative once "
        "epsilon*m/(2k) is not small against D/2.",
    ),
    repeats: int = typer.Option(
        1, "--repeats", "-R",
        help="Independent repeats (examples, random labels and w0 drawn anew from --seed in each; repeat 1 is the "
        "plain ranking). R > 1 ranks by the mean distance and shows sd, a 95% Student-t interval for the mean, the "
        "fraction of repeats each candidate won, and '= ★' for candidates tied with the winner: not significantly "
        "farther by a one-sided paired t-test on the per-repeat differences (the repeats share the private draw), "
        "Holm-adjusted over the candidates, alpha 0.05. R=1: no interval, no tie test.",
    ),
    dp_repeats: Optional[DpRepeats] = typer.Option(
        None, "--dp-repeats",
        help="With --dp and --repeats: shared (default) = one private DP sample for all repeats, only the public side "
        "varies, total epsilon = --epsilon; fresh = a new private DP sample per repeat, total epsilon = R x --epsilon "
        "(basic composition).",
    ),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG of each candidate's distances with their intervals."),
    gram: str = typer.Option(
        "auto", "--gram",
        help="materialize: stack the m x p per-sample gradients; ghost: only m x m Gram matrices from layer inputs "
        "and output gradients (exact, memory independent of m x p); auto: materialize when m x p fits --memory-budget.",
    ),
    memory_budget: str = typer.Option("4G", "--memory-budget", help="Memory the gradient work may use, e.g. 4G or 512M (chooses --gram auto and the ghost path's chunks)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    data_root: Optional[Path] = typer.Option(
        None, "--data-root", help="Folder of the built-in datasets (cifar10, chestxray, ...). Default: $GSD_DATA_ROOT, "
        "else $XDG_DATA_HOME/gsd (~/.local/share/gsd).",
    ),
    download: bool = typer.Option(False, "--download", help="Let torchvision download its datasets into the data root."),
    catalog: Optional[Path] = typer.Option(
        None, "--catalog", help="Run the jobs of this TOML catalogue (all, or those whose private dataset is --private)."
    ),
    markdown_path: Optional[Path] = typer.Option(None, "--markdown", help="Write the ranking(s) as a Markdown table to this file."),
    fail_above: Optional[float] = typer.Option(None, "--fail-above", help="Exit 1 when the best distance is above this."),
    expect_best: Optional[str] = typer.Option(None, "--expect-best", help="Exit 1 when another candidate ranks first."),
    no_cache: bool = typer.Option(
        False, "--no-cache", help="Recompute every public subspace (default: reuse them from the cache, $GSD_CACHE_DIR "
        "else ~/.cache/gsd/subspaces; see gsd cache)."
    ),
    extra: Optional[List[str]] = typer.Argument(None, hidden=True),
    ctx: typer.Context = typer.Option(None, hidden=True),
) -> None:
    """Rank public datasets by their Gradient Subspace Distance to the private one (lowest first).

    With no options, ranks the embedded public candidates for the embedded private task (MNIST-5k half A),
    all from data that ships inside installed packages. Exit codes: 0 ok, 1 a check (--fail-above,
    --expect-best) failed, 2 bad usage or input.
    """
    from .cache import SubspaceCache
    from .catalog import OPTIONS, run_catalog
    from .checks import EXIT_CHECK_FAILED, check_ranking
    from .data import resolve
    from .ranking import rank as rank_fn
    from .report import check_output_path, jobs_to_csv, jobs_to_json, print_ranking, to_markdown, write_csv, write_json, write_text

    publics = list(public or []) + list(extra or [])
    if extra and not public:
        raise GSDError(f"unexpected argument(s) {' '.join(extra)}; name public datasets with --public")
    if not dp and epsilon is not None:
        raise GSDError("--epsilon is only used with --dp; add --dp for DP-GSD")
    if dp_repeats is not None and not dp:
        raise GSDError("--dp-repeats is only used with --dp; add --dp for DP-GSD")
    if insecure_seed is not None and not dp:
        raise GSDError("--insecure-seed seeds DP-GSD's private randomness; it is only used with --dp")
    if catalog is not None and publics:
        raise GSDError("--catalog takes its candidates from the catalogue; drop --public (or drop --catalog)")
    from .repeats_report import check_plot_path, print_repeats, write_plot, write_repeats_csv

    plot_file = check_plot_path(plot_path)
    json_file = check_output_path(json_path, "--json")
    csv_file = check_output_path(csv_path, "--csv")
    md_file = check_output_path(markdown_path, "--markdown")
    cache = None if no_cache else SubspaceCache()
    bar, progress = _progress(quiet)

    options = dict(
        k=k, examples=examples, seed=seed, model=model, params=params, labels=labels.value, row_norm=row_norm.value,
        device=device.value, chunk_size=chunk_size, engine=engine.value, dp=dp, epsilon=epsilon, clip=clip,
        mechanism=mechanism, dp_sketch=dp_sketch, gibbs_sweeps=gibbs_sweeps, gram=gram, memory_budget=memory_budget,
        repeats=repeats, dp_repeats=(dp_repeats or DpRepeats.shared).value, insecure_seed=insecure_seed, classes=classes,
    )
    options.update(weights=weights, peft=peft)
    try:
        if catalog is None:
            sources = [resolve(n, root=data_root, download=download) for n in [private, *(publics or DEFAULT_PUBLIC)]]
            results = [(private, rank_fn(sources[0], sources[1:], progress=progress, cache=cache, **options))]
            checks = [{}]
        else:
            given = {o: options[o] for o in OPTIONS if ctx.get_parameter_source(o).name == "COMMANDLINE"}
            picked = private if ctx.get_parameter_source("private").name == "COMMANDLINE" else None
            ran = run_catalog(catalog, picked, download=download, overrides=given, progress=progress, cache=cache)
            results = [(job.name, rk) for job, rk in ran]
            checks = [job.checks for job, _ in ran]
    finally:
        bar.stop()
    failures = []
    many = getattr(results[0][1], "repeats", 1) > 1
    for (_, result), job_checks in zip(results, checks):
        if getattr(result, "repeats", 1) > 1:
            print_repeats(result, out)
        else:
            print_ranking(result, out)
        failures += check_ranking(
            result,
            fail_above if fail_above is not None else job_checks.get("fail_above"),
            expect_best if expect_best is not None else job_checks.get("expect_best"),
        )
    if catalog is None and not many:
        out.print("[dim]One draw: no interval and no tie test; --repeats 5 shows which candidates are tied.[/]")
    if cache is not None and cache.hits and not quiet:
        err.print(f"cache: reused {cache.hits} public subspace(s) from {cache.directory}")
    rankings = [rk for _, rk in results]
    if json_file:
        write_json(rankings[0], json_file) if catalog is None else write_text(json_file, jobs_to_json(results, failures))
        err.print(f"wrote {json_file}")
    if csv_file:
        if catalog is None:
            (write_repeats_csv if many else write_csv)(rankings[0], csv_file)
        else:
            write_text(csv_file, jobs_to_csv(results))
        err.print(f"wrote {csv_file}")
    if plot_file:
        write_plot(rankings[0] if catalog is None else [(name, rk) for name, rk in results], plot_file)
        err.print(f"wrote {plot_file}")
    if md_file:
        has_checks = fail_above is not None or expect_best is not None or any(checks)
        write_text(md_file, to_markdown(rankings, failures if has_checks else None))
        err.print(f"wrote {md_file}")
    for f in failures:
        err.print(f"[bold red]check failed:[/] {escape(f)}", highlight=False, soft_wrap=True)
    if failures:
        raise typer.Exit(EXIT_CHECK_FAILED)


datasets_app = typer.Typer(help="Datasets: the built-in names and what is on disk.", no_args_is_help=True)
cache_app = typer.Typer(help="The cache of public gradient subspaces.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")
app.add_typer(cache_app, name="cache")

_ROOT_HELP = "Folder of the built-in datasets. Default: $GSD_DATA_ROOT, else $XDG_DATA_HOME/gsd (~/.local/share/gsd)."


@datasets_app.command("list")
def datasets_list(data_root: Optional[Path] = typer.Option(None, "--data-root", help=_ROOT_HELP)) -> None:
    """Every built-in dataset, where it is looked for, and whether it is there."""
    from rich.table import Table

    from .data import data_root as root_of, list_datasets

    t = Table(title=f"datasets (data root {escape(str(root_of(data_root)))})")
    for c in ("name", "kind", "present", "where", "layout"):
        t.add_column(c, overflow="fold")
    for r in list_datasets(data_root):
        name = r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else "")
        t.add_row(escape(name), r["kind"], "yes" if r["present"] else "no", escape(r["where"]), escape(r["layout"]))
    out.print(t)
    out.print("Generic sources: folder:PATH, csv:PATH, npz:PATH, hf:PATH; any NAME:train / NAME:test.")


@datasets_app.command("show")
def datasets_show(
    name: str = typer.Argument(..., help="A dataset name (e.g. chestxray:test, cifar10, csv:labels.csv)."),
    data_root: Optional[Path] = typer.Option(None, "--data-root", help=_ROOT_HELP),
    download: bool = typer.Option(False, "--download", help="Let torchvision download it first."),
) -> None:
    """Layout found, number of examples, classes, multi-label or not, image size."""
    from .data import describe_dataset

    d = describe_dataset(name, data_root, download)
    for key, value in d.items():
        if key == "class_names" and isinstance(value, list) and len(value) > 20:
            value = ", ".join(map(str, value[:20])) + f", ... ({len(value)})"
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        out.print(f"[bold]{key}[/]: {escape(str(value))}")


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is and what it holds."""
    from .cache import SubspaceCache

    i = SubspaceCache().info()
    out.print(f"{i['directory']}: {i['entries']} entries, {i['bytes'] / 2**20:.1f} MiB")


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete every cached public subspace."""
    from .cache import SubspaceCache

    c = SubspaceCache()
    out.print(f"deleted {c.clear()} entries from {c.directory}")


@app.command()
def train(
    ctx: typer.Context,
    private: str = typer.Option(DEFAULT_PRIVATE, "--private", help="Private dataset: trains on NAME:train, evaluates on NAME:test (the official split; where the set has none, a fixed 80/20 split decided per example by a hash of its path or content)."),
    public: Optional[List[str]] = typer.Option(None, "--public", help="Public dataset for GEP; with --auto-select, the candidates (list names after it)."),
    auto_select: bool = typer.Option(False, "--auto-select", help="Rank the --public candidates (or the --catalog job's) with gsd rank first (probe network, random labels) and train with the closest."),
    catalog_path: Optional[Path] = typer.Option(None, "--catalog", help="TOML catalogue: its datasets resolve by name; with --auto-select the candidates are those of the job whose private set is --private."),
    method: Method = typer.Option(Method.gep, "--method", help="gep: Gradient Embedding Perturbation (paper 000) on the public anchor subspace; dpsgd: DP-SGD without public data; rgp: low-rank reparametrized gradient perturbation (paper 001), no public data; topagg: DP-SGD with NormTopK compression (paper 002); second-phase: train the --peft parameters on the public set first (no privacy cost), then DP-SGD on the private set (paper 004 Sec. 5; the paper uses --lr 0.8 --clip 0.1)."),
    epsilon: float = typer.Option(2.0, "--epsilon", help="Target epsilon of the training; sigma is calibrated so the final epsilon is never above it."),
    delta: float = typer.Option(1e-5, "--delta", help="Target delta, in (0, 1); use less than 1/N."),
    private_test: Optional[str] = typer.Option(None, "--private-test", help="Test set for evaluation (default: the private dataset's test part)."),
    model: str = typer.Option("fmnist-cnn", "--model", help="Model to train: fmnist-cnn (28x28x1), resnet20 (GroupNorm, 32x32x3), probe, or a torchvision backbone (gsd models list)."),
    params: Optional[List[str]] = typer.Option(None, "--params", help="Glob patterns of the parameters to train (default: all)."),
    weights: Optional[str] = typer.Option(None, "--weights", help=WEIGHTS_HELP),
    peft: Optional[str] = typer.Option(None, "--peft", help=PEFT_HELP),
    public_epochs: int = typer.Option(5, "--public-epochs", help="second-phase: epochs of stage 1 (supervised training of the --peft parameters on --public-examples public examples, their own labels)."),
    public_lr: Optional[float] = typer.Option(None, "--public-lr", help="second-phase: Adam learning rate of stage 1 (default: paper 004's 3e-3 for transformers, 5e-5 for CNNs)."),
    public_batch_size: int = typer.Option(64, "--public-batch-size", help="second-phase: minibatch size of stage 1."),
    epochs: int = typer.Option(20, "--epochs", help="Epochs; one epoch is round(N / batch size) steps."),
    batch_size: int = typer.Option(250, "--batch-size", help="Expected batch size: each step samples every private example with probability batch_size/N (Poisson)."),
    lr: float = typer.Option(0.1, "--lr", help="SGD learning rate."),
    momentum: float = typer.Option(0.9, "--momentum", help="SGD momentum."),
    weight_decay: float = typer.Option(1e-4, "--weight-decay", help="SGD weight decay."),
    lr_schedule: Schedule = typer.Option(Schedule.step, "--lr-schedule", help="step: lr / 10 from the middle of training (paper 000); constant."),
    seed: int = typer.Option(0, "--seed", help="Seed of the initial weights, the public anchors and their random labels (the private sampling and noise use a secret seed)."),
    clip: float = typer.Option(1.0, "--clip", help="dpsgd: L2 clip norm C of each per-sample gradient; noise std sigma*C."),
    k: int = typer.Option(100, "--k", help="gep: anchor subspace dimension (shared by the groups by sqrt of their size)."),
    public_examples: int = typer.Option(2000, "--public-examples", help="gep: public anchor examples (randomly labelled each step, as paper 000); second-phase: public examples of stage 1."),
    power_iters: int = typer.Option(1, "--power-iters", help="gep: power iterations per step (the paper uses 1)."),
    groups: str = typer.Option("auto", "--groups", help="gep: parameter groups, ';' between groups, ',' between glob patterns; auto = the paper's 5 groups for resnet20, one group otherwise; none = one group."),
    clip_embedding: float = typer.Option(2.0, "--clip-embedding", help="gep: clip norm S1 of the embedding; noise std sigma*S1."),
    clip_residual: float = typer.Option(0.4, "--clip-residual", help="gep: clip norm S2 of the residual; noise std sigma*S2 (paper 000 keeps S2 = S1/5)."),
    residual: bool = typer.Option(True, "--residual/--no-residual", help="gep: release the residual (GEP) or drop it (B-GEP, biased)."),
    rgp_rank: int = typer.Option(4, "--rgp-rank", help="rgp: rank r of the gradient carriers of each Linear/Conv2d weight (--power-iters: power iterations K)."),
    rgp_warmup: int = typer.Option(20, "--rgp-warmup", help="rgp: warm-up steps whose carriers decompose the weight itself; afterwards the historical update W_t - W_0."),
    topk_fraction: float = typer.Option(0.7, "--topk-fraction", help="topagg: K in (0, 1]; NormTopK keeps the largest coordinates while their squared sum is <= K ||g||^2; noise std sqrt(K)*sigma*C."),
    sparsify: float = typer.Option(0.0, "--sparsify", help="dpsgd, gep: random sparsification (paper 003) to final rate R in [0, 1): a data-independent mask per epoch, rate ramped 0 -> R, before clipping; same epsilon."),
    accountant: Accountant = typer.Option(Accountant.rdp, "--accountant", help="dp-accounting's RDP or PLD accountant (add/remove-one neighbours, Poisson sampling)."),
    physical_batch: Optional[int] = typer.Option(None, "--physical-batch", help="Examples per per-sample-gradient chunk (memory bound; default 64 CPU / 256 GPU)."),
    insecure_seed: Optional[int] = typer.Option(None, "--insecure-seed", help=INSECURE_HELP.format(what="the Poisson sampling, the noise and, with --select-epsilon, the DP-GSD draw")),
    deterministic_noise: bool = typer.Option(False, "--deterministic-noise", help="Deprecated: --insecure-seed with the value of --seed."),
    classes: Optional[str] = typer.Option(None, "--classes", help=CLASSES_HELP),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="New run folder (default gsd-train-<time>); its parent must exist."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the interrupted run in this folder, with its own settings (same result as an uninterrupted run)."),
    rank_model: str = typer.Option("probe", "--rank-model", help="--auto-select: model of the ranking (default: probe; with --weights or --peft, the trained model with its weights and --peft)."),
    rank_k: int = typer.Option(16, "--rank-k", help="--auto-select: subspace dimension of the ranking."),
    rank_examples: int = typer.Option(2000, "--rank-examples", help="--auto-select: examples per dataset in the ranking."),
    select_epsilon: Optional[float] = typer.Option(None, "--select-epsilon", help="--auto-select with DP-GSD at this epsilon (added to the budget); without it the selection is not private."),
    device: Device = typer.Option(Device.auto, "--device", help="auto uses CUDA when there is a GPU."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
    extra: Optional[List[str]] = typer.Argument(None, hidden=True),
) -> None:
    """Train privately (DP-SGD, GEP, RGP or TopAgg, optionally with random sparsification, or the
    second phase then DP-SGD) with the chosen public data; writes checkpoints, metrics.jsonl,
    summary.json and curves.png to the run folder.

    Privacy: every step is a Poisson-subsampled Gaussian mechanism under add/remove-one neighbours,
    accounted with dp-accounting. dpsgd: clip C, noise sigma*C. gep: embedding and residual of one
    subsample, accounted as one Gaussian with multiplier (z1^-2 + z2^-2)^-1/2. rgp: the carrier
    gradients (and the other parameters' gradients) clipped to C as one vector, noise sigma*C: multiplier
    sigma. topagg: clip C then NormTopK, sensitivity sqrt(K)*C, noise sqrt(K)*sigma*C: multiplier sigma.
    --sparsify: the mask is independent of the data, so the same mechanism and epsilon. second-phase:
    stage 1 sees public data only (no privacy cost); stage 2 is DP-SGD, accounted as dpsgd.

    The private sampling and noise come from the operating system (--insecure-seed: from a seed, and
    the run is marked not DP). Public data that shares examples with the private set is refused.
    summary.json holds only public settings and the privacy statement; the test metrics and the exact
    size of the private set go to private-summary.json.
    """
    import time as _time

    from .train import TrainConfig, auto_select as auto_select_fn, train as train_fn
    from .train.checkpoint import load_meta

    publics = list(public or []) + list(extra or [])
    if extra and not public:
        raise GSDError(f"unexpected argument(s) {' '.join(extra)}; name public datasets with --public")
    fields = dict(
        private=private, method=method.value, epsilon=epsilon, delta=delta, private_test=private_test, model=model,
        params=list(params) if params else None, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
        weight_decay=weight_decay, lr_schedule=lr_schedule.value, seed=seed, clip=clip, k=k,
        public_examples=public_examples, power_iters=power_iters, groups=groups, clip_embedding=clip_embedding,
        clip_residual=clip_residual, residual=residual, accountant=accountant.value, physical_batch=physical_batch,
        deterministic_noise=deterministic_noise, insecure_seed=insecure_seed, classes=classes, rgp_rank=rgp_rank, rgp_warmup=rgp_warmup, topk_fraction=topk_fraction,
        sparsify=sparsify, weights=weights, peft=peft, public_epochs=public_epochs,
        public_lr=public_lr, public_batch_size=public_batch_size,
        catalog=str(catalog_path.expanduser().resolve()) if catalog_path is not None else None,
    )
    selection = None
    if resume is not None:
        if out_dir is not None:
            raise GSDError("give either --out (a new run) or --resume (an interrupted one), not both")
        from .train.second_phase import STAGE1_META, run_settings

        saved = (load_meta(resume).get("settings", {}) if (resume / "checkpoint.json").is_file()
                 else run_settings(resume) if (resume / STAGE1_META).is_file() else {})
        sources = {n: ctx.get_parameter_source("catalog_path" if n == "catalog" else n) for n in fields}
        explicit = {n for n, src in sources.items() if src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")}
        if publics:
            explicit.add("public")
        cfg_dict = dict(saved)
        for n in explicit:
            cfg_dict[n] = fields[n] if n != "public" else publics[0]
        cfg = TrainConfig(**{k_: v for k_, v in cfg_dict.items() if k_ in TrainConfig.__dataclass_fields__})
        run = resume
    else:
        cat = None
        if catalog_path is not None:
            from .catalog import load_catalog, select_jobs

            cat = load_catalog(catalog_path)
            if auto_select and not publics:
                publics = list(select_jobs(cat, private)[0].candidates)
        if auto_select:
            if len(publics) < 1:
                raise GSDError("--auto-select needs candidates: --public A B C (or --catalog FILE with a job for --private)")
        elif len(publics) > 1:
            raise GSDError("several --public sets: add --auto-select to rank them and train with the closest")
        cfg = TrainConfig(**fields, public=publics[0] if publics else None)
        run = out_dir or Path(f"gsd-train-{_time.strftime('%Y%m%d-%H%M%S')}")
        from .train.checkpoint import prepare_run_dir
        from .train.loop import validate

        if auto_select:
            cfg.public = publics[0]
        validate(cfg)
        prepare_run_dir(run, resume=False, create=False)  # fail before the ranking, not after it
        if auto_select:
            from .report import print_ranking

            rank_opts = dict(k=rank_k, examples=rank_examples, seed=seed, model=rank_model, device=device.value)
            if (weights is not None or peft is not None) and ctx.get_parameter_source("rank_model").name == "DEFAULT":
                rank_opts.update(model=model, weights=weights, peft=peft)  # GSD on exactly the parameters to be trained
            if select_epsilon is not None:
                rank_opts.update(dp=True, epsilon=select_epsilon, insecure_seed=cfg.private_seed)
            if classes is not None:
                rank_opts.update(classes=classes)
            ranking = _with_rank_progress(quiet, lambda pr: auto_select_fn(private, publics, private_test=private_test, catalog=cat, progress=pr, **rank_opts))
            print_ranking(ranking, out)
            best = ranking.results[0]
            cfg.public, cfg.public_distance = best.public, best.distance
            selection = ranking.to_dict()
            out.print(f"training with [bold]{escape(best.public)}[/] (GSD {best.distance:.4f})")

    bar, progress = _progress(quiet, width=8, eta=True)

    try:
        summary = train_fn(cfg, run, resume=resume is not None, device=device.value, progress=progress, selection=selection)
    finally:
        bar.stop()
    from .train.report import print_summary

    print_summary(summary, out)
    err.print(f"wrote {run}/summary.json (publishable), private-summary.json, metrics.jsonl, curves.png (not publishable: "
              "test metrics of private data), checkpoint.safetensors"
              + (", stage1.safetensors" if cfg.method == "second-phase" else ""))


models_app = typer.Typer(help="Models: the registry, parameter names and counts, PEFT presets.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """Every registered model with its input size and presets."""
    from rich.table import Table

    from .models_info import list_models_info

    t = Table(title="models (NAME@SIZE builds a model for SIZExSIZE inputs, e.g. resnet18@32)")
    for c in ("name", "input", "presets", "description"):
        t.add_column(c, overflow="fold")
    for r in list_models_info():
        t.add_row(r["name"], f"{r['input_size']}x{r['input_size']}x{r['channels']}", ", ".join(r["presets"]) or "-", escape(r["description"]))
    out.print(t)
    out.print("--peft also takes: head, bitfit, lora[:r=8,alpha=8,targets=REGEX], or parameter names/glob patterns.")


@models_app.command("show")
def models_show(
    name: str = typer.Argument(..., help="A model name (gsd models list)."),
    peft: Optional[str] = typer.Option(None, "--peft", help="Mark what this --peft choice trains."),
    classes: int = typer.Option(10, "--classes", help="Size of the head."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the listing as JSON to this file."),
) -> None:
    """Parameter names, shapes and counts, and each preset's parameters (builds the model; no forward pass)."""
    import json as _json

    from rich.table import Table

    from .models_info import show_model
    from .report import check_output_path, write_text

    json_file = check_output_path(json_path, "--json")
    d = show_model(name, classes, peft)
    t = Table(title=f"{escape(d['name'])}: {d['total']:,} parameters ({d['input_size']}x{d['input_size']}x{d['channels']}, {classes} classes)")
    for c in ("parameter", "shape", "count", *(["trained"] if peft else [])):
        t.add_column(c, overflow="fold")
    for p in d["parameters"]:
        t.add_row(escape(p["name"]), "x".join(map(str, p["shape"])), f"{p['count']:,}", *(["yes" if p["trainable"] else ""] if peft else []))
    out.print(t)
    for pname, pr in d["presets"].items():
        what = pr.get("note") or f"{pr['count']:,} parameters: {', '.join(pr['parameters'])}"
        out.print(f"[bold]preset {escape(pname)}[/] ({escape(', '.join(pr['patterns']))}): {escape(what)}")
    if peft:
        out.print(f"[bold]--peft {escape(peft)}[/]: trains {d['trainable']:,} of {d['total']:,} parameters")
    if json_file:
        write_text(json_file, _json.dumps(d, indent=2) + "\n")
        err.print(f"wrote {json_file}")


@app.command()
def compare(
    private: str = typer.Option(DEFAULT_PRIVATE, "--private", help="Private dataset (its train part trains, its test part evaluates)."),
    public: Optional[str] = typer.Option(None, "--public", help="Public dataset for gep, gep+rs and second-phase."),
    methods: str = typer.Option("dpsgd,gep,rgp,topagg,gep+rs", "--methods", help="Comma-separated: dpsgd, gep, rgp, topagg, dpsgd+rs, gep+rs (+rs: random sparsification to --sparsify), second-phase."),
    epsilon: float = typer.Option(2.0, "--epsilon", help="Target epsilon of every run (sigma calibrated per method)."),
    delta: float = typer.Option(1e-5, "--delta", help="Target delta."),
    seeds: int = typer.Option(3, "--seeds", help="Runs per method, with seeds --seed, --seed+1, ..."),
    seed: int = typer.Option(0, "--seed", help="First seed."),
    sparsify: float = typer.Option(0.5, "--sparsify", help="Final random-sparsification rate of the +rs methods."),
    model: str = typer.Option("fmnist-cnn", "--model", help="Model to train."),
    epochs: int = typer.Option(10, "--epochs", help="Epochs of every run."),
    batch_size: int = typer.Option(250, "--batch-size", help="Expected (Poisson) batch size."),
    lr: float = typer.Option(0.1, "--lr", help="SGD learning rate."),
    momentum: float = typer.Option(0.9, "--momentum", help="SGD momentum."),
    clip: float = typer.Option(1.0, "--clip", help="dpsgd, rgp, topagg: clip norm C."),
    k: int = typer.Option(50, "--k", help="gep: anchor subspace dimension."),
    public_examples: int = typer.Option(1000, "--public-examples", help="gep: public anchor examples; second-phase: stage-1 examples."),
    rgp_rank: int = typer.Option(4, "--rgp-rank", help="rgp: carrier rank r."),
    rgp_warmup: int = typer.Option(20, "--rgp-warmup", help="rgp: warm-up steps."),
    topk_fraction: float = typer.Option(0.7, "--topk-fraction", help="topagg: K."),
    weights: Optional[str] = typer.Option(None, "--weights", help="Pre-trained weights of --model for every method (as gsd train --weights)."),
    peft: Optional[str] = typer.Option(None, "--peft", help="Trainable parameters for every method (as gsd train --peft); all else frozen."),
    public_epochs: int = typer.Option(5, "--public-epochs", help="second-phase: epochs of stage 1 on the public set."),
    public_lr: Optional[float] = typer.Option(None, "--public-lr", help="second-phase: Adam learning rate of stage 1 (default 5e-5 CNN, 3e-3 transformer)."),
    insecure_seed: Optional[int] = typer.Option(None, "--insecure-seed", help=INSECURE_HELP.format(what="the sampling and noise of run i: this seed + i")),
    deterministic_noise: bool = typer.Option(False, "--deterministic-noise", help="Deprecated: --insecure-seed with the value of --seed."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="New folder for the runs and comparison.json/.csv/.png (default gsd-compare-<time>); never overwritten."),
    device: Device = typer.Option(Device.auto, "--device", help="auto uses CUDA when there is a GPU."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bars."),
) -> None:
    """Train several private methods side by side on one task under one (epsilon, delta) and one
    accountant; print one table (test accuracy mean +- sd over seeds) and save JSON, CSV and a plot.

    Every method is a Poisson-subsampled Gaussian mechanism per step with the sensitivities of
    ``gsd train --help``; each run's sigma is calibrated so its epsilon is at most --epsilon. The runs
    are separate releases about one private set: together they spend the sum of their budgets, which
    the table and comparison.json report. The files hold test metrics of private data: not publishable.
    """
    import time as _time

    from .compare import compare as compare_fn, comparison_table
    from .train import TrainConfig

    base = TrainConfig(delta=delta, model=model, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, clip=clip, k=k,
                       public_examples=public_examples, rgp_rank=rgp_rank, rgp_warmup=rgp_warmup, topk_fraction=topk_fraction,
                       weights=weights, peft=peft, public_epochs=public_epochs, public_lr=public_lr,
                       deterministic_noise=deterministic_noise, insecure_seed=insecure_seed, seed=seed)
    run = out_dir or Path(f"gsd-compare-{_time.strftime('%Y%m%d-%H%M%S')}")
    bar, progress = _progress(quiet, width=8, eta=True)

    def on_run(r: dict) -> None:
        if not quiet:
            err.print(f"{r['method']} seed {r['seed']}: accuracy {r['accuracy']:.4f}, epsilon {r['epsilon']:.3f} ({r['seconds']:.0f} s)")

    try:
        result = compare_fn(private, public, methods, epsilon, seeds, run, sparsify=sparsify, base=base, device=device.value,
                            progress=progress, on_run=on_run)
    finally:
        bar.stop()
    out.print(comparison_table(result))
    err.print(f"wrote {run}/comparison.json, comparison.csv, comparison.png and one folder per run")


def _with_rank_progress(quiet: bool, fn):
    bar, progress = _progress(quiet)
    try:
        return fn(progress)
    finally:
        bar.stop()


def _error(message: str) -> None:
    """One line on stderr: ``error: <message>``."""
    err.print("[bold red]error:[/] " + escape(" ".join(message.split())), highlight=False, soft_wrap=True)


def _reflow_help(*apps: typer.Typer) -> None:
    """Join the lines of each docstring paragraph: rich keeps a docstring's line breaks, so help text
    wrapped at 100 columns in the source would come out ragged on a narrower terminal."""
    import inspect

    for a in apps:
        infos = [*a.registered_commands, *([a.registered_callback] if a.registered_callback else [])]
        for info in infos:
            fn = info.callback
            if fn is not None and fn.__doc__:
                fn.__doc__ = "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(fn.__doc__).split("\n\n"))


_reflow_help(app, datasets_app, cache_app, models_app)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: user errors print one line and exit 2, never a traceback."""
    try:
        rc = app(args=argv, standalone_mode=False)  # click returns a typer.Exit's code here
        if isinstance(rc, int) and rc:
            return rc
    except GSDError as e:
        _error(str(e))
        return 2
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        err.print("aborted")
        return 130
    except _ClickException as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # plain `gsd`: help was printed
            return 0
        msg = " ".join(e.format_message().split())
        hint = f" (see gsd {e.ctx.info_name} --help)" if getattr(e, "ctx", None) and e.ctx.info_name != "gsd" else " (see gsd --help)"
        _error(msg + hint)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
