"""Second-phase pre-training (paper 004, Section 5.1, equation 13): f_2pt(W_pt, theta; x_pub) -> theta_0.

Stage 1 of ``gsd train --method second-phase``: the trainable parameters theta (the ``--peft``
choice; everything else frozen) are trained on ``--public-examples`` examples of the public set with
the public set's own labels, by Adam (paper 004 Appendix B: lr 5e-5 for pre-trained CNNs, 3e-3 for transformers; 3e-3 from scratch),
for ``--public-epochs`` epochs of shuffled minibatches of ``--public-batch-size``. It sees public data
only and costs no privacy budget. Stage 2 (equation 14) is DP-SGD on the private set from theta_0,
accounted exactly as ``--method dpsgd``.

The model's head is sized to the private task. Where the public labels *are* private classes (every
public class name is a private class name; each is mapped to its private index), or multi-label of the
same width, the second phase trains that head too; otherwise a separate head sized to the public labels is trained in its place for stage 1
and the private head keeps its initial weights (the summary says which). A public label that merely
fits the head's index range is not the private class of that index: a 6-class photo set trained into
a 10-class digit head taught output 3 "coffee" and pushed outputs 6-9 down, and gsd's held-out
benchmark measured the second phase at chance (10%) on MNIST-M after it (issue 42).

The result is saved in the run folder (``stage1.safetensors``: theta_0 and the Adam state, written
after every public epoch; ``stage1.json``: settings, epochs done, what stage 1 saw). ``--resume``
loads it instead of training again (an interrupted stage 1 continues from its last epoch; every
random draw of stage 1 comes from ``--seed``, so the result is the same either way). As with the main
checkpoint, ``stage1.json`` is verified: ``stage1.safetensors`` carries the digest of its settings,
the run's settings, the epochs done and the losses (:func:`stage1_digest`), and a folder whose two
files disagree, or whose weights carry no digest, is refused.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from .. import data as gdata
from ..errors import GSDError
from ..gradients import default_loss
from ..models.weights import head_prefix
from . import checkpoint as ckpt

STAGE1_WEIGHTS = "stage1.safetensors"
STAGE1_META = "stage1.json"
#: the settings stage 1 depends on (a resumed run must have the same)
STAGE1_KEYS = ("public", "model", "weights", "peft", "params", "seed", "public_examples", "public_epochs",
               "public_lr", "public_batch_size", "private")

TRANSFORMER_LR, CNN_LR = 3e-3, 5e-5
#: stage 1 of a model trained from scratch (no --weights): paper 004's 5e-5 is for fine-tuning pre-trained
#: CNN backbones and hardly moves a model at its initialisation. gsd's downstream benchmark (issue 33,
#: fmnist-cnn from scratch, mnist, seed 0): 90.9% / 91.0% (pub-mnist / rot30) at 3e-3 against
#: 83.4% / 83.8% at 5e-5, DP-SGD alone 84.4%; every second-phase figure of docs/validity.md is at 3e-3.
SCRATCH_LR = 3e-3


def default_public_lr(model: nn.Module, pretrained: bool = True) -> float:
    """Stage 1's Adam learning rate: for pre-trained weights, paper 004 Appendix B (3e-3 for
    transformer-based models, 5e-5 for CNNs); from scratch, :data:`SCRATCH_LR` (gsd's benchmark)."""
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


def run_second_phase(model: nn.Module, names: list[str], cfg, spec, out: Path, device: torch.device, *,
                     num_classes: int, multilabel: bool, catalog=None, progress=None, private_classes=None,
                     timed: str | None = "training's stage 1") -> dict:
    """Stage 1 on ``model`` in place (only the parameters ``names`` change). Returns its record.
    ``timed``: the stage name under which :mod:`gsd_cli.timing` counts it (None: the caller does).
    ``private_classes``: the private task's class names (its declared label space, public); the head is
    shared only where every public class is one of them (:func:`label_map`)."""
    from ..timing import stage

    if timed is not None:
        with stage(timed):
            return run_second_phase(model, names, cfg, spec, out, device, num_classes=num_classes, multilabel=multilabel,
                                    catalog=catalog, progress=progress, private_classes=private_classes, timed=None)
    settings = {k: getattr(cfg, k) for k in STAGE1_KEYS}
    meta_file, weights_file = out / STAGE1_META, out / STAGE1_WEIGHTS
    saved = json.loads(meta_file.read_text()) if meta_file.is_file() else None
    if saved is not None and saved.get("settings") != settings:
        raise GSDError(f"{meta_file}: the second phase in this folder had other settings; start a new run with --out")
    t0 = time.perf_counter()
    source = catalog.resolve(cfg.public) if catalog is not None else gdata.resolve(cfg.public)
    sample = gdata.draw(source, cfg.public_examples, cfg.seed)
    y_all, public_head = _public_labels(sample, num_classes, multilabel, private_classes)
    lr = cfg.public_lr if cfg.public_lr is not None else default_public_lr(model, pretrained=cfg.weights is not None)
    if saved is not None and cfg.public_lr is None:  # a resumed stage 1 keeps its lr (one begun before 0.3: paper 004's default)
        lr = float(saved.get("lr", default_public_lr(model)))
    head = head_prefix(model)
    private_head = None
    train_names = list(names)
    if public_head is not None:
        old = model.get_submodule(head)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed + 104729)
            tmp = nn.Linear(old.in_features, public_head, bias=old.bias is not None).to(device)
        private_head = _swap(model, head, tmp)
        train_names = [n for n in names if not (n == head or n.startswith(head + "."))] + [f"{head}.{n}" for n, _ in tmp.named_parameters()]
    params = dict(model.named_parameters())
    for n, p in params.items():
        p.requires_grad_(n in set(train_names))
    opt = torch.optim.Adam([params[n] for n in train_names], lr=lr)
    done = 0
    losses: list[float] = []
    if saved is not None and (weights_file.is_file() or int(saved.get("epochs_done", 0) or 0) > 0):
        _verify(out, saved)
        ckpt.check_file_digest(weights_file, saved.get("weights_sha256"))
        _load(weights_file, model, opt, train_names)
        done, losses = int(saved["epochs_done"]), list(saved.get("losses", []))
    n = len(sample)
    bs = max(1, min(cfg.public_batch_size, n))
    key, cached = None, False
    if saved is None:  # a fresh stage 1: a function of public inputs, trained once (stage1_cache)
        from . import stage1_cache

        key = stage1_cache.stage1_key(model, train_names, sample, y_all, settings, lr, num_classes=num_classes, multilabel=multilabel,
                                      private_classes=private_classes, device=device)
        hit = stage1_cache.load(key)
        if hit is not None:
            _apply(hit[0], model, opt, train_names)
            done, losses, cached = cfg.public_epochs, list(hit[1]["losses"]), True
    was = model.training
    model.train()
    rng = torch.random.fork_rng(devices=[device] if torch.device(device).type == "cuda" else [])
    rng.__enter__()  # stage 1's draws from --seed leave the caller's generator as it was
    try:
        if progress:
            progress("public", done, cfg.public_epochs)
        if cached:  # the run folder gets the files a trained stage 1 leaves (--resume reads them)
            state = json.loads(json.dumps({"settings": settings, "run_settings": cfg.to_dict(), "epochs_done": done, "losses": losses, "lr": lr}))
            state["weights_sha256"] = _save(weights_file, model, opt, train_names, state)
            ckpt.atomic_write(meta_file, json.dumps(state, indent=2) + "\n")
        for epoch in range(done, cfg.public_epochs):
            torch.manual_seed(int(np.random.default_rng([cfg.seed, 0x5EED1, epoch]).integers(2**62)))  # dropout, if any: from --seed (forked)
            order = np.random.default_rng([cfg.seed, 0x2F4A5E, epoch]).permutation(n)
            total, count = 0.0, 0
            for start in range(0, n, bs):
                part = order[start : start + bs]
                x = gdata.to_model_input(gdata.read_images(source, sample.indices[part], spec.input_size), spec.input_size, spec.channels, device)
                y = y_all[part].to(device)
                loss = default_loss(model(x), y).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += float(loss.detach()) * len(part)
                count += len(part)
            losses.append(total / count)
            state = json.loads(json.dumps({"settings": settings, "run_settings": cfg.to_dict(), "epochs_done": epoch + 1, "losses": losses, "lr": lr}))
            state["weights_sha256"] = _save(weights_file, model, opt, train_names, state)  # verified on --resume
            ckpt.atomic_write(meta_file, json.dumps(state, indent=2) + "\n")
            if progress:
                progress("public", epoch + 1, cfg.public_epochs)
        if key is not None and not cached:
            stage1_cache.store(key, _tensors(model, opt, train_names), losses, lr)
    finally:
        rng.__exit__(None, None, None)
        model.train(was)
        if private_head is not None:
            _swap(model, head, private_head)
        for n_, p in model.named_parameters():
            p.requires_grad_(n_ in set(names))
    record = {
        "stage": 1,
        "what": "second-phase pre-training on public data (no privacy cost)",
        "public": source.name,
        "public_examples": n,
        "labels": "the public set's own",
        "head": (f"a separate {public_head}-way head (the public classes are not private classes by name)" if public_head
                 else "shared with the private task (every public class is a private class by name)"),
        "optimizer": "Adam",
        "lr": lr,
        "epochs": cfg.public_epochs,
        "batch_size": bs,
        "trainable_params": sum(params[n_].numel() for n_ in names),
        "train_loss": losses,
        "seconds": round(time.perf_counter() - t0, 2),
        "reused": cached,  # read from the stage-1 cache (the feature probe's, or an earlier run's), not trained again
    }
    sha = (json.loads(meta_file.read_text()).get("weights_sha256") if meta_file.is_file() else None)
    ckpt.atomic_write(meta_file, json.dumps({"settings": settings, "run_settings": cfg.to_dict(), "epochs_done": cfg.public_epochs, "losses": losses,
                                             "lr": lr, "weights_sha256": sha, "record": {k: v for k, v in record.items() if k != "seconds"}}, indent=2) + "\n")
    return record


