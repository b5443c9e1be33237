"""A closed output pipe (``gsd datasets list | head -1``): the reader went away, nothing is wrong, the
command exits 0 without a word. Used by :func:`gsd_cli.cli.app.main` and :func:`gsd_cli.cli.common.print_error`
(here, apart from both, so that neither imports the other)."""

from __future__ import annotations

import os
import sys


def is_devnull(fd: int) -> bool:
    """Whether file descriptor ``fd`` is /dev/null."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(os.devnull))
    except (OSError, ValueError):
        return False


def stdout_unflushable() -> bool:
    """Whether standard output's last buffered text cannot be written: its reader went away."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return True
    except (OSError, ValueError, AttributeError):
        return False
    return False


def closed_pipe() -> int:
    """The reader of the command's output went away (``gsd datasets list | head -1``): nothing is wrong,
    exit 0 without a word. Standard output (and standard error where it is the same pipe) is pointed at
    /dev/null, so that Python's last flush at exit raises nothing, and click's stream wrappers are
    taken off again."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if "PacifyFlushWrapper" in type(stream).__name__:
            setattr(sys, name, getattr(stream, "wrapped", stream))
    try:
        fds = [f.fileno() for f in (sys.stdout, sys.stderr)]  # a test's captured stream has none: nothing to redirect
    except (OSError, ValueError, AttributeError):
        return 0
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            if _broken(fd):
                os.dup2(null, fd)
    finally:
        os.close(null)
    return 0


def _broken(fd: int) -> bool:
    """Whether ``fd`` is a pipe (or socket) whose reader went away: a poll reports an error on it."""
    import select
    import stat as _stat

    try:
        if not (_stat.S_ISFIFO(os.fstat(fd).st_mode) or _stat.S_ISSOCK(os.fstat(fd).st_mode)):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False
