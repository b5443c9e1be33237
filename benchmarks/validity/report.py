"""Tables, plot and summary of the validity benchmark (``bench_validity.py score``)."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

import numpy as np

from .predictors import PRED_SEEDS, load
from .scores import kendall_vs, score, truth
from .tasks import TASKS
from .truth import METHOD_SETTINGS, METHODS, SEEDS, SETTINGS, load_runs

OUT = Path(__file__).resolve().parents[1] / "results" / "validity"
DEFAULT = "probe"  # GSD as today: probe network (ReLU), k=16, random labels, unit rows (m=250 here)
SELECT_ON, CONFIRM_ON = ("mnist", "digits"), ("textures",)
PRIVATE_OK = {"otdd": "no", "frechet": "not implemented (possible)", "task2vec": "not implemented (possible)", "logme": "no"}


def describe(name: str) -> str:
    """A readable description of a predictor's file name."""
    if name in PRIVATE_OK:
        return {"otdd": "OTDD (POT; fmnist-cnn features, own labels)", "frechet": "Frechet distance (fmnist-cnn features)",
                "task2vec": "Task2Vec-style Fisher distance (fmnist-cnn)", "logme": "-LogME (fmnist-cnn trained on public)"}[name]
    model, _, rest = name.partition("-") if not name.startswith("probe") else ("probe", "", name[len("probe"):].lstrip("-"))
    if name.startswith("cnn"):
        model, rest = "fmnist-cnn", name[len("cnn"):].lstrip("-")
    parts = {"": "", "k8": "k=8", "k32": "k=32", "rownone": "row norm none", "mhalf": "half the examples",
             "own": "own labels", "tanh": "tanh", "none": "no activation", "scaled": "inputs standardised",
             "sketch": "sketch D=32"}
    if rest.startswith("dp"):
        eps, _, sk = rest[2:].partition("-")
        return f"DP-GSD eps={eps}{' + sketch D=32' if sk else ''} ({model})"
    return f"GSD {model}" + (f", {parts.get(rest, rest)}" if rest else "")


def privately(name: str) -> str:
    if name in PRIVATE_OK:
        return PRIVATE_OK[name]
    if "-dp" in name:
        return "yes (this is the DP value)"
    return "yes (DP-GSD)"


def build() -> dict:
    runs = load_runs()
    doc: dict = {"settings": {"training": SETTINGS, "methods": METHOD_SETTINGS, "train_seeds": list(SEEDS),
                              "pred_seeds": list(PRED_SEEDS), "default": DEFAULT},
                 "truth": {}, "scores": {}, "dp_vs_nonprivate": {}, "platform": platform.platform(),
                 "loadavg_at_scoring": os.getloadavg(), "train_seconds_total": round(sum(r["seconds"] for r in runs), 1)}
    for task in TASKS:
        preds = load(task)
        doc["truth"][task] = {}
        doc["scores"][task] = {}
        for method in METHODS:
            acc, none = truth(runs, task, method)
            doc["truth"][task][method] = {
                c: {"mean": statistics.mean(v.values()), "sd": statistics.stdev(v.values()) if len(v) > 1 else None, "n": len(v)}
                for c, v in acc.items()}
            doc["truth"][task]["dpsgd"] = {"mean": statistics.mean(none.values()) if none else None,
                                           "sd": statistics.stdev(none.values()) if len(none) > 1 else None, "n": len(none)}
            for name, pred in sorted(preds.items()):
                s = score(pred, acc, none)
                if s is not None:
                    doc["scores"][task].setdefault(name, {})[method] = s
        for name, pred in preds.items():
            if "-dp" in name:
                ref = name.split("-dp")[0] + ("-sketch" if name.endswith("-sketch") else "")
                base = name.split("-dp")[0]
                if ref in preds or base in preds:
                    doc["dp_vs_nonprivate"].setdefault(task, {})[name] = {
                        "vs_gsd": kendall_vs(pred, preds[base]) if base in preds else None,
                        "vs_sketched_gsd": kendall_vs(pred, preds[ref]) if ref in preds and ref != base else None}
    doc["selection"] = select(doc["scores"])
    return doc


