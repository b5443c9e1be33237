"""DP selection (``gsd rank --dp``'s default, ``gsd train --auto-select --select-epsilon``): release the
closest candidate (or a short list) and its score, at a cost that does not grow with the number of
candidates.

Why. The DP energy distance (:mod:`.dpenergy`, ``--metric dp-energy``) releases every candidate's
score with Laplace noise of scale 2 C^2 Lambda / epsilon, Lambda = lambda_max(sum_j V_j V_j^T),
which approaches K when the candidates resemble each other: its noise grows with the catalogue. What
``--auto-select`` and most users need is the winner. Choosing one of K candidates costs epsilon
whatever K is (:mod:`gsd_cli.privacy.selection`).

The rows. As :mod:`.dpenergy`: a secret uniform m-subset of the private examples, each row its
example's gradient g_i (after ``--row-norm``) projected onto the public basis Q of the candidates'
own top-k subspaces, q_i = Q^T g_i, clipped to norm C; W_j = Q^T V_j. Row i gives candidate j the
energy a_ij = |W_j^T q_i|^2 in [0, C^2] and is best served by the candidate with the largest,
M_i = max_j a_ij.

The utility (what the winner maximises): the **clipped regret**

    u_j = - sum_i min(M_i - a_ij, tau),        tau = regret_clip * C^2 (public),

each row's shortfall of candidate j against the row's best candidate, clipped at tau. When no
shortfall reaches tau, u_j = s_j - sum_i M_i with s_j = sum_i a_ij the energy of :mod:`.dpenergy`:
the same order, but every row moves u_j by at most tau instead of C^2. A row far from every candidate
but one counts as "tau short" for the others however far they are: the far candidates do not set
the scale of the noise. As tau -> 0, u_j / tau -> -(number of rows whose best candidate is not j): a
vote of the rows. With tau = C^2 (``regret_clip=1``) u_j + sum_i M_i is exactly s_j.

Sensitivity (the neighbours: **replace one row**, the relation :mod:`.dpgsd`'s argument (i)-(ii)
needs to lift row-level DP to "add or remove one example" of the private set): replacing row q by
q' changes u_j by min(M(q) - a_j(q), tau) - min(M(q') - a_j(q'), tau), a difference of two numbers in
[0, tau]: |u_j(D) - u_j(D')| <= tau for every j, so Delta = tau. (Under add/remove of a row u moves
all one way, by [-tau, 0] in every coordinate: monotone; not used, because of the replace-one step
of (i).) Checked against brute force on random neighbouring pairs (tests).

Mechanisms (:mod:`gsd_cli.privacy.selection`), with epsilon_select = (1 - score_share) epsilon:

* ``top = 1``: **permute-and-flip** (McKenna and Sheldon 2020, Algorithm 1 and its privacy theorem):
  p_j = exp(epsilon_select / (2 tau) (u_j - max u)); epsilon_select-DP for Delta = tau.
* ``top = k > 1``: **peeling exponential mechanism**, k rounds at epsilon_select / k each, drawn in one
  shot with Gumbel noise (Durfee and Rogers 2019): epsilon_select-DP by basic composition of the k
  rounds (Dwork and Roth 2014, Theorem 3.16).

The released scores: the energies s_j of the selected candidates S (public once chosen), with
Laplace noise (Dwork and Roth 2014, Theorem 3.6) at epsilon_score = score_share * epsilon. Their L1
sensitivity under replace-one: sum_{j in S} |a_j(q') - a_j(q)| <= sum_{j in S} max(a_j(q'), a_j(q)),
at most |S| C^2 (each a_j in [0, C^2]) and at most sum_S a_j(q') + sum_S a_j(q) <= 2 C^2 Lambda_S,
Lambda_S = lambda_max(sum_{j in S} W_j W_j^T) (public): Laplace scale C^2 min(|S|, 2 Lambda_S) /
epsilon_score. The released distance d_j = sqrt(1 - s~_j / (m C^2)) (requested m) is the DP energy
distance of that candidate, post-processing.

In all: the selection (epsilon_select) and then the scores of what it chose (epsilon_score), adaptive
basic composition: epsilon-DP on the rows under replace-one (and add/remove), so, by :mod:`.dpgsd`'s
argument (i)-(ii), epsilon-DP under add/remove one example of the private set; delta = 0. Nothing is
released about the candidates not chosen. The generator is DP-GSD's secret one (OS entropy).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from .. import data as gdata
from ..data.reference import is_reference, reference_kind
from ..errors import GSDError
from ..privacy.randomness import INSECURE_NOTE
from ..privacy.selection import laplace_scores, peel_top_k, permute_and_flip
from .side import Subspace
from .dpenergy import DPEnergy, EnergySide, energy_sensitivity
from .registry import SideContext, register_distance

#: defaults of the selection's settings (gsd rank --top / --regret-clip / --score-share)
TOP, REGRET_CLIP, SCORE_SHARE = 1, 0.02, 0.5


def row_energies(P: torch.Tensor, W: list[torch.Tensor], clip: float) -> np.ndarray:
    """a_ij = |W_j^T clip_C(q_i)|^2 (m x K, float64) for the projected private rows P (m x D)."""
    from ..subspace.dppca import clip_rows

    Pc = clip_rows(P.to(torch.float64), clip)
    if len(W) == 0:
        return np.zeros((Pc.shape[0], 0))
    return np.stack([((Pc @ Wj.to(Pc.device, torch.float64)) ** 2).sum(1).cpu().numpy() for Wj in W], axis=1)


def clipped_regret(A: np.ndarray, tau: float) -> np.ndarray:
    """u_j = -sum_i min(M_i - a_ij, tau), M_i = max_j a_ij (module docstring): the selection's utility."""
    A = np.asarray(A, dtype=np.float64)
    if A.shape[0] == 0:
        return np.zeros(A.shape[1])
    return -np.minimum(A.max(axis=1, keepdims=True) - A, tau).sum(axis=0)


