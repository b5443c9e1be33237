"""The `gsd` command: success path, outputs, and one-line errors with exit status 2."""

import csv
import json

import pytest
from typer.testing import CliRunner

from gsd_cli.cli import app, main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_rank_writes_json_and_csv(capsys, npz_pair, tmp_path):
    j, c = tmp_path / "r.json", tmp_path / "r.csv"
    code, out, err = run(
        capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
        f"npz:{npz_pair['far']}", "--model", "fmnist-cnn", "-m", "40", "--k", "4", "--json", str(j), "--csv", str(c), "-q",
    )
    assert code == 0, err
    assert "★" in out and "Lower is closer" in out
    doc = json.loads(j.read_text())
    assert doc["k"] == 4 and doc["examples"] == 40 and doc["model"] == "fmnist-cnn"
    assert [r["rank"] for r in doc["results"]] == [1, 2]
    assert doc["results"][0]["public"] == f"npz:{npz_pair['near']}"
    rows = list(csv.DictReader(c.open()))
    assert len(rows) == 2 and rows[0]["public"] == doc["results"][0]["public"]
    assert float(rows[0]["distance"]) == pytest.approx(doc["results"][0]["distance"], abs=1e-6)


def _one_line_error(code, err):
    assert code == 2
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--private", "no-such-set"], "unknown dataset"),
        (["--k", "500", "-m", "100"], "k=500"),
        (["-m", "1"], "at least 2"),
        (["--params", "classifier.*"], "matches no parameter"),
        (["--labels", "maybe"], "--labels"),
        (["--json", "/no/such/folder/r.json"], "does not exist"),
        (["--no-such-option"], "no-such-option"),
    ],
)
def test_bad_input_one_line(capsys, args, needle):
    code, _, err = run(capsys, "rank", *args)
    _one_line_error(code, err)
    assert needle in err


def test_bad_datasets_one_line(capsys, tmp_path, image_folder):
    (tmp_path / "empty").mkdir()
    code, _, err = run(capsys, "rank", "--private", f"folder:{tmp_path / 'empty'}")
    _one_line_error(code, err)
    (image_folder / "dogs" / "3.png").write_bytes(b"\x89PNG garbage")
    code, _, err = run(capsys, "rank", "--private", f"folder:{image_folder}", "--public", "digits", "--k", "2", "-q")
    _one_line_error(code, err)
    assert "cannot read image" in err
    import numpy as np

    np.savez(tmp_path / "nox.npz", images=np.zeros((3, 4, 4)))
    code, _, err = run(capsys, "rank", "--public", f"npz:{tmp_path / 'nox.npz'}")
    _one_line_error(code, err)


def test_failed_run_keeps_existing_output(capsys, tmp_path):
    j = tmp_path / "r.json"
    j.write_text("precious")
    code, _, _ = run(capsys, "rank", "--private", "nope", "--json", str(j))
    assert code == 2 and j.read_text() == "precious"


def test_help_documents_choices():
    res = CliRunner().invoke(app, ["rank", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    assert "--row-norm" in text and "experiment code" in text and "demo notebook" in text
    assert "--labels" in text and "--chunk-size" in text


def test_no_arguments_prints_help(capsys):
    code, out, _ = run(capsys)
    assert code == 0 and "rank" in out


def test_dp_rank_cli(capsys, npz_pair, tmp_path):
    j = tmp_path / "dp.json"
    code, out, err = run(
        capsys, "rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
        "--model", "fmnist-cnn", "-m", "40", "--k", "2", "--params", "fc2.*", "--dp", "--epsilon", "2", "--clip", "1",
        "--json", str(j), "-q",
    )
    assert code == 0, err
    assert "DP-GSD" in out and "epsilon=2" in out
    pv = json.loads(j.read_text())["privacy"]
    assert pv["mechanism"] == "sequential" and pv["epsilon"] == 2 and pv["delta"] == 0 and pv["clip"] == 1
    for bad in (["--epsilon", "0"], ["--epsilon", "-1"], ["--clip", "0", "--epsilon", "1"], ["--mechanism", "gibbs", "--epsilon", "1"], ["--mechanism", "matrix", "--gibbs-sweeps", "0", "--epsilon", "1", "-m", "20", "--k", "2", "--params", "fc.*"]):
        code, _, err = run(capsys, "rank", "--dp", *bad)
        _one_line_error(code, err)
    code, _, err = run(capsys, "rank", "--epsilon", "1")
    _one_line_error(code, err)


def test_command_help_paragraphs_are_reflowed():
    """Rich keeps a docstring's line breaks; every command's help paragraphs are single lines so that
    help wraps to the terminal instead of coming out ragged."""
    from gsd_cli.cli import app, cache_app, datasets_app, models_app

    docs = [c.callback.__doc__ for a in (app, datasets_app, cache_app, models_app) for c in a.registered_commands]
    assert len(docs) >= 8 and all(docs)
    for doc in docs:
        assert all("\n" not in p for p in doc.split("\n\n")), doc
    train_doc = next(c.callback.__doc__ for c in app.registered_commands if c.callback.__name__ == "train")
    assert "add/remove-one neighbours, accounted with dp-accounting" in train_doc
