"""``gsd compare``: private trainers side by side on one task, under one budget.

>>> from gsd_cli.train.compare import compare
>>> result = compare("mnist-a", "mnist-b", ["dpsgd", "gep", "rgp", "topagg", "gep+rs"], epsilon=2.0, seeds=3,
...                  out="cmp")  # doctest: +SKIP

Every method trains with :func:`gsd_cli.train.train` at the same target (epsilon, delta), the same
model, epochs, batch size and optimizer, for seeds ``seed, seed + 1, ...`` (the seed sets the initial
weights, the public anchors and the RS masks; with ``deterministic_noise`` also the private sampling
and noise), each run in its own folder ``OUT/<method>/seed<s>``. ``NAME+rs`` is method NAME (dpsgd or
gep) with random sparsification at final rate ``sparsify``. The result: per method the test metric
that leads for the task (``metric``: macro AUC multi-label, balanced accuracy unbalanced, else
accuracy; :mod:`gsd_cli.train.evaluate`) and the accuracy (mean +- sample sd over seeds), the epsilon reached, sigma and time, written to ``OUT/comparison.json``,
``OUT/comparison.csv`` and ``OUT/comparison.png``. ``OUT`` must not exist (or be empty): nothing is
overwritten.

Budget: every run is a separate release about the same private set, so the comparison as a whole
spends the **sum** of the runs' budgets (basic composition: epsilons add, deltas add; the runs are
not adaptive to each other's outputs, but no tighter bound is claimed). ``privacy_total`` in the
result, the table and the JSON say so. The comparison's files hold test metrics of the private data
(not DP): they are marked ``"publishable": false``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

from ..errors import GSDError
from ..privacy.randomness import MAX_SEED
from .checkpoint import RUN_DIR_MODE, atomic_write, prepare_run_dir
from .config import METHODS, SPARSIFIABLE, TrainConfig, validate
from .methods import method_privacy

COMPARABLE = tuple(METHODS) + tuple(f"{m}+rs" for m in SPARSIFIABLE)


def parse_methods(spec: str | Sequence[str]) -> list[tuple[str, str, bool]]:
    """``"dpsgd,gep+rs"`` (or a list) -> ``[(label, method, sparsified)]``; unknown names, repeats and
    an empty list are one-line errors."""
    items = spec.split(",") if isinstance(spec, str) else [x for s in spec for x in str(s).split(",")]
    labels = [s.strip().lower() for s in items if s.strip()]
    if not labels:
        raise GSDError(f"--methods is empty; give a comma-separated list of {', '.join(COMPARABLE)}")
    out = []
    for lab in labels:
        if lab not in COMPARABLE:
            raise GSDError(f"unknown method {lab!r} in --methods; use {', '.join(COMPARABLE)}")
        if any(lab == o[0] for o in out):
            raise GSDError(f"method {lab!r} is listed twice in --methods")
        base, _, rs = lab.partition("+")
        out.append((lab, base, bool(rs)))
    return out


def _sd(xs: list[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) > 1 else None


def compare(
    private: str,
    public: str | None,
    methods: str | Sequence[str],
    epsilon: float,
    seeds: int = 3,
    out: str | Path = "gsd-compare",
    *,
    sparsify: float = 0.5,
    base: TrainConfig | None = None,
    device: str = "auto",
    progress: Callable[[str, int, int], None] | None = None,
    on_run: Callable[[dict], None] | None = None,
) -> dict:
    """Train every method of ``methods`` for ``seeds`` seeds at ``epsilon`` and tabulate.

    ``base``: the shared settings (model, epochs, batch size, lr, clip, GEP/RGP/TopAgg options...;
    its private, public, method, epsilon and sparsify are replaced). ``sparsify``: the final RS rate of
    the ``+rs`` methods. ``on_run(row)`` is called after each run. Returns the comparison (also
    written to ``out``)."""
    specs = parse_methods(methods)
    if seeds < 1:
        raise GSDError(f"--seeds must be at least 1 (got {seeds})")
    base = base or TrainConfig()
    for option, first in (("--seed", base.seed), ("--insecure-seed", base.insecure_seed)):
        if isinstance(first, int) and first + seeds - 1 > MAX_SEED:  # the runs' seeds are first .. first + seeds - 1
            raise GSDError(f"{option} {first} with --seeds {seeds} gives seeds up to {first + seeds - 1}, above 2^63 - 1 "
                           f"({MAX_SEED}); lower {option}")
    if any(rs for *_, rs in specs) and not 0 < sparsify < 1:
        raise GSDError(f"--sparsify must be in (0, 1) for the +rs methods (got {sparsify})")
    cfgs = []
    for label, method, rs in specs:
        for i in range(seeds):
            cfg = dataclasses.replace(base, private=private, public=public if method in ("gep", "second-phase") else None, method=method,
                                      epsilon=epsilon, sparsify=sparsify if rs else 0.0, seed=base.seed + i,
                                      insecure_seed=None if base.insecure_seed is None else base.insecure_seed + i)
            validate(cfg)  # every user error before the first run
            cfgs.append((label, cfg))
    from .loop import refuse_shared_public
    from .splits import private_parts

    parts = private_parts(private)
    for _, cfg in cfgs:  # public data that holds private examples: refused before the first run
        if cfg.method in ("gep", "second-phase") and cfg.seed == base.seed:
            refuse_shared_public(cfg, parts)
    out = Path(out).expanduser()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GSDError(f"--out {out} exists and is not empty; give a new folder (gsd compare never overwrites)")
    out = prepare_run_dir(out, resume=False)
    from . import train

    runs = []
    t0 = time.perf_counter()
    for n, (label, cfg) in enumerate(cfgs):
        if progress:
            progress("runs", n, len(cfgs))
        run_dir = out / label.replace("+", "_") / f"seed{cfg.seed}"
        run_dir.parent.mkdir(mode=RUN_DIR_MODE, exist_ok=True)  # it holds run folders of private files
        s = train(cfg, run_dir, device=device)
        row = {"method": label, "seed": cfg.seed, "accuracy": s["test"]["accuracy"], "macro_auc": s["test"].get("macro_auc"),
               "balanced_accuracy": s["test"].get("balanced_accuracy"), "primary": s["test"].get("primary", "accuracy"),
               "score": s["test"].get(s["test"].get("primary", "accuracy")),  # the metric that leads (train.evaluate)
               "epsilon": s["epsilon"], "sigma": s["sigma"], "seconds": s["seconds"], "sparsity_reached": s.get("sparsity_reached"),
               "folder": str(run_dir), "budget_epsilon": s["budget"]["total_epsilon"], "budget_delta": s["budget"]["total_delta"],
               "dp": s["dp"]}
        runs.append(row)
        if on_run:
            on_run(row)
    if progress:
        progress("runs", len(cfgs), len(cfgs))
    table = []
    for label, method, rs in specs:
        rows = [r for r in runs if r["method"] == label]
        accs = [r["accuracy"] for r in rows]
        scores = [r["score"] for r in rows if r["score"] is not None] or accs
        table.append({
            "method": label, "seeds": len(rows), "accuracy_mean": statistics.mean(accs), "accuracy_sd": _sd(accs),
            "metric": rows[0]["primary"], "score_mean": statistics.mean(scores), "score_sd": _sd(scores),
            "epsilon": max(r["epsilon"] for r in rows), "sigma": rows[0]["sigma"],
            "seconds_mean": statistics.mean(r["seconds"] for r in rows),
            "sparsity_reached": rows[0]["sparsity_reached"],
            "privacy": method_privacy(method, sparsify if rs else 0.0),
        })
    settings = {k: v for k, v in dataclasses.asdict(base).items() if k not in ("private", "public", "method", "epsilon", "sparsify", "seed")}
    result = {
        "publishable": False,
        "note": "holds test metrics of the private data (not DP); privacy_total is what the whole comparison spent",
        "privacy_total": privacy_total(runs),
        "private": private, "public": public, "epsilon": epsilon, "delta": base.delta, "seeds": [base.seed + i for i in range(seeds)],
        "sparsify": sparsify, "settings": settings, "table": table, "runs": runs,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    atomic_write(out / "comparison.json", json.dumps(result, indent=2) + "\n")
    atomic_write(out / "comparison.csv", to_csv(table))
    plot_comparison(result, out / "comparison.png")
    return result


def privacy_total(runs: list[dict]) -> dict:
    """What ``runs`` (each a separate training on the same private set) spend together: basic
    composition, epsilons and deltas add."""
    eps = math.fsum(r["budget_epsilon"] for r in runs)
    delta = math.fsum(r["budget_delta"] for r in runs)
    return {
        "runs": len(runs), "total_epsilon": eps, "total_delta": delta, "dp": all(r["dp"] for r in runs),
        "neighbouring": "add or remove one example",
        "composition": f"basic composition of the {len(runs)} runs on the same private set (epsilons and deltas add)",
    }


def to_csv(table: list[dict]) -> str:
    buf = io.StringIO()
    cols = ["method", "seeds", "accuracy_mean", "accuracy_sd", "epsilon", "sigma", "seconds_mean", "sparsity_reached",
            "metric", "score_mean", "score_sd"]  # metric: the one that leads (train.evaluate), score: its value
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in table:
        w.writerow(r)
    return buf.getvalue()


def plot_comparison(result: dict, path: Path) -> None:
    """Accuracy per method: mean +- sd bars and every seed as a dot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = result["table"]
    fig, ax = plt.subplots(figsize=(1.4 * len(table) + 2, 3.6))
    xs = range(len(table))
    ax.bar(xs, [100 * r["accuracy_mean"] for r in table], yerr=[100 * (r["accuracy_sd"] or 0) for r in table],
           color="#9ecae1", edgecolor="#3182bd", capsize=4)
    for i, r in enumerate(table):
        accs = [100 * x["accuracy"] for x in result["runs"] if x["method"] == r["method"]]
        ax.scatter([i] * len(accs), accs, color="#08519c", s=12, zorder=3)
    ax.set_xticks(list(xs), [r["method"] for r in table])
    lo = min(100 * x["accuracy"] for x in result["runs"])
    ax.set_ylim(max(0, lo - 10), min(100, max(100 * (r["accuracy_mean"] + (r["accuracy_sd"] or 0)) for r in table) + 5))
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"{result['private']}: epsilon={result['epsilon']:g}, delta={result['delta']:g}, {len(result['seeds'])} seed(s)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def comparison_table(result: dict):
    """A rich table: method, the leading test metric's mean +- sd (macro AUC, balanced accuracy or
    accuracy: :mod:`gsd_cli.train.evaluate`), epsilon, sigma, time, sparsity."""
    from rich.table import Table

    from .evaluate import LABELS

    metric = (result["table"] or [{}])[0].get("metric", "accuracy")

    t = Table(title=f"gsd compare: {result['private']} (public {result['public'] or '-'}), epsilon {result['epsilon']:g}, "
                    f"{len(result['seeds'])} seed(s)")
    for c in ("method", f"{LABELS.get(metric, metric)} (mean +- sd)", "epsilon", "sigma", "s/run", "sparsity"):
        t.add_column(c, justify="left" if c == "method" else "right")
    for r in result["table"]:
        mean, sd = r.get("score_mean", r["accuracy_mean"]), r.get("score_sd", r["accuracy_sd"])
        sd = f" +- {100 * sd:.2f}" if sd is not None else ""
        t.add_row(r["method"], f"{100 * mean:.2f}%{sd}", f"{r['epsilon']:.3f}", f"{r['sigma']:.3f}",
                  f"{r['seconds_mean']:.1f}", "-" if r["sparsity_reached"] is None else f"{r['sparsity_reached']:.2f}")
    tot = result.get("privacy_total")
    if tot:
        t.caption = (f"epsilon is per run; all {tot['runs']} runs together spent epsilon={tot['total_epsilon']:.4g}, "
                     f"delta={tot['total_delta']:.3g} on {result['private']} (basic composition)"
                     + ("" if tot["dp"] else "; NOT DP: --insecure-seed or --deterministic-noise"))
    return t