def score_sensitivity(W: list[torch.Tensor], clip: float) -> float:
    """C^2 min(|S|, 2 Lambda_S): the L1 sensitivity, under replace one row, of the energies of the
    candidates ``W`` (module docstring)."""
    if not W:
        return 0.0
    lam = energy_sensitivity(W)
    return clip * clip * min(float(len(W)), 2.0 * lam)


def check_settings(top, regret_clip, score_share) -> None:
    """One-line errors for the selection's settings, before any work."""
    if isinstance(top, bool) or not isinstance(top, (int, np.integer)) or top < 1:
        raise GSDError(f"--top {top}: give a whole number >= 1 (the candidates the DP selection returns)")
    if not (isinstance(regret_clip, (int, float)) and not isinstance(regret_clip, bool) and 0 < regret_clip <= 1):
        raise GSDError(f"--regret-clip {regret_clip}: give a number in (0, 1] (the clip of each row's regret, in units of C^2)")
    if not (isinstance(score_share, (int, float)) and not isinstance(score_share, bool) and 0 < score_share < 1):
        raise GSDError(f"--score-share {score_share}: give a number strictly between 0 and 1 (the part of --epsilon that "
                       "releases the chosen candidates' scores)")


@dataclass
class Selection:
    """One DP selection's release: ``chosen`` (candidate indices, best first) and their noisy energies
    ``scores``, with every figure of the mechanism (all public: functions of the settings and of the
    public subspaces)."""

    chosen: list[int]
    scores: list[float]
    mechanism: str
    epsilon: float
    epsilon_select: float
    epsilon_score: float
    selection_sensitivity: float
    score_sensitivity: float
    score_laplace_scale: float
    top: int
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def mechanism_name(top: int) -> str:
    return "permute-and-flip" if top == 1 else f"peeling exponential mechanism (top {top})"


