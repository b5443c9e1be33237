"""``gsd datasets``: the built-in names and what is on disk (``gsd_cli.data``)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from .app import app
from .common import err, out
from .options import data_root_option

datasets_app = typer.Typer(help="Datasets: the built-in names and what is on disk.", no_args_is_help=True)
app.add_typer(datasets_app, name="datasets")


@datasets_app.command("list")
def datasets_list(data_root: Optional[Path] = data_root_option()) -> None:
    """Every built-in dataset, where it is looked for, and whether it is there."""
    from rich.table import Table

    from ..data import data_root as root_of, list_datasets

    t = Table(title=f"datasets (data root {escape(str(root_of(data_root)))})")
    for c in ("name", "kind", "present", "where", "layout"):
        t.add_column(c, overflow="fold")
    for r in list_datasets(data_root):
        name = r["name"] + (f" ({', '.join(r['aliases'])})" if r["aliases"] else "")
        t.add_row(escape(name), r["kind"], "yes" if r["present"] else "no", escape(r["where"]), escape(r["layout"]))
    out.print(t)
    out.print("Generic sources: folder:PATH, csv:PATH, npz:PATH, hf:PATH (DICOM in folder: and csv:; options "
              "folder:PATH?groups=FILE, csv:PATH?group_column=COL); any NAME:train / NAME:test.")


@datasets_app.command("show")
def datasets_show(
    name: str = typer.Argument(..., help="A dataset name (e.g. chestxray:test, cifar10, csv:labels.csv)."),
    data_root: Optional[Path] = data_root_option(),
    download: bool = typer.Option(False, "--download", help="Let torchvision download it first."),
) -> None:
    """Layout found, number of examples, classes, multi-label or not, image size; for a grouped set
    (patients) the groups in each part, and a warning when the data's own split column puts a group
    on both sides."""
    from ..data import describe_dataset
    from ..data.groups import straddle_warning

    d = describe_dataset(name, data_root, download)
    for key, value in d.items():
        if key == "class_names" and isinstance(value, list) and len(value) > 20:
            value = ", ".join(map(str, value[:20])) + f", ... ({len(value)})"
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        out.print(f"[bold]{key}[/]: {escape(str(value))}")
    warning = straddle_warning(name, d)
    if warning:
        err.print(f"warning: {escape(warning)}", highlight=False, soft_wrap=True)


@datasets_app.command("check")
def datasets_check(
    names: Optional[List[str]] = typer.Argument(None, help="Datasets to check (default: every dataset of the catalogue's jobs, else the default ones)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="A TOML catalogue: its dataset names, and its jobs' datasets by default."),
    data_root: Optional[Path] = data_root_option(),
    first: int = typer.Option(3, "--first", min=1, help="Paths shown per problem."),
    quick: bool = typer.Option(False, "--quick", help="Read only the first bytes of each file (seconds for 100,000 images) instead of decoding every image as gsd rank does."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Before a long run: every dataset a run would use, with missing, unreadable or odd files (absent
    images of CSV rows, empty label cells, macOS ._ files, .DS_Store; every image decoded as gsd rank reads it:
    truncated, too large, NaN or out-of-range pixels): a count and the first paths of each problem; and warnings (a class
    folder holding sub-folders, images of mixed sizes or modes), which leave the exit status alone. Exit 0 clean, 1 problems found, 2 bad usage."""
    from ..data.check import check_datasets

    from .common import with_progress

    if catalog is not None:  # the data layer takes the catalogue loaded (it sits below gsd_cli.ranking.catalog)
        from ..ranking.catalog import load_catalog

        catalog = load_catalog(catalog)
    report = with_progress(quiet, lambda pr: check_datasets(names or None, catalog=catalog, data_root=data_root, quick=quick, progress=pr))
    for line in report.lines(first):
        out.print(escape(line), highlight=False, soft_wrap=True)
    if not report.ok:
        bad = sum(1 for d in report.datasets if d.problems)
        err.print(f"{bad} of {len(report.datasets)} dataset(s) have problems", highlight=False)
        raise typer.Exit(1)
