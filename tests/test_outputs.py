"""Issue 19, files and exit codes: the one output writer (atomic for files, direct for streams, symlinks
followed, umask), the top-level guard (exit 3), usage errors of the checks, and the ten tracebacks
seen by the sweep, each now one ``error:`` line with exit 2."""

import errno
import json
import os
import stat
import struct
import threading
import zlib
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.report.outputs import check_distinct, check_output_path, write_output

RANK = ["rank", "-m", "20", "-k", "2", "--model", "fmnist-cnn", "--params", "fc*", "-q", "--private", "mnist-a",
        "--public", "mnist-b"]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code, err, expected=2, needle=None):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == expected, err
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    if needle is not None:
        assert needle in lines[0], lines[0]
    return lines[0]


def bomb_png(path: Path, width: int = 20000, height: int = 20000) -> None:
    """A PNG whose header says width x height (the pixels are never there: PIL refuses it on open)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


# --- the writer ---------------------------------------------------------------------------------


def test_a_symlink_stays_a_link_and_its_target_is_written(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_output(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "later.json")
    write_output(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "later.json").read_text() == "x"


def test_devices_are_written_not_replaced():
    before = os.stat("/dev/null")
    write_output("/dev/null", "nothing\n")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and before.st_ino == after.st_ino
    if os.path.exists("/dev/full"):
        with pytest.raises(GSDError, match="no space left"):
            write_output("/dev/full", "x" * 10000)
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_a_fifo_is_written_directly(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_output(fifo, "through the pipe\n")
    reader.join(10)
    assert got == ["through the pipe\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_new_files_get_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_output(tmp_path / "a.json", "{}")
        assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o644
        os.umask(0o077)
        write_output(tmp_path / "b.json", "{}")
        assert stat.S_IMODE(os.stat(tmp_path / "b.json").st_mode) == 0o600
        os.chmod(tmp_path / "a.json", 0o640)
        write_output(tmp_path / "a.json", "[]")
        assert stat.S_IMODE(os.stat(tmp_path / "a.json").st_mode) == 0o640
        write_output(tmp_path / "secret.json", "{}", private=True)
        os.umask(0o000)
        write_output(tmp_path / "secret2.json", "{}", private=True)
        assert stat.S_IMODE(os.stat(tmp_path / "secret2.json").st_mode) == 0o600
    finally:
        os.umask(old)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".gsd-")]  # no temporary file left


def test_output_path_checks(tmp_path):
    assert str(check_output_path("-", "--json")) == "-"
    with pytest.raises(GSDError, match="too long"):
        check_output_path(tmp_path / ("a" * 300 + ".json"), "--json")
    (tmp_path / "f").write_text("")
    with pytest.raises(GSDError, match="is a file, not a folder"):
        check_output_path(tmp_path / "f" / "x.json", "--json")
    with pytest.raises(GSDError, match="both write to"):
        check_distinct({"--json": tmp_path / "x", "--csv": tmp_path / "." / "x"})
    with pytest.raises(GSDError, match="both write to"):
        check_distinct({"--json": "-", "--markdown": "-"})
    check_distinct({"--json": tmp_path / "x", "--csv": tmp_path / "y", "--plot": None})


def test_json_dash_is_stdout_and_the_table_goes_to_stderr(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *RANK, "--json", "-")
    assert code == 0, err
    assert json.loads(out)["results"][0]["public"] == "mnist-b"
    assert "GSD" in err and not (tmp_path / "-").exists()


def test_rank_cli_writes_through_a_symlink_and_refuses_one_path_twice(capsys, tmp_path):
    target = tmp_path / "r.json"
    target.write_text('{"results": [], "metric": "gsd", "model": "probe"}')  # an earlier ranking (another file: refused, test_output_links.py)
    (tmp_path / "link.json").symlink_to(target)
    code, _, err = run(capsys, *RANK, "--json", tmp_path / "link.json")
    assert code == 0, err
    assert (tmp_path / "link.json").is_symlink() and json.loads(target.read_text())["k"] == 2
    code, _, err = run(capsys, *RANK, "--json", tmp_path / "x", "--csv", tmp_path / "x")
    one_line(code, err, needle="both write to")


# --- exit codes ---------------------------------------------------------------------------------


def test_an_unexpected_exception_is_one_line_and_exit_3(capsys, monkeypatch):
    monkeypatch.delenv("GSD_DEBUG", raising=False)
    with mock.patch("gsd_cli.ranking.rank", side_effect=RuntimeError("boom")):
        code, _, err = run(capsys, *RANK)
        line = one_line(code, err, expected=3)
        assert line == "error: internal error: RuntimeError: boom (run with --debug or GSD_DEBUG=1 for the traceback)"
        code, _, err = run(capsys, "--debug", *RANK)
        assert code == 3 and "Traceback" in err and err.strip().splitlines()[-1].startswith("error: internal error")
        monkeypatch.setenv("GSD_DEBUG", "1")
        code, _, err = run(capsys, *RANK)
        assert code == 3 and "Traceback" in err


def test_an_os_error_is_one_line_and_exit_2(capsys):
    with mock.patch("gsd_cli.ranking.rank", side_effect=OSError(errno.EIO, "Input/output error", "/some/file")):
        code, _, err = run(capsys, *RANK)
    one_line(code, err, needle="/some/file: Input/output error")


@pytest.mark.parametrize("value", ["nan", "inf", "-0.1"])
def test_fail_above_must_be_a_finite_distance(capsys, value):
    one_line(*run(capsys, *RANK, "--fail-above", value)[::2], needle="--fail-above")


def test_expect_best_not_a_candidate_is_a_usage_error(capsys):
    with mock.patch("gsd_cli.ranking.rank", side_effect=AssertionError("no work before the check")):
        code, _, err = run(capsys, *RANK, "--expect-best", "mnist-c")
    one_line(code, err, needle="--expect-best mnist-c is not a candidate")
    code, _, err = run(capsys, *RANK, "--expect-best", "mnist-b")
    assert code == 0, err


# --- the ten tracebacks -------------------------------------------------------------------------


def test_nan_pixels_in_an_npz(capsys, tmp_path):
    x = np.random.default_rng(0).uniform(size=(20, 16, 16)).astype(np.float32)
    x[3, 2, 2] = np.nan
    np.savez(tmp_path / "nan.npz", x=x, y=np.arange(20) % 2)
    code, _, err = run(capsys, *RANK[:-4], "--private", f"npz:{tmp_path / 'nan.npz'}", "--public", "mnist-b")
    one_line(code, err, needle="NaN")


def test_a_300_character_json_name(capsys, tmp_path):
    code, _, err = run(capsys, *RANK, "--json", tmp_path / ("r" * 300 + ".json"))
    one_line(code, err, needle="too long")


@pytest.mark.parametrize("problem", ["read-only", "full"])
def test_a_cache_that_cannot_be_written(capsys, problem):
    """A read-only or full cache folder: no traceback (the ranking goes on without the cache, with one
    warning, or stops with one error line)."""
    e = OSError(errno.EROFS if problem == "read-only" else errno.ENOSPC, os.strerror(errno.EROFS if problem == "read-only" else errno.ENOSPC))
    with mock.patch("gsd_cli.ranking.cache.SubspaceCache.store", side_effect=e):
        code, out, err = run(capsys, *RANK)
    assert "Traceback" not in err
    if code == 0:
        assert "mnist-b" in out and len([line for line in err.splitlines() if line.startswith("warning:")]) <= 1
    else:
        one_line(code, err)


def test_a_file_where_the_cache_folder_should_be(capsys, tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = run(capsys, *RANK)
    assert "Traceback" not in err
    if code == 0:
        assert "mnist-b" in out
    else:
        one_line(code, err)
    assert (tmp_path / "cache").read_text() == "not a folder"


def test_cache_clear_leaves_a_folder_named_like_an_entry(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path))
    (tmp_path / "x.safetensors").mkdir()
    (tmp_path / "x.safetensors" / "inside").write_text("keep")
    code, _, err = run(capsys, "cache", "clear")
    assert "Traceback" not in err
    assert code == 0, err
    assert (tmp_path / "x.safetensors" / "inside").read_text() == "keep"


def test_resume_of_a_checkpoint_without_its_secret_seed(capsys, tiny, tmp_path):
    run_dir = tmp_path / "run"
    code, _, err = run(capsys, "train", "--private", tiny["private"], "--method", "dpsgd", "--epochs", "1",
                       "--batch-size", "30", "--model", "fmnist-cnn", "--out", run_dir, "-q")
    assert code == 0, err
    meta = json.loads((run_dir / "checkpoint.json").read_text())
    assert stat.S_IMODE(os.stat(run_dir / "checkpoint.json").st_mode) == 0o600  # it holds the secret seed
    meta.pop("secret", None)
    (run_dir / "checkpoint.json").write_text(json.dumps(meta))
    code, _, err = run(capsys, "train", "--resume", run_dir, "--epochs", "2", "-q")
    one_line(code, err)


@pytest.mark.parametrize("command", ["rank", "train", "compare"])
def test_a_negative_seed(capsys, command):
    argv = RANK if command == "rank" else [command, "--epochs", "1"]
    code, _, err = run(capsys, *argv, "--seed", "-5")
    one_line(code, err, needle="--seed -5")


def test_a_decompression_bomb_png(capsys, image_folder):
    bomb_png(image_folder / "cats" / "0.png")
    code, _, err = run(capsys, *RANK[:-4], "--private", f"folder:{image_folder}", "--public", "mnist-b", "-m", "12")
    one_line(code, err, needle=str(image_folder / "cats" / "0.png"))


def test_a_dataset_path_with_bytes_that_are_not_utf8(capsys, tmp_path):
    name = os.fsdecode(bytes(tmp_path) + b"/caf\xe9")
    os.makedirs(name)
    code, _, err = run(capsys, *RANK[:-4], "--private", f"folder:{name}", "--public", "mnist-b")
    line = one_line(code, err, needle="not UTF-8")
    assert "caf\\xe9" in line
