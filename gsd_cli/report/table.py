"""Rendering a ranking for people: the rich table of a ranking and of a ranking over repeats (mean
+- sd, interval, ties, wins), and the lines printed under it (how to read it, privacy, ties)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..ranking import Ranking, RepeatRanking
from ..ranking.results import TIE_TEST
from .files import _fmt


def _baseline(ranking: Ranking) -> str | None:
    """The metric's name when the ranking is by a baseline (not GSD or DP-GSD), else None."""
    m = getattr(ranking, "metric", "gsd")
    return None if m in ("gsd", "dp-gsd") else m


def _kind(ranking: Ranking) -> str:
    m = _baseline(ranking)
    return "GSD (not DP)" if m is None else f"{m} (not DP: a non-private metric on the private data)"


def _title_kind(ranking: Ranking, key: str, insecure: str) -> str:
    """What a table's title calls the ranking: GSD (not DP), a baseline, or the DP distance with its ``key``
    epsilon (``epsilon`` or ``total_epsilon``); ``insecure``: the words for a run with --insecure-seed."""
    pv = ranking.privacy
    if not pv:
        return _kind(ranking)
    if pv.get("insecure_seed") is not None:
        return f"{_dp_name(pv)} with --insecure-seed ({insecure})"
    return f"{_dp_name(pv)} ({key.replace('_', ' ')}={pv[key]:g}" + (")" if pv["exact"] else ", no proven guarantee)")


def _caption(ranking: Ranking) -> str:
    """The settings under a table: model, parameters (--peft, weights, sketch), k, seed, labels, row norm."""
    return (f"model {ranking.model}, p={ranking.num_params:,} parameters"
            + (f" (--peft {escape(ranking.peft)})" if getattr(ranking, "peft", None) else "")
            + (" from pre-trained weights" if getattr(ranking, "weights", None) else "")
            + (f" sketched to {ranking.sketch}" if ranking.sketch else "")
            + f", k={ranking.k}, seed {ranking.seed}, labels {ranking.labels}, row norm {ranking.row_norm}")


def ranking_table(ranking: Ranking) -> Table:
    pv = ranking.privacy or {}
    kind = _title_kind(ranking, "epsilon", f"NOT DP, epsilon={pv.get('epsilon', 0):g} only if the seed is secret")
    t = Table(title=f"{kind} to private [bold]{escape(ranking.private)}[/] ({ranking.private_examples} examples)",
              caption=_caption(ranking))
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
            f"{r.principal_angles_deg[0]:.0f}°..{r.principal_angles_deg[-1]:.0f}°" if r.principal_angles_deg else "-", str(r.examples),
        )
    return t


def repeats_table(ranking: RepeatRanking) -> Table:
    kind = _title_kind(ranking, "total_epsilon", "NOT DP")
    t = Table(title=f"{kind} to private [bold]{escape(ranking.private)}[/] ({ranking.private_examples} examples), "
              f"{ranking.repeats} repeat{'s' if ranking.repeats != 1 else ''}", caption=_caption(ranking))
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


def how_to_read(ranking: Ranking) -> str:
    m = _baseline(ranking)
    if m is not None:
        from ..distance.registry import distance_reading

        return f"--metric {m}: {distance_reading(m) or 'lower is closer'}. ★ marks the best candidate."
    return (
        f"Lower is closer: 0 = the same top-{ranking.k} gradient subspace as the private data, 1 = orthogonal; "
        f"a uniformly random {ranking.k}-dim subspace would score about {ranking.uniform_baseline:.4f}. "
        f"★ marks the best candidate."
    )


def _dp_name(pv: dict) -> str:
    """What a DP ranking's table calls itself: DP-GSD, the DP selection (gsd rank --dp's default), or the
    DP energy distance's noisy order (--metric dp-energy)."""
    if pv.get("release") == "selection":
        return "DP selection"
    return "DP energy" if pv.get("mechanism") == "laplace-energy" else "DP-GSD"


def selection_line(ranking: Ranking) -> str | None:
    """What a DP selection released and how; None for another ranking."""
    pv = ranking.privacy or {}
    if pv.get("release") != "selection":
        return None
    top = pv["top"]
    chose = "the winner" if top == 1 else f"the top {top}, in the order chosen"
    noise = f" (each share +- Laplace of scale {pv['share_noise_scale']:.2g})" if pv.get("share_noise_scale") is not None else ""
    margin = (f", then the winner's energy margin over the in-run noise references by the Laplace mechanism at "
              f"epsilon={pv['epsilon_margin']:g} (sensitivity 4 C^2)"
              if pv.get("epsilon_margin") else "")  # gsd train --auto-select --select-epsilon: part of the scores' share
    return (f"DP selection: {chose} by {pv['mechanism']} at epsilon={pv['epsilon_select']:g} on the clipped regret "
            f"(sensitivity {pv['regret_clip']:g} C^2, whatever the number of candidates), then the chosen candidates' DP energy "
            f"distances by the Laplace mechanism at epsilon={pv['epsilon_score']:g}{noise}{margin}; epsilon={pv['epsilon']:g} in all, "
            f"delta=0, clip={pv['clip']:g}, k={pv['k']}, at most {pv['examples']} private examples ({pv['neighbouring']}). "
            "What is DP: " + pv["what_is_dp"] + ".")


