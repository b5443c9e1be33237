"""A privacy budget per private data set, across every run: the ledger behind ``gsd budget``.

Each DP release of gsd (a DP-GSD ranking and its repeats, a training of any method, so also each run
of ``gsd compare``, a catalogue's DP jobs and ``--auto-select --select-epsilon``) is **booked here
before it releases anything**, under the data set it reads. A data set is named by what it *is*
(:func:`data_identity`: a digest of its examples' content), not by the name or path it was given
under: each example by a digest of its decoded image (:mod:`.identity`), so the same images stored
in another folder or format share one budget. A budget is a promise to the people in the data: a run
counts against every data set with a budget that shares at least one example with the data it reads
(a copy with one image changed, a set grown by one example), and is refused
(:class:`BudgetExceeded`, exit 2) if any of them would go past its budget (``gsd budget set``). A
data set without a budget is booked all the same, and ``gsd budget show`` lists what it spent.

The spent figure of a budgeted set T composes every run on T or on a set that shares an example with
T, as if each had read every person of T: exact for the people in the intersections, the safe side
for the others (two runs on two disjoint halves of T are composed although no one is in both).

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
epsilon^2 / 2): epsilon-DP implies (alpha, epsilon)-RDP for every alpha (Mironov 2017: epsilon-DP
is (infinity, epsilon)-RDP, and D_alpha <= D_infinity) and (epsilon^2/2)-zCDP, i.e. (alpha, alpha
epsilon^2 / 2)-RDP (Bun and Steinke 2016, Prop. 3.3). A release without a proven guarantee (DP-GSD's Gibbs ``matrix``
mechanism) has no curve and no true epsilon: it is booked with its nominal epsilon and marked, and a
data set with a budget refuses it.

``gsd budget show`` reports both spent figures: the basic sums, and the Rényi filter's epsilon
(the summed curves converted at delta_B / (2 |ORDERS|): the figure the filter compares with
epsilon_B), with beside it the summed curves converted at delta_B itself, which is what composing
the same runs *fixed in advance* would give (dp-accounting's RDP accountant).

Storage: SQLite by default (stdlib ``sqlite3``), the file :func:`default_location`; ``--ledger PATH``
or ``$GSD_LEDGER`` choose another file, or a SQLAlchemy URL (``postgresql://user@host/db``; ``pip
install 'gsd-cli[budget-server]'``) for a team's shared server (tables: :mod:`.schema`). Every DP
command checks its ledger before any work (:func:`ready_ledger`; :class:`LedgerError` "ledger PATH
is unusable: why; what to do", exit 2, and a file that is not a ledger is never written). A booking
is one transaction that reads the bookings that count against each budget concerned and adds the
new one under a lock (SQLite ``BEGIN IMMEDIATE``; PostgreSQL ``LOCK TABLE ... EXCLUSIVE``; held by
another process: waited for up to ``--ledger-timeout`` seconds, with a message), so concurrent runs
both land and neither slips past the budget. It is committed before the run releases anything: a
run that dies after booking stays booked (the safe side).

The ledger is itself **private**: it names runs on the private set and their times. Its totals
(``gsd budget show --publishable``) say no more than the runs' own published epsilons. It is no
membership oracle: every example identity and data set digest it stores is keyed (HMAC-SHA256 under a
per-ledger secret key kept in a file apart from it, :mod:`.key`), so a reader without the key cannot
tell whether an image is in a private set; the SQLite file is created 0600.

What a run prints about its booking is split the same way as every other output: ``booked epsilon E
on NAME in LEDGER`` is public (E and NAME are public inputs), while what is left, which budget that
is, and a refusal (:class:`BudgetExceeded`, a ``private:`` line) depend on which budgeted sets the
data shares examples with, so they are private, and so is the exit status of a refused run.
"""

from .compose import ORDERS, SHOWN_DELTA, admits, composed, event_curve, pure_dp_curve, remaining
from .hooks import (audit_booking, book_dpgsd, book_opacus, book_ranking, book_selection, book_size_estimate, book_training, book_training_run,
                    booked_line, booking_id_of_secret, ledger, left_line, publishable, ready_ledger, status_json, unbooked)
from .key import KEY_ENV, LedgerKey, LedgerKeyError, key_path
from .identity import DataIdentity, data_identity, example_digest, example_digests, legacy_digest
from .store import (BUSY_TIMEOUT, ENV, FILE_NAME, MAX_BUDGET_EPSILON, PRIVATE_NOTE, TIMEOUT_ENV, BudgetExceeded, BudgetLedger, LedgerError,
                    default_location, ledger_timeout)

__all__ = [
    "ORDERS", "SHOWN_DELTA", "admits", "composed", "event_curve", "pure_dp_curve", "remaining", "audit_booking", "book_dpgsd", "book_opacus",
    "book_ranking", "book_selection", "book_size_estimate", "book_training", "book_training_run", "booked_line", "booking_id_of_secret", "ledger", "left_line",
    "KEY_ENV", "LedgerKey", "LedgerKeyError", "key_path",
    "publishable", "ready_ledger", "status_json", "unbooked", "DataIdentity", "data_identity", "example_digest", "example_digests",
    "legacy_digest", "BUSY_TIMEOUT", "ENV", "FILE_NAME", "MAX_BUDGET_EPSILON", "PRIVATE_NOTE", "TIMEOUT_ENV", "BudgetExceeded",
    "BudgetLedger", "LedgerError", "default_location", "ledger_timeout",
]
