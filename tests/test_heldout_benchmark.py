"""The held-out benchmark's pure parts (benchmarks/validity/heldout): the split rule and the scoring,
on synthetic inputs (the benchmark's data lives in benchmark-only packages, absent in CI)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from validity.heldout import score as S
from validity.heldout.cache import run_key
from validity.heldout.tasks import ROUND1, ROUND2, ROUND3, ROUND4, ROUND5, SPLIT, SPLIT2, SPLIT3, SPLIT4, SPLIT5, TASKS, Task, assign


def test_the_committed_split_is_the_rule_s_and_meets_its_constraints():
    salt, sel, held = assign()
    doc = json.loads(SPLIT.read_text())
    assert (doc["salt"], doc["selection"], doc["held_out"]) == (salt, sel, held)
    assert sorted(sel + held) == sorted(ROUND1) and len(held) >= 4
    assert len({TASKS[t].kind for t in held}) >= 3 and sum(TASKS[t].realistic for t in held) >= 2
    # the rule, computed apart: the first four tasks by the salted hash are held out
    order = sorted(ROUND1, key=lambda t: hashlib.sha256(f"gsd-issue-42:{salt}:{t}".encode()).hexdigest())
    assert set(order[:4]) == set(held)


def test_round_two_is_new_held_out_and_realistic():
    doc = json.loads(SPLIT2.read_text())
    assert doc["held_out"] == list(ROUND2) and not set(ROUND2) & set(ROUND1) and set(TASKS) == set(ROUND1) | set(ROUND2) | set(ROUND3) | set(ROUND4) | set(ROUND5)
    assert len({TASKS[t].kind for t in ROUND2}) == 4 and all(TASKS[t].realistic for t in ROUND2)
    assert all(len(TASKS[t].candidates) >= 6 for t in ROUND2)


def test_round_three_is_new_held_out_realistic_and_names_the_commit_under_test():
    doc = json.loads(SPLIT3.read_text())
    assert doc["held_out"] == list(ROUND3) and not set(ROUND3) & (set(ROUND1) | set(ROUND2))
    assert len({TASKS[t].kind for t in ROUND3}) == 4 and all(TASKS[t].realistic for t in ROUND3)
    assert all(len(TASKS[t].candidates) >= 6 for t in ROUND3)
    assert len(doc["gsd_cli_commit"]) == 40 and "auto:probe-same" in doc["exploratory_arm"]


def test_round_four_is_new_held_out_realistic_and_offers_same_class_candidates():
    doc = json.loads(SPLIT4.read_text())
    assert doc["held_out"] == list(ROUND4) and not set(ROUND4) & (set(ROUND1) | set(ROUND2) | set(ROUND3))
    assert len({TASKS[t].kind for t in ROUND4}) == 4 and all(TASKS[t].realistic for t in ROUND4)
    assert all(len(TASKS[t].candidates) >= 6 for t in ROUND4)
    assert len(doc["gsd_cli_commit"]) == 40 and "auto:probe-same" in doc["exploratory_arm"]
    assert "pub-fashion" in TASKS["fashion-lowres"].candidates and "pub-mnist" in TASKS["mnist-noisy"].candidates


def test_round_five_is_new_held_out_and_pre_registers_the_few_shot_arms():
    doc = json.loads(SPLIT5.read_text())
    assert doc["held_out"] == list(ROUND5) and not set(ROUND5) & (set(ROUND1) | set(ROUND2) | set(ROUND3) | set(ROUND4))
    assert len({TASKS[t].kind for t in ROUND5}) == 4 and all(TASKS[t].realistic for t in ROUND5)
    assert len(doc["gsd_cli_commit"]) == 40 and "auto:few25" in doc["few_shot_arms"]


def _fake_advise(task, advised, probe):
    """The advice's shape: the second phase with the largest positive mean gain among the probed candidates."""
    gains = {c: float(np.mean(g)) for c, g in probe["gains"].items()}
    best = max(gains, key=gains.get, default=None)
    return ("second-phase", best) if best is not None and gains[best] > 0 else ("dpsgd", None)


