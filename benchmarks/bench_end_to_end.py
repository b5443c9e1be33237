"""End to end, as ratios: what `gsd rank` and `gsd train` cost against the floor of the same work.

In one run (figures are seconds and ratios; the JSON keeps both):

* rank   : the examples of the default ``gsd rank`` (the private set and the six default public sets,
           ``--m`` each, random labels, the probe network at 224x224), one set in memory at a time:
           - floor: one plain batched forward+backward over them (no per-sample anything);
           - per-sample gradients alone: torch.func vmap written by hand (the same chunks), gsd's
             ``vmap`` and ``hooks`` engines, and the API's default (``per_sample_gradients``, engine
             ``auto``, decided once per process);
           - ``gsd rank -m M`` end to end in a fresh process: cold (an empty cache folder) and warm
             (the same folder again: public subspaces cached, the private one recomputed);
* train  : one step of each ``gsd train`` method on the default model (fmnist-cnn), a batch of
           ``--batch`` mnist-a examples, against one non-private step (forward + backward + SGD):
           dpsgd, gep (``--anchors`` public anchors, k=100), rgp, sparsify (dpsgd --sparsify 0.5 at its
           final rate), topagg, second-phase (its private stage: DP-SGD on the trained parameters);
           the mean of ``--repeats`` x anchor_every consecutive steps (GEP's basis schedule, the
           defaults of ``gsd train``; 1 for the others) after two warm-up steps;
* cli    : ``gsd train --method dpsgd --epochs 1`` in a fresh process, cold and warm cache (the noise
           calibration is cached), and ``gsd --help`` / ``gsd datasets list`` start-up (wall and CPU
           seconds: the CPU seconds are steadier on a busy machine);
* engines: (``--engines``) the three per-sample engines per chunk, interleaved: the evidence for
           ``engine="auto"``'s rule on this device (:mod:`gsd_cli.gradients.engines`).

It measures whatever the tree contains (input pipeline, top-k, engines). Record the load: figures
taken while other work runs on the machine are slower and noisier (``loadavg`` in the JSON). A
machine's speed can drift by 10-20% within minutes: ``--cold-repeats 3`` times the floor and the cold
and warm rank in back-to-back pairs and reports the medians of their ratios. This process runs with
the ``gsd`` command's allocator setting (``--malloc gsd``, :mod:`gsd_cli.allocator`), so the floor and
the command are measured alike; ``--malloc system`` measures both with glibc's defaults.

    python benchmarks/bench_end_to_end.py                     # m=2000 (7 x 2000 at 224x224): minutes on a CPU
    python benchmarks/bench_end_to_end.py --m 2000 --repeats 5 --cold-repeats 3 --json benchmarks/results/end_to_end_cpu_m2000.json
    nice -n 10 python benchmarks/bench_end_to_end.py --m 200 --threads 1 --json benchmarks/results/end_to_end_cpu_m200.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_end_to_end
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from gsd_cli.data import DEFAULT_PRIVATE, DEFAULT_PUBLIC, draw, resolve
from gsd_cli.gradients.engines import engine_choices, forget_engine_choices
from gsd_cli.gradients import default_chunk_size, gradient_matrix, per_sample_gradients, resolve_device, select_parameters
from probes import get_model_spec

from .harness import add_json, write_json


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, dev) -> float:
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    return time.perf_counter() - t0


def _chunks(x, y, cs):
    return [(x[i : i + cs], y[i : i + cs]) for i in range(0, x.shape[0], cs)]


# ----------------------------------------------------------------------------------------- rank
def rank_parts(m: int, model_name: str, dev: torch.device) -> dict:
    """Seconds of the floor and of each per-sample gradient path over the default rank's examples."""
    from torch.func import functional_call, grad, vmap

    spec = get_model_spec(model_name)
    model = spec.build(num_classes=10, seed=0).to(dev)
    model.train()
    names = select_parameters(model)
    p = sum(q.numel() for q in model.parameters())
    cs = default_chunk_size(dev, p)
    params = {n: q.detach() for n, q in model.named_parameters()}

    def one(prm, xi, yi):
        return F.cross_entropy(functional_call(model, prm, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    direct_fn = vmap(grad(one), in_dims=(None, 0, 0))

    def floor(x, y):
        for xb, yb in _chunks(x, y, cs):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb, reduction="sum").backward()
        model.zero_grad(set_to_none=True)

    def direct(x, y):
        rows = []
        for xb, yb in _chunks(x, y, cs):
            g = direct_fn(params, xb, yb)
            rows.append(torch.cat([g[n].reshape(xb.shape[0], -1) for n in names], 1))
        return torch.cat(rows)

    paths = {
        "floor (plain forward+backward)": floor,
        "per-sample: vmap by hand (torch.func)": direct,
        "per-sample: gsd vmap": lambda x, y: gradient_matrix(model, _chunks(x, y, cs), x.shape[0], names, None, "vmap", dev),
        "per-sample: gsd hooks": lambda x, y: gradient_matrix(model, _chunks(x, y, cs), x.shape[0], names, None, "hooks", dev),
        "per-sample: gsd layers": lambda x, y: gradient_matrix(model, _chunks(x, y, cs), x.shape[0], names, None, "layers", dev),
        "per-sample: API default (auto)": lambda x, y: per_sample_gradients(model, x, y, device=dev),
    }
    seconds = dict.fromkeys(paths, 0.0)
    forget_engine_choices()  # the API's first call decides, as in a fresh process
    g = torch.Generator().manual_seed(1)
    for i, name in enumerate([DEFAULT_PRIVATE, *DEFAULT_PUBLIC]):
        x = draw(resolve(name), m, 0).tensor(spec.input_size, spec.channels, dev)
        y = torch.randint(0, 10, (x.shape[0],), generator=g).to(dev)
        if i == 0:  # warm-up on a slice: one-time costs (kernels, torch.func's first call) are not timed
            for k, fn in paths.items():
                if k != "per-sample: API default (auto)":
                    fn(x[:4], y[:4])
        order = list(paths) if i % 2 == 0 else list(reversed(paths))  # alternate: drift in load hits all
        for k in order:
            seconds[k] += _timed(lambda: paths[k](x, y), dev)
        del x
    choice = next(iter(engine_choices().values()), {})
    return {"model": model_name, "params": p, "sets": 1 + len(DEFAULT_PUBLIC), "m": m, "chunk": cs,
            "seconds": seconds, "api_engine": choice.get("engine"), "api_engine_choice": choice.get("how")}


def floor_seconds(m: int, model_name: str, dev: torch.device) -> float:
    """Seconds of the floor alone (as in :func:`rank_parts`): for the pairs of ``--cold-repeats``."""
    spec = get_model_spec(model_name)
    model = spec.build(num_classes=10, seed=0).to(dev)
    model.train()
    cs = default_chunk_size(dev, sum(q.numel() for q in model.parameters()))
    g = torch.Generator().manual_seed(1)
    total = 0.0
    for name in [DEFAULT_PRIVATE, *DEFAULT_PUBLIC]:
        x = draw(resolve(name), m, 0).tensor(spec.input_size, spec.channels, dev)
        y = torch.randint(0, 10, (x.shape[0],), generator=g).to(dev)

        def floor():
            for xb, yb in _chunks(x, y, cs):
                model.zero_grad(set_to_none=True)
                F.cross_entropy(model(xb), yb, reduction="sum").backward()
            model.zero_grad(set_to_none=True)

        total += _timed(floor, dev)
    return total


#: CPU seconds (user + system) of each gsd process run by _run_cli, by the label it was timed under
CPU_SECONDS: dict[str, float] = {}
#: its system seconds and minor page faults (the allocator's share: gsd_cli.allocator)
SYS_SECONDS: dict[str, float] = {}
MINOR_FAULTS: dict[str, int] = {}


def _run_cli(args: list[str], env: dict, label: str = "") -> float:
    """Wall seconds of ``gsd ARGS`` in a fresh process; its CPU seconds go to CPU_SECONDS[label]
    (steadier than the wall time on a machine busy with other jobs)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gsd_cli.cli", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"gsd {' '.join(args)} failed ({done.returncode}): {done.stderr[-1500:]}")
    label = label or " ".join(args)
    CPU_SECONDS[label] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    SYS_SECONDS[label] = after.ru_stime - before.ru_stime
    MINOR_FAULTS[label] = after.ru_minflt - before.ru_minflt
    return wall


def rank_cli(m: int, device: str) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "GSD_CACHE_DIR": cache}
        args = ["rank", "-m", str(m), "--quiet", "--device", device]
        cold, warm = "gsd rank cold (empty cache)", "gsd rank warm (same cache)"
        return {cold: _run_cli(args, env, cold), warm: _run_cli(args, env, warm)}


# ---------------------------------------------------------------------------------------- train
def train_steps(batch: int, anchors: int, repeats: int, dev: torch.device, model_name: str = "fmnist-cnn") -> dict:
    """Median seconds of one step of each method and of a non-private step."""
    import dataclasses

    from gsd_cli.models.peft import build_model
    from gsd_cli.train import StepContext, TrainConfig, build_method, private_step

    src = resolve(f"{DEFAULT_PRIVATE}:train")
    base = TrainConfig(model=model_name, batch_size=batch)
    out: dict = {"model": model_name, "batch": batch, "anchors": anchors, "seconds": {}}
    configs = {
        "dpsgd": dataclasses.replace(base, method="dpsgd"),
        "gep": dataclasses.replace(base, method="gep", public=DEFAULT_PUBLIC[0], public_examples=anchors),
        "rgp": dataclasses.replace(base, method="rgp"),
        "sparsify (dpsgd, 0.5)": dataclasses.replace(base, method="dpsgd", sparsify=0.5),
        "topagg": dataclasses.replace(base, method="topagg"),
        "second-phase (private stage)": dataclasses.replace(base, method="second-phase", public=DEFAULT_PUBLIC[0]),
    }
    spec, model, names, _ = build_model(model_name, src.num_classes, 0)
    model = model.to(dev)
    sample = draw(src, batch, 0)
    x = sample.tensor(spec.input_size, spec.channels, dev)
    y = torch.as_tensor(sample.labels()).to(dev)
    chunk = default_chunk_size(dev, sum(q.numel() for q in model.parameters()))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)

    def median(fn):
        fn()
        return statistics.median(_timed(fn, dev) for _ in range(repeats))

    def nonprivate():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()

    out["seconds"]["non-private step"] = median(nonprivate)
    for label, cfg in configs.items():
        spec_, m_, names_, _ = build_model(model_name, src.num_classes, 0, peft=cfg.peft, params=cfg.params)
        m_ = m_.to(dev)
        anchor = None
        if cfg.method == "gep":
            pub = draw(resolve(cfg.public), cfg.public_examples, 0).tensor(spec.input_size, spec.channels, dev)
            anchor = _anchor(cfg, pub, m_, names_, src.num_classes, chunk, dev)
        method = build_method(cfg, 1.0, anchor, model=m_, names=names_)
        p_ = sum(dict(m_.named_parameters())[n].numel() for n in names_)
        opt_ = torch.optim.SGD([dict(m_.named_parameters())[n] for n in names_], lr=1e-6, momentum=0.9)
        step = [0]

        def run(method=method, m_=m_, names_=names_, p_=p_, opt_=opt_):
            step[0] += 1
            ctx = StepContext(step=step[0], model=m_, names=names_, generator=torch.Generator().manual_seed(step[0]),
                              device=dev, epoch=1, epochs=2)  # the last epoch: sparsification at its final rate
            noisy = private_step(method.chain, m_, names_, _chunks(x, y, chunk), p_, ctx, method.per_sample)
            col = 0
            for n in names_:
                prm = dict(m_.named_parameters())[n]
                prm.grad = (noisy["grad"][col : col + prm.numel()] / batch).view_as(prm)
                col += prm.numel()
            opt_.step()

        # amortised over whole windows of the anchor schedule (GEP recomputes its basis every
        # anchor_every steps): the mean of repeats * anchor_every consecutive steps after two warm-up steps
        every = cfg.anchor_every if cfg.method == "gep" else 1
        run(), run()
        n = repeats * every
        out["seconds"][label] = _timed(lambda run=run, n=n: [run() for _ in range(n)], dev) / n
    out["gep_settings"] = {"anchor_every": configs["gep"].anchor_every, "anchor_warm": configs["gep"].anchor_warm,
                           "anchor_batch": configs["gep"].anchor_batch, "k": configs["gep"].k}
    return out


def _anchor(cfg, pub, model, names, num_classes, chunk, dev):
    """GEP's anchor as ``gsd train`` builds it (``gsd_cli.train.gep.anchor_for`` when the tree has it)."""
    from gsd_cli.train import gep

    if hasattr(gep, "anchor_for"):
        return gep.anchor_for(cfg, pub, model, names, num_classes, False, chunk, dev)
    from gsd_cli.train.config import parse_groups

    params = dict(model.named_parameters())
    groups = gep.split_groups(names, [params[n].numel() for n in names], parse_groups(cfg.groups, cfg.model))

    def grads(model_, xa, ya, names_):
        return gradient_matrix(model_, _chunks(xa, ya, chunk), xa.shape[0], names_, None, "vmap", dev, "none")

    return gep.Anchor(pub, num_classes, cfg.k, groups, cfg.power_iters, cfg.seed, grads)


# -------------------------------------------------------------------------------------- engines
def engine_rounds(models: list[str], chunks: list[int], rounds: int, dev: torch.device) -> list[dict]:
    """The evidence for ``auto``'s rule: per chunk, every engine in interleaved rounds
    (:func:`gsd_cli.gradients.engines.measure_engines`: one warm-up round, then alternating order), median
    seconds, each engine's median over vmap's, and in how many rounds ``layers`` was the fastest. An engine that refuses the model (Opacus refuses BatchNorm) is
    left out of that model's rows (``None``)."""
    from gsd_cli.gradients.engines import measure_engines
    from gsd_cli.gradients import default_loss

    kinds = ("vmap", "hooks", "layers")
    rows = []
    for name in models:
        spec = get_model_spec(name)
        model = spec.build(num_classes=10, seed=0).to(dev)
        model.train()
        names = select_parameters(model)
        p = sum(q.numel() for q in model.parameters())
        for cs in chunks:
            x = torch.randn(cs, spec.channels, spec.input_size, spec.input_size, device=dev)
            y = torch.randint(0, 10, (cs,), device=dev)
            out = torch.empty(cs, p, device=dev)
            # the measurement `auto` runs when asked (one untimed warm-up, alternating rounds, vmap and
            # layers kept open, hooks opened around each run; an engine that refuses has no timings)
            _, eng, t = measure_engines(model, names, default_loss, x, y, out, dev, rounds=rounds, timer=_timed, kinds=kinds)
            eng.close()
            med = {k: statistics.median(v) if v else None for k, v in t.items()}
            others = [k for k in ("vmap", "hooks") if t[k]]
            rows.append({"model": name, "chunk": cs, **{f"{k}_s": v for k, v in med.items()},
                         **{f"{k}_over_vmap": med[k] / med["vmap"] if med[k] else None for k in kinds[1:]},
                         "vmap_faster_rounds": sum(a < b for a, b in zip(t["vmap"], t["hooks"])) if t["hooks"] else None,
                         "layers_fastest_rounds": sum(c < min(o) for c, *o in zip(t["layers"], *(t[k] for k in others))) if t["layers"] else None,
                         "rounds": rounds})
            del out
    return rows


# ------------------------------------------------------------------------------------------ cli
def cli_times(device: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "GSD_CACHE_DIR": str(Path(tmp) / "cache")}
        train = ["train", "--method", "dpsgd", "--epochs", "1", "--device", device, "--out"]
        runs = {
            "gsd --help": ["--help"],
            "gsd datasets list": ["datasets", "list"],
            "gsd train --method dpsgd --epochs 1, cold": [*train, str(Path(tmp) / "a")],
            "gsd train --method dpsgd --epochs 1, warm": [*train, str(Path(tmp) / "b")],
        }
        return {label: _run_cli(args, env, label) for label, args in runs.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=2000, help="Examples per dataset of the rank part (gsd rank -m).")
    ap.add_argument("--model", default="probe", help="Model of the rank part.")
    ap.add_argument("--batch", type=int, default=250, help="Batch of the train steps.")
    ap.add_argument("--anchors", type=int, default=None, help="GEP's public anchors (default: --m).")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads here and OMP_NUM_THREADS of the gsd processes (default: torch's); 1 is "
                         "steadier on a machine busy with other jobs")
    ap.add_argument("--skip", nargs="*", default=[], choices=["rank", "rank-cli", "train", "cli"])
    ap.add_argument("--engines", action="store_true",
                    help="Also time the three engines per chunk (probe, resnet20, fmnist-cnn; chunks of 8, 64, 128) "
                         "in 11 interleaved rounds: the evidence for auto's rule on this device.")
    ap.add_argument("--engine-models", nargs="+", default=["fmnist-cnn", "resnet20", "probe"],
                    help="Models of --engines (registered names, at their input size).")
    ap.add_argument("--engine-chunks", nargs="+", type=int, default=[8, 64, 128], help="Chunk sizes of --engines.")
    ap.add_argument("--engine-rounds", type=int, default=11, help="Timed rounds of --engines (after one warm-up round).")
    ap.add_argument("--cold-repeats", type=int, default=1,
                    help="After the first run, N-1 more pairs (floor, then cold and warm gsd rank) taken back to back: "
                         "the cold/floor and cold/warm ratios are reported per pair and as medians (the machine's "
                         "speed drifts between a floor and a gsd process taken minutes apart)")
    ap.add_argument("--malloc", choices=["gsd", "system"], default="gsd",
                    help="gsd (default): this process (floor and per-sample paths included) runs with gsd's "
                         "allocator setting, as the gsd command does (gsd_cli.allocator); system: glibc's "
                         "defaults here and GSD_MALLOC=system for the gsd processes")
    add_json(ap)
    a = ap.parse_args(argv)
    if a.malloc == "gsd":
        from gsd_cli.allocator import keep_freed_memory

        malloc = "gsd (keep_freed_memory: " + ("on" if keep_freed_memory() else "not available here") + ")"
    else:
        os.environ["GSD_MALLOC"] = "system"  # inherited by the gsd processes
        malloc = "system"
    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["OMP_NUM_THREADS"] = str(a.threads)  # inherited by the gsd processes
    dev = resolve_device(a.device)
    doc = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else f"cpu ({os.cpu_count()} cores)",
           "torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform(),
           "argv": sys.argv[1:], "malloc": malloc, "loadavg_start": os.getloadavg()}
    if "rank" not in a.skip:
        r = rank_parts(a.m, a.model, dev)
        if "rank-cli" not in a.skip:
            r["seconds"].update(rank_cli(a.m, str(dev.type)))
        floor = r["seconds"]["floor (plain forward+backward)"]
        r["ratio_to_floor"] = {k: v / floor for k, v in r["seconds"].items()}
        if "rank-cli" not in a.skip:
            cold, warm = "gsd rank cold (empty cache)", "gsd rank warm (same cache)"
            pairs = [{"floor": floor, "cold": r["seconds"][cold], "warm": r["seconds"][warm]}]
            for _ in range(a.cold_repeats - 1):
                f = floor_seconds(a.m, a.model, dev)
                c = rank_cli(a.m, str(dev.type))
                pairs.append({"floor": f, "cold": c[cold], "warm": c[warm]})
            for q in pairs:
                q["cold_over_floor"], q["cold_over_warm"] = q["cold"] / q["floor"], q["cold"] / q["warm"]
            r["pairs"] = pairs
            r["median_cold_over_floor"] = statistics.median(q["cold_over_floor"] for q in pairs)
            r["median_cold_over_warm"] = statistics.median(q["cold_over_warm"] for q in pairs)
        doc["rank"] = r
        print(f"rank: {r['model']} (p={r['params']:,}), {r['sets']} sets x {r['m']} examples, chunk {r['chunk']}; "
              f"API engine: {r['api_engine']} ({r['api_engine_choice']})")
        for k, v in r["seconds"].items():
            cpu = f"  (CPU {CPU_SECONDS[k]:.2f} s, sys {SYS_SECONDS[k]:.2f} s)" if k in CPU_SECONDS else ""
            print(f"  {k:<42} {v:8.2f} s  {r['ratio_to_floor'][k]:6.2f}x floor{cpu}")
        if "pairs" in r:
            print("  pairs (floor, cold, warm): " + "; ".join(
                f"{q['floor']:.2f}/{q['cold']:.2f}/{q['warm']:.2f} s = {q['cold_over_floor']:.2f}x floor, "
                f"cold/warm {q['cold_over_warm']:.2f}" for q in r["pairs"]))
            print(f"  median over {len(r['pairs'])} pairs: cold {r['median_cold_over_floor']:.2f}x floor, "
                  f"cold/warm {r['median_cold_over_warm']:.2f}")
    if "train" not in a.skip:
        t = train_steps(a.batch, a.anchors or a.m, a.repeats, dev)
        base = t["seconds"]["non-private step"]
        t["ratio_to_nonprivate"] = {k: v / base for k, v in t["seconds"].items()}
        doc["train"] = t
        print(f"train steps: {t['model']}, batch {t['batch']}, GEP anchors {t['anchors']} (mean over {a.repeats} x anchor_every steps; GEP {t.get('gep_settings')})")
        for k, v in t["seconds"].items():
            print(f"  {k:<42} {v:8.3f} s  {t['ratio_to_nonprivate'][k]:6.1f}x non-private")
    if a.engines:
        doc["engines"] = engine_rounds(a.engine_models, a.engine_chunks, a.engine_rounds, dev)
        print(f"engines per chunk (median of {a.engine_rounds} interleaved rounds):")
        f = lambda v, spec: "refused" if v is None else format(v, spec)  # noqa: E731
        for e in doc["engines"]:
            print(f"  {e['model']:<10} chunk {e['chunk']:>3}: vmap {f(e['vmap_s'], '.4f')}, hooks {f(e['hooks_s'], '.4f')}, "
                  f"layers {f(e['layers_s'], '.4f')} (s); hooks/vmap {f(e['hooks_over_vmap'], '.2f')}, layers/vmap "
                  f"{f(e['layers_over_vmap'], '.2f')}, layers fastest in {e['layers_fastest_rounds']}/{e['rounds']} rounds")
    if "cli" not in a.skip:
        c = cli_times(str(dev.type))
        doc["cli_seconds"] = c
        print("cli (fresh processes):")
        for k, v in c.items():
            print(f"  {k:<42} {v:8.2f} s  (CPU {CPU_SECONDS[k]:.2f} s)")
    doc["cli_cpu_seconds"] = dict(CPU_SECONDS)
    doc["cli_sys_seconds"] = dict(SYS_SECONDS)
    doc["cli_minor_faults"] = dict(MINOR_FAULTS)
    doc["loadavg_end"] = os.getloadavg()
    print(f"malloc: {malloc}")
    print(f"load average at start {doc['loadavg_start'][0]:.1f}, at end {doc['loadavg_end'][0]:.1f}")
    write_json(a.json, doc, indent=2, loadavg_before=doc["loadavg_start"])


if __name__ == "__main__":
    main()