def stage1_digest(state: dict) -> str:
    """SHA-256 of the canonical JSON of ``stage1.json``'s settings, run settings, epochs done, losses and lr."""
    doc = {k: state.get(k) for k in ("settings", "run_settings", "epochs_done", "losses")}
    if "lr" in state:  # since 0.3 (stage 1's default lr depends on --weights); earlier files keep their digest
        doc["lr"] = state["lr"]
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


def _tensors(model: nn.Module, opt: torch.optim.Optimizer, names: list[str]) -> dict:
    """The parameters ``names`` and their Adam state, as ``stage1.safetensors`` holds them."""
    params = dict(model.named_parameters())
    tensors = {f"param.{n}": params[n].detach().cpu().contiguous() for n in names}
    for n in names:
        st = opt.state.get(params[n], {})
        for key in ("exp_avg", "exp_avg_sq", "step"):
            if key in st:
                v = st[key]
                tensors[f"adam.{key}.{n}"] = (v if isinstance(v, torch.Tensor) else torch.tensor(float(v))).detach().cpu().contiguous()
    return tensors


def _save(path: Path, model: nn.Module, opt: torch.optim.Optimizer, names: list[str], state: dict) -> str:
    from safetensors.torch import save as st_save

    tensors = _tensors(model, opt, names)
    blob = st_save(tensors, metadata={"gsd_digest": stage1_digest(state), "gsd_epochs_done": str(state["epochs_done"])})
    ckpt.atomic_write(path, blob)
    return hashlib.sha256(blob).hexdigest()


def _load(path: Path, model: nn.Module, opt: torch.optim.Optimizer, names: list[str]) -> None:
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except Exception as e:  # noqa: BLE001
        raise GSDError(f"{path}: unreadable ({e}); start a new run with --out") from None
    _apply(tensors, model, opt, names)


def _apply(tensors: dict, model: nn.Module, opt: torch.optim.Optimizer, names: list[str]) -> None:
    """Set the parameters ``names`` and their Adam state from ``tensors`` (:func:`_tensors`)."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n in names:
            p = params[n]
            p.copy_(tensors[f"param.{n}"].to(p.device))
            if f"adam.step.{n}" in tensors:
                opt.state[p] = {k: tensors[f"adam.{k}.{n}"].to(p.device if k != "step" else "cpu") for k in ("step", "exp_avg", "exp_avg_sq")}


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
