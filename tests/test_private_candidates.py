"""Issue 60, items 1-2: the private set offered as a candidate is refused before the advice trains stage 1 on it,
books anything or caches anything (the DP feature probe, the non-private feature probe, --warm-cache), as the only
candidate and among two; and the DP probe refuses a class count read off the private labels before anything is
decided from it (two neighbouring sets print the same lines and write the same files)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gsd_cli.cli import main

SMALL = ["--model", "fmnist-cnn", "--params", "fc*", "--epochs", "1", "--batch-size", "50", "--expected-size", "400",
         "--public-epochs", "1", "--public-examples", "1000", "-q"]
CLASSES = np.array([str(i) for i in range(10)])


def _npz(path, n, seed, classes=True, last=None):
    """``n`` random 28x28 images with labels 0..9 in turn; ``last``: labels 0..8 in turn, then one more example
    labelled ``last`` (its only example) when ``last`` is not 0 (the neighbour without it when ``last`` is 0)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    y = np.arange(n) % 10
    if last is not None:
        y = np.arange(n) % 9
        y[-1] = last
        if not last:
            x, y = x[:-1], y[:-1]
    extra = {"classes": CLASSES} if classes else {}
    np.savez(path, x=x, y=y, **extra)
    return f"npz:{path}"


@pytest.fixture
def sets(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return {"priv": _npz(tmp_path / "priv.npz", 1200, 1), "pub": _npz(tmp_path / "pub.npz", 1200, 2)}


@pytest.fixture
def no_stage1(monkeypatch):
    """Any stage 1 of the second phase (the probes' and --warm-cache's) fails the test."""
    import gsd_cli.train.probe as probe
    import gsd_cli.train.second_phase as sp

    def trained(*a, **k):
        raise AssertionError("stage 1 was trained")

    monkeypatch.setattr(sp, "run_second_phase", trained)
    monkeypatch.setattr(probe, "stage1_of", trained)


def _nothing_written(tmp_path):
    assert not os.path.exists(os.environ["GSD_LEDGER"]), "something was booked"
    cache = os.environ["GSD_CACHE_DIR"]
    assert not os.path.exists(cache) or not any(files for _, _, files in os.walk(cache)), "something was cached"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("mode", [["--select-epsilon", "0.5", "--epsilon", "2"], ["--epsilon", "2"]], ids=["dp-probe", "probe"])
@pytest.mark.parametrize("others", [0, 1], ids=["only", "among-two"])
@pytest.mark.parametrize("method", ["auto", "second-phase"])
def test_the_private_set_is_never_a_candidate_the_advice_trains_on(sets, tmp_path, capsys, no_stage1, mode, others, method):
    publics = [sets["pub"]] * others + [sets["priv"]]
    code = main(["train", "--private", sets["priv"], "--auto-select", "--method", method, "--public", *publics, *mode, *SMALL,
                 "--out", str(tmp_path / "run")])
    out, err = capsys.readouterr()
    assert code == 2, out + err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "is private data" in lines[0] and "priv.npz" in lines[0], err
    assert "booked" not in out + err and "chose" not in out + err
    _nothing_written(tmp_path)


def test_the_private_set_under_another_spelling_is_refused_by_its_path(sets, tmp_path, capsys, no_stage1):
    code = main(["train", "--private", sets["priv"], "--auto-select", "--public", sets["pub"], "npz:./priv.npz",
                 "--select-epsilon", "0.5", "--epsilon", "2", *SMALL, "--out", str(tmp_path / "run")])
    assert code == 2 and "is private data" in capsys.readouterr().err
    _nothing_written(tmp_path)


def test_a_copy_is_refused_by_content_by_the_non_private_advice_before_its_probe(sets, tmp_path, capsys, no_stage1):
    (tmp_path / "copy.npz").write_bytes((tmp_path / "priv.npz").read_bytes())
    code = main(["train", "--private", sets["priv"], "--auto-select", "--public", sets["pub"], "npz:copy.npz", "--epsilon", "2",
                 *SMALL, "--out", str(tmp_path / "run")])
    assert code == 2 and "same image content" in capsys.readouterr().err
    _nothing_written(tmp_path)


@pytest.mark.parametrize("others", [0, 1], ids=["only", "among-two"])
def test_warm_cache_refuses_the_private_set_before_any_stage_1(sets, tmp_path, capsys, no_stage1, others):
    publics = [sets["pub"]] * others + [sets["priv"]]
    code = main(["train", "--private", sets["priv"], "--auto-select", "--warm-cache", "--public", *publics, *SMALL])
    assert code == 2 and "is private data" in capsys.readouterr().err
    _nothing_written(tmp_path)


def test_the_dp_probe_reads_no_class_count_off_the_private_labels(tmp_path, capsys, monkeypatch, no_stage1):
    """Two neighbouring private sets with no declared class list (the only example of label 9 removed: max(y) + 1
    is 10 against 9, which would decide which candidates are usable, hence M and the noise): both are refused with
    byte-identical lines before anything is decided, booked or written."""
    monkeypatch.chdir(tmp_path)
    pub = _npz(tmp_path / "pub.npz", 1200, 2)
    got = []
    for i, last in enumerate((9, 0)):
        d = tmp_path / f"d{i}"
        d.mkdir()
        priv = _npz(d / "priv.npz", 1201, 1, classes=False, last=last)
        monkeypatch.chdir(d)
        code = main(["train", "--private", "npz:priv.npz", "--auto-select", "--public", pub, "--select-epsilon", "0.5",
                     "--epsilon", "2", *SMALL, "--out", "run"])
        cap = capsys.readouterr()
        got.append((code, cap.out, cap.err, sorted(os.listdir(d))))
        assert priv
    assert got[0] == got[1]
    code, out, err, files = got[0]
    assert code == 2 and out == "" and "declares no class list" in err and files == ["priv.npz"]
    assert not os.path.exists(os.environ["GSD_LEDGER"])
