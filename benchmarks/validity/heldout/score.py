"""The held-out benchmark's one scorer: any round's figures from its spec (:mod:`.spec`) and its frozen results
(:mod:`.results`) alone; no training, no ranking, no import of gsd.

Per cell (task, seed): the accuracy of every option (each no-candidate method; each candidate method with each
candidate), of every deciding arm (the option its recorded decision names, at the budget it trained with), of the
probe's pick and of a random candidate (the mean over the candidates); the *reference* is the best no-candidate
option of the task (by its mean over seeds); the *oracle* the best option of the task, chosen on the same seeds it
is scored on (an upper bound that reads the test sets); the *leave-one-seed-out oracle* scores each seed with the
option that is best on the task's other seeds (what choosing on held-out seeds would have reached).

Over a set of tasks (the round, or rounds pooled as its spec says): per arm the no-harm count (cells within the
tolerance of the reference, split into the cells that chose a no-candidate method and those that used a candidate),
the mean task gain over the reference with a 95% bootstrap interval resampling tasks, its median and the two
largest tasks' share, the share of the oracle's mean gain and of the leave-one-seed-out oracle's (ratio of means,
the same bootstrap), the gain where the oracle gains 3 points or more, the tasks whose untransformed source is a
candidate against the others; for an arm that trains at a share of the budget (the DP advice), its loss split
into the budget's part and the choice's part; the mean Spearman of GSD's and of the probe's order with the
validated method's accuracy; the probe's pick against a random candidate; the agreement of two arms' decisions; and
the spec's targets, each passed or missed (or not scored: a target that ``requires`` another is scored only where
that one passed). A round run at several private sizes scores each task at each size as a task of its own
(``<task>@<size>``); its sets name the sizes they hold, so that a set never holds one task twice. Every interval draws from a generator keyed by the round's bootstrap
key, the set and the figure: an interval does not move when another figure, task or round is added.
"""

from __future__ import annotations

import hashlib
import warnings

import numpy as np

from .results import Results, first_commit, gsd_commit
from .spec import RESULTS, Round, load

#: what "oracle gains" means for the figure of the tasks where public data can pay
BIG_GAIN = 3.0


def label(method: str, public: str | None) -> str:
    return method if public is None else f"{method}:{public}"


def rng_for(spec: Round, set_name: str, figure: str) -> np.random.Generator:
    """The bootstrap generator of one figure of one set: keyed by the spec's template of the set and the figure
    (``names`` renames a figure's last part: round 6 keyed its shares ``<arm>:share``)."""
    head, _, tail = figure.rpartition(":")
    tail = spec.bootstrap.get("names", {}).get(tail, tail)
    key = spec.bootstrap["key"].format(set=set_name, figure=f"{head}:{tail}" if head else tail)
    return np.random.default_rng(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))


def row_mean(draws: np.ndarray) -> np.ndarray:
    return draws.mean(1)


def row_nanmean(draws: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a draw of undefined values only: left out below
        return np.nanmean(draws, 1)


def row_share(draws: np.ndarray) -> np.ndarray:
    """Per draw (rows of tasks x (arm gain, oracle gain)): mean arm gain / mean oracle gain, nan where the oracle
    gains nothing."""
    o = draws[:, :, 1].mean(1)
    with np.errstate(all="ignore"):
        return np.where(o > 0, draws[:, :, 0].mean(1) / o, np.nan)


def task_boot(values, rng, stat=row_mean, draws: int = 2000) -> list[float] | None:
    """95% bootstrap interval of ``stat`` (a statistic of each draw's rows) over the rows of ``values`` (one per
    task), resampling tasks; draws of an undefined statistic are left out."""
    v = np.asarray(values, float)
    if len(v) < 2:
        return None
    d = stat(v[rng.integers(0, len(v), (draws, len(v)))])
    d = d[~np.isnan(d)]
    return [float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))] if len(d) else None


def share(v: np.ndarray) -> float:
    """Mean arm gain / mean oracle gain over the rows of ``v`` (columns: arm, oracle); nan when the oracle gains nothing."""
    return float(row_share(v[None])[0])


def ranks(x) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank."""
    x = np.asarray(x, float)
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        r[x == v] = r[x == v].mean()
    return r


def spearman(a, b) -> float:
    """Spearman's rank correlation (nan when either side is constant)."""
    if len(set(a)) < 2 or len(set(b)) < 2:
        return float("nan")
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


