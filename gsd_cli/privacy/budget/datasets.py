"""The data sets a ledger knows and the bookings that count against each: a data set is added once, with
one row per distinct example (``gsd_examples``) and the pairs of sets that share at least one example
(``gsd_overlaps``, found when the set is first seen: a set's examples never change); a data set of an
upgraded schema-1 ledger is matched by its old digest and then gets its examples. Every function but
:func:`legacy_for` and :func:`registered` runs inside a transaction of the caller's (``cur``)."""

from __future__ import annotations

import datetime as _dt
import json

from .identity import DataIdentity

BATCH = 5000  # rows per INSERT batch, and identities per IN (...) lookup (at most 500)
COLS = ("id", "digest", "name", "time", "what", "command", "mechanism", "epsilon", "delta", "rdp", "dp", "guarantee")


def now() -> str:
    """The time now, in UTC (ISO 8601, microseconds): when a data set or a booking is added."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def decoded(row: dict) -> dict:
    """A ``gsd_bookings`` row as a booking: its RDP curve a list, its flags booleans, its epsilon and delta floats."""
    r = dict(row)
    if isinstance(r.get("rdp"), str):
        r["rdp"] = json.loads(r["rdp"])
    r["dp"], r["guarantee"] = bool(r["dp"]), bool(r["guarantee"])
    r["epsilon"], r["delta"] = float(r["epsilon"]), float(r["delta"])
    return r


def legacy_for(db, data: DataIdentity) -> str | None:
    """The old digest of ``data``, computed only when the ledger has data sets from before
    per-example identities and ``data`` is not in it yet (outside any lock: it reads files)."""
    if not data.examples or data.legacy is None:
        return None
    with db.transaction(write=False) as cur:
        if cur.run("SELECT 1 FROM gsd_datasets WHERE digest = :d", {"d": data.digest}):
            return None
        if not cur.run("SELECT 1 FROM gsd_datasets WHERE examples IS NULL AND how <> 'examples' LIMIT 1"):
            return None
    return data.legacy()

def registered(db, data: DataIdentity) -> int:
    """The ``sid`` of ``data``, added in a transaction of its own when new (kept whatever the run's
    booking then says: a refused run's data set is known to the ledger, and so is what it shares)."""
    legacy = legacy_for(db, data)
    with db.transaction(write=True) as cur:
        return register(cur, data, legacy)

def register(cur, data: DataIdentity, legacy: str | None) -> int:
    """The ``sid`` of ``data``, adding it (its examples and the sets it shares examples with) when new;
    a data set of an upgraded ledger found by its old digest gets its examples and the new digest."""
    row = cur.run("SELECT sid FROM gsd_datasets WHERE digest = :d", {"d": data.digest})
    if row:
        return int(row[0][0])
    t = now()
    n = len(data.examples) if data.examples else None
    if legacy is not None:
        old = cur.run("SELECT sid FROM gsd_datasets WHERE digest = :o AND examples IS NULL", {"o": legacy})
        if old:
            sid = int(old[0][0])
            cur.run("UPDATE gsd_datasets SET digest = :d, how = :h, examples = :n, updated = :t WHERE sid = :s",
                    {"d": data.digest, "h": data.how, "n": n, "t": t, "s": sid})
            cur.run("UPDATE gsd_bookings SET digest = :d WHERE digest = :o", {"d": data.digest, "o": legacy})
            add_examples(cur, sid, data)
            return sid
    sid = int(cur.run("SELECT COALESCE(MAX(sid), 0) + 1 FROM gsd_datasets")[0][0])
    cur.run("INSERT INTO gsd_datasets (digest, name, how, epsilon, delta, created, updated, raised, sid, examples) "
            "VALUES (:d, :n, :h, NULL, NULL, :t, :t, 0, :s, :x)",
            {"d": data.digest, "n": data.name, "h": data.how, "t": t, "s": sid, "x": n})
    add_examples(cur, sid, data)
    return sid

def add_examples(cur, sid: int, data: DataIdentity) -> None:
    """The examples of the new data set ``sid``, and the pairs of sets it shares an example with (both ways)."""
    ex = data.examples
    for start in range(0, len(ex), BATCH):
        cur.many("INSERT INTO gsd_examples (sid, example) VALUES (:s, :e)", [{"s": sid, "e": e} for e in ex[start:start + BATCH]])
    if ex:  # the sets sharing an example with this one, found once (a set's examples never change)
        cur.run("INSERT INTO gsd_overlaps (sid, other) SELECT DISTINCT x.sid, o.sid FROM gsd_examples x "
                "JOIN gsd_examples o ON o.example = x.example WHERE x.sid = :s AND o.sid <> :s", {"s": sid})
        cur.run("INSERT INTO gsd_overlaps (sid, other) SELECT other, sid FROM gsd_overlaps WHERE sid = :s", {"s": sid})

def sets(cur, where: str, params: dict) -> list[tuple]:
    """The ``gsd_datasets`` rows that meet ``where``, oldest first."""
    return cur.run("SELECT sid, digest, name, how, epsilon, delta, created, raised, examples FROM gsd_datasets "
                   f"WHERE {where} ORDER BY created, digest", params)

def bookings(cur, sid: int) -> list[dict]:
    """Every booking on the set ``sid`` or on a set that shares an example with it, oldest first."""
    sql = ("SELECT " + ", ".join(f"b.{c}" for c in COLS) + " FROM gsd_bookings b JOIN gsd_datasets d ON d.digest = b.digest "
           "WHERE d.sid = :s OR d.sid IN (SELECT other FROM gsd_overlaps WHERE sid = :s) ORDER BY b.time, b.id")
    return [decoded(dict(zip(COLS, r))) for r in cur.run(sql, {"s": sid})]

def booking(cur, bid: str) -> dict | None:
    """The booking with the id ``bid``, or None."""
    rows = cur.run("SELECT " + ", ".join(COLS) + " FROM gsd_bookings WHERE id = :i", {"i": bid})
    return decoded(dict(zip(COLS, rows[0]))) if rows else None

def around(cur, data: DataIdentity, legacy: str | None) -> list[tuple]:
    """The data sets of the ledger that ``data`` is, or shares an example with (read only)."""
    for d in (data.digest, legacy):
        if d is not None:
            own = sets(cur, "digest = :d", {"d": d})
            if own:
                sid = int(own[0][0])
                return own + sets(cur, "sid IN (SELECT other FROM gsd_overlaps WHERE sid = :s)", {"s": sid})
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
    return sets(cur, f"sid IN ({marks})", {f"s{i}": s for i, s in enumerate(sorted(sids))})
