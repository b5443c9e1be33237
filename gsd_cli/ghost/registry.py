"""The registry of the Gram path's layer rules: which rule turns a module's captured calls into factors.

A rule is a function ``factors(unit, calls) -> Factors`` (:class:`gsd_cli.ghost.factors.Factors`):
``unit`` is the :class:`gsd_cli.ghost.units.Unit` being captured (``unit.module``, ``unit.prefix`` and
``unit.params``, a list of ``(full name, local name, parameter)``), ``calls`` the module's calls in one
chunk of examples, each ``((args, kwargs), gradient of its output)``, examples on dim 0.

Two ways to register one, as Opacus registers its per-layer grad samplers:

* :func:`register_rule` names module types; a module gets the first registered type along its MRO
  whose ``applies(module)`` accepts it (``applies`` refuses the variants the rule does not cover, e.g.
  a subclass that overrides ``forward``);
* :func:`register_fallback` takes what no type rule took, fallbacks being tried by ascending
  ``priority`` (Opacus' samplers, then torch.func on the module alone). Only a ``whole`` fallback may
  take a unit that owns its submodules' parameters too (MultiheadAttention).

:func:`rule_for` picks a module's rule. Rule modules register themselves when imported; the package
:mod:`gsd_cli.ghost.rules` imports them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn as nn

from ..errors import ModelError

if TYPE_CHECKING:
    from .factors import Factors

#: one call of a module in a chunk: ``((args, kwargs), gradient of its output)``
Call = tuple[tuple[tuple, dict], torch.Tensor]
#: ``factors(unit, calls)``: the unit's contribution for the chunk
FactorsFn = Callable[..., "Factors"]


@dataclass(frozen=True)
class Rule:
    """A registered layer rule: its ``name`` (``Unit.rule``), the ``factors`` function, the predicate
    ``applies(module)``, and whether it handles a module with its submodules' parameters (``whole``)."""

    name: str
    factors: FactorsFn
    applies: Callable[[nn.Module], bool]
    whole: bool = False


_BY_TYPE: dict[type, Rule] = {}
_FALLBACKS: dict[str, tuple[int, Rule]] = {}


def _always(module: nn.Module) -> bool:
    return True


def register_rule(*module_types: type, name: str | None = None, applies: Callable[[nn.Module], bool] | None = None):
    """Decorator: ``fn(unit, calls) -> Factors`` is the rule of modules of ``module_types`` (and their
    subclasses) that ``applies`` accepts (default: all). ``name`` defaults to the function's name."""

    def deco(fn: FactorsFn) -> FactorsFn:
        rule = Rule(name or fn.__name__, fn, applies or _always)
        for t in module_types:
            _BY_TYPE[t] = rule
        return fn

    return deco


def register_fallback(*, name: str, priority: int, applies: Callable[[nn.Module], bool] | None = None, whole: bool = False):
    """Decorator: ``fn(unit, calls) -> Factors`` is a rule for the modules no type rule took and that
    ``applies`` accepts, tried after the fallbacks of lower ``priority``."""

    def deco(fn: FactorsFn) -> FactorsFn:
        _FALLBACKS[name] = (priority, Rule(name, fn, applies or _always, whole))
        return fn

    return deco


def rule_for(module: nn.Module, whole: bool = False) -> Rule:
    """The rule of ``module``; ``whole``: the unit owns its submodules' parameters too."""
    if not whole:
        for cls in type(module).__mro__:
            rule = _BY_TYPE.get(cls)
            if rule is not None and rule.applies(module):
                return rule
    for _, rule in sorted(_FALLBACKS.values(), key=lambda pr: pr[0]):
        if (rule.whole or not whole) and rule.applies(module):
            return rule
    raise ModelError(f"no Gram-path rule takes {type(module).__name__}; use --gram materialize")


def rule_names() -> list[str]:
    """The registered rules' names: type rules, then fallbacks in the order they are tried."""
    names = list(dict.fromkeys(r.name for r in _BY_TYPE.values()))
    return names + [r.name for _, r in sorted(_FALLBACKS.values(), key=lambda pr: pr[0])]
