"""Dataset names -> sources.

A name is an embedded dataset (``mnist-a``, ``digits``, ...) or ``KIND:ARGUMENT`` for a generic source
(``folder:PATH``, ``npz:PATH``). New kinds plug in with :func:`register_kind`, new named datasets with
:func:`register_dataset`.
"""

from __future__ import annotations

import difflib
from typing import Callable

from ..errors import DatasetError
from .base import ImageSource
from .embedded import EMBEDDED
from .files import FolderSource, npz_source

_NAMED: dict[str, Callable[[], ImageSource]] = dict(EMBEDDED)
_KINDS: dict[str, Callable[[str, str], ImageSource]] = {
    "folder": lambda arg, name: FolderSource(arg, name=name),
    "npz": lambda arg, name: npz_source(arg, name=name),
}


def register_dataset(name: str, factory: Callable[[], ImageSource]) -> None:
    """Make ``name`` resolve to ``factory()``."""
    _NAMED[name] = factory


def register_kind(kind: str, factory: Callable[[str, str], ImageSource]) -> None:
    """Make ``kind:ARG`` resolve to ``factory(ARG, full_name)``."""
    _KINDS[kind] = factory


def dataset_names() -> list[str]:
    return sorted(_NAMED)


def source_kinds() -> list[str]:
    return sorted(_KINDS)


def resolve(spec: str | ImageSource) -> ImageSource:
    """Turn a dataset name into an :class:`ImageSource` (sources pass through)."""
    if isinstance(spec, ImageSource):
        return spec
    if not isinstance(spec, str) or not spec:
        raise DatasetError(f"a dataset is named by a string, got {spec!r}")
    if spec in _NAMED:
        return _NAMED[spec]()
    kind, sep, arg = spec.partition(":")
    if sep and kind in _KINDS:
        if not arg:
            raise DatasetError(f"{spec!r}: give a path after '{kind}:'")
        return _KINDS[kind](arg, spec)
    close = difflib.get_close_matches(spec, list(_NAMED), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise DatasetError(
        f"unknown dataset {spec!r}{hint}; use one of {', '.join(dataset_names())} "
        f"or {', '.join(k + ':PATH' for k in source_kinds())}"
    )
