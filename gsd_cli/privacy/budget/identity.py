"""What a private data set is, for the ledger: the identities of its examples, one per example.

A budget is a promise to the people in the data, so the ledger keys it by the examples, not by the
file that holds them. Each example's identity (:func:`example_digest`) is a digest of its *decoded*
image in one canonical form, so the same picture has the same identity however it is stored:

* the pixel values the source decodes (floats in [0, 1]) quantised to 8 bits, ``round(255 x)``: a
  uint8 npz, a float npz, an 8-bit or a 16-bit PNG of the same image agree;
* the layout ``H x W`` for a grey image, ``H x W x 3`` for a colour one: a trailing channel of 1 is
  dropped, and a colour image whose three channels are equal *is* its grey image (a grey picture
  saved as RGB);
* nothing else: not the file's name, path, format or bytes, not the order of the examples, and not
  the **label**. The label is left out on purpose: a label is an index whose meaning depends on the
  source's class order (a PNG folder's sorted folder names, an npz's ``classes``), and a relabelled
  copy of a person's image is still that person's record. Two people with the very same image (a
  blank frame) are taken for one: the ledger then charges both sets, the safe side.

The canonical form and the digest are gsd's one notion of "the same example"
(:func:`gsd_cli.data.base.example_identity`), shared with the overlap checks. The ledger never stores
these digests as they are (anyone could recompute them from an image): it stores them keyed
(:mod:`.key`).

A data set's own identity (:attr:`DataIdentity.digest`) is the digest of the sorted multiset of its
example identities: the same examples in any order, format or folder are one set. What this cannot
see: a copy in which *every* image was changed (re-encoded as JPEG, resized, brightened by one grey
level, augmented) shares no example identity with the original, and near-duplicates are not found;
see ``docs/budget.md``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...data.base import EXAMPLE_HEX, EXAMPLE_TAG, canonical, example_identities, example_identity  # noqa: F401  (one identity)

#: Examples decoded at once.
CHUNK = 256


@dataclass(frozen=True)
class DataIdentity:
    """A private data set as the ledger knows it: ``digest`` (what it is: the digest of its examples),
    ``name`` (as first given), ``how`` it was identified, ``examples`` (the distinct identities of its
    examples, sorted; empty for an identity known by its digest alone) and ``size`` (examples counted
    with repeats). ``legacy``: computes the digest an older gsd gave this set (to upgrade its ledger).
    ``keyed``: the digests are the ledger's stored form (:meth:`BudgetLedger.stored`, HMAC under the
    ledger's key); an identity computed from the data (:func:`data_identity`) is not, and never leaves
    the process."""

    digest: str
    name: str
    how: str
    examples: tuple[str, ...] = field(default=(), repr=False)
    size: int | None = None
    legacy: Callable[[], str] | None = field(default=None, repr=False, compare=False)
    keyed: bool = False


#: The ledger's name for the one example identity of gsd (:func:`gsd_cli.data.base.example_identity`).
example_digest = example_identity


def example_digests(source, indices: Sequence[int] | None = None, chunk: int = CHUNK) -> list[str]:
    """:func:`example_digest` of the examples ``indices`` of ``source`` (None: all), decoded ``chunk`` at a time."""
    return example_identities(source, indices, chunk)


def data_identity(source) -> DataIdentity:
    """The identity of the data set behind ``source`` (an :class:`gsd_cli.data.ImageSource` or a spec;
    a :class:`DataIdentity` is returned as it is): the *whole* data set under any ``:train`` /
    ``:test`` part, subset or class list (a training on ``NAME:train`` and a DP ranking of ``NAME``
    charge one budget: the safe side), every example decoded once (module docstring). Computed once
    per source object."""
    from ... import data as gdata
    from ...data.identity import _leaf, leaf_identities

    if isinstance(source, DataIdentity):
        return source
    if isinstance(source, str):
        source = gdata.resolve(source)
    leaf, _ = _leaf(source)
    kept = leaf.__dict__.get("_gsd_ledger_identity")
    if kept is not None:
        return kept
    keys = leaf_identities(leaf)  # every example decoded once, shared with the overlap checks
    h = hashlib.sha256(f"gsd-data-set-2:{len(keys)}\n".encode())
    for k in sorted(keys):
        h.update(k.encode() + b"\n")
    ident = DataIdentity(digest=h.hexdigest(), name=leaf.name, how="examples", examples=tuple(sorted(set(keys))),
                         size=len(keys), legacy=lambda: legacy_digest(leaf))
    try:
        leaf.__dict__["_gsd_ledger_identity"] = ident
    except (AttributeError, TypeError):  # a source without a __dict__: computed again next time
        pass
    return ident


def legacy_digest(source) -> str:
    """The digest gsd 0.3 and earlier gave the data set (``gsd-data-identity-1``: the sorted content
    hashes of an in-memory set, the SHA-256 of each file's bytes for a file-backed one, sampled above
    :data:`gsd_cli.data.identity.CONTENT_SAMPLE` files), to find its entry in a ledger written then."""
    from ...data.base import ArraySource
    from ...data.identity import _checked, _hashes, _leaf

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
    return h.hexdigest()
