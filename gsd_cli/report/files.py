"""Writing a ranking for machines: output-path checks, atomic writes, JSON and CSV (one ranking, a
ranking over repeats, or a catalogue's several jobs)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from .outputs import check_distinct, check_output_path, write_output  # noqa: F401 - re-exported
from ..ranking import Ranking, RepeatRanking


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` by the one writer, :func:`gsd_cli.report.outputs.write_output` (atomic for a
    file; ``-`` is standard output; devices and pipes written directly)."""
    write_output(path, text)


def _fmt(x: float, spec: str = ".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def to_json(ranking: Ranking) -> str:
    return json.dumps(ranking.to_dict(), indent=2) + "\n"


def to_csv(ranking: Ranking) -> str:
    buf = io.StringIO()
    cols = ["rank", "public", "distance", "examples", "private", "model", "k", "seed", "labels", "row_norm", "min_angle_deg",
            "max_angle_deg", "dp", "metric"]
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for r in ranking:
        w.writerow({
            "rank": r.rank, "public": r.public, "distance": f"{r.distance:.6f}", "examples": r.examples,
            "private": ranking.private, "model": ranking.model, "k": ranking.k, "seed": ranking.seed,
            "labels": ranking.labels, "row_norm": ranking.row_norm,
            "min_angle_deg": r.principal_angles_deg[0] if r.principal_angles_deg else None,
            "max_angle_deg": r.principal_angles_deg[-1] if r.principal_angles_deg else None,
            "dp": str(bool(getattr(ranking, "dp", False))).lower(), "metric": getattr(ranking, "metric", "gsd"),
        })
    return buf.getvalue()


def repeats_csv(ranking: RepeatRanking) -> str:
    """One row per candidate: the summary, then ``distance_repeat_<r>`` for each repeat r (seeds in
    ``repeat_seeds`` of the JSON), then the settings."""
    buf = io.StringIO()
    reps = [f"distance_repeat_{i}" for i in range(ranking.repeats)]
    cols = ["rank", "public", "mean", "sd", "ci_low", "ci_high", "win_fraction", "tied", "p_value_holm", "examples",
            *reps, "repeats", "private", "model", "k", "seed", "labels", "row_norm", "total_epsilon", "dp", "metric"]
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for r in ranking:
        w.writerow({
            "rank": r.rank, "public": r.public, "mean": f"{r.mean:.6f}", "sd": _fmt(r.sd, ".6f"),
            "ci_low": _fmt(r.ci_low, ".6f"), "ci_high": _fmt(r.ci_high, ".6f"), "win_fraction": f"{r.win_fraction:.4f}",
            "tied": int(r.tied), "p_value_holm": "" if r.p_value is None else f"{r.p_value:.6g}", "examples": r.examples,
            **{c: f"{d:.6f}" for c, d in zip(reps, r.distances)},
            "repeats": ranking.repeats, "private": ranking.private, "model": ranking.model, "k": ranking.k,
            "seed": ranking.seed, "labels": ranking.labels, "row_norm": ranking.row_norm,
            "total_epsilon": "" if not ranking.privacy else f"{ranking.privacy['total_epsilon']:g}",
            "dp": str(bool(getattr(ranking, "dp", False))).lower(), "metric": getattr(ranking, "metric", "gsd"),
        })
    return buf.getvalue()


def write_json(ranking: Ranking, path: str | Path) -> None:
    write_text(path, to_json(ranking))


def write_csv(ranking: Ranking, path: str | Path) -> None:
    write_text(path, to_csv(ranking))


def write_repeats_csv(ranking: RepeatRanking, path: str | Path) -> None:
    write_text(path, repeats_csv(ranking))


def jobs_to_csv(rankings: list[tuple[str, Ranking]]) -> str:
    """Several rankings (a catalogue) in one CSV: a ``job`` column, then each ranking's own columns
    (:func:`to_csv`, or the repeats' columns for a ranking over repeats); a column that one job lacks
    is empty in its rows."""
    cols: list[str] = ["job"]
    rows: list[dict] = []
    for name, rk in rankings:
        text = repeats_csv(rk) if getattr(rk, "repeats", 1) > 1 else to_csv(rk)
        reader = csv.DictReader(io.StringIO(text))
        cols += [c for c in reader.fieldnames or [] if c not in cols]
        rows += [{"job": name, **row} for row in reader]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, restval="")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def jobs_to_json(rankings: list[tuple[str, Ranking]], failures: list[str] | None = None) -> str:
    """Several rankings (a catalogue): ``{"jobs": [{"job": NAME, **ranking}], "failures": [...]}``."""
    doc = {"jobs": [{"job": name, **rk.to_dict()} for name, rk in rankings], "failures": list(failures or [])}
    return json.dumps(doc, indent=2) + "\n"
