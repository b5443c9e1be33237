"""Public data that a training run may not use, and private examples it leaves out.

A public set that *is* one of the private parts by its public inputs (the same name, or the same file
or folder read) is refused (:func:`refuse_shared_public`; for the advice's candidates, before any stage 1 is
trained on them, :func:`refuse_private_candidates`). Nothing that looks at the private examples
refuses: examples the two share, or the same examples under another path (a copy), would be a membership
oracle (the run stops if and only if a given image is, or is not, in the private set). Instead :func:`left_out` marks the private training examples whose file or content is among the
public examples the run uses, and the loop leaves them out of every Poisson subsample: Poisson sampling
of the set followed by a rule that looks at each example alone is Poisson sampling of the filtered set,
so the add/remove guarantee holds (:class:`gsd_cli.data.identity.PublicRows`).

A run whose *every* private training example is among the public examples (a byte copy of the private
set under another name, as GEP anchors or the second phase's public set) would run the mechanism on an
empty set and call a model trained on public data alone differentially private. It is refused
(:func:`refuse_nothing_left`), before any booking and any step; that refusal turns on the private
examples, so it is a private output (:class:`~gsd_cli.errors.PrivateError`: a ``private:`` line, and
its exit status).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import data as gdata
from ..errors import PrivateError
from .config import TrainConfig, public_count


def refuse_shared_public(cfg: TrainConfig, private: Sequence[gdata.ImageSource], catalog=None) -> gdata.Sample | None:
    """The public examples the method trains with (GEP's anchors, the second phase's public set;
    None for a method without public data), after refusing them (:class:`GSDError`) when they are
    one of the ``private`` parts by name or path (public inputs). Examples the two share, a copy
    included, are not refused (a refusal that turns on the private examples is a membership oracle):
    :func:`train` leaves those private examples out of the private training set, a per-example rule
    (:class:`gsd_cli.data.identity.PublicRows`)."""
    from ..ranking.pipeline import refuse_same_dataset

    refuse_private_base(getattr(cfg, "weights", None), private)
    if cfg.method not in ("gep", "second-phase") or not cfg.public:
        return None

    source = catalog.resolve(cfg.public) if catalog is not None else gdata.resolve(cfg.public)
    drawn = gdata.draw(source, public_count(cfg), cfg.seed)  # the examples the method will use (stage 1: its validation split too)
    what = "GEP anchor set" if cfg.method == "gep" else "second-phase public set"
    for part in private:
        refuse_same_dataset(part, [drawn], what=what)
    return drawn


def refuse_private_candidates(parts: Sequence, pubs: Sequence, *, dp: bool, examples: int = 2000, seed: int = 0) -> None:
    """Refuse (:class:`~gsd_cli.errors.GSDError`, one line) a candidate that is private data, before the advice trains
    anything on it, books anything or caches anything (issue 60): the feature probe and the DP feature probe train
    stage 1 of the second phase on each candidate *without noise*, and the DP probe's theorem
    (:mod:`gsd_cli.privacy.probe_mechanism`) holds only where those models are a function of public data.

    ``parts``: the private sources (training part first, then the test part); ``pubs``: the candidate sources. Every
    part is checked by its public inputs (:func:`gsd_cli.ranking.pipeline.refuse_same_dataset`: the same name, or the
    same file or folder read); a non-private advice (``dp`` False) also checks the training part by content, on the
    examples the ranking's first draw compares (``examples`` of each, drawn from ``seed``), as
    :func:`gsd_cli.ranking.rank` would after the probe. Under DP no private example is looked at (a refusal that
    turns on the private examples would be a membership oracle): a copy under another path is left out of the
    private data example by example where it is used (:class:`gsd_cli.data.identity.PublicRows`)."""
    from ..ranking.pipeline import refuse_private_as_public, refuse_same_dataset

    for part in parts:
        if part is not None:
            refuse_same_dataset(part, pubs)
    if not dp and pubs:
        train = parts[0]
        drawn = gdata.draw(train, examples, seed)
        refuse_private_as_public(train, drawn.indices, [gdata.draw(p, examples, seed) for p in pubs])


def refuse_private_base(weights, private: Sequence) -> None:
    """Refuse (:class:`~gsd_cli.errors.GSDError`, one line) a ``--weights`` base (``gsd pretrain``) that saw one of the
    ``private`` parts, by the public inputs its card records of each set: its identity (the name, aliases resolved,
    paths made absolute) and the path it read. Its weights, trained without noise, would carry those examples into the
    released model. Nothing else is read of the private data (as :func:`refuse_shared_public`); a base that is no
    gsd base, or whose card cannot be read (refused when it loads, :func:`gsd_cli.models.base.read_base`), passes."""
    import json

    from ..data.labelspace import LabelSpace
    from ..models.base import CARD, base_folder
    from ..ranking.pipeline import refuse_same_dataset

    folder = base_folder(weights) if weights else None
    if folder is None:
        return
    try:
        sets = json.loads((folder / CARD).read_text()).get("sets") or []
    except (OSError, ValueError, AttributeError):
        return
    for s in sets if isinstance(sets, list) else []:
        seen = LabelSpace(str(s.get("identity") or s.get("name")), 0, None, origin_path=s.get("origin"))
        for part in private:
            refuse_same_dataset(part, [seen], what=f"--weights {folder}: the base's public set")


def left_out(train_src, test_src, pub_sample, notes: list) -> np.ndarray | None:
    """The private training examples among the public examples the run uses (left out of every
    Poisson subsample: the mechanism runs on the filtered set), or None. How many, and how many test
    examples the public set holds (they would inflate the test metrics), are private notes: ``train``
    tells them as :class:`~gsd_cli.train.release.PrivateNote` once the run is booked, never on a public line."""
    if pub_sample is None:
        return None
    from ..data.identity import PublicRows

    rule = PublicRows(train_src, [pub_sample])
    if rule.empty:
        return None
    out = rule.mask(np.arange(len(train_src)))
    if out.any():
        notes.append(f"{int(out.sum())} private training example(s) are among the public examples of {pub_sample.source.name}: "
                     "left out of the private training (a per-example rule, so the guarantee holds for the rest)")
    n_test = int(PublicRows(test_src, [pub_sample]).mask(np.arange(len(test_src))).sum()) if len(test_src) else 0
    if n_test:
        notes.append(f"{n_test} private test example(s) are among the public examples of {pub_sample.source.name}: "
                     "the test metrics count them")
    return out if out.any() else None


def refuse_nothing_left(train_src, pub_sample, out: np.ndarray | None) -> None:
    """Refuse (:class:`~gsd_cli.errors.PrivateError`) a run whose private training examples are all among
    the public examples it uses (``out``, :func:`left_out`'s mask): nothing would be left to train on
    privately. Whether that happens depends on the private examples, so the CLI prints it on a
    ``private:`` line and its exit status is a private output too (docs/train.md)."""
    if out is None or len(out) == 0 or not bool(np.all(out)):
        return
    raise PrivateError(f"every private training example of {train_src.name} is among the public examples of "
                       f"{pub_sample.source.name}, so none is left to train on privately (the public set holds a copy of "
                       "the private data); use a public set that is not a copy of the private data. This refusal and its "
                       "exit status depend on the private data: keep them private")


def public_rows(cfg: TrainConfig, train_src, test_src, catalog, world) -> tuple:
    """``(public sample, left-out mask, private notes)`` of a training run: the public examples its method
    uses (:func:`refuse_shared_public`: refused when they are a private part by name or path), the private
    training examples they hold (:func:`left_out`, computed by process 0), and the notes saying how many
    (private: told after the booking). A run left with no private training example is refused here
    (:func:`refuse_nothing_left`), a private output, before any booking, stage 1 or step."""
    pub_sample = refuse_shared_public(cfg, (train_src, test_src), catalog)
    notes: list[str] = []
    out = world.from_main(lambda: left_out(train_src, test_src, pub_sample, notes))
    refuse_nothing_left(train_src, pub_sample, out)
    return pub_sample, out, notes
