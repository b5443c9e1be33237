"""Issue 44: a command whose reader goes away (``gsd datasets list | head -1``) exits 0 without a word,
whichever stream it was writing (rich's consoles, typer's help, a JSON on standard output); an error
keeps its exit status 2 when nobody reads standard error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

GSD = [sys.executable, "-m", "gsd_cli.cli"]


def _closed(argv, stream="stdout"):
    """Run gsd with ``stream`` a pipe whose reader is closed before gsd writes; (exit status, the other stream)."""
    other = "stderr" if stream == "stdout" else "stdout"
    p = subprocess.Popen([*GSD, *argv], **{stream: subprocess.PIPE, other: subprocess.PIPE}, env={**os.environ, "COLUMNS": "100"})
    getattr(p, stream).close()  # the reader is gone before the first byte
    rest = getattr(p, other).read().decode()
    return p.wait(timeout=120), rest


@pytest.mark.parametrize("argv", [["datasets", "list"], ["models", "list"], ["--help"], ["rank", "--help"], ["budget", "show"]])
def test_a_closed_output_pipe_is_exit_0_and_silent(argv):
    code, err = _closed(argv)
    assert code == 0, err
    assert err == "", err


def test_a_ranking_to_a_closed_pipe_is_exit_0(tmp_path):
    code, err = _closed(["rank", "-m", "8", "-k", "2", "--model", "fmnist-cnn", "--params", "fc*", "-q", "--public", "mnist-b",
                         "--json", "-"])
    assert code == 0, err
    assert "Traceback" not in err and "error" not in err, err


def test_an_error_with_a_closed_stderr_keeps_exit_2():
    code, out = _closed(["rank", "--model", "nosuch"], stream="stderr")
    assert code == 2 and out == ""
    code, _ = _closed(["datasets", "list"], stream="stderr")  # stderr closed, stdout read: a normal run
    assert code == 0

