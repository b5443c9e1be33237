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
    if metric != "gsd" or not doc:
        return None
    rho = doc["spearman"]
    parts = [f"{_span(list(rho[key].values()))} with {label} accuracy" for key, label in (("gep", "GEP"), ("second_phase", "second-phase"))
             if rho.get(key)]
    return (f"validity: on {doc['tasks']} benchmark tasks ({doc['where']}) the default's Spearman was "
            + " and ".join(parts) + f" (-1: the same order); its winner was the best candidate in "
            f"{doc['winner_best']} of {doc['cases']} cases and worse than no public data in {doc['winner_below_none']}. "
            + doc["advice"] + (" " + rule_sentence(doc) if rule_sentence(doc) else ""))


def rule_sentence(doc: dict) -> str | None:
    """The calibrated fallback rule of ``gsd train --auto-select`` (:mod:`gsd_cli.train.fallback`) with
    its measured error, or None when the figures hold no rule."""
    rules = doc.get("rule") or {}
    if not rules:
        return None
    parts = []
    for method, r in rules.items():
        err = f"wrong on {r['errors']} of {r['cells']} benchmark cells"
        if r.get("held_out_cells"):
            err += f", {r['held_out_errors']} of {r['held_out_cells']} held out"
        parts.append(f"{method} when its GSD <= {r['threshold']:g} ({err})")
    rank = doc.get("rank") or {}
    return ("Rule (auto-select): train with the winner by " + "; by ".join(parts)
            + "; otherwise DP-SGD without public data"
            + (f" (for rankings with model={rank.get('model')}, k={rank.get('k')}, m={rank.get('examples')})." if rank else "."))
