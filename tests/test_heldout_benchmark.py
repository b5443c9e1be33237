"""The held-out benchmark (benchmarks/validity/heldout): every round a spec and its frozen results, one runner and one
scorer. Here: the specs against their frozen split files, every round re-scored from its committed results to the
published figures, and the scorer's and the runner's logic on a synthetic round (the benchmark's data lives in
benchmark-only packages, absent in CI; nothing here trains or ranks)."""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from validity.heldout import report as R
from validity.heldout import run as RUN
from validity.heldout import tuning as TUNING
from validity.heldout import score as S
from validity.heldout.results import Results, read_lines, run_key
from validity.heldout.spec import HERE, load, parse, rounds

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def scored(n: int) -> dict:
    return S.build(load(n))


def _split(n: int) -> dict:
    return json.loads(load(n).frozen_path.read_text())


def _added_at(path) -> int | None:
    """When the commit that added ``path`` was made (Unix time), or None outside a git checkout."""
    out = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%ct", "--diff-filter=A", "--", str(path)],
                         capture_output=True, text=True, check=False).stdout.split()
    return int(out[-1]) if out else None


# -- the specs ---------------------------------------------------------------------------------------------------


def test_every_round_has_a_spec_whose_tasks_are_its_frozen_split_s():
    assert rounds() == [1, 2, 3, 4, 5, 6, 7]
    for n in rounds():
        spec, split = load(n), _split(n)
        if "spec" in split and "tasks" not in split:  # written by ``freeze``: the spec itself, unchanged since
            assert json.loads(spec.path.read_text()) == split["spec"], n
            continue
        frozen = split["tasks"]
        assert spec.scored_tasks == list(split["held_out"]), n
        assert set(frozen) == set(spec.tasks) if n == 1 else set(frozen) == set(spec.scored_tasks), n
        for name, f in frozen.items():
            t = spec.tasks[name]
            assert (t.kind, t.realistic, t.train, list(t.candidates)) == (
                f["kind"], f["realistic"], f["private_train"], f["candidates"]), (n, name)
            assert all(f.get(k, v) == v for k, v in (("private_test", t.test), ("model", t.model),
                                                     ("transformed_source_candidate", t.source))), (n, name)


def test_round_one_s_split_follows_its_rule():
    """split.json: tasks ordered by a salted hash, the first four held out, the smallest salt meeting the constraints."""
    spec, doc = load(1), _split(1)
    tasks = spec.tasks

    def ok(held, sel):
        return (len({tasks[t].kind for t in held}) >= 3 and sum(tasks[t].realistic for t in held) >= 2
                and sum(tasks[t].realistic for t in sel) >= 1 and len({tasks[t].kind for t in sel}) >= 3)

    orders = [sorted(tasks, key=lambda t, s=s: hashlib.sha256(f"gsd-issue-42:{s}:{t}".encode()).hexdigest()) for s in range(doc["salt"] + 1)]
    assert ok(orders[-1][:4], orders[-1][4:]) and not any(ok(o[:4], o[4:]) for o in orders[:-1])
    assert set(orders[-1][:4]) == set(doc["held_out"]) and set(orders[-1][4:]) == set(doc["selection"])
    # rounds 1-6 tune on its selection tasks; round 7 on seen tasks of issue 61's pilot, per private size
    assert all(load(n).tuning["tasks"] == doc["selection"] for n in rounds() if not load(n).tuning.get("sizes"))
    assert [e["task"] for e in load(7).tuning["tasks"]] == ["mnist-m", "emoji"]


def test_the_later_rounds_are_new_realistic_held_out_tasks_with_what_they_pre_registered():
    seen: set[str] = set(load(1).tasks)
    for n in (2, 3, 4, 5):
        spec, split = load(n), _split(n)
        assert not set(spec.tasks) & seen and all(t.realistic and len(t.candidates) >= 6 for t in spec.tasks.values())
        assert len({t.kind for t in spec.tasks.values()}) == 4
        seen |= set(spec.tasks)
        if n >= 3:
            assert len(split["gsd_cli_commit"]) == 40 and "auto:probe-same" in split["exploratory_arm"] and "auto:probe-same" in spec.arms
    assert "auto:few25" in _split(5)["few_shot_arms"] and {"auto:few10", "auto:few25"} <= set(load(5).arms)


def test_round_7_s_spec_is_issue_62_s_protocol_frozen_before_its_runs():
    """Round 7 (issue 62): at 500 private examples at least 8 tasks of at least 4 kinds, every task from a new source
    with at least 6 candidates (one related from another source or more, three unrelated or more, one harmful);
    from a base, DP-SGD from scratch beside it; sizes 500 and 2,000; epsilon 2; 3 seeds or more; the frozen file has
    the spec, every set's hash and the base's, and it was committed before any result of the round."""
    spec, doc = load(7), _split(7)
    small = [t for t in spec.tasks.values() if t.size == 500]
    assert len(small) >= 8 and len({t.kind for t in small}) >= 4 and {t.size for t in spec.tasks.values()} == {500, 2000}
    for t in small:
        unrelated = set(t.candidates) - set(t.related) - set(t.harmful)
        assert len(t.candidates) >= 6 and t.related and t.harmful and len(unrelated) >= 3, t.name
        assert set(t.related) | set(t.harmful) <= set(t.candidates) and t.base in spec.bases
    assert spec.epsilon == 2.0 and len(spec.seeds) >= 3 and spec.no_candidate == ("dpsgd", "ft-base")
    assert not spec.from_base("dpsgd") and spec.from_base("ft-base") and spec.from_base("sp-base")
    assert doc["spec"] == json.loads(spec.path.read_text()) and set(doc["bases_sha256"]) == set(spec.bases)
    assert {x for t in spec.tasks.values() for x in (t.train.rsplit("~", 1)[0], t.test)} <= set(doc["data_sha256"])
    assert {c for t in spec.tasks.values() for c in t.candidates} <= set(doc["data_sha256"]) | set(doc["other_sha256"])

    frozen = _added_at(spec.frozen_path)
    if frozen is None:
        pytest.skip("not a git checkout")
    for later in (ROOT / "benchmarks/results/heldout7/tuning/runs.jsonl", ROOT / "benchmarks/results/heldout7/runs.jsonl"):
        added = _added_at(later)
        assert added is None or added >= frozen, later


