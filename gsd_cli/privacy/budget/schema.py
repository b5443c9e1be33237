"""The ledger's tables and their upgrade. Schema 3 (this gsd): as schema 2, with every stored identity
keyed (:mod:`.key`: the example identities and data set digests are HMAC-SHA256 under the ledger's
secret key, kept in a file apart from the ledger; ``gsd_meta`` holds the ledger's ``ledger_id`` and
the key's ``key_check``). Schema 2: ``gsd_datasets`` (one row per data set: its digest,
name, budget, ``sid``), ``gsd_examples`` (``sid``, example identity: one row per distinct example of each
set, indexed by the identity), ``gsd_overlaps`` (``sid``, ``other``: the pairs of sets that share at
least one example, found once when a set is first seen: a set's examples never change), ``gsd_bookings``
(one row per release, under the digest of the set it read) and ``gsd_meta``. A ledger of schema 1 (data
sets keyed by one content digest, gsd 0.3) or 2 (unkeyed identities, gsd 0.4) is upgraded in place the
first time this gsd opens it (:func:`check_schema`)."""

from __future__ import annotations

import json
from typing import Callable

from ...errors import GSDError
from .compose import ORDERS
from .location import shown, unusable, writable

#: Schema version, in the ``gsd_meta`` table.
SCHEMA = 3
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


def meta_rows(ledger_id: str, key_check: str) -> list[dict]:
    """The ``gsd_meta`` rows of a new ledger (its id, and the check value of its key: :mod:`.key`)."""
    return [{"k": "schema", "v": str(SCHEMA)}, {"k": "orders", "v": json.dumps(ORDERS)}, {"k": "note", "v": PRIVATE_NOTE},
            {"k": "ledger_id", "v": ledger_id}, {"k": "key_check", "v": key_check}]


def new_key_rows(key_given) -> tuple[list[dict], object]:
    """The ``gsd_meta`` rows of a new ledger and its new key (written to its file first)."""
    from .key import make_key, new_ledger_id

    ledger_id = new_ledger_id()
    key = make_key(ledger_id, key_given)
    return meta_rows(ledger_id, key.check(ledger_id)), key


def check_schema(db, location: str, notice: Callable[[str], None], key_given=None) -> None:
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
            if schema < 2:
                migrate(db, location, notice)
            rekey(db, location, notice, key_given)
        else:
            raise unusable(location, f"it was written by an older gsd (schema {schema}) and is read-only, so it cannot be upgraded",
                           "make it writable once, or read it with the gsd that wrote it")


def migrate(db, location: str, notice: Callable[[str], None]) -> None:
    """Schema 1 -> 2: each data set gets a ``sid`` and no examples yet (``examples`` NULL); it is
    matched by its old digest (:func:`gsd_cli.privacy.budget.identity.legacy_digest`) the first
    time a run, ``budget set`` or ``budget show --private`` reads it, and then gets its examples."""
    with db.transaction(write=True, setup=True) as cur:
        if int(dict(cur.run("SELECT key, value FROM gsd_meta")).get("schema", "1")) >= 2:
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
        cur.run("UPDATE gsd_meta SET value = :v WHERE key = 'schema'", {"v": "2"})
    notice(f"upgraded the privacy ledger {shown(location)} to per-example identities (each data set booked before "
           "is matched by its old digest the next time a run reads it)")


def rekey(db, location: str, notice: Callable[[str], None], key_given=None) -> None:
    """Schema 2 -> 3: a new secret key for the ledger (written to its file, :mod:`.key`), and every
    identity the ledger stores replaced by its keyed form, in one transaction: each example identity e
    by HMAC(K, e), each data set digest d (in ``gsd_datasets`` and ``gsd_bookings``) by HMAC(K, d). The
    unkeyed identities are one-way digests of the images, so nothing needs the data again, and a data
    set of schema 1 not yet matched keeps its old digest keyed (:func:`~.datasets.legacy_for` keys the
    old digest it computes). A SQLite file is then rewritten (``VACUUM``: no unkeyed value stays in
    its free pages) and made 0600."""
    import os

    from .key import make_key, new_ledger_id

    key = None
    with db.transaction(write=True, setup=True) as cur:
        meta = dict(cur.run("SELECT key, value FROM gsd_meta"))
        if int(meta.get("schema", "1")) >= SCHEMA:
            return  # another process upgraded it meanwhile
        ledger_id = new_ledger_id()
        key = make_key(ledger_id, key_given)
        try:
            examples = cur.run("SELECT sid, example FROM gsd_examples")
            cur.run("DELETE FROM gsd_examples")
            rows = [{"s": int(sid), "e": key.keyed(e)} for sid, e in examples]
            for start in range(0, len(rows), 5000):
                cur.many("INSERT INTO gsd_examples (sid, example) VALUES (:s, :e)", rows[start:start + 5000])
            for (d,) in cur.run("SELECT digest FROM gsd_datasets"):
                cur.run("UPDATE gsd_datasets SET digest = :n WHERE digest = :d", {"n": key.keyed(d), "d": d})
            for (d,) in cur.run("SELECT DISTINCT digest FROM gsd_bookings"):
                cur.run("UPDATE gsd_bookings SET digest = :n WHERE digest = :d", {"n": key.keyed(d), "d": d})
            for k, v in (("ledger_id", ledger_id), ("key_check", key.check(ledger_id))):
                cur.run("DELETE FROM gsd_meta WHERE key = :k", {"k": k})
                cur.run("INSERT INTO gsd_meta (key, value) VALUES (:k, :v)", {"k": k, "v": v})
            cur.run("UPDATE gsd_meta SET value = :v WHERE key = 'schema'", {"v": str(SCHEMA)})
        except BaseException:
            try:
                os.unlink(key.path)  # the upgrade did not happen: its key is no one's
            except OSError:
                pass
            raise
    if db.sqlite:
        db.vacuum()
        try:
            os.chmod(db.path, 0o600)
        except OSError:
            pass
    notice(f"upgraded the privacy ledger {shown(location)}: its example identities are now keyed (HMAC) with a secret key "
           f"kept apart from it, in {key.path} (0600; without it the ledger is no membership oracle; with it, it is: "
           "guard it like the private data, and give it to whoever shares the ledger)")
