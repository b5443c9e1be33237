"""Issue 52: gsd train's defaults follow the held-out benchmark's tuning where it tuned them (gsd_cli.train.tuned),
and say so; a setting the user gives, another model or method, and --resume keep theirs."""

from __future__ import annotations

import json

import numpy as np

from gsd_cli.cli import main
from gsd_cli.train.tuned import TUNED, UNTUNED, family, training_defaults


def _npz(path, n=64, seed=0):
    rng = np.random.default_rng(seed)
    np.savez(path, x=rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), y=np.arange(n) % 4,
             classes=np.array(["a", "b", "c", "d"]))
    return f"npz:{path}"


def _settings(run):
    s = json.loads((run / "summary.json").read_text())["settings"]
    return {k: s[k] for k in ("lr", "epochs", "batch_size")}


def test_the_table_is_the_committed_tuning():
    """Each tuned entry is the tuning's chosen point (benchmarks/results/heldout6/tuned6.json) at its batch size."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "benchmarks/results"
    tuned = json.loads((root / "heldout6/tuned6.json").read_text())["methods"]
    # the second phase was tuned again for the stage 1 that learns (issue 61's pass 3)
    tuned["second-phase"] = {"chosen": {k: v for k, v in json.loads((root / "pilot61/tuned3.json").read_text())["point"].items()
                                        if k in ("lr", "epochs")}}
    for (fam, method), v in TUNED.items():
        assert fam == "fmnist-cnn" and {k: v[k] for k in ("lr", "epochs")} == tuned[method]["chosen"] and v["batch_size"] == 500
    assert family("fmnist-cnn@32x3") == "fmnist-cnn" and family("net.py:make") is None and family("timm:resnet18") is None
    assert training_defaults("resnet20", "dpsgd") == UNTUNED and training_defaults("fmnist-cnn", "gep") == UNTUNED


def test_dpsgd_on_the_fmnist_cnn_trains_at_the_tuned_point_unless_told_otherwise(tmp_path, capsys):
    priv = _npz(tmp_path / "p.npz")
    base = ["train", "--private", priv, "--method", "dpsgd", "--epsilon", "8", "--model", "fmnist-cnn", "-q"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0, capsys.readouterr().err
    assert _settings(tmp_path / "a") == TUNED[("fmnist-cnn", "dpsgd")]
    assert main([*base, "--lr", "0.2", "--epochs", "2", "--out", str(tmp_path / "b")]) == 0
    assert _settings(tmp_path / "b") == {"lr": 0.2, "epochs": 2, "batch_size": 500}, "what is given is kept; the rest is tuned"
    # GEP was not tuned over length: the earlier defaults
    pub = _npz(tmp_path / "pub.npz", 64, 1)
    assert main(["train", "--private", priv, "--public", pub, "--method", "gep", "--epsilon", "8", "--k", "2", "--public-examples", "32",
                 "--epochs", "1", "-q", "--out", str(tmp_path / "c")]) == 0
    s = _settings(tmp_path / "c")
    assert (s["lr"], s["batch_size"]) == (UNTUNED["lr"], UNTUNED["batch_size"])


def test_the_help_says_where_the_defaults_come_from():
    from typer.testing import CliRunner

    from gsd_cli.cli.app import app

    text = " ".join(CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "tuned on the held-out benchmark's selection tasks" in text


def test_the_from_base_table_is_the_pilots_committed_tuning():
    """Issue 61: DP fine-tuning from pre-trained weights has its own tuned point per PEFT choice, the pilot's
    (benchmarks/results/pilot61/tuned.json), and only a run with --weights gets it."""
    from pathlib import Path

    from gsd_cli.train.tuned import FROM_BASE, is_tuned, lr_reason, training_settings

    results = Path(__file__).resolve().parents[1] / "benchmarks/results/pilot61"
    tuned = {"dpsgd": json.loads((results / "tuned.json").read_text())["per_peft"],
             "second-phase": json.loads((results / "tuned2.json").read_text())["per_peft"]}
    for (fam, method, peft), v in FROM_BASE.items():
        assert fam == "fmnist-cnn" and {k: v[k] for k in ("lr", "epochs")} == \
            {k: tuned[method][peft][k] for k in ("lr", "epochs")} and v["batch_size"] == 500
    assert training_defaults("fmnist-cnn", "second-phase", "base", None)["lr"] == 0.25
    assert training_defaults("fmnist-cnn", "dpsgd", "base", "head") == FROM_BASE[("fmnist-cnn", "dpsgd", "head")]
    assert training_defaults("fmnist-cnn", "dpsgd", "base", "lora") == TUNED[("fmnist-cnn", "dpsgd")], "an untuned PEFT: the scratch point"
    assert is_tuned("fmnist-cnn", "dpsgd", "base", None) and not is_tuned("resnet20", "dpsgd", "base", "head")
    s = training_settings("fmnist-cnn@32x3", "dpsgd", expected_size=500, weights="base", peft="head")
    assert s == {"lr": 0.5 * 125 / 500, "epochs": 12, "batch_size": 125}
    assert "tuned for dpsgd from a base on fmnist-cnn (--peft head)" in lr_reason("fmnist-cnn", "dpsgd", 0.5, 500, "base", "head")
    assert "from a base" not in lr_reason("fmnist-cnn", "dpsgd", 0.5, 500)
