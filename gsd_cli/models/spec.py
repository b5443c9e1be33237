"""Any model: what ``--model`` (and the Python API's ``model=``) may name, resolved to a
:class:`probes.ModelSpec`.

A model reference is one of

* a registered name (``gsd models list``), e.g. ``probe``, ``resnet18@32``;
* ``timm:NAME`` (timm, an optional extra: ``pip install 'gsd-cli[timm]'``): ``timm.create_model(NAME,
  pretrained=False, num_classes=N, in_chans=C)``. Nothing is downloaded: pre-trained weights come
  from a local file with ``--weights FILE`` (:mod:`gsd_cli.models.weights`; e.g. the ``model.safetensors``
  that timm saved in the Hugging Face cache where there was internet), head new as always;
* ``PATH.py:FACTORY``: a user's own ``nn.Module``. **Loading it executes the file** (as ``python
  PATH.py`` would, its folder first on ``sys.path`` while it loads), once per content; then
  ``FACTORY(num_classes=N)`` must return an ``nn.Module`` (a class works too). Give it only files you
  trust, as any Python code you run;
* from Python, an ``nn.Module`` object (copied; its own weights are w0, so ``seed`` does not change
  them), a callable ``factory(num_classes=N) -> nn.Module``, or a :class:`probes.ModelSpec`.

Input size and channels, first that applies: the suffix ``@SIZE`` or ``@SIZExC`` (``timm:resnet10t@32``,
``net.py:make@28x1``); the model's attributes ``input_size`` (pixels, or timm's ``(C, H, W)``) and
``in_channels`` / ``in_chans``; timm's ``pretrained_cfg``; for the channels, the first convolution's
``in_channels``, else 3. A factory that takes ``in_channels`` (or ``in_chans``) and ``input_size`` (or
``img_size``) gets the suffix's values. A timm, file or Python model is checked once it is built: one
forward pass of a zero image must give ``num_classes`` logits, else a one-line :class:`ModelError`.

Per-sample gradients must stay exact: BatchNorm layers are frozen, replaced or refused by
:mod:`gsd_cli.models.exact`. What identifies a model in the cache: :func:`model_identity`.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import sys
import types
from dataclasses import replace
from pathlib import Path

from ..errors import ModelError
from .digest import model_label, module_identity, qualname

TIMM_INSTALL = "install it with: pip install 'gsd-cli[timm]'"
_LOADED: dict[tuple[str, str], types.ModuleType] = {}  # (path, sha256) -> the executed user file


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:limit]}" if text else type(e).__name__


def import_timm(ref: str = "timm:NAME"):
    """The ``timm`` module, or a one-line :class:`ModelError` saying how to install it."""
    try:
        import timm
    except ImportError:
        raise ModelError(f"--model {ref} needs timm, which is not installed; {TIMM_INSTALL}") from None
    return timm


def split_file_reference(text: str) -> tuple[str, str] | None:
    """``PATH.py:FACTORY`` -> ``(PATH.py, FACTORY)``; None when ``text`` names no Python file."""
    path, colon, factory = text.rpartition(":")
    if colon and path.endswith(".py"):
        return path, factory
    if text.endswith(".py"):
        return text, ""
    return None


# -- resolution --------------------------------------------------------------------------------------


def resolve_model(ref) -> "ModelSpec":  # noqa: F821 (probes.ModelSpec)
    """The :class:`probes.ModelSpec` of a model reference (see the module docstring). Raises
    :class:`ModelError` in one line for an unknown name, a missing file or factory, or no timm."""
    import torch.nn as nn
    from probes import ModelSpec, get_model_spec, parse_input

    if isinstance(ref, ModelSpec):
        return ref
    if isinstance(ref, nn.Module):
        return _module_spec(ref)
    if callable(ref) and not isinstance(ref, str):
        return _factory_spec(ref, model_label(ref), None, None, {"kind": "factory", "qualname": qualname(ref)})
    if not isinstance(ref, str) or not ref.strip():
        raise ModelError(f"--model must name a model (gsd models list), timm:NAME or FILE.py:FACTORY (got {ref!r})")
    try:
        base, size, chans = parse_input(ref.strip())
    except KeyError as e:
        raise ModelError(str(e.args[0])) from None
    if base.startswith("timm:"):
        return _timm_spec(ref, base[len("timm:"):], size, chans)
    parts = split_file_reference(base)
    if parts is not None:
        return _file_spec(ref, parts[0], parts[1], size, chans)
    try:
        return get_model_spec(ref.strip())
    except KeyError as e:
        raise ModelError(str(e.args[0])) from None


def _timm_spec(ref: str, name: str, size: int | None, chans: int | None):
    from probes import ModelSpec

    timm = import_timm(ref)
    if not name:
        raise ModelError("--model timm:NAME needs a model name, e.g. timm:resnet18 (timm.list_models())")
    if not timm.is_model(name):
        import difflib

        near = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
        raise ModelError(f"--model {ref}: timm {timm.__version__} has no model {name!r}"
                         + (f"; did you mean {', '.join(near)}?" if near else "; see timm.list_models('PATTERN*')"))
    cfg = timm.get_pretrained_cfg(name)
    default = tuple(cfg.input_size) if cfg is not None and getattr(cfg, "input_size", None) else None

    def build(num_classes: int = 10, in_channels: int | None = 3, input_size: int | None = None):
        kw = dict(pretrained=False, num_classes=num_classes, in_chans=in_channels or 3)
        if size is not None:  # a transformer's patch grid follows the size; a CNN takes any size
            try:
                return timm.create_model(name, img_size=size, **kw)
            except TypeError:
                pass
        return timm.create_model(name, **kw)

    return ModelSpec(ref, build, size or (default[-1] if default else None), chans or 3,
                     f"timm {name} (pretrained=False; --weights FILE for pre-trained weights)", takes_input_size=True,
                     origin={"kind": "timm", "name": name, "timm": timm.__version__})


def _load_file(ref: str, path: Path) -> tuple[types.ModuleType, str]:
    """Execute the user's file once per content (module docstring); returns the module and its SHA-256."""
    if not path.exists():
        raise ModelError(f"--model {ref}: no such file {path}")
    if not path.is_file():
        raise ModelError(f"--model {ref}: {path} is not a file; give PATH.py:FACTORY")
    data = path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    key = (str(path.resolve()), sha)
    if key in _LOADED:
        return _LOADED[key], sha
    name = f"gsd_user_model_{sha[:16]}"
    module = types.ModuleType(name)
    module.__file__ = str(path.resolve())
    module.__gsd_sha256__ = sha
    sys.modules[name] = module  # dataclasses, pickling and inspect look their module up here
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)
    try:
        exec(compile(data, str(path.resolve()), "exec"), module.__dict__)  # noqa: S102 - the user's own model file (documented)
    except (Exception, SystemExit) as e:
        sys.modules.pop(name, None)
        raise ModelError(f"--model {ref}: running {path.name} failed ({_first_line(e)})") from None
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    _LOADED[key] = module
    return module, sha


