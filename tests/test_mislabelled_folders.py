"""Issue 64, item 5: a class folder holding a sub-folder counted the sub-folder's images under the parent class with
no word (``gsd datasets check`` said ok), and images of mixed sizes and modes passed silently. Now both are said: by
``gsd datasets check`` (warnings, exit status unchanged) and by a run, once, when it opens the folder or first reads
such images (:class:`gsd_cli.errors.DataWarning`, one ``private: warning:`` line in the CLI)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from gsd_cli.cli import main
from gsd_cli.errors import DataWarning


def _images(folder, n, shape, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)).save(folder / f"{i}.png")


@pytest.fixture
def nested(tmp_path):
    """cat/ (12 grey 8x8) holding kittens/ (6 colour 10x12 images), dog/ (12 grey 8x8)."""
    root = tmp_path / "pets"
    _images(root / "cat", 12, (8, 8))
    _images(root / "cat" / "kittens", 6, (10, 12, 3), 1)
    _images(root / "dog", 12, (8, 8), 2)
    return root


@pytest.fixture
def clean(tmp_path):
    root = tmp_path / "clean"
    _images(root / "cat", 10, (8, 8))
    _images(root / "dog", 10, (8, 8), 2)
    return root


def test_datasets_check_lists_sub_folders_and_mixed_images_as_warnings(nested, clean, capsys):
    assert main(["datasets", "check", f"folder:{nested}", f"folder:{clean}", "-q"]) == 0  # warnings: the exit status stays 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"folder:{nested}: 30 examples, 30 files checked: ok, 3 warning(s)"
    assert "  warning: sub-folder counted as its class: 1: cat/kittens/ (6 images)" in lines
    assert "  warning: mixed image sizes: 2: 8x8 (24 images); 10x12 (6 images)" in lines
    assert "  warning: mixed image modes: 2: grey (24 images); colour (6 images)" in lines
    assert f"folder:{clean}: 20 examples, 20 files checked: ok" in lines and "warning" not in lines[-1]
    assert "private: warning" not in err  # the report says it: no second line from the source itself
    assert main(["datasets", "check", "--quick", f"folder:{nested}"]) == 0  # --quick decodes nothing: sub-folders only
    out = capsys.readouterr().out
    assert "1 warning(s)" in out and "sub-folder counted as its class" in out and "mixed" not in out


def test_a_folder_with_a_class_inside_a_class_is_said_when_opened(nested, clean):
    from gsd_cli.data import read_images, resolve

    with pytest.warns(DataWarning, match=r"cat/ holds kittens/ \(6 images\): a sub-folder's images count as its class"):
        src = resolve(f"folder:{nested}")
    assert len(src) == 30 and src.nested == {"cat": [("kittens", 6)]}
    with pytest.warns(DataWarning, match=r"images of mixed sizes 8x8, 10x12 and modes grey and colour \(as first read\)"):
        read_images(src, list(range(30)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # said once per source
        read_images(src, list(range(30)))
        quiet = resolve(f"folder:{clean}")
        read_images(quiet, list(range(len(quiet))))  # a clean folder says nothing


def test_a_run_says_it_on_one_labelled_line(nested, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["rank", "--private", f"folder:{nested}", "--public", "digits", "-m", "30", "--model", "fmnist-cnn", "-k", "2", "-q"]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 2, err  # once each, however often the folder is opened
    assert err[0].startswith(f"private: warning: folder:{nested}: cat/ holds kittens/ (6 images)")
    assert err[1].startswith(f"private: warning: folder:{nested}: images of mixed sizes")