def test_round_6_s_spec_is_its_protocol_and_the_protocol_was_frozen_before_its_runs():
    """split6.json (issue 52): 8 tasks of at least 4 kinds, 6 candidates each, at most a quarter with a transformed copy
    of the private source, committed before any round-6 result; the spec has its seeds, budget, grid and targets."""
    spec, doc = load(6), _split(6)
    tasks = doc["tasks"]
    assert len(tasks) >= 8 and len({t["kind"] for t in tasks.values()}) >= 4
    assert sum(t["transformed_source_candidate"] is not None for t in tasks.values()) <= len(tasks) / 4
    assert all(len(t["candidates"]) >= 6 and t["private_train"] not in t["candidates"] for t in tasks.values())
    assert (list(spec.seeds), spec.epsilon, spec.delta, spec.select_epsilon) == (doc["seeds"], doc["epsilon"], doc["delta"], doc["select_epsilon"])
    assert all(spec.tuning["grid"][m] == doc["tuning"]["grid"] for m in doc["tuning"]["methods"])
    thresholds = {t["name"]: t.get("at_least", t.get("above")) for t in spec.targets}
    T = doc["targets"]
    assert thresholds == {"auto:probe no-harm": T["auto:probe"]["no_harm_share"], "auto:probe task gain CI low": T["auto:probe"]["task_gain_ci_low_above"],
                          "auto:probe oracle share": T["auto:probe"]["oracle_share"], "auto:dp no-harm": T["auto:dp"]["no_harm_share"],
                          "auto:dp oracle share": T["auto:dp"]["oracle_share"], "auto:dp agreement": T["auto:dp"]["agreement_share"],
                          "probe pick vs random CI low": T["probe-pick"]["vs_random_ci_low_above"]}

    frozen = _added_at(spec.frozen_path)
    if frozen is None:
        pytest.skip("not a git checkout")
    for later in (ROOT / "benchmarks/results/heldout6/tuned6.json", ROOT / "benchmarks/results/heldout6/runs.jsonl"):
        added = _added_at(later)
        assert added is None or added >= frozen, later


def test_the_runner_s_settings_are_the_keys_of_every_committed_run(monkeypatch):
    """The runner would find every committed training of rounds 2-6 in its cache (the same settings, the same key)."""
    for n in (2, 3, 4, 5, 6):
        spec = load(n)
        res = Results(spec)
        runs = [r for r in res.runs.values() if r["task"] in spec.scored_tasks and res._tuned(r)]
        assert len(runs) >= 20 * len(spec.scored_tasks), n
        for r in runs:
            monkeypatch.setattr(RUN, "size", lambda name, r=r: r["settings"]["expected_size"])
            eps = r["settings"]["epsilon"]
            budget = () if eps == spec.epsilon else (eps, r["settings"]["delta"])
            s = RUN.settings(spec, spec.tasks[r["task"]], r["method"], res.tuned[r["method"]], *budget)
            assert run_key(r["task"], r["method"], r["public"], s, r["seed"]) == r["key"], (n, r["task"], r["method"])


def test_the_runner_s_tuning_finds_every_committed_tuning_run_and_chooses_the_committed_points(monkeypatch):
    """The tuning jobs of rounds 2-5 and 6 (each seed's plain-ranking winner as the candidate) are all recorded, and
    the tuning rule on them gives the tuned files the rounds ran with."""
    runs = {r["key"]: r for r in read_lines(ROOT / "benchmarks/results/heldout/runs.jsonl")}
    one = load(1)
    sizes = {one.tasks[r["task"]].train: r["settings"]["expected_size"] for r in runs.values() if r["task"] in one.tasks}
    monkeypatch.setattr(RUN, "size", sizes.__getitem__)
    monkeypatch.setattr(RUN, "compute_step", lambda *a: pytest.fail("the plain rankings are recorded"))
    for n, methods in ((5, 3), (6, 2)):
        spec = load(n)
        jobs = TUNING.tune_jobs(spec)
        assert len(jobs) == 3 * 4 * sum(len(g) for g in spec.tuning["grid"].values()) and len(spec.tuning["grid"]) == methods
        points = TUNING.best_points(spec, jobs, runs)
        assert points is not None and {m: d["chosen"] for m, d in points.items()} == Results(spec).tuned, n


def test_run_keys_change_with_every_setting_and_not_with_dict_order():
    a = run_key("mnist", "gep", "pub-mnist", {"lr": 1.0, "epochs": 3}, 0)
    assert a == run_key("mnist", "gep", "pub-mnist", {"epochs": 3, "lr": 1.0}, 0)
    assert len({a, run_key("mnist", "gep", "pub-mnist", {"lr": 2.0, "epochs": 3}, 0),
                run_key("mnist", "gep", "pub-mnist", {"lr": 1.0, "epochs": 3}, 1),
                run_key("mnist", "second-phase", "pub-mnist", {"lr": 1.0, "epochs": 3}, 0),
                run_key("mnist", "gep", "digits", {"lr": 1.0, "epochs": 3}, 0)}) == 5


# -- every round re-scored from its committed results -------------------------------------------------------------


def _pts(d: dict, dec: int = 1) -> str:
    return R._pts(d["mean"], dec, d["ci"])


