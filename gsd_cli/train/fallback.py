"""``gsd train --auto-select``'s fallback: train with the ranking's winner only where the measured
evidence says public data that close helps; otherwise say so and train without public data.

The rule is calibrated by the downstream benchmark (``benchmarks/bench_downstream.py score
--update-package``, issue 33) and shipped in ``gsd_cli/report/validity.json`` under ``rule``: per
method, a threshold on the winner's GSD (the normalised projection metric of auto-select's default
ranking) below which the benchmark's candidates beat DP-SGD without public data, with its error rate
on the benchmark's selection tasks and on a held-out task. Nothing here is hard-coded: without the
file (or without a rule for the method) no fallback is applied and the output says so.

The decision reads only the ranking's distance, a release the user already has (non-private ranking:
the run is not end-to-end DP anyway; DP-GSD: post-processing of a DP release), and public settings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: methods that use the public set; the fallback for them is DP-SGD without public data
PUBLIC_METHODS = ("gep", "second-phase")
FALLBACK = "dpsgd"


@dataclass(frozen=True)
class Decision:
    """What auto-select trains: ``method`` with ``public`` (None: no public data) and why."""

    method: str
    public: str | None
    applied: bool  # the calibrated rule was applied (False: no rule for these settings; the request stands)
    fell_back: bool  # the requested method was replaced
    message: str
    threshold: float | None = None
    distance: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def rules(figures: dict | None = None) -> tuple[dict, dict | None]:
    """``({method: rule}, ranking settings the rule was calibrated with)`` from ``validity.json``."""
    if figures is None:
        from ..report.validity import figures as shipped

        figures = shipped()
    if not figures:
        return {}, None
    return dict(figures.get("rule") or {}), figures.get("rank")


def _evidence(rule: dict) -> str:
    s = f"wrong on {rule['errors']} of {rule['cells']} benchmark cells"
    if rule.get("held_out_cells"):
        s += f", {rule['held_out_errors']} of {rule['held_out_cells']} on the held-out task"
    return s


def decide(method: str, winner: str, distance: float, *, rank_settings: dict, dp: bool = False,
           figures: dict | None = None) -> Decision:
    """Keep ``method`` with ``winner`` when its GSD ``distance`` is at most the calibrated threshold of
    ``method``; else the other public method whose rule the winner passes; else DP-SGD without public
    data. ``rank_settings`` (``model``, ``k``, ``examples``) must be those the rule was calibrated
    with, and the ranking non-private (``dp`` False): a distance from other settings is on another
    scale, so the rule is then not applied (and the message says why)."""
    table, calibrated = rules(figures)
    if method not in PUBLIC_METHODS:
        return Decision(method, winner, False, False, f"--method {method}: no fallback rule (it is calibrated for {', '.join(PUBLIC_METHODS)})")
    rule = table.get(method)
    if rule is None or calibrated is None:
        return Decision(method, winner, False, False, f"no calibrated fallback rule for --method {method} is installed; training with the winner")
    keys = ("model", "k", "examples")
    if dp or any(rank_settings.get(k) != calibrated.get(k) for k in keys):
        cal = ", ".join(f"{k}={calibrated.get(k)}" for k in keys)
        return Decision(method, winner, False, False,
                        f"fallback rule not applied: it is calibrated for the non-private ranking with {cal}; "
                        "training with the winner (compare it with --method dpsgd yourself)")
    t = float(rule["threshold"])
    if distance <= t:
        return Decision(method, winner, True, False,
                        f"fallback rule: {winner}'s GSD {distance:.4f} <= {t:g}, public data that close helped {method} "
                        f"on the benchmark ({_evidence(rule)}); training {method} with it", t, distance)
    for other in PUBLIC_METHODS:
        r = table.get(other)
        if other != method and r is not None and distance <= float(r["threshold"]):
            return Decision(other, winner, True, True,
                            f"fallback rule: {winner}'s GSD {distance:.4f} > {t:g} ({method}: {_evidence(rule)}) but <= "
                            f"{float(r['threshold']):g} for {other} ({_evidence(r)}); training {other} with it instead", t, distance)
    return Decision(FALLBACK, None, True, True,
                    f"fallback rule: no candidate is predicted to beat DP-SGD without public data (the winner {winner}'s "
                    f"GSD {distance:.4f} > {t:g}; {_evidence(rule)}); training DP-SGD without public data "
                    "(--no-fallback trains with the winner anyway)", t, distance)
