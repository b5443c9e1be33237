"""Checking the datasets of a run before a long run: ``gsd datasets check``.

:func:`check_datasets` walks every dataset a run would use (the names given; else every dataset of the
catalogue's jobs; else the default private and public sets) and reports, per dataset:

- ``cannot be used``: the name does not resolve (missing folder or file, unknown name, a loader error);
- ``absent image``: a listed image file (a CSV row's, a folder's) does not exist;
- ``unreadable``: an image file that exists but cannot be opened, or is empty (0 bytes);
- ``hidden file``: macOS / Windows metadata beside the images (``._x.png``, ``.DS_Store``,
  ``Thumbs.db``: the loaders skip them, but they mean a copied-over folder worth a look);
- ``empty label cell`` / ``empty image cell``: CSV rows (``file:line``) with an empty cell in the
  image or label column(s) the loader uses;
- ``group across splits``: a grouped source (``group_column``, a folder's ``groups`` file) whose data
  has its own split column that puts one group (patient) in more than one part (:mod:`.groups`).

A ``.dcm`` file without the DICOM preamble (``DICM`` at byte 128) is ``unreadable``.

Besides the problems, *warnings* (the data is usable as it is, but may not be what was meant; they do not change
the exit status): ``sub-folder counted as its class`` (a class folder of a ``folder:`` set holding sub-folders of
images, which count as that class, as torchvision's ``ImageFolder`` counts them), ``mixed image sizes`` and ``mixed
image modes`` (grey and colour; found as the images are decoded, so not with ``quick``). A run says the same once,
as a ``private: warning:`` line, when it opens the folder or first reads such images (:class:`gsd_cli.errors.DataWarning`).

By default every image is then decoded exactly as ``gsd rank`` reads it (:func:`gsd_cli.data.read_images`:
a truncated file, an image too large to open, NaN pixels or float pixels outside [0, 1] are
``unreadable`` with the reason), so a dataset that checks clean is one that ranks; ``quick=True``
(``gsd datasets check --quick``) reads only the first bytes of each file (ChestX-ray14's 112,120
images in seconds, but a file with a good header and a broken body passes).

Each problem keeps every path; the report shows a count and the first few.
"""

from __future__ import annotations

import csv
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GSDError
from .dicom import DICOM_EXTENSIONS

#: the order problems are reported in
KINDS = ("cannot be used", "absent image", "unreadable", "hidden file", "empty image cell", "empty label cell",
         "group across splits")
#: the warnings, in the order reported (the exit status does not change)
WARNINGS = ("sub-folder counted as its class", "mixed image sizes", "mixed image modes")


@dataclass
class DatasetCheck:
    """One dataset: ``examples`` (None when it did not resolve), ``files`` checked, ``problems`` and ``warnings``
    (:data:`WARNINGS`) by kind."""

    name: str
    examples: int | None = None
    files: int = 0
    problems: dict[str, list[str]] = field(default_factory=dict)
    warnings: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, what: str) -> None:
        self.problems.setdefault(kind, []).append(what)


@dataclass
class CheckReport:
    """Every dataset checked; ``ok`` when none has a problem."""

    datasets: list[DatasetCheck]

    @property
    def ok(self) -> bool:
        return not any(d.problems for d in self.datasets)

    def lines(self, first: int = 3) -> list[str]:
        """One line per dataset, then one per problem: its count and the first ``first`` paths."""
        out = []
        for d in self.datasets:
            size = "not resolved" if d.examples is None else f"{d.examples} examples, {d.files} files checked"
            said = "ok" if not d.problems else f"{sum(map(len, d.problems.values()))} problem(s)"
            out.append(f"{d.name}: {size}: {said}" + (f", {len(d.warnings)} warning(s)" if d.warnings else ""))
            for kind in sorted(d.problems, key=lambda k: KINDS.index(k) if k in KINDS else len(KINDS)):
                out.append(_kind_line(f"  {kind}", d.problems[kind], first))
            for kind in sorted(d.warnings, key=WARNINGS.index):
                out.append(_kind_line(f"  warning: {kind}", d.warnings[kind], first))
        return out