def _file_spec(ref: str, file: str, factory: str, size: int | None, chans: int | None):
    path = Path(file).expanduser()
    if not factory:
        raise ModelError(f"--model {ref}: name the function or class that builds the model: {file}:FACTORY")
    module, sha = _load_file(ref, path)
    fn = getattr(module, factory, None)
    if fn is None:
        defined = sorted(n for n, v in vars(module).items()
                         if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        raise ModelError(f"--model {ref}: {path.name} defines no {factory!r}"
                         + (f"; it defines {', '.join(defined[:8])}" if defined else "; define FACTORY(num_classes) -> nn.Module"))
    if not callable(fn):
        raise ModelError(f"--model {ref}: {factory} in {path.name} is a {type(fn).__name__}, not a function or class")
    origin = {"kind": "file", "path": str(path.resolve()), "sha256": sha, "factory": factory}
    return _factory_spec(fn, ref, size, chans, origin)


def _factory_spec(fn, ref: str, size: int | None, chans: int | None, origin: dict):
    from probes import ModelSpec

    def build(num_classes: int = 10, in_channels: int | None = None, input_size: int | None = None):
        return call_factory(fn, ref, num_classes, chans, size)

    return ModelSpec(ref, build, size, chans, f"user model {ref}", takes_input_size=True, origin=origin)


def call_factory(fn, ref: str, num_classes: int, channels: int | None = None, size: int | None = None):
    """``fn(num_classes=N)`` (plus ``in_channels``/``input_size`` where it takes them and they are
    given), checked to be an ``nn.Module``."""
    import torch.nn as nn

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): just call it
        params = None
    kw = {"num_classes": num_classes}
    if params is not None and "num_classes" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        raise ModelError(f"--model {ref}: the factory must take num_classes=N (the private set's classes); "
                         f"its parameters are ({', '.join(params)})")
    for value, names in ((channels, ("in_channels", "in_chans")), (size, ("input_size", "img_size"))):
        hit = next((n for n in names if n in (params or {})), None)
        if value is not None and hit:
            kw[hit] = value
    call = f"{getattr(fn, '__name__', 'factory')}({', '.join(f'{k}={v}' for k, v in kw.items())})"
    try:
        model = fn(**kw)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's code: its error, in one line
        raise ModelError(f"--model {ref}: {call} failed ({_first_line(e)})") from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"--model {ref}: {call} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def _module_spec(module):
    from probes import ModelSpec

    def build(num_classes: int = 10, in_channels: int | None = None):
        return copy.deepcopy(module)  # the user's object is never changed (frozen, trained...)

    label = model_label(module)
    return ModelSpec(label, build, None, None, f"nn.Module {type(module).__qualname__}",
                     origin={"kind": "module", "qualname": qualname(type(module))})


# -- after building ------------------------------------------------------------------------------------


