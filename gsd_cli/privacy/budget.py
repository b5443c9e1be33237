"""A privacy budget per private data set, across every run: the ledger behind ``gsd budget``.

Each DP release of gsd (a DP-GSD ranking and its repeats, a training of any method, so also each run
of ``gsd compare``, a catalogue's DP jobs and ``--auto-select --select-epsilon``) is **booked here
before it releases anything**, under the data set it reads. A data set is named by what it *is*
(:func:`data_identity`: a digest of its examples' content), not by the name or path it was given
under, so the same images copied to another folder or file share one budget. A run that would take
the data set past its budget (``gsd budget set``) is refused (:class:`BudgetExceeded`, exit 2); a
data set without a budget is booked all the same, and ``gsd budget show`` lists what it spent.

Composition under adaptivity (each run chosen after seeing the earlier ones, as people work)
------------------------------------------------------------------------------------------------
The ledger is a *privacy filter*: before each run it checks that the runs booked so far plus the new
one still fit the budget (epsilon_B, delta_B), and refuses it otherwise. Two filters run side by side,
and a run is admitted when **either** admits it:

* **basic**: epsilons add and deltas add. Basic composition is a valid filter: Rogers, Roth, Ullman,
  Vadhan, "Privacy Odometers and Filters: Pay-as-you-Go Composition" (NeurIPS 2016), Theorem 5.1
  (adaptively chosen (eps_i, delta_i), stopped while sum eps_i <= eps_B and sum delta_i <= delta_B,
  is (eps_B, delta_B)-DP). Here it gets delta_B / 2.
* **Rényi**: each run's RDP curve rho_i(alpha) at the orders :data:`ORDERS` (dp-accounting's RDP
  accountant, the one the trainers use); the curves add. For one fixed order alpha, a Rényi filter
  (stop while sum_i rho_i(alpha) <= B_alpha) is (alpha, B_alpha)-RDP for adaptively chosen
  mechanisms and parameters: Feldman and Zrnic, "Individual Privacy Accounting via a Rényi Filter"
  (NeurIPS 2021), Theorem 3.1; Lécuyer, "Practical Privacy Filters and Odometers with Rényi
  Differential Privacy" (2021). The ledger admits a run when *some* order still fits: that is a
  union of |ORDERS| one-order filters, so the other half of delta_B is split over the orders
  (delta_B / (2 |ORDERS|) each) and each order's budget is converted with dp-accounting's RDP -> DP
  conversion (Canonne, Kamath, Steinke 2020, Prop. 12, as ``compute_epsilon``).

Why the union is valid (the same argument joins the two filters): a released transcript is one for
which at least one sub-filter j (basic, or one order) still held at the end; on the transcripts where
j held, the ledger ran exactly the runs sub-filter j alone would have run, with the same
probabilities under both neighbouring data sets. So the ledger's hockey-stick divergence at
epsilon_B is at most the sum over j of sub-filter j's, each at most its share of delta_B.

Pure epsilon-DP releases (DP-GSD) enter the Rényi filter as rho(alpha) = min(epsilon, alpha
epsilon^2 / 2): epsilon-DP implies (alpha, epsilon)-RDP for every alpha (Mironov 2017, Prop. 10:
D_alpha <= D_infinity) and (epsilon^2/2)-zCDP, i.e. (alpha, alpha epsilon^2 / 2)-RDP (Bun and
Steinke 2016, Prop. 3.3). A release without a proven guarantee (DP-GSD's Gibbs ``matrix``
mechanism) has no curve and no true epsilon: it is booked with its nominal epsilon and marked, and a
data set with a budget refuses it.

``gsd budget show`` reports both spent figures: the basic sums, and the Rényi filter's epsilon
(the summed curves converted at delta_B / (2 |ORDERS|): the figure the filter compares with
epsilon_B), with beside it the summed curves converted at delta_B itself, which is what composing
the same runs *fixed in advance* would give (dp-accounting's RDP accountant).

Storage: SQLite by default (stdlib ``sqlite3``), the file :func:`default_location`; ``--ledger PATH``
or ``$GSD_LEDGER`` choose another file, or a SQLAlchemy URL (``postgresql://user@host/db``; ``pip
install 'gsd-cli[budget-server]'``) for a team's shared server. A booking is one transaction that
reads the data set's bookings and adds the new one under a lock (SQLite ``BEGIN IMMEDIATE`` with a
busy timeout; PostgreSQL ``LOCK TABLE ... EXCLUSIVE``), so concurrent runs both land and neither
slips past the budget. It is committed before the run releases anything: a run that dies after
booking stays booked (the safe side).

The ledger is itself **private**: it names runs on the private set and their times. Its totals
(``gsd budget show --publishable``) say no more than the runs' own published epsilons.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import shlex
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import GSDError

#: ``$GSD_LEDGER``: the ledger's file or SQLAlchemy URL.
ENV = "GSD_LEDGER"
#: File name of the default ledger in the user's data folder.
FILE_NAME = "privacy-ledger.sqlite"
#: Seconds a booking waits for another process's transaction (SQLite busy timeout).
BUSY_TIMEOUT = 60.0
#: delta at which a data set without a budget has its Rényi figure shown, when no run declared one.
SHOWN_DELTA = 1e-5
#: Schema version, in the ``gsd_meta`` table.
SCHEMA = 1
PRIVATE_NOTE = ("PRIVATE: the ledger names runs on the private data sets, with their times and commands; "
                "publish only `gsd budget show --publishable`")


def _orders() -> tuple[float, ...]:
    from .accountant import RDP_ORDERS

    return tuple(float(a) for a in RDP_ORDERS)


#: RDP orders at which every booking's curve is kept (the trainers' accountant's grid).
ORDERS: tuple[float, ...] = _orders()


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


# --- what a data set is ------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataIdentity:
    """A private data set as the ledger knows it: ``digest`` (what it is), ``name`` (as first given)."""

    digest: str
    name: str
    how: str


def data_identity(source) -> DataIdentity:
    """The identity of the data set behind ``source`` (an :class:`gsd_cli.data.ImageSource` or a spec;
    a :class:`DataIdentity` is returned as it is).

    The *whole* data set under any ``:train`` / ``:test`` part, subset or class list (a training on
    ``NAME:train`` and a DP ranking of ``NAME`` charge one budget: the safe side), identified by the
    content of its examples, as the overlap check hashes them (:mod:`gsd_cli.data.identity`): the
    content hash of every example of an in-memory set, the SHA-256 of each file's bytes for a
    file-backed one (all of them up to :data:`gsd_cli.data.identity.CONTENT_SAMPLE` files, else that
    many drawn with a fixed public seed), else the decoded images. The hashes are sorted before they
    are combined, so the order of the examples does not matter. Labels are not part of it."""
    from .. import data as gdata
    from ..data.base import ArraySource
    from ..data.identity import _checked, _hashes, _leaf

    if isinstance(source, DataIdentity):
        return source
    if isinstance(source, str):
        source = gdata.resolve(source)
    leaf, _ = _leaf(source)
    if isinstance(leaf, ArraySource):
        keys, how = leaf.example_keys(), "arrays"
    else:
        idx = _checked(leaf, None)
        files = len(leaf) > 0 and leaf.example_file(0) is not None
        keys, how = _hashes(leaf, idx, files), ("files" if files else "decoded")
        if len(idx) < len(leaf):
            how += f"-sample{len(idx)}"
    h = hashlib.sha256(f"gsd-data-identity-1:{how}:{len(keys)}\n".encode())
    for k in sorted(keys):
        h.update(k.encode() + b"\n")
    return DataIdentity(digest=h.hexdigest(), name=leaf.name, how=how)


# --- what a release costs ----------------------------------------------------------------------------

def event_curve(event) -> list[float]:
    """The RDP curve of a dp-accounting event at :data:`ORDERS` (dp-accounting's ``RdpAccountant``)."""
    import dp_accounting as dpa

    acc = dpa.rdp.RdpAccountant(orders=list(ORDERS))
    acc.compose(event)
    return [float(r) for r in acc.rdp]


def pure_dp_curve(epsilon: float, releases: int = 1) -> list[float]:
    """RDP curve of ``releases`` epsilon-DP releases: releases * min(epsilon, alpha epsilon^2 / 2)
    (Mironov 2017, Prop. 10; Bun and Steinke 2016, Prop. 3.3; RDP composes additively, Mironov 2017 Prop. 1)."""
    e = float(epsilon)
    return [int(releases) * min(e, a * e * e / 2) for a in ORDERS]


def _eps(curve: Sequence[float], delta: float) -> float:
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if delta <= 0:
        return math.inf
    return float(compute_epsilon(list(ORDERS), list(curve), delta)[0])


def composed(bookings: Iterable[dict], delta_budget: float | None) -> dict:
    """The spent figures of ``bookings`` (dicts with ``epsilon``, ``delta``, ``rdp`` (a list or None),
    ``guarantee``): basic sums; the Rényi filter's epsilon at ``delta_budget / (2 |ORDERS|)``; the
    same curves at ``delta_budget`` (composition fixed in advance). See the module docstring."""
    bookings = list(bookings)
    basic_eps = math.fsum(b["epsilon"] for b in bookings)
    basic_delta = math.fsum(b["delta"] for b in bookings)
    curves = [b.get("rdp") for b in bookings]
    have_curves = all(c is not None for c in curves)
    shown_delta = delta_budget if delta_budget else (max([b["delta"] for b in bookings if b["delta"] > 0] or [SHOWN_DELTA]))
    total = [math.fsum(c[i] for c in curves) for i in range(len(ORDERS))] if have_curves else None
    renyi_filter = renyi_fixed = None
    if total is not None:
        renyi_filter = _eps(total, shown_delta / (2 * len(ORDERS)))
        renyi_fixed = _eps(total, shown_delta)
    return {
        "runs": len(bookings),
        "basic_epsilon": basic_eps, "basic_delta": basic_delta,
        "renyi_epsilon": renyi_filter, "renyi_epsilon_fixed": renyi_fixed, "delta": shown_delta,
        "guarantee": all(b.get("guarantee", True) for b in bookings),
        "rdp": total,
    }


def admits(bookings: Sequence[dict], new: dict, epsilon_budget: float, delta_budget: float) -> tuple[bool, dict]:
    """Whether the filter admits ``new`` after ``bookings`` under the budget, and the figures after it:
    basic (sum eps <= eps_B and sum delta <= delta_B / 2) or Rényi (the summed curves at
    delta_B / (2 |ORDERS|) give at most eps_B); a release without a proven guarantee is never admitted."""
    after = composed([*bookings, new], delta_budget)
    if not after["guarantee"]:
        return False, after
    tol = 1e-12 * max(1.0, epsilon_budget)
    basic = after["basic_epsilon"] <= epsilon_budget + tol and after["basic_delta"] <= delta_budget / 2 * (1 + 1e-12)
    renyi = after["renyi_epsilon"] is not None and after["renyi_epsilon"] <= epsilon_budget + tol
    after["admitted_by"] = "basic" if basic else ("renyi" if renyi else None)
    return basic or renyi, after


# --- storage -----------------------------------------------------------------------------------------

_TABLES = (
    "CREATE TABLE IF NOT EXISTS gsd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS gsd_datasets (digest TEXT PRIMARY KEY, name TEXT NOT NULL, how TEXT NOT NULL, "
    "epsilon DOUBLE PRECISION, delta DOUBLE PRECISION, created TEXT NOT NULL, updated TEXT NOT NULL)",
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


class _Cursor:
    def __init__(self, run):
        self.run = lambda sql, params=None: run(sql, params or {})


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _command() -> str:
    """The ``gsd`` command running in this process (as :func:`gsd_cli.cli.main` got it), else the script."""
    cli = sys.modules.get("gsd_cli.cli.app")
    given = getattr(cli, "invoked", {}).get("argv") if cli is not None else None
    argv = ["gsd", *given] if given is not None else (list(sys.argv) or ["python"])
    return shlex.join(argv)[:1000]


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
        if tuple(json.loads(stored)) != ORDERS:
            raise GSDError(f"the ledger {self.location} keeps RDP curves at other orders than this gsd; "
                           "use the gsd version that created it, or a new --ledger")

    def __repr__(self) -> str:
        return f"BudgetLedger({self.location!r})"

    # -- budgets ---------------------------------------------------------------------------------

    def set_budget(self, data: DataIdentity, epsilon: float, delta: float) -> dict:
        """Give the data set ``data`` the budget (epsilon, delta) (replacing an earlier one; the runs
        booked stay booked). Returns :meth:`status` of the data set."""
        from .accountant import check_delta, check_epsilon

        check_epsilon(epsilon)
        check_delta(delta)
        now = _now()
        with self._db.transaction(write=True) as cur:
            cur.run("INSERT INTO gsd_datasets (digest, name, how, epsilon, delta, created, updated) "
                    "VALUES (:d, :n, :h, :e, :de, :t, :t) ON CONFLICT (digest) DO UPDATE SET epsilon = :e, delta = :de, updated = :t",
                    {"d": data.digest, "n": data.name, "h": data.how, "e": float(epsilon), "de": float(delta), "t": now})
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
            if cur.run("SELECT id FROM gsd_bookings WHERE id = :i", {"i": bid}):
                return self._bookings(cur, data.digest, bid)[0]
            cur.run("INSERT INTO gsd_datasets (digest, name, how, epsilon, delta, created, updated) "
                    "VALUES (:d, :n, :h, NULL, NULL, :t, :t) ON CONFLICT (digest) DO NOTHING",
                    {"d": data.digest, "n": data.name, "h": data.how, "t": row["time"]})
            budget = cur.run("SELECT epsilon, delta FROM gsd_datasets WHERE digest = :d", {"d": data.digest})[0]
            if budget[0] is not None:
                before = self._bookings(cur, data.digest)
                ok, after = admits(before, _decoded(row), float(budget[0]), float(budget[1]))
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
            sets = cur.run("SELECT digest, name, how, epsilon, delta, created FROM gsd_datasets"
                           + (" WHERE digest = :d" if digest else "") + " ORDER BY created, digest", {"d": digest})
            out = []
            for d, name, how, eps, delta, created in sets:
                runs = self._bookings(cur, d)
                spent = composed(runs, delta)
                budget = None if eps is None else {"epsilon": float(eps), "delta": float(delta)}
                entry = {"digest": d, "name": name, "identified_by": how, "budget": budget, "spent": spent, "runs": runs}
                if budget is not None:
                    entry["remaining"] = _remaining(spent, budget)
                out.append(entry)
        return out


def _decoded(row: dict) -> dict:
    r = dict(row)
    if isinstance(r.get("rdp"), str):
        r["rdp"] = json.loads(r["rdp"])
    r["dp"], r["guarantee"] = bool(r["dp"]), bool(r["guarantee"])
    r["epsilon"], r["delta"] = float(r["epsilon"]), float(r["delta"])
    return r


def _remaining(spent: dict, budget: dict) -> dict:
    """What is left, by each filter: epsilon_B minus its spent figure (basic: and delta_B/2 minus the
    summed deltas)."""
    basic_ok = spent["basic_delta"] <= budget["delta"] / 2
    basic = budget["epsilon"] - spent["basic_epsilon"] if basic_ok else 0.0
    renyi = budget["epsilon"] - spent["renyi_epsilon"] if spent["renyi_epsilon"] is not None else 0.0
    if not spent["guarantee"]:
        basic = renyi = 0.0
    return {"basic_epsilon": max(0.0, basic), "basic_delta": max(0.0, budget["delta"] / 2 - spent["basic_delta"]),
            "renyi_epsilon": max(0.0, renyi), "epsilon": max(0.0, basic, renyi)}


def _refusal(data: DataIdentity, before: list[dict], row: dict, eps_b: float, delta_b: float) -> str:
    if not row["guarantee"]:
        return (f"{data.name}: {row['what']} ({row['mechanism']}) has no proven DP guarantee, so the data set's budget "
                f"(epsilon {eps_b:g}, delta {delta_b:g}) cannot admit it; use a mechanism with a proof (DP-GSD: --mechanism sequential)")
    spent = composed(before, delta_b)
    left = _remaining(spent, {"epsilon": eps_b, "delta": delta_b})
    return (f"{data.name}: privacy budget exceeded: this run ({row['what']}, epsilon {row['epsilon']:.4g}) would pass the data set's "
            f"budget epsilon {eps_b:g}, delta {delta_b:g}: {len(before)} run(s) spent epsilon {spent['basic_epsilon']:.4g} (basic) / "
            f"{_fmt(spent['renyi_epsilon'])} (Rényi filter), about {left['epsilon']:.4g} left; ask for a smaller --epsilon, "
            "or stop here (gsd budget show --private ... lists the runs)")


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4g}"


# --- booking hooks (called by the releases themselves) ---------------------------------------------------

def ledger(location: str | os.PathLike | None = None) -> BudgetLedger:
    """The ledger at ``location`` (default :func:`default_location`)."""
    return BudgetLedger(location)


def book_dpgsd(private, epsilon: float, *, releases: int = 1, mechanism: str = "sequential", dp: bool = True,
               what: str = "DP-GSD ranking", ledger_location=None) -> dict:
    """Book ``releases`` epsilon-DP DP-GSD draws of ``private`` (a source or spec) before they happen:
    basic (releases x epsilon, delta 0) and the Rényi curve :func:`pure_dp_curve`. The ``matrix``
    (Gibbs) mechanism has no proven guarantee: booked at its nominal epsilon, marked, with no curve
    (a data set with a budget refuses it)."""
    exact = mechanism != "matrix"
    return BudgetLedger(ledger_location).book(
        data_identity(private), what=what, mechanism=f"DP-GSD {mechanism}, {releases} release(s) x epsilon {float(epsilon):g}",
        epsilon=float(epsilon) * int(releases), delta=0.0, rdp=pure_dp_curve(epsilon, releases) if exact else None,
        dp=dp, guarantee=exact)


def book_training(private, event, *, epsilon: float, delta: float, method: str, mechanism: str, dp: bool = True,
                  booking_id: str | None = None, pure_epsilon: float = 0.0, ledger_location=None) -> dict:
    """Book a private training on ``private`` (its training part; the whole data set is charged) before
    its first step: ``event`` is its dp-accounting event (all its steps), ``epsilon`` what the run is
    accounted at ``delta`` in all. ``pure_epsilon``: a pure-DP release of the same run composed with
    the training (a DP estimate of the set's size), added to the curve as :func:`pure_dp_curve`.
    ``booking_id``: the same id for a resumed run (booked once)."""
    curve = event_curve(event)
    if pure_epsilon:
        curve = [a + b for a, b in zip(curve, pure_dp_curve(pure_epsilon))]
    return BudgetLedger(ledger_location).book(
        data_identity(private), what=f"training ({method})", mechanism=mechanism, epsilon=epsilon, delta=delta,
        rdp=curve, dp=dp, booking_id=booking_id)


def book_training_run(config, private, event, epsilon: float, mechanism: str, secret, out=None, resume: bool = False,
                      pure_epsilon: float = 0.0) -> dict:
    """``gsd train``'s hook (:func:`gsd_cli.train.train`, process 0, after the noise is calibrated and
    before the first step): :func:`book_training` under an id derived from the run's secret seed, so a
    resumed run is booked once. A run with ``--insecure-seed`` is not DP but is booked all the same
    (the safe side: its outputs still depend on the private data). Refused: the new run's folder,
    still empty, is removed."""
    try:
        return book_training(private, event, epsilon=epsilon, delta=config.delta, method=config.method, mechanism=mechanism,
                             dp=config.private_seed is None, booking_id=booking_id_of_secret(secret), pure_epsilon=pure_epsilon)
    except BudgetExceeded:
        if out is not None and not resume:
            try:
                Path(out).rmdir()  # only when empty
            except OSError:
                pass
        raise


def book_opacus(private, noise_multiplier: float, sample_rate: float, steps: int, delta: float, *, method: str = "gep",
                residual: bool = True, accountant: str = "rdp", dp: bool = True, ledger_location=None) -> dict:
    """Opt-in hook for a training script that uses gsd's Opacus adapter (:mod:`gsd_cli.opacus`) or Opacus
    itself: book its planned run (``steps`` Poisson-subsampled steps at rate ``sample_rate`` and
    multiplier ``noise_multiplier``; ``method`` ``"gep"`` as :func:`gsd_cli.opacus.gep_event`, or
    ``"dpsgd"``) on ``private`` **before** training, so that a run past the budget is refused
    (:class:`BudgetExceeded`) before any step."""
    from .accountant import dpsgd_step_event, epsilon_of, gep_step_event, training_event

    if method == "gep":
        step = gep_step_event(noise_multiplier, noise_multiplier if residual else None)
    elif method == "dpsgd":
        step = dpsgd_step_event(noise_multiplier)
    else:
        raise GSDError(f"book_opacus: method must be 'gep' or 'dpsgd' (got {method!r})")
    event = training_event(step, sample_rate, steps)
    eps = epsilon_of(event, delta, accountant)
    return book_training(private, event, epsilon=eps, delta=delta, method=f"opacus {method}",
                         mechanism=f"Opacus {method}: {steps} Poisson-subsampled steps, q={sample_rate:g}, sigma={noise_multiplier:g}",
                         dp=dp, ledger_location=ledger_location)


def booking_id_of_secret(secret: int | str, what: str = "train") -> str:
    """A booking id derived one-way from a run's secret seed (SHA-256): the same run (resumed) gets the
    same id, and the id says nothing about the seed."""
    return hashlib.sha256(f"gsd-booking:{what}:{secret}".encode()).hexdigest()[:32]


def book_ranking(private, privacy, repeats: int = 1, *, ledger_location=None) -> dict:
    """Book a DP-GSD ranking of ``private`` before its private draw: ``privacy`` is the ranking's
    :class:`gsd_cli.ranking.config.PrivacySettings`; with ``repeats`` R > 1, ``shared`` repeats draw
    once (one release) and ``fresh`` ones R times (R releases). Drawn with ``insecure_seed``: booked,
    marked not DP."""
    releases = int(repeats) if (repeats > 1 and privacy.dp_repeats == "fresh") else 1
    return book_dpgsd(private, float(privacy.epsilon), releases=releases, mechanism=privacy.mechanism,
                      dp=privacy.insecure_seed is None, ledger_location=ledger_location)


# --- reports ------------------------------------------------------------------------------------------

def publishable(status: list[dict]) -> list[dict]:
    """Only the totals of :meth:`BudgetLedger.status` (no runs, commands, times or curves)."""
    out = []
    for s in status:
        sp = s["spent"]
        out.append({"name": s["name"], "budget": s["budget"], "runs": sp["runs"],
                    "spent": {k: sp[k] for k in ("basic_epsilon", "basic_delta", "renyi_epsilon", "renyi_epsilon_fixed", "delta", "guarantee")},
                    **({"remaining": s["remaining"]} if "remaining" in s else {})})
    return out


def status_json(status: list[dict], *, publishable_only: bool = False, location: str = "") -> dict:
    """The JSON of ``gsd budget show``: the data sets, how spending composes, whether it is private."""
    sets = publishable(status) if publishable_only else [{**s, "spent": {k: v for k, v in s["spent"].items() if k != "rdp"},
                                                         "runs": [{k: v for k, v in r.items() if k != "rdp"} for r in s["runs"]]}
                                                        for s in status]
    return {
        "publishable": publishable_only,
        **({} if publishable_only else {"note": PRIVATE_NOTE, "ledger": location}),
        "composition": ("privacy filter: a run is admitted when basic composition (Rogers et al. 2016, Thm 5.1; "
                        "delta_B/2) or the Rényi filter (Feldman and Zrnic 2021, Thm 3.1, over the RDP orders with "
                        "delta_B/(2 x orders)) keeps the data set within its budget"),
        "orders": len(ORDERS),
        "datasets": sets,
    }