def test_rounds_2_to_5_rescore_to_the_published_figures():
    """docs/validity.md's table of rounds 2-3 and 4-5 and the figures of rounds 2-5 pooled (and the native ranking's)."""
    f = scored(5)["figures"]
    for key, cells, by_choice, public, gain, median, share, oracle, big, probe, gsd in (
            ("held_out_23", (34, 40), 19, (15, 21), "+2.6 [+0.4, +5.5]", 0.8, "58% [23%, 76%]", 4.5, (6.4, 3), "-0.51 [-0.79, -0.22]", "-0.16 [-0.49, +0.17]"),
            ("held_out_45", (40, 40), 15, (25, 25), "+10.9 [+2.1, +22.3]", 3.6, "82% [24%, 109%]", 13.4, (12.5, 7), "-0.73 [-0.93, -0.50]", "-0.39 [-0.63, -0.10]")):
        a = f[key]["auto:probe"]
        assert (a["no_harm"], a["cells"], a["chose_no_candidate"], a["used_public_ok"], a["used_public"]) == (*cells, by_choice, *public), key
        assert _pts(a["task_gain"]) == gain and round(a["task_gain"]["median"], 1) == median and R._share(a["oracle_share"]) == share
        assert round(a["oracle_share"]["oracle_mean_gain"], 1) == oracle
        assert (round(a["where_oracle_gains_3"]["mean"], 1), len(a["where_oracle_gains_3"]["tasks"])) == big
        assert _pts(f[key]["spearman_probe"], 2) == probe and _pts(f[key]["spearman"], 2) == gsd
    a = f["held_out_23"]["auto:probe"]["task_gain"]
    assert a["top_two"] == ["fashion-m", "glyphs"] and round(100 * a["top_two_share"]) == 83
    p, nat = f["held_out_2345"]["auto:probe"], f["held_out_2345"]["auto:probe-native"]
    assert (p["no_harm"], p["chose_no_candidate"], p["used_public_ok"], p["used_public"]) == (74, 34, 40, 46)
    assert _pts(p["task_gain"]) == "+6.8 [+1.9, +13.1]" and round(p["task_gain"]["median"], 1) == 1.6
    assert round(100 * p["task_gain"]["top_two_share"]) == 65 and round(p["where_oracle_gains_3"]["without_top_two"]["mean"], 1) == 4.5
    b = p["by_source"]
    assert (len(b["source_tasks"]), round(100 * b["source_share"]), round(b["source_mean"], 1), round(b["other_mean"], 1)) == (9, 84, 10.1, 2.5)
    assert f["held_out_2345"]["oracle"]["no_harm"] == 70 and f["held_out_2345"]["agreement"]["auto:probe-native~auto:probe"]["cells"] == 73
    assert (nat["no_harm"], _pts(nat["task_gain"]), R._share(nat["oracle_share"]), R._share(p["oracle_share"])) == (
        75, "+6.1 [+1.4, +12.2]", "68% [26%, 98%]", "76% [37%, 99%]")
    assert round(p["oracle_share"]["oracle_mean_gain"], 1) == 8.9 and len(p["where_oracle_gains_3"]["tasks"]) == 10
    assert (round(p["where_oracle_gains_3"]["mean"], 1), round(nat["where_oracle_gains_3"]["mean"], 1)) == (10.7, 9.5)
    assert scored(3)["verdicts"] == {"auto:probe no-harm": [0.85, 0.9, False], "auto:probe gain where the oracle gains 3": [
        pytest.approx(6.41296, abs=1e-5), 2.0, True], "probe order (mean Spearman)": [pytest.approx(-0.50714, abs=1e-5), -0.6, False]}


def test_round_6_rescores_to_the_published_figures_and_splits_the_dp_advice_s_loss():
    doc = scored(6)
    f = doc["figures"]["round6"]
    p, d = f["auto:probe"], f["auto:dp"]
    assert (p["no_harm"], p["cells"], p["chose_no_candidate"], p["used_public_ok"], p["used_public"]) == (40, 40, 35, 5, 5)
    assert (_pts(p["task_gain"], 2), p["task_gain"]["median"], R._share(p["oracle_share"])) == ("+0.56 [+0.00, +1.51]", 0.0, "31% [0%, 61%]")
    assert (d["no_harm"], d["chose_no_candidate"], d["used_public_ok"], d["used_public"]) == (14, 21, 8, 19)
    assert (_pts(d["task_gain"], 2), R._share(d["oracle_share"])) == ("-1.76 [-2.96, -0.59]", "-96% [-215%, -28%]")
    assert _pts(f["oracle"]["task_gain"], 2) == "+1.84 [+0.96, +2.89]" and _pts(f["pick_vs_random"], 2) == "+1.05 [-0.06, +2.34]"
    assert f["agreement"]["auto:dp~auto:probe"] == {"cells": 20, "of": 40, "share": 0.5}
    assert [k for k, v in doc["verdicts"].items() if v[2]] == ["auto:probe no-harm"]
    oracle = {t: (round(s["mean"]["reference"], 1), round(s["mean"]["auto:probe"], 1), round(s["mean"]["auto:dp"], 1),
                  round(s["mean"]["oracle"], 1), s["oracle_choice"]) for t, s in doc["tasks"].items()}
    assert oracle["planets-grey"] == (51.4, 55.2, 50.5, 55.8, "second-phase:pub-planets") and oracle["planets"][3:] == (66.7, "dpsgd")
    # issue 62's recomputation: the loss = the budget's part (1.5 against 2) + the choice's part (against DP-SGD at 2)
    split = {k: (v["cells"], round(v["total"], 2), round(v["budget"], 2), round(v["choice"], 2)) for k, v in d["budget_split"].items()}
    assert split == {"all": (40, -1.76, -2.26, 0.5), "chose_no_candidate": (21, -1.96, -1.96, 0.0), "used_public": (19, -1.54, -2.6, 1.05)}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_rounds_1_to_5_rescore_to_every_figure_their_old_scorer_committed(n):
    """Every set's figures of the earlier scorer's last output (benchmarks/results/heldout_scores.json), per arm."""
    old = json.loads((ROOT / "benchmarks/results/heldout_scores.json").read_text())["figures"]
    for key, f in scored(n)["figures"].items():
        o = old[key]
        assert f["spearman"]["mean"] == pytest.approx(o["spearman"]["mean"]) and f["spearman"]["ci"] == pytest.approx(o["spearman"]["ci_tasks"])
        assert f["oracle"]["no_harm"] == o["oracle_cells"]["seed_cells_ok"]
        arms = [a for a in o if a.startswith("auto:")]
        assert arms and all(a in f for a in arms), key
        for a in arms:
            x, y = f[a], o[a]
            assert (x["no_harm"], x["cells"]) == (y["seed_cells_ok"], y["seed_cells"]), (key, a)
            for k in ("mean", "ci", "median", "top_two_share"):
                assert x["task_gain"][k] == pytest.approx(y["task_gain"][k]), (key, a, k)
            assert x["oracle_share"]["ci"] == pytest.approx(y["oracle_share"]["ci"]) and x["by_source"]["source_mean"] == pytest.approx(y["by_source"]["source_mean"])


