"""Issue 44, "the rest": options that do not apply are said (rank: refused; train and audit: one
warning line, and in summary.json's notes), values GEP cannot take as given are said, and a CSV that
names a column twice or holds 'nan' labels is refused in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from gsd_cli.cli import main
from gsd_cli.data import resolve
from gsd_cli.errors import DatasetError
from gsd_cli.train import TrainConfig, train
from gsd_cli.train.config import unused_note
from gsd_cli.train.gep import clamp_notes

RANK = ["rank", "-m", "8", "-k", "2", "--model", "fmnist-cnn", "--params", "fc*", "-q", "--public", "mnist-b"]


def _lines(err):
    return [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize("extra, option", [(["--mechanism", "xyz"], "--mechanism"), (["--mechanism", "matrix"], "--mechanism"),
                                           (["--gibbs-sweeps", "3"], "--gibbs-sweeps"), (["--clip", "0.5"], "--clip")])
def test_rank_refuses_a_dp_option_without_dp(extra, option, capsys):
    code = main([*RANK, *extra])
    lines = _lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {option} is only used with --dp") and "add --dp" in lines[0]


def test_unused_note_names_the_options_and_their_method():
    assert unused_note("dpsgd", ["groups", "k", "clip"]) == ("--groups, --k are not used by --method dpsgd (settings of "
                                                             "--method gep): ignored")
    assert unused_note("gep", ["clip"]).startswith("--clip is not used by --method gep")
    assert unused_note("rgp", ["power_iters", "rgp_rank", "clip"]) is None  # all RGP's
    assert unused_note("second-phase", ["public_examples", "public_lr"]) is None


def test_train_warns_of_another_methods_option_and_notes_it(tiny, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--private", tiny["private"], "--method", "dpsgd", "--groups", "layer", "--topk-fraction", "0.5",
                 "--epochs", "1", "--batch-size", "30", "--insecure-seed", "1", "--out", str(run), "-q"])
    err = capsys.readouterr().err
    assert code == 0, err
    said = "--groups, --topk-fraction are not used by --method dpsgd (settings of --method gep or topagg): ignored"
    assert f"warning: {said}" in " ".join(err.split())
    assert said in json.loads((run / "summary.json").read_text())["notes"]


def test_audit_warns_of_an_option_its_method_does_not_use(capsys):
    code = main(["audit", "--method", "dpsgd", "--topk-fraction", "0", "--canaries", "20", "--examples", "8",
                 "--insecure-seed", "1"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 0, err
    assert "warning: --topk-fraction is not used by --method dpsgd (settings of --method topagg): ignored" in err


def test_gep_says_what_it_cannot_take_as_given():
    assert clamp_notes(32, [1000, 500], 2000, 128, 128, [18, 13]) == []  # the defaults: nothing to say
    notes = clamp_notes(1_000_000, [1000], 40, 1_000_000, 40, [40])
    assert notes[0] == "--anchor-batch 1000000 is more than the 40 public examples: every basis recomputation uses all 40"
    assert notes[1].startswith("--k 1000000 is more than GEP's basis can hold here: it uses 40 directions in 1 group(s)")
    assert clamp_notes(32, [1000], 2000, 10, 32, [32]) == ["--anchor-batch 10 is below --k 32: raised to 32 anchors per basis "
                                                           "recomputation"]


def test_a_gep_run_with_clamped_settings_says_so(tiny, tmp_path):
    cfg = TrainConfig(private=tiny["private"], public=tiny["public"], method="gep", k=1_000_000, anchor_batch=1_000_000,
                      public_examples=40, epochs=1, batch_size=30, insecure_seed=1)
    said = []
    s = train(cfg, tmp_path / "run", notify=said.append)
    text = [str(n) for n in said]
    assert any(n.startswith("--anchor-batch 1000000 is more than the 40 public examples") for n in text), text
    assert any(n.startswith("--k 1000000 is more than GEP's basis can hold here") for n in text), text
    assert sum(n.startswith("--k 1000000") for n in s["notes"]) == 1


@pytest.fixture
def csv_dir(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray((rng.uniform(size=(8, 8)) * 255).astype(np.uint8)).save(tmp_path / f"{i}.png")
    return tmp_path


@pytest.mark.parametrize("text, words", [
    ("path,label,label\n0.png,a,b\n1.png,b,a\n2.png,a,a\n3.png,b,b\n", ["names column 'label' twice (columns 2 and 3)"]),
    ("path,Label,label \n0.png,a,b\n1.png,b,a\n2.png,a,a\n3.png,b,b\n", ["twice (columns 2 and 3)"]),
    ("path,label\n0.png,a\n1.png,nan\n2.png,b\n3.png,NaN\n", ["label 'nan'", "line(s) 3, 5"]),
    ("path,label\n0.png,a|nan\n1.png,b\n2.png,b\n3.png,a\n", ["label 'nan'", "line(s) 2"]),
])
def test_a_csv_with_a_duplicated_column_or_nan_labels_is_refused(csv_dir, text, words, capsys):
    (csv_dir / "t.csv").write_text(text)
    with pytest.raises(DatasetError) as e:
        resolve(f"csv:{csv_dir / 't.csv'}")
    for w in words:
        assert w in str(e.value)
    code = main(["datasets", "show", f"csv:{csv_dir / 't.csv'}"])
    lines = _lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), lines


def test_named_label_columns_with_a_missing_value_are_refused(csv_dir):
    from gsd_cli.data.csvsource import csv_source

    (csv_dir / "m.csv").write_text("path,a,b\n0.png,1,<NA>\n1.png,0,1\n2.png,1,0\n3.png,0,nan\n")
    with pytest.raises(DatasetError, match="label 'nan'.*'a', 'b' on line\\(s\\) 2, 5"):
        csv_source(csv_dir / "m.csv", label_columns=["a", "b"])


def test_a_csv_with_a_trailing_comma_and_named_nan_columns_still_loads(csv_dir):
    (csv_dir / "ok.csv").write_text("path,label,\n0.png,a,\n1.png,b,\n2.png,a,\n3.png,b,\n")
    assert len(resolve(f"csv:{csv_dir / 'ok.csv'}")) == 4
    (csv_dir / "ml.csv").write_text("path,nan_flag,b\n0.png,1,0\n1.png,0,1\n2.png,1,0\n3.png,0,1\n")  # 'nan' in a name only
    assert len(resolve(f"csv:{csv_dir / 'ml.csv'}")) == 4
