"""Where the ledger is and how it is kept: SQLite (``BEGIN IMMEDIATE``) or a SQLAlchemy URL
(PostgreSQL, ``LOCK TABLE``), checked before any work (:class:`LedgerError`: "ledger PATH is
unusable: why; what to do"), and :class:`BudgetLedger`, whose every method is one transaction.

Tables (schema 2): ``gsd_datasets`` (one row per data set: its digest, name, budget, ``sid``),
``gsd_examples`` (``sid``, example identity: one row per distinct example of each set, indexed by the
identity), ``gsd_overlaps`` (``sid``, ``other``: the pairs of sets that share at least one example,
found once when a set is first seen: a set's examples never change), ``gsd_bookings`` (one row per
release, under the digest of the set it read) and ``gsd_meta``. A ledger of schema 1 (data sets keyed
by one content digest, gsd 0.3) is upgraded in place the first time this gsd opens it."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import shlex
import stat
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

from ...errors import GSDError
from .compose import ORDERS, admits, composed, remaining
from .identity import DataIdentity

#: ``$GSD_LEDGER``: the ledger's file or SQLAlchemy URL.
ENV = "GSD_LEDGER"
#: ``$GSD_LEDGER_TIMEOUT``: seconds to wait for a ledger that another process holds (``--ledger-timeout``).
TIMEOUT_ENV = "GSD_LEDGER_TIMEOUT"
#: File name of the default ledger in the user's data folder.
FILE_NAME = "privacy-ledger.sqlite"
#: Default seconds a ledger operation waits for another process's transaction (``--ledger-timeout``).
BUSY_TIMEOUT = 30.0
#: Schema version, in the ``gsd_meta`` table.
SCHEMA = 2
#: The largest budget epsilon ``set_budget`` accepts: e^100 > 10^43, a bound on no one's privacy.
MAX_BUDGET_EPSILON = 100.0
PRIVATE_NOTE = ("PRIVATE: the ledger names runs on the private data sets, with their times and commands; "
                "publish only `gsd budget show --publishable`")

_SQLITE_HEADER = b"SQLite format 3\x00"
_BATCH = 5000  # rows per INSERT batch, and identities per IN (...) lookup (at most 500)


class BudgetExceeded(GSDError):
    """A run would take a data set past its privacy budget; nothing was released."""


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


def _is_url(location: str) -> bool:
    return "://" in location


def shown(location: str) -> str:
    """The location as messages print it: a URL's password hidden."""
    if not _is_url(location):
        return location
    scheme, _, rest = location.partition("://")
    auth, at, host = rest.rpartition("@")
    if at and ":" in auth:
        auth = auth.split(":", 1)[0] + ":***"
    return f"{scheme}://{auth}{at}{host}"


def _unusable(location: str, why: str, todo: str) -> LedgerError:
    return LedgerError(f"ledger {shown(location)} is unusable: {why}; {todo}")


def _locked(location: str, timeout: float) -> LedgerError:
    return LedgerError(f"ledger {shown(location)} is locked by another process (waited {timeout:g} s); "
                       "try again when that run has booked, or wait longer with --ledger-timeout SECONDS")


def _writable(path: str) -> bool:
    """Writable by this process *and* by its permission bits (root writes through a 0444 file, but a
    ledger made read-only is meant to stay so)."""
    try:
        return os.access(path, os.W_OK) and bool(os.stat(path).st_mode & 0o222)
    except OSError:
        return False


