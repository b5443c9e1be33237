"""``gsd models list`` / ``gsd models show NAME``: the registered models, their parameters, presets.

Only the model is built (random weights, nothing downloaded; no forward pass for a registered model,
one on a zero image for a timm or user model, :mod:`gsd_cli.models.spec`), so even resnet152 or
vit_b_16 is listed in seconds. ``show`` takes any model reference: ``timm:NAME``, ``PATH.py:FACTORY``...
"""

from __future__ import annotations

from ..errors import ModelError


def list_models_info() -> list[dict]:
    """One row per registered model: name, input size, channels, description, preset names."""
    from probes import list_models

    return [
        {"name": s.name, "input_size": s.input_size, "channels": s.channels, "description": s.description,
         "presets": sorted(s.presets)}
        for s in list_models()
    ]


def show_model(name, num_classes: int = 10, peft: str | None = None, batchnorm: str = "freeze") -> dict:
    """Parameter names, shapes and counts of model ``name`` (any reference of
    :mod:`gsd_cli.models.spec`: a registry name, ``timm:NAME``, ``PATH.py:FACTORY``, an ``nn.Module``;
    head sized to ``num_classes``), its presets with the parameters each selects, with ``peft`` what
    that choice trains, and what ``batchnorm`` (:mod:`gsd_cli.models.exact`) did to its BatchNorm layers.
    Every entry of ``parameters`` is ``{"name", "shape", "count", "trainable"}``."""
    from .spec import model_label, resolve_model
    from .peft import apply_peft, build_model

    resolve_model(name)  # an unknown name fails before the class count is looked at
    if num_classes < 1:
        raise ModelError(f"--classes must be at least 1 (got {num_classes})")
    spec, model, names, info = build_model(name, num_classes, 0, peft=peft, batchnorm=batchnorm)
    keep = set(names)
    params = [{"name": n, "shape": list(p.shape), "count": p.numel(), "trainable": n in keep} for n, p in model.named_parameters()]
    presets = {}
    for pname, pats in sorted(spec.presets.items()):
        if len(pats) == 1 and pats[0].startswith("lora"):
            presets[pname] = {"patterns": list(pats), "parameters": None, "count": None, "note": "LoRA adapters + head (gsd models show NAME --peft " + pname + ")"}
            continue
        _, chosen, pinfo = apply_peft(spec.build(num_classes=num_classes, seed=0), pname, model_name=model_label(name), presets=spec.presets)
        presets[pname] = {"patterns": list(pats), "parameters": chosen, "count": pinfo["trainable"]}
    return {
        "name": spec.name, "description": spec.description, "input_size": spec.input_size, "channels": spec.channels,
        "num_classes": num_classes, "total": sum(p["count"] for p in params),
        "trainable": sum(p["count"] for p in params if p["trainable"]), "peft": info.get("peft"),
        "batchnorm": info.get("batchnorm"), "presets": presets, "parameters": params,
    }
