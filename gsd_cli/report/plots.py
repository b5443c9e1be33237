"""The PNG plot of a ranking (over repeats): each candidate's distances, mean and interval."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from ..errors import GSDError
from .outputs import save_output
from ..ranking import Ranking
from .files import check_output_path


def check_plot_path(path: str | Path | None, force: bool = False) -> Path | None:
    """Like :func:`gsd_cli.report.check_output_path`, and the name must end in .png."""
    path = check_output_path(path, "--plot", force)
    if path is not None and str(path) != "-" and path.suffix.lower() != ".png":
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
    from .. import __version__
    from .outputs import PNG_SOFTWARE

    meta = {"Software": f"{PNG_SOFTWARE} {__version__} (matplotlib)"}  # a later run may write through a link to it (outputs.written_by_gsd)
    save_output(path, lambda f: fig.savefig(f, format="png", dpi=120, metadata=meta), binary=True, suffix=".png")


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