def reference_margin(s: np.ndarray, winner: int, references: list[int], kinds: list[list[int]] | None = None) -> float:
    """The winner's margin over the noise references, beyond the spread of noise itself, in energy
    (units of C^2):

        T = min_r (s_winner - s_r)  -  max_kind |s_kind,1 - s_kind,2|,

    s_j = sum_i a_ij the energy (:func:`private_selection`'s ``s``): how much more of the private
    gradients' energy the winner's top-k subspace holds than the best reference's, less the largest
    gap between two draws of the same kind of noise (``kinds``: the indices of each kind's draws; a
    kind with one draw adds nothing). Why energy, not the clipped regret the winner is chosen by: with
    tau = 0.02 C^2 the regret is a vote of the rows, and near-equal subspaces split the vote by tiny
    public-draw differences, so a vote margin says little where the energies are equal. Why the allowance:
    one public draw per candidate, so a margin from one draw of noise over another grows with m and is not a
    sign of closeness (the measurements: docs/evidence/validity-log.md).

    Sensitivity under replace one row (each a_ij in [0, C^2]): each difference s_j - s_l moves by
    (a_j(q') - a_l(q')) - (a_j(q) - a_l(q)), at most 2 C^2, and so do a minimum or a maximum of such
    differences (or of their absolute values): 4 C^2 for T (checked against brute force on random
    neighbouring pairs, tests)."""
    s = np.asarray(s, dtype=np.float64)
    ahead = min(s[winner] - s[r] for r in references)
    gaps = [abs(s[a] - s[b]) for kind in (kinds or ()) for i, a in enumerate(kind) for b in kind[i + 1:]]
    return float(ahead - max(gaps, default=0.0))


#: the part of the scores' share (``score_share`` x epsilon) that releases :func:`reference_margin` when
#: the selection has references: the advice reads the margin, the winner's own score is for the table
MARGIN_SHARE = 0.75


@dataclass(frozen=True)
class SelectionBudget:
    """How the DP selection splits its epsilon (module docstring; one description, read by the release, its
    privacy block and its guarantee): ``select`` chooses, ``score`` releases the chosen candidates' energies,
    ``margin`` (with auto-select's noise references: :data:`MARGIN_SHARE` of the scores' share) the winner's
    margin over them. Basic composition: the parts add to the total."""

    select: float
    score: float
    margin: float = 0.0

    @property
    def parts(self) -> list[float]:
        return [self.select, self.score] + ([self.margin] if self.margin else [])


def selection_budget(epsilon: float, score_share: float, references: bool = False) -> SelectionBudget:
    """The split of ``epsilon`` (:class:`SelectionBudget`): (1 - ``score_share``) to choose, the rest to the
    scores, of which :data:`MARGIN_SHARE` to the margin when the selection has ``references``."""
    eps_sel, eps_score = epsilon * (1.0 - score_share), epsilon * score_share
    eps_margin = eps_score * MARGIN_SHARE if references else 0.0
    return SelectionBudget(eps_sel, eps_score - eps_margin, eps_margin)


