"""Datasets: names -> sources -> seeded samples -> model input.

>>> from gsd_cli.data import resolve, draw
>>> src = resolve("digits")
>>> sample = draw(src, m=100, seed=0)
>>> len(sample)
100

Private data enters through here, so the checks that keep a DP guarantee honest live here too:
splits decided per example (:mod:`.splits`), declared class lists (:func:`with_classes`,
:func:`require_declared_classes`), non-finite pixels refused when read (:func:`read_images`), and
whether a public set shares examples with the private one (:func:`shared_examples`).

Sources also come from DICOM files (:mod:`.dicom`, in ``folder:`` and ``csv:``), with groups of
examples (patients) kept on one side of a split (:mod:`.groups`), and from a PyTorch dataset
(:func:`from_torch_dataset`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DatasetError
from .base import ArraySource, ImageSource, read_images
from .classes import require_declared_classes, with_classes
from .embedded import DEFAULT_PRIVATE, DEFAULT_PUBLIC
from .identity import draw_key, shared_examples
from .listing import describe_dataset, list_datasets
from .registry import builtin_names, dataset_names, register_dataset, register_kind, resolve, source_kinds
from .roots import data_root, default_data_root
from .torch_dataset import from_torch_dataset

# ``to_model_input`` (torch) is imported on first use (PEP 562), so that listing datasets
# (``gsd datasets list``) does not load torch.

__all__ = [
    "ImageSource", "ArraySource", "Sample", "resolve", "draw", "check_examples", "register_dataset", "register_kind",
    "dataset_names", "source_kinds", "to_model_input", "DEFAULT_PRIVATE", "DEFAULT_PUBLIC",
    "builtin_names", "list_datasets", "describe_dataset", "data_root", "default_data_root",
    "read_images", "with_classes", "require_declared_classes", "shared_examples", "from_torch_dataset",
]


@dataclass
class Sample:
    """m examples drawn from a source; images are opened chunk by chunk by :meth:`batches`."""

    source: ImageSource
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def labels(self) -> np.ndarray:
        return self.source.labels(self.indices)

    def batches(self, size: int, channels: int, chunk: int, device: torch.device | str | None = None, ahead: int = 0):
        """Yield ``(offset, x)`` with x the model input of examples ``offset:offset+chunk`` on ``device``
        (non-finite pixels refused: :func:`read_images`); ``ahead``: chunks prepared in advance by a
        background thread (:func:`gsd_cli.data.loader.model_batches`; 0: none)."""
        from .loader import model_batches

        yield from model_batches(self.source, self.indices, size, channels, chunk, device, ahead)

    def tensor(self, size: int, channels: int, device: torch.device | str | None = None) -> torch.Tensor:
        """All the drawn examples' model input in one tensor, read as :meth:`batches` reads them (files
        decoded on every core, JPEGs at a reduced scale: :mod:`gsd_cli.data.loader`)."""
        from .loader import model_batches

        parts = [x for _, x in model_batches(self.source, self.indices, size, channels, max(1, len(self)), device, ahead=0)]
        return parts[0] if parts else _to_model_input()([], size, channels, device)


def check_examples(m: int | None, name: str = "--examples") -> None:
    """A number of examples to draw per dataset: None (all) or at least 2; ``name``: the option the user
    gave it with (``gsd train --auto-select``: ``--rank-examples``)."""
    if m is not None and m < 2:
        raise DatasetError(f"{name} must be at least 2 (got {m})")


def draw(source: ImageSource | str, m: int | None, seed: int) -> Sample:
    """Draw ``min(m, len(source))`` distinct examples uniformly at random (``m=None``: all).

    The draw depends on ``seed`` and the source's identity only (:func:`gsd_cli.data.identity.draw_key`: its name,
    a file source's path made real and absolute), so adding candidates to a ranking does not change the examples
    drawn for the others, and one file draws the same examples however its path is typed.
    """
    source = resolve(source)
    n = len(source)
    check_examples(m)
    if n < 2:
        raise DatasetError(f"{source.name}: has {n} example(s); GSD needs at least 2")
    take = n if m is None else min(m, n)
    rng = np.random.default_rng([seed, _stable_hash(draw_key(source.name))])
    return Sample(source, rng.choice(n, size=take, replace=False))


def _stable_hash(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())


def _to_model_input():
    from .transform import to_model_input

    return to_model_input


def __getattr__(name: str):
    if name == "to_model_input":
        return _to_model_input()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
