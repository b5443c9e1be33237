"""What a folder source's layout and images look like, when it may not be what was meant (issue 64): a class folder
holding sub-folders of images (:func:`nested_note`; they count as its class, as in torchvision's ``ImageFolder``), and
images of mixed sizes or modes (:class:`FirstRead`). Each is said once, as a :class:`gsd_cli.errors.DataWarning`;
``gsd datasets check`` (:mod:`.check`) lists them too."""

from __future__ import annotations

import threading
import warnings

import numpy as np

from ..errors import DataWarning


def nested_note(name: str, nested: dict) -> str:
    """The line that says which class folders of ``name`` hold sub-folders of images, counted as their class."""
    shown = []
    for cls, subs in sorted(nested.items())[:3]:
        more = f", ... ({len(subs) - 2} more)" if len(subs) > 2 else ""
        shown.append(f"{cls}/ holds {', '.join(f'{d}/ ({n} images)' for d, n in subs[:2])}{more}")
    rest = f"; and {len(nested) - 3} more class folder(s)" if len(nested) > 3 else ""
    return (f"{name}: {'; '.join(shown)}{rest}: a sub-folder's images count as its class folder's class; if they are "
            "another class, move them to a class folder of their own (gsd datasets check lists them)")


def mixed_note(name: str, shapes: set) -> str:
    """The line that says a source's images differ in size or in mode (grey and colour), as first read."""
    sizes = sorted({s[:2] for s in shapes})
    modes = sorted({"grey" if len(s) == 2 else {1: "grey", 3: "colour"}.get(s[2], f"{s[2]} channels") for s in shapes},
                   key=lambda m: (m != "grey", m))
    said = []
    if len(sizes) > 1:
        said.append("sizes " + ", ".join(f"{h}x{w}" for h, w in sizes[:3]) + (", ..." if len(sizes) > 3 else ""))
    if len(modes) > 1:
        said.append("modes " + " and ".join(modes))
    return (f"{name}: images of mixed {' and '.join(said)} (as first read): each is resized to the model's input and "
            "converted to its channels; if they should not be together, check the folder (gsd datasets check lists them all)")


class FirstRead:
    """What a source's images looked like when first read (a decoded image's shape: size and channels), to warn once
    (:class:`gsd_cli.errors.DataWarning`) when they differ."""

    def __init__(self, name: str):
        self.name, self.shapes, self.told, self.lock = name, set(), False, threading.Lock()

    def __getstate__(self) -> dict:  # a source travels to other processes (Ray, spawn): without its lock
        return {k: v for k, v in self.__dict__.items() if k != "lock"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, lock=threading.Lock())

    def see(self, images: list) -> list:
        with self.lock:
            self.shapes.update(tuple(np.shape(img)) for img in images)
            tell = not self.told and (len({s[:2] for s in self.shapes}) > 1 or len({len(s) == 2 or s[2] for s in self.shapes}) > 1)
            self.told = self.told or tell
        if tell:
            warnings.warn(DataWarning(mixed_note(self.name, self.shapes)), stacklevel=3)
        return images
