"""The `gsd` console entry point: gsd_cli.cli.main(argv) -> exit status."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gsd_cli.cli import app, main

FAST = ["--model", "fmnist-cnn", "--device", "cpu"]


def run(capsys, argv):
    code = main(list(map(str, argv)))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, out, err, *needles):
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1, err
    assert lines[0].startswith("error:"), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert out == ""  # nothing ranked, nothing printed on stdout


def test_unknown_dataset(capsys, npz_sets):
    code, out, err = run(capsys, ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", "mnist-c", "-q", *FAST])
    assert_one_line_error(code, out, err, "unknown dataset", "mnist-c")


def test_k_larger_than_examples(capsys, npz_sets):
    code, out, err = run(capsys, ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", f"npz:{npz_sets['near']}",
                                  "-m", "5", "--k", "8", "-q", *FAST])
    assert_one_line_error(code, out, err, "k=8")


def test_fewer_than_two_examples(capsys, npz_sets):
    code, out, err = run(capsys, ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", f"npz:{npz_sets['near']}",
                                  "-m", "1", "--k", "1", "-q", *FAST])
    assert_one_line_error(code, out, err, "at least 2")


def test_empty_folder(capsys, empty_dir, npz_sets):
    code, out, err = run(capsys, ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", f"folder:{empty_dir}", "-q", *FAST])
    assert_one_line_error(code, out, err, str(empty_dir))


def test_unreadable_image_with_progress_bar(capsys, garbage_folder, npz_sets):
    """The broken file is found mid-run, after the progress bar started (no -q, 4 chunks)."""
    code, out, err = run(capsys, ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", f"folder:{garbage_folder}",
                                  "-m", "7", "--k", "2", "--chunk-size", "2", *FAST])
    assert_one_line_error(code, out, err, "zz_broken.png")


def test_params_matching_nothing(capsys, npz_sets):
    code, out, err = run(capsys, ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", f"npz:{npz_sets['near']}",
                                  "--params", "layer9.*", "-m", "10", "--k", "2", "-q", *FAST])
    assert_one_line_error(code, out, err, "layer9.*", "conv1.weight")


def test_bad_labels_choice(capsys):
    code, out, err = run(capsys, ["rank", "--labels", "mine", "-q"])
    assert_one_line_error(code, out, err, "--labels", "mine")


def test_json_into_missing_folder(capsys, npz_sets, tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "r.json"
    code, out, err = run(capsys, ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", f"npz:{npz_sets['near']}",
                                  "-m", "10", "--k", "2", "-q", "--json", target, *FAST])
    assert_one_line_error(code, out, err, "--json", "does not exist")
    assert not target.parent.exists()


def test_npz_without_x(capsys, write_npz, npz_sets):
    bad = write_npz("nox", images=np.zeros((10, 28, 28), dtype=np.uint8), y=np.zeros(10, dtype=np.int64))
    code, out, err = run(capsys, ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", f"npz:{bad}", "-q", *FAST])
    assert_one_line_error(code, out, err, "'x'")


def test_other_usage_errors_are_one_line(capsys, npz_sets):
    for argv in (["rank", "--k", "many"], ["rank", "--nonsense"], ["frobnicate"],
                 ["rank", "--private", f"npz:{npz_sets['priv']}", "--public", f"npz:{npz_sets['near']}", "--k", "0", "-q", *FAST]):
        code, out, err = run(capsys, argv)
        assert_one_line_error(code, out, err)


def test_successful_run_writes_json_and_csv(capsys, npz_sets, tmp_path):
    j, c = tmp_path / "rank.json", tmp_path / "rank.csv"
    priv, near, far = (f"npz:{npz_sets[n]}" for n in ("priv", "near", "far"))
    code, out, err = run(capsys, ["rank", "--private", priv, "--public", far, near, "--model", "fmnist-cnn",
                                  "-m", "40", "--k", "4", "--json", j, "--csv", c, "-q"])
    assert code == 0, err
    assert "Traceback" not in out + err and "error" not in err
    doc = json.loads(j.read_text())
    assert {"private", "model", "k", "examples", "seed", "labels", "row_norm", "results"} <= set(doc)
    assert (doc["private"], doc["model"], doc["k"], doc["examples"], doc["seed"], doc["labels"], doc["row_norm"]) == (
        priv, "fmnist-cnn", 4, 40, 0, "random", "unit"
    )
    results = doc["results"]
    assert len(results) == 2 and {r["public"] for r in results} == {near, far}
    for r in results:
        assert {"public", "distance", "rank"} <= set(r) and 0 <= r["distance"] <= 1
    assert [r["rank"] for r in results] == [1, 2]
    assert results[0]["distance"] <= results[1]["distance"]
    assert results[0]["public"] == near
    rows = list(csv.DictReader(c.open()))
    assert len(c.read_text().strip().splitlines()) == 1 + 2
    assert [r["public"] for r in rows] == [r["public"] for r in results]
    assert [int(r["rank"]) for r in rows] == [1, 2]
    for row, r in zip(rows, results):
        assert float(row["distance"]) == pytest.approx(r["distance"], abs=1e-6)
        assert float(row["min_angle_deg"]) == min(r["principal_angles_deg"])
        assert float(row["max_angle_deg"]) == max(r["principal_angles_deg"])
        assert (row["model"], row["k"], row["private"]) == ("fmnist-cnn", "4", priv)
    # the table on stdout marks the winner and says how to read it
    assert "★ 1" in out and "Lower is closer" in out


def test_rank_help_mentions_row_norm_and_the_authors_choices():
    result = CliRunner().invoke(app, ["rank", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())
    assert "--row-norm" in text and "--labels" in text
    assert "unit" in text and "none" in text
    assert "authors' experiment code" in text and "demo notebook" in text  # which choice is whose
    assert "as the authors do" in text  # random labels
    assert "[default: unit]" in text and "[default: random]" in text


def test_version_and_no_args(capsys):
    code, out, _ = run(capsys, ["--version"])
    assert code == 0 and out.strip().startswith("gsd ")
    code, out, err = run(capsys, [])
    assert code == 0 and "rank" in out + err
