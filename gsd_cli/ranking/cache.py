"""A disk cache of *public* gradient subspaces, so re-ranking recomputes only what changed.

An entry is keyed by the SHA-256 of everything that changes a public subspace: what the sampled
examples are made of (:func:`gsd_cli.data.fingerprint.sample_fingerprint`: the source's name and
kind, the drawn indices, the raw rows of in-memory arrays or the bytes of the drawn files, the
decoders' versions; never the resized model input, which would cost a second decode and resize),
the labels the gradients use, the model (its architecture's description, its weights w0) and the
names of the parameters that get gradients, the input size, channels and transform
(:data:`gsd_cli.data.transform.TRANSFORM`), k, the labels mode, row_norm, the sketch dimension and
its seed. The engine and the device do not enter (they compute the same thing). Nothing in the key
depends on ``id()`` or Python's salted ``hash()``: the same inputs give the same key in every process.
Entries are safetensors files with a JSON header (schema, key, SHA-256 of the tensors) written
atomically; one that does not load, has another schema or key, or whose checksum does not match is
recomputed and replaced, never trusted (entries of schema 1, keyed on the resized input, simply miss;
``clear`` still deletes them). The private subspace is never cached.

A cache that cannot be written (a read-only or full disk, a file where the folder should be) never
costs the ranking: the first failed write prints one warning on stderr (naming ``--no-cache`` and
``$GSD_CACHE_DIR``) and the cache stops writing for the rest of the process; reading what is there
goes on. ``clear`` deletes only gsd's own entries: regular files named ``<64 hex>.safetensors`` whose
safetensors header says they are a gsd entry of a known schema with that key (never a user's
``model.safetensors``, a folder or a symlink), and gsd's own temporary files.

Location: ``$GSD_CACHE_DIR``, else ``$XDG_CACHE_HOME/gsd/subspaces``, else ``$HOME/.cache/gsd/subspaces``
(:func:`cache_dir_or_reason`). A missing ``$HOME`` or ``$XDG_CACHE_HOME`` is never created: without a
usable folder the ranking runs without the cache and says so once.

Size: the entries are capped (:data:`DEFAULT_MAX_BYTES`, 2 GiB; ``gsd cache limit SIZE`` sets it, kept in
the folder's :data:`SETTINGS_FILE`); after each write the least recently used entries (a hit touches its
file's modification time) are deleted until the rest fit. Bases ``V`` are stored in float32 (half the
bytes; a distance moves by less than 1e-6, measured by ``benchmarks/bench_cache_float32.py``) and
read back by blocks in the dtype they were computed in (float64; float32 for the large bases of the
Gram path), so a warm rank holds no more than a cold one (:mod:`gsd_cli.ranking.cache_read`); the
singular values keep their dtype. Temporary files are named
``.gsd-tmp-<64 hex key>.<8 characters>.tmp``; ``clear`` deletes no other name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

from ..data.fingerprint import sample_fingerprint
from ..models.digest import _tensor_digest, model_digest  # noqa: F401 (the cache keys on them)
from ..data.roots import CACHE_ENV as ENV, CALIBRATION_SUBFOLDER, ENTRY_NAME as _ENTRY, STAGE1_SUBFOLDER, cache_dir_or_reason, default_cache_dir  # noqa: F401 (where the cache lives)
from ..data.transform import TRANSFORM
from .cache_read import computed_dtype, read_entry
from ..distance.side import Subspace, sample_labels

#: 2: keyed on what the examples are made of (1: on the resized model input)
SCHEMA = 2
#: every schema gsd has written: ``clear`` deletes entries of these only
KNOWN_SCHEMAS = (1, 2)
#: gsd's temporary files: ``.gsd-tmp-<the entry's 64-hex key>.<mkstemp's 8 characters>.tmp``, a name a
#: user's file does not have by chance (``clear`` deletes these and nothing else that is not an entry)
_TEMP_PREFIX = ".gsd-tmp-"
_TEMP = re.compile(r"\.gsd-tmp-[0-9a-f]{64}\.[a-z0-9_]{8}\.tmp")
#: the cache's settings (its size cap), in the cache folder
SETTINGS_FILE = "gsd-cache-settings.json"
#: the default size cap of the cache's entries: least recently used entries are deleted beyond it
DEFAULT_MAX_BYTES = 2 * 2**30


def parse_size(text: str | int) -> int:
    """``2G``, ``512M``, ``100k``, ``0`` or a byte count -> bytes (powers of 1024); else GSDError."""
    from ..errors import GSDError

    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise GSDError(f"size {text!r}: give bytes or a number with K, M, G or T (e.g. 2G, 500M)")
    value = float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")
    if value > 2**62:
        raise GSDError(f"size {text!r} is too large; give at most 4E bytes")
    return int(value)


class SubspaceCache:
    """Public subspaces on disk under ``directory`` (default :func:`default_cache_dir`).

    ``hits`` and ``misses`` count lookups in this process. ``write_error`` is the reason of the first
    write that failed (then nothing more is written; ``warn``, default a line on stderr, was called once).
    """

    def __init__(self, directory: str | Path | None = None, warn: Callable[[str], None] | None = None):
        self.unusable: str | None = None  # why there is no cache folder (then nothing is read or written)
        if directory is not None:
            self.directory = Path(directory).expanduser()
        else:
            self.directory, self.unusable = cache_dir_or_reason()
        self.hits = 0
        self.misses = 0
        self.write_error: str | None = None
        self._warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr, flush=True))
        if self.unusable is not None:
            self.write_error = self.unusable  # nothing is written (get says so once)

    # -- size cap ------------------------------------------------------------------------------------
    def max_bytes(self) -> int:
        """The size cap of the entries (:data:`DEFAULT_MAX_BYTES` unless set by :meth:`set_max_bytes`)."""
        try:
            value = json.loads((self.directory / SETTINGS_FILE).read_text(encoding="utf-8")).get("max_bytes")
        except (OSError, ValueError, AttributeError, TypeError):
            return DEFAULT_MAX_BYTES
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else DEFAULT_MAX_BYTES

    def set_max_bytes(self, value: int) -> dict:
        """Set the size cap (kept in the folder's :data:`SETTINGS_FILE`) and evict down to it; returns :meth:`evict`'s."""
        if self.directory is None:
            from ..errors import GSDError

            raise GSDError(f"no cache folder ({self.unusable}); set {ENV} to a folder")
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f"{_TEMP_PREFIX}settings.", suffix=".tmp", dir=self.directory)  # atomically, as entries
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps({"max_bytes": int(value)}) + "\n")
            os.replace(tmp, self.directory / SETTINGS_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.evict()

    def evict(self, keep: str | None = None) -> dict:
        """Delete the least recently used entries (oldest modification time: a hit touches its entry)
        until the entries fit the size cap; the entry ``keep`` (just written) goes last. Returns
        ``deleted`` and ``bytes`` freed."""
        done = {"deleted": 0, "bytes": 0}
        if self.directory is None:
            return done
        cap = self.max_bytes()
        entries = []
        for f in self.scan()["entries"]:
            try:
                st = f.stat()
            except OSError:
                continue
            entries.append((f.stem == keep, st.st_mtime, f, st.st_size))
        total = sum(e[3] for e in entries)
        for _, _, f, size in sorted(entries, key=lambda e: (e[0], e[1])):
            if total <= cap:
                break
            try:
                f.unlink()
            except OSError:
                continue
            total -= size
            done["deleted"] += 1
            done["bytes"] += size
        return done

    # -- keys ------------------------------------------------------------------------------------
    @staticmethod
    def key(model, sample, labels: torch.Tensor, settings: dict) -> str:
        """SHA-256 of ``settings``, the fingerprint of ``sample`` (what its drawn examples are made of:
        :func:`gsd_cli.data.fingerprint.sample_fingerprint`), its ``labels`` and the model (its
        description and weights: :func:`model_digest`)."""
        h = hashlib.sha256()
        doc = {"schema": SCHEMA, **settings, "sample": sample_fingerprint(sample.source, sample.indices),
               "model_digest": model_digest(model)}
        h.update(json.dumps(doc, sort_keys=True, default=str).encode())
        h.update(_tensor_digest(labels).encode())
        return h.hexdigest()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.safetensors"

    # -- entries -----------------------------------------------------------------------------------
    def load(self, key: str) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
        """``(V, s, meta)`` of a valid entry, else None (missing, unreadable, stale or corrupt). V
        comes in the dtype its basis was computed in (the entry's ``dtype``: float64, or float32 for the
        large bases of the Gram path; float64 for entries written before it was recorded), read from the
        file by blocks (:func:`gsd_cli.ranking.cache_read.read_entry`)."""
        if self.directory is None:
            if self.unusable is not None and not getattr(self, "_said", False):  # said once, on the first lookup
                self._said = True
                self._warn(f"no cache folder ({self.unusable}): ranking without the cache of public subspaces; "
                           f"set {ENV} to a folder to cache them")
            return None
        file = self.path(key)
        try:
            if not file.is_file():
                return None
            h = hashlib.sha256()
            V, s, meta = read_entry(file, h, computed_dtype)
            info = json.loads(meta.get("gsd", "{}"))
        except Exception:
            return None
        if info.get("schema") != SCHEMA or info.get("key") != key or info.get("sha256") != h.hexdigest():
            return None
        return V, s, info

    def store(self, key: str, V: torch.Tensor, s: torch.Tensor, info: dict) -> None:
        """Write an entry atomically (temporary file, then rename)."""
        from safetensors.torch import save_file

        self.directory.mkdir(parents=True, exist_ok=True)
        # V in float32: half the bytes, and the distance moves by < 1e-6 (benchmarks/bench_cache_float32.py);
        # read back in the dtype it was computed in (``dtype``), so a warm rank holds what a cold one does
        dtype = str(V.dtype).removeprefix("torch.")
        V = V.detach().cpu().to(torch.float32 if V.is_floating_point() else V.dtype).contiguous()
        s = s.detach().cpu().contiguous()
        meta = {"gsd": json.dumps({**info, "schema": SCHEMA, "key": key, "sha256": _tensor_digest(V, s), "dtype": dtype})}
        fd, tmp = tempfile.mkstemp(prefix=f"{_TEMP_PREFIX}{key}.", suffix=".tmp", dir=self.directory)
        os.close(fd)
        try:
            save_file({"V": V, "s": s}, tmp, metadata=meta)
            os.replace(tmp, self.path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, key: str, name: str) -> "Subspace | None":
        """The cached subspace for ``key`` (a hit), else None (a miss)."""
        hit = self.load(key)
        if hit is None:
            self.misses += 1
            return None
        self.hits += 1
        try:
            os.utime(self.path(key))  # least recently used goes first (evict)
        except OSError:
            pass
        V, s, info = hit
        return Subspace(name, V, s, int(info["examples"]), 0.0, info.get("engine", "") + " (cached)")

    def put(self, key: str, sub: "Subspace") -> bool:
        """Store a computed subspace under ``key``; False when the cache cannot be written (warned once,
        then no further write is tried): a cache never fails a ranking."""
        if self.write_error is not None:
            return False
        try:
            need = sub.V.numel() * 4 + sub.s.numel() * sub.s.element_size()
            cap = self.max_bytes()
            if need > cap:
                self.write_error = f"an entry of {need / 2**20:.1f} MiB is larger than the cache's cap"
                self._warn(f"not caching a public subspace of {need / 2**20:.1f} MiB: the cache's size cap is "
                           f"{cap / 2**20:.1f} MiB (raise it with gsd cache limit SIZE)")
                return False
            self.store(key, sub.V, sub.s, {"name": sub.name, "examples": sub.examples, "engine": sub.engine})
            self.evict(keep=key)
            return True
        except Exception as e:  # OSError (read-only, full, a file in the way) or safetensors' own error
            self.write_error = " ".join(f"{type(e).__name__}: {e}".split())
            self._warn(f"cannot write the cache of public subspaces in {self.directory} ({self.write_error}); "
                       f"ranking without caching. Use --no-cache, or set {ENV} to a writable folder.")
            return False

    # -- maintenance -------------------------------------------------------------------------------
    def is_entry(self, file: Path) -> bool:
        """Whether ``file`` is one of gsd's entries: a regular file (not a symlink) named
        ``<64 hex>.safetensors`` whose header says it is a gsd entry of a known schema with that key."""
        from safetensors import safe_open

        if not _ENTRY.fullmatch(file.name) or file.is_symlink() or not file.is_file():
            return False
        try:
            with safe_open(str(file), framework="pt") as f:
                info = json.loads((f.metadata() or {}).get("gsd", "{}"))
        except Exception:
            return False
        return isinstance(info, dict) and info.get("schema") in KNOWN_SCHEMAS and info.get("key") == file.stem

    def scan(self) -> dict:
        """What the folder holds: ``entries`` (gsd's), ``temporary`` (gsd's unfinished writes), ``other``
        (everything else, never touched), ``stage1`` (the second phase's stage-1 models in ``stage1/``), each a list
        of paths; ``calibrations``: the number of noise
        calibrations in ``calibration/`` (:mod:`gsd_cli.privacy.calibration_cache`; gsd's, kept by
        :meth:`clear`); ``problem`` when it is not a folder."""
        found: dict = {"entries": [], "temporary": [], "other": [], "calibrations": 0, "stage1": [], "problem": None}
        if self.directory is None:
            found["problem"] = f"no cache folder ({self.unusable})"
            return found
        if not self.directory.exists():
            return found
        if not self.directory.is_dir():
            found["problem"] = "not a folder"
            return found
        try:
            files = sorted(self.directory.iterdir())
        except OSError as e:
            found["problem"] = f"cannot be read ({e.strerror or e})"
            return found
        for f in files:
            if f.name == CALIBRATION_SUBFOLDER and f.is_dir() and not f.is_symlink():  # gsd's noise calibrations: kept
                found["calibrations"] = _count_json(f)
            elif f.name == STAGE1_SUBFOLDER and f.is_dir() and not f.is_symlink():  # stage-1 models (gsd cache clear: stage1_cache.clear)
                found["stage1"] = _entries(f)
            elif f.name == SETTINGS_FILE:  # the size cap: kept
                continue
            elif self.is_entry(f):
                found["entries"].append(f)
            elif _TEMP.fullmatch(f.name) and f.is_file() and not f.is_symlink():
                found["temporary"].append(f)
            else:
                found["other"].append(f)
        return found

    def info(self) -> dict:
        """Where the cache is; how many gsd entries and bytes it holds, how many noise calibrations
        (``calibrations``) and stage-1 models (``stage1``, ``stage1_bytes``), and how many other files it leaves alone (``other``, ``other_names``: the
        first few)."""
        found = self.scan()
        return {"directory": str(self.directory), "entries": len(found["entries"]), "max_bytes": self.max_bytes() if self.directory else None,
                "bytes": sum(_size(f) for f in found["entries"]), "temporary": len(found["temporary"]),
                "other": len(found["other"]), "other_names": [f.name for f in found["other"][:5]],
                "calibrations": found["calibrations"], "stage1": len(found["stage1"]),
                "stage1_bytes": sum(_size(f) for f in found["stage1"]), "problem": found["problem"]}

    def clear(self) -> dict:
        """Delete gsd's entries and temporary files, nothing else. Returns ``deleted`` (entries),
        ``bytes`` (theirs), ``temporary``, ``left`` (other files kept), ``left_names`` (the first few),
        ``calibrations`` (noise calibrations, kept: they are checked on every use and cheap to keep),
        ``failed`` (entries that could not be deleted) and ``problem`` (the folder is not one)."""
        found = self.scan()
        done = {"directory": str(self.directory), "deleted": 0, "bytes": 0, "temporary": 0, "failed": [],
                "left": len(found["other"]), "left_names": [f.name for f in found["other"][:5]],
                "calibrations": found["calibrations"], "problem": found["problem"]}
        for kind, files in (("deleted", found["entries"]), ("temporary", found["temporary"])):
            for f in files:
                size = _size(f)
                try:
                    f.unlink(missing_ok=True)
                except OSError as e:
                    done["failed"].append(f"{f.name} ({e.strerror or e})")
                    continue
                done[kind] += 1
                done["bytes"] += size if kind == "deleted" else 0
        return done


def _entries(folder: Path) -> list[Path]:
    """The files of ``folder`` named as gsd's entries (``<64 hex>.safetensors``)."""
    try:
        return [f for f in sorted(folder.iterdir()) if _ENTRY.fullmatch(f.name) and f.is_file() and not f.is_symlink()]
    except OSError:
        return []


def _count_json(folder: Path) -> int:
    try:
        return sum(1 for f in folder.iterdir() if f.suffix == ".json" and f.is_file())
    except OSError:
        return 0


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0


def public_cache_key(cache: SubspaceCache | None, model, sample, common: dict) -> str | None:
    """The disk-cache key of a public ``sample``'s subspace under :func:`gsd_cli.distance.side.sample_subspace`'s
    keyword arguments ``common``, or None when it is not cached (no cache; a custom loss function,
    which cannot be hashed)."""
    if cache is None or common.get("loss") is not None:
        return None
    from ..models.spec import model_identity

    labels = sample_labels(sample, common["labels"], common["num_classes"], common["seed"])
    settings = {
        "k": common["k"], "names": list(common["names"]), "row_norm": common["row_norm"], "labels": common["labels"],
        "input_size": common["input_size"], "channels": common["channels"], "num_classes": common["num_classes"],
        "transform": TRANSFORM, "sketch": common.get("sketch_dim"), "subspace_method": common.get("subspace_method", "auto"),
        "sketch_seed": common["seed"] if common.get("sketch_dim") else None,
        "model": model_identity(model, weights=False), "examples": len(sample),  # class, code, origin (weights: model_digest)
    }
    return SubspaceCache.key(model, sample, labels, settings)
