"""``gsd datasets``: the built-in names and what is on disk (``gsd_cli.data``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .app import app
from .common import out
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
    out.print("Generic sources: folder:PATH, csv:PATH, npz:PATH, hf:PATH; any NAME:train / NAME:test.")


@datasets_app.command("show")
def datasets_show(
    name: str = typer.Argument(..., help="A dataset name (e.g. chestxray:test, cifar10, csv:labels.csv)."),
    data_root: Optional[Path] = data_root_option(),
    download: bool = typer.Option(False, "--download", help="Let torchvision download it first."),
) -> None:
    """Layout found, number of examples, classes, multi-label or not, image size."""
    from ..data import describe_dataset

    d = describe_dataset(name, data_root, download)
    for key, value in d.items():
        if key == "class_names" and isinstance(value, list) and len(value) > 20:
            value = ", ".join(map(str, value[:20])) + f", ... ({len(value)})"
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        out.print(f"[bold]{key}[/]: {escape(str(value))}")