def _kind_line(head: str, items: list[str], first: int) -> str:
    more = f", ... ({len(items) - first} more)" if len(items) > first else ""
    return f"{head}: {len(items)}: " + "; ".join(items[:first]) + more


def _targets(names, catalog) -> list[str]:
    if names:
        return list(dict.fromkeys(names))
    if catalog is not None:
        return list(dict.fromkeys(n for j in catalog.jobs for n in (j.private, *j.candidates)))
    from ..defaults import DEFAULT_PRIVATE, DEFAULT_PUBLIC

    return [DEFAULT_PRIVATE, *DEFAULT_PUBLIC]


def _csv_of(name: str, catalog) -> tuple[Path, dict] | None:
    """The CSV file behind ``name`` and its column settings, when it is a CSV source."""
    entry = catalog.datasets.get(name) if catalog is not None else None
    if entry is not None and entry.source == "csv" and entry.path:
        return catalog._rel(entry.path), {"image_column": entry.image_column, "label_column": entry.label_column,
                                          "label_columns": entry.label_columns}
    if entry is None and name.startswith("csv:"):
        from .spec_options import split_options

        path = name[4:]
        for split in (":train", ":test", ":val"):
            path = path[: -len(split)] if path.endswith(split) else path
        try:
            path, options = split_options("csv", path, name)
        except GSDError:
            return None  # the dataset's own resolution reports the bad option
        for split in (":train", ":test", ":val"):  # csv:PATH:train?options
            path = path[: -len(split)] if path.endswith(split) else path
        return Path(path).expanduser(), options
    return None


