"""A disk cache of *public* gradient subspaces, so re-ranking recomputes only what changed.

An entry is keyed by the SHA-256 of everything that changes a public subspace: the content of the
sampled examples (the model input of the drawn indices, and their labels for the gradients), the
model's weights w0 and the names of the parameters that get gradients, k, row_norm, the sketch
dimension and its seed. The engine and the device do not enter (they compute the same thing).
Entries are safetensors files with a JSON header (schema, key, SHA-256 of the tensors) written
atomically; one that does not load, has another schema or key, or whose checksum does not match is
recomputed and replaced, never trusted. The private subspace is never cached.

Location: ``$GSD_CACHE_DIR``, else ``$XDG_CACHE_HOME/gsd/subspaces``, else ``~/.cache/gsd/subspaces``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
import torch

from .side import Subspace, sample_labels

SCHEMA = 1
ENV = "GSD_CACHE_DIR"


def default_cache_dir() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "gsd" / "subspaces"


def _tensor_digest(*tensors: torch.Tensor) -> str:
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class SubspaceCache:
    """Public subspaces on disk under ``directory`` (default :func:`default_cache_dir`).

    ``hits`` and ``misses`` count lookups in this process.
    """

    def __init__(self, directory: str | Path | None = None):
        self.directory = Path(directory).expanduser() if directory is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0

    # -- keys ------------------------------------------------------------------------------------
    @staticmethod
    def key(model, sample, labels: torch.Tensor, settings: dict) -> str:
        """SHA-256 of the model input and labels of ``sample``, the weights and ``settings``."""
        h = hashlib.sha256()
        h.update(json.dumps({"schema": SCHEMA, **settings}, sort_keys=True, default=str).encode())
        h.update(_tensor_digest(*[p for _, p in sorted(model.state_dict().items())]).encode())
        h.update(_tensor_digest(labels).encode())
        for _, x in sample.batches(settings["input_size"], settings["channels"], 256, "cpu"):
            h.update(_tensor_digest(x).encode())
        return h.hexdigest()

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.safetensors"

    # -- entries -----------------------------------------------------------------------------------
    def load(self, key: str) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
        """``(V, s, meta)`` of a valid entry, else None (missing, unreadable, stale or corrupt)."""
        from safetensors import safe_open

        file = self.path(key)
        if not file.is_file():
            return None
        try:
            with safe_open(str(file), framework="pt") as f:
                meta = dict(f.metadata() or {})
                V, s = f.get_tensor("V"), f.get_tensor("s")
            info = json.loads(meta.get("gsd", "{}"))
        except Exception:
            return None
        if info.get("schema") != SCHEMA or info.get("key") != key or info.get("sha256") != _tensor_digest(V, s):
            return None
        return V, s, info

    def store(self, key: str, V: torch.Tensor, s: torch.Tensor, info: dict) -> None:
        """Write an entry atomically (temporary file, then rename)."""
        from safetensors.torch import save_file

        self.directory.mkdir(parents=True, exist_ok=True)
        V, s = V.detach().cpu().contiguous(), s.detach().cpu().contiguous()
        meta = {"gsd": json.dumps({**info, "schema": SCHEMA, "key": key, "sha256": _tensor_digest(V, s)})}
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.directory)
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
        V, s, info = hit
        return Subspace(name, V.to(torch.float64), s, int(info["examples"]), 0.0, info.get("engine", "") + " (cached)")

    def put(self, key: str, sub: "Subspace") -> None:
        """Store a computed subspace under ``key``."""
        self.store(key, sub.V, sub.s, {"name": sub.name, "examples": sub.examples, "engine": sub.engine})

    # -- maintenance -------------------------------------------------------------------------------
    def info(self) -> dict:
        """Where the cache is, how many entries and bytes it holds."""
        files = list(self.directory.glob("*.safetensors")) if self.directory.is_dir() else []
        return {"directory": str(self.directory), "entries": len(files), "bytes": sum(f.stat().st_size for f in files)}

    def clear(self) -> int:
        """Delete every entry (and stray temporary files); returns how many entries were deleted."""
        if not self.directory.is_dir():
            return 0
        n = 0
        for f in self.directory.iterdir():
            if f.suffix == ".safetensors" or f.name.endswith(".tmp"):
                f.unlink(missing_ok=True)
                n += f.suffix == ".safetensors"
        return n


def public_cache_key(cache: SubspaceCache | None, model, sample, common: dict) -> str | None:
    """The disk-cache key of a public ``sample``'s subspace under :func:`gsd_cli.side.sample_subspace`'s
    keyword arguments ``common``, or None when it is not cached (no cache; a custom loss function,
    which cannot be hashed)."""
    if cache is None or common.get("loss") is not None:
        return None
    labels = sample_labels(sample, common["labels"], common["num_classes"], common["seed"])
    settings = {
        "k": common["k"], "names": list(common["names"]), "row_norm": common["row_norm"],
        "input_size": common["input_size"], "channels": common["channels"], "num_classes": common["num_classes"],
        "sketch": common.get("sketch_dim"), "sketch_seed": common["seed"] if common.get("sketch_dim") else None,
        "model": type(model).__name__, "examples": len(sample),
    }
    return SubspaceCache.key(model, sample, labels, settings)
