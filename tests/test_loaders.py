"""Loaders (issue 19): empty label cells, a byte-order mark, hidden files, one-class sets, datasets with
most listed images missing, --delta against 1/N, gsd train --data-root."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from gsd_cli.cli import main
from gsd_cli.data import resolve
from gsd_cli.data.csvsource import csv_source
from gsd_cli.data.files import FolderSource
from gsd_cli.data.published import notes_of
from gsd_cli.errors import DatasetError, GSDError
from gsd_cli.train import TrainConfig, train


def _png(path, value=128, size=8):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((size, size), value, dtype=np.uint8)).save(path)


def _one_line(code, err, *words):
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    for w in words:
        assert w in lines[0], err


def test_empty_label_cells_are_an_error_naming_the_lines(tmp_path):
    for i in range(4):
        _png(tmp_path / f"{i}.png", 40 * i)
    f = tmp_path / "d.csv"
    f.write_text("path,label\n0.png,cat\n1.png,\n2.png,dog\n3.png,  \n")
    with pytest.raises(DatasetError, match=r"empty label cell.*'label'.*line\(s\) 3, 5"):
        csv_source(f)
    f.write_text("path,a,b\n0.png,1,0\n1.png,,1\n2.png,0,1\n")
    with pytest.raises(DatasetError, match=r"empty label.*line\(s\) 3"):
        csv_source(f, label_columns=["a", "b"])
    f.write_text("path,label\n0.png,cat\n,dog\n")
    with pytest.raises(DatasetError, match=r"empty image.*line\(s\) 3"):
        csv_source(f)


def test_a_csv_with_a_byte_order_mark_is_read(tmp_path):
    for i in range(2):
        _png(tmp_path / f"{i}.png")
    f = tmp_path / "excel.csv"
    f.write_bytes("\ufeffpath,label\n0.png,cat\n1.png,dog\n".encode("utf-8"))
    src = csv_source(f)
    assert len(src) == 2 and src.classes == ["cat", "dog"]


def test_hidden_files_are_skipped_in_folders(tmp_path):
    for cls in ("a", "b"):
        _png(tmp_path / cls / "x.png")
        (tmp_path / cls / "._x.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
        (tmp_path / cls / ".DS_Store").write_bytes(b"\x00")
        (tmp_path / cls / "Thumbs.db").write_bytes(b"\x00")
        _png(tmp_path / cls / ".ipynb_checkpoints" / "y.png")
    _png(tmp_path / "__MACOSX" / "a" / "z.png")
    _png(tmp_path / ".hidden" / "w.png")
    src = FolderSource(tmp_path)
    assert src.classes == ["a", "b"] and len(src) == 2
    assert [np.asarray(im).shape for im in src.images([0, 1])] == [(8, 8), (8, 8)]
    # the published layouts too (kagskin: {train,test}/{benign,malignant})
    root = tmp_path / "root"
    for split in ("train", "test"):
        for cls in ("benign", "malignant"):
            _png(root / "kagskin" / split / cls / "1.jpg")
            (root / "kagskin" / split / cls / "._1.jpg").write_bytes(b"\x00")
    assert len(resolve("kagskin:train", root=root)) == 2


def test_a_one_class_set_is_refused_for_training_but_ranks(tmp_path, capsys):
    for i in range(12):
        _png(tmp_path / "one" / "only" / f"{i}.png", 10 * i)
    code = main(["train", "--private", f"folder:{tmp_path / 'one'}", "--method", "dpsgd", "--epochs", "1",
                 "--batch-size", "4", "--out", str(tmp_path / "run"), "-q"])
    _one_line(code, capsys.readouterr().err, "one-class set")
    # declared two classes, but every training example in one of them: trained (a refusal read off the
    # private labels would tell that they are all alike; issue 32)
    x = (np.random.default_rng(0).uniform(size=(40, 8, 8)) * 255).astype(np.uint8)
    np.savez(tmp_path / "p.npz", x=x, y=np.zeros(40, dtype=np.int64), classes=np.array(["a", "b"]))
    assert train(TrainConfig(private=f"npz:{tmp_path / 'p.npz'}", method="dpsgd", epochs=1, batch_size=8), tmp_path / "r2")["dp"]
    # as a public candidate of gsd rank it is fine
    np.savez(tmp_path / "q.npz", x=x, y=np.arange(40) % 4, classes=np.array(["a", "b", "c", "d"]))
    code = main(["rank", "--private", f"npz:{tmp_path / 'q.npz'}", "--public", f"folder:{tmp_path / 'one'}",
                 "--model", "fmnist-cnn", "--k", "2", "--examples", "12", "-q", "--no-cache"])
    assert code == 0, capsys.readouterr().err


def _chestxray(root, listed=1000, present=1):
    base = root / "chestxray"
    rows = [f"{i:08d}_000.png,{'No Finding' if i % 2 else 'Effusion'}" for i in range(listed)]
    base.mkdir(parents=True)
    (base / "Data_Entry_2017_v2020.csv").write_bytes(("\ufeffImage Index,Finding Labels\n" + "\n".join(rows) + "\n").encode())
    for i in range(present):
        _png(base / "images_001" / "images" / f"{i:08d}_000.png", 20 * i)
    return base


def test_a_dataset_with_most_images_missing_has_a_note(tmp_path):
    _chestxray(tmp_path, 1000, 3)
    src = resolve("chestxray", root=tmp_path)
    assert len(src) == 3
    (note,) = notes_of(src)
    assert "only 3 of the 1,000 images listed in Data_Entry_2017_v2020.csv" in note and "997 others" in note
    assert notes_of(resolve("chestxray:train", root=tmp_path)) == [note]  # a split keeps the note of its set
    full = tmp_path / "full"
    _chestxray(full, 4, 4)
    assert notes_of(resolve("chestxray", root=full)) == []


def _priv(tmp_path, n=60, name="priv.npz"):
    rng = np.random.default_rng(1)
    x = (rng.uniform(size=(n, 8, 8)) * 255).astype(np.uint8)
    np.savez(tmp_path / name, x=x, y=np.arange(n) % 2, classes=np.array(["a", "b"]))
    return tmp_path / name


def test_delta_at_or_above_one_over_n_warns_privately(tmp_path, capsys):
    p = _priv(tmp_path)
    run = tmp_path / "run"
    code = main(["train", "--private", f"npz:{p}", "--method", "dpsgd", "--epochs", "1", "--batch-size", "10",
                 "--delta", "0.05", "--out", str(run), "-q"])
    err = capsys.readouterr().err
    assert code == 0, err
    # the exact N: on a line labelled private only (issue 43), and in private-summary.json
    warn = [l for l in err.splitlines() if l.startswith("private: warning:") and "--delta" in l]
    n = json.loads((run / "private-summary.json").read_text())["private_train_examples"]
    assert len(warn) == 1 and f"for the N = {n} private" in warn[0] and "1/N" in warn[0]
    assert any("--delta" in x for x in json.loads((run / "private-summary.json").read_text())["notes"])
    summary = json.loads((run / "summary.json").read_text())
    assert f"N = {n} private" not in json.dumps(summary)
    # the public warning (and summary.json's note) is on the DP estimate N~ that sets the mechanism, never N
    n_est = summary["privacy"]["size"]["size"]
    public = [l for l in err.splitlines() if l.startswith("warning:") and "--delta" in l]
    assert [f"for N = {n_est}, the DP estimate" in l for l in public] == ([True] if 0.05 >= 1 / n_est else [])
    run2 = tmp_path / "run2"
    code = main(["train", "--private", f"npz:{p}", "--method", "dpsgd", "--epochs", "1", "--batch-size", "10",
                 "--delta", "1e-5", "--out", str(run2), "-q"])
    assert code == 0 and "--delta" not in capsys.readouterr().err


def test_train_takes_data_root_and_warns_of_missing_images(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GSD_DATA_ROOT", raising=False)
    root = tmp_path / "data"
    base = root / "chestxray"
    base.mkdir(parents=True)
    rows = [f"{i:08d}_000.png,{'No Finding' if i % 2 else 'Effusion'}" for i in range(400)]
    (base / "Data_Entry_2017.csv").write_text("Image Index,Finding Labels\n" + "\n".join(rows) + "\n")
    for i in range(40):
        _png(base / "images" / f"{i:08d}_000.png", 5 * i)
    import os

    run = tmp_path / "run"
    code = main(["train", "--private", "chestxray", "--data-root", str(root), "--method", "dpsgd", "--epochs", "1",
                 "--batch-size", "8", "--out", str(run), "-q"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "GSD_DATA_ROOT" not in os.environ  # restored after the command
    warn = [l for l in err.splitlines() if "only 40 of the 400" in l]
    assert len(warn) == 1 and warn[0].startswith("private: warning:"), err  # how many images the private set has: private
    assert "only 40" not in (run / "summary.json").read_text()
    code = main(["train", "--private", "chestxray", "--method", "dpsgd", "--out", str(tmp_path / "r3"), "-q",
                 "--data-root", str(tmp_path / "nowhere")])
    _one_line(code, capsys.readouterr().err, "chestxray")
