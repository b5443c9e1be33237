"""Does GSD predict second-phase pre-training's benefit? Paper 004's Table 3 (Section 6.2) offline.

Nothing is downloaded, so stage 0 is made real here: the fmnist-cnn backbone is pre-trained
(non-privately, all parameters, Adam) on scikit-image's textures (3 classes; they are also one of the
public candidates) and saved as safetensors; that file is the ``--weights`` of everything after it.
Then, with the PEFT choice ``conv2,fc1,fc2`` (the last convolution and the two Linear layers, the
first convolution frozen; Table 8 picks one or two late convolutions and the classifier; with
``conv2.weight,fc2`` alone this 26k-parameter backbone learned MNIST no better than chance in a trial):

* GSD of every embedded public candidate to the private training part (mnist-a:train), computed by
  :func:`gsd_cli.ranking.rank` with the same model, weights and ``--peft`` (k=16, random labels);
* for each candidate and seed: ``gsd train --method second-phase`` (stage 1: Adam on the candidate's
  own labels; stage 2: DP-SGD on mnist-a:train at epsilon=2, delta=1e-5, evaluated on mnist-a:test);
* the baseline ``-``: DP-SGD from the stage-0 weights without a second phase.

Reports accuracy mean +- sd per candidate and Spearman / Kendall between mean GSD and mean accuracy.

    OMP_NUM_THREADS=1 python benchmarks/bench_second_phase.py --json benchmarks/results/second_phase_cpu.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_second_phase
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from gsd_cli.data import DEFAULT_PUBLIC, resolve, to_model_input
from gsd_cli.gradients import default_loss
from gsd_cli.ranking import rank
from gsd_cli.train import TrainConfig, train

from .harness import add_json, write_json

PEFT = "conv2,fc1,fc2"


def pretrain(path: Path, dataset: str, epochs: int, seed: int) -> dict:
    """Stage 0: fmnist-cnn trained on ``dataset`` (all parameters, Adam 1e-3, batch 64), saved to ``path``."""
    from safetensors.torch import save_file

    from probes import get_model_spec

    spec = get_model_spec("fmnist-cnn")
    src = resolve(dataset)
    torch.manual_seed(seed)
    net = spec.build(num_classes=src.num_classes, seed=seed)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = to_model_input(src.images(np.arange(len(src))), spec.input_size, spec.channels, "cpu")
    y = torch.as_tensor(src.labels(np.arange(len(src))))
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for _ in range(epochs):
        for part in np.array_split(rng.permutation(len(y)), max(1, len(y) // 64)):
            loss = default_loss(net(x[part]), y[part]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        acc = float((net(x).argmax(1) == y).float().mean())
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return {"dataset": dataset, "epochs": epochs, "train_accuracy": acc, "seconds": round(time.perf_counter() - t0, 1)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--publics", nargs="+", default=list(DEFAULT_PUBLIC))
    ap.add_argument("--pretrain-on", default="textures")
    ap.add_argument("--pretrain-epochs", type=int, default=3)
    ap.add_argument("--public-examples", type=int, default=1000)
    ap.add_argument("--public-epochs", type=int, default=3)
    ap.add_argument("--public-lr", type=float, default=3e-3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--rank-examples", type=int, default=1000)
    ap.add_argument("--labels", choices=("random", "own"), default="random", help="labels of the GSD gradients")
    ap.add_argument("--reuse-runs", type=Path, default=None,
                    help="take the trainings (accuracies) from this result file of the same settings; compute only GSD")
    add_json(ap)
    args = ap.parse_args(argv)
    t_all = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="gsd-bench-2p-"))
    weights = tmp / "fmnist-cnn-textures.safetensors"
    stage0 = pretrain(weights, args.pretrain_on, args.pretrain_epochs, 0)
    print("stage 0:", stage0, flush=True)
    reused = None
    if args.reuse_runs:
        reused = json.loads(args.reuse_runs.read_text())
        same = ("seeds", "publics", "pretrain_on", "pretrain_epochs", "public_examples", "public_epochs", "public_lr",
                "epochs", "lr", "clip", "epsilon", "momentum")
        diff = [k for k in same if reused["args"].get(k) != vars(args)[k]]
        if diff or abs(reused["stage0"]["train_accuracy"] - stage0["train_accuracy"]) > 1e-6:
            raise SystemExit(f"--reuse-runs {args.reuse_runs}: other settings ({diff or 'stage-0 weights differ'})")
    gsd: dict[str, list[float]] = {p: [] for p in args.publics}
    for seed in args.seeds:
        rk = rank("mnist-a:train", args.publics, model="fmnist-cnn", weights=str(weights), peft=PEFT, k=16,
                  examples=args.rank_examples, seed=seed, device="cpu", labels=args.labels)
        for r in rk:
            gsd[r.public].append(r.distance)
        print(f"seed {seed} GSD:", {r.public: round(r.distance, 4) for r in rk}, flush=True)
    runs = list(reused["runs"]) if reused else []
    for seed in ([] if reused else args.seeds):
        for cand in ["-", *args.publics]:
            cfg = TrainConfig(
                private="mnist-a", public=None if cand == "-" else cand, method="dpsgd" if cand == "-" else "second-phase",
                model="fmnist-cnn", weights=str(weights), peft=PEFT, epsilon=args.epsilon, delta=1e-5,
                epochs=args.epochs, batch_size=250, lr=args.lr, momentum=args.momentum, weight_decay=0.0, lr_schedule="constant",
                clip=args.clip, seed=seed, deterministic_noise=True, public_examples=args.public_examples,
                public_epochs=args.public_epochs, public_lr=args.public_lr,
            )
            t0 = time.perf_counter()
            s = train(cfg, tmp / f"run-{cand}-{seed}")
            runs.append({"public": cand, "seed": seed, "accuracy": s["test"]["accuracy"], "epsilon": s["epsilon"],
                         "seconds": round(time.perf_counter() - t0, 1),
                         "stage1_loss": (s["stages"][1].get("train_loss") or [None])[-1]})
            print(runs[-1], flush=True)
    from scipy.stats import kendalltau, spearmanr

    table = []
    for cand in ["-", *args.publics]:
        accs = [r["accuracy"] for r in runs if r["public"] == cand]
        g = gsd.get(cand)
        table.append({"public": cand, "gsd_mean": statistics.mean(g) if g else None, "gsd_sd": statistics.stdev(g) if g and len(g) > 1 else None,
                      "acc_mean": statistics.mean(accs), "acc_sd": statistics.stdev(accs) if len(accs) > 1 else None})
    table.sort(key=lambda r: -r["acc_mean"])
    cands = [r for r in table if r["gsd_mean"] is not None]
    rho = spearmanr([r["gsd_mean"] for r in cands], [r["acc_mean"] for r in cands]).statistic
    tau = kendalltau([r["gsd_mean"] for r in cands], [r["acc_mean"] for r in cands]).statistic
    print("\n| accuracy (mean +- sd) | public | GSD (mean +- sd) |\n|---|---|---|")
    for r in table:
        g = "-" if r["gsd_mean"] is None else f"{r['gsd_mean']:.3f} +- {r['gsd_sd'] or 0:.3f}"
        print(f"| {100 * r['acc_mean']:.2f}% +- {100 * (r['acc_sd'] or 0):.2f} | {r['public']} | {g} |")
    print(f"Spearman(GSD, accuracy) = {rho:.3f}, Kendall tau = {tau:.3f} (negative: lower GSD, higher accuracy)")
    result = {
        "benchmark": "bench_second_phase", "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "peft": PEFT, "labels": args.labels, "runs_from": str(args.reuse_runs) if args.reuse_runs else None, "stage0": stage0, "gsd": gsd, "runs": runs, "table": table, "spearman": rho, "kendall": tau,
        "seconds": round(time.perf_counter() - t_all, 1), "loadavg": os.getloadavg(), "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__, "platform": platform.platform(),
    }
    if args.json:
        write_json(args.json, result, indent=2)
        print("wrote", args.json)


if __name__ == "__main__":
    main()