def test_the_same_classes_arm_prefers_a_set_that_trains_the_private_head_unless_clearly_worse(monkeypatch):
    monkeypatch.setattr(S, "decision_advise", _fake_advise)
    shared, separate = {"head": "shared with the private task"}, {"head": "a separate 10-way head"}
    probe = {"gains": {"other": [0.10, 0.12, 0.11], "same": [0.09, 0.13, 0.08]}, "stage1": {"other": separate, "same": shared}}
    assert S.decision_same("t", {}, probe) == ("second-phase", "same")  # not confidently worse: taken
    probe["gains"]["same"] = [0.02, 0.03, 0.025]  # worse on every repeat by about 0.085: kept out
    assert S.decision_same("t", {}, probe) == ("second-phase", "other")
    probe["gains"]["same"] = [-0.01, -0.02, -0.01]  # the restricted advice trains DP-SGD: the full decision stands
    assert S.decision_same("t", {}, probe) == ("second-phase", "other")
    probe["gains"] = {"other": [-0.1, -0.1, -0.1], "same": [-0.2, -0.1, -0.1]}
    assert S.decision_same("t", {}, probe) == ("dpsgd", None)


def test_the_split_rule_moves_on_to_the_next_salt_when_the_constraints_fail():
    # all tasks of one kind and none realistic: no salt can pass
    tasks = {f"t{i}": Task(f"t{i}", "digits", "a", "b", ("c",) * 6, "fmnist-cnn", False) for i in range(8)}
    with pytest.raises(RuntimeError):
        assign(tasks)
    kinds = ["a", "a", "a", "a", "b", "c", "d", "e"]
    tasks = {f"t{i}": Task(f"t{i}", k, "a", "b", ("c",) * 6, "fmnist-cnn", i in (0, 4, 5)) for i, k in enumerate(kinds)}
    salt = assign(tasks)[0]
    for s in range(salt):  # every earlier salt fails the constraints
        order = sorted(tasks, key=lambda t, s=s: hashlib.sha256(f"gsd-issue-42:{s}:{t}".encode()).hexdigest())
        h, se = order[:4], order[4:]
        assert not (len({tasks[t].kind for t in h}) >= 3 and sum(tasks[t].realistic for t in h) >= 2
                    and sum(tasks[t].realistic for t in se) >= 1 and len({tasks[t].kind for t in se}) >= 3)


def test_run_keys_change_with_every_setting_and_not_with_dict_order():
    a = run_key("mnist", "gep", "pub-mnist", {"lr": 1.0, "epochs": 3}, 0)
    assert a == run_key("mnist", "gep", "pub-mnist", {"epochs": 3, "lr": 1.0}, 0)
    assert len({a, run_key("mnist", "gep", "pub-mnist", {"lr": 2.0, "epochs": 3}, 0),
                run_key("mnist", "gep", "pub-mnist", {"lr": 1.0, "epochs": 3}, 1),
                run_key("mnist", "second-phase", "pub-mnist", {"lr": 1.0, "epochs": 3}, 0),
                run_key("mnist", "gep", "digits", {"lr": 1.0, "epochs": 3}, 0)}) == 5


def test_bootstrap_interval_covers_the_mean_and_shrinks_to_a_point_for_constant_values():
    rng = np.random.default_rng(0)
    d = S.boot_mean([1.0, 2.0, 3.0, 4.0, 5.0], rng)
    assert d["mean"] == 3.0 and d["ci"][0] < 3.0 < d["ci"][1] and 1.0 <= d["ci"][0] and d["ci"][1] <= 5.0
    assert S.boot_mean([2.0, 2.0, 2.0], rng)["ci"] == [2.0, 2.0]
    assert S.boot_mean([7.0], rng) == {"mean": 7.0, "ci": None, "n": 1}


def _synthetic(task: str, auto: list[float], dpsgd: list[float], oracle: list[float], pick: list[float], cands: dict) -> dict:
    """A task_scores-shaped dict (what figures() reads)."""
    rng = np.random.default_rng(1)
    per_seed = {"dpsgd": dpsgd, "auto:rule": auto, "dpsgd@auto:rule": dpsgd, "oracle": oracle}
    for m in S.METHODS:
        per_seed[f"{m}:pick"] = pick
        per_seed[f"{m}:random"] = list(np.mean([cands[c] for c in TASKS[task].candidates], axis=0))
        for c in TASKS[task].candidates:
            per_seed[f"{m}:{c}"] = cands[c]
    gains = {a: S.boot_mean(np.array(v) - np.array(dpsgd), rng) for a, v in per_seed.items() if a != "dpsgd"}
    return {"task": task, "per_seed": per_seed, "gains_vs_dpsgd": gains, "auto_seeds": {"auto:rule": [0, 1]},
            "spearman": {"method": S.VALIDATED, "rho": -1.0, "ci": [-1.0, -1.0]}}


