"""Ranking public candidates by their distance to the private dataset (paper 004, Algorithm 1).

The package follows the data flow: :mod:`.config` (the settings, :class:`RankConfig`), then
:mod:`.pipeline` (one draw: datasets, model at w0, the private side once, every public side through
an executor of :mod:`.executors` and the caches, compare, sort), :mod:`.repeats` (R draws with error
bars) and :mod:`.results` (what comes back). The sides are computed by :mod:`gsd_cli.distance.side`, compared
by a distance of :mod:`gsd_cli.distance`.

>>> from gsd_cli.ranking import RankConfig, rank
>>> r = rank("mnist-a", ["mnist-b", "noise"], RankConfig.from_options(examples=200))   # doctest: +SKIP
>>> r = rank("mnist-a", ["mnist-b", "noise"], examples=200)                            # the 0.1 form  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .. import data as gdata
from ..distance import gradient_subspace_distance
from ..distance.side import Progress, Subspace, sample_labels, sample_subspace
from .config import GradientSettings, ModelSettings, PrivacySettings, RankConfig, check_settings, option_names
from .executors import Executor, LocalExecutor, PublicTask, executor_names, get_executor, register_executor
from . import ray_executor  # noqa: F401,E402  (registers "ray"; imports Ray only when that executor is built)
from .pipeline import rank_once, refuse_private_as_public
from .repeats import holm, paired_tie_test, rank_repeats, repeat_seed, summarise, t_interval, total_epsilon
from .results import DP_REPEATS, LEVEL, TIE_ALPHA, TIE_TEST, RankResult, Ranking, RepeatRanking, RepeatResult

__all__ = [
    "rank", "rank_once", "rank_repeats", "RankConfig", "ModelSettings", "GradientSettings", "PrivacySettings",
    "option_names", "Ranking", "RankResult", "RepeatRanking", "RepeatResult", "Subspace", "sample_labels",
    "sample_subspace", "refuse_private_as_public", "gradient_subspace_distance", "Executor", "LocalExecutor",
    "PublicTask", "register_executor", "get_executor", "executor_names", "repeat_seed", "t_interval",
    "paired_tie_test", "holm", "summarise", "total_epsilon", "DP_REPEATS", "LEVEL", "TIE_ALPHA", "TIE_TEST",
]


def rank(
    private: str | gdata.ImageSource = gdata.DEFAULT_PRIVATE,
    publics: Sequence[str | gdata.ImageSource] | Mapping = gdata.DEFAULT_PUBLIC,
    config: RankConfig | None = None,
    *,
    progress: Progress | None = None,
    memo: dict | None = None,
    cache=None,
    executor=None,
    public_seed: int | None = None,
    **options,
) -> Ranking:
    """Rank public candidates by their distance (GSD by default) to the private dataset, lowest first.

    ``config``: a :class:`RankConfig`, built whole by the CLI and catalogues; the flat keyword
    ``options`` of 0.1 (``k=16, examples=2000, seed=0, model="probe", params, labels, row_norm,
    device, chunk_size, engine, loss, dp, epsilon, clip, mechanism, dp_sketch, gibbs_sweeps,
    repeats, dp_repeats, gram, memory_budget, weights, peft, insecure_seed, classes, distance,
    subspace_method, batchnorm``) build one, or override a given one. ``model`` is a registry name,
    ``timm:NAME``, ``PATH.py:FACTORY``, an ``nn.Module`` (copied; its own weights are w0) or a factory
    ``f(num_classes=N)`` (:mod:`gsd_cli.models.spec`); ``batchnorm`` (``freeze``, ``groupnorm``,
    ``refuse``) keeps its per-sample gradients exact (:mod:`gsd_cli.models.exact`). The rest are how it runs, not what it computes: ``progress``
    (``progress(name, done, total)`` after every chunk), ``memo`` (a dict in which subspaces are kept
    and reused when the same settings recur), ``cache`` (a :class:`gsd_cli.ranking.cache.SubspaceCache`: the
    *public* subspaces on disk), ``executor`` (where public subspaces are computed: ``"local"``, the
    default, ``"ray"`` (one Ray task per candidate: :mod:`.ray_executor`), or a registered or given
    :class:`Executor`), ``public_seed`` (default ``seed``: seeds the
    public examples and labels alone).

    Every dataset contributes ``min(examples, size)`` examples drawn with ``seed``; the model's
    initial weights w0 come from ``seed`` too, and the private side is computed once. Returns a
    :class:`Ranking` (a sequence of :class:`RankResult`, best first; ``.to_dict()`` is the JSON).

    ``dp=True`` (DP-GSD, :mod:`gsd_cli.distance.dpgsd`): the private top-k subspace is drawn once by
    an ``epsilon``-DP mechanism (rows clipped to ``clip``) and every candidate is compared with that
    one sample, so ``epsilon`` is spent once. It is epsilon-DP under add/remove-one-example: the
    private examples, their random labels and the draw come from a secret generator, so two identical
    calls give different private subspaces; ``insecure_seed`` seeds them instead (experiments only:
    ``dp`` is then False). ``classes`` (a count or comma-separated names) declares the private set's
    classes where its source does not (npz, CSV): under DP they must not be read off the private
    labels. A public candidate that is the private set or shares examples with it is refused, DP or
    not. ``gram``: ``materialize`` stacks the m x p per-sample gradient matrix; ``ghost`` forms only
    m x m Gram matrices (:mod:`gsd_cli.ghost`), streamed within ``memory_budget`` bytes; ``auto``
    materialises when m x p float32 fits the budget. ``subspace_method``: how the top-k subspace of a
    materialised matrix is found (:func:`gsd_cli.subspace.top_k_subspace`): ``exact`` (float64 Gram +
    eigh), ``randomized`` (block Krylov certified in float64: distances within 2e-7 of exact, else the
    exact path) or ``auto`` (randomized from min(m, p) >= 1500 on); the DP draw never uses it.
    ``dp_sketch=D`` first projects every gradient
    matrix, private and public alike, by one data-independent Gaussian matrix to D dimensions;
    ``dp_sketch="public"`` (``"public+R"``; with ``dp``) projects the private rows onto the span of the
    public candidates' own top-k subspaces (:mod:`gsd_cli.subspace.public_basis`). ``distance="dp-energy"`` (with
    ``dp``): each candidate's noisy energy share instead of a subspace (:mod:`gsd_cli.distance.dpenergy`).
    ``weights`` and ``peft`` build the model exactly as ``gsd train`` does
    (:func:`gsd_cli.models.peft.build_model`), so the distance is computed on the parameters to be trained.

    ``repeats=R`` > 1: R independent repeats with means, intervals, win fractions and ties, by
    :func:`rank_repeats` (returns a :class:`RepeatRanking`; under DP, ``dp_repeats`` = ``shared``
    or ``fresh`` says what the repeats spend).

    ``private`` and each public may also be a map-style ``torch.utils.data.Dataset`` (wrapped by
    :func:`gsd_cli.data.torch_dataset.from_torch_dataset`, used as given), and ``publics`` a mapping
    ``{name: dataset or source}`` that names them.
    """
    from ..data.torch_dataset import as_sources

    private, publics = as_sources(private, publics)
    config = RankConfig.from_options(**options) if config is None else config.replace(**options)
    check_settings(config)  # k, examples, repeats, epsilon: before the ledger and any data
    if config.privacy.dp:  # before any work: the privacy ledger it books into is usable (exit 2 otherwise)
        from ..privacy.budget import ready_ledger

        ready_ledger()
    run = dict(progress=progress, memo=memo, cache=cache, executor=get_executor(executor))  # one executor for every draw
    if config.repeats != 1:
        return rank_repeats(private, publics, config, **run)
    return rank_once(private, publics, config, public_seed=public_seed, **run)
