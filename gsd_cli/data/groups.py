"""Grouped examples (patients, lesions, subjects): splits that keep a group's examples together.

A source with groups gives each example a group id (:meth:`example_groups`): a CSV's ``group_column``
(``csv:PATH?group_column=patient_id``, or ``group_column = "..."`` in a catalogue entry), or for a
folder a groups file (``folder:PATH?groups=FILE``; a catalogue entry's ``groups = "..."``): a CSV with
a file column (``file``, ``path``, ``image``, ``filename``...) holding each image's path relative to
the folder (``<class>/<image>``, the example's identity) and a group column (``group``,
``patient_id``, ``patient``, ``subject``...). Every image of the folder needs a row; rows for files
that are not in the folder are ignored.

The split (:mod:`.splits`) then hashes the *group id* instead of the example's identity: a group is
in ``:test`` iff sha256 of its id falls below 0.2, so a patient's images are never on both sides,
and adding or removing a patient (or one image) moves no other example between train and test.

Privacy: the DP guarantees of ``gsd`` stay per *example* (add/remove one image). Grouping the split
does not make them per patient; patient-level DP would need group privacy (a guarantee for k
examples at once), which ``gsd`` does not claim.

``gsd datasets show`` reports the groups (:func:`gsd_cli.data.splits.group_summary`): how many, how many in each part,
and whether the data's *own* split column (a column ``split``, ``partition``, ``subset`` or ``fold``
of the CSV or groups file) puts a group on both sides, which would leak a patient between the parts
a user made. ``gsd`` does not split by that column; it only checks it.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Sequence


from ..errors import DatasetError

GROUP_COLUMNS = ("group", "group_id", "patient_id", "patientid", "patient id", "patient", "subject_id", "subject",
                 "lesion_id")
FILE_COLUMNS = ("file", "path", "image", "filename", "file_name", "image_path", "filepath")
SPLIT_COLUMNS = ("split", "partition", "subset", "fold")
#: group ids shown where some straddle a split
SHOWN = 5


def pick_column(columns: Sequence[str], wanted: Sequence[str]) -> str | None:
    """The first of ``wanted`` among ``columns`` (case-insensitive), as spelled in ``columns``."""
    low = {c.lower().strip(): c for c in columns}
    return next((low[w] for w in wanted if w in low), None)


def group_cells(name: str, path: Path, rows: list[dict], lines: list[int], column: str) -> list[str]:
    """The stripped group ids of ``column``; an empty cell is a one-line error naming its lines."""
    ids = [(r.get(column) or "").strip() for r in rows]
    bad = [ln for g, ln in zip(ids, lines) if not g]
    if bad:
        shown = ", ".join(map(str, bad[:SHOWN])) + (f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
        raise DatasetError(f"{name}: empty group cell(s) in column {column!r} on line(s) {shown} of {path}; "
                           "give every example its group (patient) id")
    return ids


def read_csv_rows(path: Path, cannot: str, expect: str) -> tuple[list[str], list[dict], list[int]]:
    """``(columns, rows, line numbers)`` of the CSV at ``path`` (a BOM allowed; each row's line number for messages);
    unreadable: one line, ``"{cannot} (the error's kind); give {expect}"``."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            cols = list(reader.fieldnames or [])
            rows, lines = [], []
            for r in reader:
                rows.append(r)
                lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DatasetError(f"{cannot} ({type(e).__name__}); give {expect}") from None
    return cols, rows, lines


def read_groups_file(file: str | Path, keys: Sequence[str], name: str) -> tuple[list[str], list[str] | None, str, str]:
    """``(groups, data_split, split_column, label)`` for the examples whose identities are ``keys``
    (paths relative to the folder), from the groups CSV ``file`` (module docstring). ``data_split``:
    the values of the file's own split column ``split_column`` per example, or None (and "")."""
    file = Path(file).expanduser()
    expect = "a CSV with columns file (the image's path relative to the folder, <class>/<image>) and group"
    if not file.is_file():
        raise DatasetError(f"{name}: groups file {file} not found; give {expect}")
    cols, rows, lines = read_csv_rows(file, f"{name}: cannot read groups file {file}", expect)
    file_col, group_col = pick_column(cols, FILE_COLUMNS), pick_column(cols, GROUP_COLUMNS)
    if file_col is None or group_col is None:
        raise DatasetError(f"{name}: groups file {file} has columns {cols}; give {expect}")
    split_col = pick_column([c for c in cols if c not in (file_col, group_col)], SPLIT_COLUMNS)
    ids = group_cells(name, file, rows, lines, group_col)
    by_file: dict[str, tuple[str, str | None]] = {}
    for r, g, ln in zip(rows, ids, lines):
        key = Path((r.get(file_col) or "").strip()).as_posix()
        value = (g, (r.get(split_col) or "").strip() if split_col else None)
        if key in by_file and by_file[key][0] != g:
            raise DatasetError(f"{name}: groups file {file} gives {key} two groups ({by_file[key][0]!r}, {g!r}; "
                               f"line {ln}); give each image one group")
        by_file[key] = value
    missing = [k for k in keys if k not in by_file]
    if missing:
        more = f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
        raise DatasetError(f"{name}: {len(missing)} image(s) have no row in groups file {file} "
                           f"({', '.join(missing[:SHOWN])}{more}); add a row file,group for each")
    groups = [by_file[k][0] for k in keys]
    data_split = [by_file[k][1] or "" for k in keys] if split_col else None
    return groups, data_split, split_col or "", f"groups file {os.path.basename(file)} (column {group_col!r})"


def straddling(groups: Sequence[str], sides: Sequence) -> list[str]:
    """The group ids whose examples have more than one value of ``sides`` (sorted)."""
    seen: dict[str, set] = {}
    for g, s in zip(groups, sides):
        seen.setdefault(g, set()).add(s)
    return sorted(g for g, s in seen.items() if len(s) > 1)


def straddle_warning(name: str, summary: dict) -> str | None:
    """The one-line warning when the data's own split column puts groups on both sides, else None."""
    n = summary.get("groups_across_data_split") or 0
    if not n:
        return None
    first = ", ".join(map(str, summary.get("groups_across_data_split_first", [])))
    return (f"{name}: its own split column {summary.get('data_split_column')!r} puts {n} group(s) in more than one "
            f"part ({first}{', ...' if n > SHOWN else ''}): those patients' examples are on both sides; "
            "fix the column (gsd's own :train/:test keep each group on one side)")
