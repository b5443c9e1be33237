"""Scale-out: catalogue throughput on Ray workers (``--part catalogue``) and private training across
workers (``--part training``, from ``benchmarks/scale_out_training.py``).

``--part catalogue`` ranks one catalogue job (a private set and ``--candidates`` public candidates,
generated npz sets of 28 x 28 images) with the local executor, then with the ``ray`` executor on a
local Ray instance of 1, 2 and 4 workers (``ray.init(num_cpus=W)``, one CPU and one torch thread per
task; the driver also runs one torch thread). Each setting: one untimed run (the workers import torch
and build the model once), then ``--repeats`` timed runs without the cache. Reports the wall time,
candidates per second, the speed-up over 1 worker, and the ideal speed-up that the serial private
side allows (the private side is computed in the driver before the public tasks are scheduled:
(t_priv + n t_pub) / (t_priv + ceil(n / W) t_pub), with t_priv and t_pub from the local run).

It also measures what a worker spends per image reading and resizing greyscale 1024 x 1024 PNGs (as
ChestX-ray14's) to the probe's 224 x 224 input, and writes an estimate, with its arithmetic, of a
1,000-candidate catalogue on a 16-GPU cluster from that figure and the H100 time of one candidate's
rank work (``benchmarks/results/gpu_rank_m2000.json``, ``bench_rank.py``).

    python benchmarks/bench_scale_out.py --part catalogue --json benchmarks/results/cpu_scale_out.json
    python benchmarks/bench_scale_out.py --part catalogue --workers 1 2 --examples 500 --repeats 1
    python benchmarks/bench_scale_out.py --part training ...      # options of scale_out_training.py

Load average, core count and the torch version are recorded: on a shared machine the figures say
little more than that the code runs; the speed-up needs as many free cores as workers.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_scale_out
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .harness import add_json, write_json

HERE = Path(__file__).resolve().parent


def make_catalogue(folder: Path, n: int, m: int, k: int, model: str) -> Path:
    """A private set and ``n`` candidates (28 x 28 grey, 10 declared classes, ``m`` examples each)
    whose distance to the private set grows with their index; one job ranking all of them."""
    rng = np.random.default_rng(0)
    base = rng.uniform(size=(10, 28, 28))
    lines = []
    for i, name in enumerate(["private"] + [f"cand{j}" for j in range(n)]):
        r = np.random.default_rng(i + 1)
        shift = 0.0 if i == 0 else (i - 1) / max(1, n - 1)
        y = r.integers(0, 10, m)
        x = np.clip(base[y] * (1 - shift) + shift * r.uniform(size=(m, 28, 28)) + 0.1 * r.normal(size=(m, 28, 28)), 0, 1)
        np.savez(folder / f"{name}.npz", x=(x * 255).astype(np.uint8), y=y, classes=np.array([str(c) for c in range(10)]))
        lines.append(f'[datasets.{name}]\nsource = "npz"\npath = "{name}.npz"\n')
    cands = ", ".join(f'"cand{j}"' for j in range(n))
    lines.append(f'[[jobs]]\nname = "scale-out"\nprivate = "private"\ncandidates = [{cands}]\n[jobs.options]\n'
                 f'k = {k}\nexamples = {m}\nmodel = "{model}"\nengine = "vmap"\ndevice = "cpu"\ngram = "materialize"\n')
    path = folder / "catalogue.toml"
    path.write_text("\n".join(lines))
    return path


def timed(fn, repeats: int) -> tuple[list[float], object]:
    out, times = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return times, out


def catalogue_part(args) -> dict:
    import ray
    import torch

    from gsd_cli.ranking.catalog import run_catalog
    from gsd_cli.ranking.ray_executor import RayExecutor

    torch.set_num_threads(1)
    doc = {"part": "catalogue", "candidates": args.candidates, "examples": args.examples, "k": args.k, "model": args.model,
           "repeats": args.repeats, "cpus": os.cpu_count(), "torch": torch.__version__, "ray": ray.__version__,
           "platform": platform.platform(), "loadavg_before": os.getloadavg(), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        cat = make_catalogue(Path(tmp), args.candidates, args.examples, args.k, args.model)
        run_catalog(cat)  # warm this process (imports, first model)
        times, ranked = timed(lambda: run_catalog(cat), args.repeats)
        rk = ranked[0][1]
        t_pub = sum(r.seconds for r in rk) / len(rk)
        t_priv = max(0.0, rk.seconds - sum(r.seconds for r in rk))  # the ranking's time less its public sides
        local = {r.public: r.distance for r in rk}
        doc.update(t_private_s=t_priv, t_public_s=t_pub)
        doc["runs"].append({"executor": "local", "workers": 0, "seconds": times, "load": os.getloadavg()})
        print(f"local: {min(times):.2f} s (private side ~{t_priv:.2f} s, a public side ~{t_pub:.2f} s), load {os.getloadavg()[0]:.1f}", flush=True)
        for w in args.workers:
            t0 = time.perf_counter()
            ray.init(num_cpus=w, include_dashboard=False, logging_level="warning")
            ex = RayExecutor(num_cpus=1)
            cold, _ = timed(lambda: run_catalog(cat, executor=ex), 1)  # workers start, import torch, build the model
            times, ranked = timed(lambda: run_catalog(cat, executor=ex), args.repeats)
            ray.shutdown()
            same = max(abs(r.distance - local[r.public]) for r in ranked[0][1])
            ideal = (t_priv + args.candidates * t_pub) / (t_priv + math.ceil(args.candidates / w) * t_pub)
            doc["runs"].append({"executor": "ray", "workers": w, "seconds": times, "cold_first_run_s": cold[0],
                                "start_and_first_run_s": time.perf_counter() - t0 - sum(times), "ideal_speedup": ideal,
                                "max_abs_difference_to_local": same, "load": os.getloadavg()})
            print(f"ray, {w} worker(s): {min(times):.2f} s (first run {cold[0]:.1f} s), ideal speed-up {ideal:.2f}, "
                  f"max |d - d_local| {same:.1e}, load {os.getloadavg()[0]:.1f}", flush=True)
    one = next((min(r["seconds"]) for r in doc["runs"] if r["workers"] == 1), None)
    for r in doc["runs"]:
        r["best_s"] = min(r["seconds"])
        r["candidates_per_s"] = args.candidates / r["best_s"]
        r["speedup_vs_1_worker"] = one / r["best_s"] if one else None
    doc["image_read_s"] = image_read_seconds(args.png_images)
    doc["estimate_1000_on_16_gpus"] = estimate(doc["image_read_s"])
    doc["loadavg_after"] = os.getloadavg()
    return doc


def image_read_seconds(n: int) -> float:
    """Seconds per image for gsd's loader to open a grey 1024 x 1024 PNG and resize it to 3 x 224 x 224."""
    from PIL import Image

    from gsd_cli import data as gdata

    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        for c in ("a", "b"):
            (Path(tmp) / c).mkdir()
            for i in range(n // 2):
                low = Image.fromarray((rng.uniform(size=(32, 32)) * 200).astype(np.uint8), mode="L")
                arr = np.asarray(low.resize((1024, 1024), Image.BILINEAR), dtype=np.int16) + rng.integers(-3, 4, (1024, 1024))
                Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), mode="L").save(Path(tmp) / c / f"{i}.png")  # smooth, as X-rays
        sample = gdata.draw(gdata.resolve(f"folder:{tmp}"), None, 0)
        t0 = time.perf_counter()
        for _ in sample.batches(224, 3, 16):
            pass
        return (time.perf_counter() - t0) / len(sample)