@pytest.mark.parametrize("n, note", [(5, "heldout.json"), (6, "heldout6.json"), (7, "heldout7.json")])
def test_the_shipped_validity_notes_are_the_rescored_figures_and_quote_only_printed_ones(n, note):
    """gsd_cli/report/heldout*.json is what ``score --update-package`` writes from the re-scored round, and every
    figure gsd rank's note quotes is in the round's markdown."""
    import re

    from gsd_cli.report.validity import heldout_sentence, round6_sentence, round7_sentence

    spec, doc = load(n), scored(n)
    shipped = json.loads((ROOT / "gsd_cli/report" / note).read_text())
    made = json.loads(json.dumps(R.package_note(spec, doc)))
    assert spec.package_note["file"] == note and set(made) == set(shipped)
    for k in set(shipped) - {"scored_with", "source"}:
        assert made[k] == pytest.approx(shipped[k]) if not isinstance(shipped[k], dict) else _approx(made[k], shipped[k]), k
    md = R.markdown(spec, doc)
    sentence = {5: heldout_sentence, 6: round6_sentence, 7: round7_sentence}[n](shipped)
    quoted = re.findall(r"[+-]\d+\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\]|-?\d+% \[-?\d+%, -?\d+%\]|\d+ of \d+ cells", sentence)
    assert len(quoted) >= 4
    for q in quoted:
        assert q in md, q


def _approx(a, b) -> bool:
    if isinstance(b, dict):
        return set(a) == set(b) and all(_approx(a[k], b[k]) for k in b)
    if isinstance(b, list):
        return len(a) == len(b) and all(_approx(x, y) for x, y in zip(a, b))
    return a == pytest.approx(b) if isinstance(b, float) else a == b


# -- the scorer and the runner on a synthetic round ---------------------------------------------------------------

#: accuracy (points) per (task, option, seed): task a gains on p in-sample, but p and q trade places across seeds
ACC = {"a": {"dpsgd": [50, 50, 50], "second-phase:p": [60, 62, 44], "second-phase:q": [52, 40, 58]},
       "b": {"dpsgd": [70, 70, 70], "second-phase:p": [60, 60, 60], "second-phase:q": [71, 69, 70.2]}}
#: the DP arm's decisions (method, public) per task and seed, trained at epsilon 1.5, and what they reached
DP = {"a": [("second-phase", "p", 57), ("dpsgd", None, 47), ("second-phase", "q", 55)], "b": [("dpsgd", None, 68)] * 3}


def synthetic(tmp_path: Path, targets=()) -> tuple:
    res = tmp_path / "res"
    spec = parse({"round": 99, "label": "round 99 (synthetic)", "frozen": str(tmp_path / "frozen.json"), "data": "none",
                  "results": str(res), "out": str(tmp_path / "scores"), "seeds": [0, 1, 2], "epsilon": 2.0, "delta": 1e-5,
                  "select_epsilon": 0.5, "base": {"epochs": 3}, "methods": {"dpsgd": {}, "second-phase": {}},
                  "no_candidate": ["dpsgd"], "candidate_methods": ["second-phase"],
                  "tuning": {"round": 99, "tasks": [], "seeds": [], "grid": {}, "runs": str(res), "out": str(res / "tuned.json")},
                  "rank": {}, "steps": ["advised", "probe", "dp"], "gsd_ranking": "advised", "arms": {"auto:dp": {"decider": "dp", "what": "x"}},
                  "validated": "second-phase", "probe_pick": "second-phase", "sets": {"all": {"rounds": [99], "label": "both tasks"}},
                  "bootstrap": {"draws": 300, "key": "t:{set}:{figure}"}, "targets": list(targets),
                  "tasks": {t: {"kind": "k", "train": f"{t}-train", "test": f"{t}-test", "model": "m", "candidates": ["p", "q"],
                                "source": "p" if t == "a" else None} for t in ACC}})
    res.mkdir()
    (res / "tuned.json").write_text(json.dumps({"methods": {m: {"chosen": {"lr": 1.0}} for m in spec.methods}}))
    return spec, res


def fake_steps(spec, task, seed, name):
    gains = {"a": {"p": [0.1], "q": [0.0]}, "b": {"p": [0.0], "q": [0.05]}}[task.name]
    dist = {"a": {"p": 0.3, "q": 0.5}, "b": {"p": 0.2, "q": 0.6}}[task.name]
    m, p, _ = DP[task.name][seed]
    refused = {"p": {"second_phase": "p has 50 examples, fewer than 100 per private class (200)"}} if task.name == "a" else {}
    return {"advised": {"ranking": {"results": [{"public": c, "distance": d} for c, d in dist.items()]},
                        "decision": {"evidence": refused}},
            "probe": {"gains": gains},
            "dp": {"decision": {"method": m, "public": p}, "training": {"epsilon": 1.5, "delta": 9e-6}}}[name]


def fake_fit(task, method, public, seed, s):
    if s["epsilon"] == 1.5:
        assert (method, public) == DP[task.name][seed][:2]
        return DP[task.name][seed][2] / 100, 1.5
    return ACC[task.name][method if public is None else f"{method}:{public}"][seed] / 100, 2.0


def run_synthetic(monkeypatch, spec, fit=fake_fit, steps=fake_steps):
    """What ``run`` does, every cell, on the synthetic round with gsd's training and steps faked."""
    monkeypatch.setattr(RUN, "fit", fit)
    monkeypatch.setattr(RUN, "compute_step", steps)
    monkeypatch.setattr(RUN, "size", lambda name: 100)
    res = Results(spec)
    runs = {r["key"]: r for r in read_lines(res.runs_file)}
    for seed in spec.seeds:
        for t in spec.tasks.values():
            RUN.run_cell(spec, res, runs, t, seed)
    return res


