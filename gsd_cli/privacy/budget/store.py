"""The booking logic: :class:`BudgetLedger`, whose every method is one transaction, admits or refuses a
release under the budgets it counts against (:func:`~.compose.admits`), books it, sets budgets and
reports what was spent. Where the ledger is and why it may be unusable: :mod:`.location`; its tables
and their upgrade: :mod:`.schema`; its kinds: :mod:`.sqlite_ledger` (SQLite, ``BEGIN IMMEDIATE``) and
:mod:`.server_ledger` (a SQLAlchemy URL, PostgreSQL's ``LOCK TABLE``); the data sets it knows, their
examples and overlaps: :mod:`.datasets`. The names of those modules that this one used to hold
(``LedgerError``, ``default_location``, ``ledger_timeout``, ``ENV``, ...) are importable from here too."""

from __future__ import annotations

import json
import os
import shlex
import sys
import uuid
from typing import Callable, Sequence

from ...errors import GSDError, PrivateError
from .compose import admits, composed, remaining
from .datasets import around, booking, bookings, decoded, legacy_for, now, registered, sets
from .identity import DataIdentity
from .location import (BUSY_TIMEOUT, ENV, FILE_NAME, TIMEOUT_ENV, LedgerError, default_location, is_url, ledger_timeout,  # noqa: F401
                       shown, unusable)
from .schema import PRIVATE_NOTE, SCHEMA, check_schema  # noqa: F401
from .server_ledger import ServerLedger
from .sqlite_ledger import SQLiteLedger

#: The largest budget epsilon ``set_budget`` accepts: e^100 > 10^43, a bound on no one's privacy.
MAX_BUDGET_EPSILON = 100.0


class BudgetExceeded(PrivateError):
    """A run would take a data set past its privacy budget; nothing was released. Which budgets a run
    counts against, and so whether it is refused, depends on the private data (the sets it shares
    examples with): the message is a ``private:`` line and the exit status a private output."""


def _command() -> str:
    """The ``gsd`` command running in this process (as :func:`gsd_cli.cli.main` got it), else the script."""
    cli = sys.modules.get("gsd_cli.cli.app")
    given = getattr(cli, "invoked", {}).get("argv") if cli is not None else None
    argv = ["gsd", *given] if given is not None else (list(sys.argv) or ["python"])
    # an argument that is not valid UTF-8 (a file name in another encoding) is kept, escaped: the ledger is text
    return shlex.join(argv)[:1000].encode("utf-8", "backslashreplace").decode("utf-8")


def say(line: str, private: bool = False) -> None:
    """One line for the person running gsd (stderr; the CLI's console while a ``gsd`` command runs);
    ``private``: labelled ``private:`` (its content depends on the private data)."""
    cli = sys.modules.get("gsd_cli.cli.app")
    common = sys.modules.get("gsd_cli.cli.common")
    if cli is not None and common is not None and getattr(cli, "invoked", {}).get("argv") is not None:
        from rich.markup import escape

        if private:
            common.print_private(common.err, escape(line))
        else:
            common.err.print(escape(line), highlight=False, soft_wrap=True)
    else:
        print(("private: " if private else "") + line, file=sys.stderr, flush=True)


