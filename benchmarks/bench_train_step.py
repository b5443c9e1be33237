"""Time of one GEP step and one DP-SGD step against a non-private step at the same batch size.

For each model, on the embedded private data (mnist-a) with mnist-b as GEP's public anchors, times
(median of ``--repeats`` after one warm-up):

* nonprivate : one batched forward + backward (mean loss) + SGD step over the batch;
* dpsgd      : per-sample gradients in chunks + clip + sum + noise + SGD step (gsd's DP-SGD step);
* gep        : the same plus GEP's anchor subspace (per-sample gradients of m public examples at the
               current weights + one power iteration per group) and the embed/residual transforms;
* gep_anchor : the anchor subspace alone (the part of a GEP step that does not depend on the batch);
* gep_every_N: the GEP step with ``--anchor-every N`` (the basis recomputed every N steps, reused in
               between; ``--anchor-warm`` for warm-started recomputations), amortised: the time of N
               consecutive steps (one recomputation) divided by N.

    python benchmarks/bench_train_step.py                             # fmnist-cnn and resnet20, B=250
    python benchmarks/bench_train_step.py --batch 1000 --models resnet20 --json benchmarks/results/train_step.json
    python benchmarks/bench_train_step.py --models fmnist-cnn --anchor-every 1 5 10 20 --anchor-warm
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from gsd_cli.data import draw, resolve
from gsd_cli.gradients import default_chunk_size, gradient_matrix, resolve_device, select_parameters
from gsd_cli.train import Anchor, StepContext, TrainConfig, build_method, private_step
from gsd_cli.train.gep import split_groups
from gsd_cli.train.config import parse_groups
from probes import get_model_spec


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter  # --clock cpu: this process's CPU time (a shared CPU machine; not for a GPU)


def _median_time(fn, dev, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        _sync(dev)
        t0 = clock()
        fn()
        _sync(dev)
        times.append(clock() - t0)
    return statistics.median(times)


def bench(model_name: str, batch: int, m: int, k: int, dev: torch.device, repeats: int,
          every: tuple[int, ...] = (1,), warm: bool = False, anchor_batch: int | None = None) -> dict:
    spec = get_model_spec(model_name)
    model = spec.build(num_classes=10, seed=0).to(dev)
    names = select_parameters(model)
    p = sum(x.numel() for x in model.parameters())
    priv = draw(resolve("mnist-a"), batch, 0)
    x = priv.tensor(spec.input_size, spec.channels, dev)
    y = torch.as_tensor(priv.labels()).to(dev)
    pub = draw(resolve("mnist-b"), m, 0).tensor(spec.input_size, spec.channels, dev)
    chunk = default_chunk_size(dev, p)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)

    def batches():
        for i in range(0, batch, chunk):
            yield x[i : i + chunk], y[i : i + chunk]

    def nonprivate():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def apply(v):
        col = 0
        for n, prm in model.named_parameters():
            prm.grad = v[col : col + prm.numel()].view_as(prm)
            col += prm.numel()
        opt.step()

    dp = build_method(TrainConfig(method="dpsgd"), 1.0)
    step = [0]

    def dpsgd():
        step[0] += 1
        ctx = StepContext(step=step[0], model=model, names=names, generator=torch.Generator().manual_seed(step[0]), device=dev)
        apply(private_step(dp.chain, model, names, batches(), p, ctx)["grad"] / batch)

    sizes = [dict(model.named_parameters())[n].numel() for n in names]
    groups = split_groups(names, sizes, parse_groups("auto", model_name))

    def grads(model_, xa, ya, names_):
        it = ((xa[i : i + chunk], ya[i : i + chunk]) for i in range(0, xa.shape[0], chunk))
        return gradient_matrix(model_, it, xa.shape[0], names_, None, "vmap", dev, "none")

    anchor = Anchor(pub, 10, k, groups, 1, 0, grads)
    gep = build_method(TrainConfig(method="gep", public="mnist-b", k=k), 1.0, anchor)

    def gep_step(method=gep):
        step[0] += 1
        ctx = StepContext(step=step[0], model=model, names=names, generator=torch.Generator().manual_seed(step[0]), device=dev)
        apply(private_step(method.chain, model, names, batches(), p, ctx)["grad"] / batch)

    def gep_window(n: int):
        """n consecutive steps with the basis recomputed every n steps: exactly one recomputation."""
        reuse = Anchor(pub, 10, k, groups, 1, 0, grads, every=n, warm=warm, batch=anchor_batch)
        method = build_method(TrainConfig(method="gep", public="mnist-b", k=k, anchor_every=n, anchor_warm=warm,
                                          anchor_batch=anchor_batch), 1.0, reuse)

        def run():
            done = reuse.refreshes
            for _ in range(n):
                gep_step(method)
            assert reuse.refreshes == done + 1
        return run

    def anchor_only():
        step[0] += 1
        anchor.compute(StepContext(step=step[0], model=model, names=names, device=dev))

    res = {"model": model_name, "params": p, "batch": batch, "anchors": m, "k": k, "groups": len(groups), "chunk": chunk}
    res["nonprivate_s"] = _median_time(nonprivate, dev, repeats)
    res["dpsgd_s"] = _median_time(dpsgd, dev, repeats)
    res["gep_s"] = _median_time(gep_step, dev, repeats)
    res["gep_anchor_s"] = _median_time(anchor_only, dev, repeats)
    res["dpsgd_over_nonprivate"] = res["dpsgd_s"] / res["nonprivate_s"]
    res["gep_over_nonprivate"] = res["gep_s"] / res["nonprivate_s"]
    res["gep_over_dpsgd"] = res["gep_s"] / res["dpsgd_s"]
    res["anchor_warm"] = warm
    res["anchor_batch"] = anchor_batch
    for n in every:
        res[f"gep_every_{n}_s"] = _median_time(gep_window(n), dev, repeats) / n
        res[f"gep_every_{n}_over_dpsgd"] = res[f"gep_every_{n}_s"] / res["dpsgd_s"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["fmnist-cnn", "resnet20"])
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--anchors", type=int, default=2000)
    ap.add_argument("--k", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--anchor-every", type=int, nargs="+", default=[1, 2, 10], metavar="N",
                    help="GEP steps with the anchor basis recomputed every N steps (amortised step time).")
    ap.add_argument("--anchor-warm", action="store_true", help="Warm-start the recomputations (--anchor-warm).")
    ap.add_argument("--anchor-batch", type=int, default=None,
                    help="Anchors drawn per recomputation in the anchor-every steps (--anchor-batch; default: all --anchors).")
    ap.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                    help="wall: elapsed time; cpu: this process's CPU time, steadier on a CPU shared with other work (use with 1 thread).")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dev = resolve_device(args.device)
    global clock
    clock = CLOCK[args.clock]
    rows = []
    for name in args.models:
        r = bench(name, args.batch, args.anchors, args.k, dev, args.repeats, tuple(args.anchor_every), args.anchor_warm, args.anchor_batch)
        rows.append(r)
        print(
            f"{name:11s} p={r['params']:>7,} B={r['batch']} m={r['anchors']} k={r['k']}: non-private {r['nonprivate_s']:.3f} s, "
            f"DP-SGD {r['dpsgd_s']:.3f} s ({r['dpsgd_over_nonprivate']:.1f}x), GEP {r['gep_s']:.3f} s "
            f"({r['gep_over_nonprivate']:.1f}x; anchor subspace {r['gep_anchor_s']:.3f} s); "
            + ", ".join(f"anchor-every {n}{' warm' if args.anchor_warm else ''}: {r[f'gep_every_{n}_s']:.3f} s "
                        f"({r[f'gep_every_{n}_over_dpsgd']:.1f}x DP-SGD)" for n in args.anchor_every),
            flush=True,
        )
    doc = {
        "device": str(dev), "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
        "cpu_threads": torch.get_num_threads(), "clock": args.clock, "platform": platform.platform(), "torch": torch.__version__,
        "loadavg": os.getloadavg(), "results": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
