"""Run directories: checkpoints (safetensors + JSON), ``metrics.jsonl``, ``summary.json``.

A checkpoint is written at the end of every epoch, atomically (temporary file, then rename), as
``checkpoint.safetensors`` (model state and the optimizer's momentum buffers) and ``checkpoint.json``
(settings, epoch, step, privacy state). The JSON also holds the run's *secret* seed of the private
randomness (Poisson sampling and noise): keep a run directory as private as the data; the summary and
the model weights are what may be released. The private files (``checkpoint.json``, ``metrics.jsonl``,
``private-summary.json``, ``curves.png``) are written 0600, and a run folder gsd owns is 0700
(:func:`own_run_dir`: one it created, or one that holds nothing but a run's files; a folder that also holds
the user's other files keeps its mode).

``checkpoint.json`` is verified, not trusted: the weights file carries in its safetensors metadata a
SHA-256 digest (:func:`state_digest`) of the JSON's settings, epoch, step, privacy state, selection,
clipping paths and secret seed, plus the epoch and step in clear. ``clip_paths`` holds each layer's
path of DP-SGD's clipped sums as the run's first step measured it (:mod:`gsd_cli.train.clipsum.tune`):
``--resume`` reuses them instead of timing again, so an interrupted and resumed run computes the same
bits as an uninterrupted one (with the same private randomness: ``--insecure-seed``). A resume
(:func:`load_meta`) refuses a folder whose two files disagree (an edited epoch, epsilon or seed, or
files of two runs), a JSON without its secret seed, and a checkpoint of format 1 (written before the digest existed, so it cannot be checked: the
privacy statement of the resumed run would rest on an unverifiable epoch and seed). The metadata holds
no secret and not the private set's size: the seed enters only through the digest (128 random bits:
it cannot be recovered from it).

A run of several processes (:mod:`gsd_cli.train.distributed`) writes its checkpoints from process 0
alone, and they hold nothing about the processes: the weights, momentum and secret seed are those of
the one mechanism, so ``--resume`` works with the same or another number of processes (process 0
reads the folder and broadcasts its state: :meth:`~gsd_cli.train.distributed.World.load_state`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from ..errors import GSDError
from ..report.outputs import write_output

FORMAT = 2  # 2: the weights file carries the digest of checkpoint.json (1: no digest, not resumable)
CKPT_WEIGHTS = "checkpoint.safetensors"
CKPT_META = "checkpoint.json"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"
#: the run folder's lock file (:mod:`gsd_cli.train.runlock`): a folder holding nothing else counts as empty
RUN_LOCK = ".gsd-run.lock"
#: the mode of a run folder gsd owns (:func:`own_run_dir`): only its owner lists or opens it, since it holds private files
RUN_DIR_MODE = 0o700
#: the files a ``gsd train`` run writes in its folder (with its lock file, besides its ``.gsd-*.tmp`` temporaries);
#: ``checkpoint.json``, ``metrics.jsonl``, ``private-summary.json`` and ``curves.png`` are private (written 0600)
RUN_FILES = frozenset({CKPT_WEIGHTS, CKPT_META, METRICS, SUMMARY, "private-summary.json", "curves.png", "stage1.json",
                       "stage1.safetensors", RUN_LOCK})


def atomic_write(path: Path, data: bytes | str, private: bool = False) -> None:
    """Write via a temporary file in the same folder and rename: never half a file (the one writer,
    :func:`gsd_cli.report.outputs.write_output`; ``private``: created 0600)."""
    write_output(path, data, private=private)


def own_run_dir(path: Path) -> bool:
    """Make the run folder ``path`` :data:`RUN_DIR_MODE` (0700) when gsd owns it: it holds nothing but a run's files
    (:data:`RUN_FILES` and gsd's temporaries), as a folder this run created, an empty folder given to a new run, or
    a run's own folder on ``--resume`` do. A folder that also holds anything else (the user's) keeps its mode: the
    private files in it are 0600 all the same. Returns whether the folder was made 0700."""
    try:
        names = [p.name for p in Path(path).iterdir()]
        if any(n not in RUN_FILES and not (n.startswith(".gsd-") and n.endswith(".tmp")) for n in names):
            return False
        os.chmod(path, RUN_DIR_MODE)
        return True
    except OSError:
        return False  # not ours to change (another owner's folder): the private files are 0600 all the same


def make_run_dir(path: Path) -> bool:
    """Create the run folder ``path`` 0700 if it does not exist (its parent must), then :func:`own_run_dir`. Returns
    whether this call created it."""
    path = Path(path)
    created = not path.exists()
    path.mkdir(mode=RUN_DIR_MODE, exist_ok=True)
    own_run_dir(path)
    return created


def prepare_run_dir(path: Path, resume: bool, create: bool = True) -> Path:
    """A new run needs a folder that does not exist or is empty (but for the run lock's file,
    :data:`RUN_LOCK`; its parent must exist); a resumed run needs a folder with a checkpoint. Nothing a
    user has is overwritten."""
    path = Path(path).expanduser()
    if resume:
        if not path.exists():
            raise GSDError(f"no gsd run in {path}: no such folder; give the --out folder of an interrupted gsd train run (a run "
                           f"interrupted before its training started, in --auto-select's selection, leaves none: run it again "
                           f"with --out {path})")
        if not path.is_dir():
            raise GSDError(f"no gsd run in {path}: it is a file; give the --out folder of an interrupted gsd train run")
        if not (path / CKPT_META).is_file() and not (path / "stage1.json").is_file():  # stage1: second phase
            if not any(not p.name.startswith(".") for p in path.iterdir()):  # nothing written but a run's lock file
                raise GSDError(f"no gsd run in {path}: nothing was written there (a run interrupted before its training started, "
                               f"in --auto-select's selection, leaves its folder so): nothing to resume; run it again with --out {path}")
            raise GSDError(f"no gsd run in {path}: no {CKPT_META} (or stage1.json) there; give the --out folder of an "
                           "interrupted gsd train run")
        return path
    if path.exists():
        if not path.is_dir():
            raise GSDError(f"--out {path} is a file; give a folder for the run")
        if any(p.name != RUN_LOCK for p in path.iterdir()):
            raise GSDError(f"--out {path} exists and is not empty; give a new folder, or --resume {path} to continue that run")
    elif not path.parent.exists():
        raise GSDError(f"--out {path}: folder {path.parent} does not exist; create it first")
    if create:
        make_run_dir(path)
    return path


#: the parts of ``checkpoint.json`` the digest covers
DIGESTED = ("settings", "epoch", "step", "privacy", "selection")


def state_digest(meta: dict) -> str:
    """SHA-256 of the canonical JSON of ``meta``'s :data:`DIGESTED` parts and its secret seed."""
    secret = meta.get("secret") if isinstance(meta.get("secret"), dict) else {}
    doc = {k: meta.get(k) for k in DIGESTED}
    doc["noise_seed"] = secret.get("noise_seed")
    if "clip_paths" in meta:  # each layer's measured clipping path (a run checkpointed before they were kept has none)
        doc["clip_paths"] = meta["clip_paths"]
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str)
    return hashlib.sha256(b"gsd-checkpoint-v2\0" + text.encode()).hexdigest()