# -- cells and tasks --------------------------------------------------------------------------------------------


def cell(spec: Round, res: Results, task: str, seed: int) -> dict | str:
    """Every arm's accuracy and decision in one cell, or what is missing."""
    t = spec.tasks[task]
    options = {label(m, c): res.acc(task, m, c, seed) for m, c in spec.options(task)}
    if spec.null:
        options["null"] = res.acc(task, spec.null["method"], spec.null_set(task), seed)
    missing = [o for o, a in options.items() if a is None]
    out = {"seed": seed, "options": options, "decisions": {}}
    for arm in spec.arms:
        d = res.decision(task, arm, seed)
        acc = None if d is None else res.acc(task, d["method"], d["public"], seed, d.get("epsilon"))
        if acc is None:
            missing.append(f"{arm} (decision)" if d is None else f"{arm}'s training")
            continue
        out[arm] = acc
        out["decisions"][arm] = [d["method"], d["public"]] + ([d["epsilon"]] if "epsilon" in d else [])
        if spec.dp and "epsilon" in d:  # the no-candidate methods at the training's own share (the runner trains them)
            at = {label(m, None): res.acc(task, m, None, seed, d["epsilon"]) for m in spec.no_candidate}
            missing += [f"{m} at epsilon {d['epsilon']:g}" for m, a in at.items() if a is None]
            out.setdefault("at_share", {})[arm] = at
    probe = res.step(task, seed, "probe")
    if "probe" in spec.steps and probe is None:
        missing.append("probe")
    if missing:
        return f"{task} seed {seed}: " + ", ".join(missing)
    cands = [options[label(spec.probe_pick, c)] for c in t.candidates]
    out["random"] = float(np.mean(cands))
    if probe is not None:
        out["probe_pick"] = max(t.candidates, key=lambda c: float(np.mean(probe["gains"][c])))
        out["probe-pick"] = options[label(spec.probe_pick, out["probe_pick"])]
        ev = ((res.step(task, seed, spec.gsd_ranking) or {}).get("decision") or {}).get("evidence") or {}
        out["pick_refused"] = (ev.get(out["probe_pick"]) or {}).get("second_phase")  # the advice's eligibility rule
    return out


def choose(cells: list[dict], options: list[str]) -> str:
    """The option with the best mean accuracy over ``cells`` (the first on a tie)."""
    return max(options, key=lambda o: np.mean([c["options"][o] for c in cells]))


def oracles(spec: Round, task: str, cells: list[dict]) -> dict:
    """The reference, the oracle and the leave-one-seed-out oracle of a task, written into its cells."""
    opts = [label(m, c) for m, c in spec.options(task)]
    ref = choose(cells, [label(m, None) for m in spec.no_candidate])
    best = choose(cells, opts)
    loso = [choose(cells[:i] + cells[i + 1:], opts) if len(cells) > 1 else best for i in range(len(cells))]
    for c, lo in zip(cells, loso):
        c.update({"reference": c["options"][ref], "reference_option": ref, "oracle": c["options"][best],
                  "oracle-loso": c["options"][lo]})
    return {"reference": ref, "oracle_choice": best, "loso_choices": loso}


def orders(spec: Round, res: Results, task: str, cells: list[dict]) -> dict:
    """GSD's distance and the probe's gain per candidate (means over the cells), and the Spearman of each order with
    the validated method's mean accuracy (a lower distance, a larger gain: better)."""
    t = spec.tasks[task]
    acc = [np.mean([c["options"][label(spec.validated, x)] for c in cells]) for x in t.candidates]
    dist, gain = {}, None
    for c in cells:
        doc = res.step(task, c["seed"], spec.gsd_ranking)
        rows = (doc or {}).get("ranking", doc) or {}
        for r in rows.get("results", []):
            dist.setdefault(r["public"], []).append(r["distance"])
    probes = [res.step(task, c["seed"], "probe") for c in cells]
    if all(probes):
        gain = {x: 100.0 * float(np.mean([np.mean(p["gains"][x]) for p in probes])) for x in t.candidates}
    out = {"distance": {x: float(np.mean(dist[x])) for x in t.candidates} if all(x in dist for x in t.candidates) else None,
           "probe_gain": gain}
    out["spearman"] = {"gsd": spearman([out["distance"][x] for x in t.candidates], acc) if out["distance"] else None,
                       "probe": spearman([-gain[x] for x in t.candidates], acc) if gain else None}
    return out