def _check_csv(d: DatasetCheck, path: Path, cols: dict) -> set[str]:
    """Empty image / label cells and absent images of a CSV's rows; returns the image files it names."""
    from .csvsource import IMAGE_COLUMNS, LABEL_COLUMNS, _pick

    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = list(reader.fieldnames or [])
            rows = [(reader.line_num, r) for r in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        d.add("unreadable", f"{path} ({type(e).__name__})")
        return set()
    img = cols.get("image_column") or _pick(header, IMAGE_COLUMNS)
    labels = list(cols.get("label_columns") or []) or [cols.get("label_column") or _pick([c for c in header if c != img], LABEL_COLUMNS)]
    files = set()
    for line, r in rows:
        if img in header and not (r.get(img) or "").strip():
            d.add("empty image cell", f"{path}:{line}")
        elif img in header:
            p = r[img].strip()
            files.add(p if Path(p).is_absolute() else str(path.parent / p))
        for c in labels:
            if c in header and not (r.get(c) or "").strip():
                d.add("empty label cell", f"{path}:{line} ({c})")
                break
    return files


def _check_files(d: DatasetCheck, files: set[str]) -> None:
    """Absent, unreadable or empty image files, and hidden files in their folders."""
    folders = set()
    for f in sorted(files):
        d.files += 1
        folders.add(os.path.dirname(f))
        try:
            with open(f, "rb") as fh:
                head = fh.read(132)
                if not head:
                    d.add("unreadable", f"{f} (empty file)")
                elif f.lower().endswith(DICOM_EXTENSIONS) and head[128:132] != b"DICM":
                    d.add("unreadable", f"{f} (not DICOM: no 'DICM' preamble)")
        except FileNotFoundError:
            d.add("absent image", f)
        except OSError as e:
            d.add("unreadable", f"{f} ({e.strerror or type(e).__name__})")
    from .files import is_hidden

    for folder in sorted(folders):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        d.problems.setdefault("hidden file", []).extend(
            os.path.join(folder, n) for n in names if is_hidden(n) and os.path.isfile(os.path.join(folder, n)))
        if not d.problems["hidden file"]:
            del d.problems["hidden file"]


def _check_groups(d: DatasetCheck, src) -> None:
    """Every group that the data's own split column puts in more than one part."""
    from .groups import straddling
    from .splits import groups_of

    groups, sides = groups_of(src), getattr(src, "data_split", None)
    if groups is None or sides is None or len(sides) != len(groups):
        return
    column = getattr(src, "data_split_column", "split")
    parts: dict[str, set] = {}
    for g, s in zip(groups, sides):
        parts.setdefault(g, set()).add(s)
    for g in straddling(groups, sides):
        d.add("group across splits", f"{g} ({column}: {', '.join(sorted(parts[g]))})")


def _check_nested(d: DatasetCheck, src) -> None:
    """The class folders of a ``folder:`` set (or of the set a part is taken from) that hold sub-folders of images."""
    seen = set()
    while src is not None and id(src) not in seen:
        seen.add(id(src))
        for cls, subs in sorted((getattr(src, "nested", None) or {}).items()):
            d.warnings.setdefault(WARNINGS[0], []).extend(f"{cls}/{sub}/ ({n} images)" for sub, n in subs)
        src = getattr(src, "parent", None)


def _mixed(d: DatasetCheck, shapes: dict) -> None:
    """``mixed image sizes`` / ``mixed image modes`` from the decoded images' shapes (shape -> count), each size or
    mode with its count, the most common first."""
    sizes, modes = Counter(), Counter()
    for shape, n in shapes.items():
        sizes[f"{shape[0]}x{shape[1]}"] += n
        modes["grey" if len(shape) == 2 or shape[2] == 1 else "colour" if shape[2] == 3 else f"{shape[2]} channels"] += n
    for kind, counts in ((WARNINGS[1], sizes), (WARNINGS[2], modes)):
        if len(counts) > 1:
            d.warnings[kind] = [f"{k} ({n} images)" for k, n in counts.most_common()]


def _check_decode(d: DatasetCheck, src, progress=None) -> None:
    """Read every example as the ranking does (one at a time, so each failure names its own file);
    files already reported absent or unreadable are skipped. Images of mixed sizes or modes are a warning."""
    from . import read_images

    flagged = {p.split(" (")[0] for kind in ("absent image", "unreadable") for p in d.problems.get(kind, [])}
    n = len(src)
    shapes: Counter = Counter()
    for i in range(n):
        f = src.example_file(i)
        if f is not None and f in flagged:
            continue
        try:
            shapes.update(tuple(img.shape) for img in read_images(src, [i]))
        except GSDError as e:
            d.add("unreadable", " ".join(str(e).split()))
        if progress is not None and ((i + 1) % 256 == 0 or i + 1 == n):
            progress(src.name, i + 1, n)
    _mixed(d, shapes)


def _check_one(name: str, catalog, data_root, download: bool, quick: bool = False, progress=None) -> DatasetCheck:
    from . import resolve

    d = DatasetCheck(name)
    files: set[str] = set()
    try:
        src = catalog.resolve(name, download) if catalog is not None else resolve(name, root=data_root, download=download)
    except GSDError as e:
        d.add("cannot be used", " ".join(str(e).split()))
    else:
        d.examples = len(src)
        if d.examples and src.example_file(0) is not None:
            files = {src.example_file(i) for i in range(d.examples)}
        _check_groups(d, src)
        _check_nested(d, src)
    spec = _csv_of(name, catalog)
    if spec is not None and spec[0].is_file():
        files |= _check_csv(d, *spec)
    _check_files(d, files)
    if not quick and d.examples:
        _check_decode(d, src, progress)
    return d


def check_datasets(names: list[str] | None = None, catalog=None, data_root: str | Path | None = None,
                   download: bool = False, quick: bool = False, progress=None) -> CheckReport:
    """Check ``names`` (catalogue datasets or any name ``gsd rank`` accepts); with none, every dataset
    of ``catalog``'s jobs (a :class:`gsd_cli.ranking.catalog.Catalog`, from :func:`gsd_cli.ranking.catalog.load_catalog`),
    else the default private and public sets. A dataset's problems go into the report.
    Every image is decoded as a ranking reads it unless ``quick`` (first bytes only); ``progress(name,
    done, total)`` follows the decoding."""
    if catalog is not None and not hasattr(catalog, "jobs"):
        from ..errors import GSDError

        raise GSDError("check_datasets takes a loaded catalogue: catalog=gsd_cli.ranking.catalog.load_catalog(path)")
    import warnings

    from ..errors import DataWarning

    with warnings.catch_warnings():  # what a source says when opened or first read is in the report, as a warning
        warnings.simplefilter("ignore", DataWarning)
        return CheckReport([_check_one(n, catalog, data_root, download, quick, progress) for n in _targets(names, catalog)])
