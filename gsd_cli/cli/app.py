"""The Typer app every command registers on, and the console-script entry ``main``."""

from __future__ import annotations

import inspect
import os
import sys
import traceback

import typer

from .. import __version__
from ..allocator import keep_freed_memory
from ..errors import GSDError, PrivateError
from .common import err, out, print_error, shown_data_warnings
from .pipes import closed_pipe, is_devnull, stdout_unflushable

app = typer.Typer(
    help="Choose public data for differentially private training by Gradient Subspace Distance (GSD).",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
)

# Typer >= 0.26 vendors click (typer._click), older Typer uses click itself: find the base class of
# usage errors from an exception Typer exports in both.
_ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _version(value: bool) -> None:
    if value:
        out.print(f"gsd {__version__}")
        raise typer.Exit()


_debug = {"on": False}


def debugging() -> bool:
    """``gsd --debug`` or ``GSD_DEBUG=1``: unexpected errors print their traceback."""
    return _debug["on"] or os.environ.get("GSD_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


@app.callback()
def main_callback(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Print the traceback of an unexpected error (also GSD_DEBUG=1)."),
    ledger: str = typer.Option(None, "--ledger", help="Privacy ledger every DP run books into (SQLite file or SQLAlchemy URL; default $GSD_LEDGER, else the user's data folder): see gsd budget."),
    ledger_key: str = typer.Option(None, "--ledger-key", help="The ledger's secret key file (default $GSD_LEDGER_KEY, else ~/.config/gsd/ledger-keys/<ledger id>.key): see gsd budget."),
    ledger_timeout: float = typer.Option(None, "--ledger-timeout", help="Seconds a DP run waits for a ledger that another process holds, then stops with one line (default $GSD_LEDGER_TIMEOUT, else 30)."),
) -> None:
    """Choose public data for differentially private training by Gradient Subspace Distance."""
    _debug["on"] = debug
    if ledger is not None:  # gsd_cli.privacy.budget reads it: every booking of this command goes there
        os.environ["GSD_LEDGER"] = ledger
    if ledger_key is not None:  # gsd_cli.privacy.budget.key reads it
        os.environ["GSD_LEDGER_KEY"] = ledger_key
    if ledger_timeout is not None:  # checked where the ledger is opened (gsd_cli.privacy.budget.ledger_timeout)
        os.environ["GSD_LEDGER_TIMEOUT"] = repr(float(ledger_timeout))


def reflow_help(*apps: typer.Typer) -> None:
    """Join the lines of each docstring paragraph: rich keeps a docstring's line breaks, so help text
    wrapped at 100 columns in the source would come out ragged on a narrower terminal."""
    from rich.markup import escape

    for a in apps:
        infos = [*a.registered_commands, *([a.registered_callback] if a.registered_callback else [])]
        for info in infos:
            fn = info.callback
            if fn is not None and fn.__doc__:
                fn.__doc__ = escape("\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(fn.__doc__).split("\n\n")))
            # rich reads "[timm]" in pip install 'gsd-cli[timm]' as markup and drops it: escape every help text
            for param in (inspect.signature(fn).parameters.values() if fn is not None else ()):
                help_text = getattr(param.default, "help", None)
                if isinstance(help_text, str) and "[" in help_text and not getattr(param.default, "_gsd_escaped", False):
                    param.default.help = escape(help_text)
                    param.default._gsd_escaped = True


EXIT_INTERNAL = 3


def _check_encoding(argv: list[str]) -> None:
    """An argument with bytes that are not UTF-8 (a file name from another system) cannot be shown,
    hashed or written to JSON: refuse it by name before any work."""
    for a in argv:
        try:
            str(a).encode("utf-8")
        except UnicodeEncodeError:
            shown = str(a).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            raise GSDError(f"{shown}: the name has bytes that are not UTF-8; rename the file or folder "
                           "(e.g. convmv -f latin1 -t utf8) or link it under a UTF-8 name") from None
_HINT = "(run with --debug or GSD_DEBUG=1 for the traceback)"
#: the arguments of the command running in this process (``main``), for gsd_cli.privacy.budget
invoked: dict = {"argv": None}


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: user errors print one line and exit 2, never a traceback; an operating
    system error (disk full, read-only folder) is a user error too; anything else is a bug: one line
    ``error: internal error: ...`` and exit 3 (the traceback with ``--debug`` or ``GSD_DEBUG=1``)."""
    invoked["argv"] = list(sys.argv[1:] if argv is None else argv)  # the command, as the privacy ledger records it
    if argv is None:  # this process's own command line (the console script, python -m gsd_cli.cli)
        _quick_exit()
    was_null = is_devnull(1)
    try:
        rc = _main(argv)
        return closed_pipe() if rc == 0 and stdout_unflushable() else rc
    except SystemExit as e:
        # a closed pipe met outside gsd's consoles (typer's --help): rich points standard output at
        # /dev/null and exits 1, click wraps the streams and exits 1; both silently
        if e.code == 1 and ("PacifyFlushWrapper" in type(sys.stdout).__name__ or (not was_null and is_devnull(1))):
            return closed_pipe()
        raise
    except BrokenPipeError:
        return closed_pipe()
    finally:  # a library call made after this command (in the same process) is not booked under it
        invoked["argv"] = None


def _quick_exit() -> None:
    """At the interpreter's exit, freeze the garbage collector's objects (``gc.freeze``, an ``atexit``
    handler) so that the shutdown's full collections skip them: after a training, torch and its compiler
    stack hold some 400,000 objects, and those passes took 0.9-1.1 s of every ``gsd train`` after its last
    line (2-core CPU; issue 53). Nothing else changes: files, the ledger and the other ``atexit`` handlers
    close as before, and objects are still freed when their last reference goes; a cycle still alive at
    exit is left to the operating system, which Python never promises to finalize either."""
    import atexit
    import gc

    if not _exit_frozen["registered"]:
        _exit_frozen["registered"] = True
        atexit.register(gc.freeze)


_exit_frozen = {"registered": False}


def _main(argv: list[str] | None) -> int:
    _debug["on"] = False
    keep_freed_memory()  # glibc: no page fault per large CPU tensor (gsd_cli.allocator; GSD_MALLOC=system: off)
    try:
        _check_encoding(sys.argv[1:] if argv is None else argv)
        with shown_data_warnings():  # a dataset's files worth a look: one labelled line each (common.py)
            rc = app(args=argv, prog_name="gsd", standalone_mode=False)  # click returns a typer.Exit's code here
        if rc == 130:  # Typer turns Ctrl-C (KeyboardInterrupt) into exit code 130, silently: say so
            err.print("interrupted")
        if isinstance(rc, int) and rc:
            return rc
    except PrivateError as e:  # its occurrence depends on the private data: a private line (and a private exit status)
        print_error(str(e), private=True)
        return 2
    except GSDError as e:
        print_error(str(e))
        return 2
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        err.print("aborted")
        return 130
    except _ClickException as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # plain `gsd`: help was printed
            return 0
        msg = " ".join(e.format_message().split())
        ctx = getattr(e, "ctx", None)
        path = ["gsd", *ctx.command_path.split()[1:]] if ctx is not None else ["gsd"]  # gsd cache info, not gsd info
        hint = f" (see {' '.join(path)} --help)"
        print_error(msg + hint)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:  # gsd ... | head: the reader has all it wanted (main says nothing, exits 0)
        return closed_pipe()
    except RuntimeError as e:
        if "Could not determine home directory" not in str(e):  # pathlib's expanduser of ~user for an unknown user
            return _unexpected(e)
        print_error("a path starts with ~ or ~USER but that home folder is unknown (no such user, or HOME unset); "
                    "write the path in full")
        return 2
    except OSError as e:  # the environment, not gsd: a full disk, a read-only or misplaced folder
        if debugging():
            traceback.print_exc(file=sys.stderr)
        where = f"{os.fsdecode(e.filename)}: " if e.filename is not None else ""
        print_error(f"{where}{e.strerror or e} ({type(e).__name__}; check the path, its permissions and free space)")
        return 2
    except Exception as e:  # noqa: BLE001 - the last guard: no traceback unless asked for
        return _unexpected(e)
    return 0


def _unexpected(e: Exception) -> int:
    """An exception no handler expected: out of memory is the user's to change (exit 2), anything else is a bug."""
    if debugging():
        traceback.print_exc(file=sys.stderr)
    from ..memory import out_of_memory_message

    oom = out_of_memory_message(e)  # the request was too large for this machine
    if oom is not None:
        print_error(oom)
        return 2
    print_error(f"internal error: {type(e).__name__}: {e} {_HINT}")
    return EXIT_INTERNAL
