"""What every command shares: the consoles, the progress bar, the error line, the checks of its arguments."""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, List, Optional, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..errors import GSDError
from ..units import duration as _duration  # one writer of durations
from .pipes import closed_pipe

DP_PROGRESS = " (DP)"  # = gsd_cli.distance.side.DP_PROGRESS (not imported: the CLI's start-up stays free of torch)
#: What starts a line of a DP command that carries private figures (= gsd_cli.train.release.PRIVATE_LABEL):
#: every other line is a function of public inputs and DP releases (``grep -v '^private:'`` before publishing a log)
PRIVATE_LABEL = "private:"

class PipeConsole(Console):
    """rich's Console, except on a closed pipe (``gsd datasets list | head -1``): rich points standard
    output at /dev/null and exits 1; here the console goes quiet and a ``BrokenPipeError`` reaches
    :func:`gsd_cli.cli.app.main`, which exits 0 without a word (:func:`gsd_cli.cli.pipes.closed_pipe`)."""

    def on_broken_pipe(self) -> None:
        import errno

        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the reader of gsd's output went away")


out = PipeConsole()
err = PipeConsole(stderr=True)

T = TypeVar("T")


#: progress names counted in whole units (train's epochs, stage 1's public epochs, compare's runs)
UNITS = ("epoch", "public", "runs")



#: seconds a command runs before it prints progress lines off a terminal (a short command stays silent)
PLAIN_AFTER = 15.0


def plain_progress(write: Callable[[str], None], clock: Callable[[], float] = time.monotonic, after: float = PLAIN_AFTER):
    """The callback ``progress(name, done, total)`` for a log (stderr not a terminal: CI, a file):
    plain lines, never more than one per finished unit, once the command has run ``after`` seconds. A
    unit count (:data:`UNITS`) prints one line per finished epoch (run) with its time, the elapsed time
    and an estimate of the time left; a dataset prints an estimate once (at its first chunk past
    ``after`` that is not its first) and one line when done, over all its passes (a ranking's draws, the probe's
    then the ranking's read a set again: a count that goes back starts a pass, timed from its own chunks); the steps of an epoch print one estimate,
    after the first step (past ``after``) of the run.

    Every estimate is timed from the first finished unit, chunk or step on, once there is a second: what
    comes before the first (set-up, reading and decoding, the first step's warm-up and its timing of the
    clipping paths, the model's first pass) happens once, and counted as a unit's time it made "about 38s
    left" of 3.6 s steps. Only the first epoch's line, with nothing else to go by, uses its own time."""
    t0 = clock()
    last_event = [t0]
    began: dict[str, tuple[float, int]] = {}  # name -> (time, done) when it began
    first: dict[str, tuple[float, int]] = {}  # name -> (time, done) of its first progress past the start
    prev: dict[str, tuple[float, int]] = {}  # unit counts: the previous line's (time, done)
    said: set[str] = set()
    last: dict[str, int] = {}  # a dataset's last count: a smaller one starts a new pass

    def progress(name: str, done: int, total: int) -> None:
        now = clock()
        if now - t0 < after:
            write_now = lambda line: None  # noqa: E731 - a short command prints nothing
        else:
            write_now = write
        if name in UNITS:
            if name not in began:
                began[name] = prev[name] = (now, done)
            t_prev, d_prev = prev[name]
            if done > d_prev:
                t_start, d_start = began[name]
                first.setdefault(name, (now, done))
                t_first, d_first = first[name]
                # after the first unit: the units since it (the first carries the warm-up); before: its own time
                per = (now - t_first) / (done - d_first) if done > d_first else (now - t_start) / (done - d_start)
                left = f", about {_duration(per * (total - done))} left" if done < total else ""
                write_now(f"{name} {done}/{total} done in {_duration(now - t_prev)} ({_duration(now - t0)} elapsed{left})")
                prev[name] = (now, done)
        elif name == "step":
            # the rate from the first step seen on: the time before it (set-up, anchors, the first step's
            # warm-up) is not a step's and made "about 7m46s left" of a 38 s step
            if "step" not in said and ("step" not in began or done <= began["step"][1]):
                began["step"] = (now, done)
            elif "step" not in said and 0 < done < total and write_now is write:
                said.add("step")
                t_s, d_s = began["step"]
                took = (now - t_s) / (done - d_s)
                write(f"step {done}/{total} of the epoch: {_duration(took)} a step, about {_duration(took * (total - done))} left in it")
            return  # the epoch lines say the rest
        else:
            if name in last and done < last[name]:  # a new pass over the set (another draw, the probe then the ranking)
                first.pop(name, None)  # its rate is timed from its own chunks: the last pass's made "about 8m15s left" of 40 s
                began.pop(name)
            last[name] = done
            if name not in began:
                began[name] = (last_event[0], 0)  # a dataset's chunks: it began when the previous thing ended
            if 0 < done and name not in first:
                first[name] = (now, done)  # the rate is timed from here: before it, reading, decoding, warm-up
            t_start = began[name][0]
            if done >= total and name + "\0done" not in said:
                if write_now is write:  # a pass finished in silence (before ``after``) leaves the line to a later pass
                    said.add(name + "\0done")
                if name.endswith(DP_PROGRESS):  # a DP private side: its time would tell the private set's size
                    write_now(f"{name}: {total}/{total} done")
                else:
                    write_now(f"{name}: {total}/{total} done in {_duration(now - t_start)} ({_duration(now - t0)} elapsed)")
            elif 0 < done < total and name not in said and write_now is write and done > first[name][1]:
                said.add(name)
                t_first, d_first = first[name]
                rate = (now - t_first) / (done - d_first)
                write(f"{name}: {done}/{total} after {_duration(now - t_start)}, about {_duration(rate * (total - done))} left")
        last_event[0] = now

    return progress


