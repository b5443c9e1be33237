"""``csv:PATH``: a table with an image path column and a label column, or several 0/1 label columns.

Columns are found by name (case-insensitive) unless given (a catalogue's ``image_column`` and
``label_column`` / ``label_columns``): the image column is the first of :data:`IMAGE_COLUMNS`, the
label column the first of :data:`LABEL_COLUMNS`; with no such column, every other column whose
values are all 0 or 1 is a label of a multi-label set. A label column of integers is used as is; one
of strings maps the sorted distinct strings to 0, 1, ...; strings with ``|`` in them (``A|B``) make a
multi-label set. Relative image paths resolve against the CSV's folder. Only drawn files are opened.
The file is read as UTF-8, with or without a byte-order mark (Excel's "CSV UTF-8" writes one). An
empty image or label cell is an error naming its lines (it would otherwise become a class ``""``), and
so is a label cell ``nan`` (``NaN``, ``<NA>``: how pandas writes a missing value; it would become a
class ``"nan"``). A header that names a column twice is refused (the reader would keep only the last).

Only label columns *named* (``label_columns``) declare the class list; every other way reads it off
the label values (the distinct strings, ``max + 1`` of integers, the columns that happen to hold only
0/1), and the source says so (``classes_declared`` False; declare them with
:func:`gsd_cli.data.with_classes`). An example's identity (for splits) is its image path relative to
the CSV's folder.

Image paths may name DICOM files (``.dcm``, or files with the ``DICM`` preamble: :mod:`.dicom`;
``frame`` chooses the frame of multi-frame files). ``group_column`` (e.g. ``patient_id``) gives each
row a group: the split then hashes the group id, so a patient's rows are never on both sides
(:mod:`.groups`); a column ``split`` (``partition``, ``subset``, ``fold``) of the CSV is then checked
for groups on both sides of it (``gsd datasets show``), not used.

``hf:PATH``: a Hugging Face dataset saved with ``save_to_disk`` (needs the ``hf`` extra:
``pip install 'gsd-cli[hf]'``). Its first ``Image`` feature is the image, its first ``ClassLabel``
feature (else a column ``label``) the label; rows are decoded one index at a time. A ``ClassLabel``'s
names declare the classes; a plain ``label`` column does not. An example's identity is a hash of its
image content.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import DatasetError
from .base import ImageSource
from .files import FileListSource, _pil_to_array
from .groups import SPLIT_COLUMNS, group_cells, read_csv_rows

IMAGE_COLUMNS = ("path", "image", "image_path", "filepath", "file", "filename", "file_name", "img", "image index", "image_id")
LABEL_COLUMNS = ("label", "labels", "class", "target", "y", "dx", "category", "finding labels")


def _pick(columns: Sequence[str], wanted: Sequence[str]) -> str | None:
    low = {c.lower().strip(): c for c in columns}
    return next((low[w] for w in wanted if w in low), None)


def _empty_cells(name: str, path: Path, rows: list[dict], lines: list[int], columns: Sequence[str], what: str) -> None:
    """A one-line error naming the lines of ``path`` whose cell in one of ``columns`` is empty."""
    bad = [ln for r, ln in zip(rows, lines) if any(not (r.get(c) or "").strip() for c in columns)]
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        cols = ", ".join(repr(c) for c in columns)
        raise DatasetError(f"{name}: empty {what} cell(s) in column(s) {cols} on line(s) {shown} of {path}; "
                           "fill them in or remove those rows")


#: label cells that are a missing value written out (pandas: ``nan``, ``<NA>``), not a class
MISSING = ("nan", "<na>")


def _missing_labels(name: str, path: Path, rows: list[dict], lines: list[int], columns: Sequence[str]) -> None:
    """A one-line error naming the lines whose label cell (or one ``|`` part of it) is a missing value."""
    bad = [ln for r, ln in zip(rows, lines)
           if any(t.strip().lower() in MISSING for c in columns for t in (r.get(c) or "").split("|"))]
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise DatasetError(f"{name}: label 'nan' (a missing value, as pandas writes it) in column(s) "
                           f"{', '.join(repr(c) for c in columns)} on line(s) {shown} of {path}; fill them in or remove those rows")


def _duplicate_columns(name: str, path: Path, cols: Sequence[str]) -> None:
    """Refuse a header that names a column twice (case and spaces aside): csv.DictReader would keep the
    last column's cells under that name, silently."""
    seen: dict[str, int] = {}
    for i, c in enumerate(cols, 1):
        key = (c or "").strip().lower()
        if not key:  # an unnamed column (a trailing comma): never picked
            continue
        if key in seen:
            raise DatasetError(f"{name}: the header of {path} names column {c!r} twice (columns {seen[key]} and {i}); "
                               "rename one of them")
        seen[key] = i


