"""Parameter-efficient fine-tuning (PEFT): which parameters a second phase and a private fine-tuning
train, and the one resolver that ``gsd rank`` and ``gsd train`` share (paper 004, Section 5.2, Table 8).

GSD must be computed on exactly the parameters that will be trained (the paper: "we use the same model
setting for private training and distance computation"), so both commands build their model with
:func:`build_model`: the registry's model, pre-trained weights (:mod:`gsd_cli.models.weights`) with a new
head sized to the task, then the ``--peft`` choice. Everything else is frozen (``requires_grad``
False, never in the optimiser, unchanged by training).

``--peft`` SPEC is one of

* a preset of the model (``gsd models show NAME``), e.g. ``paper``: paper 004 Table 8 (resnet152:
  ``fc`` + ``layer3.32.conv1.weight``; densenet121: ``classifier`` + two ``conv1`` weights of
  ``denseblock3``; vit_b_16: LoRA r=8, alpha=8);
* ``head`` (also ``last``): the classification head only (the last Linear layer);
* ``bitfit``: every bias term (BitFit, Zaken et al.) and the head, which is new and must learn;
* ``lora`` or ``lora:r=8,alpha=8,dropout=0,targets=REGEX``: LoRA adapters (Hu et al.) through the
  ``peft`` library (optional: ``pip install 'gsd-cli[lora]'``), plus the head. The adapters' B
  matrices start at zero, so the model computes exactly the same function before training. Default
  targets: for vit_b_16 the attention projections of every encoder block (query/key/value ``in_proj``
  and ``out_proj``: torchvision's ``nn.MultiheadAttention`` is rebuilt with the same tensors as
  :class:`probes.backbones.LinearSelfAttention`, whose projections are ``nn.Linear`` layers; peft's
  own wrapper of ``nn.MultiheadAttention`` merges the adapter into the weights in place around each
  forward, which torch.func's functional per-sample gradients, and so DP-SGD's clipping, cannot
  see); for other models every Linear and Conv2d layer except the head;
* comma-separated names or glob patterns over parameter names; a module name (``fc``) means all its
  parameters (``fc.*``), e.g. ``'fc,layer3.32.conv1.weight'``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..errors import ModelError
from .params import match_patterns

KEYWORDS = ("head", "last", "bitfit", "lora")
LORA_INSTALL = "LoRA needs the peft library: pip install 'gsd-cli[lora]' (or pip install peft)"


@dataclass
class PeftChoice:
    """A parsed ``--peft`` SPEC: ``kind`` is ``patterns``, ``head``, ``bitfit`` or ``lora``."""

    spec: str
    kind: str
    patterns: list[str] = field(default_factory=list)
    lora: dict = field(default_factory=dict)
    preset: str | None = None


def parse_peft(spec: str, presets: dict | None = None) -> PeftChoice:
    """Parse SPEC (see the module docstring); ``presets``: the model's named presets."""
    text = (spec or "").strip()
    if not text:
        raise ModelError("--peft is empty; give a preset (gsd models show NAME), head, bitfit, lora or parameter patterns")
    presets = presets or {}
    if text in presets:
        inner = presets[text]
        if len(inner) == 1 and inner[0].split(":")[0] in KEYWORDS:
            choice = parse_peft(inner[0])
        else:
            choice = PeftChoice(text, "patterns", list(inner))
        choice.spec, choice.preset = text, text
        return choice
    head, _, rest = text.partition(":")
    if head in ("head", "last", "bitfit") and not rest:
        return PeftChoice(text, "head" if head in ("head", "last") else "bitfit")
    if head == "lora":
        opts = {"r": 8, "alpha": 8.0, "dropout": 0.0, "targets": None}
        for item in filter(None, (s.strip() for s in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or key not in opts:
                raise ModelError(f"--peft {text!r}: unknown LoRA option {item!r}; use lora:r=8,alpha=8,dropout=0,targets=REGEX")
            try:
                opts[key] = value if key == "targets" else (int(value) if key == "r" else float(value))
            except ValueError:
                raise ModelError(f"--peft {text!r}: {key} must be a number (got {value!r})") from None
            if key == "targets":
                try:
                    re.compile(value)
                except re.error as e:
                    raise ModelError(f"--peft {text!r}: targets={value!r} is not a regular expression ({e}); "
                                     "e.g. targets=.*(q|v)_proj") from None
        if opts["r"] < 1 or not opts["alpha"] > 0 or not 0 <= opts["dropout"] < 1:
            raise ModelError(f"--peft {text!r}: need r >= 1, alpha > 0 and dropout in [0, 1)")
        return PeftChoice(text, "lora", lora=opts)
    if ":" in text:
        raise ModelError(f"--peft {text!r}: unknown kind {head!r}; use a preset, head, bitfit, lora[:r=..,alpha=..] or patterns")
    return PeftChoice(text, "patterns", [p.strip() for p in text.split(",") if p.strip()])


def _lora_targets(model: nn.Module, head: str, model_name: str | None, targets: str | None) -> str:
    if targets:
        return targets
    base = (model_name or "").partition("@")[0]
    if base == "vit_b_16":
        from probes.backbones import VIT_LORA_TARGETS

        return VIT_LORA_TARGETS
    mods = [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d)) and n != head]
    if not mods:
        raise ModelError(f"LoRA: {model_name} has no Linear or Conv2d layer besides its head; give targets=REGEX")
    return "^(" + "|".join(re.escape(n) for n in mods) + ")$"


