"""A ledger in a SQLite file (stdlib ``sqlite3``): checked before any work without writing to a file
that is not a ledger, created whole or not at all, and one transaction per call under ``BEGIN
IMMEDIATE`` (a lock held by another process waited for up to ``--ledger-timeout``, with one message)."""

from __future__ import annotations

import os
import stat
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from .location import FILE_NAME, LedgerError, locked, shown, unusable, writable
from .schema import new_key_rows, tables

_SQLITE_HEADER = b"SQLite format 3\x00"


class Cursor:
    """One transaction's handle, the same for both kinds of ledger: ``run(sql, params)`` returns the rows,
    ``many(sql, rows)`` runs one statement per row."""

    def __init__(self, run, many):
        self.run = lambda sql, params=None: run(sql, params or {})
        self.many = many


class SQLiteLedger:
    """stdlib sqlite3: one connection per transaction (``mode=rw``/``ro``: never creates a file);
    ``BEGIN IMMEDIATE`` takes the write lock first, waiting up to the timeout with one message."""

    sqlite = True

    def __init__(self, path: str, timeout: float, notice: Callable[[str], None], key_given=None):
        self.key_given = key_given
        self.location = path
        self.path = str(Path(path).expanduser())
        self.timeout = timeout
        self.notice = notice
        self.created = False

    def _fail(self, why: str, todo: str = "give another --ledger") -> LedgerError:
        return unusable(self.location, why, todo)

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
            if not writable(p):
                raise self._fail("the file is read-only", "make it writable (chmod u+w) or give another --ledger")
            folder = os.path.dirname(os.path.abspath(p))
            if not writable(folder):
                raise self._fail(f"its folder {folder} is read-only (SQLite writes a journal beside the ledger)",
                                 "make the folder writable, or move the ledger")
        with self.transaction(write=False) as cur:  # a lock held by another process: waited for, with a message
            names = {r[0] for r in cur.run("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "gsd_meta" not in names:
            raise self._fail("it is a SQLite database but not a gsd ledger (no gsd_meta table); it was not changed",
                             "give the path of a ledger, or of a file that does not exist yet")
        return True

    def _damaged(self, e: Exception) -> LedgerError:
        import sqlite3

        msg = " ".join(str(e).split()) or type(e).__name__
        if isinstance(e, sqlite3.OperationalError) and "locked" in msg:
            return locked(self.location, self.timeout)
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
        if not writable(probe):
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
        if not writable(folder):
            raise self._fail(f"its folder {folder} is read-only", "give a path in a writable folder")
        tmp = os.path.join(folder, f".{os.path.basename(self.path)}.{uuid.uuid4().hex[:12]}.tmp")
        key = None
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # private from its first byte (SQLite's journals follow)
            rows, key = new_key_rows(self.key_given)  # the key's file first: a ledger never exists without its key
            con = sqlite3.connect(tmp, isolation_level=None)
            try:
                con.execute("BEGIN")
                for sql in tables(True):
                    con.execute(sql)
                con.executemany("INSERT INTO gsd_meta (key, value) VALUES (:k, :v)", rows)
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
            if key is not None and not self.created:  # not this ledger's key after all
                try:
                    os.unlink(key.path)
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
                        raise locked(self.location, self.timeout) from None
                    if not waited:
                        self.notice(f"the ledger {shown(self.location)} is locked by another process; "
                                    f"waiting up to {self.timeout:g} s (--ledger-timeout)")
                        waited = True
                    con.execute(f"PRAGMA busy_timeout = {int(max(1, min(left, 1.0) * 1000))}")
            con.execute(f"PRAGMA busy_timeout = {int(max(1.0, deadline - time.monotonic()) * 1000)}")
            try:
                yield Cursor(lambda sql, p: con.execute(sql, p).fetchall(), lambda sql, rows: con.executemany(sql, rows))
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

    def vacuum(self) -> None:
        """Rewrite the file (``VACUUM``): no deleted value stays in its free pages."""
        import sqlite3

        con = self._connect(True)
        try:
            con.execute(f"PRAGMA busy_timeout = {int(max(1.0, self.timeout) * 1000)}")
            con.execute("VACUUM")
        except sqlite3.Error as e:
            raise self._damaged(e) from None
        finally:
            con.close()

    def close(self) -> None:
        pass