def test_figures_count_cells_within_half_a_point_and_the_gain_where_the_oracle_gains():
    rng = np.random.default_rng(2)
    cands = dict(zip(TASKS["animal"].candidates, ([60.0, 62.0], [40.0, 40.0], [40.0, 40.0], [40.0, 40.0], [40.0, 40.0], [40.0, 40.0])))
    a = _synthetic("animal", auto=[60.0, 62.0], dpsgd=[50.0, 50.0], oracle=[60.0, 62.0], pick=[60.0, 62.0], cands=cands)
    cands_b = {c: [70.0, 70.0] for c in TASKS["medical"].candidates}
    b = _synthetic("medical", auto=[69.6, 69.0], dpsgd=[70.0, 70.0], oracle=[70.0, 70.0], pick=[70.0, 70.0], cands=cands_b)
    f = S.figures({"animal": a, "medical": b}, rng)
    r = f["auto:rule"]
    assert (r["seed_cells_ok"], r["seed_cells"]) == (3, 4)  # -0.4 passes, -1.0 does not
    assert (r["tasks_ok"], r["tasks"]) == (1, 2)  # medical's mean -0.7 < -0.5
    assert (f["oracle_cells"]["seed_cells_ok"], f["oracle_cells"]["seed_cells"]) == (4, 4)
    b["per_seed"]["oracle"] = [69.4, 70.0]  # one oracle cell 0.6 below DP-SGD
    assert S.figures({"animal": a, "medical": b}, rng)["oracle_cells"]["seed_cells_ok"] == 3
    assert r["gain_where_oracle_gains_3"] == {"tasks": ["animal"], "mean": pytest.approx(11.0)}
    # pick minus random on animal: pick 61 against the candidates' mean (61 + 5 * 40) / 6; on medical 0
    expected = ((61.0 - (61.0 + 200.0) / 6) + 0.0) / 2
    assert f["pick_minus_random_gep:pick"]["mean"] == pytest.approx(expected)
    lo, hi = f["pick_minus_random_gep:pick"]["ci"]
    assert lo <= expected <= hi


