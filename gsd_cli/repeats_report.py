"""Rendering a ranking over repeats: rich table (mean +- sd, 95% interval, ties, wins), CSV with
every repeat's distance, and a PNG plot of the distances with their intervals.

The JSON is :meth:`gsd_cli.repeats.RepeatRanking.to_dict` (written by :func:`gsd_cli.report.write_json`).
"""

from __future__ import annotations

import csv
import io
import math
import os
import tempfile
from pathlib import Path
from typing import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import GSDError
from .ranking import Ranking
from .report import _atomic_write, check_output_path, how_to_read, privacy_line
from .repeats import TIE_TEST, RepeatRanking


def _fmt(x: float, spec: str = ".4f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def repeats_table(ranking: RepeatRanking) -> Table:
    pv = ranking.privacy
    kind = "GSD (not DP)"
    if pv:
        kind = f"DP-GSD (total epsilon={pv['total_epsilon']:g}" + (")" if pv["exact"] else ", no proven guarantee)")
        if pv.get("insecure_seed") is not None:
            kind = "DP-GSD with --insecure-seed (NOT DP)"
    t = Table(
        title=f"{kind} to private [bold]{escape(ranking.private)}[/] ({ranking.private_examples} examples), "
        f"{ranking.repeats} repeat{'s' if ranking.repeats != 1 else ''}",
        caption=(
            f"model {ranking.model}, p={ranking.num_params:,} parameters"
            + (f" sketched to {ranking.sketch}" if ranking.sketch else "")
            + f", k={ranking.k}, seed {ranking.seed}, labels {ranking.labels}, row norm {ranking.row_norm}"
        ),
    )
    t.add_column("rank", justify="right")
    t.add_column("public", overflow="fold")
    t.add_column("mean ± sd", justify="right", no_wrap=True)
    t.add_column(f"{round(100 * ranking.level)}% CI", justify="right", no_wrap=True)
    t.add_column("tie", justify="center", no_wrap=True)
    t.add_column("wins", justify="right")
    t.add_column("examples", justify="right")
    for r in ranking:
        name = f"[bold green]{escape(r.public)}[/]" if r.winner else escape(r.public)
        tie = "[bold green]★[/]" if r.winner else ("[yellow]= ★[/]" if r.tied else "")
        t.add_row(
            f"[bold green]★ {r.rank}[/]" if r.winner else str(r.rank), name,
            f"{r.mean:.3f} ± {_fmt(r.sd, '.3f')}", f"{_fmt(r.ci_low, '.3f')}..{_fmt(r.ci_high, '.3f')}", tie,
            f"{r.win_fraction:.0%}", str(r.examples),
        )
    return t


def tie_line(ranking: RepeatRanking) -> str:
    """How the ties were decided (or why they could not be)."""
    if ranking.repeats < 2:
        return "One repeat: no interval and no tie test is possible; use --repeats 5 or more to see which candidates are tied."
    tied = [r.public for r in ranking if r.tied]
    who = (", ".join(tied) + (" is" if len(tied) == 1 else " are") + " tied with the winner") if tied else "no candidate is tied with the winner"
    return (
        f"Ranked by the mean over {ranking.repeats} repeats (examples, random labels and w0 drawn anew in each); "
        f"interval: {round(100 * ranking.level)}% Student-t interval for the mean; '= ★': tied with the winner "
        f"by a {TIE_TEST}. Here {who}."
    )


def dp_repeats_line(ranking: RepeatRanking) -> str | None:
    pv = ranking.privacy
    if not pv:
        return None
    if pv["dp_repeats"] == "shared":
        how = (
            f"one private DP sample shared by all {pv['repeats']} repeats (only the public examples and labels vary): "
            f"total epsilon = {pv['total_epsilon']:g}"
        )
    else:
        how = (
            f"a fresh private DP sample in each of the {pv['repeats']} repeats: total epsilon = {pv['repeats']} x "
            f"{pv['epsilon_per_release']:g} = {pv['total_epsilon']:g} (basic composition of pure DP, delta = 0)"
        )
    return "Repeats under DP: " + how + "."


def print_repeats(ranking: RepeatRanking, console: Console | None = None) -> None:
    console = console or Console()
    console.print(repeats_table(ranking))
    console.print(how_to_read(ranking))
    console.print(escape(tie_line(ranking)))
    line = privacy_line(ranking)
    if line:
        console.print(escape(line.replace("spent once for all candidates", "per release")))
        console.print(escape(dp_repeats_line(ranking)))
        lo, hi = ranking.privacy["uniform_distance_99"]
        console.print(f"A uniformly random subspace scores {lo:.4f}..{hi:.4f} (99%).")
    for w in ranking.warnings:
        console.print(f"[bold yellow]warning:[/] {escape(w)}")


def repeats_csv(ranking: RepeatRanking) -> str:
    """One row per candidate: the summary, then ``distance_repeat_<r>`` for each repeat r (seeds in
    ``repeat_seeds`` of the JSON), then the settings."""
    buf = io.StringIO()
    reps = [f"distance_repeat_{i}" for i in range(ranking.repeats)]
    cols = ["rank", "public", "mean", "sd", "ci_low", "ci_high", "win_fraction", "tied", "p_value_holm", "examples",
            *reps, "repeats", "private", "model", "k", "seed", "labels", "row_norm", "total_epsilon", "dp"]
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
            "dp": str(bool(getattr(ranking, "dp", False))).lower(),
        })
    return buf.getvalue()


