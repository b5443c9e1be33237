"""Stage 1 of the second phase, old against new (issue 61): its time and what it learns, and the second phase
against DP-SGD from scratch where the public set is a same-distribution split.

``--part stage1``: stage 1 alone (:func:`gsd_cli.train.second_phase.run_second_phase`, the stage-1 cache off) of
the model (default fmnist-cnn, from scratch, as ``gsd train``) on the public set (default mnist-b, 2,500 embedded
MNIST digits) for the private task's label space (mnist-a's ten digits: the head is shared), in four settings:

* ``old``: the default before issue 61, 2,000 examples, 5 epochs, lr 3e-3, no validation, no augmentation;
* ``new``: today's default, every example (at most 50,000) less a seeded 10% validation split, lr chosen of
  1e-3, 3e-3 and 9e-3 on it, up to 20 epochs each with patience 3, the best epoch kept, augmentation ``auto``;
* ``quick``: the feature probe's default stage 1 (``--probe-stage1 quick``): ``new`` with the default lr alone;
* ``new-noaug``: ``new`` without augmentation.

Each: seconds, epochs run, the validation accuracy it chose by (``new``), and the accuracy of the stage-1 model on
mnist-a's test part (509 digits no stage 1 saw; a public-data-only model scored on the private task's test set:
this benchmark's figure, never a ``gsd train`` output).

``--part target``: ``gsd train --private mnist-a --method second-phase --public mnist-b --epsilon 2`` against
``--method dpsgd`` (each with ``gsd train``'s tuned defaults, ``gsd_cli.train.tuned``), over ``--seeds`` (private
noise from ``--insecure-seed``: reproducible, not DP): test accuracy mean and each seed's. The runs book into a
ledger in a temporary folder, and the stage-1 cache is a temporary one: nothing of the user's is touched.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_stage1 --part stage1 --json benchmarks/results/cpu_stage1.json
    OMP_NUM_THREADS=1 python -m benchmarks.bench_stage1 --part target --json benchmarks/results/cpu_stage1_target.json

On the held-out benchmark's selection tasks (issue 61's target: MNIST and photos, each with its same-distribution public
split, the whole private training set, epsilon 2; benchmark-only data)::

    OMP_NUM_THREADS=1 python -m benchmarks.bench_stage1 --part target --round 1 --private mnist-train --private-test mnist-test \
        --public pub-mnist --json benchmarks/results/cpu_stage1_target_mnist.json
    OMP_NUM_THREADS=1 python -m benchmarks.bench_stage1 --part target --round 1 --private photos-train --private-test photos-test \
        --public pub-photos --model fmnist-cnn@32x3 --json benchmarks/results/cpu_stage1_target_photos.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_stage1
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from .harness import add_json, loadavg, write_json

SETTINGS = {
    "old": dict(public_examples=2000, public_epochs=5, public_val=0.0, public_patience=0, public_augment="none"),
    "new": {},
    "quick": dict(probe_stage1="quick"),
    "new-noaug": dict(public_augment="none"),
}


@torch.no_grad()
def _test_accuracy(model, spec, test: str) -> float:
    from gsd_cli.data import read_images, resolve, to_model_input

    src = resolve(test)
    idx = np.arange(len(src))
    x = to_model_input(read_images(src, idx, spec.input_size), spec.input_size, spec.channels, "cpu")
    y = torch.as_tensor(np.asarray(src.labels(idx)))
    model.eval()
    return float((model(x).argmax(1) == y).float().mean())


def stage1_arm(name: str, a) -> dict:
    """One stage 1 in setting ``name`` (:data:`SETTINGS`) on a fresh model, the stage-1 cache empty."""
    from gsd_cli.data import resolve
    from gsd_cli.models.peft import build_model
    from gsd_cli.train import TrainConfig
    from gsd_cli.train.second_phase import stage1_cache
    from gsd_cli.advice.probe import _Settings
    from gsd_cli.train.second_phase import run_second_phase

    stage1_cache.clear()
    cfg = TrainConfig(private=a.private, public=a.public, method="second-phase", model=a.model, seed=a.seed, **SETTINGS[name])
    settings = _Settings(cfg, a.public, a.seed) if name == "quick" else cfg
    private = resolve(a.private)
    spec, model, names, _ = build_model(a.model, private.num_classes, a.seed)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rec = run_second_phase(model, names, settings, spec, Path(tmp), torch.device("cpu"), num_classes=private.num_classes,
                               multilabel=False, private_classes=getattr(private, "classes", None))
        seconds = time.perf_counter() - t0
    c = rec["search"]
    row = {"setting": name, "seconds": round(seconds, 1), "examples": rec["public_examples"], "train_examples": c["train_examples"],
           "val_examples": c["val_examples"], "lr": rec["lr"], "lrs": c["lrs"], "best_epoch": c["best_epoch"],
           "epochs_run": c["epochs_run"], "val_acc": c["val_acc"], "augment": c["augment"],
           "test_acc": round(_test_accuracy(model, spec, a.test), 4), "line": rec["line"], "loadavg": loadavg()}
    print(json.dumps(row), flush=True)
    return row


def target_arm(method: str, seed: int, a, out: Path) -> dict:
    """``gsd train --private PRIVATE --method METHOD --public PUBLIC --epsilon E`` with the tuned defaults."""
    from gsd_cli.train import TrainConfig, train
    from gsd_cli.train.second_phase import stage1_cache
    from gsd_cli.train.tuned import fill_defaults

    stage1_cache.clear()
    cfg = TrainConfig(private=a.private, private_test=a.private_test, method=method,
                      public=a.public if method == "second-phase" else None, model=a.model, epsilon=a.epsilon, seed=seed,
                      insecure_seed=seed)
    fill_defaults(cfg, set())
    t0 = time.perf_counter()
    s = train(cfg, out)
    priv = json.loads((out / "private-summary.json").read_text())
    row = {"method": method, "seed": seed, "accuracy": priv["test"]["accuracy"], "seconds": round(time.perf_counter() - t0, 1),
           "epochs": cfg.epochs, "lr": cfg.lr, "batch_size": cfg.batch_size, "epsilon": s["epsilon"], "loadavg": loadavg()}
    if method == "second-phase":
        row["stage1"] = s["stages"][1]["line"]
    print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("stage1", "target", "both"), default="both")
    ap.add_argument("--model", default="fmnist-cnn")
    ap.add_argument("--public", default="mnist-b")
    ap.add_argument("--private", default="mnist-a")
    ap.add_argument("--test", default="mnist-a:test", help="held-out digits the stage-1 models are scored on")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--part target: seeds (and insecure seeds)")
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--private-test", default=None, help="--part target: the test set (default: the private set's test part)")
    ap.add_argument("--round", type=int, default=None,
                    help="make the held-out benchmark's round N sets resolvable by name (benchmark-only data: python -m "
                         "benchmarks validity --round N prepare), e.g. --round 1 --private photos-train --private-test "
                         "photos-test --public pub-photos --model fmnist-cnn@32x3")
    add_json(ap)
    a = ap.parse_args(argv)
    before = loadavg()
    box = Path(tempfile.mkdtemp(prefix="gsd-bench-stage1-"))  # never the user's cache, ledger or ledger keys
    os.environ.update(GSD_CACHE_DIR=str(box / "cache"), GSD_LEDGER=str(box / "ledger.sqlite"), XDG_CONFIG_HOME=str(box / "config"))
    if a.round is not None:
        from .validity.heldout.run import ready

        ready(a.round)
    doc: dict = {"model": a.model, "public": a.public, "private": a.private, "private_test": a.private_test, "round": a.round,
                 "cpu_threads": torch.get_num_threads()}
    if a.part in ("stage1", "both"):
        doc["stage1"] = [stage1_arm(n, a) for n in a.settings]
    if a.part in ("target", "both"):
        with tempfile.TemporaryDirectory() as tmp:
            rows = [target_arm(m, s, a, Path(tmp) / f"{m}-{s}") for s in a.seeds for m in ("dpsgd", "second-phase")]
        doc["target"] = rows
        doc["target_mean"] = {m: round(statistics.mean(r["accuracy"] for r in rows if r["method"] == m), 4)
                              for m in ("dpsgd", "second-phase")}
        print(json.dumps(doc["target_mean"]), flush=True)
    write_json(a.json, doc, loadavg_before=before)


if __name__ == "__main__":
    main()