def csv_source(path: str | Path, name: str | None = None, image_column: str | None = None,
               label_column: str | None = None, label_columns: Sequence[str] | None = None,
               group_column: str | None = None, frame: int | None = None) -> ImageSource:
    """The CSV at ``path`` as an :class:`ImageSource` (see the module doc for how columns are found;
    ``group_column``: the column of group ids, e.g. patients; ``frame``: of multi-frame DICOMs)."""
    path = Path(path).expanduser()
    name = name or f"csv:{path}"
    expect = "a CSV with an image path column (path, image, file...) and a label column (label, class...) or 0/1 label columns"
    if not path.is_file():
        raise DatasetError(f"{name}: no such file {path}; give {expect}")
    cols, rows, lines = read_csv_rows(path, f"{name}: cannot read {path}", expect)
    _duplicate_columns(name, path, cols)
    img_col = image_column or _pick(cols, IMAGE_COLUMNS)
    if img_col not in cols:
        raise DatasetError(f"{name}: no image column {image_column or ''} among {cols}; give {expect} (or name it: image_column)")
    if not rows:
        raise DatasetError(f"{name}: {path} has no rows")
    _empty_cells(name, path, rows, lines, [img_col], "image")
    files = [p if Path(p).is_absolute() else str(path.parent / p) for p in (r[img_col].strip() for r in rows)]
    declared = bool(label_columns)
    if label_columns:
        label_columns = list(label_columns)
    elif not label_column:
        label_column = _pick([c for c in cols if c != img_col], LABEL_COLUMNS)
        if label_column is None:
            label_columns = [c for c in cols if c != img_col and all((r[c] or "").strip() in ("0", "1", "0.0", "1.0") for r in rows)]
            if not label_columns:
                raise DatasetError(f"{name}: no label column among {cols}; give {expect} (or name it: label_column)")
    if label_columns:
        missing = [c for c in label_columns if c not in cols]
        if missing:
            raise DatasetError(f"{name}: no column(s) {missing} among {cols}")
        _empty_cells(name, path, rows, lines, label_columns, "label")
        _missing_labels(name, path, rows, lines, label_columns)
        try:
            y = np.asarray([[float(r[c]) for c in label_columns] for r in rows], dtype=np.float32)
        except ValueError:
            raise DatasetError(f"{name}: label columns {label_columns} must hold 0 or 1") from None
        if not np.isin(y, (0.0, 1.0)).all():
            raise DatasetError(f"{name}: label columns {label_columns} must hold 0 or 1")
        classes = list(label_columns)
    else:
        if label_column not in cols:
            raise DatasetError(f"{name}: no label column {label_column!r} among {cols}")
        _empty_cells(name, path, rows, lines, [label_column], "label")
        _missing_labels(name, path, rows, lines, [label_column])
        raw = [r[label_column].strip() for r in rows]
        if all(v.lstrip("-").isdigit() for v in raw):
            y = np.asarray([int(v) for v in raw], dtype=np.int64)
            if y.min() < 0:
                raise DatasetError(f"{name}: labels in {label_column!r} must be >= 0")
            classes = [str(c) for c in range(int(y.max()) + 1)]
        elif any("|" in v for v in raw):
            classes = sorted({t.strip() for v in raw for t in v.split("|") if t.strip()})
            y = np.zeros((len(raw), len(classes)), dtype=np.float32)
            for i, v in enumerate(raw):
                for t in v.split("|"):
                    if t.strip():
                        y[i, classes.index(t.strip())] = 1.0
        else:
            classes = sorted(set(raw))
            y = np.asarray([classes.index(v) for v in raw], dtype=np.int64)
    grouping: dict = {}
    if group_column:
        if group_column not in cols:
            raise DatasetError(f"{name}: no group column {group_column!r} among {cols}; name the column of patient (group) ids")
        used = {img_col, group_column, label_column, *(label_columns or [])}
        split_col = _pick([c for c in cols if c not in used], SPLIT_COLUMNS)
        grouping = dict(groups=group_cells(name, path, rows, lines, group_column), group_label=f"column {group_column!r}",
                        data_split=[(r.get(split_col) or "").strip() for r in rows] if split_col else None,
                        data_split_column=split_col or "")
    grouped = f", grouped by column {group_column!r}" if group_column else ""
    src = FileListSource(name, files, y, classes, f"CSV {path} (images: {img_col!r}{grouped})", "csv", path.parent,
                         classes_declared=declared, frame=frame, **grouping)
    src.origin_path = str(path)  # what it reads, for gsd_cli.data.identity.origin
    return src


