"""The dataset-source interface every dataset plugs into.

A source is a list of labelled images that can be opened *by index*, so that drawing m examples from
a set of hundreds of thousands opens only those m files. Sources return images at their native size;
:mod:`gsd_cli.data.transform` turns them into model input.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np


class ImageSource(ABC):
    """A labelled image dataset opened by index.

    Subclasses set ``name``, ``num_classes`` and ``multilabel`` and implement ``__len__``,
    :meth:`labels` and :meth:`images`.
    """

    name: str
    num_classes: int
    multilabel: bool = False
    description: str = ""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def labels(self, indices: Sequence[int]) -> np.ndarray:
        """Labels of the given examples: int64 ``(n,)``, or float32 0/1 ``(n, num_classes)`` if multi-label."""

    @abstractmethod
    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        """The given examples as arrays ``H x W`` or ``H x W x C`` (C in 1, 3), float32 in [0, 1]."""

    def describe(self) -> dict:
        """What ``gsd datasets show`` prints: a JSON-able summary."""
        return {
            "name": self.name,
            "examples": len(self),
            "classes": self.num_classes,
            "multilabel": self.multilabel,
            "description": self.description,
        }


class ArraySource(ImageSource):
    """Images held in memory as one array ``N x H x W`` or ``N x H x W x C``, values in [0, 1]."""

    def __init__(self, name: str, x: np.ndarray, y: np.ndarray, num_classes: int | None = None, description: str = ""):
        if len(x) != len(y):
            from ..errors import DatasetError

            raise DatasetError(f"{name}: {len(x)} images but {len(y)} labels; give one label per image")
        self.name = name
        self._x = x
        self._y = np.asarray(y)
        self.multilabel = self._y.ndim == 2
        if num_classes is None:
            num_classes = self._y.shape[1] if self.multilabel else (int(self._y.max()) + 1 if len(self._y) else 0)
        self.num_classes = int(num_classes)
        self.description = description

    def __len__(self) -> int:
        return len(self._x)

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        return self._y[idx].astype(np.float32 if self.multilabel else np.int64)

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        idx = np.asarray(indices, dtype=np.int64)
        return list(np.asarray(self._x[idx], dtype=np.float32))

    def describe(self) -> dict:
        d = super().describe()
        d["image_size"] = list(self._x.shape[1:])
        return d
