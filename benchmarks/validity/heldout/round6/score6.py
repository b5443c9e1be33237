"""Round 6's figures and its pass/fail verdicts (:mod:`.protocol`), from the cached runs only:
``benchmarks/results/heldout6_scores.{json,md}``.

Per cell (task, seed): the accuracy of every arm; per task: the mean over seeds; over tasks: the no-harm count,
the mean task gain with a 95% bootstrap interval resampling tasks, the share of the oracle's gain, the DP advice's
agreement with the non-private advice, and the probe's pick against a random candidate. Each target of
:data:`.protocol.TARGETS` is reported as passed or missed.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from ..cache import RESULTS, gsd_commit, run_key
from ..score import _share, task_boot, write_scores
from .protocol import SEEDS, TARGETS, read_split6
from .run6 import RANKINGS6, load6, ready, settings6

OUT_JSON = RESULTS.parent / "heldout6_scores.json"
#: what gsd rank's validity note quotes of this round (gsd_cli/report/validity.py), written by ``score --update-package``
PACKAGE_NOTE = RESULTS.parents[2] / "gsd_cli" / "report" / "heldout6.json"
OUT_MD = RESULTS.parent / "heldout6_scores.md"
B = 2000
TOL = 0.5  # points: "within 0.5 of DP-SGD"


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(int(hashlib.sha256(f"round6:{name}".encode()).hexdigest()[:16], 16))


def _load(task: str, seed: int, kind: str) -> dict | None:
    p = RANKINGS6 / f"{task}-s{seed}-{kind}.json"
    return json.loads(p.read_text()) if p.is_file() else None


def advice_decision(task: str, advised: dict, probe: dict) -> tuple[str, str | None]:
    """auto:probe: gsd_cli.train.advice.advise on the cached advised ranking and feature probe (as gsd train
    --auto-select decides: the probe decides among the candidates closer than the noise references)."""
    from gsd_cli.data import resolve
    from gsd_cli.train.advice import advise, describe

    from ..score import _Ranking, probe_result
    from .prepare6 import TASKS

    t = TASKS[task]
    facts = {c: describe(resolve(c)) for c in t.candidates}
    a = advise(_Ranking(advised["ranking"], advised.get("references")), method="auto", candidates=facts,
               private_classes=int(resolve(t.train).num_classes), probe=probe_result(probe))
    return a.method, a.public


def cell(task: str, seed: int, runs: dict) -> dict | None:
    """Every arm's accuracy (points) and decision in one cell; None while any of its runs is missing."""
    from gsd_cli.train.dp_advice import split_budget

    from .prepare6 import TASKS

    t = TASKS[task]

    def acc(method, public, eps=None, delta=None):
        s = settings6(task, method, *(() if eps is None else (eps, delta)))
        r = runs.get(run_key(task, method, public, s, seed))
        return None if r is None else 100.0 * r["accuracy"]

    base = acc("dpsgd", None)
    sp = {c: acc("second-phase", c) for c in t.candidates}
    advised, probe, dp = (_load(task, seed, k) for k in ("advised", "probe", "dp"))
    if base is None or None in sp.values() or advised is None or probe is None or dp is None:
        return None
    m, pub = advice_decision(task, advised, probe)
    d = dp["decision"]
    eps_t, delta_t, _ = split_budget(*(read_split6()[k] for k in ("epsilon", "delta", "select_epsilon")))
    dp_acc = acc(d["method"], d["public"] if d["method"] != "dpsgd" else None, eps_t, delta_t)
    if dp_acc is None:
        return None
    pick = max(t.candidates, key=lambda c: float(np.mean(probe["gains"][c])))
    return {"seed": seed, "dpsgd": base, "second-phase": sp,
            "auto:probe": base if m == "dpsgd" else sp[pub], "auto:probe_decision": [m, pub],
            "auto:dp": dp_acc, "auto:dp_decision": [d["method"], d["public"]],
            "probe-pick": sp[pick], "probe-pick_candidate": pick, "random": float(np.mean(list(sp.values())))}


def task_scores(task: str, runs: dict) -> dict | None:
    cells = [cell(task, s, runs) for s in SEEDS]
    if any(c is None for c in cells):
        return None
    from .prepare6 import TASKS

    t = TASKS[task]
    options = {"dpsgd": [c["dpsgd"] for c in cells], **{f"second-phase:{x}": [c["second-phase"][x] for c in cells] for x in t.candidates}}
    best = max(options, key=lambda o: np.mean(options[o]))
    for c, v in zip(cells, options[best]):
        c["oracle"] = v
    mean = {a: float(np.mean([c[a] for c in cells])) for a in ("dpsgd", "auto:probe", "auto:dp", "oracle", "probe-pick", "random")}
    return {"task": task, "kind": t.kind, "realistic": t.realistic, "oracle_choice": best, "cells": cells, "mean": mean,
            "gain": {a: mean[a] - mean["dpsgd"] for a in ("auto:probe", "auto:dp", "oracle", "probe-pick", "random")}}


