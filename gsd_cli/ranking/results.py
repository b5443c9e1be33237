"""What a ranking returns: one row per public candidate, the settings, and over repeats the summary.

``Ranking.to_dict()`` is the JSON ``gsd rank --json`` writes (fields are only ever added).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Iterator

DP_REPEATS = ("shared", "fresh")
#: Significance level of the tie test (one-sided, Holm-adjusted over the non-winners).
TIE_ALPHA = 0.05
#: Confidence level of the intervals.
LEVEL = 0.95
TIE_TEST = (
    "one-sided paired t-test on the per-repeat differences to the winner (same private draw within a repeat), "
    "Holm-adjusted over the candidates, alpha=0.05; tied = not significantly farther than the winner"
)


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
    seconds: float | None = 0.0  # None under DP: the time depends on the private set's size
    privacy: dict | None = None
    warnings: list[str] = field(default_factory=list)
    sketch: int | None = None
    weights: str | None = None  # --weights (pre-trained backbone), when given
    peft: str | None = None  # --peft (the trainable set), when given
    dp: bool = False  # whether this output is differentially private (DP-GSD with secret randomness)
    metric: str = "gsd"  # the registered distance that produced it (gsd, dp-gsd, otdd, frechet, task2vec, logme)
    subspace_method: str = "auto"  # --subspace-method: how the non-private top-k subspaces were found
    not_selected: list[str] = field(default_factory=list)  # a DP selection: the candidates not chosen (nothing released about them)
    references: list = field(default_factory=list)  # gsd train --auto-select: the in-run noise references' rows (gsd_cli.advice.decide)
    not_ranked: list[str] = field(default_factory=list)  # gsd train --auto-select: candidates left out, none could be chosen (gsd_cli.advice.select)
    #: gsd train --auto-select: candidates whose draws stopped when their test against the noise references was decided
    #: to fail (name: draws, of, margins; gsd_cli.advice.gate.draws_until_decided)
    stopped: dict = field(default_factory=dict)

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


def _finite(v):
    """NaN (sd and interval of one repeat) as None, so the JSON stays strict."""
    return None if isinstance(v, float) and math.isnan(v) else v


@dataclass
class RepeatResult(RankResult):
    """One candidate over R repeats: ``distance`` is the mean (the ranking key); ``distances`` holds
    each repeat's distance, in repeat order. ``tied``: not significantly farther than the winner."""

    mean: float = 0.0
    sd: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    win_fraction: float = 0.0
    tied: bool = False
    p_value: float | None = None
    distances: list[float] = field(default_factory=list)


@dataclass
class RepeatRanking(Ranking):
    """A ranking over R repeats: ``results`` are :class:`RepeatResult` sorted by mean distance;
    ``runs`` holds each repeat's plain :class:`Ranking`; ``repeat_seeds`` the seed of each."""

    repeats: int = 1
    repeat_seeds: list[int] = field(default_factory=list)
    level: float = LEVEL
    tie_test: str = TIE_TEST
    dp_repeats: str | None = None
    runs: list[Ranking] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Settings, ``results`` (summary, with each repeat's ``distances``) and ``runs`` (each
        repeat's seed and distances per candidate)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("results", "runs")}
        d["results"] = [{k: _finite(v) for k, v in r.to_dict().items()} for r in self.results]
        d["runs"] = [
            {"repeat": i, "seed": s, "winner": run.winner.public, "distances": {x.public: x.distance for x in run}}
            for i, (s, run) in enumerate(zip(self.repeat_seeds, self.runs))
        ]
        return d
