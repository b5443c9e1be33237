"""Issue 19, cache: a cache that cannot be written never loses the ranking, and ``gsd cache clear``
deletes only gsd's own entries (never a user's ``model.safetensors`` or a folder)."""

import errno
import os
import tempfile

import pytest
import torch
from safetensors.torch import save_file

import gsd_cli.ranking.cache as cache_mod
from gsd_cli.ranking.cache import SubspaceCache
from gsd_cli.cli import main
from gsd_cli.distance.side import Subspace

KEY = "ab" * 32


def _sub():
    return Subspace("x", torch.eye(4, 2, dtype=torch.float64), torch.ones(2), 10, 0.0, "vmap")


def _rank_args(npz_pair):
    return ["rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
            f"npz:{npz_pair['far']}", "-k", "2", "-m", "16", "-q", "--engine", "vmap"]


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EROFS, "Read-only file system"),
    PermissionError(errno.EACCES, "Permission denied"),
])
def test_unwritable_cache_warns_once_and_stops_writing(tmp_path, monkeypatch, failure):
    warnings, calls = [], []

    def broken(*a, **k):
        calls.append(1)
        raise failure

    monkeypatch.setattr(tempfile, "mkstemp", broken)
    c = SubspaceCache(tmp_path / "c", warn=warnings.append)
    assert c.put(KEY, _sub()) is False and c.put(KEY[::-1], _sub()) is False
    assert len(warnings) == 1 and len(calls) == 1  # warned once; the second write is not even tried
    assert "--no-cache" in warnings[0] and "GSD_CACHE_DIR" in warnings[0] and failure.strerror in warnings[0]
    assert c.write_error and c.get(KEY, "x") is None


def test_full_disk_during_save_leaves_no_temporary_file(tmp_path, monkeypatch):
    import safetensors.torch as st

    def full(tensors, filename, metadata=None):
        open(filename, "wb").write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(st, "save_file", full)
    c = SubspaceCache(tmp_path / "c", warn=lambda m: None)
    assert c.put(KEY, _sub()) is False
    assert list((tmp_path / "c").iterdir()) == []


def test_cli_ranks_when_a_file_is_where_the_cache_folder_should_be(tmp_path, npz_pair, monkeypatch, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file")
    monkeypatch.setenv("GSD_CACHE_DIR", str(blocker))
    json_path = tmp_path / "r.json"
    assert main(_rank_args(npz_pair) + ["--json", str(json_path)]) == 0
    err = capsys.readouterr().err
    assert err.count("cannot write the cache") == 1 and "--no-cache" in err and "GSD_CACHE_DIR" in err
    assert json_path.is_file() and blocker.read_text() == "a file"
    assert main(["cache", "info"]) == 0 and "not a folder" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 2 and blocker.read_text() == "a file"


def test_cli_ranks_on_a_full_disk(tmp_path, npz_pair, monkeypatch, capsys):
    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path / "c"))

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.SubspaceCache, "store", full)
    assert main(_rank_args(npz_pair)) == 0
    err = capsys.readouterr().err
    assert err.count("warning: cannot write the cache") == 1 and "No space left" in err


def test_unreadable_cache_folder_is_a_miss(tmp_path, monkeypatch):
    c = SubspaceCache(tmp_path / "c")
    real = type(tmp_path).is_file

    def denied(self):
        if self.parent == c.directory:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(self)

    monkeypatch.setattr(type(tmp_path), "is_file", denied)
    assert c.get(KEY, "x") is None and c.misses == 1


def test_clear_deletes_only_gsd_entries(tmp_path, monkeypatch, capsys):
    d = tmp_path / "c"
    monkeypatch.setenv("GSD_CACHE_DIR", str(d))
    c = SubspaceCache()
    c.put(KEY, _sub())
    c.put("cd" * 32, _sub())
    user = {"w": torch.ones(3)}
    save_file(user, str(d / "model.safetensors"))                               # a user's weights
    save_file(user, str(d / ("ef" * 32 + ".safetensors")))                      # gsd's name, not gsd's header
    save_file(user, str(d / ("01" * 32 + ".safetensors")), metadata={"gsd": '{"schema": 99, "key": "x"}'})
    (d / ("23" * 32 + ".safetensors")).mkdir()                                   # a folder named like an entry
    (d / "x.safetensors").mkdir()
    (d / "notes.txt").write_text("mine")
    os.symlink(d / "model.safetensors", d / ("45" * 32 + ".safetensors"))        # a link is never followed
    (d / f".gsd-tmp-{KEY}.abc_1234.tmp").write_bytes(b"half")                     # gsd's unfinished write
    stamp = SubspaceCache().path(KEY)
    os.symlink(stamp, tmp_path / "outside-link")

    assert main(["cache", "info"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "2 entries" in text and "1 unfinished temporary" in text and "also 7 other file(s)" in text
    assert main(["cache", "clear"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "deleted 2 entries" in text and "1 temporary" in text and "left alone 7 other file(s)" in text
    left = sorted(p.name for p in d.iterdir())
    assert "model.safetensors" in left and "x.safetensors" in left and "notes.txt" in left and len(left) == 7
    assert (d / "model.safetensors").is_file() and (d / ("23" * 32 + ".safetensors")).is_dir()
    assert SubspaceCache().info()["entries"] == 0


def test_clear_of_a_missing_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path / "never"))
    assert main(["cache", "clear"]) == 0 and "deleted 0 entries" in capsys.readouterr().out
    assert not (tmp_path / "never").exists()


def test_noise_calibrations_are_gsds_own_and_kept(tmp_path, monkeypatch, capsys):
    """``calibration/`` (gsd train's cached noise multipliers) is reported as gsd's, not as a file of
    someone else's, and ``gsd cache clear`` keeps it, as documented."""
    d = tmp_path / "c"
    monkeypatch.setenv("GSD_CACHE_DIR", str(d))
    SubspaceCache().put(KEY, _sub())
    (d / "calibration").mkdir()
    for name in ("a" * 64, "b" * 64):
        (d / "calibration" / f"{name}.json").write_text("{}")
    (d / "notes.txt").write_text("mine")
    assert main(["cache", "info"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "1 entries" in text and "2 noise calibration(s) in calibration/" in text and "also 1 other file(s)" in text
    assert "calibration)" not in text.split("also")[-1]  # not listed among the other files
    assert main(["cache", "clear"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "deleted 1 entries" in text and "kept 2 noise calibration(s)" in text and "left alone 1 other file(s), not gsd cache entries (notes.txt)" in text
    assert len(list((d / "calibration").iterdir())) == 2 and (d / "notes.txt").exists()
