"""What the order of a GSD ranking is worth, as measured: one line under the table, from the
figures of the validity benchmark (``benchmarks/bench_validity.py``, issue 24) shipped in the package
as ``validity.json`` (written by ``bench_validity.py score``; nothing here is hard-coded)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def figures() -> dict | None:
    """The shipped figures, or None when the file is missing or unreadable (then nothing is printed)."""
    try:
        return json.loads(resources.files("gsd_cli.report").joinpath("validity.json").read_text())
    except (OSError, ValueError):
        return None


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:+.2f}" if abs(hi - lo) < 0.005 else f"{lo:+.2f} to {hi:+.2f}"


def validity_line(metric: str = "gsd") -> str | None:
    """One line: the default's Spearman with downstream accuracy on the benchmark's tasks, how often
    its winner was the best, and the advice those numbers support. None for other metrics."""
    doc = figures()
    if metric == "dp-energy" and doc and doc.get("rule_dp", {}).get("rule"):
        return "validity: " + rule_sentence(doc["rule_dp"], what="DP energy distance", private=True)
    if metric != "gsd" or not doc:
        return None
    rho = doc["spearman"]
    parts = [f"{_span(list(rho[key].values()))} with {label} accuracy" for key, label in (("gep", "GEP"), ("second_phase", "second-phase"))
             if rho.get(key)]
    validated, rule = validated_sentence(doc), rule_sentence(doc)
    return (f"validity: on {doc['tasks']} benchmark tasks ({doc['where']}) the default's Spearman was "
            + " and ".join(parts) + f" (-1: the same order); its winner was the best candidate in "
            f"{doc['winner_best']} of {doc['cases']} cases and worse than no public data in {doc['winner_below_none']}. "
            + (validated + " " if validated else "") + doc["advice"] + (" " + rule if rule else ""))


LABELS = {"gep": "GEP", "second-phase": "the second phase", "second_phase": "the second phase"}


def validated_sentence(doc: dict) -> str | None:
    """Which downstream method the order is validated for (Spearman <= -0.8 on every selection task of
    the benchmark), with the held-out task's figure beside it; None when the figures name none."""
    m = doc.get("validated_for")
    if not m:
        return "The order is validated for no method (Spearman <= -0.8 on every selection task was not reached)." if "validated_for" in doc else None
    rho = doc["spearman"].get(m.replace("-", "_"), {})
    sel = [v for k, v in rho.items() if k.split("@")[0] in doc.get("selection_tasks", [])]
    held = [v for k, v in rho.items() if k.split("@")[0] in doc.get("held_out", [])]
    s = f"The order is validated for {LABELS.get(m, m)} (Spearman {_span(sel)} on the selection tasks"
    return s + (f"; {_span(held)} on the held-out task)." if held else ").")


def rule_sentence(doc: dict, what: str = "GSD", private: bool = False) -> str | None:
    """The calibrated fallback rule of ``gsd train --auto-select`` (:mod:`gsd_cli.train.fallback`) with
    its measured error, or None when the figures hold no rule. ``private``: the rule of a private
    selection (``rule_dp``, on the released DP energy distance), with its expected errors at epsilon 1."""
    rules = doc.get("rule") or {}
    if not rules:
        return None
    parts = []
    gain = lambda m: rules[m].get("gain") if rules[m].get("gain") is not None else float("-inf")  # noqa: E731
    for method in sorted(rules, key=lambda m: -gain(m)):  # the order --method auto tries them in
        r = rules[method]
        err = f"wrong on {r['errors']} of {r['cells']} benchmark cells"
        if r.get("held_out_cells"):
            err += f", {r['held_out_errors']} of {r['held_out_cells']} held out"
        e1 = (r.get("expected_errors") or {}).get("1")
        if private and e1:
            err += f"; {e1['selection']:g} expected with the noise at epsilon 1"
        if r.get("gain") is not None:
            err += f"; mean gain {r['gain']:+.1f} points over DP-SGD alone"
        parts.append(f"{method} when its {what} <= {r['threshold']:g} ({err})")
    rank = doc.get("rank") or {}
    head = "Rule (auto-select's --method auto" + (" with --select-epsilon" if private else "") + "): train with the winner by "
    extra = f", clip={rank.get('clip')}" if private and rank else ""
    return (head + "; else by ".join(parts) + "; otherwise DP-SGD without public data"
            + (f" (for rankings with model={rank.get('model')}, k={rank.get('k')}, m={rank.get('examples')}{extra})." if rank else "."))
