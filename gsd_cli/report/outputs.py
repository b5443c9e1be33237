"""Writing output files, for every command: checks before any work, then one writer.

* ``-`` is standard output; a character device (``/dev/null``, a terminal) or a FIFO is written
  directly, never renamed over.
* A regular file or a new path is written atomically: a temporary file in the same folder, then a
  rename, so an interrupted run never leaves half a file. A symbolic link is followed: its target
  is replaced and the link stays a link, but only where the target is an earlier gsd output
  (:func:`written_by_gsd`: a ranking, catalogue, audit or model JSON, a ranking CSV, Markdown table
  or plot), a device or a FIFO; a link to any other file, or to nothing, is refused before any work
  (:func:`check_output_path`) unless ``force`` (the commands' ``--force``): ``--json out.json`` as a
  link to ``~/.bashrc`` replaced it.
* A new file gets the user's umask (``0666 & ~umask``), a replaced file keeps its mode; ``private``
  files (a run's secret seed) are created ``0600``.
* Every ``OSError`` (a full disk, a read-only folder, a name too long) becomes one :class:`GSDError`
  line naming the path.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import sys
import tempfile
from pathlib import Path
from typing import IO, Callable, Iterable, Mapping

from ..errors import GSDError

STDOUT = "-"


def is_stdout(path: str | Path | None) -> bool:
    return path is not None and str(path) == STDOUT


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _why(e: OSError) -> str:
    if e.errno == errno.ENAMETOOLONG:
        return "file name too long; use a shorter name"
    if e.errno == errno.ENOSPC:
        return "no space left on the device"
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "permission denied (read-only?)"
    return e.strerror or str(e)


def _virtual(folder: Path) -> bool:
    """A kernel file system (procfs, sysfs: no blocks at all), where no new file can be created."""
    try:
        return os.statvfs(folder).f_blocks == 0 and str(folder).startswith(("/proc", "/sys"))
    except (OSError, AttributeError):
        return False


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder if folder.exists() else ".", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


#: PNG text chunk gsd's plots carry (:func:`gsd_cli.report.plots.write_plot`), by which a later run knows them
PNG_SOFTWARE = "gsd"
#: top-level keys of gsd's JSON outputs: one ranking, a catalogue's jobs, an audit, ``gsd models show``
_JSON_KEYS = ({"results", "metric", "model"}, {"jobs", "failures"}, {"claimed_epsilon", "epsilon_lower_bound"},
              {"parameters", "total", "trainable"})
#: first cells of gsd's CSV headers: a ranking, a ranking over repeats, a catalogue's jobs
_CSV_HEADS = ("rank,public,distance,", "rank,public,mean,", "job,rank,public,")
_MARKDOWN_HEAD = re.compile(r"^### .*(GSD|DP|distance|energy|not DP).* to `")
#: what a catalogue's Markdown opens with when no job finished (:func:`gsd_cli.report.catalog_files.run_markdown`)
_MARKDOWN_OPENINGS = ("**Jobs that failed:**", "**Checks failed:**", "All checks passed.")


def written_by_gsd(file: str | Path, limit: int = 64 << 20) -> bool:
    """Whether ``file`` is an earlier gsd output, by its content: a JSON object with the keys of one of
    gsd's JSON outputs, a CSV whose header is a gsd ranking's, a Markdown file that opens with a gsd
    ranking's heading, or a PNG whose ``Software`` text chunk names gsd (its plots since 0.3).
    Anything unreadable, larger than ``limit`` or else: False."""
    try:
        with open(file, "rb") as f:
            head = f.read(4096)
            if head.startswith(b"\x89PNG\r\n\x1a\n"):
                return b"tEXtSoftware\x00" + PNG_SOFTWARE.encode() in head + f.read(1 << 16)
            if os.fstat(f.fileno()).st_size > limit:
                return False
            text = (head + f.read()).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    first = text.lstrip().split("\n", 1)[0].rstrip("\r")
    if first.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return False
        return isinstance(doc, dict) and any(keys <= doc.keys() for keys in _JSON_KEYS)
    return (first.startswith(_CSV_HEADS) or first == "job" or bool(_MARKDOWN_HEAD.match(first))
            or first in _MARKDOWN_OPENINGS)


def _check_link(path: Path, target: Path, what: str, force: bool) -> None:
    """Refuse ``path`` when it is a symbolic link whose target is neither an earlier gsd output nor a
    device or FIFO (module docstring), unless ``force``."""
    if force or not path.is_symlink():
        return
    if not target.exists():
        raise GSDError(f"{what} {path} is a symbolic link to {target}, which does not exist: writing would create a file "
                       "there; give another name, or add --force to write through the link")
    mode = target.stat().st_mode
    if stat.S_ISREG(mode) and not written_by_gsd(target):
        raise GSDError(f"{what} {path} is a symbolic link to {target}, which is not an earlier gsd output: writing would "
                       "replace it; give another name, or add --force to replace it")


def check_output_path(path: str | Path | None, what: str, force: bool = False) -> Path | None:
    """Fail before any work if ``path`` cannot be written: a folder, a missing or unwritable folder,
    a name too long, a symbolic link to anything but an earlier gsd output (unless ``force``: module
    docstring). ``-`` (standard output), devices and FIFOs pass."""
    if path is None:
        return None
    if is_stdout(path):
        return Path(STDOUT)
    path = Path(path).expanduser()
    try:
        target = Path(os.path.realpath(path))
        _check_link(path, target, what, force)
        if len(os.fsencode(target.name)) > _name_max(target.parent):
            raise GSDError(f"{what} {str(path)[:60]}...: file name too long ({len(os.fsencode(target.name))} bytes); use a shorter name")
        if target.is_dir():
            raise GSDError(f"{what} {path} is a folder; give a file name")
        if target.exists():
            mode = target.stat().st_mode
            if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
                return path
            if not stat.S_ISREG(mode):
                raise GSDError(f"{what} {path} is not a regular file; give a file name")
        parent = target.parent
        if not parent.exists():
            raise GSDError(f"{what} {path}: folder {parent} does not exist; create it first")
        if not parent.is_dir():
            raise GSDError(f"{what} {path}: {parent} is a file, not a folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise GSDError(f"{what} {path}: folder {parent} is not writable; give another path")
        if _virtual(parent):
            raise GSDError(f"{what} {path}: {parent} is a virtual file system (like /proc or /sys) where files cannot be "
                           "created; give a path on a disk")
    except OSError as e:
        raise GSDError(f"{what} {str(path)[:200]}: {_why(e)}") from None
    return path


def check_distinct(outputs: Mapping[str, str | Path | None]) -> None:
    """Refuse two options naming the same output (``--json X --csv X``, or ``-`` twice)."""
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = STDOUT if is_stdout(path) else os.path.realpath(Path(path).expanduser())
        if key in seen:
            raise GSDError(f"{seen[key]} and {option} both write to {path}; give each output its own file")
        seen[key] = option


def check_not_inputs(outputs: Mapping[str, str | Path | None], inputs: Iterable[str | Path | None]) -> None:
    """Refuse, before any work, an output that is one of the run's inputs (a dataset file, a catalogue,
    a weights file, an image listed by a source) or lies inside an input folder (a ``folder:`` source):
    writing it would destroy the input, or add a file to the dataset. Links are followed on both
    sides; ``-``, devices and FIFOs pass."""
    files: dict[str, str] = {}
    folders: dict[str, str] = {}
    for p in inputs:
        if p is None or str(p) in ("", STDOUT):
            continue
        try:
            real = os.path.realpath(Path(p).expanduser())
            if not os.path.exists(real):  # not an input (a name, or missing: the run says so)
                continue
        except (OSError, RuntimeError, ValueError):
            continue
        (folders if os.path.isdir(real) else files).setdefault(real, str(p))
    if not files and not folders:
        return
    for option, path in outputs.items():
        if path is None or is_stdout(path):
            continue
        try:
            real = os.path.realpath(Path(path).expanduser())
            if os.path.exists(real) and not stat.S_ISREG(os.stat(real).st_mode):
                continue  # /dev/null, a FIFO
        except (OSError, RuntimeError, ValueError):
            continue
        if real in files:
            raise GSDError(f"{option} {path} is an input of this run ({files[real]}); writing it would destroy it: "
                           "give the output another name")
        if real in folders:
            raise GSDError(f"{option} {path} is the input folder {folders[real]}; give a file name outside it")
        for folder, given in folders.items():
            if real.startswith(folder.rstrip(os.sep) + os.sep):
                raise GSDError(f"{option} {path} is inside the input folder {given} (it would change the dataset); "
                               "write the output outside it")


def run_inputs(datasets: Iterable[str], catalog: str | Path | None = None, weights: str | None = None,
               model: str | None = None) -> list[Path]:
    """The files and folders a run reads, from its arguments alone: the datasets' paths
    (:func:`gsd_cli.data.registry.spec_paths`), a weights file, a model file (``net.py:make``) and the
    catalogue file itself (the paths its datasets and jobs name: :func:`gsd_cli.ranking.catalog.catalog_inputs`,
    which the command adds: this module sits below the catalogue)."""
    from ..data.registry import spec_paths
    from ..models.spec import split_file_reference

    found: list[Path] = []
    for spec in datasets:
        found += spec_paths(spec)
    for w, m in [(weights, model)]:
        found += [Path(w)] if w else []
        ref = split_file_reference(str(m or ""))
        found += [Path(ref[0])] if ref else []
    if catalog is not None:
        found.append(Path(catalog))
    return found


def check_not_example_files(outputs: Mapping[str, str | Path | None], sources) -> None:
    """Refuse an output that is one of the image files the resolved ``sources`` read (a CSV's rows)."""
    wanted = {}
    for option, path in outputs.items():
        if path is not None and not is_stdout(path):
            for p in {os.path.abspath(Path(path).expanduser()), os.path.realpath(Path(path).expanduser())}:
                wanted[p] = (option, path)
    if not wanted:
        return
    for src in sources:
        n = len(src)
        if not n or src.example_file(0) is None:
            continue
        for i in range(n):
            f = os.path.abspath(src.example_file(i))
            if f in wanted:
                option, path = wanted[f]
                raise GSDError(f"{option} {path} is an image of the dataset {src.name}; writing it would destroy it: "
                               "give the output another name")


def save_output(path: str | Path, save: Callable[[IO], object], binary: bool = False, suffix: str = "",
                private: bool = False) -> None:
    """Call ``save(f)`` on a file object for ``path`` (see the module's rules)."""
    if is_stdout(path):
        stream = sys.stdout.buffer if binary else sys.stdout
        save(stream)
        stream.flush()
        return
    shown = Path(path)
    try:
        target = Path(os.path.realpath(Path(path).expanduser()))  # a symlink: write its target
        try:
            st = os.stat(target)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise GSDError(f"cannot write {shown}: it is a folder")
        if st is not None and not stat.S_ISREG(st.st_mode):  # a device, FIFO, ...: write it as a stream
            with open(target, "wb") if binary else open(target, "w", newline="", encoding="utf-8") as f:
                save(f)
            return
        mode = 0o600 if private else stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(prefix=".gsd-", suffix=suffix + ".tmp", dir=target.parent)
        try:
            os.fchmod(fd, mode)
            with (os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", newline="", encoding="utf-8")) as f:
                save(f)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise GSDError(f"cannot write {str(shown)[:200]}: {_why(e)}") from None


def write_output(path: str | Path, data: bytes | str, private: bool = False) -> None:
    """Write ``data`` (text or bytes) to ``path`` by :func:`save_output`."""
    if isinstance(data, str):
        save_output(path, lambda f: f.write(data), private=private)
    else:
        save_output(path, lambda f: f.write(data), binary=True, private=private)
