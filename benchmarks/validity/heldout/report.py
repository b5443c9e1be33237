"""A round's scores (:func:`.score.build`) written out: ``benchmarks/results/<out>.{json,md}`` and, with
``--update-package``, what ``gsd rank --validity`` quotes of it (``gsd_cli/report/<file>``, as the spec's
``package_note`` says)."""

from __future__ import annotations

import json
import re

from .spec import RESULTS, Round

PACKAGE = RESULTS.parents[1] / "gsd_cli" / "report"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _share(d: dict) -> str:
    ci = d.get("ci")
    return _pct(d["mean"]) + (f" [{_pct(ci[0])}, {_pct(ci[1])}]" if ci else "")


def _pts(x: float | None, dec: int, ci: list | None = None) -> str:
    if x is None:
        return "-"
    return f"{x:+.{dec}f}" + (f" [{ci[0]:+.{dec}f}, {ci[1]:+.{dec}f}]" if ci else "")


def _hp(h: dict) -> str:
    """A tuned point (``lr``, ``epochs``), or a size's points (method -> point)."""
    if all(isinstance(v, dict) for v in h.values()):
        return "at " + ", ".join(f"{m} {_hp(v)}" for m, v in h.items())
    return f"lr {h['lr']:g} x {h['epochs']} epochs" if set(h) == {"lr", "epochs"} else str(h)


def arm_row(arm: str, x: dict, dec: int) -> str:
    g, w = x["task_gain"], x.get("where_oracle_gains_3", {})
    by_choice = f"{x['chose_no_candidate']} | {x['used_public_ok']} of {x['used_public']}" if "used_public" in x else "- | -"
    top = f"{', '.join(g['top_two'])} ({_pct(g['top_two_share'])})"
    shares = " | ".join(_share(x[k]) if k in x else "-" for k in ("oracle_share", "loso_share"))
    return (f"| `{arm}` | {x['no_harm']} of {x['cells']} cells | {by_choice} | {_pts(g['mean'], dec, g['ci'])} | "
            f"{_pts(g['median'], dec)} | {top} | {shares} | {_pts(w.get('mean'), dec)} |")


def set_lines(spec: Round, name: str, f: dict) -> list[str]:
    """The figures of one set: a row per arm and the oracles, then the set's other figures."""
    dec = spec.decimals
    lab, listed = spec.sets[name]["label"], ", ".join(f["tasks"])  # a label that counts its tasks is not counted again
    L = [f"## Figures, {lab}: {listed}" if re.search(r"\(\d+ tasks", lab) else f"## Figures, {lab} ({len(f['tasks'])} tasks: {listed})", "",
         f"| arm | within {spec.tolerance} points of the reference | chose no candidate | used a candidate: within | "
         "mean task gain | median | top two (their share of the gain) | share of the oracle's gain | share of the "
         "leave-one-seed-out oracle's | mean gain where the oracle gains >= 3 |", "|---|---|---|---|---|---|---|---|---|---|"]
    arms = [a for a in f if isinstance(f[a], dict) and "task_gain" in f[a]]
    L += [arm_row(a, f[a], dec) for a in arms]
    L.append("")
    for o, what in (("oracle", "the oracle (in-sample)"), ("oracle-loso", "the leave-one-seed-out oracle")):
        x = f[o]
        L.append(f"- {what}: mean task gain {_pts(x['task_gain']['mean'], dec, x['task_gain']['ci'])}; gains >= 3 points on "
                 f"{x['tasks_gaining_3']} of {len(f['tasks'])} tasks; {x['no_harm']} of {x['cells']} cells within {spec.tolerance} points")
    for key, what in (("spearman", "GSD's order"), ("spearman_probe", "the probe's order")):
        if key in f:
            L.append(f"- {what} against {f[key]['method']} accuracy, mean Spearman over tasks "
                     f"{_pts(f[key]['mean'], 2, f[key]['ci'])}: " + ", ".join(f"{t} {r:+.2f}" for t, r in f[key]["by_task"].items()))
    if "related" in f:
        r, w = f["related"], f["worst_candidate"]
        L.append(f"- the best related set from another source (with `{spec.probe_pick}`): mean gain {_pts(r['mean'], dec, r['ci'])}, "
                 f">= 3 points on {r['gaining_3']} of {r['tasks']} tasks; the worst candidate: mean {_pts(w['mean'], dec)} ("
                 + ", ".join(f"{t} {c}" for t, c in w["by_task"].items()) + ")")
    if "pick_vs_random" in f:
        L.append(f"- the probe's pick minus a random candidate: {_pts(f['pick_vs_random']['mean'], dec, f['pick_vs_random']['ci'])}")
    if "pick_refused" in f:
        x = f["pick_refused"]
        L.append(f"- the probe's top candidate was kept out of the second phase by the advice's eligibility rule in "
                 f"{x['cells']} of {x['of']} cells ({'; '.join(x['reasons'])})")
    L += [f"- `{a.replace('~', '` and `')}` decide alike in {x['cells']} of {x['of']} cells" for a, x in f["agreement"].items()]
    for a in (a for a in arms if a in spec.arms):
        s = f[a].get("budget_split")
        if s:
            L.append(f"- `{a}` at a share of the budget, its loss per cell = the budget's part + the choice's part: " + "; ".join(
                f"{what} ({p['cells']} cells) {_pts(p['total'], 2)} = {_pts(p['budget'], 2)} + {_pts(p['choice'], 2)}"
                + (f" (against the reference at the same share: {_pts(p['vs_reference_at_share'], 2)})" if "vs_reference_at_share" in p else "")
                for what, p in (("all", s["all"]), ("chose no candidate", s["chose_no_candidate"]), ("used a candidate", s["used_public"]))
                if p["cells"]))
        b = f[a]["by_source"]
        if b["source_tasks"] and a == next(iter(spec.arms)):  # the round's advice (its first arm)
            L.append(f"- `{a}` on the tasks whose untransformed source is a candidate ({', '.join(b['source_tasks'])}): mean gain "
                     f"{_pts(b['source_mean'], dec)}, {_pct(b['source_share'])} of the total; the others: {_pts(b['other_mean'], dec)}")
    return L + [""]


