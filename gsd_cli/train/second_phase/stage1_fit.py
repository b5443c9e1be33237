"""Stage 1's training on public data (:func:`fit_public`): a seeded validation split of the public
examples, a learning rate chosen on it from a small grid, early stopping, the best epoch's weights kept.

Everything here reads public data only and draws every random number from the public ``seed``, so the
result is a function of public data and public settings (cached: :mod:`gsd_cli.train.second_phase.stage1_cache`).

- **Validation split** (:func:`validation_mask`): each drawn public example is held out with probability
  ``val`` by a rule on that example alone, a hash of (``seed``, its dataset's draw key, its index in the
  dataset): adding or removing other examples moves none. Fewer than one validation or training
  example: no validation (the record says so).
- **Learning rate and length**: for each learning rate of the grid (the model's default lr times
  :data:`LR_FACTORS`; one given lr alone), Adam from the same starting weights, up to ``epochs`` epochs of
  shuffled minibatches (augmented: :mod:`gsd_cli.train.second_phase.augment`); after each epoch the validation accuracy
  (ties: the lower validation loss); a trial stops ``patience`` epochs after its best (0: never early).
  The weights kept are those of the best epoch of the best trial (ties between learning rates: the one
  nearer the default). **A best rate at the grid's edge extends the grid** (issue 61's pilot: from a base, the
  pre-trained default 5e-5 put every candidate's best at the grid's top, 1.5e-4, most at their last epoch): while the
  best trial's rate is the largest (smallest) tried, one more trial at 3 times (a third of) it, at most
  :data:`EXTEND` more trials, so the choice is never a corner unless the extension is spent. Without validation (``val`` 0): one lr, every epoch, the last epoch's weights
  (the stage 1 before issue 61, bit for bit).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn as nn

from ... import data as gdata
from ...gradients import default_loss
from .augment import augment

#: the most public examples stage 1 draws when ``--public-examples`` is not given. Measured (benchmarks/bench_stage1.py,
#: 2-core CPU): fmnist-cnn trains ~1 ms per 28x28 example and epoch, so 50,000 examples (CIFAR-10's training set)
#: are ~1 min an epoch there, a stage 1 of 3 learning rates x ~10 epochs ~30 min: a GPU's job beyond that
STAGE1_CAP = 50_000
EPOCHS, VAL_FRACTION, PATIENCE = 20, 0.1, 3
#: the learning-rate grid: the model's default stage-1 lr (gsd_cli.train.second_phase.default_public_lr) times these
LR_FACTORS = (1 / 3, 1.0, 3.0)
#: the most trials added beyond the grid while its best rate is at an edge (module docstring), each a factor of 3 further
EXTEND = 2
#: inputs up to this many bytes (float32) are decoded once and held; larger sets are read batch by batch
HOLD_BYTES = 768 * 2**20
_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Stage1Settings:
    """Stage 1's settings, resolved: ``lrs`` the learning rates tried (one: no choice), ``augment`` a resolved
    name of :data:`gsd_cli.train.second_phase.augment.AUGMENTS` (not ``auto``); the others as their ``--public-*`` options."""

    lrs: tuple[float, ...]
    epochs: int = EPOCHS
    batch_size: int = 64
    val: float = VAL_FRACTION
    patience: int = PATIENCE
    augment: str = "none"
    seed: int = 0


@dataclass
class Stage1Record:
    """What stage 1 did and chose (public: a function of public data and settings)."""

    lr: float
    lrs: list[float]
    best_epoch: int
    epochs: int
    epochs_run: int
    train_examples: int
    val_examples: int
    val_acc: float | None
    augment: str
    patience: int
    trials: list[dict] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def validation_mask(samples: Sequence, fraction: float, seed: int) -> np.ndarray:
    """True for the examples of ``samples`` (:class:`gsd_cli.data.Sample` s, in order) held out for validation:
    a per-example rule, ``u < fraction`` with ``u`` in [0, 1) a hash of (``seed``, the dataset's draw key, the index)."""
    from ...data.identity import draw_key

    out = []
    with np.errstate(over="ignore"):
        for s in samples:
            key = np.frombuffer(__import__("hashlib").sha256(draw_key(s.source.name).encode()).digest()[:8], dtype=np.uint64)[0]
            base = _mix(np.array([int(seed) % 2**64], dtype=np.uint64) * _GOLD ^ key)
            u = _mix(np.asarray(s.indices, dtype=np.uint64) * _GOLD ^ base)
            out.append((u >> np.uint64(11)).astype(np.float64) / 2.0**53 < fraction)
    return np.concatenate(out) if out else np.zeros(0, dtype=bool)


class _Inputs:
    """The model input of the examples of ``samples`` by position: decoded once and held (CPU) when they fit
    :data:`HOLD_BYTES`, else read at each use."""

    def __init__(self, samples: Sequence, spec, device):
        self.parts = [(s.source, np.asarray(s.indices)) for s in samples]
        self.starts = np.cumsum([0] + [len(i) for _, i in self.parts])
        self.size, self.channels, self.device = spec.input_size, spec.channels, device
        n = int(self.starts[-1])
        self.held = None
        if n * self.channels * self.size**2 * 4 <= HOLD_BYTES:
            self.held = torch.cat([self._read(np.arange(i, min(n, i + 1024)), "cpu") for i in range(0, n, 1024)]) if n else None

    def _read(self, pos: np.ndarray, device) -> torch.Tensor:
        out = torch.empty(len(pos), self.channels, self.size, self.size, device=device)
        part = np.searchsorted(self.starts, pos, side="right") - 1
        for p in np.unique(part):
            where = np.flatnonzero(part == p)
            src, idx = self.parts[p]
            images = gdata.read_images(src, idx[pos[where] - self.starts[p]], self.size)
            out[torch.from_numpy(where).to(out.device)] = gdata.to_model_input(images, self.size, self.channels, device)
        return out

    def __call__(self, pos: np.ndarray) -> torch.Tensor:
        if self.held is not None:
            return self.held[torch.from_numpy(np.asarray(pos))].to(self.device)
        return self._read(np.asarray(pos), self.device)


@torch.no_grad()
def _evaluate(model: nn.Module, inputs: _Inputs, pos: np.ndarray, labels: torch.Tensor, device) -> tuple[float, float]:
    """(accuracy, mean loss) on the examples ``pos``, in eval mode; multi-label: the mean per-label accuracy."""
    model.eval()
    correct, loss = 0.0, 0.0
    try:
        for i in range(0, len(pos), 256):
            part = pos[i:i + 256]
            logits, y = model(inputs(part)), labels[part].to(device)
            loss += float(default_loss(logits, y).sum())
            hit = ((logits > 0) == (y > 0.5)).float().mean(1) if y.dtype.is_floating_point else (logits.argmax(1) == y).float()
            correct += float(hit.sum())
    finally:
        model.train()
    return correct / len(pos), loss / len(pos)


def _epoch(model, opt, inputs, train_pos, labels, s: Stage1Settings, epoch: int, device) -> float:
    """One epoch of shuffled minibatches (augmented); its mean training loss. Its draws from ``s.seed`` and ``epoch``."""
    torch.manual_seed(int(np.random.default_rng([s.seed, 0x5EED1, epoch]).integers(2**62)))  # dropout, if any (forked by the caller)
    order = train_pos[np.random.default_rng([s.seed, 0x2F4A5E, epoch]).permutation(len(train_pos))]
    gen = torch.Generator().manual_seed(int(np.random.default_rng([s.seed, 0xA06, epoch]).integers(2**62)))
    bs = max(1, min(s.batch_size, len(order)))
    total = 0.0
    for start in range(0, len(order), bs):
        part = order[start:start + bs]
        loss = default_loss(model(augment(inputs(part), s.augment, gen)), labels[part].to(device)).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total += float(loss.detach()) * len(part)
    return total / len(order)


def params_of(model: nn.Module, names: Sequence[str], prefix: str = "param.") -> dict:
    """The parameters ``names`` as CPU tensors named ``prefix + name``."""
    p = dict(model.named_parameters())
    return {f"{prefix}{n}": p[n].detach().cpu().clone().contiguous() for n in names}


def adam_of(model: nn.Module, opt: torch.optim.Optimizer, names: Sequence[str]) -> dict:
    """The Adam state of the parameters ``names`` (``adam.exp_avg.NAME``...)."""
    p = dict(model.named_parameters())
    out = {}
    for n in names:
        for k, v in opt.state.get(p[n], {}).items():
            out[f"adam.{k}.{n}"] = (v if isinstance(v, torch.Tensor) else torch.tensor(float(v))).detach().cpu().clone().contiguous()
    return out


def set_params(model: nn.Module, names: Sequence[str], tensors: dict, prefix: str = "param.", opt=None) -> None:
    """Set the parameters ``names`` (and, with ``opt``, their Adam state where ``tensors`` has it) from ``tensors``."""
    p = dict(model.named_parameters())
    with torch.no_grad():
        for n in names:
            p[n].copy_(tensors[f"{prefix}{n}"].to(p[n].device))
            if opt is not None and f"adam.step.{n}" in tensors:
                opt.state[p[n]] = {k: tensors[f"adam.{k}.{n}"].to(p[n].device if k != "step" else "cpu")
                                   for k in ("step", "exp_avg", "exp_avg_sq")}


def _better(a: dict, b: dict | None, default_lr: float) -> bool:
    """Whether result ``a`` (``acc``, ``loss``, ``lr``) beats ``b``: higher accuracy, then lower loss, then nearer the default lr."""
    if b is None:
        return True
    key = (lambda r: (r["acc"], -r["loss"], -abs(math.log(r["lr"] / default_lr))))
    return key(a) > key(b)


def fit_public(model: nn.Module, names: Sequence[str], samples, labels: torch.Tensor, spec, settings: Stage1Settings, device, *,
               progress: Callable | None = None, resume: tuple[dict, dict] | None = None,
               checkpoint: Callable[[dict, dict], None] | None = None) -> Stage1Record:
    """Train the parameters ``names`` of ``model`` (in place; the others must not require grad) on public data:
    ``samples`` (a :class:`gsd_cli.data.Sample` or a list of them) with ``labels`` (class indices, or 0/1 rows
    for multi-label; one per example, in order), inputs shaped by ``spec`` (``input_size``, ``channels``), by
    ``settings`` (module docstring). Leaves the chosen weights in ``model``; returns what it chose.

    ``progress("public", done, total)`` after each epoch (``total``: every trial's ceiling). ``checkpoint(state,
    tensors)`` after each epoch: a JSON ``state`` and the tensors (current parameters and Adam state, the best
    parameters so far) from which ``resume=(state, tensors)`` continues, with the same result. Every random draw
    comes from ``settings.seed``; the caller's generator is left as it was."""
    t0 = time.perf_counter()
    samples = [samples] if isinstance(samples, gdata.Sample) else list(samples)
    mask = validation_mask(samples, settings.val, settings.seed) if settings.val > 0 else np.zeros(len(labels), dtype=bool)
    if mask.all() or not mask.any():
        mask[:] = False
    val_pos, train_pos = np.flatnonzero(mask), np.flatnonzero(~mask)
    s = settings if len(val_pos) else dataclasses.replace(settings, lrs=settings.lrs[len(settings.lrs) // 2:][:1], val=0.0)
    inputs = _Inputs(samples, spec, device)
    state = dict(resume[0]) if resume else {"trial": 0, "epoch": 0, "trials": [], "best": None, "epochs_run": 0}
    tensors = dict(resume[1]) if resume else {}
    start = params_of(model, names, "start.") if not resume else {k: v for k, v in tensors.items() if k.startswith("start.")}
    was = model.training
    model.train()
    with torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else []):
        try:
            _search(model, names, inputs, train_pos, val_pos, labels, s, device, state, tensors, start, progress, checkpoint)
        finally:
            model.train(was)
    best = state["best"]
    if best is not None:  # the best epoch's weights, not the last's
        set_params(model, names, tensors, "best.")
    chosen = state["trials"][best["trial"]] if best is not None else state["trials"][-1]
    return Stage1Record(lr=chosen["lr"], lrs=list(state.get("lrs") or s.lrs), best_epoch=best["epoch"] if best else len(chosen["train_loss"]),
                        epochs=s.epochs, epochs_run=state["epochs_run"], train_examples=len(train_pos), val_examples=len(val_pos),
                        val_acc=best["acc"] if best else None, augment=s.augment, patience=s.patience, trials=state["trials"],
                        train_loss=list(chosen["train_loss"]), seconds=round(time.perf_counter() - t0, 2))


def _search(model, names, inputs, train_pos, val_pos, labels, s: Stage1Settings, device, state, tensors, start, progress, checkpoint):
    """The trials of :func:`fit_public`, from ``state`` (updated in place, with ``tensors``)."""
    params = dict(model.named_parameters())
    default_lr = s.lrs[len(s.lrs) // 2]
    lrs = state.setdefault("lrs", list(s.lrs))  # the grid, and the trials that extend it (module docstring)
    total = len(lrs) * s.epochs
    while state["trial"] < len(lrs):
        ti = state["trial"]
        opt = torch.optim.Adam([params[n] for n in names], lr=lrs[ti])
        if state["epoch"] > 0:  # resumed within this trial
            set_params(model, names, tensors, "param.", opt)
        else:
            set_params(model, names, start, "start.")
            state.update(trial=ti, epoch=0)
            state["trials"].append({"lr": lrs[ti], "train_loss": [], "val_acc": [], "val_loss": [], "best_epoch": None, "stopped_early": False})
        trial = state["trials"][ti]
        first = state["epoch"] if not trial["stopped_early"] else s.epochs  # a trial resumed after it stopped: done
        for epoch in range(first, s.epochs):
            trial["train_loss"].append(_epoch(model, opt, inputs, train_pos, labels, s, epoch, device))
            state["epoch"], state["epochs_run"] = epoch + 1, state["epochs_run"] + 1
            if len(val_pos):
                acc, loss = _evaluate(model, inputs, val_pos, labels, device)
                trial["val_acc"].append(acc)
                trial["val_loss"].append(loss)
                mine, b = {"acc": acc, "loss": loss, "lr": lrs[ti]}, trial["best_epoch"]
                kept = None if b is None else {"acc": trial["val_acc"][b - 1], "loss": trial["val_loss"][b - 1], "lr": lrs[ti]}
                if _better(mine, kept, default_lr):
                    trial["best_epoch"] = epoch + 1
                if _better(mine, state["best"], default_lr):
                    state["best"] = {"trial": ti, "epoch": epoch + 1, "acc": acc, "loss": loss, "lr": lrs[ti]}
                    tensors.update(params_of(model, names, "best."))
            stop = bool(len(val_pos)) and s.patience > 0 and epoch + 1 - trial["best_epoch"] >= s.patience and epoch + 1 < s.epochs
            trial["stopped_early"] = stop
            tensors.update({**params_of(model, names), **adam_of(model, opt, names), **start})
            if checkpoint is not None:
                checkpoint(state, tensors)
            if progress:
                progress("public", ti * s.epochs + (s.epochs if stop else epoch + 1), total)
            if stop:
                break
        state["epoch"] = 0
        state["trial"] = ti + 1
        nxt = _extension(lrs, state["best"], len(s.lrs)) if state["trial"] == len(lrs) and len(val_pos) else None
        if nxt is not None:
            lrs.append(nxt)
            total += s.epochs


def _extension(lrs: list, best: dict | None, grid: int) -> float | None:
    """The next rate when the best trial's is at an edge of those tried (module docstring), else None: a grid of one
    rate (given, or the probe's quick stage 1) and a spent :data:`EXTEND` extend nothing."""
    if best is None or grid < 2 or len(lrs) - grid >= EXTEND:
        return None
    if best["lr"] >= max(lrs):
        return float(f"{max(lrs) * 3:.3g}")
    if best["lr"] <= min(lrs):
        return float(f"{min(lrs) / 3:.3g}")
    return None
