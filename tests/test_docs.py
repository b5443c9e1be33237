"""The documentation site (issue 35): `mkdocs build --strict` passes, and the tutorials run end to end.

A tutorial marks each code block to run with ``<!-- run -->`` on the line before its fence; the
blocks of one tutorial run in order in one temporary folder (bash with ``-euo pipefail``, Python with
this interpreter), on the embedded data, with the small settings the tutorial itself shows.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
TUTORIALS = sorted((DOCS / "tutorials").glob("*.md"))
WORKFLOW = ROOT / "examples" / "github-actions-gsd.yml"

_BLOCK = re.compile(r"^<!-- run -->\n```(bash|python)\n(.*?)^```$", re.S | re.M)


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    """The (language, code) of every block marked ``<!-- run -->``, in order."""
    return [(m.group(1), m.group(2)) for m in _BLOCK.finditer(text)]


def _env(tmp: Path) -> dict:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)           # the `gsd` console script of this environment
    env.update(PATH=bindir + os.pathsep + env.get("PATH", ""), OMP_NUM_THREADS="1", MPLBACKEND="Agg",
               GSD_CACHE_DIR=str(tmp / "gsd-cache"), GSD_LEDGER=str(tmp / "gsd-ledger.sqlite"),
               GITHUB_STEP_SUMMARY=str(tmp / "step-summary.md"),
               NO_MKDOCS_2_WARNING="1")
    return env


#: a warning about an option (``warning: --k is not used by ...``): a tutorial gives no option it does not need
_OPTION_WARNING = re.compile(r"warning: --[a-z]")


def _run(lang: str, code: str, cwd: Path, env: dict, what: str) -> None:
    cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{what} failed (exit {p.returncode}):\n{code}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
    warned = [line for line in (p.stdout + p.stderr).splitlines() if _OPTION_WARNING.search(line)]
    assert not warned, f"{what} warns about an option (issue 64: a tutorial runs as written, without one):\n" + "\n".join(warned)


def test_block_marker_is_found_and_only_before_a_fence():
    text = "x\n<!-- run -->\n```bash\necho 1\n```\n\n```bash\necho shown only\n```\n<!-- run -->\n```python\nprint(2)\n```\n"
    assert runnable_blocks(text) == [("bash", "echo 1\n"), ("python", "print(2)\n")]
    for page in TUTORIALS:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == "<!-- run -->":
                assert i + 1 < len(lines) and re.match(r"```(bash|python)$", lines[i + 1]), \
                    f"{page.name}:{i + 1}: <!-- run --> must be followed by a ```bash or ```python fence"


def test_there_are_tutorials_and_each_runs_something():
    assert len(TUTORIALS) >= 3
    for page in TUTORIALS:
        assert runnable_blocks(page.read_text()), f"{page.name} has no <!-- run --> block"


@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.stem)
def test_tutorial_runs(page, tmp_path):
    env = _env(tmp_path)
    for i, (lang, code) in enumerate(runnable_blocks(page.read_text())):
        _run(lang, code, tmp_path, env, f"{page.name}, block {i + 1} ({lang})")
    if page.stem == "catalogue-ci":
        # the example workflow's own steps, in the folder where the tutorial wrote gsd.toml
        yaml = pytest.importorskip("yaml")
        steps = yaml.safe_load(WORKFLOW.read_text())["jobs"]["rank"]["steps"]
        runs = [s["run"] for s in steps if "run" in s and not s["run"].lstrip().startswith("pip ")]
        assert any(r.startswith("gsd rank --catalog") for r in runs)
        for r in runs:
            _run("bash", r, tmp_path, env, f"{WORKFLOW.name} step {shlex.split(r)[:3]}")
        assert "mnist-b" in (tmp_path / "step-summary.md").read_text()


def test_readme_quick_start_is_ci_command():
    """The README's two quick-start commands are there as they were, and the second is what CI runs."""
    readme = (ROOT / "README.md").read_text()
    assert "pip install . && gsd rank" in readme
    assert "pip install '.[test]' && pytest" in readme
    assert "pip install '.[test]' && pytest" in (ROOT / ".ci" / "run").read_text()


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")      # the docs extra, pulled by the test extra: present in CI
    pytest.importorskip("mkdocstrings")
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(tmp_path / "site")], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    site = tmp_path / "site"
    assert (site / "index.html").exists() and (site / "tutorials" / "dicom-patients" / "index.html").exists()
    api = (site / "api" / "index.html").read_text()
    for name in ("gsd_cli.ranking.rank", "gsd_cli.ranking.config.RankConfig", "gsd_cli.train.loop.train",
                 "gsd_cli.train.compare.compare", "gsd_cli.ranking.catalog.run_catalog", "gsd_cli.audit.audit"):
        assert f'id="{name}"' in api, f"{name} missing from the API reference"
    assert ":class:" not in api                   # the hook turned Sphinx roles into plain code
    assert "--8&lt;--" not in (site / "tutorials" / "catalogue-ci" / "index.html").read_text()   # snippet included


def test_every_page_is_in_the_nav():
    """Checked without MkDocs too (the strict build also fails on a page left out of the nav)."""
    text = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w./-]+\.md)\s*$", text, re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages == listed, f"not in the nav: {sorted(pages - listed)}; missing files: {sorted(listed - pages)}"


def test_readme_is_a_front_page():
    """README <= 250 lines (issue 35), and every relative link in it names a file that exists."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [l for l in links if not re.match(r"[a-z]+://", l)]
    assert any(l.startswith("docs/") for l in local)
    missing = [l for l in local if not (ROOT / l).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"
