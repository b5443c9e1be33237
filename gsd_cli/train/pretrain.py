"""``gsd pretrain``: a *base* model built from public sets only, the pre-trained weights W_pt of paper 004's Figure 2
(stage 0) that ``--weights BASE`` starts ``gsd train`` and ``gsd rank`` from (:mod:`gsd_cli.models.base`).

:func:`pretrain_base` trains ``model`` from its initialisation (``seed``) on the public sets' own labels, supervised,
with their label spaces concatenated: one head of sum_i C_i outputs, set i's class c being output offset_i + c
(offset_i = C_0 + ... + C_{i-1}). One head rather than one per set: every gsd model has one classification head
(:func:`gsd_cli.models.weights.head_prefix`), so the base is the model itself at a wider head, its file loads with the
ordinary checks and the head is dropped as any pre-trained head is; a head per set would need a model of another shape
for pre-training alone, and what the body learns either way is features that separate the public classes.
The joint softmax also separates the sets from one another, an easy task that costs the body little.

Training: Adam (``lr``, default 1e-3), cross-entropy, shuffled minibatches of ``batch_size`` for ``epochs`` epochs, no
augmentation; a seeded tenth of each set (:data:`VALIDATION_FRACTION`, at least one example from 10 up) is held out,
and the weights kept are those of the epoch with the best accuracy on it (the card records every epoch's). Every draw
comes from ``seed``: the same sets and settings give the same base.

**Privacy.** It reads public data only, is not differentially private and books nothing in the privacy ledger. A set
that is not public in the sense gsd can check is refused before anything is trained (:func:`refuse_private_sets`,
one line, exit 2): a set that is, or shares an example with, a private set named to it (``private``: default gsd's
default private set ``mnist-a``; with a catalogue, also every job's private set), or that the privacy ledger knows as
private data (it, or a set sharing an example with it, has bookings or a budget there; checked read-only where a
ledger exists). A base trained on a private example without noise would void every DP guarantee of a run that starts
from it.
"""

from __future__ import annotations

import copy
import datetime as _dt
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .. import data as gdata
from ..errors import GSDError
from ..models.base import CARD, CARD_FORMAT, WEIGHTS, tensor_list
from . import checkpoint as ckpt

VALIDATION_FRACTION = 0.1
DEFAULT_EPOCHS, DEFAULT_LR, DEFAULT_BATCH = 5, 1e-3, 64
#: what every output of gsd pretrain says about privacy
PRIVACY_NOTE = ("reads public data only; the base is NOT differentially private and costs no privacy budget "
                "(nothing is booked in the privacy ledger)")
#: the model input of all sets is kept in memory when it takes at most this many bytes (else read per batch)
KEEP_INPUT_BYTES = 1 << 30


@dataclass
class PublicPart:
    """One public set of the base: its examples (training and validation indices into ``source``), its classes and
    their offset in the base's head."""

    name: str
    source: gdata.ImageSource
    train: np.ndarray
    val: np.ndarray
    offset: int
    classes: int
    labels: dict = field(default_factory=dict)  # index -> label, of the examples used
    inputs: dict = field(default_factory=dict)  # index -> model input, when kept in memory


def _sources(public, catalog, private) -> tuple[list[tuple[str, gdata.ImageSource]], list[tuple[str, gdata.ImageSource]]]:
    """``(publics, privates)``: the named sets resolved (through the catalogue where one is given; a catalogue
    without ``public`` gives every job's candidates, and adds every job's private set to ``private``)."""
    cat = None
    names = list(public or [])
    private = list(private or [])
    if catalog is not None:
        from ..ranking.catalog import load_catalog

        cat = load_catalog(catalog)
        if not names:
            names = list(dict.fromkeys(c for job in cat.jobs for c in job.candidates))
        private += [job.private for job in cat.jobs if job.private not in private]
    if not names:
        raise GSDError("give the public sets of the base: --public NAME ... or --catalog FILE.toml (its jobs' candidates)")
    if len(set(names)) != len(names):
        raise GSDError(f"--public names a set twice ({', '.join(sorted({n for n in names if names.count(n) > 1}))}); name each once")
    resolve = (lambda n: cat.resolve(n)) if cat is not None else gdata.resolve
    return [(n, resolve(n)) for n in names], [(n, resolve(n)) for n in dict.fromkeys(private)]


