"""``gsd cache``: the cache of public gradient subspaces (``gsd_cli.cache.SubspaceCache``)."""

from __future__ import annotations

import typer

from .app import app
from .common import out

cache_app = typer.Typer(help="The cache of public gradient subspaces.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is and what it holds."""
    from ..cache import SubspaceCache

    i = SubspaceCache().info()
    out.print(f"{i['directory']}: {i['entries']} entries, {i['bytes'] / 2**20:.1f} MiB")


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete every cached public subspace."""
    from ..cache import SubspaceCache

    c = SubspaceCache()
    out.print(f"deleted {c.clear()} entries from {c.directory}")
