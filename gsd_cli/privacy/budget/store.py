"""Where the ledger is and how it is kept: SQLite (``BEGIN IMMEDIATE``) or a SQLAlchemy URL
(PostgreSQL, ``LOCK TABLE``), and :class:`BudgetLedger`, whose every method is one transaction."""

from __future__ import annotations

import datetime as _dt
import json
import os
import shlex
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from ...errors import GSDError
from .compose import ORDERS, admits, composed, remaining
from .identity import DataIdentity

#: ``$GSD_LEDGER``: the ledger's file or SQLAlchemy URL.
ENV = "GSD_LEDGER"
#: File name of the default ledger in the user's data folder.
FILE_NAME = "privacy-ledger.sqlite"
#: Seconds a booking waits for another process's transaction (SQLite busy timeout).
BUSY_TIMEOUT = 60.0
#: Schema version, in the ``gsd_meta`` table.
SCHEMA = 1
PRIVATE_NOTE = ("PRIVATE: the ledger names runs on the private data sets, with their times and commands; "
                "publish only `gsd budget show --publishable`")


class BudgetExceeded(GSDError):
    """A run would take a data set past its privacy budget; nothing was released."""


# --- where the ledger is -----------------------------------------------------------------------------

def default_location() -> str:
    """``$GSD_LEDGER``, else ``$XDG_DATA_HOME/gsd/privacy-ledger.sqlite`` (``~/.local/share/gsd/...``).
    Not under ``--data-root`` / ``$GSD_DATA_ROOT``: the budget must not move with the data root."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base).expanduser() / "gsd" / FILE_NAME)


def _is_url(location: str) -> bool:
    return "://" in location


_TABLES = (
    "CREATE TABLE IF NOT EXISTS gsd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS gsd_datasets (digest TEXT PRIMARY KEY, name TEXT NOT NULL, how TEXT NOT NULL, "
    "epsilon DOUBLE PRECISION, delta DOUBLE PRECISION, created TEXT NOT NULL, updated TEXT NOT NULL, raised INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS gsd_bookings (id TEXT PRIMARY KEY, digest TEXT NOT NULL, name TEXT NOT NULL, "
    "time TEXT NOT NULL, what TEXT NOT NULL, command TEXT NOT NULL, mechanism TEXT NOT NULL, "
    "epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL, rdp TEXT, dp INTEGER NOT NULL, "
    "guarantee INTEGER NOT NULL)",
    "CREATE INDEX IF NOT EXISTS gsd_bookings_digest ON gsd_bookings (digest)",
)


class _SQLite:
    """stdlib sqlite3: one connection per transaction, ``BEGIN IMMEDIATE`` takes the write lock first."""

    def __init__(self, path: str):
        self.path = str(Path(path).expanduser())
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            os.makedirs(folder, exist_ok=True)

    @contextmanager
    def transaction(self, write: bool, setup: bool = False):
        import sqlite3

        con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            con.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
            con.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                yield _Cursor(lambda sql, p: con.execute(sql, p).fetchall())
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")
        finally:
            con.close()

    def columns(self, table: str) -> set[str]:
        import sqlite3

        con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT)
        try:
            return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        finally:
            con.close()


class _SQLAlchemy:
    """A SQLAlchemy URL (PostgreSQL for teams; any backend SQLAlchemy speaks)."""

    def __init__(self, url: str):
        try:
            import sqlalchemy as sa
        except ImportError:
            raise GSDError(f"the ledger {url.split('://')[0]}://... needs SQLAlchemy and a driver: "
                           "pip install 'gsd-cli[budget-server]'") from None
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg://" + url[len("postgresql://"):]
        self.sa = sa
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        self.postgres = self.engine.dialect.name == "postgresql"

    @contextmanager
    def transaction(self, write: bool, setup: bool = False):
        with self.engine.begin() as con:
            def run(sql, params):
                res = con.execute(self.sa.text(sql), params)
                return [tuple(r) for r in res.fetchall()] if res.returns_rows else []

            cur = _Cursor(run)
            if self.postgres and setup:  # two first users creating the tables at once
                cur.run("SELECT pg_advisory_xact_lock(7290341)")
            elif write and self.postgres:
                # every booking serialised: no two runs read the same spent total and both slip past the budget
                cur.run("LOCK TABLE gsd_bookings IN EXCLUSIVE MODE")
            yield cur

    def columns(self, table: str) -> set[str]:
        return {c["name"] for c in self.sa.inspect(self.engine).get_columns(table)}


class _Cursor:
    def __init__(self, run):
        self.run = lambda sql, params=None: run(sql, params or {})


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def _command() -> str:
    """The ``gsd`` command running in this process (as :func:`gsd_cli.cli.main` got it), else the script."""
    cli = sys.modules.get("gsd_cli.cli.app")
    given = getattr(cli, "invoked", {}).get("argv") if cli is not None else None
    argv = ["gsd", *given] if given is not None else (list(sys.argv) or ["python"])
    # an argument that is not valid UTF-8 (a file name in another encoding) is kept, escaped: the ledger is text
    return shlex.join(argv)[:1000].encode("utf-8", "backslashreplace").decode("utf-8")


class BudgetLedger:
    """The privacy ledger at ``location`` (a file path or SQLAlchemy URL; default
    :func:`default_location`). Every method is one transaction."""

    def __init__(self, location: str | os.PathLike | None = None):
        self.location = str(location) if location is not None else default_location()
        self._db = _SQLAlchemy(self.location) if _is_url(self.location) else _SQLite(self.location)
        with self._db.transaction(write=True, setup=True) as cur:
            for sql in _TABLES:
                cur.run(sql)
            cur.run("INSERT INTO gsd_meta (key, value) VALUES ('schema', :v) ON CONFLICT (key) DO NOTHING", {"v": str(SCHEMA)})
            cur.run("INSERT INTO gsd_meta (key, value) VALUES ('orders', :v) ON CONFLICT (key) DO NOTHING", {"v": json.dumps(ORDERS)})
            cur.run("INSERT INTO gsd_meta (key, value) VALUES ('note', :v) ON CONFLICT (key) DO NOTHING", {"v": PRIVATE_NOTE})
            stored = cur.run("SELECT value FROM gsd_meta WHERE key = 'orders'")[0][0]
        if "raised" not in self._db.columns("gsd_datasets"):  # a ledger from before budgets were marked when raised
            with self._db.transaction(write=True, setup=True) as cur:
                cur.run("ALTER TABLE gsd_datasets ADD COLUMN raised INTEGER NOT NULL DEFAULT 0")
        if tuple(json.loads(stored)) != ORDERS:
            raise GSDError(f"the ledger {self.location} keeps RDP curves at other orders than this gsd; "
                           "use the gsd version that created it, or a new --ledger")

    def __repr__(self) -> str:
        return f"BudgetLedger({self.location!r})"

    def close(self) -> None:
        """Close the server connections this ledger holds (a SQLite ledger holds none between calls)."""
        engine = getattr(self._db, "engine", None)
        if engine is not None:
            engine.dispose()

    # -- budgets ---------------------------------------------------------------------------------

    def set_budget(self, data: DataIdentity, epsilon: float, delta: float, *, allow_raise: bool = False) -> dict:
        """Give the data set ``data`` the budget (epsilon, delta) (the runs booked stay booked and count).

        A filter's guarantee is for a budget fixed before the runs it stops: lowering a budget is
        always safe, raising one after runs were booked (chosen, perhaps, after seeing their results)
        is refused unless ``allow_raise``, and then recorded (``raised`` in :meth:`status`: the totals
        shown are still true, the filter's guarantee no longer holds for the old budget nor for the
        new one). Returns :meth:`status` of the data set."""
        from ..accountant import check_delta, check_epsilon

        check_epsilon(epsilon)
        check_delta(delta)
        now = _now()
        with self._db.transaction(write=True) as cur:
            old = cur.run("SELECT epsilon, delta FROM gsd_datasets WHERE digest = :d", {"d": data.digest})
            runs = cur.run("SELECT COUNT(*) FROM gsd_bookings WHERE digest = :d", {"d": data.digest})[0][0]
            raising = bool(old) and old[0][0] is not None and runs > 0 and (epsilon > old[0][0] or delta > old[0][1])
            if raising and not allow_raise:
                raise GSDError(f"{data.name} has the budget epsilon {old[0][0]:g}, delta {old[0][1]:g} and {runs} run(s) booked under it: "
                               "raising it after seeing results voids the filter's guarantee; keep it, or pass --raise to record that it was raised")
            cur.run("INSERT INTO gsd_datasets (digest, name, how, epsilon, delta, created, updated, raised) "
                    "VALUES (:d, :n, :h, :e, :de, :t, :t, 0) ON CONFLICT (digest) DO UPDATE SET epsilon = :e, delta = :de, updated = :t, "
                    "raised = gsd_datasets.raised + :r",
                    {"d": data.digest, "n": data.name, "h": data.how, "e": float(epsilon), "de": float(delta), "t": now, "r": int(raising)})
        return self.status(data.digest)[0]

    # -- bookings --------------------------------------------------------------------------------

    def book(self, data: DataIdentity, *, what: str, mechanism: str, epsilon: float, delta: float,
             rdp: Sequence[float] | None, dp: bool = True, guarantee: bool = True, booking_id: str | None = None,
             command: str | None = None) -> dict:
        """Book one release on ``data`` before it happens, in one locked transaction: refused
        (:class:`BudgetExceeded`) when the data set has a budget that the filter (module docstring)
        says it would pass. ``rdp``: the release's RDP curve at :data:`ORDERS` (None: none known).
        ``booking_id``: a booking with this id already in the ledger is returned as it is (a resumed
        run is not booked twice). ``dp=False``: the run is not DP (``--insecure-seed``), booked all
        the same. Returns the booking."""
        bid = booking_id or uuid.uuid4().hex
        row = {"id": bid, "digest": data.digest, "name": data.name, "time": _now(), "what": what,
               "command": command if command is not None else _command(), "mechanism": mechanism,
               "epsilon": float(epsilon), "delta": float(delta), "rdp": json.dumps(list(map(float, rdp))) if rdp is not None else None,
               "dp": int(bool(dp)), "guarantee": int(bool(guarantee))}
        with self._db.transaction(write=True) as cur:
            found = cur.run("SELECT digest FROM gsd_bookings WHERE id = :i", {"i": bid})
            if found:
                if found[0][0] != data.digest:  # an id is one run's: never another data set's booking
                    raise GSDError(f"booking {bid[:12]}... of the ledger belongs to another data set; start a new run with --out")
                return self._bookings(cur, data.digest, bid)[0]
            cur.run("INSERT INTO gsd_datasets (digest, name, how, epsilon, delta, created, updated) "
                    "VALUES (:d, :n, :h, NULL, NULL, :t, :t) ON CONFLICT (digest) DO NOTHING",
                    {"d": data.digest, "n": data.name, "h": data.how, "t": row["time"]})
            budget = cur.run("SELECT epsilon, delta FROM gsd_datasets WHERE digest = :d", {"d": data.digest})[0]
            if budget[0] is not None:
                before = self._bookings(cur, data.digest)
                ok, _ = admits(before, _decoded(row), float(budget[0]), float(budget[1]))
                if not ok:
                    raise BudgetExceeded(_refusal(data, before, row, float(budget[0]), float(budget[1])))
            cur.run("INSERT INTO gsd_bookings (id, digest, name, time, what, command, mechanism, epsilon, delta, rdp, dp, guarantee) "
                    "VALUES (:id, :digest, :name, :time, :what, :command, :mechanism, :epsilon, :delta, :rdp, :dp, :guarantee)", row)
        return _decoded(row)

    def _bookings(self, cur, digest: str, bid: str | None = None) -> list[dict]:
        sql = ("SELECT id, digest, name, time, what, command, mechanism, epsilon, delta, rdp, dp, guarantee "
               "FROM gsd_bookings WHERE digest = :d" + (" AND id = :i" if bid else "") + " ORDER BY time, id")
        cols = ("id", "digest", "name", "time", "what", "command", "mechanism", "epsilon", "delta", "rdp", "dp", "guarantee")
        return [_decoded(dict(zip(cols, r))) for r in cur.run(sql, {"d": digest, "i": bid})]

    # -- reading ---------------------------------------------------------------------------------

    def status(self, digest: str | None = None) -> list[dict]:
        """Per data set (one, or all): its budget, every booking and the spent figures of
        :func:`composed`, with ``remaining`` (epsilon_B minus the smaller spent figure that the
        filter may use) where a budget is set."""
        with self._db.transaction(write=False) as cur:
            sets = cur.run("SELECT digest, name, how, epsilon, delta, created, raised FROM gsd_datasets"
                           + (" WHERE digest = :d" if digest else "") + " ORDER BY created, digest", {"d": digest})
            out = []
            for d, name, how, eps, delta, created, raised in sets:
                runs = self._bookings(cur, d)
                spent = composed(runs, delta)
                budget = None if eps is None else {"epsilon": float(eps), "delta": float(delta), "raised": int(raised)}
                entry = {"digest": d, "name": name, "identified_by": how, "budget": budget, "spent": spent, "runs": runs}
                if budget is not None:
                    entry["remaining"] = remaining(spent, budget)
                out.append(entry)
        return out


def _decoded(row: dict) -> dict:
    r = dict(row)
    if isinstance(r.get("rdp"), str):
        r["rdp"] = json.loads(r["rdp"])
    r["dp"], r["guarantee"] = bool(r["dp"]), bool(r["guarantee"])
    r["epsilon"], r["delta"] = float(r["epsilon"]), float(r["delta"])
    return r


def _refusal(data: DataIdentity, before: list[dict], row: dict, eps_b: float, delta_b: float) -> str:
    if not row["guarantee"]:
        return (f"{data.name}: {row['what']} ({row['mechanism']}) has no proven DP guarantee, so the data set's budget "
                f"(epsilon {eps_b:g}, delta {delta_b:g}) cannot admit it; use a mechanism with a proof (DP-GSD: --mechanism sequential)")
    spent = composed(before, delta_b)
    if not spent["guarantee"]:
        return (f"{data.name}: a run booked on this data set has no proven DP guarantee, so no budget holds for it any more; "
                "nothing more can be admitted (gsd budget show --private ... lists the runs)")
    left = remaining(spent, {"epsilon": eps_b, "delta": delta_b})
    basic = f"{spent['basic_epsilon']:.4g} (basic"
    if spent["basic_delta"] + row["delta"] > delta_b / 2:
        basic += f", whose deltas would sum past delta/2 = {delta_b / 2:g}"
    return (f"{data.name}: privacy budget exceeded: this run ({row['what']}, epsilon {row['epsilon']:.4g}, delta {row['delta']:g}) "
            f"would pass the data set's budget epsilon {eps_b:g}, delta {delta_b:g}: {len(before)} run(s) spent epsilon {basic}) / "
            f"{_fmt(spent['renyi_epsilon'])} (Rényi filter), about {left['epsilon']:.4g} left; ask for a smaller --epsilon, "
            "or stop here (gsd budget show --private ... lists the runs)")


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"
