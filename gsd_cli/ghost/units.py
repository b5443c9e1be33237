"""Units of the Gram path: the modules that own selected parameters, each with its layer rule
(:func:`gsd_cli.ghost.registry.rule_for`) and the records of its capture hooks."""

from __future__ import annotations

from typing import Sequence

import torch.nn as nn

from ..errors import ModelError
from .factors import Factors
from .registry import rule_for


class Unit:
    """A module whose parameters (selected ones among them) get gradients, with its capture hooks."""

    def __init__(self, module: nn.Module, prefix: str, params: list[tuple[str, str, nn.Parameter]], recurse: bool):
        self.module, self.prefix, self.params, self.recurse = module, prefix, params, recurse
        self.inputs: list = []  # (args, kwargs) per call, in call order
        self.grads: list = []  # output gradient per call, in backward order (reversed)
        self._rule = rule_for(module, whole=recurse)
        self.rule = self._rule.name

    def clear(self) -> None:
        self.inputs, self.grads = [], []

    def factors(self) -> Factors:
        """This chunk's factors, by the unit's layer rule."""
        if len(self.inputs) != len(self.grads):
            raise ModelError(f"layer {self.prefix or type(self.module).__name__}: {len(self.inputs)} calls but {len(self.grads)} output gradients")
        calls = list(zip(self.inputs, reversed(self.grads)))
        return self._rule.factors(self, calls)


def find_units(model: nn.Module, names: Sequence[str]) -> list[Unit]:
    """The modules that own selected parameters; MultiheadAttention (which uses its out_proj's weights
    without calling it) is one unit with all its parameters."""
    keep = set(names)
    units, taken = [], set()
    for prefix, mod in model.named_modules():
        if any(prefix == t or prefix.startswith(t + ".") for t in taken):
            continue
        recurse = isinstance(mod, nn.MultiheadAttention)
        own = [(f"{prefix}.{n}" if prefix else n, n, p) for n, p in mod.named_parameters(recurse=recurse)]
        own = [t for t in own if t[0] in keep]
        if recurse:
            taken.add(prefix)
        if own:
            units.append(Unit(mod, prefix, own, recurse))
    covered = {t[0] for u in units for t in u.params}
    missing = keep - covered
    if missing:
        raise ModelError(f"parameters {sorted(missing)[:3]} belong to no module; the ghost path cannot capture them (use --gram materialize)")
    return units
