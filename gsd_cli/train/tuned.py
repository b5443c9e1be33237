"""``gsd train``'s defaults of the private training's learning rate, length and batch size, per model and method,
where the held-out benchmark tuned them; :data:`UNTUNED` elsewhere.

Where they come from: round 6 of the held-out benchmark (issue 52; ``benchmarks/validity/heldout/round6/``), whose
protocol (``split6.json``) was committed before the tuning ran. DP-SGD and the second phase were each tuned over the
same grid, learning rate 0.5, 1, 2, 4 x 3, 6, 12 epochs at Poisson batches of 500, on ``split.json``'s four
selection tasks (MNIST, MNIST in photo crops, Fashion-MNIST, animal silhouettes; 3,000-10,000 private examples, the
FMNIST CNN at 28 x 28 x 1 and 32 x 32 x 3) with three seeds at epsilon 2, delta 1e-5, clip 1, momentum 0.9, the step
schedule; the grid point with the best mean accuracy is ``benchmarks/results/heldout6/tuned6.json``. Both methods
chose lr 0.5 and 12 epochs (DP-SGD: 66.9% mean accuracy, against 58.9% at rounds 1-5's 3 epochs and lr 2). That
point is a corner of the grid: a lower rate or a longer run was not tried. Other models and methods were not tuned
by the benchmark and keep gsd's earlier defaults (:data:`UNTUNED`).
"""

from __future__ import annotations

#: the defaults of every model and method the benchmark did not tune
UNTUNED = {"lr": 0.1, "epochs": 20, "batch_size": 250}
#: (model family, method) -> the tuned settings (the model reference without its ``@SIZE`` suffix)
TUNED = {
    ("fmnist-cnn", "dpsgd"): {"lr": 0.5, "epochs": 12, "batch_size": 500},
    ("fmnist-cnn", "second-phase"): {"lr": 0.5, "epochs": 12, "batch_size": 500},
}
SOURCE = "benchmarks/results/heldout6/tuned6.json (the held-out benchmark's round-6 tuning; docs/validity.md)"
#: the settings this module decides
FIELDS = tuple(UNTUNED)


def family(model) -> str | None:
    """The registry name of a model reference without its input suffix (``fmnist-cnn@32x3`` -> ``fmnist-cnn``);
    None for a model given as an object, a file or timm (never tuned here)."""
    if not isinstance(model, str) or ":" in model or model.endswith(".py"):
        return None
    return model.split("@", 1)[0].strip()


def training_defaults(model, method: str) -> dict:
    """``lr``, ``epochs`` and ``batch_size`` for a training of ``model`` by ``method``: the tuned point where the
    benchmark tuned that pair (:data:`TUNED`), else :data:`UNTUNED`."""
    return dict(TUNED.get((family(model), method), UNTUNED))


def is_tuned(model, method: str) -> bool:
    return (family(model), method) in TUNED


def fill_defaults(cfg, given) -> list[str]:
    """Set every one of :data:`FIELDS` that is not in ``given`` (the settings the user gave) to
    :func:`training_defaults` of ``cfg``'s model and (decided) method; returns the names it changed."""
    changed = []
    for name, value in training_defaults(cfg.model, cfg.method).items():
        if name not in given and getattr(cfg, name) != value:
            setattr(cfg, name, value)
            changed.append(name)
    return changed
