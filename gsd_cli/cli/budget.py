"""``gsd budget``: the privacy budget of each private data set, across every run
(:mod:`gsd_cli.privacy.budget`)."""

from __future__ import annotations

import json
import math
from typing import Optional

import typer
from rich.markup import escape

from .app import app
from .common import err, out, print_private

budget_app = typer.Typer(
    help="The privacy budget of each private data set, across every DP run (a privacy filter). The ledger is private.",
    no_args_is_help=True,
)
app.add_typer(budget_app, name="budget")

LEDGER_HELP = ("The ledger: a SQLite file or a SQLAlchemy URL (postgresql://...) (default $GSD_LEDGER, else "
               "$XDG_DATA_HOME/gsd/privacy-ledger.sqlite). gsd rank/train/compare book into $GSD_LEDGER or "
               "`gsd --ledger PATH COMMAND`.")
KEY_HELP = ("The ledger's secret key file, which its stored identities need (default $GSD_LEDGER_KEY, else "
            "~/.config/gsd/ledger-keys/<ledger id>.key, made with the ledger).")
TIMEOUT_HELP = ("Seconds to wait for a ledger that another process holds, then stop with one line "
                "(default $GSD_LEDGER_TIMEOUT, else 30).")


def _ledger(location: Optional[str], timeout: Optional[float], create: bool = True, key: Optional[str] = None):
    from ..privacy.budget import BudgetLedger

    return BudgetLedger(location, create=create, timeout=timeout, key=key)


@budget_app.command("set")
def set_budget(
    private: str = typer.Option(..., "--private", help="The private data set (any name, path or catalogue entry that reads it: it is identified by its examples' content)."),
    epsilon: float = typer.Option(..., "--epsilon", help="Total epsilon every DP run on this data set may spend together (at most 100)."),
    delta: float = typer.Option(..., "--delta", help="Total delta (half for basic composition, half over the Rényi orders)."),
    raise_: bool = typer.Option(False, "--raise", help="Raise a budget that runs were booked under (recorded: the filter's guarantee is for a budget fixed in advance)."),
    force: bool = typer.Option(False, "--force", help="Set a budget below what the booked runs already spent (every run on the data is then refused)."),
    ledger: Optional[str] = typer.Option(None, "--ledger", help=LEDGER_HELP),
    ledger_key: Optional[str] = typer.Option(None, "--ledger-key", help=KEY_HELP),
    ledger_timeout: Optional[float] = typer.Option(None, "--ledger-timeout", help=TIMEOUT_HELP),
) -> None:
    """Give a private data set a privacy budget: from now on a DP run that would take it past
    (epsilon, delta) is refused before it starts, and so is a run on any data that shares an
    example with it. The runs booked so far stay booked and count. Set it before the first run: a
    filter's guarantee is for a budget fixed in advance, so raising one after runs needs --raise and
    is recorded; a budget below what is already spent needs --force."""
    from ..privacy.budget import data_identity
    from ..privacy.budget.store import check_budget

    check_budget(epsilon, delta)  # before a new ledger is made
    led = _ledger(ledger, ledger_timeout, key=ledger_key)  # checked (and made, if new) before the data is read
    led.check_key()
    s = led.set_budget(data_identity(private), epsilon, delta, allow_raise=raise_, force=force)
    left = s["remaining"]
    out.print(f"{escape(s['name'])}: budget epsilon {epsilon:g}, delta {delta:g}")
    print_private(out, f"{s['spent']['runs']} run(s) booked on it or on data sharing its examples, about {left['epsilon']:.4g} epsilon left")
    if s.get("overspent"):
        err.print("[yellow]warning:[/] the runs booked already spent more than this budget: every DP run on this data is refused from now on")
    err.print(f"ledger {escape(led.shown)} (private: it names runs on the private data)")


