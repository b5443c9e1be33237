"""The predictors scored by the validity benchmark, each a value per (task, candidate, seed), lower
meaning "predicted more useful"; cached as JSON under ``RESULTS/predictors``.

* GSD variants, from one pass of per-sample gradients per (task, seed, model, labels, input scaling):
  the library's own steps (:func:`gsd_cli.data.draw`, :func:`gsd_cli.distance.side.sample_labels`,
  :func:`gsd_cli.gradients.gradient_matrix`, :func:`gsd_cli.models.peft.build_model`,
  :func:`gsd_cli.subspace.top_k_subspace`, :func:`gsd_cli.subspace.projection_metric`), so that k, the
  row norm and m (the first half of the rows) vary without recomputing gradients. One case is checked
  against ``gsd_cli.rank`` to the last digit (:func:`check_against_rank`).
* DP-GSD at epsilon 1, 4, 16, with and without a sketch (:func:`gsd_cli.distance.side.sketch`, D=32): the
  private side by :func:`gsd_cli.subspace.dppca.private_top_k_subspace` (sequential mechanism, clip 1) on the
  same rows as the non-private value, the draw seeded (benchmark only: not DP).
* Baselines, through the ranking's own interface: ``gsd_cli.rank(..., distance=NAME)``.
"""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import numpy as np
import torch

from .tasks import TASKS, private_train, register, source

RESULTS = Path(__file__).resolve().parents[1] / "results" / "validity" / "predictors"
PRED_SEEDS = (0, 1, 2)
EPSILONS = (1.0, 4.0, 16.0)
SKETCH = 32
BASELINES = ("otdd", "frechet", "task2vec", "logme")

#: gradient passes: name -> (model, labels, scaled inputs, examples m)
PASSES = {
    "cnn": ("fmnist-cnn", "random", False, 500),
    "probe": ("probe", "random", False, 250),
    "probe-tanh": ("probe-tanh", "random", False, 250),
    "probe-none": ("probe-none", "random", False, 250),
    "cnn-own": ("fmnist-cnn", "own", False, 500),
    "cnn-tanh": ("fmnist-cnn-tanh", "random", False, 500),
    "cnn-none": ("fmnist-cnn-none", "random", False, 500),
    "cnn-scaled": ("fmnist-cnn", "random", True, 500),
    "probe-own": ("probe", "own", False, 250),
}
#: passes whose k, row-norm and m variants are also recorded (and, for "cnn" and "probe", DP-GSD)
VARIED = ("cnn", "probe")


def register_models() -> None:
    """The probe and fmnist-cnn with tanh or no hidden activation, as models of the registry (same
    parameters, so the same w0 from a seed as their ReLU versions)."""
    from probes import ModelSpec, get_model_spec, register as reg
    from probes.cnn import fmnist_cnn, probe

    for base, fn in (("probe", probe), ("fmnist-cnn", fmnist_cnn)):
        spec = get_model_spec(base)
        for act in ("tanh", "none"):
            reg(ModelSpec(f"{base}-{act}", functools.partial(fn, activation=act), spec.input_size, spec.channels,
                          f"{base} with hidden activation {act}"))


def scaled(src):
    """The source with each image's pixels standardised (zero mean, unit sd per image), then mapped to
    mean 0.5, sd 0.25: the same examples, the contrast and polarity of intensity kept, brightness gone."""
    from gsd_cli.data import ArraySource

    idx = np.arange(len(src))
    x = np.stack(src.images(idx)).astype(np.float64)
    axes = tuple(range(1, x.ndim))
    z = (x - x.mean(axis=axes, keepdims=True)) / np.maximum(x.std(axis=axes, keepdims=True), 1e-6)
    return ArraySource(src.name, (0.5 + 0.25 * z).astype(np.float32), src.labels(idx), src.num_classes, "scaled " + src.name)


def gradients(model, sample, labels: str, num_classes: int, seed: int, spec, names) -> torch.Tensor | None:
    """Raw per-sample gradients (m x p) as ``gsd rank`` computes them, or None when the sample's own
    labels do not fit the model's classes."""
    from gsd_cli.errors import GSDError
    from gsd_cli.gradients import gradient_matrix
    from gsd_cli.distance.side import sample_labels

    try:
        y = sample_labels(sample, labels, num_classes, seed)
    except GSDError:
        return None
    batches = ((x, y[s : s + x.shape[0]]) for s, x in sample.batches(spec.input_size, spec.channels, 64, "cpu"))
    return gradient_matrix(model, batches, len(sample), names, None, "vmap", "cpu", "none")


def _unit(G: torch.Tensor) -> torch.Tensor:
    n = G.norm(dim=1, keepdim=True)
    return G / torch.where(n > 0, n, torch.ones_like(n))