def print_private(console: Console, text: str) -> None:
    """One line that carries private figures, labelled :data:`PRIVATE_LABEL` (``text`` is rich markup)."""
    console.print(f"[yellow]{PRIVATE_LABEL}[/] " + text, highlight=False, soft_wrap=True)


def print_private_lines(console: Console, render: Callable[[Console], None]) -> None:
    """Everything ``render(c)`` prints on a console ``c`` (a table), each line labelled
    :data:`PRIVATE_LABEL`: ``render`` draws on a console of ``console``'s kind, narrower by the label,
    whose lines are then printed after the label (colours kept on a terminal)."""
    from io import StringIO

    from rich.text import Text

    buf = StringIO()
    inner = Console(file=buf, width=max(40, console.width - len(PRIVATE_LABEL) - 1), force_terminal=console.is_terminal,
                    color_system=console.color_system, no_color=console.no_color, highlight=False)
    render(inner)
    for line in buf.getvalue().splitlines():
        console.print(Text.assemble((PRIVATE_LABEL, "yellow"), " ", Text.from_ansi(line)), highlight=False, soft_wrap=True)


class PrivateConsole:
    """A console whose every line is labelled :data:`PRIVATE_LABEL` (``print`` only, as a report writer
    uses it): a string (rich markup) is one private line (:func:`print_private`), anything else (a table)
    is drawn and each of its lines labelled (:func:`print_private_lines`)."""

    def __init__(self, console: Console):
        self.console = console

    def print(self, obj="", *_, **__) -> None:
        if isinstance(obj, str):
            print_private(self.console, obj)
        else:
            print_private_lines(self.console, lambda c: c.print(obj))


def progress_bar(quiet: bool, width: int = 24, eta: bool = False, private: bool = False):
    """A rich progress bar on stderr and its callback ``progress(name, done, total)``: one task per
    name, started on the first call (so input errors print no empty progress line); the total may grow
    (the Gram path adds passes); a finished ``epoch`` restarts the ``step`` task, and a set's count that goes back
    (a new pass: another draw) restarts its task. Off a terminal (CI
    logs, redirected stderr) the bar would print nothing: plain lines instead (:func:`plain_progress`).
    ``quiet``: neither.

    ``private`` (a DP command): the times are private figures (an epoch's time grows with the private
    set's size, and whether a plain line appears at all turns on the time elapsed), so each plain line
    starts with :data:`PRIVATE_LABEL`, and so do the bar's time columns."""
    from rich.progress import TimeRemainingColumn

    plain = not quiet and not err.is_terminal
    cols = [TextColumn(f"{{task.description:<{width}}}", markup=False), BarColumn(), MofNCompleteColumn(),
            *([TextColumn(f"[yellow]{PRIVATE_LABEL}[/]")] if private else []), TimeElapsedColumn()]
    # the rate over every unit since the first (rich's default keeps 30 s of samples: an epoch longer than that
    # never had an estimate)
    bar = Progress(*cols, *([TimeRemainingColumn()] if eta else []), console=err, transient=True, disable=quiet or plain,
                   speed_estimate_period=30 * 86400.0)
    if plain:
        label = PRIVATE_LABEL + " " if private else ""
        return bar, plain_progress(lambda line: err.print(label + line, markup=False, emoji=False, highlight=False, soft_wrap=True),
                                   after=PLAIN_AFTER)  # a name like "mnist-a:train:" is no emoji code
    tasks: dict[str, int] = {}
    counts: dict[str, int] = {}

    def progress(name: str, done: int, total: int) -> None:
        if not tasks:
            bar.start()
        if name not in tasks:
            tasks[name] = bar.add_task(name, total=total)
        elif name not in UNITS and name != "step" and done < counts[name]:
            bar.reset(tasks[name], total=total)  # a new pass over a set (another draw): its own time and rate
        counts[name] = done
        bar.update(tasks[name], completed=done, total=total)
        if name == "epoch" and "step" in tasks:
            bar.reset(tasks["step"])

    return bar, progress