def task_lines(spec: Round, doc: dict) -> list[str]:
    arms = [a for a in (*spec.arms, "probe-pick", "random") if all(a in t["mean"] for t in doc["tasks"].values() if t)]
    L = ["## Tasks (mean accuracy over seeds, points)", "",
         "| task | kind | seeds | reference | " + " | ".join(f"`{a}`" for a in arms) + " | oracle (its choice) | leave-one-seed-out oracle (its choices) |",
         "|---|---|---|---|" + "---|" * len(arms) + "---|---|"]
    for t in filter(None, doc["tasks"].values()):
        m = t["mean"]
        L.append(f"| {t['task']} | {t['kind']} | {len(t['seeds'])} | {m['reference']:.1f} ({t['reference']}) | "
                 + " | ".join(f"{m[a]:.1f}" for a in arms) + f" | {m['oracle']:.1f} ({t['oracle_choice']}) | "
                 f"{m['oracle-loso']:.1f} ({', '.join(t['loso_choices'])}) |")
    L += ["", "Decisions per seed (method public[, epsilon]):", "", "| task | seed | " + " | ".join(f"`{a}`" for a in spec.arms) + " |",
          "|---|---|" + "---|" * len(spec.arms)]
    for t in filter(None, doc["tasks"].values()):
        for c in t["cells"]:
            L.append(f"| {t['task']} | {c['seed']} | " + " | ".join(" ".join(str(x) for x in c["decisions"][a] if x is not None)
                                                               if a in c["decisions"] else "-" for a in spec.arms) + " |")
    return L + [""]


def candidate_lines(spec: Round, doc: dict) -> list[str]:
    methods = spec.candidate_methods
    L = ["## Candidates (GSD: mean distance over the seeds' rankings; probe: mean gain, points; mean accuracy per method)", "",
         "| task | candidate | GSD | probe | " + " | ".join(methods) + " |", "|---|---|---|---|" + "---|" * len(methods)]
    for t in filter(None, doc["tasks"].values()):
        for x in spec.tasks[t["task"]].candidates:
            d, p = t["distance"], t["probe_gain"]
            accs = [sum(c["options"][f"{m}:{x}"] for c in t["cells"]) / len(t["cells"]) for m in methods]
            L.append(f"| {t['task']} | {x} | {'-' if not d else format(d[x], '.3f')} | {'-' if not p else format(p[x], '+.1f')} | "
                     + " | ".join(f"{a:.1f}" for a in accs) + " |")
    return L + [""]


