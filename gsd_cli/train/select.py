"""``gsd train --auto-select``: rank the candidates first, train with the closest."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ranking import Ranking, rank
from .splits import private_parts


def auto_select(private: str, candidates: Sequence[str], *, private_test: str | None = None, catalog=None, **rank_options) -> Ranking:
    """Rank ``candidates`` by GSD to the private *training* part (the test part is never looked at)
    with :func:`gsd_cli.ranking.rank` and its options (``dp=True, epsilon=...`` for the DP selection,
    :mod:`gsd_cli.distance.dpselect`, booked in the privacy ledger). The winner is ``ranking.results[0]``
    (under DP: the DP winner and its released DP energy distance; :func:`gsd_cli.distance.dpselect.released_winner`
    gives both with the noise scale of the score). ``catalog``
    (a :class:`gsd_cli.ranking.catalog.Catalog`) resolves the names it defines."""
    train_part, _ = private_parts(private, private_test, catalog)
    pubs = [catalog.resolve(c) for c in candidates] if catalog is not None else list(candidates)
    return rank(train_part, pubs, **rank_options)


def advised_selection(private: str, candidates: Sequence[str], method: str = "auto", *, private_test: str | None = None,
                      catalog=None, repeats: int | None = None, references: bool = True, train_settings=None,
                      probe_repeats: int | None = None, **rank_options):
    """``gsd train --auto-select``'s ranking and decision: ``(ranking, decision)``.

    The ranking (:func:`auto_select`) carries the in-run noise references
    (:func:`gsd_cli.train.advice.reference_sources`, at the ranking model's input shape, from the public
    ``seed``) and ``repeats`` draws (default :data:`gsd_cli.train.advice.REPEATS`; one under DP, where each
    fresh draw would spend the selection's epsilon again); :func:`gsd_cli.train.advice.advise` decides from it,
    the candidates' sizes and label counts, and the private task's declared class count. With
    ``train_settings`` (the run's :class:`gsd_cli.train.TrainConfig`: its model and stage-1 settings), a
    non-private selection for ``auto`` or ``second-phase`` also runs the feature probe
    (:func:`gsd_cli.train.probe.probe_second_phase`, ``probe_repeats`` draws, default
    :data:`gsd_cli.train.probe.REPEATS`), which then decides which candidate the second phase takes, or
    none (the decision's ``evidence["probe"]``). ``references=False``
    (``--no-fallback`` under DP, where the references would compete in the private selection): no
    references, no decision (``None``)."""
    from ..data import resolve
    from ..models.spec import resolve_model
    from ..ranking.reference import split_references
    from .advice import REFERENCE, REPEATS, advise, describe, is_reference, reference_sources

    if any(is_reference(getattr(c, "name", c)) for c in candidates):
        from ..errors import GSDError

        raise GSDError(f"{REFERENCE} is gsd's own in-run reference; name your candidates otherwise")
    dp = bool(rank_options.get("dp"))
    if repeats is None:
        repeats = 1 if dp else REPEATS
    train_part, _ = private_parts(private, private_test, catalog)
    pubs = [catalog.resolve(c) for c in candidates] if catalog is not None else [resolve(c) if isinstance(c, str) else c for c in candidates]
    spec = resolve_model(rank_options.get("model", "probe"))
    references = reference_sources(spec.input_size, spec.channels, int(rank_options.get("examples", 2000)),
                                   train_part.num_classes, int(rank_options.get("seed", 0)), draws=2 if dp else 1,
                                   shapes=_shapes(pubs) if dp else ()) if references else []  # under DP (one draw): more noise
    options = dict(rank_options)
    if repeats != 1:
        options["repeats"] = repeats
    ranking = rank(train_part, [*pubs, *references], **options)
    facts = {getattr(p, "name", str(p)): describe(p) for p in pubs}
    if not references:  # --no-fallback under DP: the winner among the candidates alone, no advice
        return ranking, None
    probe = None
    if train_settings is not None and not dp and method in ("auto", "second-phase") and not train_part.multilabel:
        from .probe import REPEATS as PROBE_REPEATS, probe_second_phase

        probe = probe_second_phase(train_part, pubs, train_settings, examples=int(rank_options.get("examples", 2000)),
                                   repeats=probe_repeats or PROBE_REPEATS, seed=int(rank_options.get("seed", 0)),
                                   device=rank_options.get("device"), progress=rank_options.get("progress"))
    decision = advise(ranking, method, candidates=facts, private_classes=int(train_part.num_classes), probe=probe)
    if probe is not None:
        decision.evidence["probe"] = probe.to_dict()
    return split_references(ranking), decision  # the table and the winner are the candidates'; the references apart


def _shapes(sources) -> list[tuple[int, int, int]]:
    """(height, width, channels) of each public candidate's first image (public data): noise of these
    shapes joins a private selection's references (:func:`gsd_cli.data.reference.reference_sources`)."""
    out = []
    for src in sources:
        if not hasattr(src, "images") or len(src) == 0:
            continue
        img = np.asarray(src.images([0])[0])
        shape = (int(img.shape[0]), int(img.shape[1]), 1 if img.ndim == 2 else int(img.shape[2]))
        if shape not in out:
            out.append(shape)
    return out
