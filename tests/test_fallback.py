"""The previous, in-sample auto-select rule (gsd_cli.advice.fallback, issue 33), which ``gsd train`` no longer
follows (gsd_cli.advice.decide does, tests/test_advice.py): kept as a comparison arm of the held-out benchmark."""

from __future__ import annotations

import json

import pytest

from gsd_cli.advice.fallback import decide, rules

RANK = {"model": "probe", "k": 16, "examples": 2000}
FIG = {"rank": RANK, "rule": {"gep": {"threshold": 0.3, "errors": 2, "cells": 20, "held_out_errors": 1, "held_out_cells": 10},
                              "second-phase": {"threshold": 0.5, "errors": 3, "cells": 20}}}


def test_decision_keeps_the_winner_below_the_threshold():
    d = decide("gep", "a", 0.25, rank_settings=RANK, figures=FIG)
    assert (d.method, d.public, d.applied, d.fell_back) == ("gep", "a", True, False)
    assert "0.2500 <= 0.3" in d.message and "2 of 20" in d.message and "1 of 10 on the held-out task" in d.message


def test_decision_falls_back_to_dpsgd_above_every_threshold():
    d = decide("gep", "a", 0.7, rank_settings=RANK, figures=FIG)
    assert (d.method, d.public, d.applied, d.fell_back) == ("dpsgd", None, True, True)
    assert "no candidate is predicted to beat DP-SGD" in d.message
    assert d.threshold == 0.3 and d.distance == 0.7


def test_decision_takes_the_other_public_method_whose_rule_passes():
    d = decide("gep", "a", 0.4, rank_settings=RANK, figures=FIG)
    assert (d.method, d.public, d.fell_back) == ("second-phase", "a", True)
    d = decide("second-phase", "a", 0.4, rank_settings=RANK, figures=FIG)  # passes its own rule
    assert (d.method, d.fell_back) == ("second-phase", False)
    d = decide("second-phase", "a", 0.6, rank_settings=RANK, figures=FIG)  # 0.6 > 0.5 and > gep's 0.3
    assert d.method == "dpsgd"


@pytest.mark.parametrize("settings, dp", [({**RANK, "k": 8}, False), ({**RANK, "model": "fmnist-cnn"}, False),
                                          ({**RANK, "examples": 500}, False), (RANK, True)])
def test_rule_is_not_applied_outside_its_calibration(settings, dp):
    d = decide("gep", "a", 0.9, rank_settings=settings, dp=dp, figures=FIG)
    assert (d.method, d.public, d.applied, d.fell_back) == ("gep", "a", False, False)
    assert "not applied" in d.message


def test_no_rule_no_fallback():
    assert not decide("rgp", "a", 0.9, rank_settings=RANK, figures=FIG).applied
    assert not decide("gep", "a", 0.9, rank_settings=RANK, figures={}).applied
    assert not decide("gep", "a", 0.9, rank_settings=RANK, figures={"rank": RANK, "rule": {}}).applied


def test_shipped_rule_is_loaded_and_printed():
    from gsd_cli.report.validity import figures, validity_line

    table, calibrated = rules()
    doc = figures()
    assert table == doc["rule"] and calibrated == doc["rank"]
    assert set(table) == {"gep", "second-phase"}
    assert "Advice (gsd train --auto-select" in validity_line("gsd")  # the rule is no longer what gsd follows


# -- --method auto (auto-select's default): the method the benchmark favours ----------------------

GAINS = {"rank": RANK, "rule": {"gep": {"threshold": 0.3, "errors": 2, "cells": 20, "gain": 0.9},
                                "second-phase": {"threshold": 0.5, "errors": 3, "cells": 20, "gain": 4.4}}}


def test_auto_takes_the_largest_gain_whose_threshold_passes():
    from gsd_cli.advice.fallback import by_gain, choose

    assert by_gain(GAINS["rule"]) == ["second-phase", "gep"]
    d = choose("a", 0.25, rank_settings=RANK, figures=GAINS)  # both pass: the larger gain
    assert (d.method, d.public, d.applied, d.fell_back) == ("second-phase", "a", True, False)
    assert "+4.4 points" in d.message and "0.2500 <= 0.5" in d.message
    swapped = {"rank": RANK, "rule": {**GAINS["rule"], "gep": {**GAINS["rule"]["gep"], "threshold": 0.6, "gain": 5.0}}}
    assert choose("a", 0.55, rank_settings=RANK, figures=swapped).method == "gep"  # gep now gains more and passes
    assert choose("a", 0.55, rank_settings=RANK, figures=GAINS).method == "dpsgd"  # passes neither threshold
    d = choose("a", 0.55, rank_settings=RANK, figures=GAINS)
    assert (d.public, d.fell_back, d.threshold) == (None, True, 0.5) and "no candidate is predicted" in d.message
    assert decide("auto", "a", 0.25, rank_settings=RANK, figures=GAINS).method == "second-phase"  # decide delegates


def test_auto_outside_the_calibration_and_without_rules():
    from gsd_cli.advice.fallback import choose

    d = choose("a", 0.9, rank_settings={**RANK, "k": 8}, figures=GAINS)  # not applied: the largest gain, with the winner
    assert (d.method, d.public, d.applied, d.fell_back) == ("second-phase", "a", False, False) and "not applied" in d.message
    d = choose("a", 0.9, rank_settings=RANK, dp=True, figures=GAINS)
    assert (d.method, d.applied) == ("second-phase", False)
    d = choose("a", 0.9, rank_settings=RANK, figures={})
    assert (d.method, d.public, d.applied) == ("gep", "a", False)


