"""A registry of named plug-ins (distances, executors): one decorator registers a class under a name.

>>> from gsd_cli.registry import Registry
>>> shapes = Registry("shape")
>>> @shapes.register("square")
... class Square: ...
>>> shapes.names(), shapes.get("square").name
(['square'], 'square')
"""

from __future__ import annotations

from typing import Callable, TypeVar

from .errors import GSDError

T = TypeVar("T", bound=type)


class Registry:
    """Classes by name, for one ``kind`` of plug-in (the word used in error messages)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, type] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: register the class under ``name`` (and set its ``name`` attribute)."""

        def deco(cls: T) -> T:
            if name in self._items and self._items[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            cls.name = name
            self._items[name] = cls
            return cls

        return deco

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def get(self, name: str) -> type:
        """The class registered as ``name``; an unknown name is a one-line error listing the known ones."""
        if name not in self._items:
            raise GSDError(f"unknown {self.kind} {name!r}; use one of {', '.join(self.names())}")
        return self._items[name]

    def pop(self, name: str) -> type | None:
        """Unregister ``name`` (tests that register a plug-in of their own)."""
        return self._items.pop(name, None)