def task_scores(spec: Round, res: Results, task: str, partial: bool = False) -> dict:
    """One task's cells, means, gains over the reference, oracles and orders; stops on a missing cell unless
    ``partial`` (then its complete cells only; None if it has none)."""
    t = spec.tasks[task]
    got = [cell(spec, res, task, s) for s in spec.seeds]
    missing = [c for c in got if isinstance(c, str)]
    if missing and not partial:
        raise SystemExit(f"round {spec.round} is incomplete: {missing[0]}{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}"
                         f" (python -m benchmarks validity --round {spec.round} status; score --partial scores the complete cells)")
    cells = [c for c in got if isinstance(c, dict)]
    if not cells:
        return None
    out = {"task": task, "kind": t.kind, "realistic": t.realistic, "source": t.source, "seeds": [c["seed"] for c in cells],
           **({"size": t.size, "group": t.group} if t.size is not None else {}),
           **oracles(spec, task, cells), **orders(spec, res, task, cells), "cells": cells}
    arms = [a for a in (*spec.arms, "probe-pick", "random", "oracle", "oracle-loso") if all(a in c for c in cells)]
    out["mean"] = {a: float(np.mean([c[a] for c in cells])) for a in ("reference", *arms)}
    out["gain"] = {a: float(np.mean([c[a] - c["reference"] for c in cells])) for a in arms}
    cand = {c: float(np.mean([x["options"][label(spec.probe_pick, c)] - x["reference"] for x in cells])) for c in t.candidates}
    out["candidate_gain"] = cand  # each candidate's (with the probe-pick method) mean gain over the reference
    if t.related:
        out["related_gain"] = max(cand[c] for c in t.related)
    return out


# -- figures over a set of tasks ---------------------------------------------------------------------------------


def _mean(values) -> float | None:
    return float(np.mean(values)) if len(values) else None


def gain_figures(tasks: list[dict], arm: str, boot) -> dict:
    """An arm's task gains: the mean with its interval, the median, the order and the two largest tasks' share."""
    tm = {t["task"]: t["gain"][arm] for t in tasks}
    g = np.array(list(tm.values()))
    order = sorted(tm, key=lambda x: -tm[x])
    total = float(g.sum())
    return {"mean": float(g.mean()), "ci": boot(g, f"{arm}:gain"), "median": float(np.median(g)),
            "sorted": [[x, tm[x]] for x in order], "top_two": order[:2],
            "top_two_share": float(sum(tm[x] for x in order[:2]) / total) if total > 0 else None}


def no_harm(spec: Round, tasks: list[dict], arm: str) -> dict:
    """Cells within the tolerance of the reference; for a deciding arm, split by what it chose."""
    rows = [(c[arm] >= c["reference"] - spec.tolerance, c["decisions"].get(arm)) for t in tasks for c in t["cells"]]
    out = {"cells": len(rows), "no_harm": sum(ok for ok, _ in rows), "no_harm_share": sum(ok for ok, _ in rows) / len(rows)}
    if all(d for _, d in rows):
        public = [ok for ok, d in rows if d[0] not in spec.no_candidate]
        out.update({"chose_no_candidate": len(rows) - len(public), "used_public": len(public), "used_public_ok": sum(public)})
    return out


def shares(tasks: list[dict], arm: str, boot) -> dict:
    """The arm's mean gain as a share of the oracle's and of the leave-one-seed-out oracle's, with intervals."""
    out = {}
    for key, oracle in (("oracle_share", "oracle"), ("loso_share", "oracle-loso")):
        both = np.array([[t["gain"][arm], t["gain"][oracle]] for t in tasks])
        pos = both[:, 1].mean() > 0
        out[key] = {"mean": share(both) if pos else None, "ci": boot(both, f"{arm}:{key}", row_share) if pos else None,
                    "oracle_mean_gain": float(both[:, 1].mean())}
    return out


def where_big(tasks: list[dict], arm: str, top_two: list[str]) -> dict:
    """The arm's mean gain on the tasks where the oracle gains 3 points or more, with and without the top two."""
    big = [t for t in tasks if t["gain"]["oracle"] >= BIG_GAIN]
    rest = [t for t in big if t["task"] not in top_two]
    return {"tasks": [t["task"] for t in big], "mean": _mean([t["gain"][arm] for t in big]),
            "without_top_two": {"tasks": [t["task"] for t in rest], "mean": _mean([t["gain"][arm] for t in rest])}}


