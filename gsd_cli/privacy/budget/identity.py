"""What a private data set is, for the ledger: a digest of its examples' content."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class DataIdentity:
    """A private data set as the ledger knows it: ``digest`` (what it is), ``name`` (as first given)."""

    digest: str
    name: str
    how: str


def data_identity(source) -> DataIdentity:
    """The identity of the data set behind ``source`` (an :class:`gsd_cli.data.ImageSource` or a spec;
    a :class:`DataIdentity` is returned as it is).

    The *whole* data set under any ``:train`` / ``:test`` part, subset or class list (a training on
    ``NAME:train`` and a DP ranking of ``NAME`` charge one budget: the safe side), identified by the
    content of its examples, as the overlap check hashes them (:mod:`gsd_cli.data.identity`): the
    content hash of every example of an in-memory set, the SHA-256 of each file's bytes for a
    file-backed one (all of them up to :data:`gsd_cli.data.identity.CONTENT_SAMPLE` files, else that
    many drawn with a fixed public seed), else the decoded images. The hashes are sorted before they
    are combined, so the order of the examples does not matter. Labels are not part of it."""
    from ... import data as gdata
    from ...data.base import ArraySource
    from ...data.identity import _checked, _hashes, _leaf

    if isinstance(source, DataIdentity):
        return source
    if isinstance(source, str):
        source = gdata.resolve(source)
    leaf, _ = _leaf(source)
    if isinstance(leaf, ArraySource):
        keys, how = leaf.example_keys(), "arrays"
    else:
        idx = _checked(leaf, None)
        files = len(leaf) > 0 and leaf.example_file(0) is not None
        keys, how = _hashes(leaf, idx, files), ("files" if files else "decoded")
        if len(idx) < len(leaf):
            how += f"-sample{len(idx)}"
    h = hashlib.sha256(f"gsd-data-identity-1:{how}:{len(keys)}\n".encode())
    for k in sorted(keys):
        h.update(k.encode() + b"\n")
    return DataIdentity(digest=h.hexdigest(), name=leaf.name, how=how)
