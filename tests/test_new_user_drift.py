"""Issue 64, item 6: what a new user met that no longer matched the docs or the tool's own promises (a file's
draws keyed by the path as typed, an out-of-range --seed, gsd rank's long validity paragraph, a warning about an
option the user never set, gsd budget show's DP column and wrapped commands, --resume of a run stopped before its
training started)."""

from __future__ import annotations

import numpy as np
import pytest

from gsd_cli.cli import main


@pytest.fixture
def npz_file(tmp_path, monkeypatch):
    """An npz of 60 small images in ``tmp_path``, the working folder."""
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "x.npz", x=(rng.uniform(size=(60, 8, 8)) * 255).astype(np.uint8), y=rng.integers(0, 3, 60),
             classes=np.array(["a", "b", "c"]))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "x.npz"


def test_a_file_draws_the_same_examples_and_labels_however_its_path_is_typed(npz_file):
    """Three spellings of one npz gave three different draws (and distances 0.509 / 0.530 / 0.521)."""
    from gsd_cli.data import draw, resolve
    from gsd_cli.data.identity import draw_key
    from gsd_cli.distance.side import sample_labels

    spellings = ["npz:x.npz", "npz:./x.npz", f"npz:{npz_file}", f"npz:{npz_file.parent}/../{npz_file.parent.name}/x.npz"]
    drawn = [draw(resolve(s), 20, seed=3) for s in spellings]
    for d in drawn[1:]:
        assert np.array_equal(d.indices, drawn[0].indices)
    labels = [sample_labels(d, "random", 10, seed=3) for d in drawn]
    for y in labels[1:]:
        assert y.tolist() == labels[0].tolist()
    assert len({draw_key(s + ":train") for s in spellings}) == 1 and draw_key("npz:x.npz:train").endswith(":train")
    # a built-in name is its own key (the embedded sets' draws and gsd rank's default table are unchanged); an alias is
    # its canonical name's
    for name in ("mnist-a", "mnist-a:train", "digits", "noise", "reference:noise@28"):
        assert draw_key(name) == name
    assert draw_key("fmnist:test") == "fashionmnist:test"


@pytest.mark.parametrize("argv", [
    ["rank", "--public", "digits", "-m", "20", "--model", "fmnist-cnn", "-q", "--seed", str(2**64)],
    ["rank", "--dp", "--epsilon", "1", "--public", "digits", "-m", "20", "-q", "--insecure-seed", str(2**63)],
    ["train", "--method", "dpsgd", "--seed", str(2**64), "-q"],
    ["audit", "--method", "dpsgd", "--epsilon", "1", "--canaries", "10", "--seed", str(2**64)],
    ["compare", "--methods", "dpsgd", "--seeds", "2", "--seed", str(2**63 - 1), "-q"],
])
def test_a_seed_outside_0_to_2_63_is_refused_in_one_line(argv, tmp_path, monkeypatch, capsys):
    """--seed 2^64 stopped with "Overflow when unpacking long long" (an internal error, exit 3, in gsd audit)."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2^63 - 1" in err[0] and "Overflow" not in err[0], err
    assert not any(tmp_path.iterdir())  # nothing written


def test_the_largest_seed_is_accepted():
    from gsd_cli.privacy.randomness import MAX_SEED, check_seed

    check_seed("--seed", MAX_SEED)
    check_seed("--seed", 0)
    with pytest.raises(Exception, match="2\\^63 - 1"):
        check_seed("--seed", MAX_SEED + 1)


def test_gsd_rank_prints_the_validity_paragraph_only_when_asked(tmp_path, monkeypatch, capsys):
    """gsd rank printed a 25-line validity paragraph under its table, also under -q, which the README's output does
    not show: now only with --validity."""
    monkeypatch.chdir(tmp_path)
    argv = ["rank", "--public", "digits", "noise", "-m", "20", "--model", "fmnist-cnn", "-k", "4", "-q"]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    assert "Lower is closer" in plain and "One draw: no interval" in plain
    assert "Earlier (held-out" not in plain and "Advice (gsd train" not in plain and "round 6" not in plain
    assert main([*argv, "--validity"]) == 0
    asked = capsys.readouterr().out
    assert "Earlier (held-out" in " ".join(asked.split()) and "Advice (gsd train" in " ".join(asked.split())
    assert asked.index("Lower is closer") < asked.index("Advice") < asked.index("One draw")


def test_gep_says_nothing_about_an_anchor_batch_the_user_never_set():
    """The DICOM tutorial (100 public examples) warned twice that "--anchor-batch 128 is more than the 100 public
    examples": 128 is the default, which takes all of fewer. A value the user gave is still said."""
    from gsd_cli.train.config import DEFAULT_ANCHOR_BATCH, TrainConfig
    from gsd_cli.train.gep import clamp_notes

    assert TrainConfig().anchor_batch == DEFAULT_ANCHOR_BATCH == 128
    assert clamp_notes(10, [1000], 100, DEFAULT_ANCHOR_BATCH, 100, [10]) == []
    told = clamp_notes(10, [1000], 100, 200, 100, [10])
    assert len(told) == 1 and "--anchor-batch 200 is more than the 100 public examples" in told[0]
    assert "below --k" in clamp_notes(10, [1000], 100, 5, 10, [10])[0]