class HFSource(ImageSource):
    """A ``datasets.Dataset`` (one split) decoded one row at a time."""

    def __init__(self, ds, name: str, image_column: str | None = None, label_column: str | None = None):
        feats = ds.features
        img = image_column or next((c for c, f in feats.items() if type(f).__name__ == "Image"), None)
        lab = label_column or next((c for c, f in feats.items() if type(f).__name__ == "ClassLabel"), None) or (
            "label" if "label" in feats else None)
        if img not in feats or lab not in feats:
            raise DatasetError(f"{name}: needs an Image feature and a ClassLabel (or 'label') column; it has {list(feats)}")
        self._ds, self._img, self.name = ds, img, name
        self._y = np.asarray(ds[lab], dtype=np.int64)
        names = getattr(feats[lab], "names", None)
        self.classes = list(names) if names else [str(c) for c in range(int(self._y.max(initial=-1)) + 1)]
        self.classes_declared = bool(names)
        self.num_classes = len(self.classes)
        self.description = f"Hugging Face dataset (image {img!r}, label {lab!r})"

    def __len__(self) -> int:
        return len(self._y)

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        return self._y[np.asarray(indices, dtype=np.int64)]

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        return [_pil_to_array(self._ds[int(i)][self._img]) for i in indices]


def hf_source(path: str | Path, name: str | None = None, split: str | None = None,
              image_column: str | None = None, label_column: str | None = None) -> ImageSource:
    """``hf:PATH``: ``datasets.load_from_disk(PATH)``; a DatasetDict needs a split (``hf:PATH:train``)
    unless it has only one."""
    try:
        import datasets
    except ImportError:
        raise DatasetError("hf:PATH needs the 'datasets' package; pip install 'gsd-cli[hf]'") from None
    path = Path(path).expanduser()
    name = name or f"hf:{path}"
    if not path.exists():
        raise DatasetError(f"{name}: no such folder {path}; give a folder written by Dataset.save_to_disk")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DatasetError(f"{name}: cannot load {path} ({type(e).__name__}); give a folder written by save_to_disk") from None
    if isinstance(ds, datasets.DatasetDict):
        if split is None and len(ds) == 1:
            split = next(iter(ds))
        if split not in ds:
            raise DatasetError(f"{name}: has splits {', '.join(ds)}; name one as hf:{path}:SPLIT")
        src = HFSource(ds[split], name, image_column, label_column)
        src.origin_path, src.origin_split = str(path), split  # what it reads, for gsd_cli.data.identity.origin
        return src
    src = HFSource(ds, name if split is None else f"hf:{path}", image_column, label_column)
    src.origin_path = str(path)
    if split is not None:  # one Dataset, no published splits: the per-example hash split
        from .splits import fixed_split

        return fixed_split(src, split, name)
    return src