def release(u: np.ndarray, s: np.ndarray, W: list[torch.Tensor], epsilon: float, clip: float, *, regret_clip: float = REGRET_CLIP,
            top: int = TOP, score_share: float = SCORE_SHARE, rng: np.random.Generator,
            references: list[int] | None = None, reference_kinds: list[list[int]] | None = None) -> Selection:
    """The mechanism on given utilities ``u`` (clipped regret) and energies ``s`` of the K candidates
    whose public subspaces (in the basis) are ``W``: choose (permute-and-flip, or peeling for ``top``
    > 1) at epsilon (1 - score_share), then release the chosen candidates' energies with Laplace noise
    at epsilon score_share (module docstring). ``rng``: the private generator.

    ``references`` (the indices of ``gsd train --auto-select``'s in-run noise references among the
    candidates; ``reference_kinds``: the indices of each kind's draws): :data:`MARGIN_SHARE` of the
    score part releases the winner's :func:`reference_margin` + Laplace(4 C^2 / epsilon_margin) (Dwork
    and Roth 2014, Theorem 3.6; sensitivity 4 C^2), drawn whatever was chosen (the budget does not depend
    on the choice) and released only when the winner is not a reference: the advice reads "closer than
    noise" from it (:func:`gsd_cli.ranking.reference.closer_than_reference`). Adaptive basic
    composition: epsilon in all."""
    check_settings(top, regret_clip, score_share)
    K = len(W)
    if len(u) != K or len(s) != K:
        raise GSDError("the selection needs one utility and one energy per candidate")
    top = min(int(top), K)
    refs = sorted(set(references or ()))
    budget = selection_budget(epsilon, score_share, bool(refs))
    eps_sel, eps_score, eps_margin = budget.select, budget.score, budget.margin
    tau = regret_clip * clip * clip  # Delta of the utility under replace one row
    chosen = [permute_and_flip(u, eps_sel, tau, rng)] if top == 1 else peel_top_k(u, top, eps_sel, tau, rng)
    l1 = score_sensitivity([W[j] for j in chosen], clip)
    scores = laplace_scores(np.asarray(s, dtype=np.float64)[chosen], l1, eps_score, rng)
    extra = {}
    if refs:
        w, others = chosen[0], [r for r in refs if r != chosen[0]]
        sensitivity = 4.0 * clip * clip
        scale = sensitivity / eps_margin
        noise = float(rng.laplace(0.0, scale))
        kinds = [[j for j in kind if j != w] for kind in (reference_kinds or ())]
        extra = {"epsilon_margin": eps_margin, "margin_sensitivity": sensitivity, "margin_laplace_scale": scale,
                 "reference_margin": (reference_margin(s, w, others, kinds) + noise) if (w not in refs and others) else None}
    return Selection(chosen, [float(v) for v in scores], mechanism_name(top), float(epsilon), eps_sel, eps_score, tau, l1,
                     l1 / eps_score, top, extra)


def private_selection(P: torch.Tensor, W: list[torch.Tensor], epsilon: float, clip: float, *, regret_clip: float = REGRET_CLIP,
                      top: int = TOP, score_share: float = SCORE_SHARE, rng: np.random.Generator,
                      references: list[int] | None = None, reference_kinds: list[list[int]] | None = None) -> Selection:
    """The whole release from the projected private rows ``P`` (m x D): clip, utilities (clipped regret
    and energies), :func:`release`."""
    A = row_energies(P, W, clip)
    return release(clipped_regret(A, regret_clip * clip * clip), A.sum(axis=0), W, epsilon, clip,
                   regret_clip=regret_clip, top=top, score_share=score_share, rng=rng, references=references,
                   reference_kinds=reference_kinds)


@dataclass
class SelectSide(EnergySide):
    """The private side of ``dp-select``: the chosen candidates (best first) and their released energies."""

    chosen: list = field(default_factory=list)
    selection: dict = field(default_factory=dict)


