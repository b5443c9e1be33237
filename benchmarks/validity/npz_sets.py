"""The benchmarks' data sets by name: each an npz file of a data folder, registered with gsd's resolver."""

from __future__ import annotations

import functools
from pathlib import Path


def register_npz(names, directory: Path, prepare: str) -> None:
    """Make each of ``names`` resolvable through :func:`gsd_cli.data.resolve` as ``directory/<name>.npz`` (an npz
    source each); a missing file stops with the command that makes the data (``prepare``)."""
    from gsd_cli.data import register_dataset
    from gsd_cli.data.files import npz_source

    missing = [n for n in names if not (directory / f"{n}.npz").is_file()]
    if missing:
        raise SystemExit(f"missing {missing[:3]}... in {directory}: run {prepare}")
    for n in names:
        register_dataset(n, functools.partial(npz_source, directory / f"{n}.npz", n))
