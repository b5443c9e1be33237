"""``gsd pretrain``: one call of :func:`gsd_cli.train.pretrain.pretrain_base`, its lines."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..defaults import DEFAULT_PRIVATE
from .app import app
from .common import err, out, public_names, with_progress
from .options import MODEL_FORMS, Device, device_option, extra_argument, public_list_option, quiet_option


@app.command()
def pretrain(
    public: Optional[List[str]] = public_list_option("Public sets the base learns from, on their own labels (concatenated label spaces)."),
    catalog: Optional[Path] = typer.Option(None, "--catalog", help="TOML catalogue: its datasets resolve the names; without --public, every job's candidates."),
    private: Optional[List[str]] = typer.Option(None, "--private", help=f"A private set the base must not see (refused if a public set is it or shares an example; default {DEFAULT_PRIVATE}; repeat for more)."),
    model: str = typer.Option("fmnist-cnn", "--model", help="Model of the base: fmnist-cnn, resnet20, probe, a torchvision backbone (gsd models list)" + MODEL_FORMS),
    epochs: int = typer.Option(5, "--epochs", help="Epochs over the public sets (the best on a held-out tenth is kept)."),
    lr: float = typer.Option(1e-3, "--lr", help="Adam learning rate."),
    batch_size: int = typer.Option(64, "--batch-size", help="Minibatch size."),
    seed: int = typer.Option(0, "--seed", help="Initial weights, the examples drawn, the split and the order."),
    examples: Optional[int] = typer.Option(None, "--examples", "-m", help="At most this many examples of each set (default: all)."),
    out_dir: Path = typer.Option(..., "--out", help="New folder for the base: weights.safetensors and card.json."),
    device: Device = device_option(),
    quiet: bool = quiet_option("No progress bar."),
    extra: Optional[List[str]] = extra_argument(),
) -> None:
    """Build a base model from public sets only (supervised on their own labels), for --weights BASE of gsd train and
    gsd rank: BASE/weights.safetensors and BASE/card.json (what it saw, its settings, the weights' digest).

    It reads public data only: the base is not differentially private and costs no privacy budget (nothing is booked
    in the privacy ledger). A public set that is a --private set, shares an example with one, or that the privacy
    ledger knows as private data is refused."""
    from rich.markup import escape

    from ..train.pretrain import PRIVACY_NOTE, pretrain_base

    publics = public_names(public, extra)

    def notify(line: str) -> None:
        if not quiet or line.startswith("warning:"):
            err.print(escape(line), highlight=False)

    card = with_progress(quiet, lambda pr: pretrain_base(publics, out_dir, model=model, catalog=catalog, private=private or [DEFAULT_PRIVATE],
                                                         epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, examples=examples,
                                                         device=device.value, progress=pr, notify=notify), eta=True)
    tr = card["training"]
    acc = tr["validation_accuracy"][tr["best_epoch"] - 1] if tr["best_epoch"] else None
    out.print(f"built the base {escape(str(out_dir))}: {card['model']} ({card['input_size']}x{card['input_size']}x{card['channels']}), "
              f"{sum(s['examples'] for s in card['sets'])} public examples of {len(card['sets'])} set(s), {card['head_classes']} classes; "
              f"epoch {tr['best_epoch']} of {tr['epochs']} kept"
              + (f" (held-out accuracy {acc:.4f})" if acc is not None else "") + f", {tr['seconds']:.0f} s", highlight=False)
    out.print(f"gsd pretrain {PRIVACY_NOTE}.", highlight=False)
    out.print(f"wrote {escape(str(out_dir))}/weights.safetensors (SHA-256 {card['weights_sha256'][:16]}...) and card.json; "
              f"use it with --weights {escape(str(out_dir))} --model {escape(card['model'])}", highlight=False)
