"""Issue 53's repeat rule on the held-out benchmark's own draws: ``python -m benchmarks validity.heldout.stops``.

Every held-out cell of rounds 2-6 has its advised ranking (the candidates and the in-run noise references, three
draws at 224) and its feature probe (every candidate, three draws) cached. This replays, on those numbers,

* ``every draw``: the advice as the benchmark scored it (``gsd_cli.advice.decide.advise`` on the whole ranking and
  the whole probe: ``auto:probe``), and
* ``stops``: what ``gsd train --auto-select`` now does (``gsd_cli.advice.select.advised_selection(gate="helping")``):
  the probe on the candidates the second phase can use, each stopped once its test is decided
  (``gsd_cli.ranking.reference.can_still_pass``); then the helpful ones ranked one at a time, the largest gain first,
  each candidate's draws stopped once its test against the references is decided, until one is closer than noise,

and counts whether the two decisions are the same, and the stage-1 trainings and the ranking's subspaces at 224 that
each way computes (the subspaces with the probe first but every draw run, this round's earlier gate, beside them).
No training or ranking is run: the cached draws are each draw's numbers, which do not depend on the other
candidates or on how many draws were run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from .replay import Ranking, probe_result
from .results import Results
from .spec import RESULTS


def _restricted(doc: dict, names: list[str]) -> dict:
    """The cached ranking document with only ``names`` among its candidates (every reference kept)."""
    from gsd_cli.ranking.reference import is_reference

    keep = set(names)
    return {**doc, "results": [r for r in doc["results"] if r["public"] in keep],
            "runs": [{**run, "distances": {n: d for n, d in run["distances"].items() if n in keep or is_reference(n)}}
                     for run in doc.get("runs") or []]}


def _sequential(values: list[float], draws: int) -> int:
    """How many of ``values`` (one per draw, in order) are drawn before the test is decided to fail (all if never)."""
    from gsd_cli.ranking.reference import ALPHA, can_still_pass

    for r in range(1, draws):
        if not can_still_pass(values[:r], draws, ALPHA, -1.0, 1.0):
            return r
    return draws


def replay(advised: dict, probe_doc: dict, facts: dict, classes: int) -> dict:
    """One cell: the decision with every draw and with the stops, and the work of each (module docstring)."""
    from gsd_cli.ranking.reference import closer_than_reference
    from gsd_cli.advice.decide import ALPHA, advise, second_phase_usable
    from gsd_cli.advice.probe import ProbeResult

    full_probe = probe_result(probe_doc)
    every = advise(Ranking(advised["ranking"], advised.get("references")), "auto", candidates=facts, private_classes=classes,
                   probe=full_probe)
    draws = full_probe.repeats
    usable = [n for n in facts if second_phase_usable(facts[n], classes) is None and n in full_probe.gains]
    kept = {n: _sequential(full_probe.gains[n], draws) for n in usable}
    probe = ProbeResult(full_probe.baseline[: max(kept.values(), default=0)], {n: full_probe.gains[n][:k] for n, k in kept.items()},
                        examples=full_probe.examples, model=full_probe.model, stage1=full_probe.stage1,
                        stopped={n: k for n, k in kept.items() if k < draws}, planned=draws)
    helping = sorted((n for n in usable if probe.test(n, ALPHA)[0]), key=lambda n: -probe.mean_gain(n))
    runs = advised["ranking"].get("runs") or []
    refs = [r["public"] for r in advised.get("references") or []]
    ranked, stopped, tried, ranking = [], {}, [], None
    for name in helping:
        tried.append(name)
        margins = [min(run["distances"][x] for x in refs) - run["distances"][name] for run in runs]
        k = _sequential(margins, len(runs))
        if k < len(runs):
            stopped[name] = {"draws": k, "of": len(runs), "margins": margins[:k]}
            continue
        ranked.append(name)
        ranking = Ranking(_restricted(advised["ranking"], ranked), advised.get("references"))
        if closer_than_reference(ranking, name).closer:
            break
    if ranking is None:
        ranking = Ranking({**advised["ranking"], "results": [], "runs": []}, [])
    ranking.not_ranked = sorted(set(facts) - set(tried))
    ranking.stopped = stopped
    gated = advise(ranking, "auto", candidates=facts, private_classes=classes, probe=probe)
    n_refs = len(refs)
    drawn = [stopped[n]["draws"] if n in stopped else len(runs) for n in tried]
    return {"every draw": [every.method, every.public], "stops": [gated.method, gated.public],
            "same": (every.method, every.public) == (gated.method, gated.public),
            "stage1": {"stops": int(sum(kept.values())), "every draw": draws * len(usable)},
            "subspaces": {"stops": (1 + n_refs) * max(drawn, default=0) + sum(drawn),
                          "probe first, every draw": ((1 + n_refs) * len(runs) if tried else 0) + len(runs) * len(tried),
                          "every candidate": (1 + n_refs + len(facts)) * len(runs)},
            "stopped": {"probe": probe.stopped, "ranking": {n: s["draws"] for n, s in stopped.items()}}}


def cells() -> list[tuple[str, str, int, dict, dict, dict, int]]:
    """(round, task, seed, advised, probe, facts, classes) of every held-out cell with both steps recorded (rounds 2-6)."""
    from gsd_cli.data import resolve
    from gsd_cli.advice.decide import describe

    from .run import ready

    out = []
    for n in ROUNDS:
        spec = ready(n)
        res = Results(spec)
        for task in spec.scored_tasks:
            t = spec.tasks[task]
            facts = {c: describe(resolve(c)) for c in t.candidates}
            classes = int(resolve(t.train).num_classes)
            for seed in spec.seeds:
                advised, probe = res.step(task, seed, "advised"), res.step(task, seed, "probe")
                if advised is not None and probe is not None:
                    out.append((f"round {n}", task, seed, advised, probe, facts, classes))
    return out


#: the rounds replayed
ROUNDS = (2, 3, 4, 5, 6)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks validity.heldout.stops", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=RESULTS.parent / "heldout_stops.json")
    a = ap.parse_args(argv)
    rows = []
    for rnd, task, seed, advised, probe, facts, classes in cells():
        r = replay(advised, probe, facts, classes)
        rows.append({"round": rnd, "task": task, "seed": seed, **r})
        print(f"{rnd} {task} seed {seed}: every draw {r['every draw']}, stops {r['stops']}{'' if r['same'] else '  DIFFERENT'}; "
              f"stage 1 {r['stage1']['stops']}/{r['stage1']['every draw']}, subspaces {r['subspaces']['stops']}/"
              f"{r['subspaces']['probe first, every draw']}/{r['subspaces']['every candidate']}", flush=True)
    total = {k: {w: int(np.sum([r[k][w] for r in rows])) for w in rows[0][k]} for k in ("stage1", "subspaces")} if rows else {}
    doc = {"command": "python -m benchmarks validity.heldout.stops", "cells": len(rows),
           "same_decision": sum(r["same"] for r in rows), "total": total, "rows": rows}
    a.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{doc['same_decision']} of {len(rows)} cells: the same decision; stage-1 trainings {total.get('stage1')}; "
          f"subspaces at 224 {total.get('subspaces')}; {a.json}")
    return doc


if __name__ == "__main__":
    main()