def test_shipped_rule_favours_a_method_by_measured_gain():
    """validity.json (written by bench_downstream.py score --update-package) carries each rule's gain."""
    from gsd_cli.advice.fallback import by_gain

    table, _ = rules()
    assert all(isinstance(r.get("gain"), (int, float)) for r in table.values())
    best = by_gain(table)[0]
    assert table[best]["gain"] == max(r["gain"] for r in table.values())
    from gsd_cli.report.validity import LABELS, figures, validated_sentence

    doc = figures()  # the method the order is validated for: Spearman <= -0.8 in every selection cell
    m = doc["validated_for"]
    if m is not None:  # in-sample (issue 33): no longer printed under the table (issue 52), still derived from the figures
        sel = [v for k, v in doc["spearman"][m.replace("-", "_")].items() if k.split("@")[0] in doc["selection_tasks"]]
        assert sel and max(sel) <= -0.8
        assert f"validated for {LABELS[m]}" in validated_sentence(doc)


# -- a private selection (--select-epsilon): the rule on the DP energy distance -----------------------

RANK_DP = {**RANK, "metric": "dp-energy", "clip": 1.0}
FIG_DP = {**GAINS, "rule_dp": {"rank": RANK_DP, "metric": "dp-energy", "rule": {
    "gep": {"threshold": 0.45, "errors": 2, "cells": 12, "gain": 1.0, "held_out_errors": 1, "held_out_cells": 6,
            "expected_errors": {"0.5": {"selection": 3.2, "held_out": 1.4}, "1": {"selection": 2.6, "held_out": 1.1}}},
    "second-phase": {"threshold": 0.42, "errors": 1, "cells": 12, "gain": 3.0,
                     "expected_errors": {"0.5": {"selection": 2.1, "held_out": None}, "1": {"selection": 1.5, "held_out": None}}}}}}


def test_a_private_selection_applies_its_own_rule_to_the_released_distance():
    from gsd_cli.advice.fallback import choose

    dp_settings = {**RANK, "epsilon": 1.0}  # metric and clip unset: gsd rank --dp's defaults
    d = choose("a", 0.41, rank_settings=dp_settings, dp=True, figures=FIG_DP)
    assert (d.method, d.public, d.applied, d.fell_back) == ("second-phase", "a", True, False)
    assert "DP energy distance 0.4100 <= 0.42" in d.message and "noise at epsilon 1, 1.5 expected wrong" in d.message
    d = choose("a", 0.44, rank_settings=dp_settings, dp=True, figures=FIG_DP)  # past the second phase's, within GEP's
    assert (d.method, d.applied) == ("gep", True)
    d = choose("a", 0.5, rank_settings={**RANK, "epsilon": 0.7}, dp=True, figures=FIG_DP)
    assert (d.method, d.public, d.applied, d.fell_back) == ("dpsgd", None, True, True)
    assert "epsilon 0.5, 3.2 expected wrong and 1.4 held out" in d.message  # the listed epsilon at most 0.7
    # the GSD thresholds never read a DP distance, and the DP ones never a GSD
    assert choose("a", 0.44, rank_settings=RANK, figures=FIG_DP).method == "second-phase"  # GSD 0.44 <= 0.5
    assert decide("gep", "a", 0.44, rank_settings=dp_settings, dp=True, figures=FIG_DP).method == "gep"
    assert decide("second-phase", "a", 0.44, rank_settings=dp_settings, dp=True, figures=FIG_DP).method == "gep"


@pytest.mark.parametrize("settings", [{**RANK, "clip": 2.0}, {**RANK, "metric": "dp-gsd"}, {**RANK, "k": 8}])
def test_a_private_selection_outside_its_calibration_is_not_applied(settings):
    from gsd_cli.advice.fallback import choose

    d = choose("a", 0.9, rank_settings=settings, dp=True, figures=FIG_DP)
    assert (d.method, d.public, d.applied) == ("second-phase", "a", False) and "calibrated for the private ranking" in d.message
    d = decide("gep", "a", 0.9, rank_settings=settings, dp=True, figures=FIG_DP)
    assert (d.method, d.applied) == ("gep", False) and "not applied" in d.message


def test_without_a_private_rule_the_gsd_gains_order_the_methods_and_nothing_is_applied():
    from gsd_cli.advice.fallback import choose

    d = choose("a", 0.1, rank_settings=RANK, dp=True, figures=GAINS)
    assert (d.method, d.applied) == ("second-phase", False) and "no rule for a private selection" in d.message
    assert not decide("gep", "a", 0.1, rank_settings=RANK, dp=True, figures=GAINS).applied


def test_the_shipped_private_rule_is_on_the_dp_energy_distance():
    table, calibrated = rules(dp=True)
    if not table:
        pytest.skip("no rule for a private selection shipped")
    assert calibrated["metric"] == "dp-energy" and calibrated["model"] == "probe"
    assert set(table) <= {"gep", "second-phase"}
    for r in table.values():
        assert 0 < r["threshold"] < 1 and r["expected_errors"]
        assert all(v["selection"] <= r["cells"] for v in r["expected_errors"].values())


