"""Models: what ``--model`` names and how a network is made ready for gradients.

* :mod:`.spec`: model names (registry, ``timm:NAME``, ``PATH.py:FACTORY``, an ``nn.Module``) and the
  input they take;
* :mod:`.exact`: BatchNorm policies (freeze, GroupNorm, refuse), so that per-sample gradients are exact;
* :mod:`.weights`: ``--weights`` (safetensors or a weights-only state dict);
* :mod:`.peft`: the trainable subset (``--params``, ``--peft`` presets, LoRA via peft) and ``build_model``;
* :mod:`.digest`: a model's identity for caches and summaries;
* :mod:`.info`: ``gsd models list`` / ``show``.

Layer: above :mod:`gsd_cli.data`, below :mod:`gsd_cli.gradients`.
"""
