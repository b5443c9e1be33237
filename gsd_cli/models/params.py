"""Which parameters get gradients: ``--params`` glob patterns over a model's parameter names (and the
matching that ``--peft`` presets use). Re-exported by :mod:`gsd_cli.gradients`, which sits above."""

from __future__ import annotations

import fnmatch
from typing import Sequence

import torch.nn as nn

from ..errors import ModelError


def select_parameters(model: nn.Module, patterns: Sequence[str] | str | None = None) -> list[str]:
    """Names of the parameters that get gradients.

    ``patterns``: glob patterns (``fnmatch``) over ``model.named_parameters()`` names, or a comma-
    separated string of them (a pattern naming a module matches its parameters, as ``--peft``);
    ``None`` means every trainable parameter. A pattern that matches no parameter is an error (it is
    almost always a typo).
    """
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if patterns is None:
        if not names:
            raise ModelError("the model has no trainable parameters; select some with --params")
        return names
    if isinstance(patterns, str):
        patterns = [patterns]
    pats = [q.strip() for pat in patterns for q in pat.split(",") if q.strip()]
    if not pats:
        raise ModelError("--params is empty; give glob patterns such as '*' or 'fc.*,layer3.*'")
    return match_patterns([n for n, _ in model.named_parameters()], pats, "--params")


def match_patterns(names: list[str], patterns: list[str], what: str = "--peft") -> list[str]:
    """The names matched by glob ``patterns``; a pattern naming a module matches its parameters.
    A pattern that matches nothing is an error (it is almost always a typo)."""
    chosen: set[str] = set()
    for pat in patterns:
        hit = [n for n in names if fnmatch.fnmatchcase(n, pat) or fnmatch.fnmatchcase(n, pat + ".*")]
        if not hit:
            near = [n for n in names if n.split(".")[0] == pat.split(".")[0]][:4] or names[:4]
            raise ModelError(f"{what} pattern {pat!r} matches no parameter; names look like: {', '.join(near)}, ... (gsd models show MODEL)")
        chosen.update(hit)
    return [n for n in names if n in chosen]
