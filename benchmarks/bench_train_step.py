"""Time of a DP-SGD step (ghost clipping and materialised per-sample gradients) and a GEP step against
a non-private step at the same batch size, in one run (issue 37).

For each model, on the embedded private data (mnist-a) with mnist-b as GEP's public anchors, times
(median of ``--repeats`` after one warm-up; the kinds of one model are interleaved round by round, in
alternating order, so a change of load on a shared machine hits them all):

* nonprivate        : one batched forward + backward (mean loss) + SGD step over the batch;
* nonprivate_pool_cl: (models with a MaxPool2d) the non-private step with its max-pools fed channels-last
                      input, as the private engines do (``maxpool_channels_last``): the plain step
                      without the slow CPU max-pool kernel;
* nonprivate_chunked: the same in the private steps' chunks (``default_chunk_size``: 64 on a CPU), the
                      gradients accumulated (a floor with the same memory as the private step's);
* dpsgd_ghost       : gsd's DP-SGD step with ``--clip-engine auto`` (the default): clipped sums by per-layer
                      ghost norms and book-keeping (:mod:`gsd_cli.train.clipsum`) + noise + SGD step;
* dpsgd_materialise : the same with ``--clip-engine materialise``: per-sample gradients by torch.func in
                      chunks, clip, sum (the path before issue 37);
* gep               : GEP with the default anchors (``TrainConfig``: basis recomputed every 4 steps, warm,
                      from 128 of the ``--anchors`` drawn since 0.3; every 2 from 250 before; k = ``--k``,
                      by default gsd train's), amortised over one recomputation window;
* gep_every_N       : with ``--anchor-every N``: the GEP step with the basis recomputed every N steps, as
                      before (``--anchor-warm``, ``--anchor-batch``), amortised over N steps.

A model name may carry its own batch, ``resnet18:16`` (ResNet-18 at 224 x 224 on a CPU). GEP is timed
for the ``--gep-models`` only (ResNet-18's anchor matrix, 250 x 11.2M floats, is 11 GB).

    OMP_NUM_THREADS=1 python benchmarks/bench_train_step.py --models fmnist-cnn resnet20 resnet18:16 \
        --repeats 3 --clock cpu --json benchmarks/results/train_step_ghost_cpu.json
    python benchmarks/bench_train_step.py --models fmnist-cnn --anchor-every 1 5 10 20 --anchor-warm
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_train_step
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import dataclasses
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from gsd_cli.data import draw, resolve
from gsd_cli.gradients import default_chunk_size, resolve_device, select_parameters
from gsd_cli.train import StepContext, TrainConfig, build_method, private_step
from gsd_cli.train.gep import anchor_for, split_groups
from gsd_cli.train.config import parse_groups
from probes import get_model_spec

from .harness import add_json, write_json


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # --clock cpu: this process's CPU time (a shared CPU machine; not for a GPU)


def _interleaved(fns: dict, dev, repeats: int) -> dict:
    """Median time of each of ``fns`` (name -> callable): one warm-up each, then ``repeats`` rounds in
    alternating order."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    order = list(fns)
    for r in range(repeats):
        for k in (order if r % 2 == 0 else order[::-1]):
            _sync(dev)
            t0 = clock()
            fns[k]()
            _sync(dev)
            times[k].append(clock() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench(model_name: str, batch: int, m: int, k: int, dev: torch.device, repeats: int,
          every: tuple[int, ...] = (), warm: bool = False, anchor_batch: int | None = None, gep: bool = True,
          chunk: int | None = None) -> dict:
    spec = get_model_spec(model_name)
    model = spec.build(num_classes=10, seed=0).to(dev)
    names = select_parameters(model)
    p = sum(x.numel() for x in model.parameters())
    priv = draw(resolve("mnist-a"), batch, 0)
    x = priv.tensor(spec.input_size, spec.channels, dev)
    y = torch.as_tensor(priv.labels()).to(dev)
    chunk = chunk or default_chunk_size(dev, p)  # --physical-batch of gsd train (default: by device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)

    def batches():
        for i in range(0, batch, chunk):
            yield x[i : i + chunk], y[i : i + chunk]

    def nonprivate():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    from gsd_cli.gradients.layers import maxpool_channels_last

    def nonprivate_pool_cl():  # the same with the engines' max-pool trick (its input channels-last): a fair floor
        hs = maxpool_channels_last(model)
        try:
            nonprivate()
        finally:
            for h in hs:
                h.remove()

    def nonprivate_chunked():  # the same chunks as the private steps, gradients accumulated
        opt.zero_grad()
        for xc, yc in batches():
            (F.cross_entropy(model(xc), yc, reduction="sum") / batch).backward()
        opt.step()

    def apply(v):
        col = 0
        for n, prm in model.named_parameters():
            prm.grad = v[col : col + prm.numel()].view_as(prm)
            col += prm.numel()
        opt.step()

    step = [0]

    def run_step(method):
        step[0] += 1
        ctx = StepContext(step=step[0], model=model, names=names, generator=torch.Generator().manual_seed(step[0]), device=dev)
        apply(private_step(method.chain, model, names, batches(), p, ctx, method.per_sample, clip_sum=method.clip_sum)["grad"] / batch)

    ghost = build_method(TrainConfig(method="dpsgd", clip_engine="auto"), 1.0)
    mat = build_method(TrainConfig(method="dpsgd", clip_engine="materialise"), 1.0)
    fns = {"nonprivate": nonprivate, "nonprivate_chunked": nonprivate_chunked,
           **({"nonprivate_pool_cl": nonprivate_pool_cl} if any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules()) else {}), "dpsgd_ghost": lambda: run_step(ghost), "dpsgd_materialise": lambda: run_step(mat)}

    res = {"model": model_name, "input": spec.input_size, "params": p, "batch": batch, "chunk": chunk}
    if gep:
        pub = draw(resolve("mnist-b"), m, 0).tensor(spec.input_size, spec.channels, dev)
        cfg = TrainConfig(method="gep", public="mnist-b", k=k, public_examples=m, model=model_name)
        groups = split_groups(names, [dict(model.named_parameters())[n].numel() for n in names], parse_groups("auto", model_name))

        def gep_window(n: int, warm_: bool, batch_: int | None):
            """n consecutive steps with the basis recomputed every n steps: exactly one recomputation."""
            c = dataclasses.replace(cfg, anchor_every=n, anchor_warm=warm_, anchor_batch=batch_)
            reuse = anchor_for(c, pub, model, names, 10, False, chunk, dev)  # as gsd train builds it
            method = build_method(c, 1.0, reuse)

            def run():
                done = reuse.refreshes
                for _ in range(n):
                    run_step(method)
                assert reuse.refreshes == done + 1
            return run

        d = TrainConfig()
        fns[f"gep_x{d.anchor_every}"] = gep_window(d.anchor_every, d.anchor_warm, d.anchor_batch)
        res.update({"anchors": m, "k": k, "groups": len(groups), "gep_anchor_every": d.anchor_every,
                    "gep_anchor_warm": d.anchor_warm, "gep_anchor_batch": d.anchor_batch})
        for n in every:
            fns[f"gep_every_{n}_x{n}"] = gep_window(n, warm, anchor_batch)
    med = _interleaved(fns, dev, repeats)
    res["nonprivate_s"] = med["nonprivate"]
    res["nonprivate_chunked_s"] = med["nonprivate_chunked"]
    if "nonprivate_pool_cl" in med:
        res["nonprivate_pool_cl_s"] = med["nonprivate_pool_cl"]
        res["dpsgd_ghost_over_nonprivate_pool_cl"] = med["dpsgd_ghost"] / med["nonprivate_pool_cl"]
    res["dpsgd_ghost_over_nonprivate_chunked"] = med["dpsgd_ghost"] / med["nonprivate_chunked"]
    res["dpsgd_ghost_s"] = med["dpsgd_ghost"]
    res["dpsgd_materialise_s"] = med["dpsgd_materialise"]
    res["clip_engine"] = ghost.clip_sum.reason
    res["dpsgd_ghost_over_nonprivate"] = res["dpsgd_ghost_s"] / res["nonprivate_s"]
    res["dpsgd_materialise_over_nonprivate"] = res["dpsgd_materialise_s"] / res["nonprivate_s"]
    dp_best = min(res["dpsgd_ghost_s"], res["dpsgd_materialise_s"])
    if gep:
        d = TrainConfig()
        res["gep_s"] = med[f"gep_x{d.anchor_every}"] / d.anchor_every
        res["gep_over_nonprivate"] = res["gep_s"] / res["nonprivate_s"]
        res["gep_over_dpsgd"] = res["gep_s"] / res["dpsgd_ghost_s"]
        res["gep_over_dpsgd_materialise"] = res["gep_s"] / res["dpsgd_materialise_s"]
        for n in every:
            res[f"gep_every_{n}_s"] = med[f"gep_every_{n}_x{n}"] / n
            res[f"gep_every_{n}_over_dpsgd"] = res[f"gep_every_{n}_s"] / dp_best
        res["anchor_warm"] = warm
        res["anchor_batch"] = anchor_batch
    return res


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["fmnist-cnn", "resnet20", "resnet18:16"],
                    help="Models, each optionally NAME:BATCH (default batch: --batch).")
    ap.add_argument("--gep-models", nargs="*", default=["fmnist-cnn", "resnet20"], help="Models whose GEP step is timed.")
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--chunk", type=int, default=None,
                    help="examples per chunk of the private steps and the chunked floor (gsd train --physical-batch; "
                         "default: default_chunk_size, 64 on a CPU)")
    ap.add_argument("--anchors", type=int, default=2000)
    ap.add_argument("--k", type=int, default=TrainConfig().k, help="GEP's k (default: gsd train's, 32 since 0.3; 100 before)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--anchor-every", type=int, nargs="*", default=[], metavar="N",
                    help="Also GEP steps with the anchor basis recomputed every N steps (amortised step time).")
    ap.add_argument("--anchor-warm", action="store_true", help="Warm-start the --anchor-every recomputations (--anchor-warm).")
    ap.add_argument("--anchor-batch", type=int, default=None,
                    help="Anchors drawn per recomputation in the --anchor-every steps (--anchor-batch; default: all --anchors).")
    ap.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                    help="wall: elapsed time; cpu: this process's CPU time, steadier on a CPU shared with other work (use with 1 thread).")
    ap.add_argument("--device", default="auto")
    add_json(ap)
    ap.add_argument("--malloc", choices=["gsd", "system"], default="gsd",
                    help="gsd: the allocator setting of the gsd command (keep_freed_memory), as gsd train runs; "
                         "system: glibc's defaults (every large tensor a fresh mapping, page faults in both steps)")
    args = ap.parse_args(argv)
    if args.malloc == "gsd":
        from gsd_cli.allocator import keep_freed_memory

        keep_freed_memory()
    dev = resolve_device(args.device)
    global clock
    clock = CLOCK[args.clock]
    load_before = os.getloadavg()
    rows = []
    for spec_ in args.models:
        name, _, b = spec_.partition(":")
        r = bench(name, int(b) if b else args.batch, args.anchors, args.k, dev, args.repeats, tuple(args.anchor_every),
                  args.anchor_warm, args.anchor_batch, gep=name in args.gep_models, chunk=args.chunk)
        rows.append(r)
        line = (f"{name:11s} p={r['params']:>10,} B={r['batch']}: non-private {r['nonprivate_s']:.3f} s, "
                f"in chunks {r['nonprivate_chunked_s']:.3f} s, "
                f"DP-SGD ghost {r['dpsgd_ghost_s']:.3f} s ({r['dpsgd_ghost_over_nonprivate']:.2f}x; "
                f"{r['dpsgd_ghost_over_nonprivate_chunked']:.2f}x chunked"
                + (f", {r['dpsgd_ghost_over_nonprivate_pool_cl']:.2f}x the step with channels-last max-pool" if "nonprivate_pool_cl_s" in r else "")
                + "), "
                f"materialised {r['dpsgd_materialise_s']:.3f} s ({r['dpsgd_materialise_over_nonprivate']:.2f}x)")
        if "gep_s" in r:
            line += (f", GEP (m={r['anchors']} pool, k={r['k']}, defaults) {r['gep_s']:.3f} s ({r['gep_over_nonprivate']:.2f}x; "
                     f"{r['gep_over_dpsgd']:.2f}x DP-SGD ghost)")
            line += "".join(f", anchor-every {n}: {r[f'gep_every_{n}_s']:.3f} s ({r[f'gep_every_{n}_over_dpsgd']:.2f}x DP-SGD)" for n in args.anchor_every)
        print(line, f"[{r['clip_engine'][:60]}...]", flush=True)
    doc = {
        "command": "python benchmarks/bench_train_step.py " + " ".join(os.sys.argv[1:]),
        "device": str(dev), "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
        "cpu_threads": torch.get_num_threads(), "clock": args.clock, "malloc": args.malloc, "platform": platform.platform(), "torch": torch.__version__,
        "loadavg_before": load_before, "loadavg": os.getloadavg(), "shared_machine": True, "results": rows,
    }
    print("load average before/after:", load_before, os.getloadavg())
    write_json(args.json, doc, indent=2, loadavg_before=load_before)


if __name__ == "__main__":
    main()
