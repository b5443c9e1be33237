"""Issue 21: the input pipeline and the public cache key of ``gsd rank``, old against new, in one run.

Per default embedded set (``gsd datasets list``; the default ``gsd rank`` draws m=2000 of each and
feeds the probe network 224x224x3): the seconds to load + resize + convert the drawn sample

* old: grey images repeated to 3 channels, then every channel resized, then normalised;
* new: :func:`gsd_cli.data.transform.to_model_input` (one channel resized, normalised, then repeated),

checked equal (``torch.equal``), and the seconds of the public cache key

* old: every drawn example loaded and resized again and the 224x224x3 float tensors hashed (the
  schema-1 key), plus the weights;
* new: :func:`gsd_cli.ranking.cache.public_cache_key` (raw rows / file bytes, labels, settings, weights).

``--overlap``: seconds of :func:`gsd_cli.distance.side.sample_subspace` on one set with the input prepared in
the caller's thread (``prefetch=0``) and by the background thread (``prefetch=1``).

``--rank``: wall seconds of the default ``gsd rank -q`` (as a subprocess), cold (a fresh
``GSD_CACHE_DIR``) then warm (the same folder again), for each ``--src`` given (a checkout's root put
first on ``PYTHONPATH``, e.g. an export of the commit before this change) and for this checkout.

    nice -n 10 python benchmarks/bench_input.py --threads 1 --json benchmarks/results/cpu_input.json
    git archive HEAD | tar -x -C /tmp/gsd-before
    nice -n 10 python benchmarks/bench_input.py --rank --src /tmp/gsd-before --skip-input

Every figure is the minimum of ``--repeats`` runs; ``os.getloadavg()`` is recorded before and after
(the machine may be shared: compare ratios taken in one run, not absolute seconds across runs).
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_input
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from gsd_cli import data as gdata
from gsd_cli.ranking.cache import SubspaceCache, _tensor_digest, public_cache_key
from gsd_cli.data.base import read_images
from gsd_cli.data.transform import to_model_input
from gsd_cli.gradients import select_parameters
from gsd_cli.distance.side import sample_labels, sample_subspace
from probes import get_model_spec

from .harness import add_json, write_json

CHUNK = 256


def old_to_model_input(images, size: int, channels: int) -> torch.Tensor:
    """gsd's transform before issue 21: channels first (grey repeated), then the resize, then normalise."""
    out = torch.empty(len(images), channels, size, size)
    groups: dict = {}
    for i, img in enumerate(images):
        groups.setdefault(img.shape, []).append(i)
    for idx in groups.values():
        batch = torch.from_numpy(np.stack([images[i] for i in idx]).astype(np.float32, copy=False))
        batch = batch.unsqueeze(1) if batch.ndim == 3 else batch.permute(0, 3, 1, 2)
        if batch.shape[1] == 1 and channels > 1:
            batch = batch.expand(-1, channels, -1, -1)
        elif batch.shape[1] == 3 and channels == 1:
            batch = (batch * torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)).sum(1, keepdim=True)
        if batch.shape[-2:] != (size, size):
            batch = F.interpolate(batch, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out[torch.tensor(idx)] = batch
    return (out - 0.5) / 0.5


def chunks(sample, size, channels, transform):
    for start in range(0, len(sample), CHUNK):
        yield transform(read_images(sample.source, sample.indices[start : start + CHUNK]), size, channels)


def consume(it) -> int:
    """Run the chunks through, keeping none (as the gradient loop does)."""
    return sum(x.shape[0] for x in it)


def old_key(net, sample, labels, size, channels) -> str:
    """The schema-1 key's work: the weights, the labels and every resized chunk hashed."""
    h = hashlib.sha256()
    h.update(_tensor_digest(*[p for _, p in sorted(net.state_dict().items())]).encode())
    h.update(_tensor_digest(labels).encode())
    for x in chunks(sample, size, channels, old_to_model_input):
        h.update(_tensor_digest(x).encode())
    return h.hexdigest()


def best(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), out


def bench_input(args, spec, net, names) -> list[dict]:
    rows = []
    common = dict(k=16, names=names, row_norm="unit", labels="random", input_size=spec.input_size,
                  channels=spec.channels, num_classes=10, seed=0, sketch_dim=None, loss=None)
    cache = SubspaceCache(tempfile.mkdtemp())
    for name in (gdata.DEFAULT_PRIVATE, *gdata.DEFAULT_PUBLIC):
        sample = gdata.draw(gdata.resolve(name), args.m, 0)
        size, ch = spec.input_size, spec.channels
        t_old, _ = best(lambda: consume(chunks(sample, size, ch, old_to_model_input)), args.repeats)
        t_new, _ = best(lambda: consume(chunks(sample, size, ch, to_model_input)), args.repeats)
        same = all(torch.equal(a, b) for a, b in zip(chunks(sample, size, ch, old_to_model_input),
                                                     chunks(sample, size, ch, to_model_input)))
        labels = sample_labels(sample, "random", 10, 0)
        k_old, _ = best(lambda: old_key(net, sample, labels, size, ch), args.repeats)
        k_new, _ = best(lambda: public_cache_key(cache, net, sample, common), args.repeats)
        rows.append({"dataset": name, "examples": len(sample), "native_shape": list(sample.source.images([0])[0].shape),
                     "input_old_s": round(t_old, 3), "input_new_s": round(t_new, 3), "input_speedup": round(t_old / t_new, 2),
                     "equal": same, "key_old_s": round(k_old, 3), "key_new_s": round(k_new, 4),
                     "key_speedup": round(k_old / k_new, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_overlap(args, spec, net, names) -> dict:
    sample = gdata.draw(gdata.resolve(args.overlap_set), args.overlap_m, 0)
    kw = dict(k=16, input_size=spec.input_size, channels=spec.channels, num_classes=10, names=names,
              engine="auto", device="cpu")
    out = {"dataset": args.overlap_set, "examples": len(sample)}
    for prefetch in (0, 1):
        out[f"subspace_prefetch{prefetch}_s"] = round(best(lambda: sample_subspace(net, sample, prefetch=prefetch, **kw),
                                                             args.repeats)[0], 2)
    out["speedup"] = round(out["subspace_prefetch0_s"] / out["subspace_prefetch1_s"], 3)
    # the mechanism alone: a device step simulated by sleeping (as a GPU leaves the CPU free), as long
    # as preparing a chunk takes; with prefetch the total tends to max(input, step), without to the sum
    n_chunks = -(-len(sample) // CHUNK)
    t_in = best(lambda: consume(x for _, x in sample.batches(spec.input_size, spec.channels, CHUNK, "cpu")), args.repeats)[0]
    step = t_in / n_chunks

    def stepped(ahead):
        for _ in sample.batches(spec.input_size, spec.channels, CHUNK, "cpu", ahead=ahead):
            time.sleep(step)

    out["simulated"] = {"input_s": round(t_in, 2), "step_s_per_chunk": round(step, 3), "chunks": n_chunks}
    for ahead in (0, 1):
        out["simulated"][f"prefetch{ahead}_s"] = round(best(lambda: stepped(ahead), args.repeats)[0], 2)
    out["simulated"]["speedup"] = round(out["simulated"]["prefetch0_s"] / out["simulated"]["prefetch1_s"], 3)
    print(json.dumps(out), flush=True)
    return out


def bench_rank(args) -> list[dict]:
    rows = []
    for src in [*args.src, None]:
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        with tempfile.TemporaryDirectory() as cache_dir:
            env["GSD_CACHE_DIR"] = cache_dir
            row = {"checkout": src or "this"}
            for phase in ("cold", "warm"):
                out = Path(cache_dir) / f"{phase}.json"
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-c", "import sys; from gsd_cli.cli import main; "
                                f"sys.exit(main(['rank', '-q', '--json', {str(out)!r}]))"],
                               env=env, check=True, stdout=subprocess.DEVNULL)
                row[f"{phase}_s"] = round(time.perf_counter() - t0, 1)
                ranking = json.loads(out.read_text())  # the engine and each candidate's seconds (0 when cached)
                row[f"{phase}_engine"] = ranking.get("engine")
                row[f"{phase}_public_s"] = round(sum(r.get("seconds", 0) for r in ranking.get("results", [])), 1)
                row[f"{phase}_internal_s"] = ranking.get("seconds")
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2000)
    ap.add_argument("--model", default="probe")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-input", action="store_true", help="skip the per-set input and key timings")
    ap.add_argument("--overlap", action="store_true", help="also time sample_subspace with and without prefetch")
    ap.add_argument("--overlap-set", default="mnist-b")
    ap.add_argument("--overlap-m", type=int, default=500)
    ap.add_argument("--rank", action="store_true", help="also time the default gsd rank, cold and warm")
    ap.add_argument("--src", nargs="*", default=[], help="other checkouts to time gsd rank from (PYTHONPATH)")
    add_json(ap)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = get_model_spec(args.model)
    net = spec.build(num_classes=10, seed=0)
    names = select_parameters(net, None)
    result = {"benchmark": "bench_input", "argv": sys.argv[1:], "torch_threads": torch.get_num_threads(),
              "cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
              "model": args.model, "input": [spec.input_size, spec.channels], "loadavg_before": os.getloadavg()}
    if not args.skip_input:
        result["sets"] = bench_input(args, spec, net, names)
        sets = result["sets"]
        result["total"] = {k: round(sum(r[k] for r in sets), 3) for k in ("input_old_s", "input_new_s", "key_old_s", "key_new_s")}
        print(json.dumps(result["total"]), flush=True)
    if args.overlap:
        result["overlap"] = bench_overlap(args, spec, net, names)
    if args.rank:
        result["rank"] = bench_rank(args)
    result["loadavg_after"] = os.getloadavg()
    write_json(args.json, result, loadavg_before=result["loadavg_before"])


if __name__ == "__main__":
    main()