def test_the_runner_records_each_cell_once_and_resumes_keyed_by_task_arm_and_seed(tmp_path, monkeypatch):
    spec, res_dir = synthetic(tmp_path)
    assert S.status(spec)[0].startswith("round 99 (synthetic): 0 of 6 cells complete")
    run_synthetic(monkeypatch, spec)
    lines = (res_dir / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 6 + 6  # every option of every cell, and each DP decision's training at its share, 1.5
    decisions = [json.loads(x) for x in (res_dir / "decisions.jsonl").read_text().splitlines()]
    assert sorted((d["task"], d["seed"]) for d in decisions) == [(t, s) for t in "ab" for s in range(3)]
    assert all(d["arm"] == "auto:dp" and d["epsilon"] == 1.5 for d in decisions)
    assert len(list((res_dir / "rankings").glob("*.json"))) == 2 * 3 * 3
    run_synthetic(monkeypatch, spec, lambda *a: pytest.fail("trained again"), lambda *a: pytest.fail("a step again"))
    assert len((res_dir / "runs.jsonl").read_text().splitlines()) == len(lines)
    assert S.status(spec)[0].startswith("round 99 (synthetic): 6 of 6 cells complete")


def test_the_scorer_s_oracles_no_harm_budget_split_orders_and_targets(tmp_path, monkeypatch):
    targets = [{"name": "dp no-harm", "figure": "auto:dp.no_harm_share", "at_least": 0.3},
               {"name": "loso pays", "figure": "oracle-loso.tasks_gaining_3_share", "at_least": 0.5}]
    spec, _ = synthetic(tmp_path, targets)
    run_synthetic(monkeypatch, spec)
    doc = S.build(spec)
    a = doc["tasks"]["a"]
    # in-sample: p (mean 55.3); left out seed 0: p (53 on seeds 1-2), seed 1: q (55), seed 2: p (61)
    assert a["oracle_choice"] == "second-phase:p" and a["loso_choices"] == ["second-phase:p", "second-phase:q", "second-phase:p"]
    assert a["gain"]["oracle"] == pytest.approx(16 / 3) and a["gain"]["oracle-loso"] == pytest.approx((10 - 10 - 6) / 3)
    assert a["cells"][0]["probe_pick"] == "p" and doc["tasks"]["b"]["cells"][0]["probe_pick"] == "q"
    # a's probe pick p was kept out of the second phase by the advice's rule on every seed; b's q was not
    assert doc["figures"]["all"]["pick_refused"] == {"cells": 3, "of": 6, "reasons": ["p has 50 examples, fewer than 100 per private class (200)"]}
    assert "kept out of the second phase by the advice's eligibility rule in 3 of 6 cells" in R.markdown(spec, doc)
    f = doc["figures"]["all"]
    dp = f["auto:dp"]
    assert (dp["no_harm"], dp["cells"], dp["chose_no_candidate"], dp["used_public"], dp["used_public_ok"]) == (2, 6, 4, 2, 2)
    assert dp["task_gain"]["mean"] == pytest.approx((3 - 2) / 2) and dp["task_gain"]["ci"][0] <= 0.5 <= dp["task_gain"]["ci"][1]
    assert dp["oracle_share"]["mean"] == pytest.approx(0.5 / ((16 / 3 + (70.2 - 70 + 69 - 70 + 71 - 70) / 3) / 2))
    s = dp["budget_split"]
    assert s["used_public"] == {"cells": 2, "total": pytest.approx(6.0), "budget": pytest.approx(-3.0), "choice": pytest.approx(9.0)}
    assert s["chose_no_candidate"] == {"cells": 4, "total": pytest.approx(-9 / 4), "budget": pytest.approx(-9 / 4), "choice": 0.0}
    assert f["spearman"]["by_task"] == {"a": pytest.approx(-1.0), "b": pytest.approx(1.0)} and f["spearman"]["mean"] == pytest.approx(0.0)
    assert f["oracle"]["tasks_gaining_3"] == 1 and f["oracle-loso"]["tasks_gaining_3"] == 0
    assert dp["by_source"]["source_tasks"] == ["a"] and dp["by_source"]["source_mean"] == pytest.approx(3.0)
    assert doc["verdicts"] == {"dp no-harm": [pytest.approx(1 / 3), 0.3, True], "loso pays": [0.0, 0.5, False]}
    text = R.write(spec, doc)
    assert "2 of 6 cells" in text and (tmp_path / "scores.md").read_text() == text and json.loads((tmp_path / "scores.json").read_text())["round"] == 99
    again = S.build(spec)["figures"]["all"]["auto:dp"]  # each interval's generator is keyed by its name: the same again
    assert again["task_gain"]["ci"] == dp["task_gain"]["ci"] and again["oracle_share"]["ci"] == dp["oracle_share"]["ci"]


def test_an_incomplete_round_is_refused_unless_partial_and_a_spec_field_must_be_known(tmp_path, monkeypatch):
    spec, res_dir = synthetic(tmp_path)
    run_synthetic(monkeypatch, spec)
    lines = (res_dir / "decisions.jsonl").read_text().splitlines()
    (res_dir / "decisions.jsonl").write_text("\n".join(lines[1:]) + "\n")  # the first cell's decision is missing
    with pytest.raises(SystemExit, match="incomplete: a seed 0: auto:dp \\(decision\\)"):
        S.build(spec)
    assert S.build(spec, partial=True)["tasks"]["a"]["seeds"] == [1, 2]
    with pytest.raises(SystemExit, match="unknown spec fields \\['colour'\\]"):
        parse({**json.loads((HERE / "rounds/round6.json").read_text()), "colour": 1})


def test_bootstrap_intervals_cover_the_mean_are_a_point_for_constants_and_keyed_by_name():
    rng = np.random.default_rng(0)
    lo, hi = S.task_boot([1.0, 2.0, 3.0, 4.0, 5.0], rng)
    assert 1.0 <= lo < 3.0 < hi <= 5.0 and S.task_boot([2.0, 2.0, 2.0], rng) == [2.0, 2.0] and S.task_boot([7.0], rng) is None
    spec = load(6)
    a = S.rng_for(spec, "round6", "auto:probe:oracle_share").integers(0, 1 << 30, 4)
    assert (a == np.random.default_rng(int(hashlib.sha256(b"round6:auto:probe:share").hexdigest()[:16], 16)).integers(0, 1 << 30, 4)).all()
    b = S.rng_for(load(3), "held_out_23", "auto:probe:gain").integers(0, 1 << 30, 4)
    assert (b == np.random.default_rng(int(hashlib.sha256(b"gsd-heldout:held_out_23:auto:probe:gain").hexdigest()[:16], 16)).integers(0, 1 << 30, 4)).all()


def test_spearman_of_a_reversed_order_is_minus_one_and_undefined_for_ties():
    assert S.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert S.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486832980505138)  # ties share their mean rank
    assert np.isnan(S.spearman([1, 1, 1], [1, 2, 3]))


# -- the repeat rule replayed on the recorded draws (validity.heldout.stops) ---------------------------------------