def privacy_line(ranking: Ranking) -> str | None:
    pv = ranking.privacy
    if not pv:
        return None
    if pv.get("release") == "selection":
        return selection_line(ranking)
    delta = "0" if pv["delta"] == 0 else "unknown"
    energy = pv["mechanism"] == "laplace-energy"  # --metric dp-energy: noisy numbers, no sampled subspace
    sample = "exact noise" if energy else ("exact sample" if pv["exact"] else "NOT an exact sample")
    sketch = f" Sketch: {pv['sketch_description']}." if pv.get("sketch") and pv.get("sketch_description") else ""
    return (
        f"{'DP energy distance, noisy order of all candidates, each score Laplace-noised' if energy else 'DP-GSD'}: "
        f"{pv['mechanism']} mechanism, epsilon={pv['epsilon']:g}, "
        f"delta={delta}, clip={pv['clip']:g}, k={pv['k']}, at most {pv['examples']} private examples, {sample}: "
        f"{pv['guarantee']} ({pv['neighbouring']}); spent once for all candidates.{sketch}"
    )


def tie_line(ranking: RepeatRanking) -> str:
    """How the ties were decided (or why they could not be)."""
    if ranking.repeats < 2:
        return "One repeat: no interval and no tie test is possible; use --repeats 5 or more to see which candidates are tied."
    if ranking.tie_test.startswith("not run"):
        return f"Ranked by the mean over {ranking.repeats} repeats; tie test {ranking.tie_test}."
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


def _print_notes(ranking: Ranking, console: Console, privacy_lines: list[str]) -> None:
    """The privacy lines (if any) with the random subspace's 99% range, then the warnings."""
    for line in privacy_lines:
        console.print(escape(line))
    if privacy_lines and "uniform_distance_99" in ranking.privacy:  # not for --metric dp-energy (no subspace is drawn)
        lo, hi = ranking.privacy["uniform_distance_99"]
        console.print(f"A uniformly random subspace scores {lo:.4f}..{hi:.4f} (99%).")
    for w in ranking.warnings:
        console.print(f"[bold yellow]warning:[/] {escape(w)}")


def _validity(ranking: Ranking, console: Console) -> None:
    """The measured worth of GSD's order (gsd_cli/report/validity.json), under a GSD ranking."""
    from .validity import validity_line

    line = validity_line(getattr(ranking, "metric", "gsd"))
    if line:
        console.print(f"[dim]{escape(line)}[/]")


def not_ranked_line(ranking: Ranking) -> str:
    """The line naming the candidates ``gsd train --auto-select`` left out of its ranking (``ranking.not_ranked``)."""
    return ("Not ranked (the feature probe found no gain from them, or the second phase cannot use them): "
            f"{', '.join(ranking.not_ranked)}.")


def stopped_line(ranking: Ranking) -> str:
    """The line naming the candidates whose draws ``gsd train --auto-select`` stopped (``ranking.stopped``: their test
    against the noise references was decided to fail before their last draw)."""
    names = ", ".join(f"{n} (after {st['draws']} of {st['of']} draws)" for n, st in ranking.stopped.items())
    return f"Not closer than noise, whatever their remaining draws (not drawn): {names}."


def left_out_lines(ranking: Ranking) -> list[str]:
    """The lines on the candidates ``gsd train --auto-select`` left out of its table: not ranked, or stopped."""
    return ([not_ranked_line(ranking)] if getattr(ranking, "not_ranked", None) else []) + (
        [stopped_line(ranking)] if getattr(ranking, "stopped", None) else [])


def print_ranking(ranking: Ranking, console: Console | None = None, validity: bool = False) -> None:
    """The ranking's table and the lines that read it; ``validity``: also the measured worth of GSD's order and of
    the advice (:func:`gsd_cli.report.validity.validity_line`, a paragraph: ``gsd rank --validity``)."""
    console = console or Console()
    console.print(ranking_table(ranking))
    if getattr(ranking, "not_selected", None):
        console.print(f"Not chosen (nothing released about them: no score, no order): {escape(', '.join(ranking.not_selected))}.",
                      highlight=False)
    for line in left_out_lines(ranking):
        console.print(escape(line), highlight=False)
    console.print(how_to_read(ranking))
    if validity:
        _validity(ranking, console)
    line = privacy_line(ranking)
    _print_notes(ranking, console, [line] if line else [])


def print_repeats(ranking: RepeatRanking, console: Console | None = None, validity: bool = False) -> None:
    """:func:`print_ranking` of a ranking over repeats: its table, the tie test and (``validity``) the measured worth."""
    console = console or Console()
    console.print(repeats_table(ranking))
    console.print(how_to_read(ranking))
    if validity:
        _validity(ranking, console)
    console.print(escape(tie_line(ranking)))
    line = privacy_line(ranking)
    lines = [line.replace("spent once for all candidates", "per release"), dp_repeats_line(ranking)] if line else []
    _print_notes(ranking, console, lines)
