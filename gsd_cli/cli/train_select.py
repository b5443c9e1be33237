"""``gsd train --auto-select --select-epsilon``'s private advice on the console: the budget's split, the
choice between the DP feature probe and the DP selection on GSD, and the probe's call and lines
(:mod:`gsd_cli.advice.dp_probe`). The command itself is :mod:`gsd_cli.cli.train`."""

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
                       fallback: bool, device: str, quiet: bool, classes=None):
    """``--auto-select --select-epsilon`` with the DP feature probe (:func:`gsd_cli.advice.select.dp_plan`), printed:
    its (public) decision, the split of the run's total, what it trains. Returns ``(config, selection record)``, or
    None for a multi-label task (then the DP selection on GSD decides)."""
    from ..train.config import validate
    from ..advice.select import dp_plan

    p = with_progress(quiet, lambda pr: dp_plan(cfg, private, publics, select_epsilon=select_epsilon, total=total, fallback=fallback,
                                                private_test=private_test, catalog=catalog, device=device, progress=pr,
                                                classes=classes), private=True,
                      doing=f"--auto-select --select-epsilon: the DP feature probe of {len(publics)} candidate(s) (minutes on a CPU)...")
    if p is None:
        return None
    out.print(escape(p.decision.message), highlight=False, soft_wrap=True)
    if p.error:
        raise GSDError(p.error)
    if p.warning:
        warn(p.warning)
    out.print(p.budget, highlight=False, soft_wrap=True)
    validate(p.config)
    if p.config.public is not None:
        out.print(f"training with [bold]{escape(p.config.public)}[/] (--method {p.config.method})")
    else:
        start = "from the base alone" if p.config.weights is not None else "without public data"
        out.print(f"training {start} (--method {p.config.method})")
    return p.config, p.selection
