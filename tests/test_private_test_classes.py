"""A test set named apart (``--private-test``) has its classes matched to the training set's by name (issue 64):
a test folder without the class "eight" shifted every later folder's sorted position, so each test image was scored
as another class, with no warning. Plain integer labels (an npz without names) keep their index."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gsd_cli.errors import GSDError
from gsd_cli.train.splits import private_parts

TRAIN_CLASSES = ("eight", "five", "one", "two")  # sorted: a test folder without "eight" shifts the other three


def _folder(root: Path, classes, per_class: int = 3) -> str:
    rng = np.random.default_rng(len(classes))
    for c in classes:
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 256, (12, 12), dtype=np.uint8), mode="L").save(root / c / f"{i}.png")
    return f"folder:{root}"


def _label_names(train, test) -> list[tuple[str, str]]:
    """(the test image's class folder, the training class its label names) for every test example."""
    labels = test.labels(np.arange(len(test)))
    return [(Path(test.example_file(i)).parent.name, train.classes[int(y)]) for i, y in enumerate(labels)]


def test_a_test_folder_without_a_class_is_matched_by_name(tmp_path):
    train, test = private_parts(_folder(tmp_path / "train", TRAIN_CLASSES), _folder(tmp_path / "test", ("five", "one", "two")))
    assert test.num_classes == len(TRAIN_CLASSES) and list(test.classes) == list(TRAIN_CLASSES)
    pairs = _label_names(train, test)
    assert len(pairs) == 9 and all(folder == named for folder, named in pairs), pairs


def test_a_test_class_the_training_set_lacks_is_refused(tmp_path):
    with pytest.raises(GSDError, match="has a class that the training set .* does not have") as e:
        private_parts(_folder(tmp_path / "train", TRAIN_CLASSES), _folder(tmp_path / "test", ("five", "nine", "one")))
    assert "nine" not in str(e.value)  # no class name in the line: it may be private


def test_classes_given_by_name_match_both_sets_by_those_names(tmp_path):
    """--classes names a class the training folders lack (no example of it) but the test folder has: both are matched
    to --classes, not the test set to the training folders (which would refuse it)."""
    train, test = private_parts(_folder(tmp_path / "train", ("five", "one")), _folder(tmp_path / "test", ("eight", "one")),
                                classes="one,eight,five")
    assert train.classes == test.classes == ["one", "eight", "five"]
    assert all(folder == named for folder, named in _label_names(train, test))


def test_a_class_count_pads_after_the_matched_names(tmp_path):
    train, test = private_parts(_folder(tmp_path / "train", TRAIN_CLASSES), _folder(tmp_path / "test", ("one", "two")), classes=6)
    assert train.num_classes == test.num_classes == 6 and train.classes == test.classes
    assert all(folder == named for folder, named in _label_names(train, test))


def test_integer_labels_keep_their_index(tmp_path):
    rng = np.random.default_rng(0)
    for name, n_classes in (("train", 4), ("test", 3)):
        np.savez(tmp_path / f"{name}.npz", x=rng.integers(0, 256, (12, 8, 8), dtype=np.uint8), y=np.arange(12) % n_classes,
                 num_classes=np.array(4))
    train, test = private_parts(f"npz:{tmp_path / 'train.npz'}", f"npz:{tmp_path / 'test.npz'}")
    assert np.array_equal(test.labels(np.arange(12)), np.arange(12) % 3)


def test_training_scores_the_test_folder_by_name_and_a_foreign_class_exits_2(tmp_path, monkeypatch, capsys):
    """End to end: the labels the evaluation sees are the training set's classes of the test images' folders; a test
    folder with a class the training set lacks is one line, exit 2, before anything is booked or written."""
    import gsd_cli.train.loop as loop
    from gsd_cli.cli import main
    from gsd_cli.privacy import budget as B
    from gsd_cli.train import TrainConfig, train

    seen = []
    real = loop.evaluate
    monkeypatch.setattr(loop, "evaluate", lambda model, src, *a, **k: seen.append(src) or real(model, src, *a, **k))
    private = _folder(tmp_path / "train", TRAIN_CLASSES, per_class=8)
    cfg = TrainConfig(private=private, private_test=_folder(tmp_path / "test", ("five", "one", "two")), method="dpsgd",
                      epochs=1, batch_size=10, epsilon=4.0, insecure_seed=0)
    train(cfg, tmp_path / "run")
    assert seen and all(folder == named for folder, named in _label_names(seen[0], seen[0]))
    booked = sum(len(d["runs"]) for d in B.BudgetLedger().status())
    capsys.readouterr()
    run = tmp_path / "run2"
    code = main(["train", "--private", private, "--private-test", _folder(tmp_path / "test2", ("five", "nine")), "--method", "dpsgd",
                 "--epochs", "1", "--batch-size", "10", "--epsilon", "4", "--out", str(run)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "does not have" in lines[0] and "Traceback" not in err, err
    assert not run.exists() and sum(len(d["runs"]) for d in B.BudgetLedger().status()) == booked
