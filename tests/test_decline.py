"""Issue 62: the DP advice declines to spend where the measured price curve says no selection wins its price back,
from public facts only (gsd_cli.advice.decline): nothing read, booked or spent for a selection, the training at the
whole total, said in one line; --no-fallback selects anyway; outside the measured regime it spends as asked."""

from __future__ import annotations

import json

import pytest

import gsd_cli.advice.decline as D
from gsd_cli.cli import main
from gsd_cli.privacy import budget as B
from gsd_cli.train.pretrain import pretrain_base

DOC = {"source": "issue 62's price curve (test)", "decline": True,
       "regime": {"model": "fmnist-cnn", "start": "base", "sizes": [500, 2000], "epsilon": 2.0},
       "designs": {"basic-0.1": {"gain": -1.5, "cells": 20, "composition": "basic"},
                   "basic-0.025": {"gain": -0.4, "cells": 20, "composition": "basic"},
                   "parallel-0.25": {"gain": 1.2, "cells": 20, "composition": "parallel"}}}


@pytest.mark.parametrize("change, declines", [
    ({}, True),
    ({"weights": None}, False),                       # from scratch: not the measured start
    ({"model": "resnet20"}, False),                   # another model family
    ({"expected_size": None}, False),                 # the size is not declared: private, the rule does not apply
    ({"expected_size": 400}, False),                  # below the measured sizes
    ({"expected_size": 5000}, False),                 # above them
    ({"epsilon": 4.0}, False),                        # a larger total than measured
    ({"epsilon": 1.0}, True),                         # a smaller one: still inside
    ({"model": "fmnist-cnn@32x3"}, True),             # the family, whatever the input size
])
def test_it_declines_inside_the_measured_regime_only(change, declines):
    kw = {"model": "fmnist-cnn", "weights": "base", "expected_size": 1000, "epsilon": 2.0, **change}
    why = D.decline_reason(doc=DOC, **kw)
    assert (why is not None) == declines
    if why:
        assert "basic-0.025: -0.4 points over 20 cells" in why and "--no-fallback selects anyway" in why


def test_a_curve_where_a_design_pays_never_declines():
    assert D.decline_reason(model="fmnist-cnn", weights="b", expected_size=1000, epsilon=2.0, doc={**DOC, "decline": False}) is None
    assert D.decline_reason(model="fmnist-cnn", weights="b", expected_size=1000, epsilon=2.0, doc={}) is None


def test_the_packaged_curve_is_the_benchmarks_and_consistent():
    """The shipped file (written by price62 table --update-package) declines only when no design's mean gain is above 0."""
    doc = D.measured()
    if doc is None:
        pytest.skip("no packaged price curve")
    assert doc["decline"] == all(d["gain"] <= 0 for d in doc["designs"].values() if d["composition"] == "basic")
    assert set(doc["regime"]) == {"model", "start", "sizes", "epsilon"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = tmp_path_factory.mktemp("decline") / "base"
    pretrain_base(["digits", "textures"], folder, model="fmnist-cnn", examples=40, epochs=1, batch_size=32, seed=0, device="cpu")
    return folder


SMALL = ["--model", "fmnist-cnn", "--epochs", "1", "--batch-size", "50", "--public-epochs", "1", "--public-examples", "300", "-q"]


def test_a_declined_run_spends_nothing_on_a_selection_and_trains_from_the_base(base, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(D, "measured", lambda: DOC)
    run = tmp_path / "run"
    code = main(["train", "--private", "mnist-a", "--auto-select", "--public", "mnist-b", "--weights", str(base),
                 "--select-epsilon", "0.5", "--epsilon", "2", "--expected-size", "1000", *SMALL, "--out", str(run)])
    out, err = capsys.readouterr()
    assert code == 0, err
    s = json.loads((run / "summary.json").read_text())
    assert s["method"] == "dpsgd" and s["public"] is None and s["dp"] is True
    assert s["selection"]["declined"] and s["selection"]["privacy"] is None and s["selection"]["reads_private"] is False
    assert s["budget"]["total_epsilon"] == pytest.approx(2.0, abs=1e-6)
    runs = B.BudgetLedger().status()[0]["runs"]
    assert not [r for r in runs if r["what"] == "DP feature probe"] and sum(r["epsilon"] for r in runs) == pytest.approx(2.0, abs=1e-6)
    text = " ".join(out.split())
    assert "training DP-SGD from the base alone" in text and "cannot win back its price" in text
    assert "training from the base alone (--method dpsgd)" in text


def test_no_fallback_selects_anyway_and_an_explicit_second_phase_is_told(base, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(D, "measured", lambda: DOC)
    argv = ["train", "--private", "mnist-a", "--auto-select", "--public", "mnist-b", "--weights", str(base), "--select-epsilon", "0.5",
            "--epsilon", "2", "--expected-size", "1000", *SMALL]
    assert main([*argv, "--method", "second-phase", "--out", str(tmp_path / "a")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "cannot win back its price" in err and "--no-fallback" in err
    assert not B.BudgetLedger().status(), "refused before anything was booked"
    assert main([*argv, "--no-fallback", "--out", str(tmp_path / "b")]) == 0, capsys.readouterr().err
    sel = json.loads((tmp_path / "b" / "summary.json").read_text())["selection"]
    assert sel["method"] == "DP feature probe" and sel["privacy"]["epsilon"] == 0.5
