"""One ranking, one draw: resolve the datasets, build the model at w0, compute the private side once
and every public side (through an executor and the caches), compare, sort.

For one model at initial weights w0 (a function of ``seed``), the private sample's representation
is computed once by the ranking's distance (:mod:`gsd_cli.distance`: GSD, DP-GSD...) and compared
with each public candidate's; candidates are ranked by distance, lowest (closest) first.

Randomness. Public draws (w0, the public examples and their random labels, the sketch) come from
``seed``, which every output prints. A non-private distance draws the private examples and labels
from ``seed`` as well: it claims no privacy, and stays reproducible. A private one (DP-GSD) redraws
them with secret randomness (:meth:`gsd_cli.distance.Distance.private_rows`).
"""

from __future__ import annotations

import time
from typing import Sequence

from .. import data as gdata
from .cache import public_cache_key
from ..distance import SideContext, make_distance
from ..errors import GSDError
from ..gradients import resolve_device
from ..subspace.public_basis import resolve_dp_sketch
from ..distance.side import LABELS, ROW_NORMS, Progress
from ..subspace import check_method, uniform_baseline
from .config import RankConfig, check_k
from .executors import PublicSide, PublicTask, public_subspaces, recall, remember
from .results import RankResult, Ranking


def refuse_private_as_public(private: gdata.ImageSource, private_indices, publics: Sequence[gdata.Sample],
                             what: str = "public candidate") -> None:
    """Raise :class:`GSDError` when a public set is the private set or shares examples with it (by
    name, path, or the content of the examples drawn; ``private_indices``: the private examples
    drawn, ``None`` for a sample of them): as a candidate its subspace would be the private data's,
    computed without privacy, and it would win with no word; as training data it would be used with
    no noise at all."""
    from ..data.identity import same_dataset, shared_examples

    for smp in publics:
        why = same_dataset(private, smp.source) or shared_examples(private, smp.source, private_indices, smp.indices)
        if why:
            raise GSDError(f"{what} {smp.source.name} is private data: {why}; public data must not hold private examples")


def refuse_same_dataset(private: gdata.ImageSource, publics: Sequence, what: str = "public candidate") -> None:
    """Raise :class:`GSDError` when a public set *is* the private set by its public inputs: the same
    name, or the same file or folder read (:func:`gsd_cli.data.identity.same_dataset` with
    ``by_content=False``). The check of a DP release: it looks at no private example, neither which
    examples the two share nor whether they hold the same ones (either would be a membership oracle:
    a public set equal to the private set minus one target holds the same examples exactly when the
    target is absent); the per-example rule leaves a copy's examples out of the private data."""
    from ..data.identity import same_dataset

    for smp in publics:  # samples, or sources (gsd_cli.advice.warm: no sample drawn yet)
        src = getattr(smp, "source", smp)
        why = same_dataset(private, src, by_content=False)
        if why:
            raise GSDError(f"{what} {src.name} is private data: {why}; public data must not be the private set")


def _check(config: RankConfig, publics) -> None:
    g = config.gradients
    check_k(g.k)
    if g.row_norm not in ROW_NORMS:
        raise GSDError(f"--row-norm must be one of {', '.join(ROW_NORMS)} (got {g.row_norm!r})")
    if g.labels not in LABELS:
        raise GSDError(f"--labels must be one of {', '.join(LABELS)} (got {g.labels!r})")
    check_method(g.subspace_method)
    if not publics:
        raise GSDError("give at least one public candidate (--public NAME ...)")


def _check_fits(k: int, samples) -> None:
    """Refuse a k larger than a sample's examples (one line saying what to do)."""
    for smp in samples:
        if k > len(smp):
            raise GSDError(f"k={k} is larger than the {len(smp)} examples of {smp.source.name}; use --k <= {len(smp)}")


def _memo_key(source: gdata.ImageSource) -> tuple:
    return (id(source), source.name)