def variants(G: torch.Tensor, varied: bool) -> dict[str, torch.Tensor]:
    """The matrices whose top-k subspaces are compared: name -> (rows, k)."""
    U = _unit(G)
    out = {"": (U, 16)}
    if varied:
        out.update({"k8": (U, 8), "k32": (U, 32), "rownone": (G, 16), "mhalf": (U[: len(U) // 2], 16)})
    return out


def _path(task: str, name: str, seed: int) -> Path:
    return RESULTS / task / f"{name}-s{seed}.json"


def _save(task: str, name: str, seed: int, values: dict) -> None:
    f = _path(task, name, seed)
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(values, indent=1) + "\n")


def gsd_pass(task: str, pass_name: str, seed: int) -> None:
    """Every predictor of one gradient pass, saved (skipped when its files exist)."""
    from gsd_cli import data as gdata
    from gsd_cli.subspace.dppca import private_top_k_subspace
    from gsd_cli.models.peft import build_model
    from gsd_cli.distance.side import sketch
    from gsd_cli.subspace import projection_metric, top_k_subspace

    model_name, labels, scale, m = PASSES[pass_name]
    varied = pass_name in VARIED
    if _path(task, pass_name, seed).is_file():
        return
    t0 = time.perf_counter()
    priv_src = private_train(task)
    num_classes = priv_src.num_classes
    spec, net, names, _ = build_model(model_name, num_classes, seed)
    cands = TASKS[task][1]

    def sample_of(src):
        smp = gdata.draw(src, m, seed)
        return gdata.Sample(scaled(src), smp.indices) if scale else smp

    Gp = gradients(net, sample_of(priv_src), labels, num_classes, seed, spec, names)
    priv = {v: top_k_subspace(M, k)[0] for v, (M, k) in variants(Gp, varied).items()}
    dp = {}
    if varied:
        Up = _unit(Gp)
        for eps in EPSILONS:
            for sk in (None, SKETCH):
                M = Up if sk is None else sketch(Up, sk, seed)
                rng = np.random.default_rng([seed, 4242, int(eps * 10), sk or 0])
                dp[(eps, sk)] = private_top_k_subspace(M, 16, eps, 1.0, "sequential", rng)
        Sp = sketch(Up, SKETCH, seed)
        priv["sketch"] = top_k_subspace(Sp, 16)[0]
    del Gp
    values: dict[str, dict] = {}
    for c in cands:
        G = gradients(net, sample_of(source(c)), labels, num_classes, seed, spec, names)
        for v, (M, k) in (variants(G, varied).items() if G is not None else []):
            values.setdefault(v, {})[c] = projection_metric(priv[v], top_k_subspace(M, k)[0])
        if G is not None and varied:
            U = _unit(G)
            Vpub = top_k_subspace(U, 16)[0]
            Vsk = top_k_subspace(sketch(U, SKETCH, seed), 16)[0]
            values.setdefault("sketch", {})[c] = projection_metric(priv["sketch"], Vsk)
            for (eps, sk), Vd in dp.items():
                values.setdefault(f"dp{eps:g}" + ("-sketch" if sk else ""), {})[c] = projection_metric(Vd, Vsk if sk else Vpub)
        for v in (variants(torch.zeros(2, 1), varied) if G is None else []):
            values.setdefault(v, {})[c] = None
        del G
    for v, vals in values.items():
        _save(task, pass_name + (f"-{v}" if v else ""), seed, vals)
    print(f"  {task} {pass_name} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)


def baseline_pass(task: str, metric: str, seed: int, model: str = "fmnist-cnn", m: int = 500) -> None:
    """A baseline through ``gsd_cli.rank(..., distance=metric)``, saved."""
    from gsd_cli.ranking import rank

    name = f"{metric}" if model == "fmnist-cnn" else f"{metric}-{model}"
    if _path(task, name, seed).is_file():
        return
    t0 = time.perf_counter()
    r = rank(private_train(task), list(TASKS[task][1]), examples=m, k=16, model=model, seed=seed, device="cpu",
             engine="vmap", distance=metric)
    assert r.metric == metric and r.dp is False
    _save(task, name, seed, {x.public: x.distance for x in r})
    print(f"  {task} {name} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)


def check_against_rank(task: str = "digits", seed: int = 0) -> float:
    """The largest difference between the pass "cnn" and ``gsd_cli.rank`` with the same settings."""
    from gsd_cli.ranking import rank

    gsd_pass(task, "cnn", seed)
    mine = json.loads(_path(task, "cnn", seed).read_text())
    r = rank(private_train(task), list(TASKS[task][1]), examples=500, k=16, model="fmnist-cnn", seed=seed, device="cpu", engine="vmap")
    return max(abs(mine[x.public] - x.distance) for x in r)


def compute_all(tasks=None, seeds=PRED_SEEDS, passes=None, baselines=BASELINES) -> None:
    register()
    register_models()
    torch.set_num_threads(1)
    for seed in seeds:
        for task in tasks or TASKS:
            order = list(passes or PASSES)
            for p in order[:2]:
                gsd_pass(task, p, seed)
            for b in baselines:
                baseline_pass(task, b, seed)
            for p in order[2:]:
                gsd_pass(task, p, seed)


def load(task: str) -> dict[str, dict[int, dict]]:
    """predictor name -> seed -> {candidate: value}."""
    out: dict[str, dict[int, dict]] = {}
    for f in sorted((RESULTS / task).glob("*-s*.json")) if (RESULTS / task).is_dir() else []:
        name, _, seed = f.stem.rpartition("-s")
        out.setdefault(name, {})[int(seed)] = json.loads(f.read_text())
    return out
