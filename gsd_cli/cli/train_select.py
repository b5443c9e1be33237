"""``gsd train --auto-select --select-epsilon``'s private advice on the console: the budget's split, the
choice between the DP feature probe and the DP selection on GSD, and the probe's call and lines
(:mod:`gsd_cli.train.dp_advice`). The command itself is :mod:`gsd_cli.cli.train`."""

from __future__ import annotations

from rich.markup import escape

from ..errors import GSDError
from .common import err, out, with_progress


def warn(message: str) -> None:
    """One ``warning:`` line on stderr (a :class:`gsd_cli.train.size.Info`: one plain line of information)."""
    from ..train.size import Info

    prefix = "" if isinstance(message, Info) else "[yellow]warning:[/] "
    err.print(prefix + escape(" ".join(str(message).split())), highlight=False, soft_wrap=True)


def uses_dp_probe(method: str, probe_repeats: int) -> bool:
    """Whether ``--select-epsilon``'s advice is the DP feature probe (``--method auto`` or ``second-phase``,
    ``--probe-repeats`` not 0; a multi-label task aside), else the DP selection on GSD (:mod:`gsd_cli.distance.dpselect`)."""
    return method in ("auto", "second-phase") and bool(probe_repeats)


def dp_probe_selection(cfg, private: str, publics: list, *, private_test, catalog, select_epsilon: float, total: tuple,
                       fallback: bool, device: str, quiet: bool, classes=None) -> dict | None:
    """``--auto-select --select-epsilon`` with the DP feature probe (:func:`gsd_cli.train.select.dp_advised_selection`):
    books and draws it, prints its (public) decision, sets the run's method, public set and the training's
    share of the total (:func:`gsd_cli.train.dp_advice.split_budget`); returns the selection's record for the
    summary, or None for a multi-label task (then the DP selection on GSD decides)."""
    from ..train.dp_advice import split_budget
    from ..train.select import dp_advised_selection

    train_epsilon, train_delta, selection_delta = split_budget(total[0], total[1], select_epsilon)
    advised = with_progress(
        quiet, lambda pr: dp_advised_selection(private, publics, cfg.method, settings=cfg, epsilon=select_epsilon, delta=selection_delta,
                                               private_test=private_test, catalog=catalog, seed=cfg.seed, device=device,
                                               insecure_seed=cfg.private_seed, progress=pr, classes=classes), private=True)
    if advised is None:
        return None
    decision, record = advised
    cfg.epsilon, cfg.delta = train_epsilon, train_delta
    out.print(escape(decision.message), highlight=False, soft_wrap=True)
    record = {**record, "advice": decision.to_dict(), "total": {"epsilon": total[0], "delta": total[1]}}
    if record.get("privacy") is None:  # nothing to choose (public facts): nothing spent, the training gets the whole total
        cfg.epsilon, cfg.delta = total
        record["reads_private"] = False
    if decision.refused and fallback:
        raise GSDError(decision.message)
    if decision.refused:  # --no-fallback: the second phase with the first candidate (it can use), against the advice
        forced = decision.public or publics[0]
        warn(f"--no-fallback: training second-phase with {forced} against the advice ({decision.message})")
        cfg.method, cfg.public = "second-phase", forced
    else:
        cfg.method, cfg.public = decision.method, decision.public
    cfg.public_distance = None
    spent = record.get("privacy") is not None
    out.print(f"privacy: the run's total is epsilon {total[0]:g}, delta {total[1]:.3g} (basic composition): the selection "
              + (f"{select_epsilon:g}, delta {selection_delta:.3g}" if spent else "nothing (no candidate to choose)")
              + f"; the training {cfg.epsilon:g}, delta {cfg.delta:.3g}", highlight=False, soft_wrap=True)
    from ..train.config import validate

    validate(cfg)
    if cfg.public is not None:
        out.print(f"training with [bold]{escape(cfg.public)}[/] (--method {cfg.method})")
    else:
        out.print(f"training without public data (--method {cfg.method})")
    return record