class BudgetLedger:
    """The privacy ledger at ``location`` (a file path or SQLAlchemy URL; default
    :func:`default_location`), checked when it is opened (:class:`LedgerError`). ``create``: a ledger
    that does not exist yet is made (and said so, through ``notice``); ``"check"``: only checked that
    it could be; False (``gsd budget show``): nothing is ever created. :attr:`exists` says whether
    there is one. ``timeout``:
    seconds to wait for another process's lock (default :func:`ledger_timeout`). Every method is one
    transaction."""

    def __init__(self, location: str | os.PathLike | None = None, *, create: bool | str = True, timeout: float | None = None,
                 notice: Callable[[str], None] | None = None, key: str | os.PathLike | None = None):
        self.location = str(location) if location is not None else default_location()
        if not self.location.strip():
            raise GSDError("--ledger is empty; give a file path or a URL (postgresql://user@host/db)")
        self.timeout = ledger_timeout(timeout)
        self.notice = notice or say
        loc = self.location
        self.key_given = key
        self._key = None
        if loc.startswith("sqlite:///"):  # SQLAlchemy's spelling of a file: the file checks apply
            self._db = SQLiteLedger(loc[len("sqlite:///"):], self.timeout, self.notice, key)
        elif is_url(loc):
            self._db = ServerLedger(loc, self.timeout, self.notice, key)
        else:
            self._db = SQLiteLedger(loc, self.timeout, self.notice, key)
        self.exists = self._db.open(create)
        self.created = self._db.created
        if self.exists:
            check_schema(self._db, self.location, self.notice, key)
            with self._db.transaction(write=False) as cur:
                meta = dict(cur.run("SELECT key, value FROM gsd_meta WHERE key IN ('ledger_id', 'key_check')"))
            self.ledger_id, self._check = meta.get("ledger_id"), meta.get("key_check")
            if not (self.ledger_id and self._check):
                raise unusable(self.location, "its gsd_meta table has no key check", "restore it from a backup, or give another --ledger")
        if self.created:
            self.notice(f"created the privacy ledger {self.shown} (private: it will name the runs on private data) and its secret key "
                        f"in {self.key.path.parent} (keep it apart from the ledger and as private as the data)")

    @property
    def shown(self) -> str:
        """The location as messages print it (a URL's password hidden)."""
        return shown(self.location)

    def __repr__(self) -> str:
        return f"BudgetLedger({self.shown!r})"

    def close(self) -> None:
        """Close the server connections this ledger holds (a SQLite ledger holds none between calls)."""
        self._db.close()

    # -- the key -----------------------------------------------------------------------------------

    @property
    def key(self):
        """The ledger's secret key (:mod:`.key`), read when first needed:
        :class:`~.key.LedgerKeyError` (one line, exit 2) when it is missing or another ledger's."""
        self._require()
        if self._key is None:
            from .key import load_key

            self._key = load_key(self.ledger_id, self._check, self.shown, self.key_given)
        return self._key

    def check_key(self) -> None:
        """Stop with one line (exit 2) unless the key of this existing ledger is at hand."""
        if self.exists:
            self.key  # noqa: B018 - loads and checks it

    def stored(self, data: DataIdentity) -> DataIdentity:
        """``data`` as this ledger stores it: its digest, its examples' identities and its old digest
        keyed (HMAC under the ledger's key, :mod:`.key`); the unkeyed ones never reach the ledger."""
        if data.keyed:
            return data
        k = self.key
        legacy = data.legacy
        return DataIdentity(digest=k.keyed(data.digest), name=data.name, how=data.how,
                            examples=tuple(sorted(k.keyed(e) for e in data.examples)), size=data.size,
                            legacy=(lambda: k.keyed(legacy())) if legacy is not None else None, keyed=True)

    def _require(self) -> None:
        if not self.exists:
            raise GSDError(f"there is no ledger at {self.shown} (nothing was booked there); check --ledger")

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
        data = self.stored(data)
        sid = registered(self._db, data)
        stamp = now()
        with self._db.transaction(write=True) as cur:
            old = cur.run("SELECT epsilon, delta, name FROM gsd_datasets WHERE sid = :s", {"s": sid})[0]
            runs = bookings(cur, sid)
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
                    {"e": float(epsilon), "de": float(delta), "t": stamp, "r": int(raising), "s": sid})
            return self._entry(cur, sets(cur, "sid = :s", {"s": sid})[0])

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
        data = self.stored(data)
        bid = booking_id or uuid.uuid4().hex
        row = {"id": bid, "digest": data.digest, "name": data.name, "time": now(), "what": what,
               "command": command if command is not None else _command(), "mechanism": mechanism,
               "epsilon": float(epsilon), "delta": float(delta), "rdp": json.dumps(list(map(float, rdp))) if rdp is not None else None,
               "dp": int(bool(dp)), "guarantee": int(bool(guarantee))}
        sid = registered(self._db, data)
        with self._db.transaction(write=True) as cur:
            found = booking(cur, bid)
            if found is not None:
                if found["digest"] != data.digest:  # an id is one run's: never another data set's booking
                    raise GSDError(f"booking {bid[:12]}... of the ledger belongs to another data set; start a new run with --out")
                return {**found, "charged": [], "again": True}
            new = decoded(row)
            part = booking(cur, absorbs) if absorbs else None
            if part is not None and part["digest"] != data.digest:
                part = None
            charged = []
            budgeted = sets(cur, "epsilon IS NOT NULL AND (sid = :s OR sid IN (SELECT other FROM gsd_overlaps WHERE sid = :s))", {"s": sid})
            for t in budgeted:
                t_sid, t_digest, t_name, eps_b, delta_b = int(t[0]), t[1], t[2], float(t[4]), float(t[5])
                before = bookings(cur, t_sid)
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
                new = decoded(row)
            cur.run("INSERT INTO gsd_bookings (id, digest, name, time, what, command, mechanism, epsilon, delta, rdp, dp, guarantee) "
                    "VALUES (:id, :digest, :name, :time, :what, :command, :mechanism, :epsilon, :delta, :rdp, :dp, :guarantee)", row)
        return {**new, "charged": charged, "again": False}

    # -- reading ---------------------------------------------------------------------------------

    def _entry(self, cur, s: tuple) -> dict:
        sid, d, name, how, eps, delta, created, raised, n = s
        runs = bookings(cur, int(sid))
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
        """Per data set (all, or the one whose stored digest is ``digest``; for a data set itself,
        :meth:`status_of`): its budget, every booking that counts against it (on it, or on a
        set that shares an example with it: ``shared``) and the spent figures of :func:`composed`, with
        ``remaining`` (epsilon_B minus the smaller spent figure that the filter may use) where a budget is set."""
        if not self.exists:
            return []
        with self._db.transaction(write=False) as cur:
            found = sets(cur, "digest = :d" if digest else "1 = 1", {"d": digest})
            return [self._entry(cur, s) for s in found]

    def fits_basic(self, data: DataIdentity, epsilon: float, delta: float) -> bool:
        """Whether a release of (``epsilon``, ``delta``) on ``data`` would be admitted by basic
        composition under every budget it counts against, read only (nothing is booked or added).
        Basic composition is monotone: a later release of at most (epsilon, delta) is then admitted too
        (unless other runs book in between)."""
        if not self.exists:
            return True
        data = self.stored(data)
        legacy = legacy_for(self._db, data)
        probe = {"epsilon": float(epsilon), "delta": float(delta), "rdp": None, "guarantee": True}
        with self._db.transaction(write=False) as cur:
            for t in around(cur, data, legacy):
                if t[4] is not None and not _fits([*bookings(cur, int(t[0])), probe], float(t[4]), float(t[5])):
                    return False
        return True

    def status_of(self, data: DataIdentity) -> list[dict]:
        """:meth:`status` of the data set ``data``, read only (nothing is added): its own entry if the
        ledger has it (by its digest, or by the old digest of an upgraded ledger), else the entries of
        every data set that shares an example with it (``shares_with_asked``: True), else []."""
        if not self.exists:
            return []
        data = self.stored(data)
        legacy = legacy_for(self._db, data)
        with self._db.transaction(write=False) as cur:
            found = around(cur, data, legacy)
            if found and found[0][1] in (data.digest, legacy):
                return [self._entry(cur, found[0])]
            return [{**self._entry(cur, s), "shares_with_asked": True} for s in found]


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
