"""What a user who follows ``gsd train --auto-select`` gets, on the large downstream benchmark (issue 33).

For each task and each *scenario* (the candidates a user might have: all of them; without the
same-distribution set; only unrelated and harmful sets), the winner of gsd's default ranking (mean
distance over the ranking seeds, as in :mod:`.large_score`), the decision of ``--method auto``
(:func:`gsd_cli.advice.fallback.choose` with the rule this benchmark calibrates and ships), and the
accuracy of that decision against DP-SGD alone, from the cached trainings (no new training): the
paired gain over the seeds with its 95% t-interval, and whether the decision was right (public data
used and it beat DP-SGD alone; or DP-SGD chosen and the favoured method with the winner would not
have beaten it). The scenarios without the good candidates are where the fallback is tested.
"""

from __future__ import annotations

import numpy as np

from .large import KIND, TASKS
from .large_stats import _acc, _fmt, interval

#: scenario -> the kinds of candidate (large.KIND) a user has
SCENARIOS = {
    "all candidates": ("same", "family", "related", "unrelated", "harmful"),
    "without the same-distribution set": ("family", "related", "unrelated", "harmful"),
    "only unrelated and harmful sets": ("unrelated", "harmful"),
}


def _mean(d: dict[int, float], seeds) -> float:
    return float(np.mean([d[s] for s in seeds]))


def scenarios(doc: dict, runs: list[dict], figures: dict, dp: bool = False) -> list[dict]:
    """One row per (task, scenario, epsilon): the auto-select decision and its outcome. ``dp``: a private
    selection (``--select-epsilon``), decided on the noise-free DP energy distance by the ``rule_dp``
    thresholds; ``same_decision_eps1`` is the probability that the released distance at selection
    epsilon 1 gives the same decision for that winner (:func:`.dp_rule.use_probability`)."""
    from gsd_cli.advice.fallback import by_gain, choose

    rank = {**figures["rule_dp"]["rank"], "epsilon": 1.0} if dp else figures["rank"]
    favoured = (by_gain((figures.get("rule_dp") or {}).get("rule") if dp else figures.get("rule") or {}) or ["gep"])[0]
    rows = []
    for task, t in doc["tasks"].items():
        dist = doc["dp_rule"]["energy"][task] if dp else t["distance"]
        for name, kinds in SCENARIOS.items():
            cands = [c for c in TASKS[task][2] if KIND[task][c] in kinds]
            if not cands:
                continue
            winner = min(cands, key=lambda c: dist[c])
            d = choose(winner, dist[winner], rank_settings=rank, dp=dp, figures=figures)
            same = _same_decision(doc, figures, task, dist[winner], d) if dp else None
            for eps in t["epsilon"]:
                base = _acc(runs, task, "dpsgd", float(eps)).get(None, {})
                method = d.method if d.public is not None else favoured
                acc = _acc(runs, task, method, float(eps)).get(winner, {})
                seeds = sorted(set(base) & set(acc))
                if not seeds:
                    continue
                chosen = acc if d.public is not None else base
                gain_option = _mean(acc, seeds) - _mean(base, seeds)  # the favoured method with the winner
                right = gain_option > 0 if d.public is not None else gain_option <= 0
                rows.append({"task": task, "scenario": name, "epsilon": eps, "candidates": cands, "winner": winner,
                             "distance": round(dist[winner], 4), "decision": d.method, "same_decision_eps1": same,
                             "public": d.public, "applied": d.applied,
                             "accuracy": interval([chosen[s] for s in seeds]), "dpsgd": interval([base[s] for s in seeds]),
                             "gain": interval([chosen[s] - base[s] for s in seeds]),
                             "option": method, "option_gain": gain_option, "right": bool(right), "seeds": seeds})
    return rows


