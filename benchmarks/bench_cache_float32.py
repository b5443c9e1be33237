"""How far a distance moves when the cached public bases are stored in float32 (issue 36).

Ranks the private set against the candidates twice with one fresh cache: the cold run computes every
public basis (float64) and stores it (float32); the warm run reads the float32 bases back. The
private side is not cached, so the only difference is the rounding of the public bases. Prints the
largest absolute difference of the distances, the entry sizes, and the load average.

    python benchmarks/bench_cache_float32.py                    # embedded MNIST halves, probe, m=500
    python benchmarks/bench_cache_float32.py --model fmnist-cnn --examples 1000 --k 16
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_cache_float32
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import tempfile
from pathlib import Path

from gsd_cli.ranking.cache import SubspaceCache
from gsd_cli.defaults import DEFAULT_PRIVATE, DEFAULT_PUBLIC
from gsd_cli.ranking import RankConfig, rank

from .harness import add_json, write_json


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="probe")
    ap.add_argument("--examples", type=int, default=500)
    ap.add_argument("--k", type=int, default=16)
    add_json(ap)
    a = ap.parse_args(argv)
    config = RankConfig.from_options(k=a.k, examples=a.examples, model=a.model, seed=0)
    with tempfile.TemporaryDirectory() as d:
        cache = SubspaceCache(d)
        cold = rank(DEFAULT_PRIVATE, DEFAULT_PUBLIC, config, cache=cache)
        warm = rank(DEFAULT_PRIVATE, DEFAULT_PUBLIC, config, cache=cache)
        sizes = [f.stat().st_size for f in Path(d).glob("*.safetensors")]
    assert cache.hits == len(DEFAULT_PUBLIC), cache.hits
    d64 = {r.public: r.distance for r in cold}
    d32 = {r.public: r.distance for r in warm}
    diff = {n: abs(d64[n] - d32[n]) for n in d64}
    load = open("/proc/loadavg").read().split()[:3]
    doc = {"model": a.model, "examples": a.examples, "k": a.k, "distances_float64": d64, "abs_difference": diff,
           "max_abs_difference": max(diff.values()), "entry_bytes_float32": sizes, "loadavg": load}
    print(json.dumps(doc, indent=2))
    write_json(a.json, doc, indent=2)


if __name__ == "__main__":
    main()
