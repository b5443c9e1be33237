"""Which public work the advice will need, done before any private run (issue 53): ``--auto-select --warm-cache``.

Most of what ``gsd train --auto-select`` costs is public: stage 1 of the second phase on each candidate (the feature
probe's draws; the DP feature probe's is the first of them) and the public sides of its GSD ranking (each
candidate's and each noise reference's subspace, in each draw). They are functions of public data and public
settings alone, and both are cached across runs (:mod:`gsd_cli.train.second_phase.stage1_cache`,
:class:`gsd_cli.ranking.cache.SubspaceCache`): a second run with the same candidates pays only the private part.
:func:`warm_advice` computes them ahead, through the same functions and under the same keys, for a private task that
only declares itself: its class count, class names and whether it is multi-label (the stage-1 head and the ranking
model's output layer depend on them), read by :func:`gsd_cli.data.labelspace.declared_label_space` from what declares
them (an npz's ``classes`` array and ``y``'s header, a folder's class folders, a CSV's header, ``--classes``). No
private example and no private label is read (the run checks ``--classes`` against the labels), nothing is booked in
the privacy ledger, and the cache stays public. Then the first advised run on a private set pays what a second run pays: built for a CI image
or a shared cache folder, where every job would otherwise pay the public part again.

It computes what the advice may read, not what it will: the advice probes every candidate the second phase can use,
then ranks only those whose features help, which it cannot know without the private data; so every usable
candidate's subspaces are computed (each candidate, for ``--method gep``, ``rgp``... where the advice ranks them all).
The DP selection on GSD (``--select-epsilon`` with a method the DP probe does not serve) draws its private side
under DP with its own public keys: only its stage 1, if any, is prepared.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Sequence


@dataclass
class WarmReport:
    """What :func:`warm_advice` did: stage-1 models trained and found in the cache, public subspaces computed and
    found, the candidates it prepared and why it left the others out (public facts: their sizes and classes)."""

    stage1_trained: int = 0
    stage1_cached: int = 0
    subspaces_computed: int = 0
    subspaces_cached: int = 0
    candidates: list = field(default_factory=list)
    left_out: dict = field(default_factory=dict)
    draws: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line for the console."""
        left = "".join(f"; left out {n}: {why}" for n, why in self.left_out.items())
        return (f"prepared {len(self.candidates)} candidate(s) ({', '.join(self.candidates) or 'none'}): stage 1 trained "
                f"{self.stage1_trained}, already cached {self.stage1_cached}; public subspaces computed {self.subspaces_computed}, "
                f"already cached {self.subspaces_cached}; {self.seconds:.1f}s{left}")


def declared_task(private, *, catalog=None, classes=None):
    """The private set as a label space (:class:`gsd_cli.data.labelspace.LabelSpace`: its class count, names, whether
    it is multi-label, and the name and path that identify it), read from what declares it and no example
    (:func:`gsd_cli.data.labelspace.declared_label_space`: an npz's ``classes`` and ``y``'s header, a folder's class
    folders, a CSV's header, ``--classes``); refused (one line) where its classes would be read off its labels."""
    from ..data.labelspace import declared_label_space

    return declared_label_space(private, catalog=catalog, classes=classes)