def test_budget_show_marks_a_non_private_selection_not_dp_and_keeps_each_command_on_one_line(tiny, tmp_path, capsys):
    """gsd budget show listed a run trained after a non-private --auto-select as DP "yes", and its command column
    wrapped the command a word a line."""
    import gsd_cli
    from gsd_cli.cli.budget import dp_cell
    from gsd_cli.privacy import budget as B
    from gsd_cli.privacy.budget.hooks import NON_PRIVATE_SELECTION
    from gsd_cli.train import TrainConfig, train

    ranking = gsd_cli.rank(tiny["private"], [tiny["public"]], model="fmnist-cnn", k=2, examples=30, seed=0)  # not DP
    cfg = TrainConfig(private=tiny["private"], method="dpsgd", epochs=1, batch_size=30, physical_batch=64, public_examples=40)
    chosen = train(cfg, tmp_path / "chosen", selection=ranking.to_dict())
    assert chosen["dp"] is False
    # the advice's stage 1 read --public-examples: not "unused" when it then chose DP-SGD (the tutorial warned so)
    assert not any("--public-examples" in n for n in chosen["notes"]), chosen["notes"]
    # the NOT-DP line says how to make the advice DP (nothing told a user of the non-private advice)
    told = [n for n in chosen["notes"] if "NOT differentially private" in n]
    assert len(told) == 1 and "--select-epsilon" in told[0]
    argv = ["train", "--private", tiny["private"], "--method", "dpsgd", "--epochs", "1", "--batch-size", "30",
            "--physical-batch", "64", "--lr", "0.1", "--out", str(tmp_path / "plain"), "-q"]
    assert main(argv) == 0
    runs = B.BudgetLedger().status()[0]["runs"]
    assert [r["dp"] for r in runs] == [False, True] and NON_PRIVATE_SELECTION in runs[0]["what"]
    assert [dp_cell(r) for r in runs] == ["no (selection)", "yes"]
    assert dp_cell({"dp": False, "guarantee": True, "what": "training (dpsgd)"}) == "no (seeded)"
    capsys.readouterr()
    assert main(["budget", "show"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert any("no (selection)" in line for line in shown)
    assert f"  2. gsd {' '.join(argv)}" in shown  # the whole command on one line


def test_resume_of_a_run_interrupted_before_its_training_says_so(tmp_path, monkeypatch, capsys):
    """An --auto-select interrupted in its selection, then --resume, said "no such folder": nothing was trained there.
    A run stopped hard leaves its folder holding only the run's lock file; one stopped by Ctrl-C leaves no folder."""
    monkeypatch.chdir(tmp_path)
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / ".gsd-run.lock").write_text("12345\n")
    assert main(["train", "--resume", str(stopped)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "interrupted before its training started" in err[0] and f"run it again with --out {stopped}" in err[0]
    assert main(["train", "--resume", str(tmp_path / "gone")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such folder" in err[0] and "interrupted before its training started" in err[0], err
    assert [p.name for p in stopped.iterdir()] == [".gsd-run.lock"] and not (tmp_path / "gone").exists()