def refuse_private_sets(publics, privates, ledger: str | None = None, notify=None) -> list[str]:
    """Refuse (:class:`GSDError`, one line) a public set that is not public in the sense gsd can check (module
    docstring); returns what was checked, for the card."""
    from ..data.identity import shared_examples

    for pname, psrc in privates:
        for name, src in publics:
            why = shared_examples(psrc, src)
            if why:
                raise GSDError(f"--public {name} is not public data here: {why}; a base is built from public sets only "
                               f"(drop {name}, or name another --private)")
    checked = [f"not the private set {n}, and no example shared with it" for n, _ in privates]
    return checked + _refuse_ledger_known(publics, ledger, notify)


def _refuse_ledger_known(publics, location, notify) -> list[str]:
    """Refuse a public set the privacy ledger knows as private data (read only: nothing is added or booked)."""
    from ..privacy.budget.identity import data_identity
    from ..privacy.budget.key import LedgerKeyError
    from ..privacy.budget.store import BudgetLedger

    led = BudgetLedger(location, create=False)
    try:
        if not led.exists:
            return ["no privacy ledger at " + led.shown]
        for name, src in publics:
            try:
                known = led.status_of(data_identity(src))
            except LedgerKeyError as e:
                if notify:
                    notify(f"warning: the public sets were not checked against the privacy ledger ({e})")
                return [f"not checked against the privacy ledger {led.shown} (its key is not at hand)"]
            if known:
                raise GSDError(f"--public {name} is private data to the privacy ledger {led.shown} (it, or a set sharing an "
                               "example with it, has a budget or bookings there: gsd budget show); a base is built from public sets only")
        return [f"none known as private data to the privacy ledger {led.shown}"]
    finally:
        led.close()


def _parts(publics, examples: int | None, seed: int) -> list[PublicPart]:
    """Each set's examples (at most ``examples``, drawn from ``seed``), split into training and validation."""
    parts, offset = [], 0
    for name, src in publics:
        if src.multilabel:
            raise GSDError(f"--public {name} is multi-label; gsd pretrain trains on single-label sets (one class per example)")
        sample = gdata.draw(src, examples, seed)
        y = np.asarray(sample.labels(), dtype=np.int64)
        if len(y) and int(y.min()) < 0:
            raise GSDError(f"--public {name} has negative labels; gsd pretrain trains with the set's own labels 0..C-1")
        classes = max(int(src.num_classes), int(y.max()) + 1 if len(y) else 1)
        order = np.random.default_rng([seed, 0xBA5E, len(parts)]).permutation(len(sample))
        n_val = int(round(VALIDATION_FRACTION * len(order))) if len(order) >= 10 else 0
        idx = sample.indices[order]
        parts.append(PublicPart(name, src, idx[n_val:], idx[:n_val], offset, classes,
                                labels={int(i): int(c) + offset for i, c in zip(sample.indices, y)}))
        offset += classes
    return parts


def _keep_inputs(parts: list[PublicPart], spec, device) -> None:
    """Every example's model input in memory, read once, where they all fit in :data:`KEEP_INPUT_BYTES`."""
    n = sum(len(p.train) + len(p.val) for p in parts)
    if n * spec.channels * spec.input_size ** 2 * 4 > KEEP_INPUT_BYTES:
        return
    for p in parts:
        idx = np.concatenate([p.train, p.val])
        x = gdata.to_model_input(gdata.read_images(p.source, idx, spec.input_size), spec.input_size, spec.channels, device)
        p.inputs = {int(i): x[j] for j, i in enumerate(idx)}


def _batch(part: PublicPart, idx: np.ndarray, spec, device) -> tuple[torch.Tensor, torch.Tensor]:
    if part.inputs:
        x = torch.stack([part.inputs[int(i)] for i in idx])
    else:
        x = gdata.to_model_input(gdata.read_images(part.source, idx, spec.input_size), spec.input_size, spec.channels, device)
    return x, torch.tensor([part.labels[int(i)] for i in idx], dtype=torch.int64, device=device)


