"""Issue 51: `gsd train --help` and `gsd rank --help` fit in 120 lines at 120 columns, each option's
help is one sentence, and the full explanations live in the manual (docs/train.md, docs/rank.md:
"Options reference"), which names every option that --help shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gsd_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["train", "rank"]
MAX_LINES = 120
MAX_WORDS = 25
ABBREVIATIONS = re.compile(r"\b(?:e\.g|i\.e|etc|vs|cf)\.")


def _help(command: str, columns: int = 120) -> str:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def _options(command: str) -> list:
    """The options --help shows (hidden ones, such as the list arguments after --public, aside)."""
    params = typer.main.get_command(app).commands[command].params
    return [p for p in params if not getattr(p, "hidden", False) and p.opts and p.opts[0].startswith("-")]


def sentences(text: str) -> int:
    """How many sentences a help text has: a sentence ends at '.', '!' or '?' followed by a space (or the
    end), an abbreviation such as 'e.g.' aside."""
    text = ABBREVIATIONS.sub("", " ".join(text.split()))
    return len(re.findall(r"[.!?](?:\s|$)", text)) or 1


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_in_120_lines_at_120_columns(command):
    text = _help(command)
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES, f"gsd {command} --help is {len(lines)} lines at 120 columns (at most {MAX_LINES})"
    assert max(len(line) for line in lines) <= 120
    assert "…" not in text  # nothing cut off


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_help_is_one_sentence(command):
    options = _options(command)
    assert len(options) > 20
    too_long = []
    for p in options:
        help_text = p.help or ""
        assert help_text.strip(), f"{p.opts[0]} has no help"
        if sentences(help_text) > 1 or len(help_text.split()) > MAX_WORDS or "\n\n" in help_text:
            too_long.append(f"{p.opts[0]}: {help_text!r}")
    assert not too_long, "help texts longer than one sentence (the full text goes to the manual):\n" + "\n".join(too_long)


def test_the_sentence_rule():
    assert sentences("Glob patterns, e.g. 'fc.*' (default: all).") == 1
    assert sentences("Seed of the draws.") == 1
    assert sentences("No trailing stop") == 1
    assert sentences("Rank first. Then train.") == 2
    assert sentences("Default: 12 for dpsgd; else 20. See docs/train.md.") == 2


@pytest.mark.parametrize("command", COMMANDS)
def test_the_manual_gives_every_option_in_full(command):
    """What --help leaves out is in the manual's "Options reference": every option is named there."""
    text = (ROOT / "docs" / f"{command}.md").read_text()
    assert "## Options reference" in text
    reference = text.split("## Options reference", 1)[1].split("\n## ", 1)[0]
    missing = [p.opts[0] for p in _options(command)
               if p.opts[0] != "--help" and not re.search(r"`" + re.escape(p.opts[0]) + r"[ `/]", reference)]
    assert not missing, f"docs/{command}.md's Options reference does not give {missing}"


def test_the_tuned_defaults_are_still_said():
    """TUNED_NOTE (where --lr, --epochs and --batch-size come from) stays in the one sentence of each."""
    params = {p.opts[0]: p.help for p in _options("train")}
    for flag, tuned, untuned in (("--lr", "0.5", "0.1"), ("--epochs", "12", "20"), ("--batch-size", "500", "250")):
        assert f"default {tuned} for dpsgd and second-phase on fmnist-cnn" in params[flag], flag
        assert "tuned on the held-out benchmark's selection tasks" in params[flag] and f"else {untuned}" in params[flag]
