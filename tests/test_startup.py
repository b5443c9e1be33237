"""Start-up (issue 21): `gsd --help` and `gsd datasets list` answer without loading torch (or any
other heavy library), and the plotting and metrics libraries load only when a command uses them.
What is checked is which modules get imported, never a time."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "torchvision", "matplotlib", "sklearn", "scipy", "opacus", "dp_accounting", "safetensors", "PIL")


def _modules_after(code: str) -> dict:
    """Run ``code`` in a fresh interpreter (stdout silenced), then report which of HEAVY it loaded."""
    script = (
        "import contextlib, io, json, sys\n"
        "buf = io.StringIO()\n"
        "with contextlib.redirect_stdout(buf):\n"
        + "".join(f"    {line}\n" for line in code.splitlines())
        + f"print(json.dumps({{'loaded': [m for m in {HEAVY!r} if m in sys.modules], 'out': buf.getvalue()}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


COMMANDS = [["--help"], ["datasets", "list"], ["datasets", "--help"], ["train", "--help"], ["rank", "--help"], ["--version"]]


def test_the_cli_answers_without_heavy_libraries(tmp_path):
    """One interpreter runs the commands in turn; after each, none of HEAVY is loaded."""
    code = (
        "from gsd_cli.cli import main\n"
        "seen = {}\n"
        f"for argv in {COMMANDS!r}:\n"
        f"    argv = argv + ['--data-root', {str(tmp_path)!r}] if argv == ['datasets', 'list'] else argv\n"
        "    assert main(argv) == 0, argv\n"
        f"    seen[' '.join(argv[:2])] = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('SEEN', json.dumps(seen))"
    )
    r = _modules_after(code)
    seen = json.loads(r["out"].rsplit("SEEN ", 1)[1])
    assert all(v == [] for v in seen.values()), seen
    for name in ("mnist-a", "digits", "cifar10"):  # `datasets list` did list them
        assert name in r["out"]


def test_importing_the_library_loads_no_plotting_or_metrics_library():
    """The trainers, the ranking and the reports import matplotlib and sklearn when they draw or
    evaluate, not when they are imported."""
    r = _modules_after("import gsd_cli.train, gsd_cli.ranking, gsd_cli.report, gsd_cli.train.compare, gsd_cli.cli.train")
    assert "matplotlib" not in r["loaded"] and "sklearn" not in r["loaded"]
    assert "torch" in r["loaded"]  # (the check sees imports: the trainers do load torch)