def _batches(parts: list[PublicPart], which: str, order: np.ndarray | None, size: int, spec, device):
    """``(x, y)`` minibatches over the sets' ``which`` (train, val) examples, in ``order`` of their concatenation."""
    pool = [(k, int(i)) for k, p in enumerate(parts) for i in getattr(p, which)]
    order = np.arange(len(pool)) if order is None else order
    for start in range(0, len(pool), size):
        chunk = [pool[j] for j in order[start:start + size]]
        xs, ys = zip(*(_batch(parts[k], np.asarray([i for kk, i in chunk if kk == k]), spec, device)
                       for k in sorted({k for k, _ in chunk})))
        yield torch.cat(xs), torch.cat(ys)


def _accuracy(model, parts, spec, device, size: int) -> float | None:
    """Accuracy on the held-out examples of every set (over the whole concatenated label space); None when none."""
    right = total = 0
    was = model.training
    model.eval()
    with torch.no_grad():
        for x, y in _batches(parts, "val", None, size, spec, device):
            right += int((model(x).argmax(1) == y).sum())
            total += len(y)
    model.train(was)
    return right / total if total else None


def _train(model, parts, spec, device, *, epochs: int, lr: float, batch_size: int, seed: int, progress) -> dict:
    """Adam on the sets' training examples; the weights of the best validation epoch are left in ``model``."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    n = sum(len(p.train) for p in parts)
    losses, accs, best, best_state = [], [], None, None
    model.train()
    for epoch in range(epochs):
        torch.manual_seed(int(np.random.default_rng([seed, 0x5EED2, epoch]).integers(2**62)))  # dropout, if any
        order = np.random.default_rng([seed, 0x0BA5, epoch]).permutation(n)
        total = 0.0
        for x, y in _batches(parts, "train", order, batch_size, spec, device):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(y)
        losses.append(round(total / max(n, 1), 6))
        accs.append(_accuracy(model, parts, spec, device, batch_size))
        if accs[-1] is None or best is None or accs[-1] > accs[best]:
            best, best_state = epoch, copy.deepcopy(model.state_dict())
        if progress:
            progress("epoch", epoch + 1, epochs)
    if best_state is not None:
        model.load_state_dict(best_state)
    return {"train_loss": losses, "validation_accuracy": accs, "best_epoch": (best + 1) if best is not None else None}


def _check(epochs: int, lr: float, batch_size: int, examples: int | None) -> None:
    if epochs < 1:
        raise GSDError(f"--epochs must be at least 1 (got {epochs})")
    if not lr > 0:
        raise GSDError(f"--lr must be positive (got {lr})")
    if batch_size < 1:
        raise GSDError(f"--batch-size must be at least 1 (got {batch_size})")
    gdata.check_examples(examples)


def _out_folder(out) -> Path:
    """A new folder for the base: missing or empty, its parent existing. Nothing a user has is overwritten."""
    path = Path(out).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise GSDError(f"--out {path} exists and is not an empty folder; give a new folder for the base")
    if not path.exists() and not path.parent.is_dir():
        raise GSDError(f"--out {path}: folder {path.parent} does not exist; create it first")
    return path


def pretrain_base(public, out, *, model: str = "fmnist-cnn", catalog=None, private=(gdata.DEFAULT_PRIVATE,), epochs: int = DEFAULT_EPOCHS,
                  lr: float = DEFAULT_LR, batch_size: int = DEFAULT_BATCH, seed: int = 0, examples: int | None = None,
                  device: str = "auto", ledger: str | None = None, progress=None, notify=None) -> dict:
    """Build a base from the public sets ``public`` (names; or those of the TOML ``catalog``) and write it to the new
    folder ``out``: ``weights.safetensors`` and ``card.json`` (:mod:`gsd_cli.models.base`). Returns the card.

    ``model``: any gsd model reference (``gsd models list``, ``timm:NAME``, ``PATH.py:FACTORY``); ``examples``: at most
    this many examples of each set (default all); ``private``: the private sets the base must not see (module
    docstring); ``ledger``: the privacy ledger read to check the sets (default gsd's). Costs no privacy: public data
    only, nothing booked. ``progress(name, done, total)`` sees the epochs, ``notify(line)`` a line per set."""
    from .. import __version__
    from ..gradients import resolve_device
    from ..models.spec import build_spec_model, model_label
    from ..models.weights import head_prefix

    _check(epochs, lr, batch_size, examples)
    folder = _out_folder(out)
    publics, privates = _sources(public, catalog, private)
    checked = refuse_private_sets(publics, privates, ledger, notify)
    parts = _parts(publics, examples, seed)
    dev = resolve_device(device)
    spec, net = build_spec_model(model, sum(p.classes for p in parts), seed)
    net = net.to(dev)
    for p in parts:
        if notify:
            notify(f"{p.name}: {len(p.train) + len(p.val)} examples ({len(p.val)} held out), {p.classes} classes -> outputs "
                   f"{p.offset}..{p.offset + p.classes - 1}")
    t0 = time.perf_counter()
    _keep_inputs(parts, spec, dev)
    record = _train(net, parts, spec, dev, epochs=epochs, lr=lr, batch_size=batch_size, seed=seed, progress=progress)
    card = {
        "format": CARD_FORMAT, "gsd_version": __version__, "privacy": PRIVACY_NOTE, "checked": checked,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "model": model_label(model), "architecture": _architecture(model), "input_size": spec.input_size, "channels": spec.channels,
        "head": head_prefix(net), "head_classes": sum(p.classes for p in parts),
        "parameters": sum(t.numel() for t in net.parameters()),
        "sets": [_set_card(p) for p in parts],
        "training": {"seed": seed, "epochs": epochs, "lr": lr, "batch_size": batch_size, "examples_cap": examples, "optimizer": "Adam",
                     "loss": "cross-entropy over the concatenated label spaces", "augmentation": None,
                     "validation_fraction": VALIDATION_FRACTION, **record, "device": dev.type,
                     "seconds": round(time.perf_counter() - t0, 2), "machine": _machine(dev)},
    }
    return write_base(folder, net, card)


def _machine(dev) -> dict:
    """What a bit-for-bit rebuild also needs (the same sets and settings are not enough): float kernels differ by
    CPU instruction set (a base rebuilt on an AVX2 CPU differed from one built with AVX-512), thread count and build."""
    import platform

    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "machine": platform.machine()}
    if dev.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(dev)
    return out


def _architecture(model) -> str:
    from ..models.base import architecture
    from ..models.spec import model_label

    return architecture(model_label(model))


def _set_card(p: PublicPart) -> dict:
    from ..data.fingerprint import sample_fingerprint

    used = np.concatenate([p.train, p.val])
    names = getattr(p.source, "classes", None)
    from ..data.identity import dataset_identity, origin

    ident, split = dataset_identity(p.name)
    where = origin(p.source)
    return {"name": p.name, "identity": ident + (f":{split}" if split else ""), "origin": where[0] if where else None,
            "description": p.source.describe().get("description", ""),
            "fingerprint": sample_fingerprint(p.source, np.sort(used)), "examples": int(len(used)),
            "train_examples": int(len(p.train)), "validation_examples": int(len(p.val)), "classes": p.classes,
            "class_names": [str(c) for c in names] if names else None, "offset": p.offset}


def write_base(folder: Path, model: torch.nn.Module, card: dict) -> dict:
    """``weights.safetensors`` (the model's state dict) then ``card.json`` (``card`` with the weights' SHA-256 and tensor
    list) in ``folder``; the card is written last, so a folder without it is no base. Returns the card."""
    from safetensors.torch import save as st_save

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    blob = st_save(state, metadata={"gsd_base": CARD_FORMAT})
    folder.mkdir(exist_ok=True)
    ckpt.atomic_write(folder / WEIGHTS, blob)
    card = {**card, "weights": WEIGHTS, "weights_sha256": hashlib.sha256(blob).hexdigest(), "tensors": tensor_list(state)}
    ckpt.atomic_write(folder / CARD, json.dumps(card, indent=2) + "\n")
    return card
