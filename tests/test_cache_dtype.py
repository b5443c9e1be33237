"""Issue 37, memory of the cache on large models: a cached basis is read back in the dtype it was
computed in (a float32 basis of the Gram path is not widened to float64), by blocks with plain file
reads (no memory map), its checksum verified block by block."""

import json

import pytest
import torch
from safetensors.torch import save_file

import gsd_cli.ranking.cache as cache_mod
import gsd_cli.ranking.cache_read as cache_read
from gsd_cli.models.digest import _tensor_digest
from gsd_cli.ranking.cache import SubspaceCache
from gsd_cli.distance.side import Subspace

KEY = "cd" * 32


def _basis(p=1001, k=3, dtype=torch.float64):
    V, _ = torch.linalg.qr(torch.randn(p, k, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    return V.to(dtype).contiguous()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_basis_comes_back_in_the_dtype_it_was_computed_in(tmp_path, monkeypatch, dtype):
    cache = SubspaceCache(tmp_path)
    V = _basis(dtype=dtype)
    assert cache.put(KEY, Subspace("x", V, torch.tensor([3.0, 2.0, 1.0], dtype=torch.float64), 10, 0.0, "ghost"))
    got = cache.get(KEY, "x")
    assert got.V.dtype == dtype and got.s.dtype == torch.float64
    assert torch.equal(got.V, V.to(torch.float32).to(dtype))  # stored in float32, nothing else lost
    monkeypatch.setattr(cache_read, "LOAD_BLOCK", 40)  # 10 float32s a block: 301 blocks, the last one short
    assert torch.equal(cache.get(KEY, "x").V, got.V)


def test_blocks_are_checked_and_no_memory_map_is_used(tmp_path, monkeypatch):
    import safetensors

    cache = SubspaceCache(tmp_path)
    cache.put(KEY, Subspace("x", _basis(), torch.ones(3), 10, 0.0, "vmap"))
    monkeypatch.setattr(cache_read, "LOAD_BLOCK", 64)

    def refuse(*a, **k):
        raise AssertionError("safe_open maps the whole file into memory")

    monkeypatch.setattr(safetensors, "safe_open", refuse)
    assert cache.load(KEY) is not None  # read without safetensors' memory-mapped reader
    raw = bytearray(cache.path(KEY).read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit in the middle of V
    cache.path(KEY).write_bytes(bytes(raw))
    assert cache.load(KEY) is None
    cache.path(KEY).write_bytes(bytes(raw[: len(raw) - 100]))  # truncated
    assert cache.load(KEY) is None


def test_an_entry_without_a_recorded_dtype_reads_as_float64(tmp_path):
    """Entries written before the dtype was recorded are read as before (float64)."""
    V, s = _basis(dtype=torch.float32), torch.ones(3, dtype=torch.float64)
    info = {"name": "x", "examples": 10, "engine": "vmap", "schema": cache_mod.SCHEMA, "key": KEY, "sha256": _tensor_digest(V, s)}
    save_file({"V": V, "s": s}, str(tmp_path / f"{KEY}.safetensors"), metadata={"gsd": json.dumps(info)})
    got = SubspaceCache(tmp_path).get(KEY, "x")
    assert got.V.dtype == torch.float64 and torch.equal(got.V, V.to(torch.float64))
