"""What ``gsd datasets list`` and ``gsd datasets show`` print."""

from __future__ import annotations

from pathlib import Path

from ..errors import DatasetError
from .embedded import EMBEDDED
from .published import FOLDERS, LAYOUTS, PUBLISHED, URLS
from .registry import resolve
from .roots import data_root
from .torchvision_sets import TORCHVISION, TORCHVISION_ALIASES


def list_datasets(root: str | Path | None = None) -> list[dict]:
    """Every built-in name: ``{name, kind, aliases, present, where, layout, url}``; ``where`` is the
    folder it was found in, or the folders it is looked for in."""
    root = data_root(root)
    rows = [
        {"name": n, "kind": "embedded", "aliases": [], "present": True, "where": "installed packages", "layout": "", "url": ""}
        for n in EMBEDDED
    ]
    for n, spec in TORCHVISION.items():
        found = next((b for b in (root, root / n) if any((b / m).exists() for m in spec.markers)), None)
        rows.append({
            "name": n, "kind": "torchvision", "aliases": sorted(a for a, t in TORCHVISION_ALIASES.items() if t == n),
            "present": found is not None, "where": str(found) if found else f"{root} or {root / n}",
            "layout": spec.layout, "url": spec.url,
        })
    for n, factory in PUBLISHED.items():
        try:
            src = factory(None, root)
            present, where = True, str(getattr(src, "root", root))
        except DatasetError:
            present, where = False, " or ".join(str(root / f) for f in FOLDERS[n][:2])
        rows.append({"name": n, "kind": "published", "aliases": [], "present": present, "where": where,
                     "layout": LAYOUTS[n], "url": URLS[n]})
    return rows


def describe_dataset(name: str, root: str | Path | None = None, download: bool = False) -> dict:
    """``resolve(name).describe()``: layout found, examples, classes, multi-label, image size."""
    d = resolve(name, root=root, download=download).describe()
    if "image_size" not in d:
        src = resolve(name, root=root)
        if len(src):
            d["image_size"] = list(src.images([0])[0].shape)
    return d
