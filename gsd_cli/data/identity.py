"""Does a public dataset share examples with the private one?

Public data is used without privacy: a public candidate, GEP anchor set or second-phase set that holds
private examples releases them (a candidate that *is* the private set even scores 0.0 and wins). So
:func:`shared_examples` looks for overlap three ways, cheapest first:

* by name: the same dataset (aliases resolved, ``fmnist`` = ``fashionmnist``; generic paths made
  absolute) unless the two are different parts of it (``mnist-a:train`` and ``mnist-a:test``);
* by path: the same files (``os.path.realpath``, so links and relative paths count), or the same
  official split of a torchvision set in the same folder;
* by content: each example's identity (:func:`gsd_cli.data.base.example_identity`: a digest of the
  decoded image in canonical form, the same notion of "the same example" as the privacy ledger's, so a
  re-encoded file, a 16-bit or palette PNG and a grey picture saved as RGB are the example they show),
  public examples against private ones: all of an in-memory set, else up to :data:`CONTENT_SAMPLE`
  drawn with a fixed seed (so a large file-backed set is checked on a sample, not exhaustively).

It answers "disjoint as far as can be told" (None) or a one-line reason. That is the check of a
non-private command (``gsd rank`` without ``--dp``). A DP release looks at public inputs only: the
names and the paths they read (:func:`same_dataset` with ``by_content=False``), and leaves shared
examples out one by one (:class:`PublicRows`); see the section "under DP" below.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from .base import ArraySource, ImageSource, example_identities
from .registry import _split_suffix, canonical, source_kinds

#: Examples of a file-backed set whose content is hashed when no indices are given.
CONTENT_SAMPLE = 2000
#: The fixed seed of that sample (public: it only decides which examples are compared).
CONTENT_SEED = 0x65D


def shared_examples(private: ImageSource, public: ImageSource, private_indices: Sequence[int] | None = None,
                    public_indices: Sequence[int] | None = None) -> str | None:
    """None if ``public`` and ``private`` share no example as far as can be told, else why they do.

    ``private_indices`` / ``public_indices`` name the examples compared by content (default: all of an
    in-memory set, else :data:`CONTENT_SAMPLE` drawn with a fixed seed); name and path checks cover
    the whole sets."""
    parts = _name_overlap(private.name, public.name)
    if parts == "same":
        return f"{public.name} is the private set {private.name} or contains it (same dataset by name)"
    reason = _path_overlap(private, public, different_parts=parts == "parts")
    if reason:
        return reason
    return _content_overlap(private, public, private_indices, public_indices)


# --- by name ----------------------------------------------------------------------------------------

def dataset_identity(name: str) -> tuple[str, str | None]:
    """``(base, split)`` of a dataset name: aliases resolved, generic paths made absolute (real)."""
    base, split = _split_suffix(name)
    kind, sep, arg = base.partition(":")
    if sep and kind in source_kinds() and arg:
        return f"{kind}:{os.path.realpath(os.path.expanduser(arg))}", split
    return canonical(base), split


def draw_key(name: str) -> str:
    """The name that keys a dataset's seeded draws (its examples, :func:`gsd_cli.data.draw`, and its random labels,
    :func:`gsd_cli.distance.side.sample_labels`): :func:`dataset_identity` with its split part, so that one dataset
    draws the same examples and labels however its path was typed (``npz:x.npz``, ``npz:./x.npz`` and
    ``npz:/abs/x.npz`` gave three different draws). A built-in name is its own key (an alias is its canonical
    name's), so the draws of the embedded sets, and ``gsd rank``'s default table, are unchanged."""
    base, split = dataset_identity(name)
    return base if split is None else f"{base}:{split}"


def _name_overlap(a: str, b: str) -> str | None:
    """'same' (one dataset, overlapping parts), 'parts' (two different parts of one dataset) or None."""
    (base_a, split_a), (base_b, split_b) = dataset_identity(a), dataset_identity(b)
    if base_a != base_b:
        return None
    return "parts" if split_a is not None and split_b is not None and split_a != split_b else "same"


# --- by path ----------------------------------------------------------------------------------------

def _leaf(source: ImageSource) -> tuple[ImageSource, np.ndarray | None]:
    """The source at the bottom of subsets and wrappers, and the indices into it (None: all)."""
    idx = None
    while hasattr(source, "parent"):
        if hasattr(source, "indices"):
            idx = source.indices if idx is None else source.indices[idx]
        source = source.parent
    return source, idx


def file_set(source: ImageSource) -> set[str] | None:
    """The real paths of every example's file, or None for a source that is not file-backed.

    Folders are resolved once each, files only where they are links, so a set of 100,000 files in a
    few folders costs one ``lstat`` per file."""
    if len(source) == 0 or source.example_file(0) is None:
        return None
    folders: dict[str, str] = {}
    out = set()
    for i in range(len(source)):
        file = os.path.abspath(os.path.expanduser(source.example_file(i)))
        if os.path.islink(file):
            out.add(os.path.realpath(file))
            continue
        folder, base = os.path.split(file)
        if folder not in folders:
            folders[folder] = os.path.realpath(folder)
        out.add(os.path.join(folders[folder], base))
    return out


def _torchvision_parts(source: ImageSource) -> set[tuple[str, str, str]] | None:
    """``{(real root, dataset class, split)}`` of a whole torchvision source (None: not one, or a subset)."""
    leaf, idx = _leaf(source)
    splits = getattr(leaf, "splits", None)
    if idx is not None or not splits or not getattr(leaf, "_parts", None):
        return None
    cls = type(leaf._parts[0]).__name__
    return {(os.path.realpath(leaf.root), cls, s) for s in splits}


def _path_overlap(private: ImageSource, public: ImageSource, different_parts: bool) -> str | None:
    files_priv, files_pub = file_set(private), file_set(public)
    if files_priv is not None and files_pub is not None:
        shared = len(files_priv & files_pub)
        if shared:
            return (f"{public.name} shares {shared} of {len(files_pub)} files with the private set {private.name} "
                    f"(same files on disk)")
        return None
    tv_priv, tv_pub = _torchvision_parts(private), _torchvision_parts(public)
    if tv_priv and tv_pub and tv_priv & tv_pub and not different_parts:
        root, cls, split = sorted(tv_priv & tv_pub)[0]
        return f"{public.name} and the private set {private.name} both hold {cls} {split} from {root} (same folder)"
    return None


# --- by content -------------------------------------------------------------------------------------

def _in_memory(source: ImageSource) -> bool:
    return isinstance(_leaf(source)[0], ArraySource)


def _checked(source: ImageSource, indices: Sequence[int] | None) -> np.ndarray:
    """The examples of ``source`` compared by content (see :func:`shared_examples`)."""
    if indices is not None:
        return np.asarray(indices, dtype=np.int64)
    n = len(source)
    if _in_memory(source) or n <= CONTENT_SAMPLE:
        return np.arange(n)
    return np.sort(np.random.default_rng(CONTENT_SEED).choice(n, CONTENT_SAMPLE, replace=False))


def _file_hash(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return "file-sha256:" + h.hexdigest()


def _hashes(source: ImageSource, idx: np.ndarray, files: bool = False) -> list[str]:
    """The examples' identities (:func:`gsd_cli.data.base.example_identity`); an in-memory set computes
    its identities once and keeps them. ``files``: hashes of the files' bytes instead (a cheap first
    test: the same bytes decode to the same example)."""
    if files:
        return [_file_hash(source.example_file(int(i))) for i in idx]
    leaf, sub = _leaf(source)
    ids = leaf_identities(leaf, whole=isinstance(leaf, ArraySource) or len(idx) >= len(leaf))
    if ids is not None:
        return [ids[int(i)] for i in (idx if sub is None else sub[idx])]
    return example_identities(source, idx)


def cached_identities(source: ImageSource, indices) -> list[str]:
    """:func:`gsd_cli.data.base.example_identity` of the examples ``indices`` of ``source``, each a function
    of that example alone, decoded once per source and kept (:func:`leaf_identities`)."""
    return _hashes(source, np.asarray(indices, dtype=np.int64))


def leaf_identities(leaf: ImageSource, whole: bool = True) -> list[str] | None:
    """The identity of every example of the source ``leaf`` (the bottom of subsets and wrappers), in
    its order, computed once and kept on it (the overlap checks and the privacy ledger share the one
    decoding pass); ``whole=False``: only when already computed (None otherwise)."""
    ids = leaf.__dict__.get("_gsd_identities")
    if ids is None and whole:
        ids = example_identities(leaf, None, chunk=4096 if isinstance(leaf, ArraySource) else 256)
        try:
            leaf.__dict__["_gsd_identities"] = ids
        except (AttributeError, TypeError):  # a source without a __dict__: computed again next time
            pass
    return ids


def _content_overlap(private: ImageSource, public: ImageSource, private_indices, public_indices) -> str | None:
    pub_idx = _checked(public, public_indices)
    priv_idx = _checked(private, private_indices)
    if not len(pub_idx) or not len(priv_idx):
        return None
    priv = set(_hashes(private, priv_idx))  # decoded: a re-encoded file is the example it shows
    shared = sum(h in priv for h in _hashes(public, pub_idx))
    if not shared:
        return None
    return (f"{public.name} shares {shared} of {len(pub_idx)} examples with the private set {private.name} "
            f"(same image content)")


# --- under DP: refuse by name and path only, drop shared examples per example ----------------------
#
# A refusal that depends on *which* private examples a public set shares is a membership oracle: put
# one private image in a public candidate, and the run stops if and only if the image is in the
# private set (P = 1 against 0: no epsilon covers it). Comparing the whole content is no better: a
# public set equal to the private set minus one target has the private set's content exactly when the
# target is not in it. So a DP release (gsd rank --dp, gsd train, --select-epsilon) refuses a public
# set only by its public inputs: the same name, or the same file or folder read (same_dataset with
# by_content=False; a usability check: such a public set would leave no private example to use), and
# handles shared examples, copies included, by a per-example rule decided before any secret draw: a
# private example whose file or content is among the public examples the run uses is left out of the
# private data (:class:`PublicRows`). Whether example x is left out depends on x and the
# public data alone, so the mechanism on the filtered set keeps its add/remove guarantee; how many
# were left out is a private fact, never printed in publishable output.


def same_dataset(private: ImageSource, public: ImageSource, by_content: bool = True) -> str | None:
    """Why ``public`` *is* ``private`` as a whole, else None: the same name (:func:`dataset_identity`), the
    same file or folder read (:func:`origin`), and with ``by_content`` also the same files or split on
    disk or the same multiset of example contents (e.g. a byte copy under another path).

    ``by_content=False`` is the check of a DP release: it looks at the public inputs only (the names
    and the paths they read, never a listing or an example of the private set), because a refusal
    that turns on the private examples is a membership oracle: a public set equal to the private set
    minus one target example has the same content as the private set exactly when the target is *not*
    in it (exit 2 against exit 0, an infinite privacy loss for that pair). Under DP a copy is harmless
    anyway: the per-example rule (:class:`PublicRows`) leaves every private example the public set
    holds out of the private data."""
    if _name_overlap(private.name, public.name) == "same":
        return f"{public.name} is the private set {private.name} (same dataset by name)"
    why = _same_origin(private, public)
    if why or not by_content:
        return why
    files_priv, files_pub = file_set(private), file_set(public)
    if files_priv is not None and files_pub is not None and files_priv == files_pub:
        return f"{public.name} is the private set {private.name} (the same files on disk)"
    tv_priv, tv_pub = _torchvision_parts(private), _torchvision_parts(public)
    if tv_priv and tv_pub and tv_priv == tv_pub:
        return f"{public.name} is the private set {private.name} (the same torchvision split in the same folder)"
    if len(private) == len(public) and len(private) > 0 and _same_sizes(private, public) and set_digest(private) == set_digest(public):
        return f"{public.name} holds exactly the examples of the private set {private.name} (same content: a copy)"
    return None


def origin(source: ImageSource) -> tuple[str, tuple[str, ...]] | None:
    """The file or folder ``source`` reads (its real path: ``npz:``, ``csv:``, ``folder:``, ``hf:``,
    however it is named) and the split parts taken of it, outermost first (``("train",)``), from the
    source's definition alone (the names and paths given; no example is looked at). None for a source
    with no such path (in memory, built-in)."""
    splits = []
    s = source
    while True:
        part = s.__dict__.get("origin_split")
        if part is not None:
            splits.append(str(part))
        if not hasattr(s, "parent"):
            break
        s = s.parent
    path = s.__dict__.get("origin_path")
    if path is None:
        return None
    return os.path.realpath(os.path.expanduser(str(path))), tuple(reversed(splits))


def _same_origin(private: ImageSource, public: ImageSource) -> str | None:
    """Why the two read the same file or folder with overlapping parts (one part holds the other, or
    the whole), else None; two different split parts of one file (``:train``, ``:test``) do not overlap."""
    a, b = origin(private), origin(public)
    if a is None or b is None or a[0] != b[0]:
        return None
    if any(x != y for x, y in zip(a[1], b[1])):  # different parts of one split
        return None
    return f"{public.name} is the private set {private.name} or holds it (it reads the same path {a[0]})"


def _same_sizes(a: ImageSource, b: ImageSource) -> bool:
    """A cheap first test for two file-backed sets (one stat per file): the same multiset of file
    sizes, else they cannot hold the same files' bytes and no file is read. True otherwise."""
    if a.example_file(0) is None or b.example_file(0) is None:
        return True
    try:
        sizes = [sorted(os.path.getsize(s.example_file(i)) for i in range(len(s))) for s in (a, b)]
    except OSError:  # a listed file that is missing: not a byte copy (the run reports the file itself)
        return False
    return sizes[0] == sizes[1]