def warm_advice(config, private, candidates: Sequence, *, probe_repeats: int | None = None, rank_repeats: int | None = None,
                catalog=None, classes=None, cache=None, progress=None, dp: bool = False,
                **rank_options) -> WarmReport:
    """The public work of ``gsd train --auto-select`` with ``config`` (a :class:`gsd_cli.train.TrainConfig`: the
    method and the stage-1 settings) on ``candidates`` for the private task ``private`` declares (module docstring),
    into gsd's cache folder. ``probe_repeats`` (default :data:`gsd_cli.advice.probe.DRAWS`; 0: no probe) and
    ``rank_repeats`` (default :data:`gsd_cli.advice.decide.REPEATS`) as the advised run's; ``rank_options``: the
    ranking's (:func:`gsd_cli.ranking.rank`'s ``model``, ``k``, ``examples``, ``seed``, ``device``...), ``cache`` a
    :class:`gsd_cli.ranking.cache.SubspaceCache` (default: gsd's folder). ``dp`` (``--select-epsilon``): the private
    advice's public work, the DP feature probe's stage 1 (one draw, at ``seed``; it ranks nothing). Returns a
    :class:`WarmReport`."""
    from ..errors import GSDError
    from ..gradients import resolve_device
    from ..ranking.cache import SubspaceCache
    from ..ranking.config import RankConfig
    from ..ranking.pipeline import public_sides, refuse_same_dataset
    from ..ranking.repeats import repeat_seed, tagged
    from ..models.spec import resolve_model
    from .decide import REPEATS, describe, reference_sources, split_usable
    from .probe import DRAWS, draw_model, stage1_of
    from .select import candidate_sources

    t0 = time.perf_counter()
    task = declared_task(private, catalog=catalog, classes=classes)
    pubs = candidate_sources(candidates, catalog)
    refuse_same_dataset(task, pubs)  # by its public inputs: the private set as a candidate would put private subspaces in the cache
    n_classes = int(task.num_classes)
    facts = {src.name: describe(src) for src in pubs}
    usable, why_not = split_usable({src.name: src for src in pubs}, facts, n_classes)
    probing = config.method in ("auto", "second-phase") and not task.multilabel and (probe_repeats is None or probe_repeats > 0)
    if dp and not probing:
        raise GSDError("--warm-cache with --select-epsilon prepares the DP feature probe's stage 1 (--method auto or "
                       "second-phase, --probe-repeats above 0); the DP selection on GSD draws its sides under DP: "
                       "nothing public to prepare")
    gate = probing and config.method == "auto"  # the probe first, then only candidates it can find helpful are ranked
    ranked = [] if dp else list(usable.values()) if gate else list(pubs)
    report = WarmReport(candidates=sorted({s.name for s in ranked} | (set(usable) if probing else set())),
                        left_out=why_not if gate else {})
    seed = int(rank_options.get("seed", 0))
    if probing and usable:  # the feature probe's draws (the DP probe's stage 1 is the first)
        dev = resolve_device(rank_options.get("device"))
        draws = 1 if dp else DRAWS if probe_repeats is None else int(probe_repeats)
        for r in range(draws):
            spec, model0, names = draw_model(config, n_classes, seed + r, dev)
            for i, name in enumerate(usable):
                rec = stage1_of(model0, names, spec, config, name, usable, seed + r, task, dev)[1]
                report.stage1_cached += bool(rec["reused"])
                report.stage1_trained += not rec["reused"]
                if progress:
                    progress("stage 1", r * len(usable) + i + 1, draws * len(usable))
        report.draws["probe"] = draws
    options = {k: v for k, v in rank_options.items() if k not in ("cache", "progress", "memo", "executor")}
    spec = resolve_model(options.get("model", "probe"))
    refs = reference_sources(spec.input_size, spec.channels, int(options.get("examples", 2000)), n_classes, seed)
    cache = cache if cache is not None else SubspaceCache()
    repeats = 0 if dp else REPEATS if rank_repeats is None else int(rank_repeats)
    for r in range(repeats):  # draw r of the repeat ranking: its seed, the public examples and w0 it draws
        cfg = RankConfig.from_options(**{**options, "seed": repeat_seed(seed, r) if repeats > 1 else seed, "repeats": 1})
        computed = public_sides([*ranked, *refs], cfg, num_classes=n_classes, cache=cache, progress=tagged(progress, r, repeats))
        report.subspaces_computed += len(computed)
        report.subspaces_cached += len(ranked) + len(refs) - len(computed)
    report.draws["ranking"] = repeats
    report.seconds = round(time.perf_counter() - t0, 2)
    return report
