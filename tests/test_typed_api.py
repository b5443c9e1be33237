"""Issue 51: the advice, the DP selection's releases and the reference test cross each package boundary as one
typed record, checked the way a user's typed program would meet them: mypy on a small client of the public API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

CLIENT = '''
from gsd_cli.distance.dpselect import ReleasedMargin, ReleasedWinner, SelectionBudget, released_margin, released_winner, selection_budget
from gsd_cli.privacy.accountant import Charge, Ledger
from gsd_cli.ranking.reference import ReferenceTest, closer_than_reference
from gsd_cli.ranking.results import Ranking
from gsd_cli.advice.decide import Decision
from gsd_cli.train.config import TrainConfig
from gsd_cli.advice.select import Plan, plan


def method_of(p: Plan) -> str:
    cfg: TrainConfig = p.config
    d: Decision | None = p.decision
    return cfg.method if d is None else d.method


def trains_with(cfg: TrainConfig) -> str | None:
    p: Plan = plan(cfg, "mnist-a", ["mnist-b"], fallback=True)
    return p.config.public if p.error is None else None


def closer(r: Ranking, name: str) -> bool:
    t: ReferenceTest = closer_than_reference(r, name)
    return t.closer and bool(t.phrase)


def winner(r: Ranking) -> str | None:
    w: ReleasedWinner | None = released_winner(r)
    return None if w is None else w.public


def margin(r: Ranking) -> float | None:
    m: ReleasedMargin = released_margin(r)
    return m.margin


def spent(ledger: Ledger) -> float:
    b: SelectionBudget = selection_budget(2.0, 0.5)
    ledger.add("public-data selection", sum(b.parts), 0.0)
    first: Charge = ledger.entries[0]
    return first.epsilon + ledger.epsilon
'''

#: each a misuse mypy must report: (code, what mypy says)
WRONG = [
    ("def f(p: Plan) -> int:\n    return p.config.method\n", "return-value"),
    ("def f(r: Ranking) -> float:\n    return released_winner(r).distance\n", "union-attr"),
    ("def f(r: Ranking) -> str:\n    return closer_than_reference(r, 'x')[1]\n", "index"),
    ("def f(p: Plan) -> None:\n    p.config = p.config\n", "misc"),  # frozen
    ("def f(led: Ledger) -> float:\n    return led.entries[0]['epsilon']\n", "index"),  # a Charge, not a dict
    ("def f() -> str:\n    return selection_budget(1.0, 0.5).select\n", "return-value"),
]

CONFIG = """[mypy]
follow_imports = silent
ignore_missing_imports = True
cache_dir = {cache}
[mypy-torch.*,torchvision.*,numpy.*,scipy.*,dp_accounting.*,opacus.*,safetensors.*,rich.*,typer.*,peft.*,timm.*,PIL.*,matplotlib.*,sklearn.*,ray.*,pandas.*,pydicom.*,probes.*]
follow_imports = skip
"""


def _mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    (tmp_path / "mypy.ini").write_text(CONFIG.format(cache=tmp_path / "cache"))
    client = tmp_path / "client.py"
    client.write_text(code)
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"), str(client)],
                          capture_output=True, text=True, timeout=600, cwd=root)


def test_a_typed_client_of_the_advice_and_the_dp_releases_type_checks(tmp_path):
    done = _mypy(tmp_path, CLIENT)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("code, error", WRONG)
def test_mypy_reports_a_misuse_of_each_record(tmp_path, code, error):
    done = _mypy(tmp_path, CLIENT + "\n\n" + code)
    assert done.returncode == 1 and f"[{error}]" in done.stdout, done.stdout + done.stderr