@register_distance("dp-select")
class DPSelect(DPEnergy):
    """The DP selection of the closest candidate(s) and their scores (module docstring). Needs ``--dp``."""

    reading = ("DP selection: the candidate(s) chosen by a private selection, best first, with each one's DP energy distance "
               "(sqrt(1 - its noisy share of the private gradients' energy in its top-k subspace)); lower is closer")
    #: releases a choice, not a distance per candidate (repeats are refused: gsd_cli.ranking.repeats)
    selection = True
    #: the release does not change with a repeat's public draw (shared repeats would show it R times)
    fixed_release = True

    def __init__(self, config) -> None:
        super().__init__(config)
        pv = config.privacy
        check_settings(pv.top, pv.regret_clip, pv.score_share)
        self.select_settings = dict(top=int(pv.top), regret_clip=float(pv.regret_clip), score_share=float(pv.score_share))

    def private_side(self, ctx: SideContext, sample: gdata.Sample) -> "SelectSide":
        P = self.projected_rows(ctx, sample)
        pv = self.config.privacy
        refs = [j for j, n in enumerate(self.names) if is_reference(n)]  # auto-select's noise references: a margin too
        kinds: dict[str, list[int]] = {}
        for j in refs:
            kinds.setdefault(reference_kind(self.names[j]), []).append(j)
        sel = private_selection(P, self.W, float(pv.epsilon), float(pv.clip), rng=self.rng, references=refs or None,
                                reference_kinds=list(kinds.values()) or None, **self.select_settings)
        names = [self.names[j] for j in sel.chosen]
        self.last_selection = sel
        return SelectSide(sample.source.name, int(self.config.gradients.examples), 0.0, self.engine_used,
                          energies=dict(zip(names, sel.scores)), chosen=names, selection=sel.to_dict())

    def compare(self, private: "SelectSide", public: Subspace) -> tuple[float | None, list[float]]:
        if public.name not in private.energies:  # not chosen: nothing is released about it
            return None, []
        return super().compare(private, public)

    def arrange(self, private: "SelectSide", rows: list) -> tuple[list, list[str]]:
        """The chosen candidates in the order chosen (the selection's order, not the noisy scores'), and
        the names of the others, of which nothing is released."""
        order = {n: i for i, n in enumerate(private.chosen)}
        kept = sorted((r for r in rows if r.public in order), key=lambda r: order[r.public])
        return kept, [r.public for r in rows if r.public not in order]

    def memo_key(self) -> tuple:
        return super().memo_key() + tuple(sorted(self.select_settings.items()))

    def report(self, ctx: SideContext, rows: list) -> tuple[dict, list[str], bool]:
        pv, g, ins = self.config.privacy, self.config.gradients, self.config.privacy.insecure_seed
        privacy, dp = self.shared_privacy(), ins is None  # the selection's own fields below, not the noisy order's
        st = self.select_settings
        eps, C = float(pv.epsilon), float(pv.clip)
        budget = selection_budget(eps, st["score_share"])  # without references; a release's own figures below
        top = min(st["top"], len(getattr(self, "names", [])) or st["top"])
        last = getattr(self, "last_selection", None)
        privacy.update(
            mechanism=mechanism_name(top), release="selection", top=top, exact=True, delta=0.0,
            epsilon_select=budget.select, epsilon_score=budget.score, score_share=st["score_share"], regret_clip=st["regret_clip"],
            selection_sensitivity=st["regret_clip"] * C * C,
            what_is_dp=("the chosen candidate(s), in the order chosen, and their released DP energy distances; "
                        "nothing is released about the other candidates"),
            not_released="the other candidates' scores and order (use --metric dp-energy for a noisy order of all candidates)",
        )
        eps_margin = 0.0
        if last is not None and last.extra.get("epsilon_margin"):  # auto-select's references: the margin's release
            eps_margin = float(last.extra["epsilon_margin"])
            privacy.update({k: last.extra[k] for k in ("epsilon_margin", "margin_sensitivity", "margin_laplace_scale", "reference_margin")},
                           epsilon_select=last.epsilon_select, epsilon_score=last.epsilon_score)
        # stated from the figures the mechanism used (the margin takes its part out of the scores' share)
        privacy["guarantee"] = selection_guarantee(top, st["regret_clip"], privacy["epsilon_select"], privacy["epsilon_score"], eps_margin)
        if last is not None:  # this ranking's own release (a side recalled from a memo has its own ranking's figures)
            m = int(g.examples)
            privacy.update(score_l1_sensitivity=last.score_sensitivity, score_laplace_scale=last.score_laplace_scale,
                           released_energy_share={self.names[j]: v / (m * C * C) for j, v in zip(last.chosen, last.scores)},
                           share_noise_scale=last.score_laplace_scale / (m * C * C))
        notes = [INSECURE_NOTE.format(seed=ins)] if ins is not None else []
        if top < st["top"]:  # clamped to the candidates (a public count): said, not silently
            notes.append(f"--top {st['top']} is more than the {top} candidates: the DP selection chooses all {top}, in order")
        return privacy, notes, dp


