"""The evidence pages are manuals, their history in evidence logs (issue 51).

docs/validity.md and docs/speed.md say what holds now, each under 400 lines; the round-by-round history and
older measurements live in docs/evidence/validity-log.md and docs/evidence/speed-log.md, which the site's nav
lists (the manuals stay in it too). Checked without MkDocs; tests/test_docs.py builds the site.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MANUALS = ("validity.md", "speed.md")
LOGS = ("evidence/validity-log.md", "evidence/speed-log.md")


def _nav_pages() -> set[str]:
    """Every page named in mkdocs.yml's nav (the `Title: page.md` lines)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return set(re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.M))


@pytest.mark.parametrize("page", MANUALS)
def test_manual_is_under_400_lines(page):
    lines = (DOCS / page).read_text().splitlines()
    assert len(lines) < 400, f"docs/{page} has {len(lines)} lines: move history to its evidence log"


@pytest.mark.parametrize("page", LOGS)
def test_evidence_log_exists_and_is_in_the_nav(page):
    path = DOCS / page
    assert path.is_file(), f"docs/{page} is missing"
    assert path.read_text().strip(), f"docs/{page} is empty"
    assert page in _nav_pages(), f"docs/{page} is not in mkdocs.yml's nav"


def test_manuals_stay_in_the_nav_and_link_their_logs():
    nav = _nav_pages()
    for manual, log in zip(MANUALS, LOGS):
        assert manual in nav, f"docs/{manual} is not in mkdocs.yml's nav"
        assert f"({log}" in (DOCS / manual).read_text(), f"docs/{manual} does not link to {log}"


def test_the_logs_are_under_an_evidence_log_section():
    text = (ROOT / "mkdocs.yml").read_text()
    m = re.search(r"^  - Evidence log:\n((?:      - .*\n)+)", text, re.M)
    assert m, "mkdocs.yml's nav has no 'Evidence log' section"
    for log in LOGS:
        assert log in m.group(1), f"{log} is not under 'Evidence log'"
