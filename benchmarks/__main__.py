"""python -m benchmarks: every benchmark of gsd from one entry point (issue 51).

    python -m benchmarks --help              # every benchmark, one line each (from its docstring)
    python -m benchmarks --list              # their names only
    python -m benchmarks NAME --help         # NAME's own options
    python -m benchmarks NAME [ARGS...]      # run NAME: its main(ARGS)

Run from the repository's root (or with it on ``PYTHONPATH``): the ``benchmarks`` package imported is
then this one. A benchmark is each ``bench_*.py`` (NAME without ``bench_``; ``bench_NAME`` works too),
``scale_out_training.py``, and the validity suites: the modules and packages under ``validity/`` that run
as a program (``validity.heldout``, ``validity.heldout.round6``, ...). The list is read from the files
(nothing is imported until a benchmark runs).
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROG = "python -m benchmarks"
#: what is no benchmark: the package's own files
SKIP = {"__init__", "__main__", "harness", "_rerun"}


def _runs_as_program(tree: ast.Module) -> bool:
    """Whether a module has an ``if __name__ == "__main__":`` block at its top level."""
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            t = node.test
            names = [t.left, *t.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and \
                    any(isinstance(n, ast.Constant) and n.value == "__main__" for n in names):
                return True
    return False


def summary(doc: str | None, width: int = 90) -> str:
    """One line from a docstring: its first paragraph without markup, cut to at most ``width`` characters
    at a sentence's end if one is past 60% of them, else at a word's (with "...")."""
    if not doc:
        return "(no docstring)"
    para = " ".join(doc.strip().split("\n\n")[0].split())
    para = re.sub(r":\w+:`~?\.?([^`]+)`", r"\1", para).replace("``", "").replace("`", "")
    if len(para) <= width:
        return para
    ends = [m.end() for m in re.finditer(r"[.?!](?= )", para[: width + 1])]
    if ends and ends[-1] >= 0.6 * width:
        return para[: ends[-1]]
    return para[: width - 3].rsplit(" ", 1)[0].rstrip(",;:") + "..."


def benchmarks() -> dict[str, tuple[str, str]]:
    """Every benchmark: name -> (module under the package, one-line description), in the order listed:
    the ``bench_*.py`` files, then the other programs at the top, then the validity suites."""
    found: list[tuple[tuple, str, str, str]] = []
    for path in sorted(HERE.rglob("*.py")):
        rel = path.relative_to(HERE)
        if rel.parts[0] == "results" or path.stem in SKIP and len(rel.parts) == 1:
            continue
        if path.name == "__main__.py":  # a package that runs as a program: its docstring is its __init__'s
            pkg = ".".join(rel.parts[:-1])
            init = path.with_name("__init__.py")
            doc = ast.get_docstring(ast.parse(init.read_text())) if init.is_file() else None
            found.append(((2, pkg), pkg, f"{pkg}.__main__", summary(doc)))
            continue
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        if not _runs_as_program(tree):
            continue
        module = ".".join(rel.with_suffix("").parts)
        if len(rel.parts) == 1 and path.stem.startswith("bench_"):
            key, name = (0, path.stem), path.stem[len("bench_"):]
        else:
            key, name = (1 if len(rel.parts) == 1 else 2, module), module
        found.append((key, name, module, summary(ast.get_docstring(tree))))
    return {name: (module, line) for _, name, module, line in sorted(found)}


def resolve(name: str, table: dict[str, tuple[str, str]]) -> str | None:
    """The name in ``table`` of the benchmark called ``name`` (also ``bench_x``, ``bench_x.py``,
    ``benchmarks/bench_x.py``, ``validity/heldout``), or None."""
    n = name.strip().removesuffix(".py").replace("/", ".").replace("\\", ".")
    n = n.removeprefix("benchmarks.")
    for key in (n, n.removeprefix("bench_")):
        if key in table:
            return key
    return None


def help_text(table: dict[str, tuple[str, str]]) -> str:
    width = max(len(n) for n in table) + 2
    groups = {"benchmarks (benchmarks/bench_NAME.py)": [], "other programs": [], "validity suites (benchmarks/validity/)": []}
    for name, (module, line) in table.items():
        g = ("benchmarks (benchmarks/bench_NAME.py)" if not name.count(".") and module.startswith("bench_")
             else "validity suites (benchmarks/validity/)" if module.startswith("validity.") else "other programs")
        groups[g].append(f"  {name:<{width}}{line}")
    out = [f"usage: {PROG} [-h] [--list] NAME [ARGS ...]", "",
           "Every benchmark of gsd, run from the repository's root: NAME runs with its own options ARGS",
           f"({PROG} NAME --help lists them). Results written with --json carry the environment",
           "record of benchmarks/harness.py (load average, threads, versions, git commit, GPU)."]
    for g, lines in groups.items():
        if lines:
            out += ["", f"{g}:", *lines]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    table = benchmarks()
    if not argv or argv[0] in ("-h", "--help"):
        (sys.stdout if argv else sys.stderr).write(help_text(table))
        return 0 if argv else 2
    if argv[0] == "--list":
        print("\n".join(table))
        return 0
    name = resolve(argv[0], table)
    if name is None:
        sys.stderr.write(f"{PROG}: no benchmark named {argv[0]!r} ({PROG} --help lists them)\n")
        return 2
    args = argv[1:]
    mod = importlib.import_module(f"{__package__ or 'benchmarks'}.{table[name][0]}")
    sys.argv = [f"{PROG} {name}", *args]  # argparse's prog, and the command line a benchmark records
    rc = mod.main(args)
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