def estimate(image_s: float, n: int = 1000, gpus: int = 16, m: int = 2000, cpus_per_gpu: int = 8) -> dict:
    """A paper estimate of an n-candidate catalogue on ``gpus`` GPUs, each task loading its own m images."""
    gpu_file = HERE / "results" / "gpu_rank_m2000.json"
    grad_s = 0.60  # H100, probe, m=2000, k=16: gsd's rank work for one dataset
    if gpu_file.exists():
        grad_s = json.loads(gpu_file.read_text())["models"]["probe"]["steps"]["gsd rank work (auto engine + eigh)"]["seconds"]
    load_s = m * image_s
    one_task = load_s + grad_s
    waves = math.ceil(n / gpus)
    # one task per GPU: loading (one CPU) and the GPU work run one after the other
    serial = waves * one_task + one_task  # + the private side, in the driver, first
    # with num_gpus=1/g, g tasks share a GPU: loading on g CPUs overlaps the GPU work
    share = cpus_per_gpu
    overlapped = max(n * load_s / (gpus * share), n * grad_s / gpus) + one_task
    return {
        "assumptions": f"{n} candidates, {gpus} GPUs (H100), m={m} images of 1024x1024 per candidate read by the task, "
                       f"probe at 224x224, k=16; {cpus_per_gpu} CPU cores per GPU; Ray overhead and model build ignored",
        "image_read_s": image_s, "load_per_task_s": load_s, "gpu_work_per_task_s": grad_s,
        "one_gpu_per_task_s": serial, "one_gpu_per_task_arithmetic":
            f"ceil({n}/{gpus})={waves} waves x ({m} x {image_s * 1e3:.2f} ms + {grad_s:.2f} s) + one private side = {serial:.0f} s",
        "shared_gpu_s": overlapped, "shared_gpu_arithmetic":
            f"max({n} x {load_s:.1f} s / ({gpus} x {share} CPUs), {n} x {grad_s:.2f} s / {gpus} GPUs) + one private side "
            f"= {overlapped:.0f} s (num_gpus=1/{share} per task)",
        "result_bytes_per_candidate": 30202 * 16 * 8,
    }


def training_part(argv: list[str]) -> dict:
    """``benchmarks/scale_out_training.py``'s ``run(parser().parse_args(argv))`` (its spawned workers import
    it by name, ``benchmarks.scale_out_training``, from this process's ``sys.path``)."""
    from . import scale_out_training as mod

    return mod.run(mod.parser().parse_args(argv))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["catalogue", "training", "all"], default="catalogue")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--candidates", type=int, default=6)
    ap.add_argument("--examples", type=int, default=1000)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--model", default="fmnist-cnn")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--png-images", type=int, default=32, help="PNGs read for the per-image time of the estimate")
    add_json(ap)
    args, rest = ap.parse_known_args(argv)
    out = {}
    if args.part in ("catalogue", "all"):
        if rest and args.part == "catalogue":
            ap.error(f"unknown options for --part catalogue: {' '.join(rest)}")
        out["catalogue"] = catalogue_part(args)
        est = out["catalogue"]["estimate_1000_on_16_gpus"]
        print("estimate, 1,000 candidates on 16 GPUs:\n  " + est["one_gpu_per_task_arithmetic"] + "\n  " + est["shared_gpu_arithmetic"])
    if args.part in ("training", "all"):
        out["training"] = training_part(rest)
    if args.json:
        write_json(args.json, out)
        print(f"wrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
