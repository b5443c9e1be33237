"""The end-of-run report of ``gsd train``."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def result_line(test: dict) -> str:
    """The test result in one line, led by the metric that fits the task (:mod:`gsd_cli.train.evaluate`):
    macro AUC for a multi-label set, balanced accuracy for an unbalanced single-label one, else accuracy."""
    from .evaluate import LABELS, lead

    label, value = lead(test)
    head = f"{label} {_fmt(value)}"
    key = test.get("primary", "accuracy")
    if key == "macro_auc" and test.get("auc_per_finding"):
        got = sum(v is not None for v in test["auc_per_finding"].values())
        head += f" (mean over {got} of {len(test['auc_per_finding'])} findings)"
    elif key == "balanced_accuracy" and test.get("class_ratio") is not None:
        head += f" (classes {test['class_ratio']:.3g}:1 in the test set)"
    rest = [f"{LABELS[k]} {_fmt(test[k])}" for k in ("accuracy", "balanced_accuracy", "macro_auc") if k != key and test.get(k) is not None]
    if key == "macro_auc" and rest:
        rest[0] += " over (example, finding) pairs, mostly true negatives"
    return head + (f"; {', '.join(rest)}" if rest else "")


def _metric(selection: dict) -> str:
    m = str(selection.get("metric") or "gsd")
    return "GSD" if m == "gsd" else m


def distance_label(selection: dict | None) -> str | None:
    """What the public set's distance in a run's summary is, as the training table names it: the DP
    selection's released DP energy distance, the DP energy distance, DP-GSD; ``"distance"`` without a
    selection (given with the settings). None for a non-private selection: its distance is a statistic of
    the private data, shown only on a line labelled private."""
    if selection is None:
        return "distance"
    pv = selection.get("privacy")
    if not pv:
        return None
    from ..privacy.accountant import selection_kind

    return "DP energy distance, released" if pv.get("release") == "selection" else selection_kind(pv)


def print_summary(summary: dict, console: Console) -> None:
    """A two-column table of what was trained and what it spent (public: settings, the privacy
    statement, the public notes), then what it reached on lines labelled private
    (:data:`~gsd_cli.train.release.PRIVATE_LABEL`): the test result and the test set's size are
    statistics of the private data outside the guarantee."""
    from .release import PRIVATE_LABEL

    t = Table(title=f"gsd train: {summary['method']} on {escape(summary['private'])}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    pub = summary.get("public")
    label = distance_label(summary.get("selection"))
    d = summary.get("public_distance")
    if pub:
        shown = label is not None and d is not None  # a non-private selection's distance: on a private line below
        t.add_row("public data", escape(pub) + (f" ({label} {d:.4f})" if shown else ""))
    else:
        t.add_row("public data", "none")
    stages = summary.get("stages") or []
    if stages and stages[0].get("weights") == "pre-trained":
        t.add_row("backbone weights", escape(str(stages[0].get("source"))) + f" (new head {escape(str(stages[0].get('head')))})")
    if summary.get("peft"):
        pf = summary["peft"]
        t.add_row("trainable (--peft)", f"{escape(pf['spec'])}: {pf['trainable']:,} of {pf['total']:,} parameters")
    if len(stages) > 1 and stages[1].get("public"):
        s1 = stages[1]
        what = s1.get("line") or (f"{escape(s1['public'])}: {s1['public_examples']} examples, {s1['epochs']} epoch(s) of Adam "
                                  f"lr {s1['lr']:g} (public data only: no privacy cost)")  # a summary written before issue 61
        t.add_row("second phase", escape(what) + f"; head {escape(s1['head'])}")
    if summary.get("gep"):
        g = summary["gep"]
        t.add_row("anchor subspace", f"k={g['k']} in {g['groups']} group(s) {g['k_per_group']}, {summary['public_examples']} anchors, "
                  f"S1={g['clip_embedding']}, S2={g['clip_residual']}" + ("" if g["residual"] else ", residual dropped (B-GEP)"))
    else:
        t.add_row("clip", _fmt(summary.get("clip")))
    if summary.get("rgp"):
        r = summary["rgp"]
        t.add_row("RGP carriers", f"rank {r['rank']} on {len(r['layers'])} layer(s), {r['per_example_floats']} of "
                  f"{r['full_per_example_floats']} floats per example, K={r['power_iters']}, warm-up {r['warmup_steps']} steps")
    if summary.get("topagg"):
        r = summary["topagg"]
        t.add_row("TopAgg", f"NormTopK K={r['topk_fraction']:g}: sensitivity sqrt(K) C = {r['sensitivity']:.4g}, noise std {r['noise_std']:.4g}")
    if summary.get("sparsify"):
        t.add_row("random sparsification", f"final rate {summary['sparsify']['final_rate']:g}, reached {summary.get('sparsity_reached', 0):.3f} "
                  f"(mean over epochs {summary.get('mean_sparsity', 0):.3f})")
    t.add_row("noise multiplier sigma", f"{summary['sigma']:.4f} (effective {summary['privacy']['effective_noise_multiplier']:.4f})")
    t.add_row("steps, sampling rate", f"{summary['steps']} steps, q={summary['sampling_rate']:.4g} (Poisson)")
    t.add_row("privacy (training)", f"epsilon={summary['epsilon']:.4f} (target {summary['privacy']['target_epsilon']}), delta={summary['delta']:g}, "
              f"{summary['privacy']['accountant'].upper()} accountant")
    b = summary["budget"]
    if len(b["entries"]) > 1:
        t.add_row("privacy (total)", f"epsilon={b['total_epsilon']:.4f}, delta={b['total_delta']:g} ({b['composition']})")
    t.add_row("differentially private", "yes" if summary.get("dp", True) else "[bold red]NO[/] (see the warnings below)")
    console.print(t)
    for n in summary.get("notes", []):
        console.print(f"[yellow]warning:[/] {escape(n)}")
    test = summary["test"]
    lines = [f"test ({summary['private_test_examples']} examples): {result_line(test)}"]
    if pub and d is not None and label is None and summary.get("selection") is not None:
        lines.insert(0, f"public data {pub}: {_metric(summary['selection'])} {d:.4f} in the non-private selection")
    if test.get("auc_per_finding"):
        lines.append("AUC per finding: " + ", ".join(f"{k} {_fmt(v)}" for k, v in test["auc_per_finding"].items()))
    for line in lines:
        console.print(f"[yellow]{PRIVATE_LABEL}[/] " + escape(line), highlight=False, soft_wrap=True)
