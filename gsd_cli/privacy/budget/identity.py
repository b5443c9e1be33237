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

import numpy as np

#: The version tag hashed into every example identity (a change of canonical form must change it).
EXAMPLE_TAG = b"gsd-example-1\n"
#: Hex digits kept of each example's SHA-256 (128 bits: no two different images collide in practice).
EXAMPLE_HEX = 32
#: Examples decoded at once.
CHUNK = 256


@dataclass(frozen=True)
class DataIdentity:
    """A private data set as the ledger knows it: ``digest`` (what it is: the digest of its examples),
    ``name`` (as first given), ``how`` it was identified, ``examples`` (the distinct identities of its
    examples, sorted; empty for an identity known by its digest alone) and ``size`` (examples counted
    with repeats). ``legacy``: computes the digest an older gsd gave this set (to upgrade its ledger)."""

    digest: str
    name: str
    how: str
    examples: tuple[str, ...] = field(default=(), repr=False)
    size: int | None = None
    legacy: Callable[[], str] | None = field(default=None, repr=False, compare=False)


def canonical(img: np.ndarray) -> np.ndarray:
    """An image (``H x W`` or ``H x W x C``, floats in [0, 1]) in the canonical form of the ledger:
    uint8 ``round(255 x)`` (non-finite values as 0, :func:`gsd_cli.data.base.quantised`), grey as
    ``H x W`` (a trailing channel of 1 dropped; three equal channels are one grey channel)."""
    from ...data.base import quantised

    q = quantised(img)
    return _grey_if_equal(q[None])[0]


def _grey_if_equal(q: np.ndarray):
    """A stack ``n x H x W [x C]`` of uint8 images in canonical layout: a list (or array) of them."""
    if q.ndim == 4 and q.shape[-1] == 1:
        return q[..., 0]
    if q.ndim == 4 and q.shape[-1] == 3:
        grey = (q[..., 0] == q[..., 1]).all(axis=(1, 2)) & (q[..., 1] == q[..., 2]).all(axis=(1, 2))
        if grey.all():
            return q[..., 0]
        return [q[i, ..., 0] if g else q[i] for i, g in enumerate(grey)]
    return q


def _digest(q: np.ndarray) -> str:
    h = hashlib.sha256(EXAMPLE_TAG)
    h.update(repr(tuple(q.shape)).encode())
    h.update(np.ascontiguousarray(q).tobytes())
    return h.hexdigest()[:EXAMPLE_HEX]


def example_digest(img: np.ndarray) -> str:
    """The identity of one example: SHA-256 (first :data:`EXAMPLE_HEX` hex digits) of its image in
    :func:`canonical` form and of that form's shape."""
    return _digest(canonical(img))


def example_digests(source, indices: Sequence[int] | None = None, chunk: int = CHUNK) -> list[str]:
    """:func:`example_digest` of the examples ``indices`` of ``source`` (None: all), decoded ``chunk`` at a time."""
    from ...data.base import quantised

    idx = np.arange(len(source)) if indices is None else np.asarray(indices, dtype=np.int64)
    out: list[str] = []
    for start in range(0, len(idx), chunk):
        imgs = source.images(idx[start : start + chunk])
        if len(imgs) > 1 and all(np.shape(im) == np.shape(imgs[0]) for im in imgs):
            out += [_digest(q) for q in _grey_if_equal(quantised(np.stack(imgs)))]  # one quantisation per chunk
        else:
            out += [example_digest(im) for im in imgs]
    return out


def data_identity(source) -> DataIdentity:
    """The identity of the data set behind ``source`` (an :class:`gsd_cli.data.ImageSource` or a spec;
    a :class:`DataIdentity` is returned as it is): the *whole* data set under any ``:train`` /
    ``:test`` part, subset or class list (a training on ``NAME:train`` and a DP ranking of ``NAME``
    charge one budget: the safe side), every example decoded once (module docstring). Computed once
    per source object."""
    from ... import data as gdata
    from ...data.identity import _leaf

    if isinstance(source, DataIdentity):
        return source
    if isinstance(source, str):
        source = gdata.resolve(source)
    leaf, _ = _leaf(source)
    kept = leaf.__dict__.get("_gsd_ledger_identity")
    if kept is not None:
        return kept
    keys = example_digests(leaf)
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