def add_lora(model: nn.Module, opts: dict, head: str, model_name: str | None, seed: int) -> tuple[nn.Module, list[str], dict]:
    """Inject LoRA adapters (peft's ``inject_adapter_in_model``) in place; returns the model, the
    adapter parameter names and what was done. The A matrices are drawn from ``seed``."""
    try:
        from peft import LoraConfig, inject_adapter_in_model
    except ImportError:
        raise ModelError(LORA_INSTALL) from None
    targets = _lora_targets(model, head, model_name, opts.get("targets"))
    cfg = LoraConfig(r=int(opts["r"]), lora_alpha=float(opts["alpha"]), lora_dropout=float(opts["dropout"]),
                     target_modules=targets, bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 7919)
        try:
            model = inject_adapter_in_model(cfg, model)
        except ValueError as e:
            raise ModelError(f"LoRA targets {targets!r}: {str(e).splitlines()[0][:200]}") from None
    adapters = [n for n, _ in model.named_parameters() if ".lora_" in n]
    if not adapters:
        raise ModelError(f"LoRA targets {targets!r} matched no layer of {model_name}")
    wrapped = sorted({n.split(".lora_")[0] for n in adapters})
    return model, adapters, {"r": int(opts["r"]), "alpha": float(opts["alpha"]), "dropout": float(opts["dropout"]),
                             "targets": targets, "layers": len(wrapped)}


def apply_peft(model: nn.Module, spec: str | PeftChoice, *, model_name: str | None = None, presets: dict | None = None,
               seed: int = 0) -> tuple[nn.Module, list[str], dict]:
    """Apply ``--peft`` to ``model``: returns ``(model, names, info)`` where ``names`` are the
    trainable parameters (in ``named_parameters`` order) and every other parameter is frozen."""
    from .weights import head_prefix

    choice = spec if isinstance(spec, PeftChoice) else parse_peft(spec, presets)
    head = head_prefix(model)
    info: dict = {"spec": choice.spec, "kind": choice.kind, "preset": choice.preset, "head": head}
    if choice.kind == "lora":
        model, adapters, info["lora"] = add_lora(model, choice.lora, head, model_name, seed)
        all_names = [n for n, _ in model.named_parameters()]
        keep = set(adapters) | set(match_patterns(all_names, [head]))
    else:
        all_names = [n for n, _ in model.named_parameters()]
        if choice.kind == "head":
            keep = set(match_patterns(all_names, [head]))
        elif choice.kind == "bitfit":
            keep = {n for n in all_names if n.endswith(".bias")} | set(match_patterns(all_names, [head]))
        else:
            keep = set(match_patterns(all_names, choice.patterns))
            info["patterns"] = list(choice.patterns)
    names = [n for n in all_names if n in keep]
    for n, p in model.named_parameters():
        p.requires_grad_(n in keep)
    params = dict(model.named_parameters())
    info["trainable"] = sum(params[n].numel() for n in names)
    info["total"] = sum(p.numel() for p in params.values())
    info["tensors"] = len(names)
    return model, names, info


def build_model(model_name, num_classes: int, seed: int = 0, *, weights: str | None = None, peft: str | None = None,
                params=None, batchnorm: str = "freeze"):
    """The model that ``gsd rank`` and ``gsd train`` use: ``model_name`` (any model reference of
    :mod:`gsd_cli.models.spec`: registry name, ``timm:NAME``, ``PATH.py:FACTORY``, ``nn.Module``) with
    initial weights from ``seed``, then ``weights`` (stage 0: pre-trained weights, new head), its
    BatchNorm layers made exact by ``batchnorm`` (:mod:`gsd_cli.models.exact`), then ``peft``
    (or the older ``params`` glob selection; not both). Returns ``(spec, model, names, info)``."""
    from .params import select_parameters
    from .exact import make_exact
    from .spec import build_spec_model, model_label

    if peft is not None and params:
        raise ModelError("give --peft or --params, not both (--peft also accepts parameter patterns)")
    spec, model = build_spec_model(model_name, num_classes, seed)
    model_name = model_label(model_name)
    own = spec.origin.get("kind") == "module"
    info: dict = {"stage0": {"weights": "the module's own weights" if own else "random initialisation from --seed", "seed": seed}}
    if weights is not None:
        from .weights import load_weights

        info["stage0"] = {"weights": "pre-trained", **load_weights(model, weights, model_name, spec)}
    model, exact = make_exact(model, batchnorm, model_name)
    if exact is not None:
        info["batchnorm"] = exact
    if peft is not None:
        model, names, info["peft"] = apply_peft(model, peft, model_name=model_name, presets=spec.presets, seed=seed)
    else:
        names = select_parameters(model, params)
        keep = set(names)
        for n, p in model.named_parameters():
            p.requires_grad_(n in keep)
    return spec, model, names, info
