"""Second-phase pre-training (paper 004, Section 5.1, equation 13): f_2pt(W_pt, theta; x_pub) -> theta_0.

Stage 1 of ``gsd train --method second-phase``: the trainable parameters theta (the ``--peft``
choice; everything else frozen) are trained on the public set with its own labels by Adam
(:func:`gsd_cli.train.second_phase.stage1_fit.fit_public`): all of its examples (at most :data:`STAGE1_CAP`, or
``--public-examples``), less a seeded validation split (``--public-val``, 10%) on which stage 1 picks its
learning rate from a grid around the model's default (paper 004 Appendix B: 5e-5 for pre-trained CNNs,
3e-3 for transformers; 3e-3 from scratch; ``--public-lr`` fixes one) and its length (up to
``--public-epochs``, stopping ``--public-patience`` epochs after the best, whose weights are kept), its
training batches augmented (``--public-augment``, :mod:`gsd_cli.train.second_phase.augment`). It sees public data only
and costs no privacy budget; what it chose is one public line (:func:`stage1_line`) and ``stage1.json``.
Stage 2 (equation 14) is DP-SGD on the private set from theta_0, accounted exactly as ``--method dpsgd``.

The model's head is sized to the private task. Where the public labels *are* private classes (every
public class name is a private class name; each is mapped to its private index), or multi-label of the
same width, the second phase trains that head too; otherwise a separate head sized to the public labels is trained in its place for stage 1
and the private head keeps its initial weights (the summary says which). A public label that merely
fits the head's index range is not the private class of that index: a 6-class photo set trained into
a 10-class digit head taught output 3 "coffee" and pushed outputs 6-9 down, and gsd's held-out
benchmark measured the second phase at chance (10%) on MNIST-M after it (issue 42).

The result is saved in the run folder (``stage1.safetensors``: while stage 1 runs, the current
parameters, their Adam state and the best parameters so far, written after every public epoch; then
theta_0; ``stage1.json``: settings, epochs done, the search's state, what stage 1 chose). ``--resume``
loads it instead of training again (an interrupted stage 1 continues from its last epoch; every random
draw of stage 1 comes from ``--seed``, so the result is the same either way). As with the main
checkpoint, ``stage1.json`` is verified: ``stage1.safetensors`` carries the digest of its settings, the
run's settings, the epochs done, the losses and the search (:func:`stage1_digest`), and a folder whose two
files disagree, or whose weights carry no digest, is refused. A folder written before the validation
split existed resumes as it began (:data:`LEGACY`: no validation, no augmentation, one lr).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from ... import data as gdata
from ...errors import GSDError
from ...models.weights import head_prefix
from .. import checkpoint as ckpt
from .augment import resolve_augment
from .stage1_fit import LR_FACTORS, PATIENCE, STAGE1_CAP, VAL_FRACTION, Stage1Settings, fit_public, params_of, set_params

STAGE1_WEIGHTS = "stage1.safetensors"
STAGE1_META = "stage1.json"
#: the settings stage 1 depends on (a resumed run must have the same)
STAGE1_KEYS = ("public", "model", "weights", "peft", "params", "seed", "public_examples", "public_epochs",
               "public_lr", "public_batch_size", "public_val", "public_patience", "public_augment", "private")
#: the stage-1 settings a ``stage1.json`` written before they existed was trained with (no validation, no augmentation)
LEGACY = {"public_val": 0.0, "public_patience": 0, "public_augment": "none"}

TRANSFORMER_LR, CNN_LR = 3e-3, 5e-5
#: stage 1 of a model trained from scratch (no --weights): paper 004's 5e-5 is for fine-tuning pre-trained
#: CNN backbones and hardly moves a model at its initialisation. gsd's downstream benchmark (issue 33,
#: fmnist-cnn from scratch, mnist, seed 0): 90.9% / 91.0% (pub-mnist / rot30) at 3e-3 against
#: 83.4% / 83.8% at 5e-5, DP-SGD alone 84.4%; every second-phase figure of docs/validity.md is at 3e-3.
SCRATCH_LR = 3e-3


def default_public_lr(model: nn.Module, pretrained: bool = True) -> float:
    """Stage 1's Adam learning rate: for pre-trained weights, paper 004 Appendix B (3e-3 for
    transformer-based models, 5e-5 for CNNs); from scratch, :data:`SCRATCH_LR` (gsd's benchmark).

    A base of ``gsd pretrain`` counts as from scratch here (:func:`pretrained_start`): paper 004's 5e-5 is for
    ImageNet-scale backbones, and from gsd's small bases issue 61's pilot saw stage 1 choose the top of its extended grid,
    1.35e-3 (27 x 5e-5, the extension spent), on every candidate of pass 2's tuning (mnist and mnist-m with UCI digits,
    seeds 0-1) and in the pre-trained-base tutorial (``benchmarks/results/pilot61/runs.jsonl``, ``stage1``)."""
    if not pretrained:
        return SCRATCH_LR
    from probes.backbones import LinearSelfAttention

    attention = (nn.MultiheadAttention, LinearSelfAttention)
    return TRANSFORMER_LR if any(isinstance(m, attention) for m in model.modules()) else CNN_LR


def label_map(public_names, private_names) -> list[int] | None:
    """Where every public class is a private class (by name, case and surrounding space aside): the
    private index of each public label, in public label order; else None (unknown names included)."""
    if not public_names or not private_names:
        return None
    index = {str(c).strip().lower(): i for i, c in enumerate(private_names)}
    out = [index.get(str(c).strip().lower()) for c in public_names]
    return None if any(i is None for i in out) else out


def _public_labels(sample: gdata.Sample, num_classes: int, multilabel: bool,
                   private_classes=None) -> tuple[torch.Tensor, int | None]:
    """The public labels and, when they are not private classes (:func:`label_map`), the width of a
    separate head. Public labels that are private classes by name are mapped to the private indices
    (``sandal`` is output 5 of a Fashion-MNIST head whatever its index in the public set)."""
    y = sample.labels()
    src = sample.source
    if src.multilabel:
        y = torch.from_numpy(np.asarray(y, dtype=np.float32))
        return y, (None if multilabel and y.shape[1] == num_classes else y.shape[1])
    y = torch.from_numpy(np.asarray(y, dtype=np.int64))
    if len(y) and int(y.min()) < 0:
        raise GSDError(f"{src.name} has negative labels; the second phase trains with the public set's own labels")
    top = int(y.max()) + 1 if len(y) else 1
    mapping = None if multilabel else label_map(getattr(src, "classes", None), private_classes)
    if mapping is not None and top <= len(mapping):
        return torch.tensor(mapping, dtype=torch.int64)[y], None
    return y, max(top, src.num_classes, 2)


def _swap(model: nn.Module, name: str, new: nn.Module) -> nn.Module:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, child)
    setattr(parent, child, new)
    return old


def pretrained_start(weights) -> bool:
    """Whether stage 1 starts from published pre-trained weights (paper 004's learning rates, :func:`default_public_lr`):
    ``--weights`` given and not a base of ``gsd pretrain`` (:func:`gsd_cli.models.base.base_folder`)."""
    if weights is None:
        return False
    from ...models.base import base_folder

    return base_folder(weights) is None


def stage1_settings(cfg, model: nn.Module, spec, saved: dict | None = None) -> Stage1Settings:
    """Stage 1's resolved settings (:class:`gsd_cli.train.second_phase.stage1_fit.Stage1Settings`) from ``cfg``'s ``public_*``
    fields (None: their defaults): ``--public-lr`` alone where given, else the grid around the model's default
    (:func:`default_public_lr` times :data:`LR_FACTORS`), or the default alone without validation (or with
    ``cfg.public_grid`` False: the feature probe's quick stage 1); a resumed stage 1
    keeps the learning rates it began with (one begun before 0.3: paper 004's default)."""
    val = VAL_FRACTION if getattr(cfg, "public_val", None) is None else float(cfg.public_val)
    if cfg.public_lr is not None:
        lrs = (float(cfg.public_lr),)
    elif saved is not None and (saved.get("search") or {}).get("lrs"):
        lrs = tuple(saved["search"].get("grid") or saved["search"]["lrs"])  # the grid it began with (lrs: also its extension)
    elif saved is not None and not val:
        lrs = (float(saved.get("lr", default_public_lr(model))),)
    else:
        d = default_public_lr(model, pretrained=pretrained_start(cfg.weights))
        grid = val > 0 and getattr(cfg, "public_grid", True)  # the feature probe's quick stage 1: the default alone
        lrs = tuple(float(f"{d * f:.3g}") for f in LR_FACTORS) if grid else (d,)
    patience = getattr(cfg, "public_patience", None)
    return Stage1Settings(lrs=lrs, epochs=int(cfg.public_epochs), batch_size=int(cfg.public_batch_size), val=val,
                          patience=PATIENCE if patience is None else int(patience), seed=int(cfg.seed),
                          augment=resolve_augment(getattr(cfg, "public_augment", None) or "auto", spec.input_size))


def _saved_stage1(out: Path, settings: dict) -> dict | None:
    """The folder's ``stage1.json`` (a run resumed), or None; refused when it had other settings (one saved
    before a setting existed: that setting's value then, :data:`LEGACY`)."""
    meta_file = out / STAGE1_META
    saved = json.loads(meta_file.read_text()) if meta_file.is_file() else None
    if saved is not None and {**LEGACY, **saved.get("settings", {})} != settings:
        raise GSDError(f"{meta_file}: the second phase in this folder had other settings; start a new run with --out")
    return saved


def _resume_state(out: Path, saved: dict, s: Stage1Settings) -> tuple[dict, dict] | None:
    """``(state, tensors)`` of the stage 1 in this folder, verified: one interrupted (:func:`fit_public` resumes from
    them) or finished (``state["complete"]``: ``tensors`` hold its weights); None when it had not finished an epoch."""
    weights_file = out / STAGE1_WEIGHTS
    if not (weights_file.is_file() or int(saved.get("epochs_done", 0) or 0) > 0):
        return None
    _verify(out, saved)
    ckpt.check_file_digest(weights_file, saved.get("weights_sha256"))
    tensors = _load(weights_file)
    state = saved.get("search")
    if state is None:  # a stage 1 of gsd before the validation split: one lr, every epoch
        done, losses = int(saved["epochs_done"]), list(saved.get("losses", []))
        state = {"trial": 0, "epoch": done, "epochs_run": done, "best": None, "lrs": list(s.lrs),
                 "trials": [{"lr": s.lrs[0], "train_loss": losses, "val_acc": [], "val_loss": [], "best_epoch": None, "stopped_early": False}],
                 "complete": done >= s.epochs}
    return dict(state), tensors


def run_second_phase(model: nn.Module, names: list[str], cfg, spec, out: Path, device: torch.device, *,
                     num_classes: int, multilabel: bool, catalog=None, progress=None, private_classes=None,
                     timed: str | None = "training's stage 1") -> dict:
    """Stage 1 on ``model`` in place (only the parameters ``names`` change). Returns its record (``line``: the
    one public line that says what it chose). ``timed``: the stage name under which :mod:`gsd_cli.timing`
    counts it (None: the caller does). ``private_classes``: the private task's class names (its declared label
    space, public); the head is shared only where every public class is one of them (:func:`label_map`)."""
    from ...timing import stage

    if timed is not None:
        with stage(timed):
            return run_second_phase(model, names, cfg, spec, out, device, num_classes=num_classes, multilabel=multilabel,
                                    catalog=catalog, progress=progress, private_classes=private_classes, timed=None)
    settings = {k: getattr(cfg, k, None) for k in STAGE1_KEYS}
    saved = _saved_stage1(out, settings)
    t0 = time.perf_counter()
    source = catalog.resolve(cfg.public) if catalog is not None else gdata.resolve(cfg.public)
    cap = cfg.public_examples if cfg.public_examples is not None else STAGE1_CAP
    sample = gdata.draw(source, cap, cfg.seed)
    y_all, public_head = _public_labels(sample, num_classes, multilabel, private_classes)
    s = stage1_settings(cfg, model, spec, saved)
    head = head_prefix(model)
    private_head, train_names = None, list(names)
    if public_head is not None:
        old = model.get_submodule(head)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 104729)
            tmp = nn.Linear(old.in_features, public_head, bias=old.bias is not None).to(device)
        private_head = _swap(model, head, tmp)
        train_names = [n for n in names if not (n == head or n.startswith(head + "."))] + [f"{head}.{n}" for n, _ in tmp.named_parameters()]
    for n, p in model.named_parameters():
        p.requires_grad_(n in set(train_names))
    try:
        found = _stage1(model, train_names, sample, y_all, s, spec, device, out, saved, settings, cfg, progress,
                        dict(num_classes=num_classes, multilabel=multilabel, private_classes=private_classes))
    finally:
        if private_head is not None:
            _swap(model, head, private_head)
        for n_, p in model.named_parameters():
            p.requires_grad_(n_ in set(names))
    choice, cached, tensors = found
    params = dict(model.named_parameters())
    record = {
        "stage": 1, "what": "second-phase pre-training on public data (no privacy cost)", "public": source.name,
        "public_examples": len(sample), "public_available": len(source), "examples_cap": int(cap),
        "cap": "--public-examples" if cfg.public_examples is not None else "default", "labels": "the public set's own",
        "head": (f"a separate {public_head}-way head (the public classes are not private classes by name)" if public_head
                 else "shared with the private task (every public class is a private class by name)"),
        "optimizer": "Adam", "lr": choice["lr"], "epochs": choice["best_epoch"], "epochs_max": s.epochs,
        "batch_size": max(1, min(s.batch_size, choice["train_examples"])),
        "trainable_params": sum(params[n_].numel() for n_ in names), "train_loss": choice["train_loss"],
        "search": {k: v for k, v in choice.items() if k not in ("seconds", "train_loss")},
        "seconds": round(time.perf_counter() - t0, 2),
        "reused": cached,  # read from the stage-1 cache (the feature probe's, or an earlier run's), not trained again
    }
    record["line"] = stage1_line(record)
    _finish(out, settings, cfg, choice, record, tensors)
    return record


def _stage1(model, train_names, sample, y_all, s: Stage1Settings, spec, device, out: Path, saved, settings: dict, cfg, progress,
            task: dict) -> tuple[dict, bool, dict]:
    """Stage 1 proper: read from the folder (a resumed run), from the stage-1 cache, or trained (:func:`fit_public`,
    its checkpoints in the folder); ``(what it chose, read from the cache, the chosen weights as tensors)``."""
    from . import stage1_cache

    weights_file = out / STAGE1_WEIGHTS
    resume = _resume_state(out, saved, s) if saved is not None else None
    if resume is not None and resume[0].get("complete"):  # finished before: its weights
        set_params(model, train_names, resume[1])
        done = saved.get("record") or {}
        choice = {**done["search"], "train_loss": done.get("train_loss", [])} if "search" in done else _legacy_choice(resume[0], s, len(sample))
        return choice, False, params_of(model, train_names)
    key = None
    if saved is None:  # a fresh stage 1: a function of public inputs, trained once (stage1_cache)
        key = stage1_cache.stage1_key(model, train_names, sample, y_all, settings, s, device=device, **task)
        hit = stage1_cache.load(key)
        if hit is not None:
            set_params(model, train_names, hit[0])
            if progress:
                progress("public", 1, 1)
            return dict(hit[1]["choice"]), True, params_of(model, train_names)

    def checkpoint(state: dict, tensors: dict) -> None:
        meta = {"settings": settings, "run_settings": cfg.to_dict(), "epochs_done": state["epochs_run"],
                "losses": state["trials"][state["trial"]]["train_loss"], "lr": state["trials"][state["trial"]]["lr"],
                "search": {**state, "lrs": list(state.get("lrs") or s.lrs), "grid": list(s.lrs)}}  # lrs: tried (the grid extended)
        meta = json.loads(json.dumps(meta))
        meta["weights_sha256"] = _save(weights_file, tensors, meta)  # verified on --resume
        ckpt.atomic_write(out / STAGE1_META, json.dumps(meta, indent=2) + "\n")

    rec = fit_public(model, train_names, sample, y_all, spec, s, device, progress=progress, resume=resume, checkpoint=checkpoint)
    choice = rec.to_dict()
    tensors = params_of(model, train_names)
    if key is not None:
        stage1_cache.store(key, tensors, rec.train_loss, rec.lr, choice={k: v for k, v in choice.items() if k != "seconds"})
    return choice, False, tensors


def _legacy_choice(state: dict, s: Stage1Settings, n: int) -> dict:
    """What a stage 1 finished by gsd before the validation split chose: its one lr, every epoch."""
    losses = state["trials"][0]["train_loss"]
    return {"lr": s.lrs[0], "lrs": list(s.lrs), "best_epoch": len(losses), "epochs": s.epochs, "epochs_run": len(losses),
            "train_examples": n, "val_examples": 0, "val_acc": None, "augment": s.augment, "patience": s.patience,
            "trials": state["trials"], "train_loss": losses}


def _finish(out: Path, settings: dict, cfg, choice: dict, record: dict, tensors: dict) -> None:
    """The folder's files once stage 1 is done: ``stage1.safetensors`` the chosen weights, ``stage1.json`` complete,
    with its record (``--resume`` reads them)."""
    meta = {"settings": settings, "run_settings": cfg.to_dict(), "epochs_done": choice["epochs_run"], "losses": choice["train_loss"],
            "lr": choice["lr"], "search": {"complete": True, "lrs": choice["lrs"]}, "record": record}
    meta = json.loads(json.dumps(meta))
    meta["weights_sha256"] = _save(out / STAGE1_WEIGHTS, tensors, meta)
    ckpt.atomic_write(out / STAGE1_META, json.dumps(meta, indent=2) + "\n")


def stage1_line(record: dict) -> str:
    """The one public line of what stage 1 did and chose (it reads public data only)."""
    c = record["search"]
    n, avail, cap = record["public_examples"], record.get("public_available", record["public_examples"]), record.get("examples_cap")
    drawn = (f"all {n:,} examples" if n == avail else f"{n:,} of {avail:,} examples") + (
        f" (cap {cap:,}{', --public-examples' if record.get('cap') == '--public-examples' else ''})" if cap else "")
    if c.get("val_examples"):
        lrs = ", ".join(f"{x:.3g}" for x in c["lrs"])
        how = (f"{c['val_examples']:,} held out for validation; lr {record['lr']:.3g}" + (f" chosen of {lrs}" if len(c["lrs"]) > 1 else "")
               + f", epoch {c['best_epoch']} kept (at most {c['epochs']}, patience {c['patience']}): validation accuracy {100 * c['val_acc']:.1f}%")
    else:
        how = f"no validation; lr {record['lr']:.3g}, {c['best_epoch']} epoch(s), the last kept"
    tail = "read from the stage-1 cache" if record.get("reused") else f"{c['epochs_run']} epoch(s) in {record['seconds']:.1f} s"
    return (f"stage 1 on {record['public']} (public data only, no privacy cost): {drawn}, augment {c['augment']}; {how}; {tail}")


def stage1_digest(state: dict) -> str:
    """SHA-256 of the canonical JSON of ``stage1.json``'s settings, run settings, epochs done, losses, lr and search."""
    doc = {k: state.get(k) for k in ("settings", "run_settings", "epochs_done", "losses")}
    for k in ("lr", "search"):  # lr since 0.3 (stage 1's default lr depends on --weights), search since issue 61; earlier files keep their digest
        if k in state:
            doc[k] = state[k]
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(b"gsd-stage1-v1\0" + text.encode()).hexdigest()


def _verify(out: Path, saved: dict) -> None:
    """Refuse a stage 1 whose ``stage1.json`` is not the one its weights were saved with."""
    wfile = out / STAGE1_WEIGHTS
    try:
        info = ckpt.tensor_metadata(wfile)
    except Exception as e:  # noqa: BLE001 - missing or unreadable: the same user error
        raise GSDError(f"{wfile}: missing or unreadable ({type(e).__name__}); start a new run with --out") from None
    if "gsd_digest" not in info:
        raise GSDError(f"{wfile}: written without the digest of {STAGE1_META} (an older gsd); stage 1 cannot be verified, "
                       "so the run cannot be resumed; start a new run with --out")
    if info["gsd_digest"] != stage1_digest(saved):
        raise GSDError(f"{out}: {STAGE1_META} does not match {STAGE1_WEIGHTS} (epochs done: {saved.get('epochs_done')} in "
                       f"{STAGE1_META}, {info.get('gsd_epochs_done')} in the weights); the folder was edited or mixes two runs, "
                       "so it cannot be resumed; start a new run with --out")


def _save(path: Path, tensors: dict, state: dict) -> str:
    """Write ``tensors`` to ``path`` with the digest of ``state`` (``stage1.json``'s content); their SHA-256."""
    from safetensors.torch import save as st_save

    blob = st_save({k: v.contiguous() for k, v in tensors.items()},
                   metadata={"gsd_digest": stage1_digest(state), "gsd_epochs_done": str(state["epochs_done"])})
    ckpt.atomic_write(path, blob)
    return hashlib.sha256(blob).hexdigest()


def _load(path: Path) -> dict:
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as e:  # noqa: BLE001
        raise GSDError(f"{path}: unreadable ({e}); start a new run with --out") from None


def run_settings(path: Path) -> dict:
    """The settings of a run stopped during stage 1 (before its first checkpoint): from ``stage1.json``."""
    f = Path(path) / STAGE1_META
    try:
        return dict(json.loads(f.read_text()).get("run_settings", {}))
    except (OSError, ValueError) as e:
        raise GSDError(f"--resume {path}: no readable checkpoint.json or {STAGE1_META} ({type(e).__name__}); start a new run") from None


def stages(model_info: dict, stage1: dict | None, summary: dict) -> list[dict]:
    """What each stage of paper 004's Figure 2 saw: 0 the backbone's weights, 1 the second phase
    (public data only), 2 the private fine-tuning and its privacy."""
    s0 = {"stage": 0, "what": "backbone weights", **model_info.get("stage0", {})}
    s2 = {
        "stage": 2, "what": f"private fine-tuning ({summary['method']})", "private": summary["private"],
        "optimizer": "SGD",
        "lr": summary["settings"]["lr"], "clip": summary["settings"]["clip"], "epochs": summary["epochs"],
        "steps": summary["steps"], "epsilon": summary["epsilon"], "delta": summary["delta"], "sigma": summary["sigma"],
        "trainable_params": summary["num_params"],
    }
    s1 = stage1 if stage1 is not None else {"stage": 1, "what": "none (no second phase)"}
    return [s0, s1, s2]
