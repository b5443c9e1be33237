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

**The second phase was tuned again** for the stage 1 that learns (issue 61), which hands stage 2 a far better model
than round 6's (2 epochs on 2,000 public examples): issue 61's pass 3 (``benchmarks/validity/pilot/plan61c.json``,
committed before it ran) trained it from scratch over lr 0.125, 0.25, 0.5 x 6, 12 epochs on the same four selection
tasks (whole private sets, each with its same-distribution public split, epsilon 2, seeds 0-2): lr 0.125 and 12
epochs, 80.7% mean against 75.5% at round 6's point (``benchmarks/results/pilot61/tuned3.json``); the smallest rate, a
corner again.

**The learning rate follows the batch** (issue 64). Each default learning rate is tuned *at its batch size*: DP-SGD's
update is ``lr x (sum of the clipped gradients + noise) / B``, so at another ``B`` the same ``lr`` takes steps of
another length per example. Where the user gives ``--batch-size B`` and no ``--lr``, the rate is scaled linearly,
``lr = lr_0 x B / B_0`` (the linear scaling rule: Goyal et al. 2017, *Accurate, Large Minibatch SGD*; for DP-SGD's
noisy average, keeping ``lr / B`` fixed is the usual way to move a tuned point to another batch, e.g. Sander, Stock,
Sablayrolles 2023, *TAN without a burn*). Measured on 311 MNIST images at epsilon 2 (``benchmarks/bench_small_private.py``,
five runs each, chance 0.10): ``--batch-size 64`` at the tuned lr 0.5 reached 0.11, at the scaled 0.064 0.32. Where the size is declared
(``--expected-size N``) and no ``--batch-size`` is given, the batch is at most ``N / SMALL_SET_STEPS`` (an epoch of at
least that many steps; 316 examples at the tuned batch 500 took one step an epoch, q = 1), with the rate scaled with
it. Both are functions of public settings only (the declared size, the batch): the private data sets nothing here.
"""

from __future__ import annotations

import math

#: the defaults of every model and method the benchmark did not tune
UNTUNED = {"lr": 0.1, "epochs": 20, "batch_size": 250}
#: (model family, method) -> the tuned settings (the model reference without its ``@SIZE`` suffix)
TUNED = {
    ("fmnist-cnn", "dpsgd"): {"lr": 0.5, "epochs": 12, "batch_size": 500},
    # re-tuned for the stage 1 that learns (issue 61's pass 3, plan61c.json): round 6's lr 0.5 lost 5.2 points there
    ("fmnist-cnn", "second-phase"): {"lr": 0.125, "epochs": 12, "batch_size": 500},
}
SOURCE = ("benchmarks/results/heldout6/tuned6.json (the held-out benchmark's round-6 tuning) and, for the second phase, "
          "benchmarks/results/pilot61/tuned3.json (issue 61's pass 3; docs/validity.md)")
#: (model family, method, PEFT choice) -> the tuned settings of a run that starts from pre-trained weights (``--weights``:
#: a base of ``gsd pretrain`` or published weights); PEFT ``all`` is no ``--peft``. Tuned by issue 61's pilot
#: (``benchmarks/validity/pilot/plan61.json``, committed before it ran): DP fine-tuning from a base built of public
#: sets that hold none of the task's source (``ft-base``), learning rate 0.125, 0.25, 0.5 x 6, 12 epochs x PEFT all,
#: last, head, on the selection tasks mnist (28 x 28 x 1) and mnist-m (32 x 32 x 3), 2,000 private examples, epsilon 2,
#: seeds 0-1; the point of best mean accuracy per PEFT choice (``benchmarks/results/pilot61/tuned.json``). Every choice
#: chose lr 0.5 and 12 epochs, a corner of that grid, as round 6's from-scratch tuning did; all parameters (52.3% mean)
#: beat ``last`` and ``head`` (40.3%; on the FMNIST CNN both train the last layer alone). The second phase from a base
#: was tuned apart (the pilot's pass 2, ``plan61b.json``): stage 1 on each task's related candidate (UCI digits), then
#: DP fine-tuning over lr 0.03125-0.5 x 3, 6, 12 epochs; lr 0.25 and 12 epochs (63.2% mean; at 0.5, 58.6%), the longest
#: run a corner (``benchmarks/results/pilot61/tuned2.json``).
FROM_BASE = {
    ("fmnist-cnn", "dpsgd", "all"): {"lr": 0.5, "epochs": 12, "batch_size": 500},
    ("fmnist-cnn", "dpsgd", "last"): {"lr": 0.5, "epochs": 12, "batch_size": 500},
    ("fmnist-cnn", "dpsgd", "head"): {"lr": 0.5, "epochs": 12, "batch_size": 500},
    # the second phase from a base, all parameters: pass 2 of the pilot (plan61b.json; benchmarks/results/pilot61/tuned2.json)
    ("fmnist-cnn", "second-phase", "all"): {"lr": 0.25, "epochs": 12, "batch_size": 500},
}
#: the settings this module decides
FIELDS = tuple(UNTUNED)


def family(model) -> str | None:
    """The registry name of a model reference without its input suffix (``fmnist-cnn@32x3`` -> ``fmnist-cnn``);
    None for a model given as an object, a file or timm (never tuned here)."""
    if not isinstance(model, str) or ":" in model or model.endswith(".py"):
        return None
    return model.split("@", 1)[0].strip()


def _from_base_key(model, method: str, weights, peft) -> tuple | None:
    """The :data:`FROM_BASE` key of a run from pre-trained ``weights`` (None: from scratch, or a PEFT choice not tuned)."""
    if weights is None:
        return None
    return family(model), method, "all" if peft is None else str(peft)


def training_defaults(model, method: str, weights=None, peft=None) -> dict:
    """``lr``, ``epochs`` and ``batch_size`` for a training of ``model`` by ``method``: from pre-trained ``weights``
    with ``peft``, the tuned from-base point where issue 61's pilot tuned it (:data:`FROM_BASE`); else the tuned point
    where the benchmark tuned that pair (:data:`TUNED`), else :data:`UNTUNED`."""
    key = _from_base_key(model, method, weights, peft)
    if key in FROM_BASE:
        return dict(FROM_BASE[key])
    return dict(TUNED.get((family(model), method), UNTUNED))


def is_tuned(model, method: str, weights=None, peft=None) -> bool:
    return _from_base_key(model, method, weights, peft) in FROM_BASE or (family(model), method) in TUNED


def tuned_where(model, method: str, weights=None, peft=None) -> str:
    """Where the default point of a run came from, in words (its plan line)."""
    if _from_base_key(model, method, weights, peft) in FROM_BASE:
        return f"tuned for {method} from a base on {family(model)}{'' if peft is None else f' (--peft {peft})'}"
    if (family(model), method) in TUNED:
        return f"tuned for {method} on {family(model)}"
    return "gsd's default"


#: with a declared size N and no --batch-size, an epoch takes at least this many steps (the batch at most N / 4)
SMALL_SET_STEPS = 4


def scaled_lr(model, method: str, batch_size: int, weights=None, peft=None) -> float:
    """The default learning rate at ``batch_size``: the default point's rate times ``batch_size`` over its batch
    (module docstring: the linear scaling rule)."""
    d = training_defaults(model, method, weights, peft)
    return d["lr"] * int(batch_size) / d["batch_size"]


def training_settings(model, method: str, *, expected_size: int | None = None, weights=None, peft=None, **given) -> dict:
    """``lr``, ``epochs`` and ``batch_size`` of a run of ``model`` by ``method``: those in ``given`` (the user's) as
    given; the others the defaults (:func:`training_defaults`), but for the batch, at most ``expected_size //``
    :data:`SMALL_SET_STEPS` when a size is declared, and the learning rate, scaled to the batch when that is not the
    default's (:func:`scaled_lr`)."""
    values = training_defaults(model, method, weights, peft)
    default_batch = values["batch_size"]
    values.update({k: v for k, v in given.items() if k in FIELDS and v is not None})
    if given.get("batch_size") is None and isinstance(expected_size, int) and expected_size >= 2:
        values["batch_size"] = max(1, min(default_batch, expected_size // SMALL_SET_STEPS))
    if given.get("lr") is None and values["batch_size"] != default_batch:
        values["lr"] = scaled_lr(model, method, values["batch_size"], weights, peft)
    return values


def lr_reason(model, method: str, lr: float, batch_size: int, weights=None, peft=None) -> str:
    """Where a run's learning rate came from, for its plan line: the default at its batch (tuned or not), that default
    scaled to another batch, or given."""
    d = training_defaults(model, method, weights, peft)
    what = tuned_where(model, method, weights, peft) + f" at batch {d['batch_size']}"
    if math.isclose(lr, d["lr"]) and int(batch_size) == d["batch_size"]:
        return f"lr {lr:g} ({what})"
    if math.isclose(lr, scaled_lr(model, method, batch_size, weights, peft), rel_tol=1e-9):
        return f"lr {lr:.4g} ({d['lr']:g}, {what}, scaled to batch {batch_size}: lr / batch kept)"
    return f"lr {lr:g} (as given)"


def small_set_note(batch_size: int) -> str:
    """The note of a run whose DP size estimate was at most its batch (every step took every example, q = 1): what
    to give instead, the learning rate following the batch either way (module docstring)."""
    return (f"the DP estimate of the private set's size is at most --batch-size {batch_size}: every step used all examples "
            f"(q = 1, one step an epoch); declare the size, --expected-size N (the batch is then at most N / {SMALL_SET_STEPS}), "
            f"or give --batch-size about a quarter of the set: without --lr, the learning rate is scaled with the batch")


def fill_defaults(cfg, given) -> list[str]:
    """Set every one of :data:`FIELDS` that is not in ``given`` (the settings the user gave) to
    :func:`training_settings` of ``cfg``'s model, (decided) method and declared size, keeping those given (the learning
    rate scaled to a given batch); returns the names it changed."""
    changed = []
    values = training_settings(cfg.model, cfg.method, expected_size=cfg.expected_size, weights=cfg.weights, peft=cfg.peft,
                               **{n: getattr(cfg, n) for n in given})
    for name, value in values.items():
        if name not in given and getattr(cfg, name) != value:
            setattr(cfg, name, value)
            changed.append(name)
    return changed
