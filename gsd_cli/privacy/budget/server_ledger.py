"""A ledger on a server through SQLAlchemy (PostgreSQL for teams; any backend SQLAlchemy speaks): a
booking's transaction takes ``LOCK TABLE ... EXCLUSIVE`` (held by another process: waited for up to
``--ledger-timeout``, with one message)."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable

from .location import LedgerError, locked, shown, unusable
from .schema import new_key_rows, tables
from .sqlite_ledger import Cursor


class ServerLedger:
    """A SQLAlchemy URL (PostgreSQL for teams; any backend SQLAlchemy speaks)."""

    sqlite = False

    def __init__(self, url: str, timeout: float, notice: Callable[[str], None], key_given=None):
        from urllib.parse import urlsplit

        self.key_given = key_given
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
        return unusable(self.location, why, todo)

    def _server_error(self, e: Exception) -> LedgerError:
        orig = getattr(e, "orig", None) or e
        msg = " ".join(str(orig).split("\n")[0].split()) or type(orig).__name__
        if isinstance(e, self.sa.exc.OperationalError) and ("lock" in msg and "timeout" in msg or "could not obtain lock" in msg):
            return locked(self.location, self.timeout)
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
        key = None
        try:
            with self.transaction(write=True, setup=True) as cur:
                existed = self._has_meta(cur)
                for sql in tables(False):
                    cur.run(sql)
                if not existed:
                    rows, key = new_key_rows(self.key_given)  # the key's file first, on this machine (apart from the server)
                    for row in rows:
                        cur.run("INSERT INTO gsd_meta (key, value) VALUES (:k, :v) ON CONFLICT (key) DO NOTHING", row)
            self.created = not existed
        finally:
            if key is not None and not self.created:
                import os

                try:
                    os.unlink(key.path)
                except OSError:
                    pass
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

                cur = Cursor(run, many)
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
            raise locked(self.location, self.timeout) from None
        cur.run("SET LOCAL lock_timeout = 0")

    def columns(self, cur, table: str) -> set[str]:
        if self.postgres:
            return {r[0] for r in cur.run("SELECT column_name FROM information_schema.columns WHERE table_name = :t", {"t": table})}
        return {c["name"] for c in self.sa.inspect(self.engine).get_columns(table)}

    def close(self) -> None:
        self.engine.dispose()