def test_the_stops_replay_keeps_the_decision_and_counts_the_work():
    """``python -m benchmarks validity.heldout.stops`` on one synthetic cell: B helps but is farther than noise in its first draw
    (stopped: one draw), C loses in the probe's first draw (one stage 1), A helps and is closer: chosen either way."""
    from gsd_cli.advice.decide import Candidate
    from validity.heldout.stops import replay

    refs = {"reference:noise@28": [0.80, 0.79, 0.81], "reference:noise@7": [0.74, 0.73, 0.75]}
    draws = {"A": [0.40, 0.41, 0.39], "B": [0.90, 0.70, 0.70], "C": [0.50, 0.52, 0.51], **refs}
    runs = [{"repeat": r, "seed": r, "distances": {n: v[r] for n, v in draws.items()}} for r in range(3)]
    row = lambda n: {"public": n, "distance": float(np.mean(draws[n])), "distances": draws[n]}  # noqa: E731
    advised = {"ranking": {"results": [row(n) for n in "ABC"], "runs": runs}, "references": [row(n) for n in refs]}
    probe = {"baseline": [0.5, 0.5, 0.5], "gains": {"A": [0.10, 0.11, 0.12], "B": [0.30, 0.31, 0.32], "C": [-0.01, 0.2, 0.2]},
             "examples": 100, "model": "m", "stage1": {}}
    facts = {n: Candidate(n, 5000, 10) for n in "ABC"}
    r = replay(advised, probe, facts, 10)
    assert r["same"] and r["stops"] == ["second-phase", "A"]
    assert r["stopped"] == {"probe": {"C": 1}, "ranking": {"B": 1}}
    assert r["stage1"] == {"stops": 7, "every draw": 9}
    # B: one draw of the private side, the two references and B; then A: all three draws
    assert r["subspaces"] == {"stops": 3 * 3 + 1 + 3, "probe first, every draw": 3 * 3 + 3 * 2, "every candidate": 6 * 3}


def test_the_stops_replay_makes_the_real_gates_decision_on_the_same_draws(monkeypatch):
    """The replay re-states ``advised_selection(gate="helping")``'s loop on cached numbers; here both run on the same
    scripted draws (the real gate with its ranking and stage 1 faked, the probe's stop rule real) and must agree on
    the decision and on what each stopped."""
    import gsd_cli.advice.probe as probe_mod
    import gsd_cli.advice.select as select
    from gsd_cli.data import resolve
    from gsd_cli.data.reference import is_reference
    from gsd_cli.ranking.repeats import repeat_seed
    from gsd_cli.train import TrainConfig
    from gsd_cli.advice.decide import describe
    from test_advice import FakeRanking
    from validity.heldout.stops import replay

    rows = {"mnist-b": [0.90, 0.70, 0.70], "digits": [0.40, 0.41, 0.39], "noise": [0.50, 0.52, 0.51]}
    gains = {"mnist-b": [0.30, 0.31, 0.32], "digits": [0.10, 0.11, 0.12], "noise": [-0.05, 0.2, 0.2]}
    refs: dict = {}

    def fake_rank(private, publics, memo=None, **options):
        names = [getattr(p, "name", str(p)) for p in publics]
        for n in names:
            if is_reference(n):
                refs.setdefault(n, [0.80 - 0.01 * len(refs), 0.79, 0.81])
        draws = {n: refs[n] if is_reference(n) else rows[n] for n in names}
        if options.get("repeats") == 1:
            r = [repeat_seed(0, i) for i in range(3)].index(options["seed"])
            draws = {n: [v[r]] for n, v in draws.items()}
        return FakeRanking(draws)

    def fake_stage1(model, names, settings, *a, **k):
        model._gain = gains[settings.public][settings.seed]
        return {"head": "shared", "public_examples": 100, "lr": 0.1}

    def fake_features(model, x, chunk=256):
        fake_accuracy.gain = getattr(model, "_gain", 0.0)
        return x.flatten(1)[:, :4]

    def fake_accuracy(feats, labels, num_classes, s):
        return 0.5 + fake_accuracy.gain

    monkeypatch.setattr(select, "rank", fake_rank)
    monkeypatch.setattr("gsd_cli.train.second_phase.run_second_phase", fake_stage1)
    monkeypatch.setattr(probe_mod, "head_features", fake_features)
    monkeypatch.setattr(probe_mod, "linear_probe_accuracy", fake_accuracy)
    cfg = TrainConfig(private="mnist-a", method="auto", model="fmnist-cnn")
    ranking, decision = select.advised_selection("mnist-a", list(rows), "auto", gate="helping", train_settings=cfg,
                                                 model="fmnist-cnn", examples=50, device="cpu")
    cached = {"ranking": {"results": [{"public": n, "distance": float(np.mean(v))} for n, v in rows.items()],
                          "runs": [{"repeat": r, "distances": {**{n: v[r] for n, v in rows.items()}, **{n: v[r] for n, v in refs.items()}}}
                                   for r in range(3)]},
              "references": [{"public": n, "distance": float(np.mean(v))} for n, v in refs.items()]}
    probe = {"baseline": [0.5, 0.5, 0.5], "gains": gains, "examples": 50, "model": "fmnist-cnn", "stage1": {}}
    r = replay(cached, probe, {n: describe(resolve(n)) for n in rows}, 10)
    assert r["stops"] == [decision.method, decision.public] == ["second-phase", "digits"]
    assert r["stopped"]["ranking"] == {n: s["draws"] for n, s in ranking.stopped.items()} == {"mnist-b": 1}
    assert r["stopped"]["probe"] == decision.evidence["probe"]["stopped"] == {"noise": 1}


# -- a round run from a base at several private sizes (round 7's regime), on synthetic data -------------------------