def markdown(spec: Round, doc: dict) -> str:
    L = [f"# {spec.label[:1].upper()}{spec.label[1:]}", "",
         f"Spec `{doc['spec']}`, frozen in `{spec.frozen}` (commit {doc['frozen_commit']}) before the round's first run. "
         f"Scored with gsd {doc['scored_with']} from the committed results (`benchmarks/results/{spec.results}/`; the runs "
         f"were made at {len(doc['run_commits'])} gsd commit{'' if len(doc['run_commits']) == 1 else 's'}). Command: `{doc['command']}`. Tuned: "
         + "; ".join(f"{m} {_hp(h)}" for m, h in doc["tuned"].items()) + ". The reference is the best arm that uses no candidate "
         f"({', '.join(spec.no_candidate)}); gains in points over it, per task the mean over seeds; intervals: 95% bootstrap "
         f"over tasks ({spec.bootstrap['draws']} draws).", "",
         *(f"- `{a}`: {w}" for a, w in doc["arms"].items()), ""]
    if doc["verdicts"]:
        L += ["## Targets", "", "| target | figure | threshold | result |", "|---|---|---|---|"]
        L += [f"| {k} | {'-' if v is None else format(v, '.3g')} | {thr:g} | {'not scored (gate missed)' if ok is None else 'pass' if ok else '**miss**'} |"
              for k, (v, thr, ok) in doc["verdicts"].items()]
        L.append("")
    for name, f in doc["figures"].items():
        L += set_lines(spec, name, f)
    return "\n".join(L + task_lines(spec, doc) + candidate_lines(spec, doc))


def _arm_note(x: dict) -> dict:
    return {"cells": x["cells"], "no_harm": x["no_harm"], "dpsgd_by_choice": x["chose_no_candidate"],
            "used_public_ok": x["used_public_ok"], "used_public": x["used_public"],
            "gain": {k: x["task_gain"][k] for k in ("mean", "ci")}, "oracle_share": {k: x["oracle_share"][k] for k in ("mean", "ci")}}


def round_note(spec: Round, doc: dict, note: dict) -> dict:
    """A pre-registered round with its DP advice (``heldout6.json``): both advices' figures and the targets missed."""
    f = doc["figures"][next(iter(spec.sets))]
    a, b = note["non_private"], note["dp"]
    return {"source": f"{doc['command']} --update-package (benchmarks/results/{spec.out}.md)", "label": spec.label,
            "tasks": len(doc["tasks"]), "baseline": {"tuned": doc["tuned"]["dpsgd"], "grid": note["grid"]},
            "select_epsilon": spec.select_epsilon, "intervals": "95% bootstrap over tasks", "non_private": _arm_note(f[a]),
            "dp": _arm_note(f[b]), "agreement": {k: f["agreement"][f"{b}~{a}"][k] for k in ("cells", "share")},
            "oracle_gain": {k: f["oracle"]["task_gain"][k] for k in ("mean", "ci")},
            "missed": [k for k, v in doc["verdicts"].items() if v[2] is False], "scored_with": doc["scored_with"]}


def pooled_note(spec: Round, doc: dict, note: dict) -> dict:
    """The pre-registered rounds and, apart, the rounds designed after their miss (``heldout.json``)."""
    arm = note["arm"]

    def one(name: str) -> dict:
        f = doc["figures"][name]
        a, g = f[arm], f[arm]["task_gain"]
        return {"label": spec.sets[name]["label"], "rounds": list(spec.sets[name]["rounds"]), "tasks": f["tasks"],
                "cells_ok": a["no_harm"], "cells": a["cells"], "dpsgd_by_choice": a["chose_no_candidate"],
                "used_public_ok": a["used_public_ok"], "used_public": a["used_public"], "always_dpsgd_ok": a["cells"],
                "gain": {"mean": g["mean"], "ci": g["ci"]}, "median_gain": g["median"],
                "oracle_share": {k: a["oracle_share"][k] for k in ("mean", "ci")}, "top_two": g["top_two"],
                "top_two_share": g["top_two_share"], "spearman_gsd": {k: f["spearman"][k] for k in ("mean", "ci")},
                **({"spearman_probe": {k: f["spearman_probe"][k] for k in ("mean", "ci")}} if "spearman_probe" in f else {})}

    return {"source": f"{doc['command']} --update-package (benchmarks/results/{spec.out}.md)", "arm": arm,
            "decided_by": spec.arms[arm]["what"], "scored_with": doc["scored_with"],
            "baseline": {"lrs": [g["lr"] for g in spec.tuning["grid"]["dpsgd"]], "epochs": spec.base["epochs"]},
            "intervals": "95% bootstrap over tasks", "pre_registered": one(note["pre_registered"]), "later": one(note["later"])}