@budget_app.command("show")
def show(
    private: Optional[str] = typer.Option(None, "--private", help="Only this data set (default: every data set in the ledger)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    publishable: bool = typer.Option(False, "--publishable", help="Totals only: no runs, commands or times."),
    ledger: Optional[str] = typer.Option(None, "--ledger", help=LEDGER_HELP),
    ledger_key: Optional[str] = typer.Option(None, "--ledger-key", help=KEY_HELP),
    ledger_timeout: Optional[float] = typer.Option(None, "--ledger-timeout", help=TIMEOUT_HELP),
) -> None:
    """What each private data set has spent and has left, with every run booked on it or on data
    that shares examples with it (command, time, mechanism, epsilon). Spent is shown two ways: basic
    composition (epsilons and deltas add) and the Rényi filter (RDP curves add; converted at the
    filter's delta, and at the budget's delta as if the runs were fixed in advance). The ledger is
    private; --publishable prints the totals only. --private needs the ledger's secret key (the ledger
    stores keyed identities only). Never creates a ledger."""
    from ..privacy.budget import data_identity, status_json

    led = _ledger(ledger, ledger_timeout, create=False, key=ledger_key)
    if not led.exists:
        if as_json:
            typer.echo(json.dumps({"publishable": publishable, "ledger": led.shown, "exists": False, "datasets": []}, indent=2))
        else:
            out.print(f"no ledger at {escape(led.shown)}: nothing was booked there (a DP run creates it; is the path right?)")
        return
    status = led.status_of(data_identity(private)) if private is not None else led.status()
    doc = status_json(status, publishable_only=publishable, location=led.shown)
    if as_json:  # plain text: a console would wrap long strings
        typer.echo(json.dumps(_finite(doc), indent=2))
        return
    _tables(doc, publishable)
    if not doc["datasets"]:
        out.print("no runs booked" + (" on this data set or on data sharing its examples" if private is not None else "")
                  + f" in {escape(led.shown)}")
    elif private is not None and status and status[0].get("shares_with_asked"):
        err.print("this data set is not in the ledger itself; the entries above share examples with it, and their budgets apply to it")
    if not publishable:
        err.print("[yellow]private:[/] this ledger names runs on private data; publish only --publishable")


def _finite(x):
    """Strict JSON: an infinite figure (no bound) becomes null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def _f(x, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def dp_cell(run: dict) -> str:
    """A booked run's "DP" column: yes, "no proof" (a mechanism without a proven guarantee), "no (selection)" (its public
    data chosen by a non-private ranking of the private data) or "no (seeded)" (``--insecure-seed``)."""
    from ..privacy.budget.hooks import NON_PRIVATE_SELECTION

    if not run["guarantee"]:
        return "no proof"
    if run["dp"]:
        return "yes"
    return "no (selection)" if NON_PRIVATE_SELECTION in run["what"] else "no (seeded)"


def _runs(s: dict) -> None:
    """The runs booked on one data set, numbered, then each one's command on a line of its own (in the table's last
    column a command was wrapped a word a line)."""
    from rich.table import Table

    table = Table(title=f"runs on {escape(s['name'])} (data {s['digest'][:12]})", title_justify="left")
    for c in ("#", "time (UTC)", "what", "epsilon", "delta", "DP", "data"):
        table.add_column(c, overflow="fold", no_wrap=c not in ("what", "data"))
    for i, r in enumerate(s["runs"], 1):
        when = r["time"].replace("T", " ").split("+")[0].split(".")[0]
        table.add_row(str(i), when, escape(r["what"]), _f(r["epsilon"]), _f(r["delta"], ".3g"), dp_cell(r),
                      escape(r["name"]) + (" (shares examples)" if r.get("shared") else ""))
    table.caption = "mechanisms: gsd budget show --json"
    out.print(table)
    out.print("commands:", highlight=False)
    for i, r in enumerate(s["runs"], 1):
        out.print(f"  {i}. {escape(r['command'])}", highlight=False, soft_wrap=True)


def _tables(doc: dict, publishable: bool) -> None:
    from rich.table import Table

    for s in doc["datasets"]:
        sp, b = s["spent"], s["budget"]
        runs = sp["runs"] if isinstance(sp.get("runs"), int) else len(s.get("runs") or [])
        head = (f"{escape(s['name'])}: budget " + (f"epsilon {b['epsilon']:g}, delta {b['delta']:g}" if b else "none set")
                + f"; {runs} run(s)")
        t = Table(title=head, title_justify="left")
        for c in ("composition", "epsilon spent", "delta", "left"):
            t.add_column(c)
        rem = s.get("remaining")
        t.add_row("basic (adaptive filter)", _f(sp["basic_epsilon"]), _f(sp["basic_delta"], ".3g"),
                  _f(rem["basic_epsilon"]) if rem else "-")
        t.add_row(f"Rényi filter (delta {sp['delta']:g})", _f(sp["renyi_epsilon"]), "", _f(rem["renyi_epsilon"]) if rem else "-")
        t.add_row("Rényi, runs fixed in advance", _f(sp["renyi_epsilon_fixed"]), _f(sp["delta"], ".3g"), "")
        if not sp["guarantee"]:
            t.caption = "a booked run has no proven DP guarantee: the totals are not a guarantee"
        elif b and b.get("raised"):
            t.caption = "the budget was raised after runs were booked: the figures are true, the filter's guarantee is void"
        elif s.get("overspent"):
            t.caption = "the runs booked spent more than this budget (set with --force): every run on it is refused"
        out.print(t)
        if publishable:
            continue
        _runs(s)
        count = f"{s['examples']} distinct examples" if s.get("examples") is not None else f"identified by {s['identified_by']}"
        shares = f"; shares examples with {escape(', '.join(s['shares_examples_with']))}" if s.get("shares_examples_with") else ""
        print_private(out, f"{escape(s['name'])}: {count}{shares}")