def _mean_rho(scores: dict, name: str, tasks) -> float | None:
    vals = [scores[t][name][m]["spearman"] for t in tasks for m in METHODS
            if name in scores.get(t, {}) and m in scores[t][name]]
    vals = [v for v in vals if v == v]
    return float(np.mean(vals)) if len(vals) == len(tasks) * len(METHODS) else None


def select(scores: dict) -> dict:
    """The GSD setting (non-DP variants) with the most negative mean Spearman on SELECT_ON, and how it
    and the default do on CONFIRM_ON."""
    names = sorted({n for t in SELECT_ON for n in scores.get(t, {}) if "-dp" not in n})
    ranked = sorted(((r, n) for n in names if (r := _mean_rho(scores, n, SELECT_ON)) is not None))
    out = {"select_on": list(SELECT_ON), "confirm_on": list(CONFIRM_ON),
           "by_mean_spearman_on_selection": [{"predictor": n, "mean_spearman": r} for r, n in ranked]}
    if ranked:
        best = ranked[0][1]
        gsd_only = [n for _, n in ranked if n not in PRIVATE_OK]
        out["chosen"] = best
        out["chosen_gsd"] = gsd_only[0] if gsd_only else None
        for key, n in (("chosen", best), ("chosen_gsd", out["chosen_gsd"]), ("default", DEFAULT)):
            if n:
                out[f"{key}_on_confirmation"] = {m: scores.get(t, {}).get(n, {}).get(m) and
                                                 {k: scores[t][n][m][k] for k in ("spearman", "spearman_ci", "kendall", "best", "below_none", "regret")}
                                                 for t in CONFIRM_ON for m in METHODS}
    return out


def fmt_ci(ci) -> str:
    return "-" if not ci else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"


