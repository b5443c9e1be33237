"""Scores of the large downstream benchmark (issue 33): gsd's default ranking per task (the one
``gsd train --auto-select`` runs: probe network, k=16, 2,000 examples, random labels), the accuracy
of every method with gsd's pick, the oracle pick and the worst candidate against DP-SGD without public
data, Spearman with bootstrap intervals, and the calibration of the auto-select fallback rule
(:mod:`gsd_cli.advice.fallback`).

The rule: train with the winner by method M when the winner's GSD is at most a threshold t_M, else
fall back to DP-SGD without public data. t_M is chosen on the *selection* tasks' cells (every
candidate at every epsilon, read as "would this candidate, were it the winner, beat DP-SGD?"; the
truth is its mean accuracy over seeds against DP-SGD's), as the threshold with the fewest wrong
decisions (ties: the smaller threshold, the cautious one); its error rate is reported on those cells
and separately on the held-out task's.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from .large import EPSILONS, FAMILIES, HELD_OUT, KIND, METHODS, SELECTION, SETTINGS, TASKS, load_runs, register
from .large_stats import ROOT, _acc, _fmt, calibrate, evaluate, interval, missing  # noqa: F401 (the shared pieces, also named here)

RANKS = ROOT / "validity" / "large_ranks"
OUT = ROOT / "downstream_cpu.json"
#: auto-select's ranking defaults (gsd train --rank-model/--rank-k/--rank-examples)
RANK = dict(model="probe", k=16, examples=2000)


def rank_file(task: str, seed: int) -> Path:
    return RANKS / f"{task}-s{seed}.json"


def rank_all(tasks=None, seeds=(0, 1, 2)) -> None:
    """gsd's ranking of each task's candidates, as auto-select runs it, with seed = the public seed
    and the private draw's seed (benchmark only); cached."""
    import torch

    from gsd_cli.ranking import rank

    torch.set_num_threads(1)
    register()
    for task, seed, f in missing(tasks, seeds, rank_file):
        t0 = time.perf_counter()
        r = rank(TASKS[task][0], list(TASKS[task][2]), seed=seed, insecure_seed=seed, device="cpu", **RANK)
        doc = {"task": task, "seed": seed, "settings": RANK, "distance": {x.public: x.distance for x in r.results},
               "seconds": round(time.perf_counter() - t0, 1), "loadavg": os.getloadavg()}
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"{task} s{seed}: {doc['distance']} ({doc['seconds']} s)", flush=True)


def distances(task: str) -> dict[int, dict[str, float]]:
    out = {}
    for f in sorted(RANKS.glob(f"{task}-s*.json")):
        d = json.loads(f.read_text())
        if d["task"] == task and d["settings"] == RANK:
            out[d["seed"]] = d["distance"]
    return out


#: the truth's seeds (the tuning runs, seed 10, chose the settings and are not part of it)
SEEDS = (0, 1, 2)


def variant_runs(variant: str | None) -> list[dict]:
    """The grid's runs (``variant`` None) or those of a variant (``overrides["variant"]``, e.g.
    :data:`.defaults_runs.VARIANT`: every setting at gsd's own training defaults)."""
    if variant is None:
        return load_runs()
    runs = [r for r in load_runs(overrides_ok=True) if (r.get("overrides") or {}).get("variant") == variant]
    if variant == "gsd-defaults":  # only runs at the defaults gsd has now (a changed default is a new run)
        from .defaults_runs import overrides

        runs = [r for r in runs if r["overrides"] == overrides(r["method"])]
    return runs


