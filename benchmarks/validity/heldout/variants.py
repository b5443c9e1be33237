"""Exploratory, in-sample: probe variants for a later round (issue 42). Not gsd's advice, and not evidence
about it: every task here has been seen (rounds 1-4), so what this finds can only be *proposed* here
and must be measured on a new round of held-out tasks before it changes a default.

The question (round 4's photos2): the feature probe fits its linear probe on 1,000 private examples
without noise, a far easier learner than DP training. Where the untrained model's random features
already separate the private classes well for such a learner (77-80% on photos2), no stage 1 beats
them with confidence, and the advice trains DP-SGD alone where the second phase gained +19 points. A
*few-shot* probe (the same ridge fitted on ``m`` examples per class, scored on the rest, averaged over
splits) is a weaker learner, closer to what DP training can extract.

How: each task and seed's probe is re-run exactly as :func:`.arms.probe_one` runs it (the same
stage 1, the same draws), with :func:`gsd_cli.train.probe.linear_probe_accuracy` wrapped so that every
call also scores the same features with the few-shot probes; the full probe's figures are checked
against the cached probe (the same numbers). Each variant's gains then go through gsd's own advice
(:func:`.score.decision_advise`, the probe's gains replaced), and the scorer's cells are read off the
cached runs::

    cd benchmarks && OMP_NUM_THREADS=1 python -m validity.heldout.variants [--tasks ...] [--seeds 0 1 2 3 4]

writes ``results/heldout/rankings/<task>-s<seed>-probe-variants.json`` and
``results/heldout_probe_variants.{json,md}`` (``--out``). Round 5 (held out) pre-registered the few-shot
arms in ``split5.json``: ``--tasks mnist-blur fashion-noisy letters-uz graphics --out heldout_probe_variants_round5``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from .cache import RANKINGS, RESULTS, gsd_commit, load_runs
from .tasks import ROUND1, ROUND2, ROUND3, ROUND4, TASKS, register

#: the few-shot probes: examples per class fitted (the rest scored), and the random splits averaged
PER_CLASS = (10, 25)
SPLITS = 5


def few_shot_accuracy(feats: torch.Tensor, labels: torch.Tensor, num_classes: int, seed: int, per_class: int,
                      splits: int = SPLITS) -> float:
    """The feature probe's ridge (the same penalty per fitted example, standardised features) fitted on
    ``per_class`` examples of each class and scored on the others, averaged over ``splits`` random splits."""
    from gsd_cli.train.probe import RIDGE

    f = feats.detach().to(torch.float64).cpu()
    y = labels.detach().to(torch.int64).cpu().numpy()
    rng = np.random.default_rng([seed, per_class, 0xF5])
    accs = []
    for _ in range(splits):
        fit = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per_class] for c in range(num_classes)])
        score = np.setdiff1d(np.arange(len(y)), fit)
        fi, si = torch.from_numpy(fit), torch.from_numpy(score)
        mu, sd = f[fi].mean(0), f[fi].std(0) + 1e-6
        x = torch.cat([(f[fi] - mu) / sd, torch.ones(len(fi), 1, dtype=f.dtype)], 1)
        xs = torch.cat([(f[si] - mu) / sd, torch.ones(len(si), 1, dtype=f.dtype)], 1)
        target = torch.nn.functional.one_hot(torch.from_numpy(y[fit]), num_classes).to(f.dtype)
        w = torch.linalg.solve(x.T @ x + RIDGE * len(fi) * torch.eye(x.shape[1], dtype=f.dtype), x.T @ target)
        accs.append(float((torch.argmax(xs @ w, 1).numpy() == y[score]).mean()))
    return float(np.mean(accs))


def probe_variants(task: str, seed: int) -> dict:
    """The probe of ``task`` at ``seed`` with every variant's baseline and gains (cached)."""
    path = RANKINGS / f"{task}-s{seed}-probe-variants.json"
    if path.is_file():
        return json.loads(path.read_text())
    import gsd_cli.train.probe as P

    from .arms import probe_one

    calls: list[dict] = []
    full = P.linear_probe_accuracy

    def wrapped(feats, labels, num_classes, s):
        out = {"full": full(feats, labels, num_classes, s)}
        for m in PER_CLASS:
            out[f"few{m}"] = few_shot_accuracy(feats, labels, num_classes, s, m)
        calls.append(out)
        return out["full"]

    cached = RANKINGS / f"{task}-s{seed}-probe.json"
    saved = cached.read_text() if cached.is_file() else None
    P.linear_probe_accuracy = wrapped
    t0 = time.perf_counter()
    try:
        if cached.is_file():
            cached.unlink()  # probe_one recomputes (its cache restored below, unchanged)
        doc = probe_one(task, seed)
    finally:
        P.linear_probe_accuracy = full
        if saved is not None:
            cached.write_text(saved)
    cands = list(TASKS[task].candidates)
    per_draw = 1 + len(cands)  # the baseline, then each candidate, per draw (probe_second_phase's order)
    variants = {}
    for v in calls[0]:
        base = [calls[r * per_draw][v] for r in range(len(calls) // per_draw)]
        gains = {c: [calls[r * per_draw + 1 + i][v] - base[r] for r in range(len(base))] for i, c in enumerate(cands)}
        variants[v] = {"baseline": base, "gains": gains}
    if saved is not None:  # the full probe reproduces the cached one
        old = json.loads(saved)
        assert np.allclose(old["baseline"], variants["full"]["baseline"]), (task, seed)
    out = {"task": task, "seed": seed, "stage1": doc["stage1"], "examples": doc["examples"], "model": doc["model"],
           "variants": variants, "commit": gsd_commit(), "wall_seconds": round(time.perf_counter() - t0, 1)}
    path.write_text(json.dumps(out) + "\n")
    return out


def score(tasks, seeds) -> dict:
    """Each variant's advice (gsd's, the probe's gains replaced) on the cached runs: cells within 0.5 points
    of DP-SGD, the gain where the oracle gains >= 3, and Spearman of the mean gain with the second phase's accuracy."""
    from .arms import chosen
    from .cache import load_ranking
    from .score import BASELINE, Cells, decision_advise, spearman

    runs, hps = load_runs(), chosen()
    rows = {}
    for task in tasks:
        c = Cells(task, seeds, runs, hps)
        cands = TASKS[task].candidates
        c.seeds = [s for s in c.seeds if load_ranking(task, s, "advised") is not None and load_ranking(task, s, "probe") is not None]
        if not c.seeds:
            continue  # no advice to re-apply (the selection tasks have no advised rankings)
        docs = {s: probe_variants(task, s) for s in c.seeds}
        sp = np.array([np.mean([c.acc("second-phase", x, s) for s in c.seeds]) for x in cands])
        base = {s: c.acc(BASELINE, None, s) for s in c.seeds}
        options = [(BASELINE, None)] + [(m, x) for m in ("gep", "second-phase") for x in cands]
        oracle = max(options, key=lambda o: np.mean([c.acc(o[0], o[1], s) for s in c.seeds]))
        oracle_gain = float(np.mean([c.acc(*oracle, s) - base[s] for s in c.seeds]))
        rows[task] = {"oracle_gain": oracle_gain, "variants": {}}
        for v in docs[c.seeds[0]]["variants"]:
            cells, decisions = [], []
            for s in c.seeds:
                probe = {**load_ranking(task, s, "probe"), "gains": docs[s]["variants"][v]["gains"]}
                m, pub = decision_advise(task, load_ranking(task, s, "advised"), probe)
                acc = base[s] if m == BASELINE else c.acc(m, pub, s)
                cells.append(acc - base[s])
                decisions.append(f"{m} {pub or '-'}")
            mean_gain = np.array([np.mean([np.mean(docs[s]["variants"][v]["gains"][x]) for s in c.seeds]) for x in cands])
            rows[task]["variants"][v] = {"cells": cells, "decisions": decisions, "spearman": spearman(list(-mean_gain), list(sp)),
                                         "baseline": float(np.mean([np.mean(docs[s]["variants"][v]["baseline"]) for s in c.seeds]))}
    summary = {}
    for v in next(iter(rows.values()))["variants"]:
        cells = [g for r in rows.values() for g in r["variants"][v]["cells"]]
        big = [t for t, r in rows.items() if r["oracle_gain"] >= 3]
        summary[v] = {"cells_ok": sum(g >= -0.5 for g in cells), "cells": len(cells),
                      "gain_where_oracle_gains_3": float(np.mean([np.mean(rows[t]["variants"][v]["cells"]) for t in big])) if big else None,
                      "spearman_mean": float(np.nanmean([r["variants"][v]["spearman"] for r in rows.values()]))}
    return {"what": "exploratory, in-sample (every task seen): probe variants through gsd's advice", "per_class": PER_CLASS,
            "splits": SPLITS, "seeds": list(seeds), "tasks": rows, "summary": summary}


def markdown(doc: dict) -> str:
    vs = list(doc["summary"])
    L = ["# Probe variants (exploratory, in-sample: every task has been seen)", "",
         f"Few-shot probes: the feature probe's ridge fitted on m examples per class (m in {list(doc['per_class'])}), scored on "
         f"the rest, {doc['splits']} splits; each variant's gains through gsd's advice. Seeds {doc['seeds']}. "
         "A proposal for a later held-out round, not evidence.", "",
         "| variant | cells within 0.5 of DP-SGD | mean gain where the oracle gains >= 3 | mean Spearman |", "|---|---|---|---|"]
    for v in vs:
        s = doc["summary"][v]
        g = "-" if s["gain_where_oracle_gains_3"] is None else f"{s['gain_where_oracle_gains_3']:+.1f}"
        L.append(f"| {v} | {s['cells_ok']} of {s['cells']} | {g} | {s['spearman_mean']:+.2f} |")
    L += ["", "| task | oracle gain | " + " | ".join(f"{v}: gain, Spearman, untrained probe %" for v in vs) + " |",
          "|---|---|" + "---|" * len(vs)]
    for t, r in doc["tasks"].items():
        L.append(f"| {t} | {r['oracle_gain']:+.1f} | " + " | ".join(
            f"{np.mean(r['variants'][v]['cells']):+.1f}, {r['variants'][v]['spearman']:+.2f}, {100 * r['variants'][v]['baseline']:.0f}" for v in vs) + " |")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog=f"python -m {__spec__.name}")
    ap.add_argument("--tasks", nargs="+", default=[*ROUND1, *ROUND2, *ROUND3, *ROUND4])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    ap.add_argument("--compute-only", action="store_true", help="run the probes, do not score (a task's probe must be cached first: rank --probe)")
    ap.add_argument("--out", default="heldout_probe_variants", help="results/<OUT>.{json,md} (round 5, held out: heldout_probe_variants_round5)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    register()
    for task in a.tasks:
        for s in a.seeds:
            if not (RANKINGS / f"{task}-s{s}-probe.json").is_file():  # the seeds the benchmark probed (selection tasks: 0-2)
                print(f"{task} seed {s}: no cached probe (python -m validity.heldout rank --stage ... --probe first): skipped", flush=True)
                continue
            t0 = time.time()
            d = probe_variants(task, s)
            print(f"{task} seed {s}: " + "; ".join(
                f"{v} {100 * np.mean(x['baseline']):.0f}%" for v, x in d["variants"].items()) + f" ({time.time() - t0:.0f} s)", flush=True)
    if a.compute_only:
        return
    doc = score(a.tasks, a.seeds)
    (RESULTS.parent / f"{a.out}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (RESULTS.parent / f"{a.out}.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
