"""DP-GSD (paper 004, Algorithms 2-3, as corrected in DESIGN.md): the private subspace drawn by an
epsilon-DP exponential mechanism, compared with each public subspace (post-processing).

Randomness. The private examples, their random labels and the mechanism's draw come from the
operating system (:func:`gsd_cli.privacy.randomness.private_rng`), never from the ranking's public
``seed``, and nothing in the output can reproduce them; ``insecure_seed`` opts back into a
reproducible draw and marks the output not DP.

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
replaced (score sensitivity C^2, :mod:`gsd_cli.subspace.dppca`), so M(S - y + x)(O) is within e^{+-epsilon} of
M(S)(O) for every (S, y), hence P_D'(O) within e^{+-epsilon} of P_D(O). (ii) N < m: every example is a
row and D' adds one row, which changes the score by (g . v)^2 in [0, C^2]: within the sensitivity,
so epsilon-DP directly. The model w0, the sketch and the public side do not depend on D (with
``--dp-sketch public`` the sketch is the span of the public sides themselves, :mod:`gsd_cli.subspace.public_basis`,
built before the private rows are touched, and each row's projection Q^T g is a function of that row
alone, clipped after: the sensitivity argument above is unchanged); the
distances and the ranking are post-processing. The number of rows m = min(m, N) would reveal N when
N < m, so a DP ranking prints the requested m, never N, and every data-independent utility figure
uses the requested m. Position-assigned labels or a public-seed draw (as before 0.2.0) break (i):
adding one example would re-draw other rows and labels.
"""

from __future__ import annotations

from .. import data as gdata
from ..errors import GSDError
from ..privacy.randomness import INSECURE_NOTE, check_insecure_seed, private_rng, randomness_statement
from ..subspace.public_basis import public_basis, public_extra, resolve_dp_sketch
from .side import Subspace
from .registry import Distance, SideContext, register_distance


