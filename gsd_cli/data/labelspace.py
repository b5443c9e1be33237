"""A private task's declared label space, read without any of its examples (``gsd train --auto-select --warm-cache``).

The advice's public work (stage 1 of the second phase on each candidate, the public subspaces of its ranking) depends
on the private task only through its label space: the class count, the class names and whether it is multi-label.
:func:`declared_label_space` reads those from what *declares* them and nothing else (issue 60, item 5):

* ``npz:PATH``: the file's ``classes`` or ``num_classes`` array and the *header* of ``y`` (its shape: a 2-d ``y`` is
  multi-label, one column a class); neither ``x`` nor ``y``'s values are read;
* ``folder:PATH``: the names of the class folders (one directory listing; no image, no file list);
* ``csv:PATH``: the header row; named ``label_columns`` (a catalogue's) declare a multi-label set, otherwise the
  classes must come from ``--classes`` (the label column's values are private and are not read);
* any other name (the embedded, torchvision and published sets, ``hf:``, a registered kind): its definition, through
  :func:`gsd_cli.data.resolve` (their class lists are part of what they are; no example is decoded to tell them).

``classes`` (``--classes``) declares the list as every run does; where it names classes, the run itself checks them
against the labels (a warm-up reads no label). A label space that nothing declares is refused in one line, as a DP
run refuses it (:func:`gsd_cli.data.require_declared_classes`). The result carries the name and the path the set
reads (:func:`gsd_cli.data.identity.origin`), so the private set offered as a candidate is still refused by its
public inputs (:func:`gsd_cli.ranking.pipeline.refuse_same_dataset`).
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DatasetError


@dataclass
class LabelSpace:
    """What a private task declares of its labels, and the name and path that identify it (no example)."""

    name: str
    num_classes: int
    classes: list[str] | None
    multilabel: bool = False
    classes_declared: bool = True
    origin_path: str | None = None
    origin_split: str | None = None


def declared_label_space(spec, *, catalog=None, classes=None) -> LabelSpace:
    """The label space of the private set ``spec`` (a name, a catalogue name with ``catalog``, or a source), with
    ``classes`` (``--classes``: a count or names) declared; see the module docstring for what each kind reads."""
    from .classes import parse_classes
    from .registry import _split_suffix

    space = _read(spec, catalog, _split_suffix)
    if classes is not None:
        want = parse_classes(classes)
        if isinstance(want, list):
            names = want
        elif space.classes is not None and len(space.classes) >= want:
            names = space.classes[:want]
        else:
            names = [*(space.classes or []), *(str(i) for i in range(len(space.classes or []), want))]
        space.classes, space.num_classes, space.classes_declared = names, len(names), True
    if not space.classes_declared:
        from .classes import require_declared_classes

        require_declared_classes(space)
    return space


def _read(spec, catalog, split_suffix) -> LabelSpace:
    if not isinstance(spec, str):  # a source object: its attributes (no example)
        return _of_source(spec)
    if catalog is not None and spec in catalog.datasets:
        e = catalog.datasets[spec]
        if e.source in ("npz", "csv", "folder") and e.path:
            return _by_kind(e.source, str(catalog._file(e)), spec, e.split, label_columns=e.label_columns)
        return _of_source(catalog.resolve(spec))
    base, split = split_suffix(spec)
    kind, sep, arg = base.partition(":")
    if sep and kind in ("npz", "csv", "folder") and arg:
        from .spec_options import split_options

        path, _ = split_options(kind, arg, spec)
        return _by_kind(kind, path, spec, split)
    from .registry import resolve

    return _of_source(resolve(spec))


def _of_source(src) -> LabelSpace:
    from .identity import origin

    where = origin(src)
    return LabelSpace(str(src.name), int(src.num_classes), list(getattr(src, "classes", None) or []) or None,
                      bool(getattr(src, "multilabel", False)), bool(getattr(src, "classes_declared", True)),
                      where[0] if where else None, where[1][-1] if where and where[1] else None)


def _by_kind(kind: str, path: str, name: str, split: str | None, label_columns=None) -> LabelSpace:
    real = str(Path(path).expanduser())
    reader = {"npz": _npz, "folder": _folder, "csv": _csv}[kind]
    count, names, multilabel, declared = reader(real, name, label_columns)
    return LabelSpace(name, count, names, multilabel, declared, real, split)


def _npz(path: str, name: str, _label_columns) -> tuple:
    if not os.path.isfile(path):
        raise DatasetError(f"{name}: no such file; give an .npz with arrays 'x' and 'y'")
    try:
        with zipfile.ZipFile(path) as z:
            members = {Path(m).stem: m for m in z.namelist()}
            if "y" not in members:
                raise DatasetError(f"{name}: has no array 'y'; it needs arrays named 'x' (images) and 'y' (labels)")
            with z.open(members["y"]) as f:  # the header alone: shape and dtype, no label
                version = np.lib.format.read_magic(f)
                header = getattr(np.lib.format, "read_array_header_%d_%d" % version, None)
                shape = (header(f) if header else np.lib.format._read_array_header(f, version))[0]
            small = {k: np.load(z.open(members[k]), allow_pickle=False) for k in ("classes", "num_classes") if k in members}
    except DatasetError:
        raise
    except Exception as e:  # zipfile.BadZipFile, ValueError, OSError...
        raise DatasetError(f"{name}: cannot read ({type(e).__name__}: {e}); save it with numpy.savez(path, x=..., y=...)") from None
    from .files import _declared_classes

    declared = _declared_classes(_Arrays(small), name)
    if len(shape) == 2:
        return int(shape[1]), declared if isinstance(declared, list) else None, True, True
    if declared is None:
        return 0, None, False, False
    names = declared if isinstance(declared, list) else [str(c) for c in range(declared)]
    return len(names), names, False, True


class _Arrays(dict):
    """The small declared arrays of an npz, as :func:`gsd_cli.data.files._declared_classes` reads them."""

    @property
    def files(self) -> list[str]:
        return list(self)


def _folder(path: str, name: str, _label_columns) -> tuple:
    from .files import is_hidden

    if not os.path.isdir(path):
        raise DatasetError(f"{name}: no such folder; give a folder of class folders (PATH/<class>/<image>)")
    names = sorted(e.name for e in os.scandir(path) if e.is_dir() and not is_hidden(e.name))
    if not names:
        raise DatasetError(f"{name}: no class folder in {path}; give a folder of class folders (PATH/<class>/<image>)")
    return len(names), names, False, True


def _csv(path: str, name: str, label_columns) -> tuple:
    import csv

    if not os.path.isfile(path):
        raise DatasetError(f"{name}: no such file {path}")
    if label_columns:
        with open(path, newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), [])
        missing = [c for c in label_columns if c not in header]
        if missing:
            raise DatasetError(f"{name}: no column(s) {missing} among {header}")
        return len(label_columns), list(label_columns), True, True
    return 0, None, False, False  # its label values are private: --classes declares them
