"""Rendering a ranking: rich tables for people (:mod:`.table`), JSON and CSV for machines
(:mod:`.files`), Markdown for pull requests (:mod:`.markdown`) and a PNG plot (:mod:`.plots`), for a
ranking, a ranking over repeats and a catalogue's several jobs.

The JSON is :meth:`gsd_cli.ranking.Ranking.to_dict` (or ``RepeatRanking.to_dict``), written by
:func:`write_json`. The training report of ``gsd train`` is :mod:`gsd_cli.train.report`.
"""

from __future__ import annotations

from .files import (
    check_distinct,
    check_output_path,
    jobs_to_csv,
    jobs_to_json,
    repeats_csv,
    to_csv,
    to_json,
    write_csv,
    write_json,
    write_repeats_csv,
    write_text,
)
from .markdown import to_markdown
from .plots import check_plot_path, write_plot
from .table import dp_repeats_line, how_to_read, print_ranking, print_repeats, privacy_line, ranking_table, repeats_table, tie_line

__all__ = [
    "check_distinct", "check_output_path", "check_plot_path", "write_text", "to_json", "to_csv", "write_json", "write_csv",
    "repeats_csv", "write_repeats_csv", "jobs_to_csv", "jobs_to_json", "to_markdown", "write_plot",
    "ranking_table", "repeats_table", "how_to_read", "privacy_line", "tie_line", "dp_repeats_line",
    "print_ranking", "print_repeats",
]
