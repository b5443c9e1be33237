"""The Typer app every command registers on, and the console-script entry ``main``."""

from __future__ import annotations

import inspect

import typer

from .. import __version__
from ..errors import GSDError
from .common import err, out, print_error

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


@app.callback()
def main_callback(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Choose public data for differentially private training by Gradient Subspace Distance."""


def reflow_help(*apps: typer.Typer) -> None:
    """Join the lines of each docstring paragraph: rich keeps a docstring's line breaks, so help text
    wrapped at 100 columns in the source would come out ragged on a narrower terminal."""
    for a in apps:
        infos = [*a.registered_commands, *([a.registered_callback] if a.registered_callback else [])]
        for info in infos:
            fn = info.callback
            if fn is not None and fn.__doc__:
                fn.__doc__ = "\n\n".join(" ".join(p.split()) for p in inspect.cleandoc(fn.__doc__).split("\n\n"))


def main(argv: list[str] | None = None) -> int:
    """Console-script entry: user errors print one line and exit 2, never a traceback."""
    try:
        rc = app(args=argv, standalone_mode=False)  # click returns a typer.Exit's code here
        if isinstance(rc, int) and rc:
            return rc
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
        hint = f" (see gsd {e.ctx.info_name} --help)" if getattr(e, "ctx", None) and e.ctx.info_name != "gsd" else " (see gsd --help)"
        print_error(msg + hint)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    return 0