def build(seeds=SEEDS, variant: str | None = None, epsilons=EPSILONS) -> dict:
    from .scores import score

    runs = [r for r in variant_runs(variant) if r["seed"] in seeds]
    doc = {"source": "python benchmarks/bench_downstream.py score (issue 33)", "rank": RANK, "variant": variant,
           "epsilons": list(epsilons), "settings": (runs[0]["settings"] if variant and runs else SETTINGS),
           "selection_tasks": list(SELECTION), "held_out": list(HELD_OUT), "tasks": {}, "cells": [],
           "runs": len(runs), "seconds": round(sum(r["seconds"] for r in runs)), "machine": "2-core CPU, shared"}
    for task in TASKS:
        dist = distances(task)
        if not dist:
            continue
        dmean = {c: float(np.mean([dist[s][c] for s in dist])) for c in TASKS[task][2]}
        pick = min(dmean, key=dmean.get)
        tdoc = {"distance": dmean, "rank_seeds": sorted(dist), "pick": pick, "kind": KIND[task], "epsilon": {}}
        for eps in epsilons:
            base = _acc(runs, task, "dpsgd", eps).get(None, {})
            if not base:
                continue
            e = {"dpsgd": interval(list(base.values())), "dpsgd_seeds": sorted(base)}
            for method in METHODS:
                acc = _acc(runs, task, method, eps)
                seeds = sorted(set(base).intersection(*(set(v) for v in acc.values()))) if acc else []
                full = {c: v for c, v in acc.items() if set(seeds) <= set(v)}
                if not full or not seeds:
                    continue
                means = {c: float(np.mean([full[c][s] for s in seeds])) for c in full}
                complete = len(full) == len(TASKS[task][2])
                m = {"seeds": seeds, "candidates": {c: interval([full[c][s] for s in seeds]) for c in full},
                     "pick": pick if pick in full else None, "complete": complete,
                     "oracle": max(means, key=means.get) if complete else None,
                     "worst": min(means, key=means.get) if complete else None}
                bmean = float(np.mean([base[s] for s in seeds]))
                m["gain_pick"] = means[pick] - bmean if pick in full else None
                # paired gain per seed (the same private randomness seeds), with a t-interval
                if pick in full:
                    m["gain_pick_interval"] = interval([full[pick][s] - base[s] for s in seeds])
                m["spearman"] = m["spearman_ci"] = m["kendall"] = None
                if complete:
                    pred = {s: {c: dist[s][c] for c in full} for s in dist}
                    sc = score(pred, full, {s: base[s] for s in seeds})
                    if sc:
                        m.update(spearman=sc["spearman"], spearman_ci=sc["spearman_ci"], kendall=sc["kendall"])
                    if task in FAMILIES:
                        fam = list(FAMILIES[task])
                        m["family"] = {"order_by_accuracy": sorted(fam, key=lambda c: -means[c]),
                                       "order_by_gsd": sorted(fam, key=lambda c: dmean[c]), "expected": fam}
                    for c in full:  # the rule's cells: complete candidate sets only
                        doc["cells"].append({"task": task, "epsilon": eps, "method": method, "candidate": c,
                                             "distance": dmean[c], "gain": means[c] - bmean,
                                             "selection": task in SELECTION})
                e[method] = m
            tdoc["epsilon"][f"{eps:g}"] = e
        doc["tasks"][task] = tdoc
    doc["rule"] = {}
    for method in METHODS:
        sel = [c for c in doc["cells"] if c["method"] == method and c["selection"]]
        held = [c for c in doc["cells"] if c["method"] == method and not c["selection"]]
        if not sel:
            continue
        cal = calibrate(sel)
        doc["rule"][method] = {**cal, "held_out": evaluate(cal["threshold"], held) if held else None}
    from .dp_rule import build_dp, energy

    if any(energy(task) for task in TASKS):  # the private selection's rule (validity/dp_rule.py), where ranked
        doc["dp_rule"] = build_dp(doc)
    return doc


def tables(doc: dict) -> str:
    lines = []
    for task, t in doc["tasks"].items():
        role = "held out" if task in doc["held_out"] else "selection"
        lines.append(f"\n### {task} ({role}); gsd's pick: {t['pick']}")
        lines.append("| epsilon | DP-SGD alone | method | gsd's pick | oracle pick | worst candidate | Spearman [95% CI] |")
        lines.append("|---|---|---|---|---|---|---|")
        for eps, e in t["epsilon"].items():
            for method in METHODS:
                if method not in e:
                    continue
                m = e[method]
                c = m["candidates"]
                sp = "-" if m["spearman"] is None else f"{m['spearman']:+.2f}" + (f" [{m['spearman_ci'][0]:+.2f}, {m['spearman_ci'][1]:+.2f}]" if m["spearman_ci"] else "")
                ow = [f"{_fmt(c[m[w]])} ({m[w]})" if m[w] else "not run" for w in ("oracle", "worst")]
                lines.append(f"| {eps} | {_fmt(e['dpsgd'])} | {method} | {_fmt(c[m['pick']]) if m['pick'] else '-'} ({m['pick']}) | "
                             f"{ow[0]} | {ow[1]} | {sp} |")
        lines.append("GSD: " + ", ".join(f"{c} {d:.3f}" for c, d in sorted(t["distance"].items(), key=lambda x: x[1])))
    for method, r in doc["rule"].items():
        ho = r["held_out"]
        lines.append(f"\nrule {method}: use public data iff winner's GSD <= {r['threshold']}: wrong on {r['errors']}/{r['cells']} "
                     f"selection cells" + (f", {ho['errors']}/{ho['cells']} held-out cells" if ho else "")
                     + f"; mean gain over DP-SGD where it uses public data {r['gain']:+.2f} points ({r['used']} cells)"
                     + (f", held out {ho['gain']:+.2f} ({ho['used']})" if ho and ho["gain"] is not None else ""))
    return "\n".join(lines)