def test_task_figures_split_the_no_harm_count_and_resample_tasks():
    """Issue 52: the no-harm count split into DP-SGD by choice and cells that used public data, beside always
    choosing DP-SGD; the mean gain over tasks with an interval resampling tasks; the oracle's share; the top two
    tasks' share; the tasks whose untransformed source is a candidate against the others."""
    assert TASKS["mnist-rot"].source == "pub-mnist" and TASKS["fashion-m"].source == "pub-fashion" and TASKS["scenes"].source is None
    assert all(t.source in t.candidates for t in TASKS.values() if t.source)

    def task(name, auto, oracle, methods):
        cands = {c: [50.0, 50.0] for c in TASKS[name].candidates}
        s = _synthetic(name, auto=auto, dpsgd=[50.0, 50.0], oracle=oracle, pick=auto, cands=cands)
        s["decisions"] = [{"seed": i, "auto:rule": {"method": m, "public": None if m == "dpsgd" else "x"}} for i, m in enumerate(methods)]
        return s

    sc = {"mnist-rot": task("mnist-rot", [70.0, 70.0], [70.0, 70.0], ["second-phase", "second-phase"]),  # +20
          "fashion-m": task("fashion-m", [50.0, 49.0], [54.0, 54.0], ["dpsgd", "gep"]),  # 0 by choice, -1.0 with public data
          "scenes": task("scenes", [54.0, 54.0], [56.0, 56.0], ["gep", "gep"])}  # +4
    f = S.figures(sc, np.random.default_rng(3), "synthetic")
    r = f["auto:rule"]
    assert r["no_harm"] | {"what": None} == {"cells_ok": 5, "cells": 6, "dpsgd_by_choice": 1, "used_public": 5, "used_public_ok": 4,
                                            "always_dpsgd_ok": 6, "always_dpsgd_cells": 6, "what": None}
    g = r["task_gain"]
    assert g["mean"] == pytest.approx((20.0 - 0.5 + 4.0) / 3) and g["median"] == pytest.approx(4.0)
    assert g["ci"][0] <= g["mean"] <= g["ci"][1] and g["ci"][0] >= -0.5 and g["ci"][1] <= 20.0
    assert [t for t, _ in g["sorted"]] == ["mnist-rot", "scenes", "fashion-m"] and g["top_two"] == ["mnist-rot", "scenes"]
    assert g["top_two_share"] == pytest.approx(24.0 / 23.5)
    o = r["oracle_share"]
    assert o["mean"] == pytest.approx((23.5 / 3) / ((20.0 + 4.0 + 6.0) / 3)) and o["ci"][0] <= o["mean"] <= o["ci"][1]
    b = r["by_source"]
    assert b["source_tasks"] == ["mnist-rot", "fashion-m"] and b["other_tasks"] == ["scenes"]
    assert b["source_mean"] == pytest.approx(19.5 / 2) and b["other_mean"] == pytest.approx(4.0) and b["source_share"] == pytest.approx(19.5 / 23.5)
    assert f["spearman"]["ci_tasks"] == [-1.0, -1.0]  # every task's rho is -1
    # keyed by the set's name, not the generator handed in: the same intervals again
    again = S.figures(sc, np.random.default_rng(4), "synthetic")["auto:rule"]
    assert again["task_gain"]["ci"] == g["ci"] and again["oracle_share"]["ci"] == o["ci"]
    lines = "\n".join(S.task_lines(r))
    assert "5 of 6 cells within 0.5 points of DP-SGD = 1 where the advice chose DP-SGD itself + 4 of 5 cells that used public data" in lines
    assert "always choosing DP-SGD: 6 of 6" in lines and "(95% bootstrap over tasks)" in lines


def test_the_pre_registered_rounds_and_the_later_ones_are_scored_apart():
    assert S.span_key(*S.PRE_REGISTERED) == S.pooled_key(3) == "held_out_23" and S.span_key(*S.LATER) == "held_out_45"
    assert list(S.HEADLINE.values()) == ["rounds 2-3 (pre-registered)", "rounds 4-5 (added after a miss)"]


def test_the_shipped_validity_note_is_the_committed_scores_and_quotes_only_printed_figures():
    """gsd_cli/report/heldout.json is package_note() of the committed heldout_scores.json, and every figure that
    gsd rank's note quotes is in the scorer's markdown (benchmarks/results/heldout_scores.md)."""
    import json
    import re

    from gsd_cli.report.validity import heldout, heldout_sentence, validity_line

    doc = json.loads(S.OUT_JSON.read_text())
    shipped = heldout()
    assert {k: v for k, v in shipped.items() if k != "scored_with"} == {
        k: v for k, v in S.package_note(doc).items() if k != "scored_with"}
    md = S.OUT_MD.read_text()
    assert heldout_sentence(shipped, "Earlier") in validity_line("gsd")
    note = heldout_sentence(shipped)
    quoted = re.findall(r"[+-]\d+\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\]|\d+% \[\d+%, \d+%\]|\d+ of \d+ cells", note)
    assert len(quoted) >= 6
    for q in quoted:
        assert q in md, q
    assert f"carry {100 * shipped['pre_registered']['top_two_share']:.0f}% of the total gain" in md


def test_spearman_of_a_reversed_order_is_minus_one_and_undefined_for_ties():
    assert S.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(S.spearman([1, 1, 1], [1, 2, 3]))


def test_bootstrap_generators_are_keyed_by_name_so_intervals_do_not_move_when_tasks_are_added():
    a, b = S.named_rng("glyphs").integers(0, 1 << 30, 4), S.named_rng("glyphs").integers(0, 1 << 30, 4)
    assert (a == b).all() and not (a == S.named_rng("scans").integers(0, 1 << 30, 4)).all()


