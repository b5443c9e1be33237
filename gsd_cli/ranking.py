"""GSD between datasets and the ranking of public candidates (paper 004, Algorithm 1).

For one model at initial weights w0 (a function of ``seed``), the private sample's top-k gradient
subspace is computed once and compared with each public candidate's; candidates are ranked by
distance, lowest (closest to the private task) first.

Randomness. Public draws (w0, the public examples and their random labels, the sketch) come from
``seed``, which every output prints. A non-private ranking (``dp=False``) draws its private examples
and labels from ``seed`` as well: it claims no privacy, and stays reproducible. Under DP-GSD the
private examples, their random labels and the mechanism's draw come from the operating system
(:func:`gsd_cli.privacy.randomness.private_rng`), never from ``seed``, and nothing in the output can
reproduce them; ``insecure_seed`` opts back into a reproducible draw and marks the output not DP.

Neighbouring relation: **add or remove one example** of the private dataset, the relation of the
trainers' accountant, so that a DP selection and a DP training compose (their epsilons add).
Claim: DP-GSD with budget epsilon is epsilon-DP under it. Proof. Let D' = D + {x}, |D| = N, and let
m be the number of rows requested. The rows are a uniformly random m-subset of the dataset, drawn
with secret randomness, each row with its own label drawn independently (uniform in the model's
label space, or the example's own), so a row is an (example, label) pair whose label depends on no
other row. (i) N >= m: couple the draws. Given x is not drawn from D', the draw is a uniform
m-subset of D; given x is drawn, removing x and adding a uniform element y of D not yet drawn gives
a uniform m-subset S of D. So P_D'(O) = (1 - a) P_D(O) + a E[M(S - y + x)(O)] with a = m / (N + 1),
where S - y + x differs from S in one row. The mechanism M is epsilon-DP on its m rows under one row
replaced (score sensitivity C^2, :mod:`gsd_cli.dppca`), so M(S - y + x)(O) is within e^{+-epsilon} of
M(S)(O) for every (S, y), hence P_D'(O) within e^{+-epsilon} of P_D(O). (ii) N < m: every example is a
row and D' adds one row, which changes the score by (g . v)^2 in [0, C^2]: within the sensitivity,
so epsilon-DP directly. The model w0, the sketch and the public side do not depend on D; the
distances and the ranking are post-processing. The number of rows m = min(m, N) would reveal N when
N < m, so a DP ranking prints the requested m, never N, and every data-independent utility figure
uses the requested m. Position-assigned labels or a public-seed draw (as before 0.3) break (i):
adding one example would re-draw other rows and labels.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np
import torch
import torch.nn as nn

from . import data as gdata
from .cache import public_subspace
from .errors import GSDError, ModelError
from .gradients import LossFn, default_chunk_size, gradient_matrix, resolve_device
from .privacy.randomness import INSECURE_NOTE, check_insecure_seed, private_rng, randomness_statement
from .subspace import principal_angles, projection_metric, top_k_subspace, uniform_baseline

LABELS = ("random", "own")
ROW_NORMS = ("unit", "none")

#: ``progress(dataset_name, examples_done, examples_total)``, called after every chunk.
Progress = Callable[[str, int, int], None]


@dataclass
class Subspace:
    """Top-k gradient subspace of one sample: basis ``V`` (p x k, float64) and singular values ``s``."""

    name: str
    V: torch.Tensor
    s: torch.Tensor
    examples: int
    seconds: float
    engine: str = ""


@dataclass
class RankResult:
    """One public candidate's row of a ranking (what the JSON ``results`` list holds)."""

    public: str
    distance: float
    rank: int
    examples: int
    principal_angles_deg: list[float]
    seconds: float
    winner: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Ranking:
    """A ranking: a sequence of :class:`RankResult` (best first) plus the settings that produced it."""

    private: str
    model: str
    k: int
    examples: int
    seed: int
    labels: str
    row_norm: str
    params: list[str] | None
    num_params: int
    device: str
    engine: str
    private_examples: int
    uniform_baseline: float
    results: list[RankResult] = field(default_factory=list)
    seconds: float = 0.0
    privacy: dict | None = None
    warnings: list[str] = field(default_factory=list)
    sketch: int | None = None
    weights: str | None = None  # --weights (pre-trained backbone), when given
    peft: str | None = None  # --peft (the trainable set), when given
    dp: bool = False  # whether this output is differentially private (DP-GSD with secret randomness)

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Iterator[RankResult]:
        return iter(self.results)

    def __getitem__(self, i: int) -> RankResult:
        return self.results[i]

    @property
    def winner(self) -> RankResult:
        return self.results[0]

    def to_dict(self) -> dict:
        """The JSON document: settings, then ``results`` sorted by rank. Fields are only ever added."""
        d = {k: v for k, v in asdict(self).items() if k != "results"}
        d["results"] = [r.to_dict() for r in self.results]
        return d