def boot(values: np.ndarray, stat, name: str) -> list[float] | None:
    """95% interval of ``stat`` over rows of ``values`` (one per task), resampling tasks
    (:func:`validity.heldout.score.task_boot`, :data:`B` draws from a generator keyed by ``name``)."""
    return task_boot(values, rng_for(name), stat, B)


def arm_figures(tasks: list[dict], arm: str) -> dict:
    cells = [c for t in tasks for c in t["cells"]]
    dec = [c.get(f"{arm}_decision") for c in cells]
    ok = [c[arm] >= c["dpsgd"] - TOL for c in cells]
    gains = np.array([t["gain"][arm] for t in tasks])
    pair = np.array([[t["gain"][arm], t["gain"]["oracle"]] for t in tasks])
    order = sorted(gains, reverse=True)
    total = float(gains.sum())
    return {"cells": len(cells), "no_harm": int(sum(ok)), "no_harm_share": sum(ok) / len(cells),
            "dpsgd_by_choice": sum(1 for d in dec if d and d[0] == "dpsgd"),
            "used_public_ok": sum(1 for d, o in zip(dec, ok) if d and d[0] != "dpsgd" and o),
            "used_public": sum(1 for d in dec if d and d[0] != "dpsgd"),
            "task_gain": {"mean": float(gains.mean()), "ci": boot(gains, np.mean, f"{arm}:gain"), "median": float(np.median(gains)),
                          "top_two_share": float(sum(order[:2]) / total) if total > 0 else None},
            "oracle_share": {"mean": _share(pair), "ci": boot(pair, _share, f"{arm}:share")}}


def build() -> dict:
    doc = ready()
    runs = load6()
    scores = {t: task_scores(t, runs) for t in doc["held_out"]}
    missing = [t for t, s in scores.items() if s is None]
    if missing:
        raise SystemExit(f"round 6 is incomplete ({', '.join(missing)}): python -m validity.heldout.round6 run")
    tasks = list(scores.values())
    figs = {a: arm_figures(tasks, a) for a in ("auto:probe", "auto:dp", "probe-pick", "random")}
    oracle = np.array([t["gain"]["oracle"] for t in tasks])
    figs["oracle"] = {"task_gain": {"mean": float(oracle.mean()), "ci": boot(oracle, np.mean, "oracle:gain")}}
    cells = [c for t in tasks for c in t["cells"]]
    agree = sum(1 for c in cells if c["auto:dp_decision"] == c["auto:probe_decision"])
    vs_random = np.array([t["mean"]["probe-pick"] - t["mean"]["random"] for t in tasks])
    figs["agreement"] = {"cells": agree, "share": agree / len(cells)}
    figs["pick_vs_random"] = {"mean": float(vs_random.mean()), "ci": boot(vs_random, np.mean, "pick-vs-random")}
    verdict = verdicts(figs)
    return {"protocol": "benchmarks/validity/heldout/round6/split6.json", "scored_with": gsd_commit(),
            "run_commits": sorted({r["commit"] for r in runs.values()}), "figures": figs, "targets": TARGETS,
            "verdicts": verdict, "tasks": scores}


def verdicts(f: dict) -> dict:
    p, d = f["auto:probe"], f["auto:dp"]
    ci = p["task_gain"]["ci"]
    share = lambda x: x["oracle_share"]["mean"]  # noqa: E731
    T = TARGETS
    return {
        "auto:probe no-harm": [p["no_harm_share"], T["auto:probe"]["no_harm_share"], p["no_harm_share"] >= T["auto:probe"]["no_harm_share"]],
        "auto:probe task gain CI low": [ci[0], 0.0, ci[0] > T["auto:probe"]["task_gain_ci_low_above"]],
        "auto:probe oracle share": [share(p), T["auto:probe"]["oracle_share"], share(p) >= T["auto:probe"]["oracle_share"]],
        "auto:dp no-harm": [d["no_harm_share"], T["auto:dp"]["no_harm_share"], d["no_harm_share"] >= T["auto:dp"]["no_harm_share"]],
        "auto:dp oracle share": [share(d), T["auto:dp"]["oracle_share"], share(d) >= T["auto:dp"]["oracle_share"]],
        "auto:dp agreement": [f["agreement"]["share"], T["auto:dp"]["agreement_share"], f["agreement"]["share"] >= T["auto:dp"]["agreement_share"]],
        "probe pick vs random CI low": [f["pick_vs_random"]["ci"][0], 0.0, f["pick_vs_random"]["ci"][0] > T["probe-pick"]["vs_random_ci_low_above"]],
    }


