"""Rendering a ranking: rich table for people, JSON and CSV for machines."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import GSDError
from .ranking import Ranking


def check_output_path(path: str | Path | None, what: str) -> Path | None:
    """Fail before any work if an output path cannot be written (missing folder, is a folder)."""
    if path is None:
        return None
    path = Path(path).expanduser()
    if path.is_dir():
        raise GSDError(f"{what} {path} is a folder; give a file name")
    if not path.parent.exists():
        raise GSDError(f"{what} {path}: folder {path.parent} does not exist; create it first")
    return path


def _atomic_write(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so an interrupted run never leaves half a file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def to_json(ranking: Ranking) -> str:
    return json.dumps(ranking.to_dict(), indent=2) + "\n"


def to_csv(ranking: Ranking) -> str:
    buf = io.StringIO()
    cols = ["rank", "public", "distance", "examples", "private", "model", "k", "seed", "labels", "row_norm", "min_angle_deg",
            "max_angle_deg", "dp"]
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    for r in ranking:
        w.writerow({
            "rank": r.rank, "public": r.public, "distance": f"{r.distance:.6f}", "examples": r.examples,
            "private": ranking.private, "model": ranking.model, "k": ranking.k, "seed": ranking.seed,
            "labels": ranking.labels, "row_norm": ranking.row_norm,
            "min_angle_deg": r.principal_angles_deg[0], "max_angle_deg": r.principal_angles_deg[-1],
            "dp": str(bool(getattr(ranking, "dp", False))).lower(),
        })
    return buf.getvalue()


def write_json(ranking: Ranking, path: str | Path) -> None:
    _atomic_write(Path(path), to_json(ranking))


def write_csv(ranking: Ranking, path: str | Path) -> None:
    _atomic_write(Path(path), to_csv(ranking))


def ranking_table(ranking: Ranking) -> Table:
    pv = ranking.privacy
    kind = "GSD (not DP)"
    if pv:
        kind = f"DP-GSD (epsilon={pv['epsilon']:g}" + (")" if pv["exact"] else ", no proven guarantee)")
        if pv.get("insecure_seed") is not None:
            kind = f"DP-GSD with --insecure-seed (NOT DP, epsilon={pv['epsilon']:g} only if the seed is secret)"
    t = Table(
        title=f"{kind} to private [bold]{escape(ranking.private)}[/] ({ranking.private_examples} examples)",
        caption=(
            f"model {ranking.model}, p={ranking.num_params:,} parameters"
            + (f" (--peft {escape(ranking.peft)})" if getattr(ranking, "peft", None) else "")
            + (" from pre-trained weights" if getattr(ranking, "weights", None) else "")
            + (f" sketched to {ranking.sketch}" if ranking.sketch else "")
            + f", k={ranking.k}, seed {ranking.seed}, "
            f"labels {ranking.labels}, row norm {ranking.row_norm}"
        ),
    )
    t.add_column("rank", justify="right")
    t.add_column("public", overflow="fold")
    t.add_column("distance", justify="right")
    t.add_column("", min_width=10, no_wrap=True)
    t.add_column("angles min..max", justify="right")
    t.add_column("examples", justify="right")
    for r in ranking:
        bar = "█" * max(1, round(10 * r.distance))
        name = f"[bold green]{escape(r.public)}[/]" if r.winner else escape(r.public)
        t.add_row(
            f"[bold green]★ {r.rank}[/]" if r.winner else str(r.rank), name, f"{r.distance:.4f}", bar,
            f"{r.principal_angles_deg[0]:.0f}°..{r.principal_angles_deg[-1]:.0f}°", str(r.examples),
        )
    return t


def how_to_read(ranking: Ranking) -> str:
    return (
        f"Lower is closer: 0 = the same top-{ranking.k} gradient subspace as the private data, 1 = orthogonal; "
        f"a uniformly random {ranking.k}-dim subspace would score about {ranking.uniform_baseline:.4f}. "
        f"★ marks the best candidate."
    )


def privacy_line(ranking: Ranking) -> str | None:
    pv = ranking.privacy
    if not pv:
        return None
    delta = "0" if pv["delta"] == 0 else "unknown"
    sample = "exact sample" if pv["exact"] else "NOT an exact sample"
    return (
        f"DP-GSD: {pv['mechanism']} mechanism, epsilon={pv['epsilon']:g}, delta={delta}, clip={pv['clip']:g}, "
        f"k={pv['k']}, at most {pv['examples']} private examples, {sample}: {pv['guarantee']} "
        f"({pv['neighbouring']}); spent once for all candidates."
    )


def print_ranking(ranking: Ranking, console: Console | None = None) -> None:
    console = console or Console()
    console.print(ranking_table(ranking))
    console.print(how_to_read(ranking))
    line = privacy_line(ranking)
    if line:
        console.print(escape(line))
        lo, hi = ranking.privacy["uniform_distance_99"]
        console.print(f"A uniformly random subspace scores {lo:.4f}..{hi:.4f} (99%).")
    for w in ranking.warnings:
        console.print(f"[bold yellow]warning:[/] {escape(w)}")


def to_markdown(rankings: list[Ranking], failures: list[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table per ranking (to paste in a pull request), then failed checks."""

    def cell(text) -> str:
        return str(text).replace("|", "\\|")

    def num(x: float) -> str:
        return "-" if x != x else f"{x:.4f}"

    parts = []
    for rk in rankings:
        kind = ("DP-GSD" if getattr(rk, "dp", False) else "DP-GSD (NOT DP: --insecure-seed)") if rk.privacy else "GSD (not DP)"
        reps = getattr(rk, "repeats", 1)
        head = (
            f"### {kind} to `{cell(rk.private)}` ({rk.private_examples} examples)\n\n"
            f"model {cell(rk.model)}, p={rk.num_params:,}, k={rk.k}, seed {rk.seed}, labels {rk.labels}, "
            f"row norm {rk.row_norm}; a random subspace scores about {rk.uniform_baseline:.4f}"
        )
        if reps > 1:
            level = round(100 * rk.level)
            parts.append(
                head + f"; {reps} repeats, ranked by the mean; `= ★`: tied with the winner ({rk.tie_test})\n\n"
                f"| rank | public | mean ± sd | {level}% CI | wins | examples |\n|---:|---|---:|---:|---:|---:|\n"
                + "".join(
                    f"| {r.rank}{' ★' if r.winner else (' = ★' if r.tied else '')} | `{cell(r.public)}` | "
                    f"{r.mean:.4f} ± {num(r.sd)} | {num(r.ci_low)}..{num(r.ci_high)} | {r.win_fraction:.0%} | {r.examples} |\n"
                    for r in rk
                )
            )
            continue
        parts.append(
            head + "\n\n| rank | public | distance | examples |\n|---:|---|---:|---:|\n"
            + "".join(
                f"| {r.rank}{' ★' if r.winner else ''} | `{cell(r.public)}` | {r.distance:.4f} | {r.examples} |\n" for r in rk
            )
        )
    if failures:
        parts.append("**Checks failed:**\n\n" + "".join(f"- {cell(f)}\n" for f in failures))
    elif failures is not None:
        parts.append("All checks passed.\n")
    return "\n".join(parts)


def jobs_to_csv(rankings: list[tuple[str, Ranking]]) -> str:
    """Several rankings (a catalogue) in one CSV: a ``job`` column, then each ranking's own columns
    (:func:`to_csv`, or the repeats' columns for a ranking over repeats); a column that one job lacks
    is empty in its rows."""
    from .repeats_report import repeats_csv

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


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    _atomic_write(Path(path), text)
