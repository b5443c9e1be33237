"""Whether to train with the ranking's winner or without public data: the previous in-sample rule (a benchmark arm).

``gsd train --auto-select``'s fallback: train with the ranking's winner only where the measured
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

A private selection (``--select-epsilon``) releases the DP energy distance, on another scale than
GSD; its rule is calibrated apart (``benchmarks/validity/dp_rule.py``, shipped under ``rule_dp``: a
threshold on the energy distance, with the expected number of wrong decisions on the benchmark once
the Laplace noise of each selection epsilon is added) and applied to the released distance.

The decision reads only the ranking's distance, a release the user already has (non-private ranking:
the run is not end-to-end DP anyway; a DP ranking: post-processing of a DP release), and public settings.
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


def rules(figures: dict | None = None, dp: bool = False) -> tuple[dict, dict | None]:
    """``({method: rule}, ranking settings the rule was calibrated with)`` from ``validity.json``: the
    GSD rule, or with ``dp`` the private selection's (``rule_dp``: on the DP energy distance)."""
    if figures is None:
        from ..report.validity import figures as shipped

        figures = shipped()
    if not figures:
        return {}, None
    if dp:
        d = figures.get("rule_dp") or {}
        return dict(d.get("rule") or {}), d.get("rank")
    return dict(figures.get("rule") or {}), figures.get("rank")


def _nearest_epsilon(expected: dict, epsilon: float | None) -> str | None:
    """The key of ``expected`` (selection epsilons) to quote for ``epsilon``: the largest at most it
    (its noise is at least as large as the user's), else the smallest."""
    if not expected or epsilon is None:
        return None
    keys = sorted(expected, key=float)
    below = [k for k in keys if float(k) <= epsilon + 1e-12]
    return below[-1] if below else keys[0]


def _evidence(rule: dict, epsilon: float | None = None) -> str:
    s = f"wrong on {rule['errors']} of {rule['cells']} benchmark cells"
    if rule.get("held_out_cells"):
        s += f", {rule['held_out_errors']} of {rule['held_out_cells']} on the held-out task"
    key = _nearest_epsilon(rule.get("expected_errors") or {}, epsilon)
    if key is not None:  # a private selection: the same cells read through the Laplace noise
        e = rule["expected_errors"][key]
        s += (f"; with the selection's noise at epsilon {key}, {e['selection']:g} expected wrong"
              + (f" and {e['held_out']:g} held out" if e.get("held_out") is not None else ""))
    return s


#: the settings a rule is calibrated for: auto-select's ranking, and for a private selection its metric and clip
KEYS = ("model", "k", "examples")
DP_KEYS = KEYS + ("metric", "clip")
#: what an unset metric or clip means under --select-epsilon (gsd rank --dp's defaults)
DP_DEFAULTS = {"metric": "dp-energy", "clip": 1.0}


def _applicable(calibrated: dict | None, rank_settings: dict, dp: bool) -> str | None:
    """None when the rule applies to this ranking, else why not."""
    keys = DP_KEYS if dp else KEYS
    have = {**(DP_DEFAULTS if dp else {}), **{k: v for k, v in rank_settings.items() if v is not None}}
    if calibrated is not None and all(have.get(k) == calibrated.get(k) for k in keys):
        return None
    cal = ", ".join(f"{k}={(calibrated or {}).get(k)}" for k in keys)
    if calibrated is None:
        return ("no rule for a private selection is installed" if dp else "no calibrated rule is installed")
    return f"it is calibrated for the {'private' if dp else 'non-private'} ranking with {cal}"


def _table(figures: dict | None, dp: bool) -> tuple[dict, dict | None]:
    """The rule table for this selection; a private one without ``rule_dp``: the GSD table (its gains
    order the methods) marked uncalibrated (its thresholds are not applied)."""
    table, calibrated = rules(figures, dp)
    if dp and not table:
        return rules(figures)[0], None
    return table, calibrated


def _what(dp: bool) -> str:
    return "DP energy distance" if dp else "GSD"


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
    Without any rule: GEP (paper 000's method; gsd's default before the benchmark). A private selection
    (``dp``) reads the ``rule_dp`` thresholds on the released DP energy distance; without them, the
    GSD rule's gains only (its thresholds are on another scale)."""
    table, calibrated = _table(figures, dp)
    what, eps = _what(dp), rank_settings.get("epsilon") if dp else None
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
                            f"--method auto: {winner}'s {what} {distance:.4f} <= {t:g}, where {m} with public data that close beat "
                            f"DP-SGD alone on gsd's benchmark ({_evidence(table[m], eps)}{gain(m)}); training {m} with it", t, distance)
    t = max(float(table[m]["threshold"]) for m in order)
    return Decision(FALLBACK, None, True, True,
                    f"--method auto: no candidate is predicted to beat DP-SGD without public data (the winner {winner}'s {what} "
                    f"{distance:.4f} > {t:g}, every method's threshold; {'; '.join(f'{m}: {_evidence(table[m], eps)}' for m in order)}); "
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
    table, calibrated = _table(figures, dp)
    what, eps = _what(dp), rank_settings.get("epsilon") if dp else None
    if method not in PUBLIC_METHODS:
        return Decision(method, winner, False, False, f"--method {method}: no fallback rule (it is calibrated for {', '.join(PUBLIC_METHODS)})")
    rule = table.get(method)
    if rule is None or (calibrated is None and not dp):
        return Decision(method, winner, False, False, f"no calibrated fallback rule for --method {method} is installed; training with the winner")
    why = _applicable(calibrated, rank_settings, dp)
    if why is not None:
        return Decision(method, winner, False, False,
                        f"fallback rule not applied: {why}; training with the winner (compare it with --method dpsgd yourself)")
    t = float(rule["threshold"])
    if distance <= t:
        return Decision(method, winner, True, False,
                        f"fallback rule: {winner}'s {what} {distance:.4f} <= {t:g}, public data that close helped {method} "
                        f"on the benchmark ({_evidence(rule, eps)}); training {method} with it", t, distance)
    for other in PUBLIC_METHODS:
        r = table.get(other)
        if other != method and r is not None and distance <= float(r["threshold"]):
            return Decision(other, winner, True, True,
                            f"fallback rule: {winner}'s {what} {distance:.4f} > {t:g} ({method}: {_evidence(rule, eps)}) but <= "
                            f"{float(r['threshold']):g} for {other} ({_evidence(r, eps)}); training {other} with it instead", t, distance)
    return Decision(FALLBACK, None, True, True,
                    f"fallback rule: no candidate is predicted to beat DP-SGD without public data (the winner {winner}'s "
                    f"{what} {distance:.4f} > {t:g}; {_evidence(rule, eps)}); training DP-SGD without public data "
                    "(--no-fallback trains with the winner anyway)", t, distance)
