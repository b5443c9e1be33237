"""Where built-in datasets are looked for: ``--data-root`` > ``$GSD_DATA_ROOT`` > the per-user data
folder ``$XDG_DATA_HOME/gsd`` (``~/.local/share/gsd`` when ``XDG_DATA_HOME`` is unset)."""

from __future__ import annotations

import os
import re
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


# --- where gsd keeps its caches (the subspace cache, gsd_cli.ranking.cache; noise calibrations,
# gsd_cli.privacy.calibration_cache): here, below both, so that privacy does not import the ranking's cache

CACHE_ENV = "GSD_CACHE_DIR"
#: The subfolder where gsd keeps noise calibrations (:mod:`gsd_cli.privacy.calibration_cache`).
CALIBRATION_SUBFOLDER = "calibration"
#: the subfolder of the cache folder with the second phase's stage-1 models (:mod:`gsd_cli.train.second_phase.stage1_cache`)
STAGE1_SUBFOLDER = "stage1"
#: the name of a gsd cache entry file, a public subspace in the cache folder or a stage-1 model in ``stage1/``: its key
#: (SHA-256, lower-case hex) and ``.safetensors``; gsd lists, counts and deletes no other file
ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.safetensors")


def cache_dir_or_reason() -> tuple[Path | None, str | None]:
    """``(folder, None)`` of the cache: ``$GSD_CACHE_DIR``, else ``$XDG_CACHE_HOME/gsd/subspaces`` when
    ``$XDG_CACHE_HOME`` is an existing folder, else ``$HOME/.cache/gsd/subspaces`` when ``$HOME`` is one;
    else ``(None, why)``: a missing ``$HOME`` or ``$XDG_CACHE_HOME`` is never created, and with ``$HOME``
    unset the cache is off (the password database's home may be another user's, under sudo)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser(), None
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        if not os.path.isabs(xdg) or not os.path.isdir(xdg):
            return None, f"XDG_CACHE_HOME={xdg} is not an existing folder"
        return Path(xdg) / "gsd" / "subspaces", None
    home = os.environ.get("HOME")
    if not home:
        return None, "HOME is not set"
    if not os.path.isabs(home) or not os.path.isdir(home):
        return None, f"HOME={home} is not an existing folder"
    return Path(home) / ".cache" / "gsd" / "subspaces", None


def default_cache_dir() -> Path | None:
    """The cache folder (:func:`cache_dir_or_reason`), or None when there is no usable one."""
    return cache_dir_or_reason()[0]
