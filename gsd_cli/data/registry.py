"""Dataset names -> sources.

A name is one of

* an embedded dataset (``mnist-a``, ``digits``, ...), always available;
* a built-in dataset under the data root (:mod:`.torchvision_sets`: ``cifar10``, ``svhn``, ...;
  :mod:`.published`: ``chestxray``, ``kagchest``, ``ham10000``, ``kagskin``, ``mnist_m``);
* ``KIND:ARGUMENT`` for a generic source (``folder:PATH``, ``csv:PATH``, ``npz:PATH``, ``hf:PATH``),
  with options where the kind takes them (``folder:PATH?groups=FILE``: :mod:`.spec_options`);

optionally followed by ``:train``, ``:test`` (or ``:val`` where published): see :mod:`.splits`. A
plain name means all its examples. New kinds plug in with :func:`register_kind`, new named datasets
with :func:`register_dataset`. A map-style ``torch.utils.data.Dataset`` passed instead of a name is
wrapped by :func:`gsd_cli.data.torch_dataset.from_torch_dataset`.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Callable

from ..errors import DatasetError
from .base import ImageSource
from .csvsource import csv_source, hf_source
from .embedded import EMBEDDED
from .files import FolderSource, npz_source
from .published import PUBLISHED, PUBLISHED_ALIASES
from .roots import data_root
from .spec_options import join_options, split_options
from .splits import SPLITS, fixed_split
from .torchvision_sets import TORCHVISION, TORCHVISION_ALIASES, torchvision_source

_NAMED: dict[str, Callable[[], ImageSource]] = dict(EMBEDDED)
_KINDS: dict[str, Callable[..., ImageSource]] = {  # (arg, name, **options of spec_options.KIND_OPTIONS)
    "folder": lambda arg, name, **options: FolderSource(arg, name=name, **options),
    "npz": lambda arg, name: npz_source(arg, name=name),
    "csv": lambda arg, name, **options: csv_source(arg, name=name, **options),
}


def register_dataset(name: str, factory: Callable[[], ImageSource]) -> None:
    """Make ``name`` resolve to ``factory()``."""
    _NAMED[name] = factory


def register_kind(kind: str, factory: Callable[[str, str], ImageSource]) -> None:
    """Make ``kind:ARG`` resolve to ``factory(ARG, full_name)``."""
    _KINDS[kind] = factory


def dataset_names() -> list[str]:
    """Names that resolve with no files: the embedded datasets (and registered ones)."""
    return sorted(_NAMED)


def builtin_names() -> list[str]:
    """Names of the datasets looked for under the data root (torchvision's and the published ones)."""
    return sorted([*TORCHVISION, *PUBLISHED])


def canonical(name: str) -> str:
    """A built-in name with its alias resolved (``fmnist`` -> ``fashionmnist``); others unchanged."""
    return TORCHVISION_ALIASES.get(name, PUBLISHED_ALIASES.get(name, name))


def source_kinds() -> list[str]:
    return sorted([*_KINDS, "hf"])


def spec_paths(spec) -> list[Path]:
    """The files and folders a dataset name reads, found from the name alone (nothing opened): the path
    of ``folder:``/``csv:``/``npz:``/``hf:`` specs and an option's file (``?groups=FILE``); [] for
    other names. For :func:`gsd_cli.report.outputs.check_not_inputs`."""
    if not isinstance(spec, str):
        return []
    kind, sep, arg = spec.partition(":")
    if not sep or not arg or kind not in (*_KINDS, "hf"):
        return []
    path, split = _split_suffix(arg)
    try:
        if split is not None and Path(arg).expanduser().exists():
            path = arg
        path, options = split_options(kind, path, spec)
    except (DatasetError, RuntimeError, OSError):
        return [Path(path)]
    if options and split is None:
        path, _ = _split_suffix(path)
    return [Path(path), *(Path(v) for k, v in options.items() if k == "groups")]


def _split_suffix(spec: str) -> tuple[str, str | None]:
    head, sep, tail = spec.rpartition(":")
    return (head, tail) if sep and head and tail in SPLITS else (spec, None)


def resolve(spec: str | ImageSource, *, root: str | Path | None = None, download: bool = False) -> ImageSource:
    """Turn a dataset name into an :class:`ImageSource` (sources pass through).

    ``root`` is the data root of the built-in datasets (default :func:`gsd_cli.data.roots.default_data_root`);
    ``download=True`` lets torchvision fetch its datasets there.
    """
    if isinstance(spec, ImageSource):
        return spec
    if not isinstance(spec, str) and hasattr(spec, "__getitem__") and hasattr(spec, "__len__"):
        from .torch_dataset import from_torch_dataset

        return from_torch_dataset(spec)
    if not isinstance(spec, str) or not spec:
        raise DatasetError(f"a dataset is named by a string, got {spec!r}")
    if spec in _NAMED:
        return _NAMED[spec]()
    base, split = _split_suffix(spec)
    key = canonical(base)
    if key in TORCHVISION:
        return torchvision_source(key, split, data_root(root), download, name=spec if key == base else None)
    if key in PUBLISHED:
        return PUBLISHED[key](split, data_root(root), name=spec if key == base else None)
    if base in _NAMED and split is not None:
        return fixed_split(_NAMED[base](), split, spec)
    kind, sep, arg = spec.partition(":")
    if sep and (kind in _KINDS or kind == "hf"):
        if not arg:
            raise DatasetError(f"{spec!r}: give a path after '{kind}:'")
        path, split = _split_suffix(arg)
        if split is not None and Path(arg).expanduser().exists():
            path, split = arg, None  # a file really named like 'x:train'
        path, options = split_options(kind, path, spec)
        if options and split is None:  # the split written before the options: folder:PATH:train?groups=FILE
            path, split = _split_suffix(path)
        if kind == "hf":
            return hf_source(path, name=spec, split=split)
        if split is None:
            return _KINDS[kind](path, spec, **options)
        return fixed_split(_KINDS[kind](path, f"{kind}:{join_options(path, options)}", **options), split, spec)
    others = [*builtin_names(), *TORCHVISION_ALIASES, *PUBLISHED_ALIASES]
    close = difflib.get_close_matches(base, list(_NAMED), n=1) or difflib.get_close_matches(base, others, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise DatasetError(
        f"unknown dataset {spec!r}{hint}; use one of {', '.join(dataset_names())}, a built-in "
        f"({', '.join(builtin_names())}; see gsd datasets list) or {', '.join(k + ':PATH' for k in source_kinds())}"
    )
