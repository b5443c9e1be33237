"""The `gsd` command (gsd_cli.cli.main(argv) -> exit status): success path, outputs, and one-line
errors with exit status 2."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from gsd_cli.cli import app, main

FAST = ["--model", "fmnist-cnn", "--device", "cpu"]


def run(capsys, *argv):
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


# ------------------------------------------------------------------------------ one-line errors


def test_unknown_dataset(capsys, npz_pair):
    code, out, err = run(capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", "mnist-c", "-q", *FAST)
    assert_one_line_error(code, out, err, "unknown dataset", "mnist-c")


def test_k_larger_than_examples(capsys, npz_pair):
    code, out, err = run(capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
                         "-m", "5", "--k", "8", "-q", *FAST)
    assert_one_line_error(code, out, err, "k=8")


def test_fewer_than_two_examples(capsys, npz_pair):
    code, out, err = run(capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
                         "-m", "1", "--k", "1", "-q", *FAST)
    assert_one_line_error(code, out, err, "at least 2")


def test_empty_folder(capsys, empty_dir, npz_pair):
    code, out, err = run(capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"folder:{empty_dir}", "-q", *FAST)
    assert_one_line_error(code, out, err, str(empty_dir))


def test_unreadable_image_with_progress_bar(capsys, garbage_folder, npz_pair):
    """The broken file is found mid-run, after the progress bar started (no -q, 4 chunks)."""
    code, out, err = run(capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"folder:{garbage_folder}",
                         "-m", "7", "--k", "2", "--chunk-size", "2", *FAST)
    assert_one_line_error(code, out, err, "cannot read image", "zz_broken.png")


def test_params_matching_nothing(capsys, npz_pair):
    code, out, err = run(capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
                         "--params", "layer9.*", "-m", "10", "--k", "2", "-q", *FAST)
    assert_one_line_error(code, out, err, "layer9.*", "matches no parameter", "conv1.weight")


def test_bad_labels_choice(capsys):
    code, out, err = run(capsys, "rank", "--labels", "mine", "-q")
    assert_one_line_error(code, out, err, "--labels", "mine")


def test_json_into_missing_folder(capsys, npz_pair, tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "r.json"
    code, out, err = run(capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
                         "-m", "10", "--k", "2", "-q", "--json", target, *FAST)
    assert_one_line_error(code, out, err, "--json", "does not exist")
    assert not target.parent.exists()


def test_npz_without_x(capsys, write_npz, npz_pair):
    bad = write_npz("nox", images=np.zeros((10, 28, 28), dtype=np.uint8), y=np.zeros(10, dtype=np.int64))
    code, out, err = run(capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{bad}", "-q", *FAST)
    assert_one_line_error(code, out, err, "'x'")


def test_other_usage_errors_are_one_line(capsys, npz_pair):
    for argv, needles in (
        (["rank", "--k", "many"], []),
        (["rank", "--nonsense"], ["nonsense"]),
        (["frobnicate"], []),
        (["rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}", "--k", "0", "-q", *FAST], []),
    ):
        code, out, err = run(capsys, *argv)
        assert_one_line_error(code, out, err, *needles)


def test_failed_run_keeps_existing_output(capsys, tmp_path):
    j = tmp_path / "r.json"
    j.write_text("precious")
    code, _, _ = run(capsys, "rank", "--private", "nope", "--json", str(j))
    assert code == 2 and j.read_text() == "precious"


# ------------------------------------------------------------------------------ success


def test_successful_run_writes_json_and_csv(capsys, npz_pair, tmp_path):
    j, c = tmp_path / "rank.json", tmp_path / "rank.csv"
    priv, near, far = (f"npz:{npz_pair[n]}" for n in ("priv", "near", "far"))
    code, out, err = run(capsys, "rank", "--private", priv, "--public", far, near, "--model", "fmnist-cnn",
                         "-m", "40", "--k", "4", "--json", j, "--csv", c, "-q")
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


def test_dp_rank_cli(capsys, npz_pair, tmp_path):
    j = tmp_path / "dp.json"
    code, out, err = run(
        capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
        "--model", "fmnist-cnn", "-m", "40", "--k", "2", "--params", "fc2.*", "--dp", "--epsilon", "2", "--clip", "1",
        "--json", str(j), "-q",
    )
    assert code == 0, err
    assert "DP selection" in out and "epsilon=2" in out  # the default under DP: the DP selection of the winner
    pv = json.loads(j.read_text())["privacy"]
    assert pv["mechanism"] == "permute-and-flip" and pv["epsilon"] == 2 and pv["delta"] == 0 and pv["clip"] == 1
    code, out, err = run(  # DP-GSD by name
        capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
        "--model", "fmnist-cnn", "-m", "40", "--k", "2", "--params", "fc2.*", "--dp", "--epsilon", "2", "--clip", "1",
        "--metric", "dp-gsd", "--json", str(j), "-q",
    )
    assert code == 0, err
    assert "DP-GSD" in out and "epsilon=2" in out
    pv = json.loads(j.read_text())["privacy"]
    assert pv["mechanism"] == "sequential" and pv["epsilon"] == 2 and pv["delta"] == 0 and pv["clip"] == 1
    for bad in (["--epsilon", "0"], ["--epsilon", "-1"], ["--clip", "0", "--epsilon", "1"], ["--mechanism", "gibbs", "--epsilon", "1"], ["--mechanism", "matrix", "--gibbs-sweeps", "0", "--epsilon", "1", "-m", "20", "--k", "2", "--params", "fc.*"]):
        code, out, err = run(capsys, "rank", "--dp", *bad)
        assert_one_line_error(code, out, err)
    code, out, err = run(capsys, "rank", "--epsilon", "1")
    assert_one_line_error(code, out, err)


# ------------------------------------------------------------------------------ help


def test_rank_help_mentions_row_norm_and_the_authors_choices():
    result = CliRunner().invoke(app, ["rank", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0
    text = " ".join(result.output.replace("│", " ").split())
    assert "--row-norm" in text and "--labels" in text and "--chunk-size" in text
    assert "unit" in text and "none" in text
    assert "authors' experiment code" in text and "demo notebook" in text  # which choice is whose
    assert "as the authors do" in text  # random labels
    assert "[default: unit]" in text and "[default: random]" in text


def test_version_and_no_args(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0 and out.strip().startswith("gsd ")
    code, out, _ = run(capsys)
    assert code == 0 and "rank" in out  # no arguments: the help, on stdout


def test_command_help_paragraphs_are_reflowed():
    """Rich keeps a docstring's line breaks; every command's help paragraphs are single lines so that
    help wraps to the terminal instead of coming out ragged."""
    from gsd_cli.cli import cache_app, datasets_app, models_app

    docs = [c.callback.__doc__ for a in (app, datasets_app, cache_app, models_app) for c in a.registered_commands]
    assert len(docs) >= 8 and all(docs)
    for doc in docs:
        assert all("\n" not in p for p in doc.split("\n\n")), doc
    train_doc = next(c.callback.__doc__ for c in app.registered_commands if c.callback.__name__ == "train")
    assert "add/remove-one neighbours, accounted with dp-accounting" in train_doc
