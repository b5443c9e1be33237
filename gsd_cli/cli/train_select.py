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


def split_budget(total_epsilon: float, total_delta: float, select_epsilon: float):
    """The training's and the selection's shares of ``--epsilon``/``--delta`` (:func:`gsd_cli.train.dp_advice.split_budget`)."""
    from ..train.dp_advice import split_budget as split

    return split(total_epsilon, total_delta, select_epsilon)


def dp_probe_path(cfg, probe_repeats: int, private: str, private_test, catalog, classes) -> bool:
    """Whether ``--select-epsilon``'s advice is the DP feature probe (``--method auto`` or ``second-phase``, a
    single-label private task, ``--probe-repeats`` not 0), else the DP selection on GSD (:mod:`gsd_cli.distance.dpselect`)."""
    if cfg.method not in ("auto", "second-phase") or not probe_repeats:
        return False
    from .. import data as gdata
    from ..train.splits import private_parts

    train_part, _ = private_parts(private, private_test, catalog)
    if classes is not None:
        train_part = gdata.with_classes(train_part, classes)
    return not train_part.multilabel


def dp_probe_selection(cfg, private: str, publics: list, *, private_test, catalog, select_epsilon: float, selection_delta: float,
                       total: tuple, fallback: bool, device: str, quiet: bool, classes=None) -> dict:
    """``--auto-select --select-epsilon`` with the DP feature probe (:func:`gsd_cli.train.select.dp_advised_selection`):
    books and draws it, prints its (public) decision, sets the run's method and public set; returns the
    selection's record for the summary."""
    from ..train.select import dp_advised_selection

    decision, record = with_progress(
        quiet, lambda pr: dp_advised_selection(private, publics, cfg.method, settings=cfg, epsilon=select_epsilon, delta=selection_delta,
                                               private_test=private_test, catalog=catalog, seed=cfg.seed, device=device,
                                               insecure_seed=cfg.private_seed, progress=pr, classes=classes), private=True)
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
