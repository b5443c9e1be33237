"""What identifies a model: :func:`module_identity` (architecture, code, origin, weights) and
:func:`model_label` (how a model is written in settings and outputs). The public entry point is
:func:`gsd_cli.models.spec.model_identity`, which also takes a model reference."""

from __future__ import annotations

import functools
import hashlib
import json
import inspect
import sys
import weakref

#: packages whose classes are identified by their version, not by their source file
LIBRARIES = ("torch", "torchvision", "timm", "probes", "gsd_cli", "peft", "opacus")
_LABELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (tensor stamp, digest)


def model_label(ref) -> str:
    """How a model reference is written in settings, summaries and rankings: a string reference as
    given; a spec's name; ``module:CLASS#DIGEST`` for an ``nn.Module`` (DIGEST: 12 hex digits of its
    :func:`module_identity`, so a resumed run can tell another module); ``factory:QUALNAME``."""
    import torch.nn as nn
    from probes import ModelSpec

    if isinstance(ref, str):
        return ref
    if isinstance(ref, ModelSpec):
        return ref.name
    if isinstance(ref, nn.Module):
        stamp = tuple((n, t.data_ptr(), t._version) for n, t in ref.state_dict(keep_vars=True).items())
        kept = _LABELS.get(ref)
        if kept is None or kept[0] != stamp:  # hashing the weights once while no tensor of it changes
            kept = _LABELS[ref] = (stamp, hashlib.sha256(module_identity(ref).encode()).hexdigest()[:12])
        return f"module:{type(ref).__qualname__}#{kept[1]}"
    return f"factory:{qualname(ref)}"


def qualname(obj) -> str:
    """``module.qualname`` of a function or class."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _weights_digest(model) -> str:
    import torch

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        h.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _library_version(top: str) -> str:
    import importlib.metadata as md

    try:
        return md.version("gsd-cli" if top in ("gsd_cli", "probes") else top)
    except md.PackageNotFoundError:
        return str(getattr(sys.modules.get(top), "__version__", "?"))


def _code_digest(model) -> str:
    """The code of every class in ``model``: a library's version, a user class's source file digest."""
    parts = set()
    for cls in {type(m) for m in model.modules()}:
        mod = sys.modules.get(cls.__module__)
        top = cls.__module__.split(".")[0]
        if top in LIBRARIES:
            parts.add(f"{top}=={_library_version(top)}")
        elif getattr(mod, "__gsd_sha256__", None):  # a file loaded by --model PATH.py:FACTORY
            parts.add(f"{cls.__module__}.{cls.__qualname__}@{mod.__gsd_sha256__}")
        else:
            try:
                src = inspect.getsource(cls)
            except (OSError, TypeError):
                src = "?"
            parts.add(f"{cls.__module__}.{cls.__qualname__}@{hashlib.sha256(src.encode()).hexdigest()}")
    return hashlib.sha256("\n".join(sorted(parts)).encode()).hexdigest()


def module_identity(model, *, weights: bool = True) -> str:
    """A string that changes when a built model's architecture, code or (with ``weights``) weights
    change: its class, a digest of its ``repr`` (every layer and its settings), of its classes' code
    (a library's version; a user class's source, or the SHA-256 of the file ``--model PATH.py:FACTORY``
    ran), where it came from (``_gsd_origin``: timm name and version, the file and factory) and, with
    ``weights``, of its state dict."""
    m = model
    cls = type(m)
    origin = ",".join(f"{k}={v}" for k, v in sorted(getattr(m, "_gsd_origin", {}).items()))
    parts = [f"class={cls.__module__}.{cls.__qualname__}", f"arch={hashlib.sha256(repr(m).encode()).hexdigest()[:32]}",
             f"code={_code_digest(m)[:32]}"] + ([f"origin=[{origin}]"] if origin else [])
    if weights:
        parts.append(f"weights={_weights_digest(m)[:32]}")
    return " ".join(parts)


# --- the digest of a model object (its description and state): what a cached public subspace is keyed on

def _tensor_digest(*tensors: "torch.Tensor") -> str:
    import torch

    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b"")  # reshape: a 0-dim buffer (num_batches_tracked); no copy
    return h.hexdigest()


_MODEL_DIGESTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_digest(model: "torch.nn.Module") -> str:
    """SHA-256 of a model's description (its ``repr``: layers, their shapes and activations; which
    modules are in training mode) and of its state (parameters and buffers, by name). Kept per model
    object while no tensor of it changes (same storage, same in-place version counter), so that the
    candidates of one ranking hash the weights once."""
    state = sorted(model.state_dict(keep_vars=True).items())
    stamp = tuple((n, t.data_ptr(), t._version, tuple(t.shape), str(t.dtype)) for n, t in state)
    kept = _MODEL_DIGESTS.get(model)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    h = hashlib.sha256()
    h.update(repr(model).encode())
    h.update(repr([m.training for m in model.modules()]).encode())
    h.update(json.dumps([n for n, _ in state]).encode())
    h.update(_tensor_digest(*[t.detach() for _, t in state]).encode())
    digest = h.hexdigest()
    _MODEL_DIGESTS[model] = (stamp, digest)
    return digest