def _draw_setup(config: RankConfig, num_classes: int, dev, distance, pub_samples: list, pseed: int, cache, progress):
    """What every side of one draw is computed with: the model at w0 (from ``config.seed``) on the device, the sides'
    context, the memo key of its settings and one task per public sample (cached under
    :func:`gsd_cli.ranking.cache.public_cache_key`). Returns ``(num_params, sketch, ctx, key, tasks)``."""
    from ..models.spec import model_label
    from ..models.peft import build_model

    m, g, seed = config.model, config.gradients, config.seed
    spec, net, names, _ = build_model(m.model, num_classes, seed, weights=m.weights, peft=m.peft, params=m.params, batchnorm=m.batchnorm)
    net = net.to(dev)  # every side runs on the device (a baseline's features too, not only the gradients)
    num_params = sum(dict(net.named_parameters())[n].numel() for n in names)
    if g.k > num_params:
        raise GSDError(f"k={g.k} is larger than the {num_params} selected parameters; use a smaller --k")
    sketch = resolve_dp_sketch(g.dp_sketch, g.k, distance.private)  # None, a Gaussian D, or public[+R] (gsd_cli.subspace.public_basis)
    gauss = sketch if isinstance(sketch, int) else None
    ctx = SideContext(net, dims=gauss or num_params, common=dict(
        sketch_dim=gauss, k=g.k, input_size=spec.input_size, channels=spec.channels, num_classes=num_classes,
        names=names, labels=g.labels, row_norm=g.row_norm, seed=seed, loss=g.loss, engine=g.engine, device=dev,
        chunk_size=g.chunk_size, progress=progress, gram=g.gram, memory_budget=g.memory_budget,
        subspace_method=g.subspace_method,
    ))
    # everything a subspace depends on beyond its sample (sources are keyed by identity, kept alive in the memo)
    key = (model_label(m.model), m.batchnorm, m.weights, m.peft, tuple(names), num_classes, g.k, g.labels, g.row_norm, g.dp_sketch, g.loss,
           str(dev), g.examples, seed, g.gram, g.subspace_method)
    tasks = [PublicTask(smp, pseed, key + (_memo_key(smp.source), pseed) + distance.public_key(),
                        lambda smp=smp: public_cache_key(cache, net, smp, {**ctx.common, "seed": pseed}))
             for smp in pub_samples]
    return num_params, sketch, ctx, key, tasks


def public_sides(publics: Sequence, config: RankConfig, *, num_classes: int, cache, progress: Progress | None = None) -> list[str]:
    """One draw's public subspaces alone (``config.seed``; GSD), into the disk ``cache``
    (:class:`gsd_cli.ranking.cache.SubspaceCache`), exactly as :func:`rank_once` computes and keys them for a private
    set of ``num_classes`` classes, without one: what ``gsd train --auto-select --warm-cache`` prepares
    (:mod:`gsd_cli.advice.warm`). Returns the names of those computed (the others were in the cache)."""
    _check(config, publics)
    if config.distance_name != "gsd":
        raise GSDError(f"only GSD's public subspaces are cached (--metric {config.distance_name})")
    g = config.gradients
    distance = make_distance(config.distance_name, config)
    pub_samples = [gdata.draw(gdata.resolve(p), g.examples, config.seed) for p in publics]
    _check_fits(g.k, pub_samples)
    _, _, ctx, _, tasks = _draw_setup(config, int(num_classes), resolve_device(g.device), distance, pub_samples, config.seed,
                                      cache, progress)
    side, computed = PublicSide(distance, ctx), []

    def compute(task):
        computed.append(task.name)
        return side(task)

    public_subspaces(tasks, compute, cache=cache, consume=lambda i, sub: None)  # kept on disk, not here
    return computed