def _label_seed(seed: int, name: str) -> list[int]:
    return [seed, zlib.crc32(name.encode()), 1]


def sample_labels(sample: gdata.Sample, labels: str, num_classes: int, seed: int,
                  rng: np.random.Generator | None = None) -> torch.Tensor:
    """Labels for the gradients: uniformly random in the model's label space (the authors' choice,
    i.i.d. per row, seeded by ``seed`` and the dataset name, or drawn from ``rng``: the private side
    of DP-GSD passes a secret generator), or the dataset's own."""
    if labels not in LABELS:
        raise GSDError(f"--labels must be one of {', '.join(LABELS)} (got {labels!r})")
    if labels == "random":
        rng = rng if rng is not None else np.random.default_rng(_label_seed(seed, sample.source.name))
        return torch.from_numpy(rng.integers(0, num_classes, size=len(sample)))
    y = sample.labels()
    if sample.source.multilabel:
        if y.shape[1] != num_classes:
            raise GSDError(
                f"{sample.source.name} has {y.shape[1]} labels per example but the model has {num_classes} outputs; use --labels random"
            )
        return torch.from_numpy(y.astype(np.float32))
    if len(y) and int(y.max()) >= num_classes:
        raise GSDError(
            f"{sample.source.name} has labels up to {int(y.max())} but the model has {num_classes} classes "
            f"(set by the private dataset); use --labels random"
        )
    return torch.from_numpy(y.astype(np.int64))


