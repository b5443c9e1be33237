"""Reading an entry of the cache of public subspaces (:mod:`gsd_cli.ranking.cache`) without holding
more than the basis itself: plain file reads by blocks into the preallocated tensor, in the dtype the
basis was computed in (issue 37: a warm rank of a large model must peak no higher than a cold one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch

#: bytes of the stored basis read (and converted) at a time by :meth:`gsd_cli.ranking.cache.SubspaceCache.load`
LOAD_BLOCK = 64 << 20
#: safetensors' dtype names (https://github.com/huggingface/safetensors: the format) -> torch dtypes
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8}


def read_entry(file: Path, h, dtype: "Callable[[dict], torch.dtype | None]"):
    """``(V, s, metadata)`` of the safetensors file ``file``, read with plain file reads (no memory
    map: the mapped file's pages would count as the process's memory beside the tensor they fill) and
    by blocks of :data:`LOAD_BLOCK` bytes straight into the preallocated ``V`` of dtype
    ``dtype(metadata)`` (None: as stored), so a warm rank holds the basis once, in the dtype it was
    computed in: no float64 copy of a float32 basis, no whole-file buffer. Each tensor's shape, dtype
    and stored bytes are fed to ``h`` in the order :func:`gsd_cli.models.digest._tensor_digest` uses. The format: an 8-byte
    little-endian header length, a JSON header (each tensor's dtype, shape and byte offsets after the
    header; ``__metadata__``), the tensors' bytes. Raises ValueError or OSError when the file is not
    such an entry."""
    import numpy as np

    with open(file, "rb", buffering=0) as f:
        n = int.from_bytes(f.read(8), "little")
        if not 2 <= n <= 100 << 20:
            raise ValueError("not a safetensors header")
        header = json.loads(f.read(n))
        meta = dict(header.get("__metadata__") or {})
        want = dtype(meta)
        out = []
        for name in ("V", "s"):
            e = header[name]
            stored, shape = _DTYPES[e["dtype"]], tuple(int(d) for d in e["shape"])
            a, b = (int(x) for x in e["data_offsets"])
            size = torch.empty((), dtype=stored).element_size()
            if b - a != size * int(np.prod(shape, dtype=np.int64)):
                raise ValueError(f"tensor {name}: its byte range does not match its shape")
            t = torch.empty(shape, dtype=want if name == "V" and want is not None else stored)
            h.update(str((shape, str(stored))).encode())
            flat, f_pos = t.reshape(-1), 8 + n + a
            per = max(1, LOAD_BLOCK // size)
            scratch = None if t.dtype == stored else torch.empty(min(per, flat.numel()), dtype=stored)
            for i in range(0, flat.numel(), per):
                blk = flat[i:i + per] if scratch is None else scratch[:min(per, flat.numel() - i)]
                view = blk.view(torch.uint8).numpy()
                f.seek(f_pos + i * size)
                if f.readinto(view) != view.nbytes:
                    raise ValueError(f"tensor {name} is truncated")
                h.update(view)
                if scratch is not None:
                    flat[i:i + blk.numel()] = blk
            out.append(t)
    return out[0], out[1], meta


def computed_dtype(meta: dict) -> "torch.dtype | None":
    """The dtype a cached basis is read into: the one it was computed in, as its entry's ``gsd``
    metadata records it (float64 when not recorded, as entries were read before; as stored when V is
    not a float)."""
    try:
        recorded = json.loads(meta.get("gsd", "{}")).get("dtype", "float64")
    except (ValueError, AttributeError):
        return None
    return {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}.get(recorded)
