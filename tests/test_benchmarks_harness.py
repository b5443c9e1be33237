"""The benchmark harness (issue 51): ``benchmarks/`` is one package with one entry point,
``python -m benchmarks``, and the environment record of ``benchmarks/harness.py``. Cheap: no benchmark
runs here (the listing, one ``--help``, the files read with ast, one record)."""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from import_graph import assert_acyclic

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
#: what the record must say (issue 51)
ENV_KEYS = {"loadavg_before", "loadavg_after", "omp_num_threads", "torch_threads", "cpu_count", "python", "torch", "gsd",
            "git_commit", "gpu"}


def _run(*args: str) -> subprocess.CompletedProcess:
    """``python ARGS`` from the repository's root (``-m``/``-c`` put it first on sys.path: this checkout's
    ``benchmarks``, not a package of that name installed elsewhere)."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _code_files() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*.py") if "results" not in p.relative_to(BENCH).parts)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_help_lists_every_benchmark_with_a_line_from_its_docstring():
    r = _run("-m", "benchmarks", "--help")
    assert r.returncode == 0, r.stderr
    listed = {}
    for line in r.stdout.splitlines():
        if line.startswith("  ") and len(line.split(None, 1)) == 2:
            name, text = line.split(None, 1)
            listed[name] = text
    for path in sorted(BENCH.glob("bench_*.py")):
        name = path.stem[len("bench_"):]
        assert name in listed, f"{path.name} is not listed by python -m benchmarks --help"
        doc = " ".join(ast.get_docstring(ast.parse(path.read_text())).split()).replace("`", "")
        assert len(listed[name]) > 15 and doc.startswith(listed[name][:15]), (name, listed[name])
    for suite in ("validity.heldout", "validity.heldout.stops", "scale_out_training"):
        assert suite in listed, suite
    names = _run("-m", "benchmarks", "--list").stdout.split()
    assert set(names) == set(listed) and len(names) >= len(list(BENCH.glob("bench_*.py"))) + 3


def test_a_benchmark_runs_through_the_entry_point_with_its_own_options():
    r = _run("-m", "benchmarks", "budget_composition", "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m benchmarks budget_composition") and "--epsilon" in r.stdout
    assert _run("-m", "benchmarks", "no-such-benchmark").returncode == 2


def test_every_listed_benchmark_has_a_main_that_takes_argv():
    """The entry point calls ``main(argv)``: every module it lists defines one with a first parameter."""
    spec = importlib.util.spec_from_file_location("_benchmarks_entry_point", BENCH / "__main__.py")  # stdlib only
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    table = entry.benchmarks()
    assert table and all(text for _, text in table.values())
    for name, (module, _) in table.items():
        path = BENCH.joinpath(*module.split(".")).with_suffix(".py")
        mains = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        assert mains and mains[0].args.args, f"{name}: {path.relative_to(ROOT)} has no main(argv)"


def test_no_file_under_benchmarks_changes_sys_path():
    offenders = []
    for path in sorted(BENCH.rglob("*")):
        if not path.is_file() or "results" in path.relative_to(BENCH).parts:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        if "sys.path.insert" in text:
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders


def _imports(path: Path, modules: set[str]) -> tuple[set[str], list[str]]:
    """The package's modules that ``path`` imports (at any depth: in functions too), and its imports of
    them by a bare name (``import bench_rank``, ``from validity.x import``: the old sys.path style)."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    tops = {m.split(".")[1] for m in modules if m.count(".") >= 1}
    found, bare = set(), []

    def add(name: str) -> None:
        while name and name not in modules:  # benchmarks.validity.large.TASKS -> benchmarks.validity.large
            name = name.rpartition(".")[0]
        if name and name != mod:
            found.add(name)

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in tops and a.name != "_rerun":
                    bare.append(a.name)
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
                if name.split(".")[0] in tops:
                    bare.append(name)
            for a in node.names:
                add(f"{name}.{a.name}")
    return found, bare


def test_the_benchmarks_package_has_no_import_cycle():
    files = _code_files()
    modules = {_module(p) for p in files}
    graph, bare = {}, {}
    for p in files:
        graph[_module(p)], b = _imports(p, modules)
        if b:
            bare[str(p.relative_to(ROOT))] = b
    assert not bare, f"imports by a bare name (use package-relative or benchmarks.x): {bare}"
    assert "benchmarks.validity.dp_rule" in graph["benchmarks.validity.large_score"]  # the graph sees imports in functions
    assert_acyclic(graph)


def test_env_record_has_its_keys_and_write_json_adds_it_beside_the_results(tmp_path):
    out = tmp_path / "sub" / "result.json"
    code = ("import json, sys\n"
            "from benchmarks.harness import env_record, write_json\n"
            "print(json.dumps(env_record()))\n"
            f"write_json({str(out)!r}, {{'rows': [1, 2], 'loadavg': None}}, loadavg_before=(1.0, 2.0, 3.0))\n")
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout.strip().splitlines()[-1])
    assert ENV_KEYS <= set(env), ENV_KEYS - set(env)
    assert isinstance(env["cpu_count"], int) and env["python"].count(".") == 2 and env["gsd"]
    assert env["loadavg_after"] is None or len(env["loadavg_after"]) == 3
    assert env["torch_threads"] is None or env["torch_threads"] >= 1
    doc = json.loads(out.read_text())
    assert doc["rows"] == [1, 2] and "loadavg" in doc  # the benchmark's own keys, unchanged
    assert ENV_KEYS <= set(doc["env"]) and doc["env"]["loadavg_before"] == [1.0, 2.0, 3.0]
    assert not list(out.parent.glob("*.tmp"))
