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
    import gsd_cli.advice.probe as probe
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


def _label_space_of_the_run(spec, classes=None):
    from gsd_cli.data import with_classes
    from gsd_cli.train.splits import private_parts

    train, _ = private_parts(spec)
    if classes is not None:
        train = with_classes(train, classes)
    return int(train.num_classes), list(train.classes) if getattr(train, "classes", None) else None, bool(train.multilabel)


def test_warm_cache_reads_the_label_space_alone_and_it_is_the_runs(tmp_path, monkeypatch):
    """Item 5: --warm-cache's private task is its declared label space, read with no example or label of any kind of
    source (npz: its classes array and y's header; a folder: its class folders; a CSV: its header and --classes), and
    it is the label space the advised run trains with (the same stage-1 and subspace keys)."""
    import csv

    from PIL import Image

    import gsd_cli.data.csvsource as cs
    import gsd_cli.data.files as files
    from gsd_cli.data.labelspace import declared_label_space
    from gsd_cli.advice.warm import declared_task

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.savez("named.npz", x=rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), y=np.arange(40) % 4,
             classes=np.array(["a", "b", "c", "d"]))
    np.savez("multi.npz", x=rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), y=rng.integers(0, 2, (40, 3)))
    np.savez("plain.npz", x=rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), y=np.arange(40) % 4)
    for c in ("cat", "dog"):
        for i in range(20):
            (tmp_path / "imgs" / c).mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(tmp_path / "imgs" / c / f"{i}.png")
    with open("t.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        w.writerows([[f"imgs/{c}/{i}.png", c] for c in ("cat", "dog") for i in range(20)])
    cases = [("npz:named.npz", None), ("npz:multi.npz", None), ("npz:plain.npz", 4), ("npz:plain.npz", "w,x,y,z"),
             ("folder:imgs", None), ("csv:t.csv", "cat,dog"), ("npz:named.npz", 4)]
    want = {c: _label_space_of_the_run(*c) for c in cases}

    def read(*a, **k):
        raise AssertionError("a private example or label was read")

    monkeypatch.setattr(files, "list_image_folder", read)
    monkeypatch.setattr(files.ArraySource, "__init__", read)  # what an npz's x and y become
    monkeypatch.setattr(cs, "read_csv_rows", read)
    for (spec, classes), (count, names, multilabel) in want.items():
        got = declared_task(spec, classes=classes)
        assert (got.num_classes, got.classes, got.multilabel) == (count, names, multilabel), (spec, classes)
    from gsd_cli.errors import DatasetError

    with pytest.raises(DatasetError, match="declares no class list"):
        declared_label_space("npz:plain.npz")
    with pytest.raises(DatasetError, match="declares no class list"):
        declared_label_space("csv:t.csv")


def test_gsd_train_runs_the_dp_probe_through_the_audited_call(monkeypatch):
    """The DP advice draws through gsd_cli.privacy.probe_mechanism.run_dp_probe at the plan it booked (the call that
    `gsd audit --method dp-probe` runs end to end), so a wrong z or permute-and-flip epsilon there is what the audit sees."""
    from gsd_cli.data import resolve
    from gsd_cli.privacy import probe_mechanism as pm
    from gsd_cli.train import TrainConfig
    from gsd_cli.advice.dp_probe import dp_probe_advice
    from gsd_cli.train.splits import private_parts

    seen, booked = [], []
    run = pm.run_dp_probe

    def spy(plan, *a, **k):
        seen.append(plan)
        return run(plan, *a, **k)

    monkeypatch.setattr(pm, "run_dp_probe", spy)
    cfg = TrainConfig(method="auto", private="mnist-a", model="fmnist-cnn", params=["fc*"], public_examples=300, public_epochs=1,
                      public_batch_size=100)
    train_part, _ = private_parts("mnist-a")
    dp_probe_advice(train_part, [resolve("mnist-b")], cfg, "auto", epsilon=1.0, delta=1e-6, seed=0, device="cpu",
                    insecure_seed=1, book=lambda *a: booked.append(a))
    want = pm.plan_dp_probe(1.0, 1e-6, 2)
    assert len(seen) == 1 and seen[0] == want
    assert booked[0][0] == 1.0 and list(booked[0][2]) == list(want.curve)


def test_a_base_that_saw_the_private_set_is_refused_before_training(sets, tmp_path, capsys):
    """A `gsd pretrain` base built on what is then the private set (pretrain checked another --private) carries its
    examples, trained without noise, into the released model: `gsd train --weights BASE` refuses it by the identity and
    the path its card records, in one line, before anything is booked."""
    from gsd_cli.train.pretrain import pretrain_base

    pretrain_base([sets["pub"], "npz:./priv.npz"], tmp_path / "base", model="fmnist-cnn", examples=40, epochs=1,
                  batch_size=32, seed=0, device="cpu")
    common = ["--method", "dpsgd", "--model", "fmnist-cnn", "--weights", str(tmp_path / "base"), "--epochs", "1", "--batch-size", "50",
              "--expected-size", "400", "--epsilon", "2", "-q"]
    code = main(["train", "--private", f"npz:{tmp_path / 'priv.npz'}", *common, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "the base's public set" in err and "is private data" in err and len(err.strip().splitlines()) == 1
    _nothing_written(tmp_path)
    (tmp_path / "other.npz").write_bytes((tmp_path / "pub.npz").read_bytes())
    code = main(["train", "--private", "npz:other.npz", *common, "--out", str(tmp_path / "run2")])
    assert code == 0, capsys.readouterr().err  # a base of other sets trains
