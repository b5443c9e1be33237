"""``gsd models``: the registry, parameter names and counts, PEFT presets (``gsd_cli.models.info``)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from .app import app
from .common import err, out
from .options import BatchNorm, batchnorm_option, force_option, json_option

models_app = typer.Typer(help="Models: the registry, parameter names and counts, PEFT presets.", no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list() -> None:
    """Every registered model with its input size and presets."""
    from rich.table import Table

    from ..models.info import list_models_info

    t = Table(title="models (NAME@SIZE builds a model for SIZExSIZE inputs, e.g. resnet18@32)")
    for c in ("name", "input", "presets", "description"):
        t.add_column(c, overflow="fold")
    for r in list_models_info():
        t.add_row(r["name"], f"{r['input_size']}x{r['input_size']}x{r['channels']}", ", ".join(r["presets"]) or "-", escape(r["description"]))
    out.print(t)
    out.print("--peft also takes: head, bitfit, lora[:r=8,alpha=8,targets=REGEX], or parameter names/glob patterns.")
    out.print("--model also takes timm:NAME (pip install 'gsd-cli[timm]') and PATH.py:FACTORY (your nn.Module; loading it runs "
              "the file), with @SIZE or @SIZExCHANNELS: e.g. timm:resnet10t@64, net.py:make@28x1.", highlight=False)


@models_app.command("show")
def models_show(
    name: str = typer.Argument(..., help="A model name (gsd models list), timm:NAME or PATH.py:FACTORY."),
    peft: Optional[str] = typer.Option(None, "--peft", help="Mark what this --peft choice trains."),
    classes: int = typer.Option(10, "--classes", help="Size of the head."),
    batchnorm: BatchNorm = batchnorm_option("freeze"),
    json_path: Optional[Path] = json_option("Write the listing as JSON to this file."),
    force: bool = force_option(),
) -> None:
    """Parameter names, shapes and counts, and each preset's parameters (builds the model: a timm or file model runs one forward pass)."""
    import json as _json

    from rich.table import Table

    from ..models.info import show_model
    from ..report import check_output_path, write_text

    json_file = check_output_path(json_path, "--json", force)
    from ..report.outputs import check_not_inputs, run_inputs

    check_not_inputs({"--json": json_file}, run_inputs([], None, None, name))  # a model file net.py:make
    d = show_model(name, classes, peft, batchnorm.value)
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
    if d.get("batchnorm"):
        out.print(f"[bold]--batchnorm {d['batchnorm']['policy']}[/]: {d['batchnorm']['layers']} layer(s); {escape(d['batchnorm']['note'])}")
    if json_file:
        write_text(json_file, _json.dumps(d, indent=2) + "\n")
        err.print(f"wrote {json_file}")
