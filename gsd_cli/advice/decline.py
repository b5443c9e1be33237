"""Whether the DP advice should spend any of the budget at all (issue 62): public facts against the measured price.

``gsd train --auto-select --select-epsilon E`` spends ``E`` of the run's total on choosing a public set (the DP feature
probe, :mod:`gsd_cli.advice.dp_probe`); the training gets the rest. Where the price curve measured that no selection
wins its price back, the advice **declines to spend**: it trains without a selection (from the base alone where the run
starts from ``--weights``, else DP-SGD from scratch) with the whole total, reads no private example for a selection,
books nothing for one, and says why. ``--no-fallback`` selects anyway.

The rule reads public facts only, so declining costs no privacy:

* the measured regime (``gsd_cli/report/price62.json``, written by ``python -m benchmarks validity.pilot.price62 table
  --update-package`` from issue 62's price curve): the model family, whether the run starts from a base, the private
  set sizes and the total epsilon it measured, and each selection design's mean gain over training without a selection
  at the same total;
* the run's settings: ``--model``, ``--weights``, the total ``--epsilon`` and the declared size ``--expected-size`` (a
  public number; without it the size is private and the rule does not apply).

It declines only inside the measured regime (the same model family and start, a declared size between the smallest
and the largest measured, a total epsilon at most the measured one) and only when no design that ``--select-epsilon``
runs (a share of the total by basic composition) had a mean gain above 0 there. Outside it the advice spends as
asked: nothing was measured there.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

#: the measured price curve (package data; None when it is not there)
CURVE = Path(__file__).resolve().parents[1] / "report" / "price62.json"


@cache
def measured() -> dict | None:
    """The price curve's regime and figures, as the benchmark wrote them; None without the file."""
    try:
        return json.loads(CURVE.read_text())
    except (OSError, ValueError):
        return None


def decline_reason(*, model, weights, expected_size, epsilon: float, doc: dict | None = None) -> str | None:
    """Why the DP advice should not spend (module docstring), or None (spend). ``doc``: the curve (default
    :func:`measured`)."""
    from ..train.tuned import family

    doc = measured() if doc is None else doc
    if not doc or not doc.get("decline"):
        return None
    r = doc["regime"]
    start = "base" if weights is not None else "scratch"
    if family(model) != r["model"] or start != r["start"]:
        return None
    if not isinstance(expected_size, int) or not min(r["sizes"]) <= expected_size <= max(r["sizes"]):
        return None
    if float(epsilon) > float(r["epsilon"]):
        return None
    basic = {k: v for k, v in doc["designs"].items() if v.get("composition", "basic") == "basic"}  # what --select-epsilon runs
    best = max(basic, key=lambda d: basic[d]["gain"])
    g = doc["designs"][best]["gain"]
    where = "from a base" if start == "base" else "from scratch"
    return (f"the selection cannot win back its price here: in {doc['source']} ({r['model']} {where}, "
            f"{min(r['sizes']):,}-{max(r['sizes']):,} private examples, total epsilon {r['epsilon']:g}) no design of the "
            f"DP advice gained on average over training without a selection at the same total (the best, {best}: "
            f"{g:+.1f} points over {doc['designs'][best]['cells']} cells); declared size {expected_size:,}, epsilon "
            f"{float(epsilon):g} (public facts): nothing spent on a selection, --no-fallback selects anyway")


def declined_plan(config, total: tuple[float, float], fallback: bool) -> dict | None:
    """The fields of :func:`gsd_cli.advice.select.dp_plan`'s plan (:class:`gsd_cli.advice.select.Plan`) when the advice declines to spend (:func:`gsd_cli.advice.decline.decline_reason`), else
    None: DP-SGD without a candidate (from the base alone with ``--weights``) at the whole total, or, for an explicit
    ``--method second-phase``, an error that says so."""
    from dataclasses import replace

    from .decide import FALLBACK, Decision, without
    from .probe import start_of

    why = decline_reason(model=config.model, weights=config.weights, expected_size=config.expected_size,
                         epsilon=total[0]) if fallback else None
    if why is None:
        return None
    record = {"method": "declined", "winner": None, "privacy": None, "reads_private": False, "declined": why,
              "spent": "nothing: the advice declined to spend (public facts)",
              "total": {"epsilon": total[0], "delta": total[1]}}
    budget = (f"privacy: the run's total is epsilon {total[0]:g}, delta {total[1]:.3g}: the selection nothing (declined); "
              f"the training {total[0]:g}, delta {total[1]:.3g}")
    config = replace(config, epsilon=total[0], delta=total[1])
    if config.method == "second-phase":
        decision = Decision("second-phase", None, False, f"--method second-phase: {why}; train with --method dpsgd, or add "
                            "--no-fallback to select anyway", refused=True, evidence={"declined": why})
        record["advice"] = decision.to_dict()
        return dict(config=config, ranking=None, decision=decision, selection=record, public=True, error=decision.message,
                    budget=budget)
    decision = Decision(FALLBACK, None, True, f"--method auto: training DP-SGD {without(start_of(config))}: {why}",
                        evidence={"declined": why})
    record["advice"] = decision.to_dict()
    return dict(config=replace(config, method=FALLBACK, public=None, public_distance=None), ranking=None, decision=decision,
                selection=record, public=True, budget=budget)