def tensor_metadata(file: Path) -> dict:
    """The safetensors metadata (``__metadata__``) of ``file``; ``{}`` when it has none."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        return dict(f.metadata() or {})


def save(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, meta: dict) -> None:
    """Weights and momentum to ``checkpoint.safetensors`` (with the digest of ``meta`` in its
    metadata), then ``meta`` to ``checkpoint.json`` (written last: a checkpoint exists once its JSON does)."""
    from safetensors.torch import save as st_save

    tensors = {f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            buf = optimizer.state.get(p, {}).get("momentum_buffer")
            if buf is not None:
                tensors[f"momentum.{names[id(p)]}"] = buf.detach().cpu().contiguous()
    meta = json.loads(json.dumps({"format": FORMAT, **meta}))  # digest what load_meta will read back
    info = {"gsd_format": str(FORMAT), "gsd_digest": state_digest(meta), "gsd_epoch": str(meta.get("epoch")),
            "gsd_step": str(meta.get("step"))}
    blob = st_save(tensors, metadata=info)
    meta["weights_sha256"] = hashlib.sha256(blob).hexdigest()  # verified on --resume (check_file_digest)
    atomic_write(path / CKPT_WEIGHTS, blob)
    atomic_write(path / CKPT_META, json.dumps(meta, indent=2) + "\n", private=True)  # the secret seed


def file_sha256(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_file_digest(file: Path, expected: str | None) -> None:
    """Refuse a checkpoint file whose SHA-256 is not the one recorded when it was written (a flipped
    byte, a truncated copy): its weights would resume silently wrong. ``expected`` None: a checkpoint
    of a gsd without the digest (nothing to compare)."""
    if expected is None:
        return
    try:
        got = file_sha256(file)
    except OSError as e:
        raise GSDError(f"{file}: unreadable ({e.strerror or e}); the run cannot be resumed") from None
    if got != expected:
        raise GSDError(f"{file}: its SHA-256 is not the one recorded when it was written (the file is damaged or was "
                       "replaced); restore it from a backup or start a new run")


def load_meta(path: Path) -> dict:
    """``checkpoint.json`` of the run in ``path``, verified against ``checkpoint.safetensors``
    (module docstring); any disagreement is a one-line :class:`GSDError`."""
    f = Path(path) / CKPT_META
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise GSDError(f"{f}: unreadable checkpoint ({e}); it cannot be resumed") from None
    if not isinstance(meta, dict):
        raise GSDError(f"{f}: not a gsd checkpoint (a JSON object was expected); it cannot be resumed")
    if meta.get("format") == 1:
        raise GSDError(f"{f}: written by an older gsd (checkpoint format 1, without the digest that lets a resume verify "
                       "it); finish the run with the gsd version that started it, or start a new run")
    if meta.get("format") != FORMAT:
        raise GSDError(f"{f}: checkpoint format {meta.get('format')} is not {FORMAT}; rerun from the start")
    secret = meta.get("secret")
    seed = secret.get("noise_seed") if isinstance(secret, dict) else None
    if not (isinstance(seed, str) and seed.isdigit()):
        raise GSDError(f"{f}: no secret seed (secret.noise_seed) of the private randomness; the run's sampling and noise "
                       "cannot be replayed, so it cannot be resumed; start a new run")
    verify(Path(path), meta)
    return meta


def verify(path: Path, meta: dict) -> None:
    """Refuse a run folder whose ``checkpoint.json`` is not the one its weights were saved with."""
    wfile = path / CKPT_WEIGHTS
    try:
        info = tensor_metadata(wfile)
    except Exception as e:  # noqa: BLE001 - missing or unreadable: the same user error
        raise GSDError(f"{wfile}: missing or unreadable ({type(e).__name__}); the run cannot be resumed") from None
    if info.get("gsd_digest") == state_digest(meta):
        return
    if "gsd_digest" not in info:
        raise GSDError(f"{wfile}: written without the digest of {CKPT_META} (another program or an older gsd); "
                       "the run cannot be verified, so it cannot be resumed; start a new run")
    said = [f"{k} {meta.get(k)} in {CKPT_META} but {info.get('gsd_' + k)} in the weights" for k in ("epoch", "step")
            if str(meta.get(k)) != info.get("gsd_" + k)]
    what = "; ".join(said) or "its settings, privacy state or secret seed differ from those the weights were saved with"
    raise GSDError(f"{path}: {CKPT_META} does not match {CKPT_WEIGHTS} ({what}); the folder was edited or mixes two "
                   "runs, so it cannot be resumed; restore the files or start a new run")


def load_state(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Weights and momentum from ``checkpoint.safetensors``, after checking its SHA-256 against the
    one ``checkpoint.json`` recorded (:func:`check_file_digest`)."""
    from safetensors.torch import load_file

    try:
        recorded = json.loads((Path(path) / CKPT_META).read_text()).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        recorded = None  # load_meta has refused an unreadable checkpoint.json already
    check_file_digest(Path(path) / CKPT_WEIGHTS, recorded)
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
    """The first ``epochs`` lines of ``metrics.jsonl`` (lines of epochs after the checkpoint are dropped).
    The file is written whole and atomically, so a line cut short or a missing epoch means it was damaged
    afterwards: a one-line :class:`GSDError` (the summary and curves of the run need every epoch's row)."""
    f = Path(path) / METRICS
    if not f.exists():
        return []
    rows = []
    for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or not isinstance(row.get("epoch", 0), (int, float)):
            raise GSDError(f"{f}: line {i} is not a metrics row (the file was cut short or edited); restore it from a "
                           "backup, or start a new run (the checkpoint itself is intact)")
        rows.append(row)
    rows = [r for r in rows if r.get("epoch", 0) <= epochs]
    have = {int(r["epoch"]) for r in rows if "epoch" in r}
    missing = [e for e in range(1, epochs + 1) if e not in have]
    if missing and epochs:
        raise GSDError(f"{f}: the rows of epoch(s) {', '.join(map(str, missing[:5]))} are missing (the file was cut short "
                       "or edited); restore it from a backup, or start a new run (the checkpoint itself is intact)")
    return rows


def write_metrics(path: Path, rows: list[dict]) -> None:
    atomic_write(Path(path) / METRICS, "".join(json.dumps(r) + "\n" for r in rows), private=True)  # test metrics: not DP