@register_distance("dp-gsd")
class DPGSD(Distance):
    """The private side by :func:`gsd_cli.subspace.dppca.private_top_k_subspace` (rows clipped to ``clip``,
    ``mechanism`` sequential or matrix) with a secret generator; ``s`` is never released."""

    private = True

    def __init__(self, config) -> None:
        from ..subspace.dppca import MECHANISMS, bingham_scale

        super().__init__(config)
        pv, g = config.privacy, config.gradients
        if pv.epsilon is None:
            raise GSDError("--dp needs --epsilon (the privacy budget of the ranking, > 0)")
        bingham_scale(pv.epsilon, pv.clip)  # validates epsilon > 0 and clip > 0
        if pv.mechanism not in MECHANISMS:
            raise GSDError(f"unknown --mechanism {pv.mechanism!r}; use one of {', '.join(MECHANISMS)}")
        if pv.mechanism == "matrix" and pv.gibbs_sweeps < 1:  # before any gradient is computed
            raise GSDError(f"--gibbs-sweeps must be at least 1 (got {pv.gibbs_sweeps})")
        if g.examples is None:
            raise GSDError("--dp needs a number of private examples (-m/--examples): with all of them, the output would reveal the size of the private set")
        check_insecure_seed(pv.insecure_seed)
        self.rng = private_rng("dp-gsd", pv.insecure_seed, config.seed)
        self.settings = dict(epsilon=float(pv.epsilon), clip=float(pv.clip), mechanism=pv.mechanism, sweeps=pv.gibbs_sweeps)
        self.sketch = resolve_dp_sketch(g.dp_sketch, g.k, True)
        self.extra = public_extra(self.sketch)  # None unless --dp-sketch public[+R]
        self.basis = None

    @property
    def needs_public_sides(self) -> bool:
        """Whether the private side needs the public sides first (the public-basis sketch)."""
        return self.extra is not None

    def use_public_sides(self, ctx: SideContext, publics: list[Subspace]) -> None:
        """Build the public basis from the public sides (in the order of the candidates), before the
        private rows are touched; the subspaces then live in its D dimensions (``ctx.dims``)."""
        self.basis = public_basis([s.V for s in publics], self.extra, self.config.seed)
        ctx.dims = int(self.basis.shape[1])
        if not 1 <= self.config.gradients.k < ctx.dims:  # D = k: the draw would be the whole basis, every distance fixed
            raise GSDError(f"the public basis has {ctx.dims} dimensions, not more than k={self.config.gradients.k}: the DP "
                           f"subspace would be the whole basis whatever the private data; use --dp-sketch public+R "
                           f"(R random directions), more candidates, or a smaller --k")

    def private_rows(self, sample: gdata.Sample, publics=()) -> gdata.Sample:
        """A uniformly random m-subset, drawn with the secret generator (module docstring, (i)), of the
        private examples that are not among the public examples ``publics`` (a per-example rule
        decided before the draw, :class:`gsd_cli.data.identity.PublicRows`: the filtered set is a
        function of each example alone, so (i) and (ii) hold for it). The draw walks a secret random
        permutation, skipping examples the rule leaves out, until it has m (or the set is exhausted):
        a uniform m-subset of the filtered set, with only the examples walked ever hashed."""
        import numpy as np

        from ..data.identity import PublicRows

        n, m = len(sample.source), len(sample)
        rule = PublicRows(sample.source, publics)
        if rule.empty:
            return gdata.Sample(sample.source, self.rng.choice(n, size=m, replace=False))
        perm = self.rng.permutation(n)
        kept: list = []
        have, start = 0, 0
        while have < m and start < n:
            block = perm[start : start + max(m - have, 64)]
            start += len(block)
            keep = block[~rule.mask(block)]
            kept.append(keep[: m - have])
            have += len(kept[-1])
        return gdata.Sample(sample.source, np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64))

    def private_side(self, ctx: SideContext, sample: gdata.Sample) -> Subspace:
        # The clip bounds each example's own gradient (its sensitivity) only if each row is that example's
        # gradient alone. ``vmap`` computes every example as a batch of its own, so that holds by
        # construction; the faster ``layers`` engine holds it only for models whose examples do not
        # interact, which it checks on one example of the first chunk. So ``auto`` means vmap here; the
        # public sides (no privacy at stake) keep ``auto``. An engine asked for by name is used as asked.
        engine = "vmap" if ctx.common.get("engine", "auto") == "auto" else ctx.common["engine"]
        m = int(self.config.gradients.examples)  # the requested m: progress and path choices never see min(m, N)
        if self.needs_public_sides and self.basis is None:
            raise GSDError("--dp-sketch public: the public basis must be built (use_public_sides) before the private side")
        sub = ctx.subspace(sample, dp={**self.settings, "rng": self.rng, "m": m}, engine=engine, basis=self.basis)
        sub.dims = ctx.dims
        return sub

    def memo_key(self) -> tuple:
        return (self.name, tuple(sorted(self.settings.items())), self.config.privacy.insecure_seed, self.extra)

    def shared_privacy(self) -> dict:
        """The privacy block's fields every DP distance that draws m private rows states (DP-GSD, the DP energy
        distance, the DP selection): epsilon, the row clip, k, the requested m, the neighbouring relation, how the
        private rows are drawn and kept apart from the public ones, and the private randomness. Each distance adds
        its mechanism's own (name, guarantee, sensitivities)."""
        g, ins = self.config.gradients, self.config.privacy.insecure_seed
        return {
            "epsilon": self.settings["epsilon"],
            "clip": self.settings["clip"],
            "k": g.k,
            "examples": int(g.examples),
            "neighbouring": "add or remove one example",
            "private_sampling": (
                "m private examples (at most; all of a smaller set) drawn uniformly without replacement with secret "
                "randomness, each with its own random label; the number actually drawn is not released"
            ),
            "public_overlap": ("private examples whose file or content is among the public examples drawn are left out "
                               "before the secret draw (a per-example rule); how many is not released"),
            "row_norm": g.row_norm,
            "insecure_seed": ins,
            "private_randomness": randomness_statement(ins),
        }

    def report(self, ctx: SideContext, rows: list) -> tuple[dict, list[str], bool]:
        """What the ranking spent, and whether its distances can say anything. Uses only (epsilon,
        the requested m, k, p) and the released distances, never the private singular values (paper
        004's Theorem 3 bound needs the private eigengap, so it is not reported). m = min(m, N) would
        reveal N when N < m: the requested m is used and printed."""
        from .dp_report import concentration_bound, mechanism_guarantee, uniform_distance_quantiles

        cfg, g, ins = self.settings, self.config.gradients, self.config.privacy.insecure_seed
        k, m, p = g.k, int(g.examples), ctx.dims
        lo, _, hi = uniform_distance_quantiles(k, p)
        # sequential: each of k steps has epsilon/k; matrix: one exponent with the whole epsilon
        conc = concentration_bound(cfg["epsilon"], m, k if cfg["mechanism"] == "sequential" else 1)
        privacy = {
            "mechanism": cfg["mechanism"],
            **self.shared_privacy(),
            **mechanism_guarantee(cfg["mechanism"], cfg["sweeps"]),
            "concentration_bound": conc,
            "uniform_distance_99": [lo, hi],
            "sketch": self.sketch,
            "sketch_dims": p,
            "sketch_description": sketch_description(self.sketch, p, k, self.extra),
        }
        notes = [INSECURE_NOTE.format(seed=ins)] if ins is not None else []
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
        # "dp" is true only for a proven mechanism: the matrix mechanism's Gibbs chain has none
        return privacy, notes, ins is None and bool(privacy["exact"])


def sketch_description(dp_sketch, dims: int, k: int, extra: int | None) -> str:
    """What the mechanism's input was projected onto, for the privacy block (public facts only)."""
    if extra is not None:
        return (f"public basis: the span of the public candidates' own top-{k} gradient subspaces at w0"
                + (f" plus {extra} random directions from --seed" if extra else "")
                + f", {dims} orthonormal directions, computed from public data only before the private rows are read; "
                "each private row projected onto it, then clipped; the draw mapped back to parameter space")
    if dp_sketch:
        return f"Gaussian sketch: every gradient projected by one N(0, 1/{dims}) matrix from --seed to {dims} dimensions, then clipped"
    return f"none: the mechanism runs in all {dims} parameters"
