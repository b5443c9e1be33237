"""Issue 52, items 1-2: `gsd train --auto-select --select-epsilon E` private end to end with the DP feature
probe (gsd_cli.advice.dp_probe): booked before it draws, --epsilon the run's total (the selection's share
off it), the run "differentially private: yes", and neighbouring private sets print the same public lines."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from gsd_cli.cli import common, main
from gsd_cli.errors import GSDError
from gsd_cli.privacy import budget as B
from gsd_cli.advice.dp_probe import SELECTION_DELTA_SHARE, project, split_budget

SMALL = ["--model", "fmnist-cnn", "--params", "fc*", "--epochs", "1", "--batch-size", "50", "--expected-size", "400",
         "--public-epochs", "1", "--public-examples", "1000", "-q"]


def _summary(run):
    return json.loads((run / "summary.json").read_text())


def test_the_dp_probe_run_is_dp_end_to_end_and_its_parts_add_to_the_total(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--auto-select", "--public", "mnist-b", "noise", "--select-epsilon", "1", "--epsilon", "3", "--delta", "1e-5",
                 *SMALL, "--probe-stage1", "same", "--out", str(run)])
    out, err = capsys.readouterr()
    assert code == 0, err
    s = _summary(run)
    sel = s["selection"]
    assert sel["method"] == "DP feature probe" and sel["privacy"]["release"] == "dp-probe" and s["dp"] is True
    assert sel["privacy"]["epsilon"] == 1.0 and sel["privacy"]["delta"] == pytest.approx(SELECTION_DELTA_SHARE * 1e-5)
    assert sel["privacy"]["epsilon_achieved"] <= 1.0 and sel["total"] == {"epsilon": 3.0, "delta": 1e-5}
    # the run's total is --epsilon and --delta: the selection's share and the training's, by basic composition
    assert s["budget"]["total_epsilon"] == pytest.approx(3.0, abs=1e-6) and s["budget"]["total_delta"] == pytest.approx(1e-5)
    assert "the public-data selection's epsilon 1 " in s["privacy"]["composition"]
    # booked before it drew, as its own mechanism, with its delta and curve
    runs = B.BudgetLedger().status()[0]["runs"]
    probe = [r for r in runs if r["what"] == "DP feature probe"]
    assert len(probe) == 1 and probe[0]["epsilon"] == 1.0 and probe[0]["delta"] > 0 and probe[0]["rdp"] is not None
    assert sum(r["epsilon"] for r in runs) == pytest.approx(3.0, abs=1e-6)
    # what is printed: the decision (a DP release), the split; nothing private on a public line
    assert "the DP feature probe chose" in out and "the run's total is epsilon 3" in out
    if s["method"] == "second-phase":  # the probe's stage 1 (run's settings and seed, --probe-stage1 same) is the training's
        assert s["stages"][1]["reused"] is True
    # a count of private examples ("test (N examples)") is on private lines only; stage 1's line and its row in the run's
    # table name the public cap ("--public-examples)"), public
    leaked = [line for line in (out + err).splitlines()
              if re.search(r"(?<!public-)examples\)", line) and not line.startswith(common.PRIVATE_LABEL)]
    assert not leaked, leaked


def test_nothing_usable_spends_nothing_and_the_training_gets_the_total(tmp_path, capsys):
    """faces (200 images, 2 classes) cannot be a 10-class task's second phase: nothing to choose, decided
    from public facts, so nothing is booked for the selection and the training is accounted at --epsilon."""
    run = tmp_path / "run"
    code = main(["train", "--auto-select", "--public", "faces", "--select-epsilon", "1", "--epsilon", "2", *SMALL, "--out", str(run)])
    out, err = capsys.readouterr()
    assert code == 0, err
    s = _summary(run)
    assert s["method"] == "dpsgd" and s["dp"] is True and s["selection"]["privacy"] is None
    assert s["budget"]["total_epsilon"] == pytest.approx(2.0, abs=1e-6)
    assert not [r for r in B.BudgetLedger().status()[0]["runs"] if r["what"] == "DP feature probe"]
    assert "selection nothing" in " ".join(out.split())


def test_the_selection_must_leave_the_training_some_epsilon(capsys, tmp_path):
    with pytest.raises(GSDError, match="must be below --epsilon"):
        split_budget(2.0, 1e-5, 2.0)
    assert split_budget(2.0, 1e-5, 0.5) == pytest.approx((1.5, 1e-5 * (1 - SELECTION_DELTA_SHARE), 1e-5 * SELECTION_DELTA_SHARE))
    code = main(["train", "--auto-select", "--public", "mnist-b", "--select-epsilon", "2", "--epsilon", "2", *SMALL,
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "--select-epsilon 2 must be below --epsilon 2" in err and not (tmp_path / "run").exists()


def test_the_projection_is_public_and_per_example():
    x = np.random.default_rng(0).normal(size=(10, 40))
    a, b = project(x, 3), project(x[:6], 3)
    assert a.shape == (10, 16) and np.allclose(a[:6], b)  # each row a function of that example alone
    assert not np.allclose(project(x, 4), a)  # from --seed
    assert project(x[:, :8], 3).shape == (10, 8)


def _npz(path, x):
    np.savez(path, x=x, y=(np.arange(len(x)) % 10).astype(np.int64), classes=np.array([str(i) for i in range(10)]))
    return f"npz:{path}"


def test_neighbouring_private_sets_print_the_same_public_lines(tmp_path, capsys, monkeypatch):
    """D and D + {x} under the DP probe (the same --insecure-seed, so the mechanism's draws are the same
    ones): every public line and summary.json agree; the decision is the DP release."""
    from test_console_privacy import _public

    rng = np.random.default_rng(5)
    base = rng.integers(0, 256, (121, 28, 28), dtype=np.uint8)
    test = _npz(tmp_path / "test.npz", rng.integers(0, 256, (30, 28, 28), dtype=np.uint8))
    got = []
    for d in (base[1:], base):
        priv = _npz(tmp_path / "priv.npz", d)
        monkeypatch.setenv("GSD_LEDGER", str(tmp_path / f"l{len(got)}.sqlite"))
        run = tmp_path / f"run{len(got)}"
        code = main(["train", "--private", priv, "--private-test", test, "--auto-select", "--public", "mnist-b", "noise",
                     "--select-epsilon", "1", "--epsilon", "2", "--insecure-seed", "7", *SMALL, "--out", str(run)])
        cap = capsys.readouterr()
        s = _summary(run)
        for k in ("created", "seconds"):
            s.pop(k, None)
        got.append((code, cap, s))
    (c1, k1, s1), (c2, k2, s2) = got
    assert c1 == c2 == 0
    norm = lambda lines: [line.replace("l0.sqlite", "L").replace("l1.sqlite", "L").replace("run0", "R").replace("run1", "R")  # noqa: E731
                          for line in _public(lines)]
    assert norm(k1.out.splitlines()) == norm(k2.out.splitlines())
    assert norm(k1.err.splitlines()) == norm(k2.err.splitlines())
    assert json.dumps(s1, sort_keys=True).replace("run0", "R") == json.dumps(s2, sort_keys=True).replace("run1", "R")