def sized_note(spec: Round, doc: dict, note: dict) -> dict:
    """A round run at several private sizes (``heldout7.json``): per size whether public data paid (the
    leave-one-seed-out oracle's tasks gaining 3 points), the oracles' gains, each advice's figures and GSD's order;
    the targets missed and those not scored (their gate missed)."""
    def one(name: str) -> dict:
        f = doc["figures"][name]
        arms = {k: _arm_note(f[note[k]]) for k in ("non_private", "dp", "dp_select") if note.get(k) in f}
        for k in arms:
            arms[k]["loso_share"] = {x: f[note[k]]["loso_share"][x] for x in ("mean", "ci")}
            split = f[note[k]].get("budget_split")
            if split:
                arms[k]["budget_split"] = split["all"]
        lo = f["oracle-loso"]
        gate = [t["name"] for t in spec.targets if t.get("set") == name and t["figure"] == "oracle-loso.tasks_gaining_3_share"]
        return {"label": spec.sets[name]["label"], "pays": doc["verdicts"][gate[0]][2] if gate else None, "sizes": list(spec.sets[name].get("sizes", [])), "tasks": f["tasks"],
                "oracle_loso": {"gaining_3": lo["tasks_gaining_3"], "of": len(f["tasks"]),
                                "gain": {k: lo["task_gain"][k] for k in ("mean", "ci")}},
                "oracle": {"gaining_3": f["oracle"]["tasks_gaining_3"], "gain": {k: f["oracle"]["task_gain"][k] for k in ("mean", "ci")}},
                **arms, "spearman_gsd": {k: f["spearman"][k] for k in ("mean", "ci")} if "spearman" in f else None,
                **({"probe_pick": {"gain": {k: f["probe-pick"]["task_gain"][k] for k in ("mean", "ci")},
                                   "oracle_share": {k: f["probe-pick"]["oracle_share"][k] for k in ("mean", "ci")}}} if "probe-pick" in f else {}),
                **({"pick_refused": {k: f["pick_refused"][k] for k in ("cells", "of")}} if "pick_refused" in f else {})}

    return {"source": f"{doc['command']} --update-package (benchmarks/results/{spec.out}.md)", "label": spec.label,
            "epsilon": spec.epsilon, "select_epsilon": (spec.dp or {}).get(spec.arms.get(note.get("dp"), {}).get("step"), {}).get("select_epsilon", spec.select_epsilon),
            "tuned": doc["tuned"], "intervals": "95% bootstrap over tasks", "sets": {n: one(n) for n in spec.sets},
            "missed": [k for k, v in doc["verdicts"].items() if v[2] is False],
            "not_scored": [k for k, v in doc["verdicts"].items() if v[2] is None], "scored_with": doc["scored_with"]}


def package_note(spec: Round, doc: dict) -> dict | None:
    note = spec.package_note
    if not note:
        return None
    if note.get("kind") == "by_size":
        return sized_note(spec, doc, note)
    return (pooled_note if "pre_registered" in note else round_note)(spec, doc, note)


def write(spec: Round, doc: dict, update_package: bool = False) -> str:
    """The scores' JSON and markdown (the markdown also returned), and with ``update_package`` the shipped note."""
    text = markdown(spec, doc)
    (RESULTS / f"{spec.out}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (RESULTS / f"{spec.out}.md").write_text(text)
    note = package_note(spec, doc) if update_package else None
    if update_package and note is None:
        raise SystemExit(f"round {spec.round}'s spec ships no package note")
    if note is not None:
        (PACKAGE / spec.package_note["file"]).write_text(json.dumps(note, indent=1) + "\n")
    return text
