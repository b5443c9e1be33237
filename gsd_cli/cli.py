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


class Labels(str, Enum):
    random = "random"
    own = "own"


class RowNorm(str, Enum):
    unit = "unit"
    none = "none"


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Engine(str, Enum):
    auto = "auto"
    vmap = "vmap"
    hooks = "hooks"


def _version(value: bool) -> None:
    if value:
        out.print(f"gsd {__version__}")
        raise typer.Exit()


@app.callback()
def main_callback(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Choose public data for differentially private training by Gradient Subspace Distance."""


@app.command()
def rank(
    private: str = typer.Option(DEFAULT_PRIVATE, "--private", help="Private dataset: an embedded name, folder:PATH or npz:PATH."),
    public: Optional[List[str]] = typer.Option(
        None, "--public", help=f"Public candidates (repeat the option or list names after it). Default: {' '.join(DEFAULT_PUBLIC)}."
    ),
    k: int = typer.Option(16, "--k", "-k", help="Dimension of the gradient subspaces (paper 004 uses 16)."),
    examples: int = typer.Option(2000, "--examples", "-m", help="Examples drawn per dataset (all of a smaller set)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the examples, the random labels and the initial weights w0."),
    model: str = typer.Option("probe", "--model", help="Model: probe (paper 004 Table 7b), fmnist-cnn (Table 7a), resnet20, resnet50 (GroupNorm, 32x32)."),
    params: Optional[List[str]] = typer.Option(
        None, "--params", help="Glob patterns over parameter names that get gradients, e.g. 'fc.*' (default: all trainable)."
    ),
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
        "replace-one neighbours, delta=0); one private sample serves all candidates, so epsilon is spent once.",
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
    gram: str = typer.Option(
        "auto", "--gram",
        help="materialize: stack the m x p per-sample gradients; ghost: only m x m Gram matrices from layer inputs "
        "and output gradients (exact, memory independent of m x p); auto: materialize when m x p fits --memory-budget.",
    ),
    memory_budget: str = typer.Option("4G", "--memory-budget", help="Memory the gradient work may use, e.g. 4G or 512M (chooses --gram auto and the ghost path's chunks)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    extra: Optional[List[str]] = typer.Argument(None, hidden=True),
) -> None:
    """Rank public datasets by their Gradient Subspace Distance to the private one (lowest first).

    With no options, ranks the embedded public candidates for the embedded private task (MNIST-5k half A),
    all from data that ships inside installed packages.
    """
    from .ranking import rank as rank_fn
    from .report import check_output_path, print_ranking, write_csv, write_json

    publics = list(public or []) + list(extra or [])
    if extra and not public:
        raise GSDError(f"unexpected argument(s) {' '.join(extra)}; name public datasets with --public")
    if not dp and epsilon is not None:
        raise GSDError("--epsilon is only used with --dp; add --dp for DP-GSD")
    json_file = check_output_path(json_path, "--json")
    csv_file = check_output_path(csv_path, "--csv")
    bar = Progress(
        TextColumn("{task.description:<24}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True, disable=quiet,
    )
    tasks: dict[str, int] = {}

    def progress(name: str, done: int, total: int) -> None:
        if not tasks:
            bar.start()  # started on the first chunk, so input errors print no empty progress line
        if name not in tasks:
            tasks[name] = bar.add_task(name, total=total)
        bar.update(tasks[name], completed=done, total=total)  # the Gram path's total grows with its passes

    try:
        result = rank_fn(
            private, publics or list(DEFAULT_PUBLIC), k=k, examples=examples, seed=seed, model=model,
            params=params, labels=labels.value, row_norm=row_norm.value, device=device.value,
            chunk_size=chunk_size, engine=engine.value, progress=progress,
            dp=dp, epsilon=epsilon, clip=clip, mechanism=mechanism, dp_sketch=dp_sketch,
            gibbs_sweeps=gibbs_sweeps, gram=gram, memory_budget=memory_budget,
        )
    finally:
        bar.stop()
    print_ranking(result, out)
    if json_file:
        write_json(result, json_file)
        err.print(f"wrote {json_file}")
    if csv_file:
        write_csv(result, csv_file)
        err.print(f"wrote {csv_file}")


def _error(message: str) -> None:
    """One line on stderr: ``error: <message>``."""
    err.print("[bold red]error:[/] " + escape(" ".join(message.split())), highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: user errors print one line and exit 2, never a traceback."""
    try:
        app(args=argv, standalone_mode=False)
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
