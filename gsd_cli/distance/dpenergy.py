"""DP energy distance (``--metric dp-energy --dp``): release, per public candidate, how much of the
private gradients' energy lies in that candidate's own top-k subspace, by the Laplace mechanism.

Why. A ranking needs K numbers, not a private subspace: DP-GSD's Bingham draw spends epsilon on a
whole k-dimensional subspace (k draws, epsilon/k each), and its order keeps little of the non-private
one at usual budgets (``benchmarks/bench_dp_public_basis.py``). Here each candidate j gets one number,

    s_j = sum_i |V_j^T g_i|^2,

over the private rows g_i (each example's gradient after ``--row-norm``), where V_j (p x k,
orthonormal) is candidate j's top-k gradient subspace at w0: public data only. Non-private, the
candidates ordered by s_j follow the GSD order closely (Kendall tau 0.87 to 1 on the benchmark's
tasks); s_j is the private rows' energy inside V_j, GSD's ||V_j^T V_priv||_F^2 without the top-k cut.

Privacy (pure epsilon-DP under add/remove one example). Let Q (p x D) be an orthonormal basis of
span(V_1..V_K) and W_j = Q^T V_j (public; :mod:`gsd_cli.subspace.public_basis`). Each row becomes q_i = Q^T g_i
(a function of that example alone), clipped to norm C; then s_j = sum_i |W_j^T q_i|^2, and one row
contributes the vector (|W_j^T q|^2)_j with L1 norm q^T (sum_j W_j W_j^T) q <= C^2 Lambda, where
Lambda = lambda_max(sum_j V_j V_j^T) <= K is a function of the public subspaces only. Replacing one
row changes s by the difference of two such vectors: L1 norm <= 2 C^2 Lambda. So adding Laplace
noise of scale b = 2 C^2 Lambda / epsilon to each s_j is epsilon-DP on the m rows under replace-one
(the Laplace mechanism, Dwork and Roth 2014, Theorem 3.6) and under add/remove-one (L1 <= C^2 Lambda).
The m rows are drawn from the private set exactly as DP-GSD's (:mod:`gsd_cli.distance.dpgsd`: a secret
uniform m-subset, own labels per row), whose argument (i)-(ii) needs only "epsilon-DP on the rows under
replace-one and add/remove-one", so the ranking is epsilon-DP under add/remove one example. The
released distance d_j = sqrt(max(0, 1 - s~_j / (m C^2))) uses the requested m (public) and is
post-processing. The noise comes from the secret generator of DP-GSD (OS entropy), never ``--seed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import data as gdata
from ..errors import GSDError
from ..privacy.randomness import INSECURE_NOTE
from ..subspace.public_basis import project_rows, public_basis
from .side import DP_PROGRESS, Side, Subspace
from .dpgsd import DPGSD
from .registry import SideContext, register_distance


@dataclass
class EnergySide(Side):
    """The private side of ``dp-energy``: the released noisy energies, by candidate name (no subspace is released)."""

    energies: dict = field(default_factory=dict)


def energy_sensitivity(subspaces) -> float:
    """Lambda = lambda_max(sum_j V_j V_j^T): the top squared singular value of [V_1 ... V_K] (public)."""
    M = torch.cat([V.detach().to("cpu", torch.float64) for V in subspaces], dim=1)
    return float(torch.linalg.svdvals(M)[0] ** 2)


def laplace_scale(epsilon: float, clip: float, lam: float) -> float:
    """b = 2 C^2 Lambda / epsilon: the Laplace scale for the L1 sensitivity 2 C^2 Lambda (replace one row)."""
    return 2.0 * clip * clip * lam / epsilon


def energies(P: torch.Tensor, W: list[torch.Tensor], clip: float) -> np.ndarray:
    """s_j = sum_i |W_j^T clip(q_i)|^2 for the projected private rows P (m x D): no noise."""
    from ..subspace.dppca import clip_rows

    Pc = clip_rows(P.to(torch.float64), clip)
    return np.array([float(((Pc @ Wj.to(Pc.device, torch.float64)) ** 2).sum()) for Wj in W])


def private_energies(P: torch.Tensor, W: list[torch.Tensor], epsilon: float, clip: float, lam: float,
                     rng: np.random.Generator) -> np.ndarray:
    """s~_j = sum_i |W_j^T clip(q_i)|^2 + Laplace(b) for the projected private rows P (m x D)."""
    return energies(P, W, clip) + rng.laplace(0.0, laplace_scale(epsilon, clip, lam), size=len(W))


@register_distance("dp-energy")
class DPEnergy(DPGSD):
    """Each candidate's share of the private gradients' energy in its own top-k subspace, released by
    the Laplace mechanism (module docstring). Needs ``--dp``; no sketch, no Bingham draw."""

    reading = ("DP energy distance: sqrt(1 - the private gradients' energy share in the candidate's own top-k subspace), "
               "each share released with Laplace noise; lower is closer")
    #: one release fixes every candidate's distance: repeats that share it show the same numbers
    fixed_release = True

    def __init__(self, config) -> None:
        if not config.privacy.dp:
            raise GSDError("--metric dp-energy is differentially private: give --dp and --epsilon")
        if config.gradients.dp_sketch not in (None, 0, "0", "none"):
            raise GSDError(f"--metric {self.name} measures in the candidates' own subspaces; drop --dp-sketch")
        if config.privacy.mechanism != "sequential":  # DP-GSD's Bingham sampler: no such draw here (and no guarantee to book)
            raise GSDError(f"--mechanism {config.privacy.mechanism} is DP-GSD's Bingham sampler; --metric {self.name} draws no "
                           "subspace: drop --mechanism (or use --metric dp-gsd)")
        super().__init__(config)
        self.extra = 0  # the public sides come first (the pipeline's needs_public_sides)
        self.sketch = None

    def use_public_sides(self, ctx: SideContext, publics: list[Subspace]) -> None:
        Vs = [s.V for s in publics]
        self.basis = public_basis(Vs)
        self.W = [self.basis.T @ V.detach().to("cpu", torch.float64) for V in Vs]
        self.names = [s.name for s in publics]
        self.lam = energy_sensitivity(Vs)

    def projected_rows(self, ctx: SideContext, sample: gdata.Sample) -> torch.Tensor:
        """The private rows projected onto the public basis, q_i = Q^T g_i (m x D, float64, not yet
        clipped): each a function of its own example alone. Chunk by chunk: only m x D numbers are
        kept, never the m x p matrix."""
        from ..gradients import default_chunk_size, gradient_matrix, resolve_device
        from .side import sample_labels

        if self.basis is None:
            raise GSDError(f"{self.name}: the public sides must come first (use_public_sides)")
        c = ctx.common
        dev = resolve_device(c.get("device", "auto"))
        engine = "vmap" if c.get("engine", "auto") == "auto" else c["engine"]  # per-example rows by construction (as DPGSD)
        m = int(self.config.gradients.examples)
        y = sample_labels(sample, c["labels"], c["num_classes"], c["seed"], rng=self.rng)
        p = self.basis.shape[0]
        cs = c.get("chunk_size") or default_chunk_size(dev, p)
        info: dict = {}
        parts = []  # chunk by chunk: only m x D numbers are kept, never the m x p matrix
        for start, x in sample.batches(c["input_size"], c["channels"], cs, dev):
            Gc = gradient_matrix(ctx.model, iter([(x, y[start : start + x.shape[0]])]), x.shape[0], c["names"], c.get("loss"),
                                 engine, dev, c["row_norm"], None, info)
            parts.append(project_rows(Gc, self.basis).cpu())
            del Gc
        P = torch.cat(parts) if parts else torch.zeros(0, self.basis.shape[1], dtype=torch.float64)
        if c.get("progress") is not None:  # m of m under the DP name, whose time the CLI withholds (as DP-GSD's)
            c["progress"](sample.source.name + DP_PROGRESS, m, m)
        self.engine_used = info.get("engine", engine)
        return P

    def private_side(self, ctx: SideContext, sample: gdata.Sample) -> EnergySide:
        P = self.projected_rows(ctx, sample)
        pv = self.config.privacy
        s = private_energies(P, self.W, float(pv.epsilon), float(pv.clip), self.lam, self.rng)
        return EnergySide(sample.source.name, int(self.config.gradients.examples), 0.0, self.engine_used,
                          energies=dict(zip(self.names, s.tolist())))

    def compare(self, private: EnergySide, public: Subspace) -> tuple[float, list[float]]:
        m, C = int(self.config.gradients.examples), float(self.config.privacy.clip)
        e = private.energies[public.name]
        return math.sqrt(min(1.0, max(0.0, 1.0 - e / (m * C * C)))), []

    def report(self, ctx: SideContext, rows: list) -> tuple[dict, list[str], bool]:
        pv, g, ins = self.config.privacy, self.config.gradients, self.config.privacy.insecure_seed
        lam = getattr(self, "lam", None)
        b = None if lam is None else laplace_scale(float(pv.epsilon), float(pv.clip), lam)
        privacy = self.shared_privacy()  # not DP-GSD's sampler, bound or sketch: the Laplace mechanism's own fields
        privacy.update(
            mechanism="laplace-energy", exact=True, delta=0.0, release="noisy order",
            what_is_dp="noisy order of all candidates, each score Laplace-noised (every candidate's DP energy distance)",
            guarantee=("pure epsilon-DP: the Laplace mechanism on the K candidates' energies, L1 sensitivity "
                       "2 C^2 Lambda (one row replaced), Lambda = lambda_max(sum_j V_j V_j^T) from the public subspaces"),
            sensitivity_lambda=lam, laplace_scale=b,
        )
        notes = [INSECURE_NOTE.format(seed=ins)] if ins is not None else []
        m = int(g.examples)
        if b is not None and b / (m * float(pv.clip) ** 2) > 0.01:
            notes.append(f"the Laplace noise (scale {b:.3g}) moves each energy share by about {b / (m * float(pv.clip) ** 2):.2g} "
                         f"of m C^2: candidates whose shares differ by less are tied; raise --epsilon or -m")
        return privacy, notes, ins is None