def by_source(tasks: list[dict], arm: str) -> dict:
    src = [t for t in tasks if t["source"]]
    other = [t for t in tasks if not t["source"]]
    total = sum(t["gain"][arm] for t in tasks)
    return {"source_tasks": [t["task"] for t in src], "source_mean": _mean([t["gain"][arm] for t in src]),
            "source_share": float(sum(t["gain"][arm] for t in src) / total) if src and total > 0 else None,
            "other_tasks": [t["task"] for t in other], "other_mean": _mean([t["gain"][arm] for t in other])}


def budget_split(spec: Round, tasks: list[dict], arm: str) -> dict | None:
    """An arm that trains at a share of the budget (its decisions name an epsilon): per cell its loss against the
    reference = the budget's part (the chosen option at that share minus at the whole budget) + the choice's part
    (the chosen option at the whole budget minus the reference); means over all cells, over those that chose a
    no-candidate method, over those that used a candidate."""
    rows = []
    for t in tasks:
        for c in t["cells"]:
            d = c["decisions"].get(arm)
            if d is None or len(d) < 3:
                return None
            full = c["options"][label(d[0], d[1] if d[0] not in spec.no_candidate else None)]
            same = c.get("at_share", {}).get(arm, {}).get(c.get("reference_option"))  # the reference at the same share
            rows.append((d[0] in spec.no_candidate, c[arm] - c["reference"], c[arm] - full, full - c["reference"],
                         None if same is None else c[arm] - same))

    def part(sel):
        sel = list(sel)
        out = {"cells": len(sel), **{k: _mean([r[i] for r in sel]) for i, k in ((1, "total"), (2, "budget"), (3, "choice"))}}
        if sel and all(r[4] is not None for r in sel):  # the choice at equal training budget: against the reference there
            out["vs_reference_at_share"] = _mean([r[4] for r in sel])
        return out

    return {"all": part(rows), "chose_no_candidate": part(r for r in rows if r[0]), "used_public": part(r for r in rows if not r[0])}


def arm_figures(spec: Round, tasks: list[dict], arm: str, boot) -> dict:
    g = gain_figures(tasks, arm, boot)
    out = {**no_harm(spec, tasks, arm), "task_gain": g, **shares(tasks, arm, boot),
           "where_oracle_gains_3": where_big(tasks, arm, g["top_two"]), "by_source": by_source(tasks, arm)}
    split = budget_split(spec, tasks, arm)
    return {**out, "budget_split": split} if split else out


def oracle_figures(spec: Round, tasks: list[dict], which: str, boot) -> dict:
    g = gain_figures(tasks, which, boot)
    big = sum(t["gain"][which] >= BIG_GAIN for t in tasks)
    return {**no_harm(spec, tasks, which), "task_gain": g, "tasks_gaining_3": big, "tasks_gaining_3_share": big / len(tasks),
            "by_task": {t["task"]: t["gain"][which] for t in tasks}}


def order_figures(tasks: list[dict], which: str, key: str, boot) -> dict | None:
    rho = [t["spearman"][which] for t in tasks]
    if any(r is None for r in rho):
        return None
    return {"by_task": {t["task"]: r for t, r in zip(tasks, rho)}, "mean": float(row_nanmean(np.array([rho]))[0]),
            "ci": boot(rho, key, row_nanmean)}


