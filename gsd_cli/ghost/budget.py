"""The memory budget of the gradient work, and the choice between the materialised and the Gram path."""

from __future__ import annotations

import re
from typing import Callable, Iterable

import torch

from ..errors import GSDError

GRAMS = ("auto", "materialize", "ghost")

#: default --memory-budget: 4 GiB
DEFAULT_BUDGET = 4 * 2**30

#: ``batches(chunk_size)`` -> a fresh iterator of ``(x, y)`` chunks, the same examples in the same order each time.
Batches = Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]


def parse_bytes(text: str | int | float) -> int:
    """``'4G'``, ``'512M'``, ``'1.5GiB'``, ``'2000000'`` -> bytes (binary units)."""
    if isinstance(text, (int, float)):
        n = int(text)
    else:
        mt = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", str(text).lower())
        if not mt:
            raise GSDError(f"--memory-budget {text!r} is not a size; write e.g. 4G, 512M or 2000000")
        n = int(float(mt.group(1)) * 1024 ** "bkmgt".index(mt.group(2) or "b"))
    if n < 2**20:
        raise GSDError(f"--memory-budget must be at least 1M (got {text!r})")
    return n


def choose_gram(gram: str, m: int, p: int, memory_budget: int | str | None, sketch_dim: int | None = None) -> str:
    """``materialize`` or ``ghost`` for ``gram`` in :data:`GRAMS`: ``auto`` materialises when the m x p
    float32 matrix fits ``memory_budget`` (default :data:`DEFAULT_BUDGET`), else ghost. ``--dp-sketch``
    projects the m x p matrix, so it materialises."""
    if gram not in GRAMS:
        raise GSDError(f"--gram must be one of {', '.join(GRAMS)} (got {gram!r})")
    budget = DEFAULT_BUDGET if memory_budget is None else parse_bytes(memory_budget)
    if sketch_dim:
        if gram == "ghost":
            raise GSDError("--dp-sketch projects the m x p gradient matrix; use --gram materialize or auto with it")
        return "materialize"
    if gram == "auto":
        return "materialize" if 4 * m * p <= budget else "ghost"
    return gram
