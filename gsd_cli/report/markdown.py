"""Rendering rankings as GitHub-flavoured Markdown (to paste in a pull request)."""

from __future__ import annotations

from ..ranking import Ranking


def to_markdown(rankings: list[Ranking], failures: list[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table per ranking (to paste in a pull request), then failed checks."""

    def cell(text) -> str:
        return str(text).replace("|", "\\|")

    def num(x: float) -> str:
        return "-" if x != x else f"{x:.4f}"

    parts = []
    for rk in rankings:
        why_not = "--insecure-seed" if rk.privacy and rk.privacy.get("exact", True) else "no proven guarantee"
        kind = ("DP-GSD" if getattr(rk, "dp", False) else f"DP-GSD (NOT DP: {why_not})") if rk.privacy else (
            "GSD (not DP)" if getattr(rk, "metric", "gsd") == "gsd" else f"{rk.metric} (not DP: a non-private metric on the private data)")
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
