"""Gram ("ghost") path: GSD from m x m Gram matrices, never an m x p per-sample gradient matrix.

GSD needs only G G^T (DESIGN.md, "Projection metric"). Hooks capture every parameterised layer's
inputs and output gradients, and each layer contributes to K = G G^T (float64) by its own rule, one
module each under :mod:`gsd_cli.ghost.rules`:

* Linear / Conv2d (:mod:`.rules.linear`, :mod:`.rules.conv`, :mod:`.rules.pairs`):
  <g_i, g_j> = <A_i A_j^T, B_i B_j^T>, or the layer's per-sample gradients where cheaper;
* Embedding (:mod:`.rules.embedding`): <g_i, g_j> = sum_{t,s} [tok_it = tok_js] (b_it . b_js);
* norm layers and the rest of Opacus' per-layer grad samplers (:mod:`.rules.opacus_samplers`), and
  anything else through torch.func on that module alone (:mod:`.rules.materialised`): that layer's
  per-sample gradients.

The rest: :mod:`.registry` (which rule a module gets), :mod:`.units` (the modules that own selected
parameters), :mod:`.factors` (a layer's factors and their storage), :mod:`.stream` (chunks and layer
groups within ``memory_budget``), :mod:`.accumulate` (K from stored factors), :mod:`.operator`
(:class:`GhostOperator`: ``gram()``, ``matvec``, ``rmatvec``), :mod:`.topk` (the top-k subspace,
:func:`ghost_subspace`), :mod:`.budget` (:func:`parse_bytes`, :func:`choose_gram`).

A rule for a new layer type is one new module in :mod:`gsd_cli.ghost.rules` with a function
``factors(unit, calls) -> Factors`` decorated by ``@register_rule(MyLayer, name="my-layer")`` (or
``@register_fallback``), plus its import in ``gsd_cli/ghost/rules/__init__.py``.
"""

from .budget import DEFAULT_BUDGET, GRAMS, Batches, choose_gram, parse_bytes
from .factors import Factors
from .registry import Rule, register_fallback, register_rule, rule_for, rule_names
from . import rules  # noqa: F401  (the layer rules register themselves)
from .operator import GhostOperator
from .topk import ghost_subspace, orthonormalise_, top_k_from_operator

__all__ = [
    "DEFAULT_BUDGET", "GRAMS", "Batches", "parse_bytes", "choose_gram", "Factors", "GhostOperator",
    "top_k_from_operator", "orthonormalise_", "ghost_subspace",
    "Rule", "register_rule", "register_fallback", "rule_for", "rule_names",
]