def figures(spec: Round, set_name: str, tasks: list[dict]) -> dict:
    """Every figure of one set of tasks (module docstring)."""
    def boot(values, figure: str, stat=row_mean):
        return task_boot(values, rng_for(spec, set_name, figure), stat, spec.bootstrap["draws"])

    arms = [a for a in dict.fromkeys(a for t in tasks for a in t["gain"]) if all(a in t["gain"] for t in tasks)]
    out = {"tasks": [t["task"] for t in tasks]}
    out.update({o: oracle_figures(spec, tasks, o, boot) for o in ("oracle", "oracle-loso")})
    out.update({a: arm_figures(spec, tasks, a, boot) for a in arms if not a.startswith("oracle")})
    for key, which in (("spearman", "gsd"), ("spearman_probe", "probe")):
        f = order_figures(tasks, which, key, boot)
        if f:
            out[key] = {"method": spec.validated, **f}
    related = [t["related_gain"] for t in tasks if "related_gain" in t]
    if related:  # what the best related set from another source gave, and the worst candidate
        out["related"] = {"mean": float(np.mean(related)), "ci": boot(related, "related:gain"), "tasks": len(related),
                          "gaining_3": int(sum(g >= BIG_GAIN for g in related))}
        out["worst_candidate"] = {"mean": float(np.mean([min(t["candidate_gain"].values()) for t in tasks])),
                                  "by_task": {t["task"]: min(t["candidate_gain"], key=t["candidate_gain"].get) for t in tasks}}
    if "probe-pick" in arms:
        d = np.array([t["mean"]["probe-pick"] - t["mean"]["random"] for t in tasks])
        out["pick_vs_random"] = {"mean": float(d.mean()), "ci": boot(d, "pick-vs-random")}
    refused = [c["pick_refused"] for t in tasks for c in t["cells"] if c.get("pick_refused")]
    if refused:  # cells whose probe's top candidate the advised ranking kept out of the second phase, and why
        out["pick_refused"] = {"cells": len(refused), "of": sum(len(t["cells"]) for t in tasks), "reasons": sorted(set(refused))}
    out["agreement"] = {}
    for a, b in spec.agreement:
        if a in arms and b in arms:
            same = [c["decisions"][a][:2] == c["decisions"][b][:2] for t in tasks for c in t["cells"]]
            out["agreement"][f"{a}~{b}"] = {"cells": sum(same), "of": len(same), "share": sum(same) / len(same)}
    return out


def dig(doc, path: str):
    for part in path.split("."):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def verdicts(spec: Round, figs: dict) -> dict:
    """Each target of the spec: [figure, threshold, passed]."""
    out = {}
    for t in spec.targets:
        try:
            v = dig(figs[t.get("set", next(iter(spec.sets)))], t["figure"])
        except (KeyError, IndexError, TypeError):  # a figure an unfinished or degenerate set does not have
            v = None
        op, thr = next((k, t[k]) for k in ("at_least", "at_most", "above") if k in t)
        ok = v is not None and {"at_least": v >= thr, "at_most": v <= thr, "above": v > thr}[op]
        gate = out.get(t.get("requires"))
        out[t["name"]] = [v, thr, None if gate is not None and gate[2] is not True else bool(ok)]
    return out


def build(spec: Round, partial: bool = False) -> dict:
    """A round's scores: its tasks and the figures of each of its sets (rounds pooled as the spec says)."""
    scored: dict[int, tuple[Round, Results, dict]] = {}

    def scores(n: int):
        if n not in scored:
            s = spec if n == spec.round else load(n)
            res = Results(s)
            scored[n] = (s, res, {t: task_scores(s, res, t, partial) for t in s.scored_tasks})
        return scored[n]

    own, res, tasks = scores(spec.round)
    figs = {name: figures(spec, name, [x for r in st["rounds"] for x in scores(r)[2].values()
                                       if x and (not st.get("sizes") or x.get("size") in st["sizes"])])
            for name, st in spec.sets.items()}
    return {"round": spec.round, "label": spec.label, "spec": str(spec.path.relative_to(RESULTS.parents[1])),
            "frozen": spec.frozen, "frozen_commit": first_commit(spec.frozen_path),
            "command": f"python -m benchmarks validity --round {spec.round} score", "scored_with": gsd_commit(),
            "run_commits": sorted(res.commits), "tuned": res.tuned, "arms": {a: d.get("what", "") for a, d in spec.arms.items()},
            "sets": spec.sets, "tasks": tasks, "figures": figs, "verdicts": verdicts(spec, figs)}


def status(spec: Round) -> list[str]:
    """Where a round stands, from its results alone: per task the complete cells and the first missing pieces."""
    try:
        res = Results(spec)  # reads the tuned file (per size where the round is tuned per size)
    except SystemExit as e:
        return [f"round {spec.round}: not tuned ({e})"]
    out, done = [], 0
    for task in spec.scored_tasks:
        got = [cell(spec, res, task, s) for s in spec.seeds]
        ok = sum(isinstance(c, dict) for c in got)
        done += ok
        gaps = [c for c in got if isinstance(c, str)]
        out.append(f"{task}: {ok} of {len(got)} cells complete" + (f"; {gaps[0]}" + (f" (+{len(gaps) - 1} more)" if len(gaps) > 1 else "") if gaps else ""))
    total = len(spec.scored_tasks) * len(spec.seeds)
    return [f"{spec.label}: {done} of {total} cells complete; frozen in {spec.frozen} "
            f"(commit {first_commit(spec.frozen_path)})", *out]