def write_repeats_csv(ranking: RepeatRanking, path: str | Path) -> None:
    _atomic_write(Path(path), repeats_csv(ranking))


def check_plot_path(path: str | Path | None) -> Path | None:
    """Like :func:`gsd_cli.report.check_output_path`, and the name must end in .png."""
    path = check_output_path(path, "--plot")
    if path is not None and path.suffix.lower() != ".png":
        raise GSDError(f"--plot {path}: the plot is a PNG image; give a file name ending in .png")
    return path


def write_plot(ranking: Ranking | Sequence[tuple[str, Ranking]], path: str | Path) -> None:
    """PNG of each candidate's distances (one dot per repeat), mean and interval, best at the top.

    Works for a plain :class:`Ranking` too (one dot each), and for several rankings (a catalogue's
    ``[(job, ranking), ...]``: one panel per job, stacked). Written atomically (temporary file, rename)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    path = Path(path)
    panels = [(None, ranking)] if isinstance(ranking, Ranking) else list(ranking)
    heights = [1.2 + 0.45 * len(rk.results) for _, rk in panels]
    fig = Figure(figsize=(7.5, sum(heights)))
    axes = fig.subplots(len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, (job, rk) in zip(axes, panels):
        _plot_ranking(ax, rk, job)
    fig.tight_layout()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=120)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plot_ranking(ax, ranking: Ranking, job: str | None = None) -> None:
    """Draw one ranking on ``ax`` (see :func:`write_plot`)."""
    rows = list(ranking)
    n = len(rows)
    for i, r in enumerate(rows):
        y = n - 1 - i
        dists = getattr(r, "distances", None) or [r.distance]
        colour = "tab:green" if r.winner else ("tab:orange" if getattr(r, "tied", False) else "tab:grey")
        jitter = [y + 0.12 * ((j % 5) - 2) / 2 for j in range(len(dists))]
        ax.scatter(dists, jitter, s=12, color=colour, alpha=0.6, linewidths=0)
        lo, hi = getattr(r, "ci_low", math.nan), getattr(r, "ci_high", math.nan)
        if not (math.isnan(lo) or math.isnan(hi)):
            ax.errorbar([r.distance], [y], xerr=[[r.distance - lo], [hi - r.distance]], fmt="o", color=colour, capsize=4)
        else:
            ax.plot([r.distance], [y], "o", color=colour)
    labels = [r.public + ("  ★" if r.winner else ("  = ★" if getattr(r, "tied", False) else "")) for r in rows]
    ax.set_yticks(range(n - 1, -1, -1))
    ax.set_yticklabels(labels)
    ax.axvline(ranking.uniform_baseline, color="tab:red", linestyle=":", linewidth=1)
    reps = getattr(ranking, "repeats", 1)
    ax.set_xlabel(f"GSD to {ranking.private} (lower is closer; dotted: random subspace {ranking.uniform_baseline:.3f})")
    ax.set_title(
        f"{ranking.model}, k={ranking.k}, m={ranking.private_examples}, {reps} repeat{'s' if reps != 1 else ''}"
        + (f": mean and {round(100 * ranking.level)}% t-interval" if reps > 1 else ""),
        fontsize=10,
    )
    if job is not None and job != ranking.private:
        ax.set_title(f"{job}: " + ax.get_title(), fontsize=10)
    ax.set_xlim(0, 1.02)
    ax.grid(axis="x", alpha=0.3)
