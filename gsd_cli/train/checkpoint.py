"""Run directories: checkpoints (safetensors + JSON), ``metrics.jsonl``, ``summary.json``.

A checkpoint is written at the end of every epoch, atomically (temporary file, then rename), as
``checkpoint.safetensors`` (model state and the optimizer's momentum buffers) and ``checkpoint.json``
(settings, epoch, step, privacy state). The JSON also holds the run's *secret* seed of the private
randomness (Poisson sampling and noise): keep a run directory as private as the data; the summary and
the model weights are what may be released.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from ..errors import GSDError

FORMAT = 1
CKPT_WEIGHTS = "checkpoint.safetensors"
CKPT_META = "checkpoint.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


def atomic_write(path: Path, data: bytes | str) -> None:
    """Write via a temporary file in the same folder and rename: never half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare_run_dir(path: Path, resume: bool, create: bool = True) -> Path:
    """A new run needs a folder that does not exist or is empty (its parent must exist); a resumed
    run needs a folder with a checkpoint. Nothing a user has is overwritten."""
    path = Path(path).expanduser()
    if resume:
        if not (path / CKPT_META).is_file() and not (path / "stage1.json").is_file():  # stage1: second phase
            raise GSDError(f"--resume {path}: no {CKPT_META} there; give the folder of an interrupted gsd train run")
        return path
    if path.exists():
        if not path.is_dir():
            raise GSDError(f"--out {path} is a file; give a folder for the run")
        if any(path.iterdir()):
            raise GSDError(f"--out {path} exists and is not empty; give a new folder, or --resume {path} to continue that run")
    elif not path.parent.exists():
        raise GSDError(f"--out {path}: folder {path.parent} does not exist; create it first")
    if create:
        path.mkdir(exist_ok=True)
    return path


def save(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict) -> None:
    """Weights and momentum to ``checkpoint.safetensors``, then ``meta`` to ``checkpoint.json``
    (written last: a checkpoint exists once its JSON does)."""
    from safetensors.torch import save as st_save

    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                tensors[f"momentum.{names[id(p)]}"] = buf.detach().cpu().contiguous()
    atomic_write(path / CKPT_WEIGHTS, st_save(tensors))
    atomic_write(path / CKPT_META, json.dumps({"format": FORMAT, **meta}, indent=2) + "\n")


def load_meta(path: Path) -> dict:
    try:
        meta = json.loads((Path(path) / CKPT_META).read_text())
    except (OSError, ValueError) as e:
        raise GSDError(f"{Path(path) / CKPT_META}: unreadable checkpoint ({e}); it cannot be resumed") from None
    if meta.get("format") != FORMAT:
        raise GSDError(f"{Path(path) / CKPT_META}: checkpoint format {meta.get('format')} is not {FORMAT}; rerun from the start")
    return meta


def load_state(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(Path(path) / CKPT_WEIGHTS))
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise GSDError(f"{Path(path) / CKPT_WEIGHTS}: unreadable ({e}); the run cannot be resumed") from None
    dev = next(model.parameters()).device
    state = {k[len("model.") :]: v for k, v in tensors.items() if k.startswith("model.")}
    model.load_state_dict(state)
    params = dict(model.named_parameters())
    for k, v in tensors.items():
        if k.startswith("momentum."):
            optimizer.state[params[k[len("momentum.") :]]]["momentum_buffer"] = v.to(dev)


def read_metrics(path: Path, epochs: int) -> list[dict]:
    """The first ``epochs`` lines of ``metrics.jsonl`` (lines of epochs after the checkpoint are dropped)."""
    f = Path(path) / METRICS
    if not f.exists():
        return []
    lines = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return [r for r in lines if r.get("epoch", 0) <= epochs]


def write_metrics(path: Path, rows: list[dict]) -> None:
    atomic_write(Path(path) / METRICS, "".join(json.dumps(r) + "\n" for r in rows))
