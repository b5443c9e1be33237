"""What every command shares: the consoles, the progress bar, the error line, the checks of its arguments."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import GSDError

out = Console()
err = Console(stderr=True)

T = TypeVar("T")


def progress_bar(quiet: bool, width: int = 24, eta: bool = False):
    """A rich progress bar on stderr and its callback ``progress(name, done, total)``: one task per
    name, started on the first call (so input errors print no empty progress line); the total may grow
    (the Gram path adds passes); a finished ``epoch`` restarts the ``step`` task."""
    from rich.progress import TimeRemainingColumn

    cols = [TextColumn(f"{{task.description:<{width}}}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    bar = Progress(*cols, *([TimeRemainingColumn()] if eta else []), console=err, transient=True, disable=quiet)
    tasks: dict[str, int] = {}

    def progress(name: str, done: int, total: int) -> None:
        if not tasks:
            bar.start()
        if name not in tasks:
            tasks[name] = bar.add_task(name, total=total)
        bar.update(tasks[name], completed=done, total=total)
        if name == "epoch" and "step" in tasks:
            bar.reset(tasks["step"])

    return bar, progress


def with_progress(quiet: bool, fn: Callable[[Callable], T], width: int = 24, eta: bool = False) -> T:
    """``fn(progress)`` under a progress bar that is stopped however ``fn`` ends."""
    bar, progress = progress_bar(quiet, width=width, eta=eta)
    try:
        return fn(progress)
    finally:
        bar.stop()


def print_error(message: str) -> None:
    """One line on stderr: ``error: <message>``."""
    err.print("[bold red]error:[/] " + escape(" ".join(message.split())), highlight=False, soft_wrap=True)


def public_names(public: Optional[List[str]], extra: Optional[List[str]]) -> list[str]:
    """The names of ``--public A B C``: Typer binds A to the option and leaves B C as extra arguments,
    which without a --public are a usage error."""
    if extra and not public:
        raise GSDError(f"unexpected argument(s) {' '.join(extra)}; name public datasets with --public")
    return list(public or []) + list(extra or [])


def new_run_dir(given: Optional[Path], prefix: str) -> Path:
    """``given``, else ``<prefix>-<local time>`` in the working folder."""
    return given or Path(f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}")