def declared_input(model) -> tuple[int | None, int | None]:
    """``(size, channels)`` the model declares by its attributes (module docstring), None where not."""
    size = chans = None
    for attr in ("input_size", "img_size", "image_size"):
        v = getattr(model, attr, None)
        if isinstance(v, int):
            size = v
        elif isinstance(v, (tuple, list)) and len(v) in (2, 3) and all(isinstance(i, int) for i in v):
            size, chans = v[-1], (v[0] if len(v) == 3 else None)
        if size is not None:
            break
    for attr in ("in_channels", "in_chans"):
        if isinstance(getattr(model, attr, None), int):
            chans = getattr(model, attr)
            break
    cfg = getattr(model, "pretrained_cfg", None)
    if isinstance(cfg, dict) and isinstance(cfg.get("input_size"), (tuple, list)) and len(cfg["input_size"]) == 3:
        size = size or int(cfg["input_size"][-1])
        chans = chans or int(cfg["input_size"][0])
    if chans is None:
        import torch.nn as nn

        conv = next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv1d, nn.Conv3d))), None)
        chans = conv.in_channels if conv is not None else None
    return size, chans


def settle_spec(spec, model, num_classes: int):
    """``spec`` with the input size and channels read off the built ``model`` where the reference did
    not give them; a timm, file or Python model is checked by one forward pass (module docstring)."""
    size, chans = spec.input_size, spec.channels
    if size is None or chans is None:
        found_size, found_chans = declared_input(model)
        size, chans = size or found_size, chans or found_chans or 3
    if size is None:
        raise ModelError(f"model {spec.name}: its input size is unknown; write it after the model as @SIZE or "
                         "@SIZExCHANNELS (e.g. net.py:make@32x1), or give the module an input_size attribute")
    spec = replace(spec, input_size=int(size), channels=int(chans))
    if spec.origin:
        check_output(model, spec, num_classes)
    return spec


def check_output(model, spec, num_classes: int) -> None:
    """One forward pass of a zero image in eval mode: it must run and give ``(1, num_classes)`` logits."""
    import torch

    was = model.training
    model.eval()
    x = torch.zeros(1, spec.channels, spec.input_size, spec.input_size)
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as e:  # noqa: BLE001 - the user's model: its error, in one line
        raise ModelError(f"model {spec.name} fails on a 1x{spec.channels}x{spec.input_size}x{spec.input_size} input "
                         f"({_first_line(e)}); give its input as @SIZExCHANNELS after the model's name") from None
    finally:
        model.train(was)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    if shape != (1, num_classes):
        raise ModelError(f"model {spec.name} gives {shape} for one example, not (1, {num_classes}): its head must have "
                         f"num_classes={num_classes} outputs (the private set's classes), and it must return one tensor of logits")


def _check_model_memory(spec, num_classes: int, seed: int) -> None:
    """Refuse a model whose parameters (with their gradients and a per-example copy: x3) would not fit."""
    import torch

    from ..memory import check_fits

    try:
        with torch.device("meta"):
            n = sum(p.numel() for p in spec.build(num_classes=num_classes, seed=seed).parameters())
    except Exception:  # noqa: BLE001 - a model that cannot be built on the meta device: no estimate
        return
    check_fits(3 * 4 * n, f"model {spec.name} with {num_classes:,} classes ({n:,} parameters)",
               "give the real class count (--classes, or the labels' class list)")


def build_spec_model(ref, num_classes: int, seed: int = 0):
    """``(spec, model)``: the reference resolved, built with w0 from ``seed`` and settled."""
    spec = resolve_model(ref)
    if num_classes >= 10_000:  # a large head: its size from a build on the meta device (no memory), checked first
        _check_model_memory(spec, num_classes, seed)
    try:
        model = spec.build(num_classes=num_classes, seed=seed)
    except ValueError as e:
        raise ModelError(f"model {spec.name}: {e}") from None
    if spec.origin:
        model._gsd_origin = dict(spec.origin)  # a plain attribute (not in the state dict): for model_identity
    return settle_spec(spec, model, num_classes), model


def model_identity(model_or_spec, *, weights: bool = True) -> str:
    """A string that changes when the model's architecture, code or (with ``weights``) weights change.

    For a built ``nn.Module``: :func:`gsd_cli.models.digest.module_identity` (its class, a digest of its
    ``repr``, of its classes' code, where it came from: timm name and version, the file's SHA-256 and
    factory, and with ``weights`` of its state dict). For a reference (a name, ``timm:NAME``,
    ``PATH.py:FACTORY``, a spec): what it resolves to, without building it. The disk cache of public
    subspaces keys on it (:func:`gsd_cli.ranking.cache.public_cache_key`)."""
    import torch.nn as nn

    if isinstance(model_or_spec, nn.Module):
        return module_identity(model_or_spec, weights=weights)
    spec = resolve_model(model_or_spec)
    origin = ",".join(f"{k}={v}" for k, v in sorted(spec.origin.items())) or "registry"
    return f"spec:{spec.name} [{origin}] input={spec.input_size}x{spec.channels}"