def sample_subspace(
    model: nn.Module,
    sample: gdata.Sample,
    *,
    k: int,
    input_size: int,
    channels: int,
    num_classes: int,
    names: Sequence[str],
    labels: str = "random",
    row_norm: str = "unit",
    seed: int = 0,
    loss: LossFn | None = None,
    engine: str = "auto",
    device: str | torch.device = "auto",
    chunk_size: int | None = None,
    progress: Progress | None = None,
    dp: dict | None = None,
    sketch_dim: int | None = None,
    label_seed: int | None = None,
    gram: str = "materialize",
    memory_budget: int | str | None = None,
) -> Subspace:
    """Per-sample gradients of ``sample`` at the model's weights, then their top-k subspace.

    With ``dp = {"epsilon", "clip", "mechanism", "rng"}`` the subspace is drawn by the epsilon-DP
    mechanism of :func:`gsd_cli.dppca.private_top_k_subspace` instead, with the private generator
    ``rng`` for the random labels and the draw (``s`` is then empty: the private singular values are
    never released). ``label_seed`` (default ``seed``) seeds the random labels alone otherwise;
    ``seed`` also seeds the sketch (public)."""
    t0 = time.perf_counter()
    dev = resolve_device(device)
    if k > len(sample):
        raise GSDError(f"k={k} is larger than the {len(sample)} examples of {sample.source.name}; use --k <= {len(sample)}")
    y = sample_labels(sample, labels, num_classes, seed if label_seed is None else label_seed,
                      rng=None if dp is None else dp["rng"])
    p = sum(dict(model.named_parameters())[n].numel() for n in names)
    cs = chunk_size if chunk_size is not None else default_chunk_size(dev, p)
    if cs < 1:
        raise GSDError(f"--chunk-size must be at least 1 (got {cs})")
    done = 0

    def batches():
        for start, x in sample.batches(input_size, channels, cs, dev):
            yield x, y[start : start + x.shape[0]]

    def on_chunk(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(sample.source.name, done, len(sample))

    info: dict = {}
    if gram != "materialize":
        from .ghost import choose_gram, ghost_subspace

        if choose_gram(gram, len(sample), p, memory_budget, sketch_dim) == "ghost":
            bs = lambda c: ((x, y[s : s + x.shape[0]]) for s, x in sample.batches(input_size, channels, c, dev))  # noqa: E731
            prog = None if progress is None else (lambda d, t: progress(sample.source.name, d, t))
            V, s = ghost_subspace(model, bs, len(sample), names, k, loss=loss, device=dev, row_norm=row_norm,
                                  memory_budget=memory_budget, chunk_size=chunk_size, progress=prog, dp=dp)
            return Subspace(sample.source.name, V, s, len(sample), time.perf_counter() - t0, "ghost")
    G = gradient_matrix(model, batches(), len(sample), names, loss, engine, dev, row_norm, on_chunk, info)
    if sketch_dim:
        from .dppca import sketch

        G = sketch(G, sketch_dim, seed)
    if dp is None:
        V, s = top_k_subspace(G, k)
    else:
        from .dppca import private_top_k_subspace

        V = private_top_k_subspace(G, k, dp["epsilon"], dp["clip"], dp["mechanism"], dp["rng"], dp.get("sweeps", 10))
        s = torch.empty(0, dtype=torch.float64)
    del G
    return Subspace(sample.source.name, V, s, len(sample), time.perf_counter() - t0, info["engine"])


def _as_xy(batch, num_classes: int, seed: int, salt: int) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        gen = torch.Generator().manual_seed(seed * 1_000_003 + salt)
        return batch, torch.randint(0, num_classes, (batch.shape[0],), generator=gen)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return batch[0], batch[1]
    raise GSDError("give examples as a tensor x (random labels) or a pair (x, y)")


def gradient_subspace_distance(
    model: nn.Module,
    private,
    public,
    k: int = 16,
    *,
    params: Sequence[str] | str | None = None,
    row_norm: str = "unit",
    loss: LossFn | None = None,
    chunk_size: int | None = None,
    engine: str = "auto",
    device: str | torch.device = "auto",
    seed: int = 0,
) -> float:
    """GSD (paper 004, Algorithm 1) between two batches at the model's current weights.

    ``private`` and ``public`` are input tensors (each example gets a uniformly random label in the
    model's label space, drawn from ``seed``, as the authors do) or ``(x, y)`` pairs. Returns the
    normalised projection metric in [0, 1] between the top-k right singular subspaces of the two
    per-sample gradient matrices.
    """
    from .gradients import per_sample_gradients

    if row_norm not in ROW_NORMS:
        raise GSDError(f"--row-norm must be one of {', '.join(ROW_NORMS)} (got {row_norm!r})")
    dev = resolve_device(device)
    first = private if isinstance(private, torch.Tensor) else private[0]
    with torch.no_grad():
        num_classes = model.to(dev)(first[:1].to(dev)).shape[-1]
    bases = []
    for salt, batch in enumerate((private, public)):
        x, y = _as_xy(batch, num_classes, seed, salt)
        G = per_sample_gradients(model, x, y, loss, params, chunk_size, engine=engine, device=dev, row_norm=row_norm)
        bases.append(top_k_subspace(G, k)[0])
        del G
    return projection_metric(*bases)


def rank(
    private: str | gdata.ImageSource = gdata.DEFAULT_PRIVATE,
    publics: Sequence[str | gdata.ImageSource] = gdata.DEFAULT_PUBLIC,
    *,
    k: int = 16,
    examples: int | None = 2000,
    seed: int = 0,
    model: str = "probe",
    params: Sequence[str] | str | None = None,
    labels: str = "random",
    row_norm: str = "unit",
    device: str = "auto",
    chunk_size: int | None = None,
    engine: str = "auto",
    loss: LossFn | None = None,
    progress: Progress | None = None,
    dp: bool = False,
    epsilon: float | None = None,
    clip: float = 1.0,
    mechanism: str = "sequential",
    dp_sketch: int | None = None,
    gibbs_sweeps: int = 10,
    repeats: int = 1,
    dp_repeats: str = "shared",
    public_seed: int | None = None,
    memo: dict | None = None,
    cache=None,
    gram: str = "auto",
    memory_budget: int | str | None = None,
    weights: str | None = None,
    peft: str | None = None,
    insecure_seed: int | None = None,
    classes: int | str | None = None,
) -> Ranking:
    """Rank public candidates by their GSD to the private dataset, lowest first.

    ``dp=True`` (DP-GSD): the private top-k subspace is drawn once by an ``epsilon``-DP mechanism
    (rows clipped to ``clip``; see :mod:`gsd_cli.dppca`) and every candidate is compared with that
    one sample: the public side and the distances are post-processing, so ``epsilon`` is spent once.
    It is epsilon-DP under add/remove-one-example (module docstring): the private examples, their
    random labels and the draw come from a secret generator, so two identical calls give different
    private subspaces; ``insecure_seed`` seeds them instead (experiments only: ``dp`` is then False).
    A public candidate that is the private set or shares examples with it is refused, DP or not.
    ``classes`` (a count or comma-separated names) declares the private set's classes where its
    source does not (npz, CSV): under DP they must not be read off the private labels.
    The ranking's ``privacy`` field states what was spent, ``warnings`` when the sample is too noisy
    to say anything (judged from data-independent quantities only). ``gram``: ``materialize`` stacks
    the m x p per-sample gradient matrix; ``ghost`` forms only m x m Gram matrices from layer inputs and
    output gradients (:mod:`gsd_cli.ghost`), streamed within ``memory_budget`` bytes (e.g. ``"4G"``);
    ``auto`` materialises when m x p float32 fits the budget. ``dp_sketch=D`` first projects
    every gradient matrix, private and public alike, by one data-independent Gaussian matrix to D
    dimensions (clipping after it), so that a small budget can still say something.

    Every dataset contributes ``min(examples, size)`` examples drawn with ``seed`` (the private ones
    under DP: secretly); the model's initial weights w0 come from ``seed``, and the private subspace
    is computed once. Returns a
    :class:`Ranking` (a sequence of :class:`RankResult`, best first; ``.to_dict()`` is the JSON).

    ``repeats=R`` > 1: R independent repeats with means, intervals, win fractions and ties, by
    :func:`gsd_cli.repeats.rank_repeats` (returns a :class:`gsd_cli.repeats.RepeatRanking`; under DP,
    ``dp_repeats`` = ``shared`` or ``fresh`` says what the repeats spend). ``public_seed`` (default
    ``seed``) seeds the public examples and labels alone; ``memo``: a dict in which subspaces are
    kept and reused when the same settings recur (in memory). ``cache`` (a
    :class:`gsd_cli.cache.SubspaceCache`) stores and reuses the *public* subspaces on disk.
    ``weights`` (pre-trained weights, new head) and ``peft`` (the trainable set) build the model
    exactly as ``gsd train`` does (:func:`gsd_cli.peft.build_model`), so the distance is computed on
    the parameters that will be trained.
    """
    if repeats != 1:
        kw = dict(locals())  # the parameters as given
        del kw["public_seed"]
        from .repeats import rank_repeats

        return rank_repeats(**kw)
    from probes import get_model_spec

    t0 = time.perf_counter()
    if k < 1:
        raise GSDError(f"--k must be at least 1 (got {k})")
    if row_norm not in ROW_NORMS:
        raise GSDError(f"--row-norm must be one of {', '.join(ROW_NORMS)} (got {row_norm!r})")
    if labels not in LABELS:
        raise GSDError(f"--labels must be one of {', '.join(LABELS)} (got {labels!r})")
    if not publics:
        raise GSDError("give at least one public candidate (--public NAME ...)")
    try:
        spec = get_model_spec(model)
    except KeyError as e:
        raise ModelError(str(e.args[0])) from None
    check_insecure_seed(insecure_seed)
    dev = resolve_device(device)
    priv_source = gdata.resolve(private)
    if classes is not None:
        priv_source = gdata.with_classes(priv_source, classes)
    if dp:
        gdata.require_declared_classes(priv_source)
        if examples is None:
            raise GSDError("--dp needs a number of private examples (-m/--examples): with all of them, the output would reveal the size of the private set")
    pub_sources = [gdata.resolve(p) for p in publics]
    names_seen = [priv_source.name] + [s.name for s in pub_sources]
    dup = {n for n in names_seen[1:] if names_seen[1:].count(n) > 1}
    if dup:
        raise GSDError(f"public candidate(s) {', '.join(sorted(dup))} given twice; name each once")
    pseed = seed if public_seed is None else public_seed
    samples = [gdata.draw(s, examples, seed if i == 0 else pseed) for i, s in enumerate([priv_source, *pub_sources])]
    prng = None
    if dp:  # the private rows: a uniformly random m-subset drawn secretly (module docstring, (i))
        prng = private_rng("dp-gsd", insecure_seed, seed)
        samples[0] = gdata.Sample(priv_source, prng.choice(len(priv_source), size=len(samples[0]), replace=False))
    refuse_private_as_public(priv_source, samples[0].indices, samples[1:])
    for smp in samples:
        if k > len(smp):
            raise GSDError(
                f"k={k} is larger than the {len(smp)} examples of {smp.source.name}; use --k <= {len(smp)}"
            )
    num_classes = priv_source.num_classes
    if num_classes < 1:
        raise GSDError(f"{priv_source.name} has no classes; it needs labelled examples")
    from .peft import build_model

    _, net, names, _ = build_model(model, num_classes, seed, weights=weights, peft=peft, params=params)
    num_params = sum(dict(net.named_parameters())[n].numel() for n in names)
    if k > num_params:
        raise GSDError(f"k={k} is larger than the {num_params} selected parameters; use a smaller --k")
    if dp_sketch is not None and not 1 <= k <= dp_sketch:
        raise GSDError(f"--dp-sketch {dp_sketch} must be at least k={k}")
    dims = dp_sketch or num_params
    common = dict(
        sketch_dim=dp_sketch, k=k, input_size=spec.input_size, channels=spec.channels, num_classes=num_classes, names=names,
        labels=labels, row_norm=row_norm, seed=seed, loss=loss, engine=engine, device=dev,
        chunk_size=chunk_size, progress=progress, gram=gram, memory_budget=memory_budget,
    )
    dp_cfg = None
    if dp:
        from .dppca import MECHANISMS, bingham_scale

        if epsilon is None:
            raise GSDError("--dp needs --epsilon (the privacy budget of the ranking, > 0)")
        bingham_scale(epsilon, clip)  # validates epsilon > 0 and clip > 0
        if mechanism not in MECHANISMS:
            raise GSDError(f"unknown --mechanism {mechanism!r}; use one of {', '.join(MECHANISMS)}")
        dp_cfg = dict(epsilon=float(epsilon), clip=float(clip), mechanism=mechanism, sweeps=gibbs_sweeps, rng=prng)
    key = (model, weights, peft, tuple(names), num_classes, k, labels, row_norm, dp_sketch, loss, str(dev), examples, seed, gram)
    dp_key = tuple(sorted((n, v) for n, v in (dp_cfg or {}).items() if n != "rng")) + ((insecure_seed,) if dp else ())
    priv = _cached(memo, key + (priv_source, seed, dp_key), lambda: sample_subspace(net, samples[0], **common, dp=dp_cfg))
    if engine == "auto" and priv.engine != "ghost":  # measured once on the private sample; the same engine for every candidate
        common["engine"] = priv.engine
    rows = []
    for smp in samples[1:]:
        pub = _cached(memo, key + (smp.source, pseed), lambda: public_subspace(
            cache, net, smp, {**common, "seed": pseed}, lambda: sample_subspace(net, smp, **common, label_seed=pseed)))
        angles = principal_angles(priv.V, pub.V)
        rows.append(
            RankResult(
                public=smp.source.name,
                distance=projection_metric(priv.V, pub.V),
                rank=0,
                examples=pub.examples,
                principal_angles_deg=[round(math.degrees(a), 4) for a in angles.tolist()],
                seconds=round(pub.seconds, 3),
            )
        )
    rows.sort(key=lambda r: r.distance)
    for i, r in enumerate(rows, 1):
        r.rank = i
        r.winner = i == 1
    privacy, notes = (None, [])
    private_examples = priv.examples
    if dp_cfg is not None:
        # m = min(examples, N) would reveal N when N < examples: the requested m is used and printed
        privacy, notes = _dp_report(dp_cfg, k, int(examples), dims, row_norm, rows)
        privacy.update(sketch=dp_sketch, insecure_seed=insecure_seed, private_randomness=randomness_statement(insecure_seed))
        if insecure_seed is not None:
            notes.insert(0, INSECURE_NOTE.format(seed=insecure_seed))
        private_examples = int(examples)
    return Ranking(
        privacy=privacy, warnings=notes, dp=dp_cfg is not None and insecure_seed is None,
        private=priv_source.name, model=model, k=k, examples=examples if examples is not None else -1,
        seed=seed, labels=labels, row_norm=row_norm,
        params=None if params is None else ([params] if isinstance(params, str) else list(params)),
        num_params=num_params, device=str(dev), engine=priv.engine, private_examples=private_examples,
        uniform_baseline=uniform_baseline(k, dims), results=rows, sketch=dp_sketch, weights=weights, peft=peft,
        seconds=round(time.perf_counter() - t0, 3),
    )


def refuse_private_as_public(private: gdata.ImageSource, private_indices, publics: Sequence[gdata.Sample],
                             what: str = "public candidate") -> None:
    """Raise :class:`GSDError` when a public set is the private set or shares examples with it (by
    name, path, or the content of the examples drawn; ``private_indices``: the private examples
    drawn, ``None`` for a sample of them): as a candidate its subspace would be the private data's,
    computed without privacy, and it would win with no word; as training data it would be used with
    no noise at all."""
    from .data.identity import shared_examples

    for smp in publics:
        why = shared_examples(private, smp.source, private_indices, smp.indices)
        if why:
            raise GSDError(f"{what} {smp.source.name} is private data: {why}; public data must not hold private examples")


def _cached(cache: dict | None, key: tuple, compute: Callable[[], Subspace]) -> Subspace:
    """``compute()``, or the subspace kept in ``cache`` under ``key``. Sources are keyed by identity
    and kept alive beside the entry, so an id is never reused while it is cached."""
    if cache is None:
        return compute()
    sources = [x for x in key if isinstance(x, gdata.ImageSource)]
    key = tuple((id(x), x.name) if isinstance(x, gdata.ImageSource) else x for x in key)
    if key not in cache:
        cache[key] = (sources, compute())
    return cache[key][1]


def _dp_report(cfg: dict, k: int, m: int, p: int, row_norm: str, rows: list[RankResult]) -> tuple[dict, list[str]]:
    """What a DP ranking spent, and whether its distances can say anything. Uses only (epsilon, m,
    k, p) and the released distances, never the private singular values (paper 004's Theorem 3 bound
    needs the private eigengap, so it is not reported)."""
    from .dppca import concentration_bound, mechanism_guarantee, uniform_distance_quantiles

    lo, _, hi = uniform_distance_quantiles(k, p)
    # sequential: each of k steps has epsilon/k; matrix: one exponent with the whole epsilon
    conc = concentration_bound(cfg["epsilon"], m, k if cfg["mechanism"] == "sequential" else 1)
    privacy = {
        "mechanism": cfg["mechanism"],
        "epsilon": cfg["epsilon"],
        "clip": cfg["clip"],
        "k": k,
        "examples": m,
        **mechanism_guarantee(cfg["mechanism"], cfg.get("sweeps", 10)),
        "neighbouring": "add or remove one example",
        "private_sampling": (
            "m private examples (at most; all of a smaller set) drawn uniformly without replacement with secret "
            "randomness, each with its own random label; the number actually drawn is not released"
        ),
        "row_norm": row_norm,
        "concentration_bound": conc,
        "uniform_distance_99": [lo, hi],
    }
    notes = []
    if not privacy["exact"]:
        notes.append("the matrix mechanism's Gibbs sampler is a Markov chain: no differential-privacy guarantee is proven for this output")
    if conc < p / 2:
        notes.append(
            f"epsilon*m/(2k) = {conc:.3g} is below p/2 = {p / 2:.3g}: each private direction is drawn close to "
            f"uniformly, so the DP distances say little; raise --epsilon or -m, lower --k, or select fewer parameters (--params)"
        )
    if rows and all(lo <= r.distance <= hi for r in rows):
        notes.append(
            f"every DP distance lies in the 99% range of a uniformly random subspace ({lo:.4f}..{hi:.4f}): "
            f"this ranking is noise"
        )
    return privacy, notes
