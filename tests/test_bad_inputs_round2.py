"""Bad input, round 2 (issue 36): the sweep's cases that destroyed files, gave silently wrong results,
ended in an internal error (exit 3) or said something misleading. Each case: exit 2 (or the right
result), one ``error:`` line, no traceback, and the user's files intact. Tiny inputs (fmnist-cnn's fc
layers, m = 20, k = 2); most cases fail before any gradient."""

from __future__ import annotations

import csv
import json
import os
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from gsd_cli.cli import main

R = ["rank", "-m", "20", "-k", "2", "--model", "fmnist-cnn", "--params", "fc*", "-q"]
T = ["train", "--method", "dpsgd", "--epochs", "1", "--batch-size", "20", "--model", "fmnist-cnn", "--params", "fc*", "-q"]


def _png_header_only(path: Path, side: int = 20000) -> None:
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad2")
    rng = np.random.default_rng(36)
    y = np.arange(40) % 4
    u8 = lambda *shape: (rng.uniform(size=shape) * 255).astype(np.uint8)  # noqa: E731
    np.savez(root / "priv.npz", x=u8(40, 16, 16), y=y, classes=np.array(list("abcd")))
    np.savez(root / "pub.npz", x=u8(40, 16, 16), y=y)
    np.savez(root / "rgb.npz", x=u8(40, 16, 16, 3), y=y, classes=np.array(list("abcd")))
    np.savez(root / "u16.npz", x=(rng.uniform(size=(40, 8, 8)) * 65535).astype(np.uint16), y=y)
    np.savez(root / "i64.npz", x=u8(40, 8, 8).astype(np.int64) * 300, y=y)
    np.savez(root / "multi2.npz", x=u8(40, 16, 16), y=np.stack([y % 2, (y == 3) * 2], 1))
    np.savez(root / "biglabel.npz", x=u8(40, 16, 16), y=np.where(np.arange(40) == 0, 10**12, y))
    np.savez(root / "numclasses.npz", x=u8(40, 16, 16), y=y, num_classes=np.int64(10**7))
    for cls in ("a", "b"):  # a folder source, a float-TIFF folder
        (root / "folder" / cls).mkdir(parents=True)
        (root / "tif" / cls).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(u8(12, 12)).save(root / "folder" / cls / f"{i}.png")
            Image.fromarray(rng.uniform(size=(12, 12)).astype(np.float32)).save(root / "tif" / cls / f"{i}.tif")
    Image.fromarray(np.full((12, 12), 1e30, np.float32)).save(root / "tif" / "a" / "0.tif")
    for cls in ("a", "b"):  # what datasets check must read as rank does
        (root / "chk" / cls).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(u8(12, 12)).save(root / "chk" / cls / f"{i}.png")
    png = (root / "chk" / "a" / "0.png").read_bytes()
    (root / "chk" / "a" / "0.png").write_bytes(png[: len(png) // 2])  # truncated
    _png_header_only(root / "chk" / "b" / "big.png")  # 20000 x 20000, header only
    Image.fromarray(np.full((12, 12), np.nan, np.float32)).save(root / "chk" / "b" / "nan.tif")
    imgs = sorted((root / "folder").rglob("*.png"))
    with open(root / "list.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        w.writerows([[str(p), p.parent.name] for p in imgs])
    with open(root / "one.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label"])
        w.writerows([[str(p), "cat"] for p in imgs])
    (root / "nan.py").write_text(
        "import torch.nn as nn\n"
        "class Net(nn.Module):\n"
        "    def __init__(self, n):\n        super().__init__()\n        self.fc = nn.Linear(256, n)\n"
        "    def forward(self, x):\n        return self.fc(x.flatten(1)) * float('nan')\n"
        "def make(num_classes):\n    return Net(num_classes)\n")
    return root


def _run(capsys, argv, d) -> tuple[int, str]:
    got = main([a.format(d=d) for a in argv])
    _, err = capsys.readouterr()
    return got, err


def _one_error_line(err: str) -> str:
    info = ("warning:", "plan:", "booked epsilon", "created the privacy ledger", "private:")  # a run's information lines
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(info)]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    return lines[0]


def _catalogue(d: Path, name: str, body: str, prefix: str = "") -> Path:
    path = d / f"{name}.toml"
    path.write_text(prefix + f'[datasets.p]\nsource = "npz"\npath = "{d / "priv.npz"}"\n{body}')
    return path


JOB = '[[jobs]]\nprivate = "p"\ncandidates = ["mnist-b"]\n[jobs.options]\n'

CASES = [
    # sizes checked before allocating
    ("dp-sketch-huge", [*R, "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--dp-sketch", "100000000000"], "of memory"),
    ("dp-classes-1e9", [*R, "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--dp", "--epsilon", "1",
                        "--classes", "1000000000"], "at most 1,000,000 classes"),
    ("classes-1e7", [*R, "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--classes", "10000000"], "1,000,000"),
    ("npz-label-1e12", [*R, "--private", "npz:{d}/biglabel.npz", "--public", "npz:{d}/pub.npz"], "more than 1,000,000 classes"),
    ("npz-num-classes-1e7", [*R, "--private", "npz:{d}/numclasses.npz", "--public", "npz:{d}/pub.npz"], "declares more than"),
    ("weights-dev-zero", [*R, "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--weights", "/dev/zero"], "not a regular file"),
    ("audit-canaries-1e9", ["audit", "--method", "dpsgd", "--canaries", "1000000000"], "of memory"),
    # numbers refused up front
    ("dp-epsilon-1e308", [*R, "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--dp", "--epsilon", "1e308"], "at most 1e+12"),
    ("dp-clip-1e-300", [*R, "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--dp", "--epsilon", "1",
                        "--clip", "1e-300"], "--clip 1e-300"),
    ("train-lr-inf", [*T, "--private", "npz:{d}/priv.npz", "--lr", "inf", "--out", "{d}/never1"], "--lr must be a finite number"),
    ("train-weight-decay-nan", [*T, "--private", "npz:{d}/priv.npz", "--weight-decay", "nan", "--out", "{d}/never2"], "finite"),
    ("rank-nan-model", [*R[:5], "--model", "{d}/nan.py:make@16x1", "-q", "--private", "npz:{d}/priv.npz", "--public",
                        "npz:{d}/pub.npz", "--no-cache"], "NaN or infinite"),
    ("rank-nan-model-ghost", [*R[:5], "--model", "{d}/nan.py:make@16x1", "-q", "--private", "npz:{d}/priv.npz", "--public",
                              "npz:{d}/pub.npz", "--no-cache", "--gram", "ghost"], "NaN or infinite"),
    ("train-nan-model", [*T[:7], "--model", "{d}/nan.py:make@16x1", "-q", "--private", "npz:{d}/priv.npz", "--out", "{d}/nanrun"],
     "outputs are NaN or infinite"),
    # parsing
    ("peft-bad-regex", [*R[:7], "-q", "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--peft", "lora:targets=("],
     "not a regular expression"),
    ("npz-unknown-user-home", [*R, "--private", "npz:~nosuchuser36/x.npz", "--public", "npz:{d}/pub.npz"], "home folder is unknown"),
    ("rgb-to-5-channels", [*R[:5], "--model", "fmnist-cnn@28x5", "-q", "--private", "npz:{d}/rgb.npz", "--public", "npz:{d}/pub.npz"],
     "cannot map 3 channels to 5"),
    ("audit-examples-negative", ["audit", "--method", "dpsgd", "--examples", "-1"], "--examples -1"),
    # bounds
    ("repeats-1e6", [*R, "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--repeats", "1000000"], "at most 1,000"),
    ("audit-steps-1e6", ["audit", "--method", "dpsgd", "--steps", "1000000"], "at most 100,000"),
    ("nproc-1000", [*T, "--private", "npz:{d}/priv.npz", "--nproc", "1000", "--out", "{d}/never3"], "--nproc 1000"),
    # silently wrong before
    ("npz-multilabel-2", [*R, "--private", "npz:{d}/multi2.npz", "--public", "npz:{d}/pub.npz"], "other than 0 and 1"),
    ("npz-int64-not-8-bit", [*R, "--private", "npz:{d}/i64.npz", "--public", "npz:{d}/pub.npz"], "uint16"),
    ("folder-float-tiff-1e30", [*R, "--private", "folder:{d}/tif", "--public", "npz:{d}/pub.npz"], "outside [0, 1]"),
    ("audit-public-is-private", ["audit", "--method", "gep", "--model", "fmnist-cnn", "--private", "npz:{d}/priv.npz",
                                 "--public", "npz:{d}/priv.npz", "--canaries", "10", "--examples", "10"], "is private data"),
    # misleading before
    ("json-on-proc", [*R, "--private", "npz:{d}/priv.npz", "--public", "npz:{d}/pub.npz", "--json", "/proc/version"], "virtual file system"),
    ("one-class-csv", [*R, "--private", "csv:{d}/one.csv", "--public", "npz:{d}/pub.npz", "--dp", "--epsilon", "1"], "--classes"),
]


@pytest.mark.parametrize("name,argv,needle", CASES, ids=[c[0] for c in CASES])
def test_round2_case(capsys, d, name, argv, needle):
    got, err = _run(capsys, argv, d)
    line = _one_error_line(err)
    assert got == 2, err
    assert needle in line, line
    if name == "one-class-csv":
        assert "'classes' array" not in line  # an npz's remedy, not a CSV's


# -- files destroyed -------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--json", "--csv", "--markdown"])
def test_an_output_that_is_the_private_dataset_is_refused_and_the_file_kept(tmp_path, d, capsys, option):
    priv = tmp_path / "priv.npz"
    priv.write_bytes((d / "priv.npz").read_bytes())
    before = priv.read_bytes()
    got, err = _run(capsys, [*R, "--private", f"npz:{priv}", "--public", f"npz:{d}/pub.npz", option, str(priv)], d)
    assert got == 2 and "is an input of this run" in _one_error_line(err)
    assert priv.read_bytes() == before


def test_outputs_inside_inputs_are_refused(tmp_path, d, capsys):
    img = d / "folder" / "a" / "0.png"
    before = img.read_bytes()
    cat = _catalogue(d, "cat-out", JOB)
    cases = [
        ([*R, "--private", f"folder:{d}/folder", "--public", f"npz:{d}/pub.npz", "--plot", str(img)], "inside the input folder"),
        ([*R, "--private", f"folder:{d}/folder", "--public", f"npz:{d}/pub.npz", "--json", f"{d}/folder/r.json"], "inside"),
        ([*R, "--private", f"csv:{d}/list.csv", "--public", f"npz:{d}/pub.npz", "--plot", str(img)], "an image of the dataset"),
        (["rank", "-q", "--catalog", str(cat), "--json", str(cat)], "is an input"),
        (["rank", "-q", "--catalog", str(cat), "--csv", str(d / "priv.npz")], "is an input"),
        ([*T, "--private", f"folder:{d}/folder", "--out", f"{d}/folder/run"], "inside the input folder"),
        (["audit", "--method", "dpsgd", "--model", "fmnist-cnn", "--private", f"npz:{d}/priv.npz", "--json", f"{d}/priv.npz"], "input"),
    ]
    size = (d / "priv.npz").stat().st_size
    for argv, needle in cases:
        got, err = _run(capsys, argv, d)
        assert got == 2 and needle in _one_error_line(err), (argv, err)
    assert img.read_bytes() == before and (d / "priv.npz").stat().st_size == size
    assert "jobs" in cat.read_text() and not (d / "folder" / "run").exists() and not (d / "folder" / "r.json").exists()


def test_cache_clear_keeps_a_user_file_shaped_like_an_old_temporary(tmp_path, monkeypatch, capsys):
    from gsd_cli.ranking.cache import SubspaceCache
    from gsd_cli.distance.side import Subspace

    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path))
    mine = tmp_path / ".0123456789abcdef.mywork.tmp"
    mine.write_text("my work")
    SubspaceCache().put("ab" * 32, Subspace("x", torch.eye(4, 2, dtype=torch.float64), torch.ones(2), 10, 0.0, "vmap"))
    gsd_tmp = tmp_path / f".gsd-tmp-{'cd' * 32}.k3_9zq1a.tmp"  # gsd's own unfinished write: deleted
    gsd_tmp.write_bytes(b"half")
    assert main(["cache", "clear"]) == 0
    assert mine.read_text() == "my work" and not gsd_tmp.exists()
    assert "deleted 1 entries" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("env", ["home-missing", "xdg-missing", "home-unset"])
