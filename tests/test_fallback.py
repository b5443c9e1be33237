"""auto-select's calibrated fallback (gsd_cli.train.fallback, issue 33): the decision, its use by
``gsd train --auto-select``, and the shipped rule in validity.json and the table's validity line."""

from __future__ import annotations

import json

import pytest

from gsd_cli.train.fallback import decide, rules

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
    line = validity_line("gsd")
    for method, r in table.items():
        assert f"GSD <= {r['threshold']:g}" in line and f"{r['errors']} of {r['cells']}" in line


def test_auto_select_falls_back_to_dpsgd(capsys, tmp_path, tiny, monkeypatch):
    import gsd_cli.report.validity as v
    from gsd_cli.cli import main

    fig = {**v.figures(), "rank": RANK, "rule": {"gep": {"threshold": 0.0, "errors": 0, "cells": 4}}}
    monkeypatch.setattr(v, "figures", lambda: fig)
    run = tmp_path / "fb"
    args = ["train", "--private", tiny["private"], "--auto-select", "--public", tiny["public"], "--epochs", "1",
            "--batch-size", "30", "--k", "4", "--public-examples", "30", "-q", "--insecure-seed", "0"]
    code = main([*args, "--out", str(run)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "no candidate is predicted to beat DP-SGD" in out and "training without public data" in out
    s = json.loads((run / "summary.json").read_text())
    assert s["method"] == "dpsgd" and s["selection"]["fallback"]["fell_back"] is True
    code = main([*args, "--no-fallback", "--out", str(tmp_path / "nofb")])  # the user's choice stands
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads((tmp_path / "nofb" / "summary.json").read_text())["method"] == "gep"