def sized(tmp_path: Path, targets=()) -> tuple:
    """Two tasks at private sizes 40 and 400, a base, DP-SGD from scratch and from the base as no-candidate methods,
    the second phase from the base with each candidate, and a DP advice made to select (tuned per size)."""
    res = tmp_path / "res"
    spec = parse({"round": 98, "label": "round 98 (synthetic, sized)", "frozen": str(tmp_path / "frozen.json"), "data": "none",
                  "results": str(res), "out": str(tmp_path / "scores"), "seeds": [0, 1, 2], "epsilon": 2.0, "delta": 1e-5,
                  "sizes": [40, 400], "base": {"clip": 1.0}, "bases": {"B": {"model": "m", "public": ["z"], "epochs": 1}},
                  "methods": {"dpsgd": {}, "ft-base": {"method": "dpsgd", "from_base": True},
                              "sp-base": {"method": "second-phase", "from_base": True}},
                  "no_candidate": ["dpsgd", "ft-base"], "candidate_methods": ["sp-base"],
                  "tuning": {"round": 98, "tasks": [], "seeds": [], "grid": {}, "runs": str(res), "out": str(res / "tuned.json")},
                  "rank": {}, "steps": ["dp-select"], "dp": {"dp-select": {"select_epsilon": 0.5, "fallback": False}},
                  "gsd_ranking": "advised", "arms": {"auto:dp-select": {"decider": "dp", "step": "dp-select", "what": "x"}},
                  "validated": "sp-base", "probe_pick": "sp-base",
                  "sets": {"small": {"rounds": [98], "sizes": [40], "label": "40"}, "large": {"rounds": [98], "sizes": [400], "label": "400"}},
                  "bootstrap": {"draws": 300, "key": "t:{set}:{figure}"}, "targets": list(targets),
                  "tasks": {t: {"kind": "k", "train": f"{t}-train", "test": f"{t}-test", "model": "m", "candidates": ["p", "q"],
                                "base": "B", "related": ["p"], **({"sizes": [40]} if t == "b" else {})} for t in "ab"}})
    res.mkdir()
    (res / "tuned.json").write_text(json.dumps({"sizes": {str(n): {"methods": {m: {"chosen": {"lr": 0.5, "epochs": e}} for m in spec.methods}}
                                                          for n, e in ((40, 6), (400, 24))}}))
    return spec, res


#: per task (size): each option's accuracy (points) on seeds 0-2, at epsilon 2
SIZED = {"a@40": {"dpsgd": 30, "ft-base": 40, "sp-base:p": 50, "sp-base:q": 35},
         "a@400": {"dpsgd": 60, "ft-base": 62, "sp-base:p": 63, "sp-base:q": 55},
         "b@40": {"dpsgd": 20, "ft-base": 21, "sp-base:p": 10, "sp-base:q": 22}}


def sized_steps(spec, task, seed, name):
    m, p = ("second-phase", "p") if task.name == "a@40" else ("dpsgd", None)
    return {"training": {"method": m, "public": p, "from_base": True, "epsilon": 1.5, "delta": 9e-6}}


def sized_fit(task, method, public, seed, s):
    assert s["expected_size"] == 100 and s["epochs"] == {40: 6, 400: 24}[task.size]  # the tuned point of its size
    assert s["batch_size"] == task.size // 4 and s["lr_scale"] == pytest.approx(task.size / 4 / 500)
    assert s.get("from_base") == (None if method == "dpsgd" else "B") and s.get("train_method") == {
        "dpsgd": None, "ft-base": "dpsgd", "sp-base": "second-phase"}[method]
    acc = SIZED[task.name][label_of(method, public)] - (3 if s["epsilon"] == 1.5 else 0)
    return acc / 100, s["epsilon"]


def label_of(method, public):
    return method if public is None else f"{method}:{public}"


def test_a_sized_from_base_round_runs_each_size_as_a_task_at_its_tuned_point_with_the_dp_advice_s_share(tmp_path, monkeypatch):
    spec, res_dir = sized(tmp_path)
    assert list(spec.tasks) == ["a@40", "a@400", "b@40"] and spec.tasks["a@400"].train == "a-train~400"
    assert spec.tasks["b@40"].group == "b" and spec.method_of("dpsgd", True) == "ft-base" and spec.method_of("dpsgd", False) == "dpsgd"
    run_synthetic(monkeypatch, spec, sized_fit, sized_steps)
    runs = [json.loads(x) for x in (res_dir / "runs.jsonl").read_text().splitlines()]
    # 4 options a cell; at the share: the decision's training and both no-candidate methods (ft-base is the decision
    # where the advice chose no candidate: trained once)
    assert len(runs) == 9 * 4 + 3 * 3 + 6 * 2
    decisions = {(d["task"], d["seed"]): (d["method"], d["public"]) for d in read_lines(res_dir / "decisions.jsonl")}
    assert decisions[("a@40", 0)] == ("sp-base", "p") and decisions[("b@40", 2)] == ("ft-base", None)
    targets = [{"name": "pays", "figure": "oracle-loso.tasks_gaining_3_share", "at_least": 0.5, "set": "large"},
               {"name": "share", "figure": "auto:dp-select.oracle_share.mean", "at_least": 0.5, "set": "large", "requires": "pays"},
               {"name": "pays small", "figure": "oracle-loso.tasks_gaining_3_share", "at_least": 0.5, "set": "small"}]
    doc = S.build(replace(spec, targets=tuple(targets)))
    assert doc["figures"]["small"]["tasks"] == ["a@40", "b@40"] and doc["figures"]["large"]["tasks"] == ["a@400"]
    assert doc["tasks"]["a@40"]["reference"] == "ft-base" and doc["tasks"]["a@40"]["gain"]["oracle"] == pytest.approx(10)
    assert doc["verdicts"]["pays"] == [0.0, 0.5, False] and doc["verdicts"]["share"][2] is None  # not scored: gate missed
    assert doc["verdicts"]["pays small"] == [0.5, 0.5, True]
    split = doc["figures"]["small"]["auto:dp-select"]["budget_split"]
    # a@40 chose p (47 at 1.5) against ft-base at 1.5 (37): +10; b@40 chose ft-base: 0 against itself at the share
    assert split["used_public"]["vs_reference_at_share"] == pytest.approx(10.0)
    assert split["chose_no_candidate"]["vs_reference_at_share"] == pytest.approx(0.0)
    assert "not scored (gate missed)" in R.markdown(spec, doc)
    rel = doc["figures"]["small"]["related"]  # p: +10 on a@40, -11 on b@40; the worst candidate: q, then p
    assert (rel["mean"], rel["tasks"], rel["gaining_3"]) == (pytest.approx(-0.5), 2, 1)
    assert doc["figures"]["small"]["worst_candidate"]["by_task"] == {"a@40": "q", "b@40": "p"}


def test_a_seeded_subset_depends_on_the_set_s_length_only_and_nests():
    from validity.heldout.spec import subset_indices

    small, large = subset_indices(5000, 500), subset_indices(5000, 2000)
    assert len(set(small)) == 500 and set(small) <= set(large) and small == sorted(small)
    assert small == sorted(int(i) for i in np.random.default_rng(0).permutation(5000)[:500])
    with pytest.raises(SystemExit, match="a subset of 600 examples of a set of 500"):
        subset_indices(500, 600)