def test_the_few_shot_probe_separates_separable_classes_and_is_at_chance_on_noise():
    import torch

    from validity.heldout.variants import few_shot_accuracy

    g = torch.Generator().manual_seed(0)
    y = torch.arange(300) % 3
    sep = torch.nn.functional.one_hot(y, 3).double() * 5 + 0.1 * torch.randn(300, 3, generator=g, dtype=torch.float64)
    assert few_shot_accuracy(sep, y, 3, seed=0, per_class=10) == pytest.approx(1.0)
    noise = torch.randn(300, 20, generator=g, dtype=torch.float64)
    assert abs(few_shot_accuracy(noise, y, 3, seed=0, per_class=10) - 1 / 3) < 0.1
    # fewer fitted examples: a weaker learner on weakly informative features
    weak = torch.nn.functional.one_hot(y, 3).double() * 0.6 + torch.randn(300, 30, generator=g, dtype=torch.float64)[:, :3]
    weak = torch.cat([weak, torch.randn(300, 27, generator=g, dtype=torch.float64)], 1)
    assert few_shot_accuracy(weak, y, 3, seed=0, per_class=5) < few_shot_accuracy(weak, y, 3, seed=0, per_class=60)


def test_round_6_was_frozen_before_its_runs_and_meets_the_issue_s_design():
    """split6.json (issue 52, item 3): 8 tasks of at least 4 kinds, 6 candidates each from other sources, at most a
    quarter with a transformed copy of the private source, committed in an earlier commit than any round-6 result."""
    import subprocess

    from validity.heldout.round6.protocol import SPLIT6, TARGETS

    doc = json.loads(SPLIT6.read_text())
    tasks = doc["tasks"]
    assert len(tasks) >= 8 and len({t["kind"] for t in tasks.values()}) >= 4
    assert sum(t["transformed_source_candidate"] is not None for t in tasks.values()) <= len(tasks) / 4
    assert all(len(t["candidates"]) >= 6 and t["private_train"] not in t["candidates"] for t in tasks.values())
    assert doc["targets"] == json.loads(json.dumps(TARGETS)) and doc["select_epsilon"] < doc["epsilon"]
    root = SPLIT6.parents[4]

    def first_commit(path):
        out = subprocess.run(["git", "-C", str(root), "log", "--format=%ct", "--diff-filter=A", "--", str(path)],
                             capture_output=True, text=True, check=False).stdout.split()
        return int(out[-1]) if out else None

    frozen = first_commit(SPLIT6)
    if frozen is None:
        pytest.skip("not a git checkout")
    for later in (root / "benchmarks/results/heldout6/tuned6.json", root / "benchmarks/results/heldout6/runs.jsonl"):
        added = first_commit(later)
        assert added is None or added >= frozen, later


def test_the_shipped_round_6_note_is_the_committed_scores_and_quotes_only_printed_figures():
    """gsd_cli/report/heldout6.json is package_note() of the committed heldout6_scores.json, and the figures gsd rank's
    note quotes of round 6 are in the round's markdown."""
    import re

    from validity.heldout.round6 import score6

    from gsd_cli.report.validity import heldout6, round6_sentence

    shipped = heldout6()
    if shipped is None or not score6.OUT_JSON.is_file():
        pytest.skip("round 6 is not scored in this checkout")
    doc = json.loads(score6.OUT_JSON.read_text())
    assert {k: v for k, v in shipped.items() if k != "scored_with"} == {
        k: v for k, v in json.loads(json.dumps(score6.package_note(doc))).items() if k != "scored_with"}
    md = score6.OUT_MD.read_text()
    quoted = re.findall(r"[+-]\d+\.\d+ \[[+-]\d+\.\d+, [+-]\d+\.\d+\]|-?\d+% \[-?\d+%, -?\d+%\]", round6_sentence(shipped))
    assert len(quoted) >= 4
    for q in quoted:
        assert q in md, q


def test_the_stops_replay_keeps_the_decision_and_counts_the_work():
    """``python -m validity.heldout stops`` on one synthetic cell: B helps but is farther than noise in its first draw
    (stopped: one draw), C loses in the probe's first draw (one stage 1), A helps and is closer: chosen either way."""
    from gsd_cli.train.advice import Candidate
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
    import gsd_cli.train.probe as probe_mod
    import gsd_cli.train.select as select
    from gsd_cli.data import resolve
    from gsd_cli.data.reference import is_reference
    from gsd_cli.ranking.repeats import repeat_seed
    from gsd_cli.train import TrainConfig
    from gsd_cli.train.advice import describe
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