def _same_decision(doc: dict, figures: dict, task: str, d: float, decision) -> float:
    """P(the released distance at selection epsilon 1 falls in the same decision interval as ``d``)."""
    from .dp_rule import use_probability

    en = doc["dp_rule"]
    lam = float(np.mean(en["lambda"][task]))
    beta = 2.0 * lam / (en["rank"]["examples"] * 1.0)
    ts = sorted(float(r["threshold"]) for r in figures["rule_dp"]["rule"].values())
    edges = [0.0] + ts + [float("inf")]
    for lo, hi in zip(edges, edges[1:]):
        if lo < d <= hi or (lo == 0.0 and d <= hi):
            p_hi = 1.0 if hi == float("inf") else use_probability(d, hi, beta)
            p_lo = 0.0 if lo == 0.0 else use_probability(d, lo, beta)
            return round(p_hi - p_lo, 3)
    return 1.0


def table(rows: list[dict], what: str = "GSD") -> str:
    lines = [f"| task | candidates | winner ({what}) | --method auto | accuracy | DP-SGD alone | gain [95% CI] | right? |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g = r["gain"]
        gi = f"{100 * g['mean']:+.1f}" + (f" [{100 * g['ci'][0]:+.1f}, {100 * g['ci'][1]:+.1f}]" if g["ci"] else "")
        what = f"{r['decision']} with {r['winner']}" if r["public"] else "DP-SGD, no public data"
        same = "" if r.get("same_decision_eps1") is None else f" (same decision at epsilon 1: {r['same_decision_eps1']:.0%})"
        lines.append(f"| {r['task']} (eps {r['epsilon']}) | {r['scenario']} | {r['winner']} ({r['distance']:.3f}) | {what}{same} | "
                     f"{_fmt(r['accuracy'])} | {_fmt(r['dpsgd'])} | {gi} | {'yes' if r['right'] else 'no'} |")
    n, ok = len(rows), sum(r["right"] for r in rows)
    lines.append(f"\n--method auto was right in {ok} of {n} (task, scenario, epsilon) cells; it fell back to DP-SGD in "
                 f"{sum(r['public'] is None for r in rows)} of them.")
    return "\n".join(lines)


def noise_limited(runs: list[dict], epsilon: float = 0.5) -> list[dict]:
    """Where DP noise, not the three epochs, limits accuracy: DP-SGD alone against GEP and the second
    phase with each task's same-distribution set at a small epsilon (``bench_downstream.py train
    --epsilons 0.5 --first 1``), paired gains over the seeds run."""
    rows = []
    for task, (_, _, cands) in TASKS.items():
        base = _acc(runs, task, "dpsgd", epsilon).get(None, {})
        if not base:
            continue
        row = {"task": task, "epsilon": epsilon, "public": cands[0], "dpsgd": interval(list(base.values())), "seeds": sorted(base)}
        for method in ("gep", "second-phase"):
            acc = _acc(runs, task, method, epsilon).get(cands[0], {})
            seeds = sorted(set(acc) & set(base))
            if seeds:
                row[method] = {"accuracy": interval([acc[s] for s in seeds]), "gain": interval([acc[s] - base[s] for s in seeds]),
                               "per_seed": {s: acc[s] for s in seeds}, "dpsgd_per_seed": {s: base[s] for s in seeds}}
        rows.append(row)
    return rows


def noise_limited_table(rows: list[dict]) -> str:
    lines = ["| task (epsilon) | DP-SGD alone | GEP with the same-distribution set | gain | second phase with it | gain |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for m in ("gep", "second-phase"):
            if m not in r:
                cells += ["-", "-"]
                continue
            g = r[m]["gain"]
            cells += [f"{_fmt(r[m]['accuracy'])} (seeds: {', '.join(f'{100 * v:.1f}' for v in r[m]['per_seed'].values())})",
                      f"{100 * g['mean']:+.1f}" + (f" [{100 * g['ci'][0]:+.1f}, {100 * g['ci'][1]:+.1f}]" if g["ci"] else "")]
        lines.append(f"| {r['task']} ({r['epsilon']:g}) | {_fmt(r['dpsgd'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
