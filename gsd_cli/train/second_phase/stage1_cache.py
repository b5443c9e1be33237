"""Stage 1 of the second phase, trained once: a cache of its results, in memory and on disk.

Stage 1 (:func:`gsd_cli.train.second_phase.run_second_phase`) is a function of public inputs only:
the model and its initial weights, the drawn public examples and their labels, the stage-1 settings
(examples, epochs, lr or its grid, batch size, validation fraction, patience, augmentation, seed) and the
private task's *declared* label space (its class count, names and whether it is multi-label, which
decide whether the head is shared). Every random draw in it comes from ``--seed`` (the validation split;
the order of the examples; the augmentation; the temporary head; any dropout, under a forked generator). So the feature probe of ``gsd train --auto-select``, which trains stage 1 on each
candidate with the run's own settings, and the training that follows with the chosen candidate
compute the same thing: the training reads it here instead of training it again, and a second run
with the same candidates (a new private set of the same task) reads every candidate's.

An entry is keyed by the SHA-256 of all those inputs: the model's digest before stage 1
(:func:`gsd_cli.models.digest.model_digest`: its layers and every weight), the trained parameters'
names, what the drawn public examples are made of (:func:`gsd_cli.data.fingerprint.sample_fingerprint`),
their labels, the settings as given and as resolved (the learning rates tried, what ``--public-augment
auto`` means for the model's input), the validation split's rule, the label space, the device's kind and
the library versions. It holds the chosen parameters (what ``stage1.safetensors`` holds once stage 1 is
done), the losses, the lr and what stage 1 chose (its record); its tensors' checksum is verified on read, and an entry that does not load, or has
another key, is recomputed and replaced, never trusted. Nothing private enters: the cache is public.

Location: ``stage1/`` under gsd's cache folder (``$GSD_CACHE_DIR``, ...; :func:`gsd_cli.data.roots.default_cache_dir`);
``gsd cache clear`` deletes its entries. Without a usable folder the entries of this process are kept
in memory only.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import torch

from ...data.roots import ENTRY_NAME, STAGE1_SUBFOLDER as SUBFOLDER  # noqa: F401 (the cache folder's stage-1 subfolder)

SCHEMA = 3  # 2: the validation split, the lr grid, early stopping and augmentation (entries hold what stage 1 chose); 3: the grid extends at its edge
#: the rule of stage 1's validation split (gsd_cli.train.second_phase.stage1_fit.validation_mask): bump when it changes
VALIDATION_RULE = "splitmix64(seed, sha256(draw key), index) < fraction, v1"
#: entries of this process (key -> (tensors, meta)), whatever the disk allows
_MEMORY: dict[str, tuple[dict, dict]] = {}
_MEMORY_MAX = 16


def cache_dir() -> Path | None:
    from ...data.roots import default_cache_dir

    base = default_cache_dir()
    return None if base is None else base / SUBFOLDER


def stage1_key(model, train_names: list[str], sample, labels: torch.Tensor, settings: dict, s, *, num_classes: int,
               multilabel: bool, private_classes, device: torch.device) -> str:
    """The key of a stage 1 (module docstring): ``model`` before stage 1 (its private head already swapped
    for a public one where the public labels are not private classes), the names it trains, the drawn
    ``sample`` and its ``labels``, the stage-1 ``settings`` (every ``public_*`` field, as given) and ``s``, the
    :class:`~gsd_cli.train.second_phase.stage1_fit.Stage1Settings` they resolve to (the learning rates tried, the augmentation
    ``auto`` means, the validation fraction, the patience...), the label space and the device's kind."""
    import dataclasses

    from ...data.fingerprint import sample_fingerprint
    from ...models.digest import _tensor_digest, model_digest

    doc = {"schema": SCHEMA, "model": model_digest(model), "train": sorted(train_names),
           "sample": sample_fingerprint(sample.source, sample.indices), "labels": _tensor_digest(labels.detach().cpu()),
           "settings": {k: v for k, v in settings.items() if k not in ("private", "public")},
           "resolved": {k: [repr(float(x)) for x in v] if k == "lrs" else v for k, v in dataclasses.asdict(s).items()},
           "split": VALIDATION_RULE, "num_classes": int(num_classes), "multilabel": bool(multilabel),
           "private_classes": list(private_classes) if private_classes is not None else None,
           "device": torch.device(device).type, "torch": torch.__version__}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def _checksum(tensors: dict) -> str:
    from ...models.digest import _tensor_digest

    names = sorted(tensors)
    return hashlib.sha256((json.dumps(names) + _tensor_digest(*[tensors[n] for n in names])).encode()).hexdigest()


def load(key: str) -> tuple[dict, dict] | None:
    """``(tensors, meta)`` of the entry ``key`` (``meta``: ``losses``, ``lr``, ``choice``), or None."""
    if key in _MEMORY:
        return _MEMORY[key]
    folder = cache_dir()
    if folder is None:
        return None
    path = folder / f"{key}.safetensors"
    if not path.is_file():
        return None
    try:
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(path), framework="pt") as f:
            info = f.metadata() or {}
        tensors = load_file(str(path))
        meta = json.loads(info.get("gsd_stage1", "{}"))
        if meta.get("schema") != SCHEMA or meta.get("key") != key or meta.get("checksum") != _checksum(tensors):
            return None
        os.utime(path)
    except Exception:  # noqa: BLE001 - a damaged entry is recomputed, never trusted
        return None
    _remember(key, tensors, meta)
    return tensors, meta


def store(key: str, tensors: dict, losses: list[float], lr: float, choice: dict | None = None) -> None:
    """Keep a stage 1's result under ``key`` (in memory; on disk when the cache folder can be written); ``choice``:
    what it chose (:class:`gsd_cli.train.second_phase.stage1_fit.Stage1Record` as a dict: lr, epochs, validation accuracy...)."""
    tensors = {n: t.detach().cpu().contiguous() for n, t in tensors.items()}
    meta = {"schema": SCHEMA, "key": key, "losses": [float(x) for x in losses], "lr": float(lr), "choice": choice or {},
            "checksum": _checksum(tensors)}
    _remember(key, tensors, meta)
    folder = cache_dir()
    if folder is None:
        return
    try:
        from safetensors.torch import save

        folder.mkdir(parents=True, exist_ok=True)
        blob = save(tensors, metadata={"gsd_stage1": json.dumps(meta)})
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".gsd-tmp-stage1-", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, folder / f"{key}.safetensors")
    except OSError:  # a cache that cannot be written costs only the time of training stage 1 again
        try:
            os.unlink(tmp)  # type: ignore[possibly-undefined]
        except (OSError, NameError):
            pass


def _remember(key: str, tensors: dict, meta: dict) -> None:
    _MEMORY[key] = (tensors, meta)
    while len(_MEMORY) > _MEMORY_MAX:
        _MEMORY.pop(next(iter(_MEMORY)))


def clear() -> int:
    """Delete the cached stage-1 entries on disk (and this process's); returns how many files."""
    _MEMORY.clear()
    folder = cache_dir()
    n = 0
    if folder is None or not folder.is_dir():
        return 0
    for f in folder.iterdir():
        if f.is_file() and not f.is_symlink() and (ENTRY_NAME.fullmatch(f.name) or f.name.startswith(".gsd-tmp-stage1-")):
            try:
                f.unlink()
                n += 1
            except OSError:
                pass
    return n
