"""The disk cache of public subspaces: hits counted by gradient computations, never by timing."""

import numpy as np
import pytest
import torch

import gsd_cli.ranking as ranking
import gsd_cli.distance.side as side
from gsd_cli.ranking.cache import SubspaceCache
from gsd_cli.cli import main

OPTS = dict(k=2, examples=16, engine="vmap")


@pytest.fixture
def grad_counter(monkeypatch):
    calls = []
    real = side.gradient_matrix  # every side's gradients are computed in gsd_cli.distance.side

    def counting(model, batches, n, *a, **k):
        calls.append(n)
        return real(model, batches, n, *a, **k)

    monkeypatch.setattr(side, "gradient_matrix", counting)
    return calls


def test_hit_skips_gradients_and_gives_the_same_ranking(tmp_path, npz_pair, grad_counter):
    cache = SubspaceCache(tmp_path / "c")
    priv, near, far = (f"npz:{npz_pair[n]}" for n in ("priv", "near", "far"))
    first = ranking.rank(priv, [near, far], cache=cache, **OPTS)
    assert len(grad_counter) == 3 and (cache.hits, cache.misses) == (0, 2)
    grad_counter.clear()
    again = ranking.rank(priv, [near, far], cache=cache, **OPTS)
    assert len(grad_counter) == 1  # only the private sample (never cached)
    assert cache.hits == 2
    assert [r.public for r in again] == [r.public for r in first]
    # bases cached in float32 (issue 36): a distance moves by ~1e-9 (benchmarks/bench_cache_float32.py)
    assert [r.distance for r in again] == pytest.approx([r.distance for r in first], abs=1e-7)
    # a setting that changes the result misses; the engine does not enter the key
    grad_counter.clear()
    ranking.rank(priv, [near, far], cache=cache, **{**OPTS, "row_norm": "none"})
    assert len(grad_counter) == 3
    grad_counter.clear()
    ranking.rank(priv, [near, far], cache=cache, **{**OPTS, "engine": "hooks"})
    assert len(grad_counter) == 1
    # a new candidate: only it is computed
    grad_counter.clear()
    ranking.rank(priv, [near, far, "digits:test"], cache=cache, **OPTS)
    assert len(grad_counter) == 2
    # other weights (seed) or other examples miss
    grad_counter.clear()
    ranking.rank(priv, [near, far], cache=cache, **{**OPTS, "seed": 1})
    assert len(grad_counter) == 3


def test_key_follows_content_not_name(tmp_path, npz_pair, grad_counter):
    cache = SubspaceCache(tmp_path / "c")
    priv, near = f"npz:{npz_pair['priv']}", f"npz:{npz_pair['near']}"
    ranking.rank(priv, [near], cache=cache, **OPTS)
    x = np.load(npz_pair["near"])["x"].copy()
    x[:, 0, 0] = 255 - x[:, 0, 0]  # same name, other pixels
    np.savez(npz_pair["near"], x=x, y=np.load(npz_pair["priv"])["y"])
    grad_counter.clear()
    ranking.rank(priv, [near], cache=cache, **OPTS)
    assert len(grad_counter) == 2


def test_corrupt_or_stale_entry_is_recomputed(tmp_path, npz_pair, grad_counter):
    cache = SubspaceCache(tmp_path / "c")
    priv, near = f"npz:{npz_pair['priv']}", f"npz:{npz_pair['near']}"
    good = ranking.rank(priv, [near], cache=cache, **OPTS)
    (entry,) = list((tmp_path / "c").glob("*.safetensors"))
    raw = bytearray(entry.read_bytes())
    raw[-8:] = bytes(8 * [0x7F])  # flip tensor bytes: checksum no longer matches
    entry.write_bytes(bytes(raw))
    grad_counter.clear()
    again = ranking.rank(priv, [near], cache=cache, **OPTS)
    assert len(grad_counter) == 2 and again[0].distance == pytest.approx(good[0].distance, abs=1e-12)
    entry.write_bytes(b"garbage")  # unreadable
    grad_counter.clear()
    ranking.rank(priv, [near], cache=cache, **OPTS)
    assert len(grad_counter) == 2
    # a valid file stored under another key (e.g. renamed) is stale
    key = entry.stem
    V, s, info = cache.load(key)
    cache.store("0" * 64, V, s, info)
    (tmp_path / "c" / ("0" * 64 + ".safetensors")).replace(entry)
    assert cache.load(key) is None
    grad_counter.clear()
    ranking.rank(priv, [near], cache=cache, **OPTS)
    assert len(grad_counter) == 2 and cache.load(key) is not None


def test_cli_no_cache_and_cache_commands(tmp_path, npz_pair, grad_counter, monkeypatch, capsys):
    monkeypatch.setenv("GSD_CACHE_DIR", str(tmp_path / "cli"))
    args = ["rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}",
            "-k", "2", "-m", "16", "-q", "--engine", "vmap"]
    assert main(args) == 0 and len(grad_counter) == 2
    grad_counter.clear()
    assert main(args) == 0 and len(grad_counter) == 1
    grad_counter.clear()
    assert main(args + ["--no-cache"]) == 0 and len(grad_counter) == 2
    assert main(["cache", "info"]) == 0
    assert "1 entries" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "deleted 1" in capsys.readouterr().out
    assert SubspaceCache().info()["entries"] == 0


def test_private_subspace_never_cached(tmp_path, npz_pair):
    cache = SubspaceCache(tmp_path / "c")
    ranking.rank(f"npz:{npz_pair['priv']}", [f"npz:{npz_pair['near']}", f"npz:{npz_pair['far']}"], cache=cache, **OPTS)
    names = sorted(__import__("json").loads(
        __import__("safetensors").safe_open(str(f), "pt").metadata()["gsd"])["name"] for f in (tmp_path / "c").glob("*.safetensors"))
    assert names == sorted([f"npz:{npz_pair['near']}", f"npz:{npz_pair['far']}"])
    assert torch.is_tensor(cache.load(next((tmp_path / "c").glob("*.safetensors")).stem)[0])