@contextmanager
def shown_data_warnings():
    """Within: each :class:`gsd_cli.errors.DataWarning` (a dataset's files worth a look: a class folder holding
    sub-folders, images of mixed sizes or modes) is one line on stderr, ``private: warning: ...`` (it describes the
    files of a set that may be the private one), once per dataset; other warnings as Python shows them."""
    import warnings

    from ..errors import DataWarning

    with warnings.catch_warnings():
        warnings.simplefilter("default", DataWarning)
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, DataWarning):
                print_private(err, "[yellow]warning:[/] " + escape(" ".join(str(message).split())))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def _saying(doing: str, progress: Callable) -> Callable:
    """``progress`` that first prints ``doing`` on stderr, once."""
    said = []

    def first(*args) -> None:
        if not said:
            said.append(True)
            err.print(escape(doing), highlight=False, soft_wrap=True)
        progress(*args)

    return first


def with_progress(quiet: bool, fn: Callable[[Callable], T], width: int = 24, eta: bool = False, private: bool = False,
                  doing: str | None = None) -> T:
    """``fn(progress)`` under a progress bar that is stopped however ``fn`` ends (``private``: :func:`progress_bar`).
    ``doing``: what a long phase does, one line on stderr under ``quiet`` (no bar then: ``gsd train --auto-select -q``
    printed nothing for minutes), when its work starts (its first progress report: a refusal before any work stays
    the one line it was); a public line, fixed before any data is read."""
    bar, progress = progress_bar(quiet, width=width, eta=eta, private=private)
    if quiet and doing:
        progress = _saying(doing, progress)
    try:
        return fn(progress)
    finally:
        bar.stop()


def print_error(message: str, private: bool = False) -> None:
    """One line on stderr: ``error: <message>`` (undecodable bytes of a file name shown as ``\\xff``);
    ``private``: ``private: error: <message>``, a refusal whose occurrence depends on the private data."""
    message = str(message).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    label = f"[yellow]{PRIVATE_LABEL}[/] " if private else ""
    try:
        err.print(label + "[bold red]error:[/] " + escape(" ".join(message.split())), highlight=False, soft_wrap=True, emoji=False)
    except BrokenPipeError:  # nobody reads stderr any more (gsd ... 2>&1 | head): the exit status still says it
        closed_pipe()


def public_names(public: Optional[List[str]], extra: Optional[List[str]]) -> list[str]:
    """The names of ``--public A B C``: Typer binds A to the option and leaves B C as extra arguments,
    which without a --public are a usage error."""
    if extra and not public:
        raise GSDError(f"unexpected argument(s) {' '.join(extra)}; name public datasets with --public")
    return list(public or []) + list(extra or [])


def new_run_dir(given: Optional[Path], prefix: str) -> Path:
    """``given``, else ``<prefix>-<local time>`` in the working folder."""
    return given or Path(f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}")


def catalog_inputs(catalog: str | Path | None) -> list[Path]:
    """Every path a catalogue's datasets and jobs name (for :func:`gsd_cli.report.outputs.check_not_inputs`);
    [] for none, or for a catalogue that does not load (the run reports its error)."""
    from ..ranking.catalog import load_catalog
    from ..data.registry import spec_paths
    from ..errors import GSDError
    from ..models.spec import split_file_reference

    if catalog is None:
        return []
    try:
        cat = load_catalog(catalog)
    except GSDError:
        return []
    found = [cat._rel(p) for e in cat.datasets.values() for p in (e.path, e.groups, e.root) if p]
    for job in cat.jobs:
        found += [p for n in (job.private, *job.candidates) if n not in cat.datasets for p in spec_paths(n)]
        found += [Path(str(job.options["weights"]))] if job.options.get("weights") else []
        ref = split_file_reference(str(job.options.get("model") or ""))
        found += [Path(ref[0])] if ref else []
    return found