def _ci(c) -> str:
    return f"[{c[0]:+.2f}, {c[1]:+.2f}]" if c else "n/a"


def markdown(doc: dict) -> str:
    f = doc["figures"]
    out = ["# Round 6 (issue 52): pre-registered, 8 new tasks, 5 seeds", "",
           f"Protocol: `{doc['protocol']}` (committed before the first run). Scored with gsd {doc['scored_with']}. "
           "Command: `cd benchmarks && python -m validity.heldout.round6 score`. Intervals: 95% bootstrap over tasks.", "",
           "## Verdicts", "", "| target | figure | threshold | result |", "| --- | --- | --- | --- |"]
    for k, (v, thr, ok) in doc["verdicts"].items():
        out.append(f"| {k} | {v:.3g} | {thr:g} | {'pass' if ok else '**miss**'} |")
    out += ["", "## Arms over tasks", "",
            "| arm | within 0.5 of DP-SGD | DP-SGD by choice | used public: ok | mean task gain | median | top two's share | share of oracle's gain |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for a in ("auto:probe", "auto:dp", "probe-pick", "random"):
        x = f[a]
        tt = x["task_gain"]["top_two_share"]
        out.append(f"| {a} | {x['no_harm']}/{x['cells']} | {x['dpsgd_by_choice']} | {x['used_public_ok']}/{x['used_public']} | "
                   f"{x['task_gain']['mean']:+.2f} {_ci(x['task_gain']['ci'])} | {x['task_gain']['median']:+.2f} | "
                   f"{'n/a' if tt is None else f'{100 * tt:.0f}%'} | {100 * x['oracle_share']['mean']:.0f}% "
                   f"[{', '.join(f'{100 * v:.0f}%' for v in x['oracle_share']['ci'] or [])}] |")
    out += ["", f"Oracle: mean task gain {f['oracle']['task_gain']['mean']:+.2f} {_ci(f['oracle']['task_gain']['ci'])}. "
            f"auto:dp makes auto:probe's decision in {f['agreement']['cells']}/{len(doc['tasks']) * len(SEEDS)} cells. "
            f"Probe's pick minus a random candidate: {f['pick_vs_random']['mean']:+.2f} {_ci(f['pick_vs_random']['ci'])}.", "",
            "## Tasks (mean accuracy over seeds, points)", "",
            "| task | kind | DP-SGD | auto:probe | auto:dp | probe-pick | random | oracle (choice) | decisions auto:probe / auto:dp |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in doc["tasks"].values():
        m = t["mean"]
        dec = "; ".join(f"{c['auto:probe_decision'][1] or 'dpsgd'} / {c['auto:dp_decision'][1] or 'dpsgd'}" for c in t["cells"])
        out.append(f"| {t['task']} | {t['kind']} | {m['dpsgd']:.1f} | {m['auto:probe']:.1f} | {m['auto:dp']:.1f} | {m['probe-pick']:.1f} | "
                   f"{m['random']:.1f} | {m['oracle']:.1f} ({t['oracle_choice']}) | {dec} |")
    return "\n".join(out) + "\n"


def package_note(doc: dict) -> dict:
    """What ``gsd_cli/report/heldout6.json`` ships: the round's figures for the non-private and the DP advice, as the
    markdown prints them, and which targets it missed."""
    from .protocol import SELECT_EPSILON
    from .run6 import chosen

    def arm(a: str) -> dict:
        x = doc["figures"][a]
        return {k: x[k] for k in ("cells", "no_harm", "dpsgd_by_choice", "used_public_ok", "used_public")} | {
            "gain": {"mean": x["task_gain"]["mean"], "ci": x["task_gain"]["ci"]},
            "oracle_share": {"mean": x["oracle_share"]["mean"], "ci": x["oracle_share"]["ci"]}}

    return {"source": "cd benchmarks && python -m validity.heldout.round6 score --update-package (benchmarks/results/heldout6_scores.md)",
            "label": "round 6 (pre-registered, 8 new tasks from new sources)", "tasks": len(doc["tasks"]),
            "baseline": {"tuned": chosen()["dpsgd"], "grid": "lr 0.5-4 x 3-12 epochs"}, "select_epsilon": SELECT_EPSILON,
            "intervals": "95% bootstrap over tasks", "non_private": arm("auto:probe"), "dp": arm("auto:dp"),
            "agreement": doc["figures"]["agreement"], "oracle_gain": doc["figures"]["oracle"]["task_gain"],
            "missed": [k for k, v in doc["verdicts"].items() if not v[2]], "scored_with": doc["scored_with"]}


def main(update_package: bool = False) -> dict:
    doc = build()
    write_scores(doc, OUT_JSON, OUT_MD, markdown(doc), PACKAGE_NOTE, package_note(doc) if update_package else None)
    return doc