def validated_for(rho: dict, selection: list[str]) -> str | None:
    """The downstream method the default distance's order is validated for: Spearman <= -0.8 in every
    cell of the selection tasks (several: the most negative mean), or None."""
    ok = {}
    for m, cells in rho.items():
        sel = [v for k, v in cells.items() if k.split("@")[0] in selection]
        if sel and max(sel) <= -0.8:
            ok[m] = float(np.mean(sel))
    return min(ok, key=ok.get) if ok else None


def package_figures(doc: dict) -> dict:
    """What ``gsd_cli/report/validity.json`` ships: the fallback rule and the evidence for it."""
    rho = {m: {} for m in METHODS}
    below = cases = best = 0
    for task, t in doc["tasks"].items():
        for eps, e in t["epsilon"].items():
            for m in METHODS:
                if m in e and e[m]["spearman"] is not None:
                    rho[m][f"{task}@{eps}"] = round(e[m]["spearman"], 2)
                    cases += 1
                    best += e[m]["pick"] == e[m]["oracle"]
                    below += (e[m]["gain_pick"] or 0) < 0
    allr = [v for d in rho.values() for v in d.values()]
    if allr and max(allr) <= -0.8 and below == 0:
        advice = "The order below the winner predicted accuracy too."
    elif best >= cases / 2:
        advice = "Trust the winner, not the order below it."
    else:
        advice = "Neither the winner nor the order was reliable there: confirm with a short training on your data."
    rule = {m: {"threshold": r["threshold"], "errors": r["errors"], "cells": r["cells"], "gain": r["gain"],
                "held_out_errors": r["held_out"]["errors"] if r["held_out"] else None,
                "held_out_cells": r["held_out"]["cells"] if r["held_out"] else None,
                "held_out_gain": r["held_out"]["gain"] if r["held_out"] else None}
            for m, r in doc["rule"].items()}
    return {"source": "python benchmarks/bench_downstream.py score --update-package (issue 33)",
            "predictor": "GSD probe",
            "where": f"auto-select's ranking (probe, k=16, m=2000); fmnist-cnn trained {doc['settings']['epochs']} epochs at batch "
                     f"{doc['settings']['batch_size']}" + (" (gsd train's defaults)" if doc.get("variant") else "")
                     + f" at epsilon {' and '.join(f'{e:g}' for e in doc['epsilons'])}, "
                     f"{len({r for t in doc['tasks'].values() for e in t['epsilon'].values() for r in e.get('dpsgd_seeds', [])})} seeds, 2-core CPU",
            "tasks": len(doc["tasks"]), "spearman": {"gep": rho["gep"], "second_phase": rho["second-phase"]},
            "cases": cases, "winner_best": best, "winner_below_none": below,
            "selection_tasks": doc["selection_tasks"], "held_out": doc["held_out"], "validated_for": validated_for(rho, doc["selection_tasks"]),
            "rank": doc["rank"], "rule": rule,
            **({"rule_dp": _package_dp(doc["dp_rule"])} if doc.get("dp_rule") else {}),
            "advice": advice}


def _package_dp(dp: dict) -> dict:
    from .dp_rule import package_rule

    return package_rule(dp)


def write(doc: dict, update_package: bool = False) -> None:
    from .pipeline_score import noise_limited, noise_limited_table, scenarios, table

    runs = [r for r in variant_runs(doc.get("variant")) if r["seed"] in SEEDS]
    doc["auto_select"] = scenarios(doc, runs, package_figures(doc))
    doc["noise_limited"] = noise_limited(runs)
    stem = "downstream_cpu" if not doc.get("variant") else f"downstream_{doc['variant'].replace('-', '_')}_cpu"
    (ROOT / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = (tables(doc) + "\n\n### gsd train --auto-select (--method auto), by scenario\n" + table(doc["auto_select"])
            + ("\n\n### Where DP noise limits accuracy (epsilon 0.5, the same-distribution set)\n" + noise_limited_table(doc["noise_limited"])
               if doc["noise_limited"] else ""))
    if doc.get("dp_rule"):
        from .dp_rule import tables as dp_tables

        doc["auto_select_dp"] = scenarios(doc, runs, package_figures(doc), dp=True)
        (ROOT / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
        text += ("\n" + dp_tables(doc["dp_rule"]) + "\n\n### gsd train --auto-select --select-epsilon (--method auto), by scenario "
                 "(noise-free energy distance)\n" + table(doc["auto_select_dp"], "DP energy distance"))
    (ROOT / f"{stem}.md").write_text(text + "\n")
    print(text)
    if update_package:
        p = Path(__file__).resolve().parents[2] / "gsd_cli" / "report" / "validity.json"
        p.write_text(json.dumps(package_figures(doc), indent=1) + "\n")
        print(f"wrote {p}")