def test_the_sized_tuning_grows_its_grid_at_an_edge_and_says_when_it_stays_on_one(tmp_path, monkeypatch):
    """The best rate lies below the grid: it grows down twice (0.125 -> 0.0625 -> 0.03125) and stays on the edge
    (said); the best epochs (12) are inside from the start."""
    import math

    res = tmp_path / "res"
    doc = json.loads((HERE / "rounds/round7.json").read_text())
    doc["tuning"] = {**doc["tuning"], "runs": str(res), "out": str(res / "tuned.json"), "sizes": [500], "seeds": [0],
                     "tasks": doc["tuning"]["tasks"][1:], "grid": {"dpsgd": {"lr": [0.125, 0.25], "epochs": [6, 12, 24]}}}
    spec = parse(doc)
    monkeypatch.setattr(RUN, "size", lambda name: 500)
    seen = []

    def fit(task, method, public, seed, s):
        seen.append((s["lr"], s["epochs"]))
        return 0.5 - 0.01 * abs(math.log2(s["lr"]) + 8) - 0.01 * abs(s["epochs"] - 12) / 6, 2.0

    monkeypatch.setattr(RUN, "fit", fit)
    out = TUNING.tune_sized(spec, res / "runs.jsonl", (1, 1))
    assert out == {"500": {"dpsgd": {"lr": 0.03125, "epochs": 12}}}
    tuned = json.loads((res / "tuned.json").read_text())["sizes"]["500"]["methods"]["dpsgd"]
    assert tuned["edge"] is True and [g["best"]["lr"] for g in tuned["grown"]] == [0.125, 0.0625]
    assert len(seen) == len(set(seen)) == 4 * 3  # each point once: 2 rates, then one more, then one more, x 3 epochs
    assert TUNING.grown({"lr": [0.5, 1.0], "epochs": [24, 48]}, {"lr": 0.5, "epochs": 48},
                     {"factor": 2, "epochs_max": 48, "epochs_min": 3}) == {"lr": [0.25, 0.5, 1.0], "epochs": [24, 48]}


def test_a_sized_round_s_package_note_says_size_by_size_whether_public_data_paid(tmp_path, monkeypatch):
    from gsd_cli.report import validity as V

    spec, _ = sized(tmp_path)
    spec = replace(spec, package_note={"file": "heldout7.json", "kind": "by_size", "dp": "auto:dp-select"},
                   targets=({"name": "pays", "figure": "oracle-loso.tasks_gaining_3_share", "at_least": 0.5, "set": "small"},
                            {"name": "pays large", "figure": "oracle-loso.tasks_gaining_3_share", "at_least": 0.5, "set": "large"}))
    run_synthetic(monkeypatch, spec, sized_fit, sized_steps)
    note = json.loads(json.dumps(R.package_note(spec, S.build(spec))))
    small = note["sets"]["small"]
    assert small["sizes"] == [40] and small["oracle_loso"]["gaining_3"] == 1 and small["oracle_loso"]["of"] == 2
    assert small["dp"]["cells"] == 6 and "non_private" not in small and note["missed"] == ["pays large"] and note["not_scored"] == []
    assert (small["pays"], note["sets"]["large"]["pays"]) == (True, False)
    text = V.round7_sentence(note)
    assert "at 40 private examples (2 tasks) public data paid: the oracle chosen on other seeds gained 3 points or more on 1 of 2" in text
    assert "at 400 private examples (1 tasks) public data did not pay" in text and "(DP, the same total) within 0.5 points in" in text
    monkeypatch.setattr(V, "heldout7", lambda: note)
    assert V.validity_line().startswith("validity (round 98") and "Round 6 (from scratch, no task with a related public set from another source: " in V.validity_line()


def test_a_base_that_is_not_the_frozen_one_is_used_only_as_a_recorded_deviation(tmp_path, capsys):
    """ready's base check: the frozen weights pass; other weights stop the run unless the round's deviations file
    records their hash (a base rebuilt from the frozen recipe), and then it is said."""
    import hashlib

    w = tmp_path / "B" / "weights.safetensors"
    with pytest.raises(SystemExit, match="missing"):
        RUN.check_base(w, "0" * 64, None, 7)
    w.parent.mkdir()
    w.write_bytes(b"frozen")
    frozen = hashlib.sha256(b"frozen").hexdigest()
    assert RUN.check_base(w, frozen, None, 7) == frozen
    w.write_bytes(b"rebuilt")
    rebuilt = hashlib.sha256(b"rebuilt").hexdigest()
    with pytest.raises(SystemExit, match="deviations file"):
        RUN.check_base(w, frozen, None, 7)
    with pytest.raises(SystemExit, match="not the base round 7 froze"):
        RUN.check_base(w, frozen, {"sha256": frozen, "reason": "x"}, 7)
    assert RUN.check_base(w, frozen, {"sha256": rebuilt, "reason": "lost cache"}, 7) == rebuilt
    assert "the rebuilt base" in capsys.readouterr().err


def test_round_7_s_deviations_name_the_rebuilt_base_and_keep_the_frozen_file():
    dev = json.loads((HERE / "round7/split7-deviations.json").read_text())["bases_rebuilt"]
    frozen = _split(7)["bases_sha256"]
    assert set(dev) <= set(frozen) and all(d["frozen_sha256"] == frozen[b] != d["sha256"] and d["reason"] for b, d in dev.items())


def test_a_round_s_base_is_restored_from_its_committed_copy_and_a_new_one_is_kept(tmp_path):
    built = []

    def build(folder):
        built.append(folder)
        folder.mkdir()
        (folder / "card.json").write_text("{}")
        (folder / "weights.safetensors").write_bytes(b"w")

    folder, kept = tmp_path / "cache" / "bases" / "B", tmp_path / "results" / "bases" / "B"
    assert RUN.place_base(folder, kept, build).startswith("built") and (kept / "weights.safetensors").read_bytes() == b"w"
    assert RUN.place_base(folder, kept, build) == "present"
    shutil.rmtree(folder)  # the cache is lost: the committed copy comes back, nothing is rebuilt
    assert RUN.place_base(folder, kept, build).startswith("restored") and (folder / "weights.safetensors").read_bytes() == b"w"
    assert len(built) == 1