def rank_once(private, publics: Sequence, config: RankConfig, *, public_seed: int | None = None,
              progress: Progress | None = None, memo: dict | None = None, cache=None, executor=None) -> Ranking:
    """One draw of a ranking (``config.repeats`` is not looked at): see :func:`gsd_cli.ranking.rank`."""
    from ..models.spec import model_label, resolve_model

    t0 = time.perf_counter()
    _check(config, publics)
    m, g, seed = config.model, config.gradients, config.seed
    resolve_model(m.model)  # a bad --model fails before any data is read
    dev = resolve_device(g.device)
    priv_source = gdata.resolve(private)
    if m.classes is not None:
        priv_source = gdata.with_classes(priv_source, m.classes)
    distance = make_distance(config.distance_name, config)
    if distance.private:
        gdata.require_declared_classes(priv_source)  # the model's shape must not be read off the private labels
    pub_sources = [gdata.resolve(p) for p in publics]
    names_seen = [s.name for s in pub_sources]
    dup = {n for n in names_seen if names_seen.count(n) > 1}
    if dup:
        raise GSDError(f"public candidate(s) {', '.join(sorted(dup))} given twice; name each once")
    pseed = seed if public_seed is None else public_seed
    pub_samples = [gdata.draw(s, g.examples, pseed) for s in pub_sources]
    if distance.private:
        # Under DP: refuse a candidate only when it is the private set as a whole; shared examples are
        # left out of the private rows by a per-example rule before the secret draw (no count, no
        # refusal that turns on one example: gsd_cli.data.identity)
        refuse_same_dataset(priv_source, pub_samples)
        priv_sample = distance.private_rows(gdata.draw(priv_source, g.examples, seed), pub_samples)
    else:
        priv_sample = distance.private_rows(gdata.draw(priv_source, g.examples, seed))
        refuse_private_as_public(priv_source, priv_sample.indices, pub_samples)
    # under DP the private side is checked against the requested m (min(m, N) would reveal N)
    _check_fits(g.k, pub_samples if distance.private else [priv_sample, *pub_samples])
    if distance.private and g.k > int(g.examples):
        raise GSDError(f"k={g.k} is larger than -m {g.examples}; use --k <= {g.examples}")
    num_classes = priv_source.num_classes
    if num_classes < 1:
        raise GSDError(f"{priv_source.name} has no classes; it needs labelled examples")
    if num_classes < 2 and not priv_source.multilabel:  # one logit: cross-entropy's gradients are all zero
        raise GSDError(f"{priv_source.name} has one class: a one-class model has no gradients to compare; "
                       f"give a private set with at least 2 classes (or --classes N)")
    num_params, sketch, ctx, key, tasks = _draw_setup(config, num_classes, dev, distance, pub_samples, pseed, cache, progress)
    pkey = key + (_memo_key(priv_source), seed, distance.memo_key())
    subs = None
    priv = recall(memo, pkey)
    if priv is None:
        if distance.private:  # a new DP draw: booked in the privacy ledger first, refused past the budget (gsd_cli.privacy.budget)
            from ..privacy.budget import book_ranking

            book_ranking(priv_source, config.privacy, distance=config.distance_name)
        pre = None
        if getattr(distance, "needs_public_sides", False):  # --dp-sketch public: the basis is built from the public sides first
            pre = {} if memo is None else dict(memo)  # a copy: the private side stays the memo's first new entry (rank_repeats keeps it)
            subs = public_subspaces(tasks, PublicSide(distance, ctx), executor=executor, memo=pre, cache=cache)
            distance.use_public_sides(ctx, [subs[i] for i in range(len(tasks))])
        priv = remember(memo, pkey, priv_source, distance.private_side(ctx, priv_sample))
        for k_, v_ in (pre or {}).items() if memo is not None else ():
            memo.setdefault(k_, v_)
    ctx.dims = getattr(priv, "dims", None) or ctx.dims  # the public basis's D, also for a shared draw recalled from the memo
    if g.engine == "auto" and priv.engine != "ghost" and not distance.private:  # chosen once on the private sample; the same engine for every candidate (under DP the private side takes vmap: DPGSD.private_side)
        ctx.common["engine"] = priv.engine
    def compared(i, pub):  # each public side compared as it arrives, then dropped (executors.public_subspaces)
        d, angles = distance.compare(priv, pub)
        return RankResult(public=pub_samples[i].source.name, distance=d, rank=0, examples=pub.examples,
                          principal_angles_deg=angles, seconds=round(pub.seconds, 3))

    if subs is None:
        results = public_subspaces(tasks, PublicSide(distance, ctx), executor=executor, memo=memo,
                                   cache=cache if distance.disk_cache else None, consume=compared)  # a baseline's sides are no subspaces
    else:
        results = {i: compared(i, sub) for i, sub in subs.items()}
    subs = None
    # by distance; a DP selection keeps the chosen candidates in the order chosen, nothing released about the rest
    rows, not_selected = distance.arrange(priv, [results[i] for i in range(len(pub_samples))])
    for i, r in enumerate(rows, 1):
        r.rank = i
        r.winner = i == 1
    privacy, notes, dp = distance.report(ctx, rows)
    return Ranking(
        privacy=privacy, warnings=notes, dp=dp, metric=distance.name,
        private=priv_source.name, model=model_label(m.model), k=g.k, examples=g.examples if g.examples is not None else -1,
        seed=seed, labels=g.labels, row_norm=g.row_norm,
        params=None if m.params is None else ([m.params] if isinstance(m.params, str) else list(m.params)),
        num_params=num_params, device=str(dev), engine=priv.engine,
        # under DP the requested m: min(m, N) would reveal N
        private_examples=int(g.examples) if distance.private else priv.examples,
        uniform_baseline=uniform_baseline(g.k, ctx.dims), results=rows, not_selected=not_selected, sketch=sketch, weights=m.weights, peft=m.peft,
        # under DP the run's time grows with min(m, N): withheld (None), as the private set's size
        seconds=None if distance.private else round(time.perf_counter() - t0, 3), subspace_method=g.subspace_method,
    )
