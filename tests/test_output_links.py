"""Issue 44: an output option (--json, --csv, --markdown, --plot) that names a symbolic link writes
through it only when the link's target is an earlier gsd output (or a device); a link to any other
file, or to nothing, is refused in one line before any work, unless --force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.report.outputs import check_output_path, written_by_gsd

RANK = ["rank", "-m", "12", "-k", "2", "--model", "fmnist-cnn", "--params", "fc*", "-q", "--private", "mnist-a",
        "--public", "mnist-b"]
OPTIONS = {"--json": "json", "--csv": "csv", "--markdown": "md", "--plot": "png"}


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.fixture
def earlier(tmp_path, capsys):
    """One gsd rank's four outputs, written by the command itself."""
    d = tmp_path / "earlier"
    d.mkdir()
    files = {opt: d / f"r.{ext}" for opt, ext in OPTIONS.items()}
    code, err = _run(capsys, *RANK, *[a for opt, f in files.items() for a in (opt, f)])
    assert code == 0, err
    return files


def test_gsd_knows_its_own_outputs_and_nothing_else(earlier, tmp_path):
    assert all(written_by_gsd(f) for f in earlier.values())
    others = {"notes.txt": "precious\n", "config.json": '{"editor": "vim"}', "data.csv": "a,b\n1,2\n",
              "README.md": "# Title\n", "list.json": "[1, 2]", "empty.json": ""}
    for name, text in others.items():
        (tmp_path / name).write_text(text)
        assert not written_by_gsd(tmp_path / name), name
    (tmp_path / "photo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)  # a PNG gsd did not write
    assert not written_by_gsd(tmp_path / "photo.png")
    assert not written_by_gsd(tmp_path / "missing.json")


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_link_to_another_file_is_refused_and_the_file_kept(option, tmp_path, capsys):
    precious = tmp_path / "precious.txt"
    precious.write_text("precious\n")
    link = tmp_path / f"out.{OPTIONS[option]}"
    link.symlink_to(precious)
    code, err = _run(capsys, *RANK, option, link)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "is a symbolic link to" in lines[0] and "not an earlier gsd output" in lines[0] and "--force" in lines[0]
    assert precious.read_text() == "precious\n" and link.is_symlink()
    code, err = _run(capsys, *RANK, option, link, "--force")  # the user's choice
    assert code == 0, err
    assert precious.read_bytes() != b"precious\n" and link.is_symlink()


@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_link_to_an_earlier_output_is_written_through(option, earlier, tmp_path, capsys):
    link = tmp_path / f"latest.{OPTIONS[option]}"
    link.symlink_to(earlier[option])
    before = earlier[option].stat().st_mtime_ns
    code, err = _run(capsys, *RANK, option, link, "--seed", "1")
    assert code == 0, err
    assert link.is_symlink() and earlier[option].stat().st_mtime_ns != before and written_by_gsd(earlier[option])


def test_a_dangling_link_is_refused_and_nothing_created(tmp_path, capsys):
    link = tmp_path / "out.csv"
    link.symlink_to(tmp_path / "elsewhere.csv")
    code, err = _run(capsys, *RANK, "--csv", link)
    assert code == 2 and "does not exist" in err and "--force" in err, err
    assert not (tmp_path / "elsewhere.csv").exists()


def test_a_link_to_a_device_still_writes(tmp_path):
    link = tmp_path / "null.json"
    link.symlink_to("/dev/null")
    assert check_output_path(link, "--json") == link


@pytest.mark.parametrize("argv", [["models", "show", "fmnist-cnn", "--json"],
                                  ["audit", "--method", "dpsgd", "--canaries", "50", "--steps", "2", "--json"]])
def test_the_other_commands_refuse_the_same_way(argv, tmp_path, capsys):
    precious = tmp_path / "precious.json"
    precious.write_text('{"keep": true}')
    link = tmp_path / "out.json"
    link.symlink_to(precious)
    code, err = _run(capsys, *argv, link)
    assert code == 2 and "not an earlier gsd output" in err, err
    assert json.loads(precious.read_text()) == {"keep": True}
    with pytest.raises(GSDError, match="not an earlier gsd output"):
        check_output_path(link, "--json")
    assert check_output_path(link, "--json", force=True) == Path(link)
