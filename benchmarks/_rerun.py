"""A benchmark run as a file, the way before issue 51 (``python benchmarks/bench_x.py ARGS``): run it as
the package's module instead, ``python -m benchmarks.bench_x ARGS``, with the repository first on
``PYTHONPATH`` and the interpreter's own options kept, and exit with its status.

A benchmark imports this module by its bare name, and only when it runs as a file (``__package__`` is
None there and the file's folder is ``sys.path[0]``)::

    if __name__ == "__main__" and not __package__:  # python benchmarks/bench_x.py: as python -m benchmarks.bench_x
        import _rerun  # noqa: F401 (never returns)

It is no part of the package's imports.
"""

import os
import subprocess
import sys
from pathlib import Path

_main = Path(sys.modules["__main__"].__file__).resolve()
_root = _main.parents[1]
_env = dict(os.environ)
_env["PYTHONPATH"] = os.pathsep.join([str(_root), *([_env["PYTHONPATH"]] if _env.get("PYTHONPATH") else [])])
_options = sys.orig_argv[1 : len(sys.orig_argv) - len(sys.argv)]  # e.g. -X importtime, -u (not the file)
_cmd = [sys.executable, *_options, "-m", f"{_main.parent.name}.{_main.stem}", *sys.argv[1:]]
sys.stdout.flush()
sys.stderr.flush()
if os.name == "posix":
    os.execve(sys.executable, _cmd, _env)  # the same process: its exit status, signals and resource use
sys.exit(subprocess.call(_cmd, env=_env))
