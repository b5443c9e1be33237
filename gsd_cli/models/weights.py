"""Pre-trained weights for a backbone (stage 0 of paper 004's Figure 2), from a local file only.

``--weights PATH`` reads a safetensors file, or a PyTorch file with ``torch.load(weights_only=True)``:
PyTorch's restricted unpickler, which builds tensors and plain containers and refuses any other
class *without executing it*, so a checkpoint cannot run code. ``--weights NAME`` (e.g.
``IMAGENET1K_V1``) takes torchvision's published weights for the model, which torchvision downloads
into its cache: only where there is internet, and only when the user asks. ``--weights BASE`` takes a base that
``gsd pretrain`` built from public sets (the folder, or its ``weights.safetensors``), checked against its card and the
model first (:mod:`gsd_cli.models.base`).

The classification head is always new, sized to the private task (paper 004: the pre-trained
network's head has the pre-training task's classes): the head's keys in the file are dropped and
reported. Every other key must match the model exactly; missing or unexpected keys, or a shape that
differs, are a one-line :class:`~gsd_cli.errors.ModelError` listing them.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import ModelError

# torchvision's DenseNet checkpoints use the old names 'denselayer1.norm.1.weight' for 'norm1.weight'
_DENSENET_OLD = re.compile(r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|running_var))$")


_FUSED = re.compile(r"\.in_proj_(weight|bias)$")


def _listing(keys, limit: int = 6) -> str:
    keys = sorted(keys)
    return ", ".join(keys[:limit]) + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


def head_prefix(model: nn.Module) -> str:
    """Name of the classification head: the last ``nn.Linear`` module (``fc``, ``classifier``,
    ``heads.head``, ``fc2``...)."""
    last = None
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            last = name
    if last is None:
        raise ModelError("the model has no Linear layer to serve as its classification head")
    return last


def read_state_dict(source: str | Path, model_name: str | None = None, spec=None) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors of a weights file (or torchvision weight name, or a base of ``gsd pretrain``: checked against its
    card and against the model ``model_name`` of ``spec``, :mod:`gsd_cli.models.base`) and where they came from."""
    from .base import base_folder, check_base_fits, read_base, read_card

    folder = base_folder(source)
    if folder is not None:
        check_base_fits(folder, read_card(folder)[0], model_name, spec)
        state, _, info = read_base(folder)
        return state, info
    path = Path(str(source)).expanduser()
    if not path.exists():
        return _torchvision_weights(str(source), model_name)
    if path.is_dir():
        raise ModelError(f"--weights {path} is a folder without a base's card.json; give a .safetensors or .pt file, "
                         "or a base folder of gsd pretrain")
    import stat

    if not stat.S_ISREG(path.stat().st_mode):  # /dev/zero, a FIFO: read_bytes would never end
        raise ModelError(f"--weights {path} is not a regular file (a device or pipe); give a .safetensors or .pt file")
    from ..memory import check_fits

    check_fits(2 * path.stat().st_size, f"--weights {path} ({path.stat().st_size:,} bytes, read and then loaded)",
               "give a smaller weights file or free memory")
    data = path.read_bytes()
    info = {"source": str(path), "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    if data[:8] and _looks_like_safetensors(data):
        from safetensors.torch import load as st_load

        try:
            state = st_load(data)
        except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
            raise ModelError(f"--weights {path}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
        info["format"] = "safetensors"
    else:
        import io
        import pickle

        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ModelError(
                f"--weights {path}: refused, not a plain state dict of tensors (weights_only load: {first[:160]}); "
                "save the weights with torch.save(model.state_dict(), PATH) or as safetensors"
            ) from None
        except Exception as e:  # noqa: BLE001
            raise ModelError(f"--weights {path}: not a safetensors or PyTorch weights file ({type(e).__name__})") from None
        info["format"] = "torch (weights_only)"
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise ModelError(f"--weights {path}: refused, not a state dict (a mapping of parameter names to tensors)")
    return dict(state), info


def _looks_like_safetensors(data: bytes) -> bool:
    if len(data) < 10:
        return False
    n = int.from_bytes(data[:8], "little")
    return 2 <= n <= len(data) - 8 and data[8:9] == b"{"


def _torchvision_weights(name: str, model_name: str | None) -> tuple[dict, dict]:
    from probes.backbones import TORCHVISION_WEIGHTS

    base = (model_name or "").partition("@")[0]
    enum_name = TORCHVISION_WEIGHTS.get(base)
    if enum_name is None or "/" in name or name.endswith((".pt", ".pth", ".safetensors", ".bin")):
        raise ModelError(f"--weights {name}: no such file" + (
            f"; for {base} give a .safetensors / .pt file or a torchvision weight name such as IMAGENET1K_V1" if enum_name else ""))
    from ..data.torchvision_sets import import_torchvision

    tvm = import_torchvision("torchvision.models")
    enum = getattr(tvm, enum_name)
    member = name.split(".")[-1]
    if member not in enum.__members__:
        raise ModelError(f"--weights {name}: not a file, nor a torchvision weight of {base} ({', '.join(enum.__members__)})")
    try:
        state = enum[member].get_state_dict(progress=False)
    except Exception as e:  # noqa: BLE001 - no internet, a broken cache...
        raise ModelError(f"--weights {name}: torchvision could not fetch {enum_name}.{member} ({type(e).__name__}); "
                         "download it where there is internet and pass the file") from None
    return state, {"source": f"torchvision:{enum_name}.{member}", "url": enum[member].url, "format": "torchvision"}


def load_weights(model: nn.Module, source: str | Path, model_name: str | None = None, spec=None) -> dict:
    """Load pre-trained weights into ``model`` (before any PEFT change), with a new head.

    ``source``: a weights file, a torchvision weight name, or a base folder of ``gsd pretrain`` (then also checked
    against its card and against ``spec``, the model's input size and channels: :mod:`gsd_cli.models.base`).
    Returns what stage 0 saw: source, format, SHA-256 of the file, the head keys dropped (and for a base, ``base``:
    its path and the SHA-256 of its card). Raises :class:`ModelError` (nothing loaded) when keys are missing or
    unexpected or shapes differ."""
    state, info = read_state_dict(source, model_name, spec)
    state = {(_DENSENET_OLD.sub(r"\1\2", k)): v for k, v in state.items()}
    state = {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}
    own = model.state_dict()
    # torchvision's fused attention names -> probes.backbones.LinearSelfAttention's Linear layers
    state = {(_FUSED.sub(r".in_proj.\1", k) if _FUSED.sub(r".in_proj.\1", k) in own and k not in own else k): v for k, v in state.items()}
    head = head_prefix(model)
    is_head = lambda k: k.startswith(head + ".")  # noqa: E731
    dropped = sorted(k for k in state if is_head(k))
    missing = sorted(k for k in own if k not in state and not is_head(k))
    unexpected = sorted(k for k in state if k not in own and not is_head(k))
    where = info["source"]
    if missing or unexpected:
        parts = ([f"missing {len(missing)} key(s): {_listing(missing)}"] if missing else []) + (
            [f"unexpected {len(unexpected)} key(s): {_listing(unexpected)}"] if unexpected else [])
        raise ModelError(f"--weights {where} does not fit model {model_name or type(model).__name__}: {'; '.join(parts)}")
    bad = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in own if k in state and not is_head(k) and state[k].shape != own[k].shape]
    if bad:
        raise ModelError(f"--weights {where}: shapes differ from model {model_name or type(model).__name__}: {_listing(bad, 4)}")
    model.load_state_dict({k: v for k, v in state.items() if not is_head(k)}, strict=False)
    info.update(head=head, head_keys_dropped=dropped, keys_loaded=len(state) - len(dropped))
    return info