def set_digest(source: ImageSource) -> str:
    """SHA-256 of the sorted content hashes of every example (order- and path-independent): two sets
    with the same digest hold the same examples. File-backed sets hash their files' bytes."""
    import hashlib

    idx = np.arange(len(source))
    file_backed = len(source) > 0 and source.example_file(0) is not None
    keys = sorted(_file_hash(source.example_file(int(i))) for i in idx) if file_backed else sorted(_hashes(source, idx))
    h = hashlib.sha256()
    for k in keys:
        h.update(k.encode())
    return h.hexdigest()


class PublicRows:
    """The per-example rule of a DP release: ``mask(indices)`` is True for each private example whose
    real file path, file bytes or identity (:func:`gsd_cli.data.base.example_identity`, the ledger's
    notion of the same example) is among the public examples used (``publics``: the
    :class:`~gsd_cli.data.Sample` drawn of each public source, with public randomness). Paths and
    bytes are cheap first tests; the examples they leave undecided are decoded and compared."""

    def __init__(self, private: ImageSource, publics) -> None:
        self.private = private
        self.file_backed = len(private) > 0 and private.example_file(0) is not None
        self.paths: set[str] = set()
        self.file_hashes: set[str] = set()
        self.contents: set[str] = set()
        for smp in publics:
            src, idx = smp.source, np.asarray(smp.indices, dtype=np.int64)
            if not len(idx):
                continue
            if src.example_file(int(idx[0])) is not None:
                for i in idx:
                    self.paths.add(os.path.realpath(os.path.expanduser(src.example_file(int(i)))))
                if self.file_backed:
                    self.file_hashes.update(_hashes(src, idx, files=True))
            self.contents.update(_hashes(src, idx))
        self.empty = not (self.paths or self.file_hashes or self.contents)

    def mask(self, indices) -> np.ndarray:
        """Boolean array: which of the private examples ``indices`` are among the public examples."""
        idx = np.asarray(indices, dtype=np.int64)
        out = np.zeros(len(idx), dtype=bool)
        if self.empty or not len(idx):
            return out
        if self.file_backed and (self.paths or self.file_hashes):
            for j, i in enumerate(idx):
                f = self.private.example_file(int(i))
                if os.path.realpath(os.path.expanduser(f)) in self.paths:
                    out[j] = True
            if self.file_hashes:
                rest = np.flatnonzero(~out)
                hs = _hashes(self.private, idx[rest], files=True)
                out[rest] = [h in self.file_hashes for h in hs]
        if self.contents:
            rest = np.flatnonzero(~out)
            hs = _hashes(self.private, idx[rest])
            out[rest] = [h in self.contents for h in hs]
        return out
