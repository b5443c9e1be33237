"""Where the privacy ledger is (``--ledger``, ``$GSD_LEDGER``, the default file), how long to wait for
another process's lock (``--ledger-timeout``), and the one-line errors of a ledger that cannot be used
(:class:`LedgerError`: "ledger PATH is unusable: why; what to do")."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ...errors import GSDError

#: ``$GSD_LEDGER``: the ledger's file or SQLAlchemy URL.
ENV = "GSD_LEDGER"
#: ``$GSD_LEDGER_TIMEOUT``: seconds to wait for a ledger that another process holds (``--ledger-timeout``).
TIMEOUT_ENV = "GSD_LEDGER_TIMEOUT"
#: File name of the default ledger in the user's data folder.
FILE_NAME = "privacy-ledger.sqlite"
#: Default seconds a ledger operation waits for another process's transaction (``--ledger-timeout``).
BUSY_TIMEOUT = 30.0


class LedgerError(GSDError):
    """The ledger cannot be used (a file that is not a ledger, a server that cannot be reached, a lock
    held past ``--ledger-timeout``): one line, exit 2, nothing booked and no file changed."""


# --- where the ledger is -----------------------------------------------------------------------------

def default_location() -> str:
    """``$GSD_LEDGER``, else ``$XDG_DATA_HOME/gsd/privacy-ledger.sqlite`` (``~/.local/share/gsd/...``).
    Not under ``--data-root`` / ``$GSD_DATA_ROOT``: the budget must not move with the data root."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base).expanduser() / "gsd" / FILE_NAME)


def ledger_timeout(value: float | str | None = None) -> float:
    """Seconds to wait for a ledger held by another process: ``value``, else ``$GSD_LEDGER_TIMEOUT``,
    else :data:`BUSY_TIMEOUT`; a number >= 0 (0: do not wait)."""
    given = value if value is not None else os.environ.get(TIMEOUT_ENV) or None
    if given is None:
        return BUSY_TIMEOUT
    try:
        t = float(given)
    except (TypeError, ValueError):
        t = math.nan
    if not (math.isfinite(t) and 0 <= t <= 86400):
        raise GSDError(f"--ledger-timeout must be a number of seconds from 0 to 86400 (got {given!r})")
    return t


def is_url(location: str) -> bool:
    return "://" in location


def shown(location: str) -> str:
    """The location as messages print it: a URL's password hidden."""
    if not is_url(location):
        return location
    scheme, _, rest = location.partition("://")
    auth, at, host = rest.rpartition("@")
    if at and ":" in auth:
        auth = auth.split(":", 1)[0] + ":***"
    return f"{scheme}://{auth}{at}{host}"


def unusable(location: str, why: str, todo: str) -> LedgerError:
    return LedgerError(f"ledger {shown(location)} is unusable: {why}; {todo}")


def locked(location: str, timeout: float) -> LedgerError:
    return LedgerError(f"ledger {shown(location)} is locked by another process (waited {timeout:g} s); "
                       "try again when that run has booked, or wait longer with --ledger-timeout SECONDS")


def writable(path: str) -> bool:
    """Writable by this process *and* by its permission bits (root writes through a 0444 file, but a
    ledger made read-only is meant to stay so)."""
    try:
        return os.access(path, os.W_OK) and bool(os.stat(path).st_mode & 0o222)
    except OSError:
        return False
