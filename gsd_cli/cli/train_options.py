"""``gsd train``'s options, as a table (:data:`TRAIN_OPTIONS`: name -> (type, typer option)); the command,
:func:`gsd_cli.cli.train.train`, takes them as keyword arguments (:func:`gsd_cli.cli.options.with_options`).
Each help text is one sentence; the full explanation of every option is docs/train.md's "Options reference"."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..defaults import DEFAULT_PRIVATE
from .options import (
    MODEL_FORMS, Accountant, BatchNorm, Device, Method, Schedule, batchnorm_option, classes_option, data_root_option,
    deterministic_noise_option, device_option, extra_argument, insecure_seed_option, peft_option, public_list_option, quiet_option,
    weights_option,
)


def _panel(option, panel: str):
    """A shared option (``options.py``) shown under the help panel ``panel`` of ``gsd train --help``."""
    option.rich_help_panel = panel
    return option


#: where --lr, --epochs and --batch-size come from when not given (gsd_cli.train.tuned)
TUNED_NOTE = "default {v} for dpsgd and second-phase on fmnist-cnn (tuned on the held-out benchmark's selection tasks), else {u}."

#: every option of ``gsd train``, in the order ``--help`` shows them
TRAIN_OPTIONS = {
    "private": (str, typer.Option(DEFAULT_PRIVATE, "--private", help="Private dataset: trains on NAME:train, tests on NAME:test.", rich_help_panel="Data")),
    "public": (Optional[List[str]], _panel(public_list_option("Public dataset; with --auto-select, the candidates (default: gsd rank's)."), "Data")),
    "auto_select": (bool, typer.Option(False, "--auto-select", help="Rank the --public candidates first and train as the advice decides.", rich_help_panel="Data")),
    "catalog_path": (Optional[Path], typer.Option(None, "--catalog", help="TOML catalogue of datasets, whose --private job gives --auto-select's candidates.", rich_help_panel="Data")),
    "method": (Optional[Method], typer.Option(None, "--method", show_default=False, help="Training method (default: auto with --auto-select, else gep).", rich_help_panel="Privacy")),
    "epsilon": (float, typer.Option(2.0, "--epsilon", help="Target epsilon of the run.", rich_help_panel="Privacy")),
    "delta": (float, typer.Option(1e-5, "--delta", help="Target delta, below 1/N.", rich_help_panel="Privacy")),
    "private_test": (Optional[str], typer.Option(None, "--private-test", help="Test set for evaluation (default: the private dataset's test part); its classes are matched to the training set's by name.", rich_help_panel="Data")),
    "model": (str, typer.Option("fmnist-cnn", "--model", help="Model to train: fmnist-cnn, resnet20, probe, a torchvision backbone (gsd models list)" + MODEL_FORMS, rich_help_panel="Model")),
    "batchnorm": (BatchNorm, batchnorm_option("refuse", "Model")),
    "params": (Optional[List[str]], typer.Option(None, "--params", help="Glob patterns of the parameters to train (default: all).", rich_help_panel="Model")),
    "weights": (Optional[str], _panel(weights_option(), "Model")),
    "peft": (Optional[str], _panel(peft_option(), "Model")),
    "public_epochs": (int, typer.Option(20, "--public-epochs", help="Most epochs of stage 1 per learning rate (early stopping).", rich_help_panel="Second phase (--method second-phase)")),
    "public_lr": (Optional[float], typer.Option(None, "--public-lr", help="Adam lr of stage 1 (default: chosen on validation around 3e-3).", rich_help_panel="Second phase (--method second-phase)")),
    "public_batch_size": (int, typer.Option(64, "--public-batch-size", help="Minibatch size of stage 1.", rich_help_panel="Second phase (--method second-phase)")),
    "public_val": (float, typer.Option(0.1, "--public-val", help="Fraction of public examples stage 1 holds out for validation.", rich_help_panel="Second phase (--method second-phase)")),
    "public_patience": (int, typer.Option(3, "--public-patience", help="Stage 1 stops this many epochs after its best (0: never).", rich_help_panel="Second phase (--method second-phase)")),
    "public_augment": (str, typer.Option("auto", "--public-augment", help="Stage 1's augmentation: auto, none, crop, crop-flip, affine.", rich_help_panel="Second phase (--method second-phase)")),
    "epochs": (Optional[int], typer.Option(None, "--epochs", show_default=False, help="Epochs; " + TUNED_NOTE.format(v="12", u="20"), rich_help_panel="Optimisation")),
    "batch_size": (Optional[int], typer.Option(None, "--batch-size", show_default=False, help="Expected (Poisson) batch size; " + TUNED_NOTE.format(v="500", u="250"), rich_help_panel="Optimisation")),
    "expected_size": (Optional[int], typer.Option(None, "--expected-size", help="Declared (public) size N0 of the private set (default: a DP estimate of N).", rich_help_panel="Optimisation")),
    "sampling_rate": (Optional[float], typer.Option(None, "--sampling-rate", help="Declared (public) Poisson sampling rate q, instead of --expected-size.", rich_help_panel="Optimisation")),
    "max_steps": (int, typer.Option(100_000, "--max-steps", help="Most steps the run may plan (larger plans are refused).", rich_help_panel="Optimisation")),
    "size_epsilon": (Optional[float], typer.Option(None, "--size-epsilon", help="Epsilon of the DP estimate of N when no size is declared (default 2% of --epsilon).", rich_help_panel="Privacy")),
    "lr": (Optional[float], typer.Option(None, "--lr", show_default=False, help="SGD learning rate; " + TUNED_NOTE.format(v="0.5", u="0.1"), rich_help_panel="Optimisation")),
    "momentum": (float, typer.Option(0.9, "--momentum", help="SGD momentum.", rich_help_panel="Optimisation")),
    "weight_decay": (float, typer.Option(1e-4, "--weight-decay", help="SGD weight decay.", rich_help_panel="Optimisation")),
    "lr_schedule": (Schedule, typer.Option(Schedule.step, "--lr-schedule", help="step: lr / 10 from mid-training (paper 000); constant.", rich_help_panel="Optimisation")),
    "seed": (int, typer.Option(0, "--seed", help="Public seed: initial weights, public anchors and their labels.", rich_help_panel="Optimisation")),
    "clip": (float, typer.Option(1.0, "--clip", help="dpsgd: per-sample clip norm C.", rich_help_panel="Privacy")),
    "clip_engine": (str, typer.Option("auto", "--clip-engine", help="dpsgd, second-phase: how the clipped sum is computed (ghost, materialise or auto).", rich_help_panel="Privacy")),
    "k": (int, typer.Option(32, "--k", help="Anchor subspace dimension (shared by the groups).", rich_help_panel="GEP (--method gep)")),
    "public_examples": (Optional[int], typer.Option(None, "--public-examples", show_default=False, help="GEP anchors (default 2000); stage 1's examples (default all).", rich_help_panel="GEP (--method gep)")),
    "power_iters": (int, typer.Option(1, "--power-iters", help="Power iterations per step (the paper uses 1).", rich_help_panel="GEP (--method gep)")),
    "groups": (str, typer.Option("auto", "--groups", help="Parameter groups, ';' between groups, ',' between globs (auto, none).", rich_help_panel="GEP (--method gep)")),
    "clip_embedding": (float, typer.Option(1.0, "--clip-embedding", help="Clip norm S1 of the embedding (noise std sigma*S1).", rich_help_panel="GEP (--method gep)")),
    "clip_residual": (float, typer.Option(0.5, "--clip-residual", help="Clip norm S2 of the residual (noise std sigma*S2).", rich_help_panel="GEP (--method gep)")),
    "residual": (bool, typer.Option(True, "--residual/--no-residual", help="Release (GEP) or drop (B-GEP) the residual.", rich_help_panel="GEP (--method gep)")),
    "anchor_every": (int, typer.Option(4, "--anchor-every", help="Recompute the anchor basis every N steps (same epsilon).", rich_help_panel="GEP (--method gep)")),
    "anchor_warm": (bool, typer.Option(True, "--anchor-warm/--anchor-cold", help="Start each power iteration from the previous basis, or a random one.", rich_help_panel="GEP (--method gep)")),
    "anchor_batch": (int, typer.Option(128, "--anchor-batch", help="Anchors per recomputation (0: all --public-examples).", rich_help_panel="GEP (--method gep)")),
    "rgp_rank": (int, typer.Option(4, "--rgp-rank", help="rgp: rank r of the gradient carriers of each Linear/Conv2d weight.", rich_help_panel="RGP, TopAgg, sparsification")),
    "rgp_warmup": (int, typer.Option(20, "--rgp-warmup", help="rgp: warm-up steps whose carriers decompose the weight itself.", rich_help_panel="RGP, TopAgg, sparsification")),
    "topk_fraction": (float, typer.Option(0.7, "--topk-fraction", help="topagg: NormTopK keeps K in (0, 1] of each gradient's squared norm.", rich_help_panel="RGP, TopAgg, sparsification")),
    "sparsify": (float, typer.Option(0.0, "--sparsify", help="dpsgd, gep: random sparsification's final rate in [0, 1) (paper 003).", rich_help_panel="RGP, TopAgg, sparsification")),
    "accountant": (Accountant, typer.Option(Accountant.rdp, "--accountant", help="dp-accounting's accountant.", rich_help_panel="Privacy")),
    "physical_batch": (Optional[int], typer.Option(None, "--physical-batch", help="Examples per per-sample-gradient chunk (default 64 on CPU, 256 on GPU).", rich_help_panel="Optimisation")),
    "insecure_seed": (Optional[int], _panel(insecure_seed_option("sampling, noise, DP draws"), "Privacy")),
    "deterministic_noise": (bool, _panel(deterministic_noise_option(), "Privacy")),
    "classes": (Optional[str], _panel(classes_option(), "Data")),
    "data_root": (Optional[Path], _panel(data_root_option(), "Data")),
    "out_dir": (Optional[Path], typer.Option(None, "--out", help="New run folder (default gsd-train-<time>); its parent must exist.", rich_help_panel="Run folder and output")),
    "resume": (Optional[Path], typer.Option(None, "--resume", help="Continue the interrupted run in this folder, with its own settings.", rich_help_panel="Run folder and output")),
    "rank_model": (Optional[str], typer.Option(None, "--rank-model", help="Model of the ranking (default: probe, or the trained one with --weights or --peft).", rich_help_panel="Auto-select ranking (--auto-select)")),
    "rank_k": (int, typer.Option(16, "--rank-k", help="Subspace dimension of the ranking.", rich_help_panel="Auto-select ranking (--auto-select)")),
    "rank_examples": (int, typer.Option(2000, "--rank-examples", help="Examples per dataset in the ranking.", rich_help_panel="Auto-select ranking (--auto-select)")),
    "select_epsilon": (Optional[float], typer.Option(None, "--select-epsilon", help="Make the selection private at this epsilon, part of --epsilon (default: not private).", rich_help_panel="Auto-select ranking (--auto-select)")),
    "probe_repeats": (int, typer.Option(3, "--probe-repeats", min=0, max=100, help="Draws of the feature probe (0: no probe).", rich_help_panel="Auto-select ranking (--auto-select)")),
    "probe_stage1": (str, typer.Option("quick", "--probe-stage1", help="Probe's stage 1: quick (one lr) or same (the run's).", rich_help_panel="Auto-select ranking (--auto-select)")),
    "rank_repeats": (Optional[int], typer.Option(None, "--rank-repeats", help="Ranking draws (default 3; 1 with --select-epsilon).", rich_help_panel="Auto-select ranking (--auto-select)")),
    "fallback": (bool, typer.Option(True, "--fallback/--no-fallback", help="Follow the advice, or the closest candidate anyway.", rich_help_panel="Auto-select ranking (--auto-select)")),
    "warm_cache": (bool, typer.Option(False, "--warm-cache", help="Compute the advice's public work into gsd's cache and stop (no private example read).", rich_help_panel="Auto-select ranking (--auto-select)")),
    "device": (Device, _panel(device_option(), "Run folder and output")),
    "nproc": (int, typer.Option(1, "--nproc", help="Processes to train with on this machine (not under torchrun).", rich_help_panel="Run folder and output")),
    "quiet": (bool, _panel(quiet_option("No progress bars."), "Run folder and output")),
    "log": (Optional[List[str]], typer.Option(None, "--log", help="Also log the run to tensorboard or mlflow (repeat the option for both).", rich_help_panel="Run folder and output")),
    "log_dir": (Optional[Path], typer.Option(None, "--log-dir", help="With --log: the folder of tb/ and mlruns/ instead of the run folder.", rich_help_panel="Run folder and output")),
    "extra": (Optional[List[str]], extra_argument()),
}
