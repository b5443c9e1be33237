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
    from ..ranking.reference import advice_sentence

    if metric in ("dp-energy", "dp-select"):  # a private selection: what auto-select does with its winner
        return "validity: " + advice_sentence(private=True)
    if metric != "gsd" or not doc:
        return None
    rho = doc["spearman"]
    parts = [f"{_span(list(rho[key].values()))} with {label} accuracy" for key, label in (("gep", "GEP"), ("second_phase", "second-phase"))
             if rho.get(key)]
    validated = validated_sentence(doc)
    return (f"validity (in-sample: every task offered a split of the private set itself as a candidate): on "
            f"{doc['tasks']} benchmark tasks ({doc['where']}) the default's Spearman was "
            + " and ".join(parts) + f" (-1: the same order); its winner was the best candidate in "
            f"{doc['winner_best']} of {doc['cases']} cases and worse than no public data in {doc['winner_below_none']}. "
            + (validated + " " if validated else "") + doc["advice"] + " " + advice_sentence())


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
