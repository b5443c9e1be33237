"""Where built-in datasets are looked for: ``--data-root`` > ``$GSD_DATA_ROOT`` > the per-user data
folder ``$XDG_DATA_HOME/gsd`` (``~/.local/share/gsd`` when ``XDG_DATA_HOME`` is unset)."""

from __future__ import annotations

import os
from pathlib import Path

ENV = "GSD_DATA_ROOT"


def default_data_root() -> Path:
    """``$GSD_DATA_ROOT``, else ``$XDG_DATA_HOME/gsd``, else ``~/.local/share/gsd``."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "gsd"


def data_root(root: str | Path | None = None) -> Path:
    """The data root to use: ``root`` when given, else :func:`default_data_root`."""
    return Path(root).expanduser() if root is not None else default_data_root()
