"""The ledger's tables and their upgrade. Schema 2: ``gsd_datasets`` (one row per data set: its digest,
name, budget, ``sid``), ``gsd_examples`` (``sid``, example identity: one row per distinct example of each
set, indexed by the identity), ``gsd_overlaps`` (``sid``, ``other``: the pairs of sets that share at
least one example, found once when a set is first seen: a set's examples never change), ``gsd_bookings``
(one row per release, under the digest of the set it read) and ``gsd_meta``. A ledger of schema 1 (data
sets keyed by one content digest, gsd 0.3) is upgraded in place the first time this gsd opens it
(:func:`check_schema`)."""

from __future__ import annotations

import json
from typing import Callable

from ...errors import GSDError
from .compose import ORDERS
from .location import shown, unusable, writable

#: Schema version, in the ``gsd_meta`` table.
SCHEMA = 2
PRIVATE_NOTE = ("PRIVATE: the ledger names runs on the private data sets, with their times and commands; "
                "publish only `gsd budget show --publishable`")


def tables(sqlite: bool) -> tuple[str, ...]:
    """The statements that make a new ledger's tables (``sqlite``: SQLite's compact tables)."""
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
        *SCHEMA2[sqlite],
    )


SCHEMA2 = {s: (
    "CREATE UNIQUE INDEX IF NOT EXISTS gsd_datasets_sid ON gsd_datasets (sid)",
    "CREATE TABLE IF NOT EXISTS gsd_examples (sid INTEGER NOT NULL, example TEXT NOT NULL, PRIMARY KEY (sid, example))"
    + (" WITHOUT ROWID" if s else ""),
    "CREATE INDEX IF NOT EXISTS gsd_examples_example ON gsd_examples (example)",
    "CREATE TABLE IF NOT EXISTS gsd_overlaps (sid INTEGER NOT NULL, other INTEGER NOT NULL, PRIMARY KEY (sid, other))"
    + (" WITHOUT ROWID" if s else ""),
) for s in (True, False)}


def meta_rows() -> list[dict]:
    """The ``gsd_meta`` rows of a new ledger."""
    return [{"k": "schema", "v": str(SCHEMA)}, {"k": "orders", "v": json.dumps(ORDERS)}, {"k": "note", "v": PRIVATE_NOTE}]


def check_schema(db, location: str, notice: Callable[[str], None]) -> None:
    """Check the schema of the ledger ``db`` (a :class:`~.sqlite_ledger.SQLiteLedger` or
    :class:`~.server_ledger.ServerLedger` at ``location``) before it is used: a newer schema, other RDP
    orders or a damaged ``gsd_meta`` are refused; an older schema is upgraded (:func:`migrate`), or
    refused when the file is read-only."""
    with db.transaction(write=False) as cur:
        meta = dict(cur.run("SELECT key, value FROM gsd_meta"))
    try:
        schema = int(meta.get("schema", "1"))
        orders = tuple(json.loads(meta["orders"]))
    except (KeyError, ValueError, TypeError):
        raise unusable(location, "its gsd_meta table is damaged", "restore it from a backup, or give another --ledger") from None
    if schema > SCHEMA:
        raise unusable(location, f"it was written by a newer gsd (ledger schema {schema}, this gsd reads {SCHEMA})",
                       "upgrade gsd (pip install -U gsd-cli), or give another --ledger")
    if orders != ORDERS:
        raise GSDError(f"the ledger {shown(location)} keeps RDP curves at other orders than this gsd; "
                       "use the gsd version that created it, or a new --ledger")
    if schema < SCHEMA:
        if not db.sqlite or writable(db.path):
            migrate(db, location, notice)
        else:
            raise unusable(location, f"it was written by an older gsd (schema {schema}) and is read-only, so it cannot be upgraded",
                           "make it writable once, or read it with the gsd that wrote it")


def migrate(db, location: str, notice: Callable[[str], None]) -> None:
    """Schema 1 -> 2: each data set gets a ``sid`` and no examples yet (``examples`` NULL); it is
    matched by its old digest (:func:`gsd_cli.privacy.budget.identity.legacy_digest`) the first
    time a run, ``budget set`` or ``budget show --private`` reads it, and then gets its examples."""
    with db.transaction(write=True, setup=True) as cur:
        if int(dict(cur.run("SELECT key, value FROM gsd_meta")).get("schema", "1")) >= SCHEMA:
            return  # another process upgraded it meanwhile
        cols = db.columns(cur, "gsd_datasets")
        if "raised" not in cols:
            cur.run("ALTER TABLE gsd_datasets ADD COLUMN raised INTEGER NOT NULL DEFAULT 0")
        if "sid" not in cols:
            cur.run("ALTER TABLE gsd_datasets ADD COLUMN sid INTEGER")
            cur.run("ALTER TABLE gsd_datasets ADD COLUMN examples INTEGER")
        for i, (d,) in enumerate(cur.run("SELECT digest FROM gsd_datasets ORDER BY created, digest"), 1):
            cur.run("UPDATE gsd_datasets SET sid = :s WHERE digest = :d", {"s": i, "d": d})
        for sql in SCHEMA2[db.sqlite]:
            cur.run(sql)
        cur.run("UPDATE gsd_meta SET value = :v WHERE key = 'schema'", {"v": str(SCHEMA)})
    notice(f"upgraded the privacy ledger {shown(location)} to per-example identities (each data set booked before "
           "is matched by its old digest the next time a run reads it)")
