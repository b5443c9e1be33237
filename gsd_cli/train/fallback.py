"""``gsd train --auto-select``'s fallback: train with the ranking's winner only where the measured
evidence says public data that close helps; otherwise say so and train without public data.

The rule is calibrated by the downstream benchmark (``benchmarks/bench_downstream.py score
--update-package``, issue 33) and shipped in ``gsd_cli/report/validity.json`` under ``rule``: per
method, a threshold on the winner's GSD (the normalised projection metric of auto-select's default
ranking) below which the benchmark's candidates beat DP-SGD without public data, with its error rate
on the benchmark's selection tasks and on a held-out task, and the mean accuracy gain of the cells
where it used public data. ``--method auto`` (auto-select's default, :func:`choose`) takes the method
with the largest such gain among those whose threshold the winner passes; an explicit ``--method``
(:func:`decide`) is kept while its own threshold passes. Nothing here is hard-coded: without the
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


def _applicable(calibrated: dict | None, rank_settings: dict, dp: bool) -> str | None:
    """None when the rule applies to this ranking, else why not."""
    keys = ("model", "k", "examples")
    if calibrated is not None and not dp and all(rank_settings.get(k) == calibrated.get(k) for k in keys):
        return None
    cal = ", ".join(f"{k}={(calibrated or {}).get(k)}" for k in keys)
    return f"it is calibrated for the non-private ranking with {cal}"


def by_gain(table: dict) -> list[str]:
    """The public methods with a rule, best first by their mean accuracy gain over DP-SGD alone on the
    benchmark cells where their rule used public data (ties and unknown gains: :data:`PUBLIC_METHODS`'s
    order)."""
    have = [m for m in PUBLIC_METHODS if m in table]
    return sorted(have, key=lambda m: (-(table[m].get("gain") if table[m].get("gain") is not None else float("-inf")),
                                       PUBLIC_METHODS.index(m)))


def choose(winner: str, distance: float, *, rank_settings: dict, dp: bool = False, figures: dict | None = None) -> Decision:
    """``--method auto`` (``gsd train --auto-select``'s default): the method the benchmark's evidence
    favours for a winner this close. Among the public methods whose calibrated threshold the winner's
    GSD passes, the one with the largest mean gain over DP-SGD alone on the benchmark cells where its
    rule used public data; none passing: DP-SGD without public data. Where the rule does not apply
    (other ranking settings, DP-GSD), the method with the largest gain, with the winner, and says so.
    Without any rule: GEP (paper 000's method; gsd's default before the benchmark)."""
    table, calibrated = rules(figures)
    order = by_gain(table)
    if not order:
        return Decision("gep", winner, False, False, "--method auto: no calibrated rule is installed; training gep with the winner")

    def gain(m: str) -> str:
        r = table[m]
        return "" if r.get("gain") is None else f", mean gain {r['gain']:+.1f} points over DP-SGD alone where it used public data"

    why = _applicable(calibrated, rank_settings, dp)
    if why is not None:
        m = order[0]
        return Decision(m, winner, False, False,
                        f"--method auto: the distance rule is not applied ({why}); training {m} with the winner, the method "
                        f"that gained most with close public data on gsd's benchmark{gain(m)} (compare it with --method dpsgd yourself)")
    for m in order:
        t = float(table[m]["threshold"])
        if distance <= t:
            return Decision(m, winner, True, False,
                            f"--method auto: {winner}'s GSD {distance:.4f} <= {t:g}, where {m} with public data that close beat "
                            f"DP-SGD alone on gsd's benchmark ({_evidence(table[m])}{gain(m)}); training {m} with it", t, distance)
    t = max(float(table[m]["threshold"]) for m in order)
    return Decision(FALLBACK, None, True, True,
                    f"--method auto: no candidate is predicted to beat DP-SGD without public data (the winner {winner}'s GSD "
                    f"{distance:.4f} > {t:g}, every method's threshold; {'; '.join(f'{m}: {_evidence(table[m])}' for m in order)}); "
                    "training DP-SGD without public data (--no-fallback trains with the winner anyway)", t, distance)


def decide(method: str, winner: str, distance: float, *, rank_settings: dict, dp: bool = False,
           figures: dict | None = None) -> Decision:
    """Keep ``method`` with ``winner`` when its GSD ``distance`` is at most the calibrated threshold of
    ``method``; else the other public method whose rule the winner passes; else DP-SGD without public
    data. ``rank_settings`` (``model``, ``k``, ``examples``) must be those the rule was calibrated
    with, and the ranking non-private (``dp`` False): a distance from other settings is on another
    scale, so the rule is then not applied (and the message says why)."""
    if method == "auto":
        return choose(winner, distance, rank_settings=rank_settings, dp=dp, figures=figures)
    table, calibrated = rules(figures)
    if method not in PUBLIC_METHODS:
        return Decision(method, winner, False, False, f"--method {method}: no fallback rule (it is calibrated for {', '.join(PUBLIC_METHODS)})")
    rule = table.get(method)
    if rule is None or calibrated is None:
        return Decision(method, winner, False, False, f"no calibrated fallback rule for --method {method} is installed; training with the winner")
    why = _applicable(calibrated, rank_settings, dp)
    if why is not None:
        return Decision(method, winner, False, False,
                        f"fallback rule not applied: {why}; training with the winner (compare it with --method dpsgd yourself)")
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