def tables(doc: dict) -> str:
    lines = []
    for task, (priv, cands) in TASKS.items():
        tr = doc["truth"][task]
        lines.append(f"\n#### Task `{task}` (private {priv}): accuracy, mean ± sd over {len(SEEDS)} seeds\n")
        lines.append("| public | GEP | second phase |\n|---|---:|---:|")
        for c in cands:
            g, s = tr.get("gep", {}).get(c), tr.get("second-phase", {}).get(c)
            cell = lambda v: "-" if not v else f"{100 * v['mean']:.1f}% ± {100 * (v['sd'] or 0):.1f} (n={v['n']})"  # noqa: E731
            lines.append(f"| {c} | {cell(g)} | {cell(s)} |")
        d = tr.get("dpsgd", {})
        if d.get("mean") is not None:
            lines.append(f"| none (DP-SGD) | {100 * d['mean']:.1f}% ± {100 * (d['sd'] or 0):.1f} (n={d['n']}) | same |")
    lines.append("\n#### Predictors: Spearman with mean accuracy (95% bootstrap interval over seeds); "
                 "✓ = picked the best; ✗ = picked one below DP-SGD\n")
    head = "| predictor | private? | " + " | ".join(f"{t} GEP | {t} 2nd phase" for t in TASKS) + " |"
    lines += [head, "|---|---|" + "---|" * (2 * len(TASKS))]
    names = sorted({n for t in TASKS for n in doc["scores"][t]}, key=lambda n: (n in PRIVATE_OK, "-dp" in n, n))
    for n in names:
        cells = []
        for t in TASKS:
            for m in METHODS:
                s = doc["scores"][t].get(n, {}).get(m)
                cells.append("n/a" if not s else f"{s['spearman']:+.2f} {fmt_ci(s['spearman_ci'])}"
                             + (" ✓" if s["best"] else "") + (" ✗" if s["below_none"] else "")
                             + (f" (on {s['n']})" if s["n"] < len(TASKS[t][1]) else ""))
        lines.append(f"| {describe(n)} | {privately(n)} | " + " | ".join(cells) + " |")
    lines.append("\n#### DP-GSD against the non-private order: Kendall tau (mean over seeds of single draws)\n")
    lines.append("| DP predictor | " + " | ".join(TASKS) + " |\n|---|" + "---|" * len(TASKS))
    dps = sorted({n for t in doc["dp_vs_nonprivate"] for n in doc["dp_vs_nonprivate"][t]})
    for n in dps:
        cells = []
        for t in TASKS:
            v = doc["dp_vs_nonprivate"].get(t, {}).get(n, {})
            k = v.get("vs_sketched_gsd") or v.get("vs_gsd")
            cells.append("-" if not k else f"{k['mean_per_seed']:+.2f}")
        lines.append(f"| {describe(n)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    preds = {t: load(t) for t in TASKS}
    fig, axes = plt.subplots(2, len(TASKS), figsize=(5 * len(TASKS), 8))
    for j, task in enumerate(TASKS):
        for i, method in enumerate(METHODS):
            ax = axes[i, j]
            tr = doc["truth"][task].get(method, {})
            p = preds[task].get(DEFAULT, {})
            for c, v in tr.items():
                vals = [p[s][c] for s in p if p[s].get(c) is not None]
                if not vals:
                    continue
                ax.errorbar(np.mean(vals), 100 * v["mean"], yerr=100 * (v["sd"] or 0), xerr=np.std(vals), fmt="o", capsize=3)
                ax.annotate(c, (np.mean(vals), 100 * v["mean"]), fontsize=8, xytext=(4, 4), textcoords="offset points")
            none = doc["truth"][task]["dpsgd"]["mean"]
            if none is not None:
                ax.axhline(100 * none, ls="--", c="gray", lw=1)
                ax.text(ax.get_xlim()[0], 100 * none, " DP-SGD, no public data", fontsize=7, va="bottom", color="gray")
            s = doc["scores"][task].get(DEFAULT, {}).get(method)
            ax.set_title(f"{task}, {method}" + (f": Spearman {s['spearman']:+.2f}" if s else ""), fontsize=10)
            ax.set_xlabel("GSD (probe, mean over seeds)")
            ax.set_ylabel("test accuracy (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PACKAGE_NOTE = Path(__file__).resolve().parents[2] / "gsd_cli" / "report" / "validity.json"


def validity_note(doc: dict, name: str = DEFAULT) -> dict:
    """The figures ``gsd rank`` prints under a GSD ranking (gsd_cli/report/validity.json)."""
    sc = {t: doc["scores"][t].get(name, {}) for t in TASKS}
    rho = {key: {t: round(sc[t][m]["spearman"], 2) for t in TASKS if m in sc[t] and sc[t][m]["spearman"] == sc[t][m]["spearman"]}
           for key, m in (("gep", "gep"), ("second_phase", "second-phase"))}
    cases = [sc[t][m] for t in TASKS for m in METHODS if m in sc[t]]
    best = sum(c["best"] for c in cases)
    below = sum(c["below_none"] for c in cases)
    allr = [v for d in rho.values() for v in d.values()]
    if allr and max(allr) <= -0.8 and below == 0:
        advice = "The order below the winner predicted accuracy too."
    elif best >= len(cases) / 2:
        advice = ("Trust the winner, not the order below it" + (", and compare the winner with training without public data."
                                                                  if below else "."))
    else:
        advice = "Neither the winner nor the order was reliable there: confirm with a short training on your data."
    return {"source": "python benchmarks/bench_validity.py score (issue 24)", "predictor": describe(name),
            "where": "probe, k=16, m=250; fmnist-cnn trained at epsilon 2, 5 seeds", "tasks": len(TASKS),
            "spearman": rho, "cases": len(cases), "winner_best": best, "winner_below_none": below, "advice": advice}


def write(doc: dict) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    doc["validity_note"] = validity_note(doc)
    try:
        shipped = json.loads(PACKAGE_NOTE.read_text())
    except (OSError, ValueError):
        shipped = {}
    if "rule" not in shipped:  # the note of issue 33's benchmark (bench_downstream.py score) is kept
        PACKAGE_NOTE.write_text(json.dumps(doc["validity_note"], indent=1) + "\n")
    (OUT / "summary.json").write_text(json.dumps(doc, indent=1, default=float) + "\n")
    (OUT / "tables.md").write_text(tables(doc))
    plot(doc, OUT / "validity.png")