def _tables(sqlite: bool) -> tuple[str, ...]:
    compact = " WITHOUT ROWID" if sqlite else ""
    return (
        "CREATE TABLE IF NOT EXISTS gsd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "CREATE TABLE IF NOT EXISTS gsd_datasets (digest TEXT PRIMARY KEY, name TEXT NOT NULL, how TEXT NOT NULL, "
        "epsilon DOUBLE PRECISION, delta DOUBLE PRECISION, created TEXT NOT NULL, updated TEXT NOT NULL, raised INTEGER NOT NULL DEFAULT 0, "
        "sid INTEGER, examples INTEGER)",
        "CREATE TABLE IF NOT EXISTS gsd_bookings (id TEXT PRIMARY KEY, digest TEXT NOT NULL, name TEXT NOT NULL, "
        "time TEXT NOT NULL, what TEXT NOT NULL, command TEXT NOT NULL, mechanism TEXT NOT NULL, "
        "epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL, rdp TEXT, dp INTEGER NOT NULL, "
        "guarantee INTEGER NOT NULL)",
        "CREATE INDEX IF NOT EXISTS gsd_bookings_digest ON gsd_bookings (digest)",
        *_SCHEMA2[sqlite],
    )


_SCHEMA2 = {s: (
    "CREATE UNIQUE INDEX IF NOT EXISTS gsd_datasets_sid ON gsd_datasets (sid)",
    "CREATE TABLE IF NOT EXISTS gsd_examples (sid INTEGER NOT NULL, example TEXT NOT NULL, PRIMARY KEY (sid, example))"
    + (" WITHOUT ROWID" if s else ""),
    "CREATE INDEX IF NOT EXISTS gsd_examples_example ON gsd_examples (example)",
    "CREATE TABLE IF NOT EXISTS gsd_overlaps (sid INTEGER NOT NULL, other INTEGER NOT NULL, PRIMARY KEY (sid, other))"
    + (" WITHOUT ROWID" if s else ""),
) for s in (True, False)}


def _meta_rows() -> list[dict]:
    return [{"k": "schema", "v": str(SCHEMA)}, {"k": "orders", "v": json.dumps(ORDERS)}, {"k": "note", "v": PRIVATE_NOTE}]


class _Cursor:
    def __init__(self, run, many):
        self.run = lambda sql, params=None: run(sql, params or {})
        self.many = many


# --- SQLite ------------------------------------------------------------------------------------------

class _SQLite:
    """stdlib sqlite3: one connection per transaction (``mode=rw``/``ro``: never creates a file);
    ``BEGIN IMMEDIATE`` takes the write lock first, waiting up to the timeout with one message."""

    sqlite = True

    def __init__(self, path: str, timeout: float, notice: Callable[[str], None]):
        self.location = path
        self.path = str(Path(path).expanduser())
        self.timeout = timeout
        self.notice = notice
        self.created = False

    def _fail(self, why: str, todo: str = "give another --ledger") -> LedgerError:
        return _unusable(self.location, why, todo)

    # -- checks before any work ----------------------------------------------------------------------

    def open(self, create: bool | str) -> bool:
        """Check that the path is a usable ledger (or, with ``create``, a new one in a writable folder,
        then create it; ``create="check"``: only check that it could be); False: there is none (not
        created). Reads at most 100 bytes of a file that is not a ledger, and never writes to it."""
        p = self.path
        try:
            st = os.stat(p)
        except FileNotFoundError:
            st = None
        except OSError as e:
            raise self._fail(f"it cannot be read ({e.strerror or e})", "check the path and its permissions") from None
        if st is None:
            if os.path.lexists(p):
                raise self._fail("it is a link to a missing file", "give the path of a ledger, or of a new file")
            if not create:
                return False
            if create == "check":
                self._check_new()
                return False
            self._create()
            return True
        if stat.S_ISDIR(st.st_mode):
            raise self._fail("it is a folder", f"give a file, e.g. {os.path.join(self.location, FILE_NAME)}")
        if not stat.S_ISREG(st.st_mode):
            raise self._fail("it is not a regular file (a device, pipe or socket)", "give the path of a ledger file, or of a new file")
        if st.st_size == 0:
            raise self._fail("it is an empty file, not a gsd ledger (gsd writes only into its own ledgers)",
                             "give the path of a ledger, or of a file that does not exist yet")
        try:
            with open(p, "rb") as f:
                header = f.read(100)
        except OSError as e:
            raise self._fail(f"it cannot be read ({e.strerror or e})", "check its permissions") from None
        if not header.startswith(_SQLITE_HEADER):
            raise self._fail("it is not a gsd ledger (not a SQLite database); it was not changed",
                             "give the path of a ledger, or of a file that does not exist yet")
        if len(header) < 100:
            raise self._fail(f"it is truncated ({st.st_size} bytes)", "restore it from a backup, or give another --ledger")
        page = int.from_bytes(header[16:18], "big")
        page = 65536 if page == 1 else page
        pages = int.from_bytes(header[28:32], "big")
        if pages and header[24:28] == header[92:96] and st.st_size < page * pages:
            raise self._fail(f"it is truncated ({st.st_size} of {page * pages} bytes)", "restore it from a backup, or give another --ledger")
        if create:
            if not _writable(p):
                raise self._fail("the file is read-only", "make it writable (chmod u+w) or give another --ledger")
            folder = os.path.dirname(os.path.abspath(p))
            if not _writable(folder):
                raise self._fail(f"its folder {folder} is read-only (SQLite writes a journal beside the ledger)",
                                 "make the folder writable, or move the ledger")
        with self.transaction(write=False) as cur:  # a lock held by another process: waited for, with a message
            tables = {r[0] for r in cur.run("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "gsd_meta" not in tables:
            raise self._fail("it is a SQLite database but not a gsd ledger (no gsd_meta table); it was not changed",
                             "give the path of a ledger, or of a file that does not exist yet")
        return True

    def _damaged(self, e: Exception) -> LedgerError:
        import sqlite3

        msg = " ".join(str(e).split()) or type(e).__name__
        if isinstance(e, sqlite3.OperationalError) and "locked" in msg:
            return _locked(self.location, self.timeout)
        if "readonly" in msg or "read-only" in msg:
            return self._fail("it cannot be written (read-only)", "make it and its folder writable, or give another --ledger")
        return self._fail(f"it is damaged ({msg})", "restore it from a backup, or give another --ledger")

    def _check_new(self) -> None:
        """A new ledger could be made at the path: its folder, or the nearest folder above it that
        exists, is a writable folder (nothing is created)."""
        folder = os.path.dirname(os.path.abspath(self.path))
        probe = folder
        while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        if not os.path.isdir(probe):
            raise self._fail(f"{probe} is not a folder", "give a path in a folder")
        if not _writable(probe):
            raise self._fail(f"{'its folder ' if probe == folder else 'the folder '}{probe} is read-only", "give a path in a writable folder")

    def _create(self) -> None:
        """A new ledger, made whole in a temporary file and linked into place: no other process ever
        sees a half-made one (and an empty file is never a ledger), and of two made at once one wins."""
        import sqlite3

        folder = os.path.dirname(os.path.abspath(self.path))
        if os.path.lexists(folder) and not os.path.isdir(folder):
            raise self._fail(f"{folder} is not a folder", "give a path in a folder")
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as e:
            raise self._fail(f"its folder {folder} cannot be created ({e.strerror or e})", "give a path in a writable folder") from None
        if not _writable(folder):
            raise self._fail(f"its folder {folder} is read-only", "give a path in a writable folder")
        tmp = os.path.join(folder, f".{os.path.basename(self.path)}.{uuid.uuid4().hex[:12]}.tmp")
        try:
            con = sqlite3.connect(tmp, isolation_level=None)
            try:
                con.execute("BEGIN")
                for sql in _tables(True):
                    con.execute(sql)
                con.executemany("INSERT INTO gsd_meta (key, value) VALUES (:k, :v)", _meta_rows())
                con.execute("COMMIT")
            finally:
                con.close()
            try:
                os.link(tmp, self.path)
                self.created = True
            except FileExistsError:  # another process made it first: that one is the ledger
                pass
            except OSError:  # no hard links on this file system
                if not os.path.exists(self.path):
                    os.rename(tmp, self.path)
                    self.created = True
        except sqlite3.Error as e:
            raise self._fail(f"it cannot be created ({e})", "give a path in a writable folder") from None
        except OSError as e:
            raise self._fail(f"it cannot be created ({e.strerror or e})", "give a path in a writable folder") from None
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass

    # -- transactions --------------------------------------------------------------------------------

    def _connect(self, write: bool):
        import sqlite3
        from urllib.parse import quote

        uri = f"file:{quote(os.path.abspath(self.path))}?mode={'rw' if write else 'ro'}"
        return sqlite3.connect(uri, uri=True, timeout=0.2, isolation_level=None)

    @contextmanager
    def transaction(self, write: bool, setup: bool = False):
        import sqlite3

        try:
            con = self._connect(write)
        except sqlite3.Error as e:
            raise self._damaged(e) from None
        try:
            deadline = time.monotonic() + self.timeout
            waited = False
            while True:
                try:
                    con.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                    if not write:  # the shared lock, now
                        con.execute("SELECT COUNT(*) FROM sqlite_master").fetchall()
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) and "busy" not in str(e):
                        raise self._damaged(e) from None
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _locked(self.location, self.timeout) from None
                    if not waited:
                        self.notice(f"the ledger {shown(self.location)} is locked by another process; "
                                    f"waiting up to {self.timeout:g} s (--ledger-timeout)")
                        waited = True
                    con.execute(f"PRAGMA busy_timeout = {int(max(1, min(left, 1.0) * 1000))}")
            con.execute(f"PRAGMA busy_timeout = {int(max(1.0, deadline - time.monotonic()) * 1000)}")
            try:
                yield _Cursor(lambda sql, p: con.execute(sql, p).fetchall(), lambda sql, rows: con.executemany(sql, rows))
            except BaseException as e:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                if isinstance(e, sqlite3.Error):
                    raise self._damaged(e) from None
                raise
            try:
                con.execute("COMMIT")
            except sqlite3.Error as e:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise self._damaged(e) from None
        finally:
            con.close()

    def columns(self, cur, table: str) -> set[str]:
        return {r[1] for r in cur.run(f"PRAGMA table_info({table})")}

    def close(self) -> None:
        pass


# --- a server (SQLAlchemy) ---------------------------------------------------------------------------

class _SQLAlchemy:
    """A SQLAlchemy URL (PostgreSQL for teams; any backend SQLAlchemy speaks)."""

    sqlite = False

    def __init__(self, url: str, timeout: float, notice: Callable[[str], None]):
        from urllib.parse import urlsplit

        self.location = url
        self.timeout = timeout
        self.notice = notice
        self.created = False
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError as e:
            raise self._fail(f"it is not a valid URL ({e})", "write e.g. postgresql://user@host/db, or give a file path") from None
        try:
            import sqlalchemy as sa
        except ImportError:
            raise self._fail("a server ledger needs SQLAlchemy and a driver", "pip install 'gsd-cli[budget-server]'") from None
        self.sa = sa
        try:
            u = sa.engine.make_url(url)
            if u.drivername == "postgresql":
                u = u.set(drivername="postgresql+psycopg")
            connect_args = {"connect_timeout": max(1, int(math.ceil(timeout)))} if u.drivername.startswith("postgresql") else {}
            self.engine = sa.create_engine(u, pool_pre_ping=True, connect_args=connect_args)
        except sa.exc.NoSuchModuleError:
            raise self._fail(f"SQLAlchemy knows no database {url.split('://')[0]!r}",
                             "give a file path, or a URL such as postgresql://user@host/db") from None
        except ImportError as e:
            raise self._fail(f"its driver ({e.name or e}) is not installed", "pip install 'gsd-cli[budget-server]'") from None
        except (sa.exc.ArgumentError, ValueError, TypeError) as e:
            raise self._fail(f"it is not a valid URL ({' '.join(str(e).split())})", "write e.g. postgresql://user@host/db") from None
        self.postgres = self.engine.dialect.name == "postgresql"

    def _fail(self, why: str, todo: str = "give another --ledger") -> LedgerError:
        return _unusable(self.location, why, todo)

    def _server_error(self, e: Exception) -> LedgerError:
        orig = getattr(e, "orig", None) or e
        msg = " ".join(str(orig).split("\n")[0].split()) or type(orig).__name__
        if isinstance(e, self.sa.exc.OperationalError) and ("lock" in msg and "timeout" in msg or "could not obtain lock" in msg):
            return _locked(self.location, self.timeout)
        if isinstance(e, (self.sa.exc.OperationalError, self.sa.exc.InterfaceError)):
            return self._fail(f"the server cannot be reached ({msg})", "check that it runs and the URL (host, port, user, database)")
        return self._fail(f"the server refused ({msg})", "check the URL and the user's rights on the database")

    def open(self, create: bool) -> bool:
        try:
            with self.engine.connect() as con:
                have = self.sa.inspect(con).has_table("gsd_meta")
        except self.sa.exc.SQLAlchemyError as e:
            raise self._server_error(e) from None
        if have:
            return True
        if not create or create == "check":
            return False
        with self.transaction(write=True, setup=True) as cur:
            existed = self._has_meta(cur)
            for sql in _tables(False):
                cur.run(sql)
            if not existed:
                for row in _meta_rows():
                    cur.run("INSERT INTO gsd_meta (key, value) VALUES (:k, :v) ON CONFLICT (key) DO NOTHING", row)
        self.created = not existed
        return True

    def _has_meta(self, cur) -> bool:
        if self.postgres:
            return bool(cur.run("SELECT to_regclass('gsd_meta') IS NOT NULL")[0][0])
        try:
            cur.run("SELECT 1 FROM gsd_meta LIMIT 1")
            return True
        except self.sa.exc.SQLAlchemyError:
            return False

    @contextmanager
    def transaction(self, write: bool, setup: bool = False):
        sa = self.sa
        try:
            with self.engine.begin() as con:
                def run(sql, params):
                    res = con.execute(sa.text(sql), params)
                    return [tuple(r) for r in res.fetchall()] if res.returns_rows else []

                def many(sql, rows):
                    if rows:
                        con.execute(sa.text(sql), list(rows))

                cur = _Cursor(run, many)
                if self.postgres and setup:  # two first users creating the tables at once
                    cur.run("SELECT pg_advisory_xact_lock(7290341)")
                elif write and self.postgres:
                    # every booking serialised: no two runs read the same spent total and both slip past the budget
                    self._lock(cur)
                yield cur
        except sa.exc.SQLAlchemyError as e:
            raise self._server_error(e) from None

    def _lock(self, cur) -> None:
        sa = self.sa
        cur.run("SAVEPOINT gsd_lock")
        try:
            cur.run("LOCK TABLE gsd_bookings IN EXCLUSIVE MODE NOWAIT")
            return
        except sa.exc.OperationalError:
            cur.run("ROLLBACK TO SAVEPOINT gsd_lock")
        self.notice(f"the ledger {shown(self.location)} is locked by another process; waiting up to {self.timeout:g} s (--ledger-timeout)")
        cur.run(f"SET LOCAL lock_timeout = '{int(self.timeout * 1000)}ms'")
        try:
            cur.run("LOCK TABLE gsd_bookings IN EXCLUSIVE MODE")
        except sa.exc.OperationalError:
            raise _locked(self.location, self.timeout) from None
        cur.run("SET LOCAL lock_timeout = 0")

    def columns(self, cur, table: str) -> set[str]:
        if self.postgres:
            return {r[0] for r in cur.run("SELECT column_name FROM information_schema.columns WHERE table_name = :t", {"t": table})}
        return {c["name"] for c in self.sa.inspect(self.engine).get_columns(table)}

    def close(self) -> None:
        self.engine.dispose()


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _command() -> str:
    """The ``gsd`` command running in this process (as :func:`gsd_cli.cli.main` got it), else the script."""
    cli = sys.modules.get("gsd_cli.cli.app")
    given = getattr(cli, "invoked", {}).get("argv") if cli is not None else None
    argv = ["gsd", *given] if given is not None else (list(sys.argv) or ["python"])
    # an argument that is not valid UTF-8 (a file name in another encoding) is kept, escaped: the ledger is text
    return shlex.join(argv)[:1000].encode("utf-8", "backslashreplace").decode("utf-8")


def say(line: str) -> None:
    """One line for the person running gsd (stderr; the CLI's console while a ``gsd`` command runs)."""
    cli = sys.modules.get("gsd_cli.cli.app")
    common = sys.modules.get("gsd_cli.cli.common")
    if cli is not None and common is not None and getattr(cli, "invoked", {}).get("argv") is not None:
        from rich.markup import escape

        common.err.print(escape(line), highlight=False, soft_wrap=True)
    else:
        print(line, file=sys.stderr, flush=True)


_COLS = ("id", "digest", "name", "time", "what", "command", "mechanism", "epsilon", "delta", "rdp", "dp", "guarantee")


class BudgetLedger:
    """The privacy ledger at ``location`` (a file path or SQLAlchemy URL; default
    :func:`default_location`), checked when it is opened (:class:`LedgerError`). ``create``: a ledger
    that does not exist yet is made (and said so, through ``notice``); ``"check"``: only checked that
    it could be; False (``gsd budget show``): nothing is ever created. :attr:`exists` says whether
    there is one. ``timeout``:
    seconds to wait for another process's lock (default :func:`ledger_timeout`). Every method is one
    transaction."""

    def __init__(self, location: str | os.PathLike | None = None, *, create: bool | str = True, timeout: float | None = None,
                 notice: Callable[[str], None] | None = None):
        self.location = str(location) if location is not None else default_location()
        if not self.location.strip():
            raise GSDError("--ledger is empty; give a file path or a URL (postgresql://user@host/db)")
        self.timeout = ledger_timeout(timeout)
        self.notice = notice or say
        loc = self.location
        if loc.startswith("sqlite:///"):  # SQLAlchemy's spelling of a file: the file checks apply
            self._db = _SQLite(loc[len("sqlite:///"):], self.timeout, self.notice)
        elif _is_url(loc):
            self._db = _SQLAlchemy(loc, self.timeout, self.notice)
        else:
            self._db = _SQLite(loc, self.timeout, self.notice)
        self.exists = self._db.open(create)
        self.created = self._db.created
        if self.created:
            self.notice(f"created the privacy ledger {self.shown} (private: it will name the runs on private data)")
        if self.exists:
            self._setup(create)

    @property
    def shown(self) -> str:
        """The location as messages print it (a URL's password hidden)."""
        return shown(self.location)

    def __repr__(self) -> str:
        return f"BudgetLedger({self.shown!r})"

    def close(self) -> None:
        """Close the server connections this ledger holds (a SQLite ledger holds none between calls)."""
        self._db.close()

    # -- schema ----------------------------------------------------------------------------------

    def _setup(self, writable: bool) -> None:
        with self._db.transaction(write=False) as cur:
            meta = dict(cur.run("SELECT key, value FROM gsd_meta"))
        try:
            schema = int(meta.get("schema", "1"))
            orders = tuple(json.loads(meta["orders"]))
        except (KeyError, ValueError, TypeError):
            raise _unusable(self.location, "its gsd_meta table is damaged", "restore it from a backup, or give another --ledger") from None
        if schema > SCHEMA:
            raise _unusable(self.location, f"it was written by a newer gsd (ledger schema {schema}, this gsd reads {SCHEMA})",
                            "upgrade gsd (pip install -U gsd-cli), or give another --ledger")
        if orders != ORDERS:
            raise GSDError(f"the ledger {self.shown} keeps RDP curves at other orders than this gsd; "
                           "use the gsd version that created it, or a new --ledger")
        if schema < SCHEMA:
            if not self._db.sqlite or _writable(self._db.path):
                self._migrate()
            else:
                raise _unusable(self.location, f"it was written by an older gsd (schema {schema}) and is read-only, so it cannot be upgraded",
                                "make it writable once, or read it with the gsd that wrote it")

    def _migrate(self) -> None:
        """Schema 1 -> 2: each data set gets a ``sid`` and no examples yet (``examples`` NULL); it is
        matched by its old digest (:func:`gsd_cli.privacy.budget.identity.legacy_digest`) the first
        time a run, ``budget set`` or ``budget show --private`` reads it, and then gets its examples."""
        with self._db.transaction(write=True, setup=True) as cur:
            if int(dict(cur.run("SELECT key, value FROM gsd_meta")).get("schema", "1")) >= SCHEMA:
                return  # another process upgraded it meanwhile
            cols = self._db.columns(cur, "gsd_datasets")
            if "raised" not in cols:
                cur.run("ALTER TABLE gsd_datasets ADD COLUMN raised INTEGER NOT NULL DEFAULT 0")
            if "sid" not in cols:
                cur.run("ALTER TABLE gsd_datasets ADD COLUMN sid INTEGER")
                cur.run("ALTER TABLE gsd_datasets ADD COLUMN examples INTEGER")
            for i, (d,) in enumerate(cur.run("SELECT digest FROM gsd_datasets ORDER BY created, digest"), 1):
                cur.run("UPDATE gsd_datasets SET sid = :s WHERE digest = :d", {"s": i, "d": d})
            for sql in _SCHEMA2[self._db.sqlite]:
                cur.run(sql)
            cur.run("UPDATE gsd_meta SET value = :v WHERE key = 'schema'", {"v": str(SCHEMA)})
        self.notice(f"upgraded the privacy ledger {self.shown} to per-example identities (each data set booked before "
                    "is matched by its old digest the next time a run reads it)")

    def _require(self) -> None:
        if not self.exists:
            raise GSDError(f"there is no ledger at {self.shown} (nothing was booked there); check --ledger")

    # -- data sets -------------------------------------------------------------------------------

    def _legacy_for(self, data: DataIdentity) -> str | None:
        """The old digest of ``data``, computed only when the ledger has data sets from before
        per-example identities and ``data`` is not in it yet (outside any lock: it reads files)."""
        if not data.examples or data.legacy is None:
            return None
        with self._db.transaction(write=False) as cur:
            if cur.run("SELECT 1 FROM gsd_datasets WHERE digest = :d", {"d": data.digest}):
                return None
            if not cur.run("SELECT 1 FROM gsd_datasets WHERE examples IS NULL AND how <> 'examples' LIMIT 1"):
                return None
        return data.legacy()

    def _registered(self, data: DataIdentity) -> int:
        """The ``sid`` of ``data``, added in a transaction of its own when new (kept whatever the run's
        booking then says: a refused run's data set is known to the ledger, and so is what it shares)."""
        legacy = self._legacy_for(data)
        with self._db.transaction(write=True) as cur:
            return self._register(cur, data, legacy)

    def _register(self, cur, data: DataIdentity, legacy: str | None) -> int:
        """The ``sid`` of ``data``, adding it (its examples and the sets it shares examples with) when new;
        a data set of an upgraded ledger found by its old digest gets its examples and the new digest."""
        row = cur.run("SELECT sid FROM gsd_datasets WHERE digest = :d", {"d": data.digest})
        if row:
            return int(row[0][0])
        now = _now()
        n = len(data.examples) if data.examples else None
        if legacy is not None:
            old = cur.run("SELECT sid FROM gsd_datasets WHERE digest = :o AND examples IS NULL", {"o": legacy})
            if old:
                sid = int(old[0][0])
                cur.run("UPDATE gsd_datasets SET digest = :d, how = :h, examples = :n, updated = :t WHERE sid = :s",
                        {"d": data.digest, "h": data.how, "n": n, "t": now, "s": sid})
                cur.run("UPDATE gsd_bookings SET digest = :d WHERE digest = :o", {"d": data.digest, "o": legacy})
                self._add_examples(cur, sid, data)
                return sid
        sid = int(cur.run("SELECT COALESCE(MAX(sid), 0) + 1 FROM gsd_datasets")[0][0])
        cur.run("INSERT INTO gsd_datasets (digest, name, how, epsilon, delta, created, updated, raised, sid, examples) "
                "VALUES (:d, :n, :h, NULL, NULL, :t, :t, 0, :s, :x)",
                {"d": data.digest, "n": data.name, "h": data.how, "t": now, "s": sid, "x": n})
        self._add_examples(cur, sid, data)
        return sid

    def _add_examples(self, cur, sid: int, data: DataIdentity) -> None:
        ex = data.examples
        for start in range(0, len(ex), _BATCH):
            cur.many("INSERT INTO gsd_examples (sid, example) VALUES (:s, :e)", [{"s": sid, "e": e} for e in ex[start:start + _BATCH]])
        if ex:  # the sets sharing an example with this one, found once (a set's examples never change)
            cur.run("INSERT INTO gsd_overlaps (sid, other) SELECT DISTINCT x.sid, o.sid FROM gsd_examples x "
                    "JOIN gsd_examples o ON o.example = x.example WHERE x.sid = :s AND o.sid <> :s", {"s": sid})
            cur.run("INSERT INTO gsd_overlaps (sid, other) SELECT other, sid FROM gsd_overlaps WHERE sid = :s", {"s": sid})

    def _sets(self, cur, where: str, params: dict) -> list[tuple]:
        return cur.run("SELECT sid, digest, name, how, epsilon, delta, created, raised, examples FROM gsd_datasets "
                       f"WHERE {where} ORDER BY created, digest", params)

    def _bookings(self, cur, sid: int) -> list[dict]:
        """Every booking on the set ``sid`` or on a set that shares an example with it, oldest first."""
        sql = ("SELECT " + ", ".join(f"b.{c}" for c in _COLS) + " FROM gsd_bookings b JOIN gsd_datasets d ON d.digest = b.digest "
               "WHERE d.sid = :s OR d.sid IN (SELECT other FROM gsd_overlaps WHERE sid = :s) ORDER BY b.time, b.id")
        return [_decoded(dict(zip(_COLS, r))) for r in cur.run(sql, {"s": sid})]

    def _booking(self, cur, bid: str) -> dict | None:
        rows = cur.run("SELECT " + ", ".join(_COLS) + " FROM gsd_bookings WHERE id = :i", {"i": bid})
        return _decoded(dict(zip(_COLS, rows[0]))) if rows else None

    # -- budgets ---------------------------------------------------------------------------------

    def set_budget(self, data: DataIdentity, epsilon: float, delta: float, *, allow_raise: bool = False, force: bool = False) -> dict:
        """Give the data set ``data`` the budget (epsilon, delta); every run booked on it, or on a set that
        shares an example with it, counts against it.

        A filter's guarantee is for a budget fixed before the runs it stops: raising a budget after
        runs were booked (chosen, perhaps, after seeing their results) is refused unless
        ``allow_raise``, and then recorded (``raised`` in :meth:`status`). Lowering one is safe, but a
        budget below what the booked runs already spent is refused unless ``force`` (it would admit
        nothing, and say less than the truth about what was spent); with ``force`` it is set, and
        :meth:`status` says ``overspent``. ``epsilon`` at most :data:`MAX_BUDGET_EPSILON`.
        Returns :meth:`status` of the data set."""
        check_budget(epsilon, delta)
        self._require()
        sid = self._registered(data)
        now = _now()
        with self._db.transaction(write=True) as cur:
            old = cur.run("SELECT epsilon, delta, name FROM gsd_datasets WHERE sid = :s", {"s": sid})[0]
            runs = self._bookings(cur, sid)
            raising = old[0] is not None and bool(runs) and (epsilon > old[0] or delta > old[1])
            if raising and not allow_raise:
                raise GSDError(f"{old[2]} has the budget epsilon {old[0]:g}, delta {old[1]:g} and {len(runs)} run(s) booked under it: "
                               "raising it after seeing results voids the filter's guarantee; keep it, or pass --raise to record that it was raised")
            if runs and not _fits(runs, float(epsilon), float(delta)) and not force:
                spent = composed(runs, float(delta))
                what = ("a run booked on it has no proven DP guarantee, so no budget holds" if not spent["guarantee"] else
                        f"the {len(runs)} run(s) booked on it (or on data sharing its examples) already spent epsilon "
                        f"{spent['basic_epsilon']:.4g} (basic) / {_fmt(spent['renyi_epsilon'])} (Rényi filter)")
                raise GSDError(f"{old[2]}: {what}: more than the budget epsilon {float(epsilon):g}, delta {float(delta):g}, which would "
                               "admit no run; give at least what is spent, or pass --force to set it all the same (every run is then refused)")
            cur.run("UPDATE gsd_datasets SET epsilon = :e, delta = :de, updated = :t, raised = raised + :r WHERE sid = :s",
                    {"e": float(epsilon), "de": float(delta), "t": now, "r": int(raising), "s": sid})
            return self._entry(cur, self._sets(cur, "sid = :s", {"s": sid})[0])

    # -- bookings --------------------------------------------------------------------------------

    def book(self, data: DataIdentity, *, what: str, mechanism: str, epsilon: float, delta: float,
             rdp: Sequence[float] | None, dp: bool = True, guarantee: bool = True, booking_id: str | None = None,
             command: str | None = None, absorbs: str | None = None) -> dict:
        """Book one release on ``data`` before it happens, in one locked transaction: refused
        (:class:`BudgetExceeded`) when ``data``, or any data set with a budget that shares an example
        with it (the people in the intersection are in this run), would pass its budget by the filter
        (see :mod:`gsd_cli.privacy.budget`). ``rdp``: the release's RDP curve at :data:`ORDERS` (None:
        none known). ``booking_id``: a booking with this id already in the ledger is returned as it is
        (a resumed run is not booked twice). ``dp=False``: the run is not DP (``--insecure-seed``),
        booked all the same. ``absorbs``: the id of an earlier booking of the same run on the same data
        (a training's size estimate, booked before it was drawn): admitted, this release and that one
        become one booking (their epsilons, deltas and curves added; the composition is the same);
        refused, that one stays. Returns the booking, with ``charged``: each budgeted data set it
        counts against, and what that one has left after it."""
        self._require()
        bid = booking_id or uuid.uuid4().hex
        row = {"id": bid, "digest": data.digest, "name": data.name, "time": _now(), "what": what,
               "command": command if command is not None else _command(), "mechanism": mechanism,
               "epsilon": float(epsilon), "delta": float(delta), "rdp": json.dumps(list(map(float, rdp))) if rdp is not None else None,
               "dp": int(bool(dp)), "guarantee": int(bool(guarantee))}
        sid = self._registered(data)
        with self._db.transaction(write=True) as cur:
            found = self._booking(cur, bid)
            if found is not None:
                if found["digest"] != data.digest:  # an id is one run's: never another data set's booking
                    raise GSDError(f"booking {bid[:12]}... of the ledger belongs to another data set; start a new run with --out")
                return {**found, "charged": [], "again": True}
            new = _decoded(row)
            part = self._booking(cur, absorbs) if absorbs else None
            if part is not None and part["digest"] != data.digest:
                part = None
            charged = []
            budgeted = self._sets(cur, "epsilon IS NOT NULL AND (sid = :s OR sid IN (SELECT other FROM gsd_overlaps WHERE sid = :s))", {"s": sid})
            for t in budgeted:
                t_sid, t_digest, t_name, eps_b, delta_b = int(t[0]), t[1], t[2], float(t[4]), float(t[5])
                before = self._bookings(cur, t_sid)
                ok, after = admits(before, new, eps_b, delta_b)
                if not ok:
                    raise BudgetExceeded(_refusal(data, t_name if t_digest != data.digest else None, before, new, eps_b, delta_b))
                charged.append({"name": t_name, "self": t_digest == data.digest,
                                "remaining": remaining(after, {"epsilon": eps_b, "delta": delta_b})})
            if part is not None:  # one booking for the run: the same sums, so the same composition
                cur.run("DELETE FROM gsd_bookings WHERE id = :i", {"i": part["id"]})
                curve = None if part["rdp"] is None or new["rdp"] is None else [a + b for a, b in zip(part["rdp"], new["rdp"])]
                row.update(epsilon=part["epsilon"] + new["epsilon"], delta=part["delta"] + new["delta"],
                           rdp=json.dumps(curve) if curve is not None else None, guarantee=int(part["guarantee"] and new["guarantee"]),
                           dp=int(part["dp"] and new["dp"]))
                new = _decoded(row)
            cur.run("INSERT INTO gsd_bookings (id, digest, name, time, what, command, mechanism, epsilon, delta, rdp, dp, guarantee) "
                    "VALUES (:id, :digest, :name, :time, :what, :command, :mechanism, :epsilon, :delta, :rdp, :dp, :guarantee)", row)
        return {**new, "charged": charged, "again": False}

    # -- reading ---------------------------------------------------------------------------------

    def _entry(self, cur, s: tuple) -> dict:
        sid, d, name, how, eps, delta, created, raised, n = s
        runs = self._bookings(cur, int(sid))
        for r in runs:
            r["shared"] = r["digest"] != d  # booked on another data set that shares examples with this one
        spent = composed(runs, delta)
        budget = None if eps is None else {"epsilon": float(eps), "delta": float(delta), "raised": int(raised)}
        others = [r[0] for r in cur.run("SELECT d.name FROM gsd_overlaps o JOIN gsd_datasets d ON d.sid = o.other "
                                        "WHERE o.sid = :s ORDER BY d.created", {"s": int(sid)})]
        entry = {"digest": d, "name": name, "identified_by": how, "examples": n, "shares_examples_with": others,
                 "budget": budget, "spent": spent, "runs": runs}
        if budget is not None:
            entry["remaining"] = remaining(spent, budget)
            entry["overspent"] = bool(runs) and not _fits(runs, budget["epsilon"], budget["delta"])
        return entry

    def status(self, digest: str | None = None) -> list[dict]:
        """Per data set (one, or all): its budget, every booking that counts against it (on it, or on a
        set that shares an example with it: ``shared``) and the spent figures of :func:`composed`, with
        ``remaining`` (epsilon_B minus the smaller spent figure that the filter may use) where a budget is set."""
        if not self.exists:
            return []
        with self._db.transaction(write=False) as cur:
            sets = self._sets(cur, "digest = :d" if digest else "1 = 1", {"d": digest})
            return [self._entry(cur, s) for s in sets]

    def _around(self, cur, data: DataIdentity, legacy: str | None) -> list[tuple]:
        """The data sets of the ledger that ``data`` is, or shares an example with (read only)."""
        for d in (data.digest, legacy):
            if d is not None:
                own = self._sets(cur, "digest = :d", {"d": d})
                if own:
                    sid = int(own[0][0])
                    return own + self._sets(cur, "sid IN (SELECT other FROM gsd_overlaps WHERE sid = :s)", {"s": sid})
        sids: set[int] = set()
        ex = list(data.examples)
        for start in range(0, len(ex), 500):
            part = ex[start:start + 500]
            marks = ", ".join(f":e{i}" for i in range(len(part)))
            sids.update(int(r[0]) for r in cur.run(f"SELECT DISTINCT sid FROM gsd_examples WHERE example IN ({marks})",
                                                   {f"e{i}": e for i, e in enumerate(part)}))
        if not sids:
            return []
        marks = ", ".join(f":s{i}" for i in range(len(sids)))
        return self._sets(cur, f"sid IN ({marks})", {f"s{i}": s for i, s in enumerate(sorted(sids))})

    def fits_basic(self, data: DataIdentity, epsilon: float, delta: float) -> bool:
        """Whether a release of (``epsilon``, ``delta``) on ``data`` would be admitted by basic
        composition under every budget it counts against, read only (nothing is booked or added).
        Basic composition is monotone: a later release of at most (epsilon, delta) is then admitted too
        (unless other runs book in between)."""
        if not self.exists:
            return True
        legacy = self._legacy_for(data)
        probe = {"epsilon": float(epsilon), "delta": float(delta), "rdp": None, "guarantee": True}
        with self._db.transaction(write=False) as cur:
            for t in self._around(cur, data, legacy):
                if t[4] is not None and not _fits([*self._bookings(cur, int(t[0])), probe], float(t[4]), float(t[5])):
                    return False
        return True

    def status_of(self, data: DataIdentity) -> list[dict]:
        """:meth:`status` of the data set ``data``, read only (nothing is added): its own entry if the
        ledger has it (by its digest, or by the old digest of an upgraded ledger), else the entries of
        every data set that shares an example with it (``shares_with_asked``: True), else []."""
        if not self.exists:
            return []
        legacy = self._legacy_for(data)
        with self._db.transaction(write=False) as cur:
            sets = self._around(cur, data, legacy)
            if sets and sets[0][1] in (data.digest, legacy):
                return [self._entry(cur, sets[0])]
            return [{**self._entry(cur, s), "shares_with_asked": True} for s in sets]


def check_budget(epsilon: float, delta: float) -> None:
    """A budget's (epsilon, delta), refused in one line: epsilon in (0, :data:`MAX_BUDGET_EPSILON`],
    delta as the accountant takes it."""
    from ..accountant import check_delta, check_epsilon

    check_epsilon(epsilon)
    check_delta(delta)
    if float(epsilon) > MAX_BUDGET_EPSILON:
        raise GSDError(f"--epsilon {float(epsilon):g} is above the largest budget gsd keeps, {MAX_BUDGET_EPSILON:g} "
                       f"(e^{MAX_BUDGET_EPSILON:g} > 10^43: a bound on no one's privacy); give a budget of at most {MAX_BUDGET_EPSILON:g}")


def _fits(runs: list[dict], epsilon: float, delta: float) -> bool:
    """Whether the booked ``runs`` are within the budget (epsilon, delta) by either filter."""
    spent = composed(runs, delta)
    if not spent["guarantee"]:
        return False
    tol = 1e-12 * max(1.0, epsilon)
    basic = spent["basic_epsilon"] <= epsilon + tol and spent["basic_delta"] <= delta / 2 * (1 + 1e-12)
    return basic or (spent["renyi_epsilon"] is not None and spent["renyi_epsilon"] <= epsilon + tol)


def _decoded(row: dict) -> dict:
    r = dict(row)
    if isinstance(r.get("rdp"), str):
        r["rdp"] = json.loads(r["rdp"])
    r["dp"], r["guarantee"] = bool(r["dp"]), bool(r["guarantee"])
    r["epsilon"], r["delta"] = float(r["epsilon"]), float(r["delta"])
    return r


def _refusal(data: DataIdentity, other: str | None, before: list[dict], row: dict, eps_b: float, delta_b: float) -> str:
    """The one-line refusal; ``other``: the budgeted data set that refused, when it is not ``data`` itself."""
    whose = "the data set's" if other is None else f"{other}'s"
    head = f"{data.name}: " + ("" if other is None else f"it shares examples with {other}; ")
    if not row["guarantee"]:
        return (f"{head}{row['what']} ({row['mechanism']}) has no proven DP guarantee, so a budget "
                f"(epsilon {eps_b:g}, delta {delta_b:g}) cannot admit it; use a mechanism with a proof (DP-GSD: --mechanism sequential)")
    spent = composed(before, delta_b)
    if not spent["guarantee"]:
        return (f"{head}a run booked on this data has no proven DP guarantee, so no budget holds for it any more; "
                "nothing more can be admitted (gsd budget show --private ... lists the runs)")
    left = remaining(spent, {"epsilon": eps_b, "delta": delta_b})
    basic = f"{spent['basic_epsilon']:.4g} (basic"
    if spent["basic_delta"] + row["delta"] > delta_b / 2:
        basic += f", whose deltas would sum past delta/2 = {delta_b / 2:g}"
    return (f"{head}privacy budget exceeded: this run ({row['what']}, epsilon {row['epsilon']:.4g}, delta {row['delta']:g}) "
            f"would pass {whose} budget epsilon {eps_b:g}, delta {delta_b:g}: {len(before)} run(s) spent epsilon {basic}) / "
            f"{_fmt(spent['renyi_epsilon'])} (Rényi filter), about {left['epsilon']:.4g} left; ask for a smaller --epsilon, "
            "or stop here (gsd budget show --private ... lists the runs)")


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"
