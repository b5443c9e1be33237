"""``gsd cache``: the cache of public gradient subspaces (``gsd_cli.ranking.cache.SubspaceCache``)."""

from __future__ import annotations

import typer

from rich.markup import escape

from .app import app
from .common import out

cache_app = typer.Typer(help="The cache of public gradient subspaces.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _left(n: int, names: list[str]) -> str:
    if not n:
        return ""
    shown = ", ".join(names) + (", ..." if n > len(names) else "")
    return f"; left alone {n} other file(s), not gsd cache entries ({shown})"


def _calibrations(n: int) -> str:
    return f", {n} noise calibration(s) in calibration/ (kept by gsd cache clear)" if n else ""


@cache_app.command("info")
def cache_info() -> None:
    """Where the cache is and what it holds: gsd's entries (count, size), its noise calibrations, and other files it leaves alone."""
    from ..ranking.cache import SubspaceCache

    i = SubspaceCache().info()
    if i["directory"] == "None":
        out.print(escape(f"{i['problem']}; set GSD_CACHE_DIR to a folder to cache public subspaces"), highlight=False, soft_wrap=True)
        return
    if i["problem"]:
        out.print(escape(f"{i['directory']}: {i['problem']}; set GSD_CACHE_DIR to a folder, or rank with --no-cache"), highlight=False, soft_wrap=True)
        return
    temp = f", {i['temporary']} unfinished temporary file(s)" if i["temporary"] else ""
    stage1 = f", {i['stage1']} stage-1 model(s) in stage1/ ({_mib(i['stage1_bytes'])})" if i["stage1"] else ""
    text = (f"{i['directory']}: {i['entries']} entries, {_mib(i['bytes'])} of a {_mib(i['max_bytes'])} cap (least "
            f"recently used entries deleted beyond it; gsd cache limit SIZE){temp}{stage1}{_calibrations(i['calibrations'])}")
    out.print(escape(text + _left(i["other"], i["other_names"]).replace("left alone", "also")), highlight=False, soft_wrap=True)


@cache_app.command("clear")
def cache_clear() -> None:
    """Delete gsd's cached public subspaces and second-phase stage-1 models (and its unfinished temporary files); noise calibrations and other files in the folder are left alone."""
    from ..ranking.cache import SubspaceCache
    from ..errors import GSDError
    from ..train.second_phase import stage1_cache

    c = SubspaceCache().clear()
    stage1 = stage1_cache.clear() if not c["problem"] else 0
    if c["problem"]:
        where = "" if c["directory"] == "None" else f"cache {c['directory']}: "
        raise GSDError(f"{where}{c['problem']}; nothing deleted")
    temp = f" and {c['temporary']} temporary file(s)" if c["temporary"] else ""
    text = f"deleted {c['deleted']} entries ({_mib(c['bytes'])}){temp} from {c['directory']}"
    if stage1:
        text += f", and {stage1} stage-1 model(s) from {stage1_cache.SUBFOLDER}/"
    if c["calibrations"]:
        text += f"; kept {c['calibrations']} noise calibration(s) in calibration/ (delete that folder to drop them)"
    out.print(escape(text + _left(c["left"], c["left_names"])), highlight=False, soft_wrap=True)
    if c["failed"]:
        raise GSDError(f"could not delete {len(c['failed'])} entries: {', '.join(c['failed'][:5])}")


@cache_app.command("limit")
def cache_limit(
    size: str = typer.Argument(None, help="New size cap of the cache's entries, e.g. 2G, 500M, 0 (cache nothing); none: show it."),
) -> None:
    """Show or set the size cap of the cache: after each write, the least recently used entries are deleted
    until the rest fit (default 2 GiB; kept in the cache folder)."""
    from ..ranking.cache import SubspaceCache, parse_size
    from ..errors import GSDError

    c = SubspaceCache()
    if c.directory is None:
        raise GSDError(f"no cache folder ({c.unusable}); set GSD_CACHE_DIR to a folder")
    if size is None:
        out.print(escape(f"{c.directory}: size cap {_mib(c.max_bytes())}"), highlight=False, soft_wrap=True)
        return
    done = c.set_max_bytes(parse_size(size))
    freed = f"; deleted {done['deleted']} least recently used entries ({_mib(done['bytes'])})" if done["deleted"] else ""
    out.print(escape(f"{c.directory}: size cap set to {_mib(c.max_bytes())}{freed}"), highlight=False, soft_wrap=True)
