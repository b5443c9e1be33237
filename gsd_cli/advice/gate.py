"""Which candidates the probe-first gate ranks, and when a candidate's ranking draws stop.

The probe-first gate's ranking (``gsd train --auto-select``, :func:`gsd_cli.advice.select.advised_selection` with
``gate="helping"``): a helpful candidate's draws one at a time until its test against the noise references is decided,
and the ranking of no candidate."""

from __future__ import annotations


def draws_until_decided(rank, train_part, source, references: list, repeats: int, memo: dict, options: dict) -> dict | None:
    """Issue 53, "stop drawing repeats for a candidate whose test is already decided": ``source``'s draws of the
    ranking with the references (``rank``: :func:`gsd_cli.ranking.rank`), one at a time (draw r is repeat r of :func:`gsd_cli.ranking.rank`'s repeat ranking:
    the same seed, kept in ``memo``), until its test against the references is decided to fail
    (:func:`gsd_cli.ranking.reference.can_still_pass`: the margin to the closest reference, a difference of two GSDs
    in [0, 1], lies in [-1, 1]). Returns ``{"draws", "margins"}`` of a decided candidate (its remaining draws, and
    the private side's and references' for them, never computed), None when every draw was needed (then the repeat
    ranking tests it). Other metrics than GSD, or fewer than two repeats: None at once (nothing to stop)."""
    from ..ranking.reference import ALPHA, can_still_pass, is_reference
    from ..ranking.repeats import repeat_seed, tagged
    from ..timing import stage

    if repeats < 2 or options.get("distance", "gsd") != "gsd":
        return None
    margins: list[float] = []
    for r in range(repeats):
        with stage("rankings"):
            one = rank(train_part, [source, *references], memo=memo, **{**options, "repeats": 1,  # its lines tagged as the repeat ranking's
                                                                          "seed": repeat_seed(int(options.get("seed", 0)), r),
                                                                          "progress": tagged(options.get("progress"), r, repeats)})
        d = {row.public: float(row.distance) for row in one}
        margins.append(min(v for n, v in d.items() if is_reference(n)) - d[source.name])
        if r + 1 < repeats and not can_still_pass(margins, repeats, ALPHA, -1.0, 1.0):
            return {"draws": r + 1, "of": repeats, "margins": margins}
    return None


def unranked(train_part, options: dict, repeats: int):
    """The ranking of no candidate (``gate="helping"`` when the probe finds no help, or every helpful one stopped): the settings a ranking with
    ``options`` and ``repeats`` draws states (the public ones exactly as :func:`gsd_cli.ranking.rank` would), no rows."""
    from ..gradients import resolve_device
    from ..models.peft import build_model
    from ..models.spec import model_label
    from ..ranking.config import RankConfig
    from ..ranking.repeats import repeat_seed
    from ..ranking.results import TIE_TEST, RepeatRanking
    from ..subspace import uniform_baseline

    cfg = RankConfig.from_options(**{**{k: v for k, v in options.items() if k not in ("cache", "progress", "memo", "executor")},
                                     "repeats": repeats})
    m, g = cfg.model, cfg.gradients
    _, net, names, _ = build_model(m.model, int(train_part.num_classes), cfg.seed, weights=m.weights, peft=m.peft, params=m.params,
                                   batchnorm=m.batchnorm)
    num_params = sum(dict(net.named_parameters())[n].numel() for n in names)
    m_private = len(train_part) if g.examples is None else min(int(g.examples), len(train_part))
    return RepeatRanking(
        private=train_part.name, model=model_label(m.model), k=g.k, examples=g.examples if g.examples is not None else -1,
        seed=cfg.seed, labels=g.labels, row_norm=g.row_norm,
        params=None if m.params is None else ([m.params] if isinstance(m.params, str) else list(m.params)),
        num_params=num_params, device=str(resolve_device(g.device)), engine=g.engine, private_examples=m_private,
        uniform_baseline=uniform_baseline(g.k, num_params), sketch=None, weights=m.weights, peft=m.peft,
        subspace_method=g.subspace_method, seconds=0.0, repeats=int(repeats),
        repeat_seeds=[repeat_seed(cfg.seed, r) for r in range(int(repeats))], tie_test=TIE_TEST)
