"""``gsd compare``: one call of ``gsd_cli.train.compare.compare``, its table."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..defaults import DEFAULT_PRIVATE
from .app import app
from .common import err, new_run_dir, out, print_private, with_progress
from .options import Device, deterministic_noise_option, device_option, insecure_seed_option, peft_option, quiet_option, weights_option


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
    expected_size: Optional[int] = typer.Option(None, "--expected-size", help="Declared (public) private-set size N0 (q = batch size / N0) for every run; default: each run's DP estimate of N (as gsd train)."),
    sampling_rate: Optional[float] = typer.Option(None, "--sampling-rate", help="Declared (public) sampling rate q for every run, instead of --expected-size."),
    lr: float = typer.Option(0.1, "--lr", help="SGD learning rate."),
    momentum: float = typer.Option(0.9, "--momentum", help="SGD momentum."),
    clip: float = typer.Option(1.0, "--clip", help="dpsgd, rgp, topagg: clip norm C."),
    k: int = typer.Option(50, "--k", help="gep: anchor subspace dimension."),
    public_examples: int = typer.Option(1000, "--public-examples", help="gep: public anchor examples; second-phase: stage-1 examples."),
    rgp_rank: int = typer.Option(4, "--rgp-rank", help="rgp: carrier rank r."),
    rgp_warmup: int = typer.Option(20, "--rgp-warmup", help="rgp: warm-up steps."),
    topk_fraction: float = typer.Option(0.7, "--topk-fraction", help="topagg: K."),
    weights: Optional[str] = weights_option("Pre-trained weights of --model for every method (as gsd train --weights)."),
    peft: Optional[str] = peft_option("Trainable parameters for every method (as gsd train --peft); all else frozen."),
    public_epochs: int = typer.Option(5, "--public-epochs", help="second-phase: most epochs of stage 1 on the public set per learning rate (early stopping)."),
    public_lr: Optional[float] = typer.Option(None, "--public-lr", help="second-phase: Adam learning rate of stage 1 (default: chosen on validation around 3e-3 from scratch; with --weights paper 004's 5e-5 CNN, 3e-3 transformer)."),
    insecure_seed: Optional[int] = insecure_seed_option("the sampling and noise of run i: this seed + i"),
    deterministic_noise: bool = deterministic_noise_option(),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="New folder for the runs and comparison.json/.csv/.png (default gsd-compare-<time>); never overwritten."),
    device: Device = device_option(),
    quiet: bool = quiet_option("No progress bars."),
) -> None:
    """Train several private methods side by side on one task under one (epsilon, delta) and one
    accountant; print one table (test accuracy mean +- sd over seeds) and save JSON, CSV and a plot.

    Every method is a Poisson-subsampled Gaussian mechanism per step with the sensitivities of
    ``gsd train --help``; each run's sigma is calibrated so its epsilon is at most --epsilon. The runs
    are separate releases about one private set: together they spend the sum of their budgets, which
    the table and comparison.json report. The files hold test metrics of private data: not publishable.
    """
    from ..train.compare import compare as compare_fn, comparison_table
    from ..train import TrainConfig
    base = TrainConfig(delta=delta, model=model, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, clip=clip, k=k,
                       expected_size=expected_size, sampling_rate=sampling_rate,
                       public_examples=public_examples, rgp_rank=rgp_rank, rgp_warmup=rgp_warmup, topk_fraction=topk_fraction,
                       weights=weights, peft=peft, public_epochs=public_epochs, public_lr=public_lr,
                       deterministic_noise=deterministic_noise, insecure_seed=insecure_seed, seed=seed)
    run = new_run_dir(out_dir, "gsd-compare")

    def on_run(r: dict) -> None:
        if not quiet:
            print_private(err, f"{r['method']} seed {r['seed']}: accuracy {r['accuracy']:.4f}, epsilon {r['epsilon']:.3f} ({r['seconds']:.0f} s)")

    result = with_progress(quiet, lambda pr: compare_fn(private, public, methods, epsilon, seeds, run, sparsify=sparsify, base=base,
                                                        device=device.value, progress=pr, on_run=on_run), width=8, eta=True,
                           private=True)  # the runs' times grow with the private set: labelled private
    out.print(comparison_table(result))
    err.print(f"wrote {run}/comparison.json, comparison.csv, comparison.png and one folder per run")
