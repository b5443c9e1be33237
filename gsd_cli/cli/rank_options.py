"""``gsd rank``'s options, as a table (:data:`RANK_OPTIONS`: name -> (type, typer option)); the command,
:func:`gsd_cli.cli.rank.rank`, takes them as keyword arguments (:func:`gsd_cli.cli.options.with_options`).
Each help text is one sentence; the full explanation of every option is docs/rank.md's "Options reference"."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..defaults import DEFAULT_PRIVATE, DEFAULT_PUBLIC
from .options import (
    MODEL_FORMS, BatchNorm, Device, DpRepeats, Engine, Labels, RowNorm, batchnorm_option, classes_option, data_root_option, device_option,
    extra_argument, force_option, insecure_seed_option, json_option, peft_option, public_list_option, quiet_option, weights_option,
)

#: every option of ``gsd rank``, in the order ``--help`` shows them
RANK_OPTIONS = {
    "private": (str, typer.Option(DEFAULT_PRIVATE, "--private", help="Private dataset: a name (gsd datasets list), folder:PATH, csv:PATH, npz:PATH or hf:PATH, with :train or :test.")),
    "public": (Optional[List[str]], public_list_option(
        f"Public candidates, repeated or listed after it (default: {' '.join(DEFAULT_PUBLIC)})."
        )),
    "references": (bool, typer.Option(False, "--references", help="Rank noise references beside the candidates and say which are closer than noise (not with --dp or --catalog).")),
    "k": (int, typer.Option(16, "--k", "-k", help="Gradient subspace dimension (paper 004 uses 16).")),
    "examples": (int, typer.Option(2000, "--examples", "-m", help="Examples per dataset (all of a smaller set).")),
    "seed": (int, typer.Option(0, "--seed", help="Seed of the weights and draws (under --dp, public ones only).")),
    "insecure_seed": (Optional[int], insecure_seed_option("the --dp draws")),
    "classes": (Optional[str], classes_option()),
    "model": (str, typer.Option("probe", "--model", help="Model: probe, fmnist-cnn, resnet20, resnet50" + MODEL_FORMS)),
    "batchnorm": (BatchNorm, batchnorm_option("freeze")),
    "params": (Optional[List[str]], typer.Option(
        None, "--params", help="Glob patterns of the parameters that get gradients, e.g. 'fc.*' (default: all trainable)."
        )),
    "weights": (Optional[str], weights_option()),
    "peft": (Optional[str], peft_option()),
    "labels": (Labels, typer.Option(
        Labels.random, "--labels", help="random: uniform, as the authors do; own: the datasets' labels."
        )),
    "row_norm": (RowNorm, typer.Option(
        RowNorm.unit, "--row-norm",
        help="unit: each per-sample gradient scaled to norm 1 (the authors' experiment code); none: raw (the authors' demo notebook).",
        )),
    "device": (Device, device_option()),
    "chunk_size": (Optional[int], typer.Option(None, "--chunk-size", help="Examples per gradient chunk (default: 64 on CPU, 256 on CUDA).")),
    "engine": (Engine, typer.Option(Engine.auto, "--engine", help="Per-sample gradient engine (auto: layers, else vmap).")),
    "json_path": (Optional[Path], json_option("Write the ranking as JSON to this file.")),
    "csv_path": (Optional[Path], typer.Option(None, "--csv", help="Write the ranking as CSV to this file.")),
    "dp": (bool, typer.Option(
        False, "--dp",
        help="A pure epsilon-DP ranking, one release for all candidates: the DP selection, or --metric dp-energy or dp-gsd.",
        )),
    "top": (int, typer.Option(1, "--top", help="With --dp: how many candidates to choose.")),
    "regret_clip": (float, typer.Option(0.02, "--regret-clip", help="With --dp: clip of each private row's shortfall, in C^2.")),
    "score_share": (float, typer.Option(0.5, "--score-share", help="With --dp: the share of --epsilon for the scores.")),
    "epsilon": (Optional[float], typer.Option(None, "--epsilon", help="With --dp: the privacy budget (> 0).")),
    "clip": (float, typer.Option(1.0, "--clip", help="With --dp: per-sample clip norm C.")),
    "mechanism": (str, typer.Option(
        "sequential", "--mechanism",
        help="DP-GSD: sequential (pure DP) or matrix (NO proven guarantee).",
        )),
    "gibbs_sweeps": (int, typer.Option(10, "--gibbs-sweeps", help="With --mechanism matrix: Gibbs sweeps.")),
    "dp_sketch": (Optional[str], typer.Option(
        None, "--dp-sketch", metavar="D|public[+R]|none",
        help="Project the gradients to D random dimensions, or (public, with --dp) onto the candidates' subspaces plus R random ones.",
        )),
    "repeats": (int, typer.Option(
        1, "--repeats", "-R",
        help="Independent repeats (R > 1: intervals and a tie test).",
        )),
    "dp_repeats": (Optional[DpRepeats], typer.Option(
        None, "--dp-repeats",
        help="With --dp and --repeats: shared (default, one private DP sample) or fresh (one per repeat, R x --epsilon).",
        )),
    "plot_path": (Optional[Path], typer.Option(None, "--plot", help="Write a PNG of each candidate's distances with their intervals.")),
    "gram": (str, typer.Option(
        "auto", "--gram",
        help="materialize, ghost (Gram matrices) or auto (--memory-budget).",
        )),
    "memory_budget": (str, typer.Option("4G", "--memory-budget", help="Memory the gradient work may use (e.g. 512M).")),
    "subspace_method": (str, typer.Option(
        "auto", "--subspace-method",
        help="Top-k subspaces: exact, randomized (certified) or auto.",
        )),
    "quiet": (bool, quiet_option("No progress bar.")),
    "validity": (bool, typer.Option(False, "--validity", help="Also print what GSD's order and the advice were worth on held-out tasks (docs/validity.md).")),
    "data_root": (Optional[Path], data_root_option(
        "Folder of the built-in datasets such as cifar10 (default: $GSD_DATA_ROOT, else $XDG_DATA_HOME/gsd).",
        )),
    "download": (bool, typer.Option(False, "--download", help="Let torchvision download its datasets into the data root.")),
    "catalog": (Optional[Path], typer.Option(
        None, "--catalog", help="Run the jobs of this TOML catalogue (all, or those whose private dataset is --private)."
        )),
    "fail_fast": (bool, typer.Option(
        False, "--fail-fast", help="With --catalog: stop at the first job that fails (default: run the others, exit 2 at the end)."
        )),
    "markdown_path": (Optional[Path], typer.Option(None, "--markdown", help="Write the ranking(s) as a Markdown table to this file.")),
    "force": (bool, force_option()),
    "fail_above": (Optional[float], typer.Option(None, "--fail-above", help="Exit 1 when the best distance is above this.")),
    "expect_best": (Optional[str], typer.Option(None, "--expect-best", help="Exit 1 when another candidate ranks first.")),
    "no_cache": (bool, typer.Option(
        False, "--no-cache", help="Recompute every public subspace, not reusing the cache."
        )),
    "executor": (str, typer.Option(
        "local", "--executor", help="Where public subspaces run: local or ray ('gsd-cli[ray]')."
        )),
    "metric": (str, typer.Option(
        "gsd", "--metric", help="The distance: gsd, dp-energy or dp-gsd (with --dp), or a baseline: otdd ('gsd-cli[ot]'), frechet, task2vec, logme."
        )),
    "ray_address": (Optional[str], typer.Option(
        None, "--ray-address", help="With --executor ray: the cluster (default: $RAY_ADDRESS, else a local Ray instance)."
        )),
    "log": (Optional[List[str]], typer.Option(
        None, "--log", help="Also log each ranking to tensorboard or mlflow (or both)."
        )),
    "log_dir": (Path, typer.Option(Path("."), "--log-dir", help="With --log: the folder of tb/ and mlruns/.")),
    "extra": (Optional[List[str]], extra_argument()),
}