def selection_guarantee(top: int, regret_clip: float, eps_select: float, eps_score: float, eps_margin: float = 0.0) -> str:
    """The DP selection's privacy statement from the epsilons its mechanism used (:func:`release`):
    ``eps_select`` to choose, ``eps_score`` for the chosen candidates' scores and, with auto-select's
    noise references, ``eps_margin`` for the winner's margin over them (taken out of the scores' share).
    The parts it states add to the total it states."""
    parts = SelectionBudget(eps_select, eps_score, eps_margin).parts
    text = (f"pure epsilon-DP: {mechanism_name(top)} on the clipped regret (each row's shortfall against its best "
            f"candidate, clipped at tau = {regret_clip:g} C^2; sensitivity tau, one row replaced) at epsilon {eps_select:g}"
            + ("" if top == 1 else f" ({top} rounds at {eps_select / top:g}, basic composition)")
            + f", then the chosen candidates' energies by the Laplace mechanism at epsilon {eps_score:g}")
    if eps_margin:
        text += (f", then the winner's energy margin over the best noise reference less the largest gap between two draws "
                 f"of one kind of noise (sensitivity 4 C^2) by the Laplace mechanism at epsilon {eps_margin:g} "
                 f"({MARGIN_SHARE:g} of the scores' share, {eps_score + eps_margin:g})")
    return text + f"; basic composition: {' + '.join(f'{e:g}' for e in parts)} = epsilon {sum(parts):g}"


@dataclass(frozen=True)
class ReleasedWinner:
    """The DP selection's winner and its released score (what a decision that reads DP releases only may use):
    ``distance`` (the released DP energy distance), ``energy_share`` (s~ / (m C^2)), ``share_noise_scale`` (the
    Laplace scale of that share), ``epsilon_score`` (the part of epsilon that released it)."""

    public: str
    distance: float
    energy_share: float
    share_noise_scale: float | None
    epsilon_score: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ReleasedMargin:
    """The DP selection's released margin of its winner over the in-run noise references (energy in C^2 units,
    :func:`reference_margin` plus Laplace noise) and the Laplace scale; both None where none was released."""

    margin: float | None
    laplace_scale: float | None


def released_winner(ranking) -> ReleasedWinner | None:
    """The DP winner of a ranking by the DP selection and its released score (:class:`ReleasedWinner`), for a
    decision that must read DP releases only (``gsd train --auto-select --select-epsilon``); None for another
    ranking."""
    pv = getattr(ranking, "privacy", None) or {}
    if pv.get("release") != "selection" or not ranking.results:
        return None
    best = ranking.results[0]
    share = (pv.get("released_energy_share") or {}).get(best.public, 1.0 - best.distance ** 2)  # unclamped when known
    return ReleasedWinner(best.public, best.distance, share, pv.get("share_noise_scale"), pv["epsilon_score"])


def released_margin(ranking) -> ReleasedMargin:
    """The winner's released margin over the in-run references (:class:`ReleasedMargin`) of a DP selection's
    ranking (its ``privacy`` block: ``reference_margin``, ``margin_laplace_scale``)."""
    pv = getattr(ranking, "privacy", None) or {}
    return ReleasedMargin(pv.get("reference_margin"), pv.get("margin_laplace_scale"))


__all__ = ["DPSelect", "Selection", "check_settings", "clipped_regret", "mechanism_name", "private_selection", "reference_margin", "release", "MARGIN_SHARE",
           "released_winner", "released_margin", "SelectionBudget", "selection_budget", "ReleasedWinner", "ReleasedMargin", "row_energies", "selection_guarantee", "score_sensitivity", "REGRET_CLIP", "SCORE_SHARE", "TOP"]