def test_a_missing_home_is_never_created_and_the_run_says_so_once(tmp_path, d, monkeypatch, capsys, env):
    monkeypatch.delenv("GSD_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    gone = tmp_path / "nonexistent-home"
    if env == "home-missing":
        monkeypatch.setenv("HOME", str(gone))
    elif env == "xdg-missing":
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("XDG_CACHE_HOME", str(gone))
    else:
        monkeypatch.delenv("HOME", raising=False)
    got, err = _run(capsys, [*R, "--private", f"npz:{d}/priv.npz", "--public", f"npz:{d}/pub.npz", "mnist-b", "--engine", "vmap"], d)
    assert got == 0, err
    assert err.count("no cache folder") == 1 and "GSD_CACHE_DIR" in err and "Traceback" not in err
    assert not gone.exists() and not (tmp_path / ".cache").exists()


def test_cache_size_cap_evicts_the_least_recently_used_and_stores_float32(tmp_path, monkeypatch, capsys):
    from gsd_cli.ranking.cache import SubspaceCache, parse_size
    from gsd_cli.distance.side import Subspace

    def sub():
        V = torch.linalg.qr(torch.randn(3000, 4, dtype=torch.float64))[0]
        return Subspace("x", V, torch.ones(4, dtype=torch.float64), 10, 0.0, "vmap")

    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path))
    c = SubspaceCache()
    keys = [f"{i:x}" * 64 for i in range(1, 5)]
    one = sub()
    assert c.put(keys[0], one)
    size = c.path(keys[0]).stat().st_size
    assert size < 3000 * 4 * 8 * 0.6  # float32 bases: about half of float64
    got = c.get(keys[0], "x")
    assert got.V.dtype == torch.float64 and torch.allclose(got.V, one.V, atol=1e-6)
    assert main(["cache", "limit", str(int(size * 2.5))]) == 0
    os.utime(c.path(keys[0]), (1, 1))
    assert c.put(keys[1], sub())
    os.utime(c.path(keys[1]), (2, 2))
    assert c.get(keys[0], "x") is not None  # a hit: keys[0] is now the most recently used
    assert c.put(keys[2], sub())  # three entries do not fit: the least recently used (keys[1]) goes
    assert c.path(keys[0]).exists() and not c.path(keys[1]).exists() and c.path(keys[2]).exists()
    capsys.readouterr()
    assert main(["cache", "info"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "2 entries" in text and "cap" in text and "gsd-cache-settings" not in text
    assert main(["cache", "limit", "lots"]) == 2
    assert parse_size("2G") == 2 * 2**30 and parse_size("500M") == 500 * 2**20


# -- silently wrong --------------------------------------------------------------------------------


def test_uint16_npz_is_scaled_by_its_range(d):
    from gsd_cli.data import resolve

    src = resolve(f"npz:{d}/u16.npz")
    top = max(float(im.max()) for im in src.images(range(len(src))))
    assert 0.99 < top <= 1.0


def test_catalogue_fail_above_must_be_finite(d, capsys):
    for value in ("nan", "inf", "-1.0"):
        cat = _catalogue(d, f"fa-{value}", JOB + f"fail_above = {value}\n")
        got, err = _run(capsys, ["rank", "-q", "--catalog", str(cat)], d)
        assert got == 2 and "fail_above" in _one_error_line(err)


def test_datasets_check_reads_what_rank_reads(d, capsys):
    got, out_err = main(["datasets", "check", f"folder:{d}/chk", "-q"]), capsys.readouterr()
    assert got == 1
    text = " ".join(out_err.out.split())
    assert "unreadable: 3" in text and "NaN" in text and "too large" in text and "0.png" in text
    assert main(["datasets", "check", f"folder:{d}/chk", "--quick", "-q"]) == 0  # headers only: documented


def test_a_damaged_checkpoint_or_metrics_file_is_refused_on_resume(tmp_path, d, capsys):
    run = tmp_path / "run"
    got, err = _run(capsys, [*T, "--private", f"npz:{d}/priv.npz", "--out", str(run)], d)
    assert got == 0, err
    assert json.loads((run / "checkpoint.json").read_text())["weights_sha256"]
    metrics = run / "metrics.jsonl"
    whole = metrics.read_text()
    metrics.write_text(whole[:-15])  # a line cut short (the file is written atomically: damaged afterwards)
    got, err = _run(capsys, ["train", "--resume", str(run), "-q"], d)
    assert got == 2 and "metrics.jsonl: line 1" in _one_error_line(err)
    metrics.write_text(whole)
    w = run / "checkpoint.safetensors"
    blob = bytearray(w.read_bytes())
    blob[-5] ^= 1  # one flipped bit in a weight
    w.write_bytes(bytes(blob))
    got, err = _run(capsys, ["train", "--resume", str(run), "-q"], d)
    assert got == 2 and "SHA-256" in _one_error_line(err)
    assert w.read_bytes() == bytes(blob)  # left as it was


# -- misleading or unbounded -----------------------------------------------------------------------


def test_catalogue_type_errors_and_a_bom(d, capsys):
    from gsd_cli.ranking.catalog import load_catalog

    for body, needle in ((JOB + "params = 5\n", "params = 5"), (JOB + "device = true\n", "device"),
                         ('[[jobs]]\nprivate = "p"\ncandidates = "mnist-b"\n', "should be a list of names")):
        got, err = _run(capsys, ["rank", "-q", "--catalog", str(_catalogue(d, "typed", body))], d)
        assert got == 2 and needle in _one_error_line(err), err
    bad = d / "datasets3.toml"
    bad.write_text("datasets = 3\n")
    got, err = _run(capsys, ["rank", "-q", "--catalog", str(bad)], d)
    assert got == 2 and "datasets = 3" in _one_error_line(err)
    bom = d / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf" + _catalogue(d, "plain", JOB).read_bytes())
    assert load_catalog(bom).jobs[0].candidates == ["mnist-b"]


def test_a_big_catalogue_lists_each_missing_name_once(d, capsys):
    jobs = "".join(f'[[jobs]]\nname = "j{i}"\nprivate = "nosuch{i % 7}"\ncandidates = ["gone{i % 5}", "mnist-b"]\n' for i in range(300))
    cat = d / "big.toml"
    cat.write_text(jobs)
    got, err = _run(capsys, ["rank", "-q", "--catalog", str(cat)], d)
    assert got == 2 and "Traceback" not in err
    assert len(err) < 6000, len(err)  # 12 missing names, the list of known names once, 10 job lines and a count
    assert " ".join(err.split()).count("use one of") == 1 and "290 more job(s)" in " ".join(err.split())


def test_help_keeps_bracketed_extras():
    from typer.testing import CliRunner

    from gsd_cli.cli import app

    text = " ".join(CliRunner().invoke(app, ["rank", "--help"], env={"COLUMNS": "300"}).output.split())
    assert "gsd-cli[ray]" in text and "gsd-cli[ot]" in text


def test_plain_progress_times_steps_from_the_first_step():
    from gsd_cli.cli import common

    lines, t = [], [0.0]
    p = common.plain_progress(lines.append, lambda: t[0], after=0)
    p("epoch", 0, 1)
    t[0] = 400.0  # set-up (anchors, first-step warm-up) before the first step
    p("step", 1, 13)
    t[0] += 38.0
    p("step", 2, 13)
    assert lines == ["step 2/13 of the epoch: 38s a step, about 6m58s left in it"]


def test_broken_torchvision_is_named(d, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)  # import fails, as a mismatched build does
    got, err = _run(capsys, [*R, "--private", f"npz:{d}/priv.npz", "--public", "cifar10", "--data-root", str(d)], d)
    assert got == 2 and "torchvision failed to import" in _one_error_line(err)
    got, err = _run(capsys, [*R, "--private", f"folder:{d}/folder", "--public", f"npz:{d}/pub.npz"], d)
    assert got == 0, err  # a folder: source does not need torchvision


def test_truncated_dicom_is_called_truncated(tmp_path):
    pydicom = pytest.importorskip("pydicom")
    from pydicom.data import get_testdata_file

    from gsd_cli.data.dicom import read_dicom
    from gsd_cli.errors import DatasetError

    cut = tmp_path / "cut.dcm"
    cut.write_bytes(Path(get_testdata_file("CT_small.dcm")).read_bytes()[:1000])
    with pytest.raises(DatasetError, match="truncated") as e:
        read_dicom(cut, "folder:x")
    assert "DICOMDIR" not in str(e.value) and pydicom


def test_ctrl_c_says_interrupted_and_exits_130(d, monkeypatch, capsys):
    import gsd_cli.ranking as ranking

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(ranking, "rank", interrupted)
    got, err = _run(capsys, [*R, "--private", f"npz:{d}/priv.npz", "--public", f"npz:{d}/pub.npz"], d)
    assert got == 130 and err.strip() == "interrupted"


def test_out_of_memory_is_a_user_error_with_the_figure(d, monkeypatch, capsys):
    import gsd_cli.ranking as ranking

    def oom(*a, **k):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 1843200000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(ranking, "rank", oom)
    got, err = _run(capsys, [*R, "--private", f"npz:{d}/priv.npz", "--public", f"npz:{d}/pub.npz"], d)
    line = _one_error_line(err)
    assert got == 2 and "out of memory" in line and "1.8 GB" in line and "internal error" not in line


def test_the_sweep_covers_the_issue():
    assert len(CASES) >= 25
