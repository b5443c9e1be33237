"""Gradient Embedding Perturbation (paper 000): the anchor subspace and the two GEP transforms.

Each step (Algorithm 2, line 4) computes per-sample gradients of m public *anchor* examples at the
current weights, randomly labelled (paper 000 Sec. 5: "labeled randomly at each update"; the labels
are redrawn each step from the seed), and from them, per parameter group, an orthonormal basis B_g
(k_g x p_g) by the power method of Algorithm 1:

    B ~ N(0, 1)^{k x p};  repeat t times:  A = G_a B^T,  B = A^T G_a,  orthonormalise the rows of B.

The quota k is shared by the groups in proportion to sqrt(group size) (paper 000 Sec. 3.2,
"Parameter grouping"; rounded down as the authors' code does, at least 1, at most min(m, p_g)).

The private per-sample gradients G (n x p) are then split (Algorithm 1, lines 4-5) into the embedding
W = G B^T (the groups' embeddings concatenated, n x sum k_g) and the residual R = G - W B, computed
from the *unclipped* W; both are clipped and noised by the generic transforms, and the noisy sums are
mapped back, v = w~ B + r~ (line 8; the residual is dropped for B-GEP). Under ``--clip-engine`` auto
or ghost the residual's clipped sum comes from B's orthonormal rows without forming R
(:mod:`gsd_cli.train.gep.sums`: ||r_i||^2 = ||g_i||^2 - ||w_i||^2, the same clips and noise).

Reusing the basis (``every`` > 1, ``warm``; issue 21). Paper 000 recomputes the anchor gradients and
B at every step (Algorithm 2, line 4), which makes a GEP step many times a DP-SGD step: per-sample
gradients of m anchors plus 2mkp multiply-adds per power iteration (Sec. 3.3). :class:`Anchor` can
instead recompute B every ``every`` steps (always at an epoch's first step, so a run resumed from an
epoch checkpoint recomputes exactly the bases an uninterrupted run used) and keep it in between, and
with ``warm`` start each recomputation's power iteration from the previous basis instead of a Gaussian
matrix (subspace tracking: the iterations accumulate across refreshes; cold again at each epoch's
first step, for the same reason). ``every=1, warm=False`` is the paper's algorithm, bit for bit.
``batch`` = b < m uses, at each recomputation, max(b, k) anchors drawn uniformly without replacement
from the m (a public draw from (seed, step)), so the pool stays m while each recomputation costs b
per-sample gradients; with ``warm`` the basis tracks the subspace across draws (paper 000 Appendix C,
Table 6: m = 1000, 2000, 4000 move GEP's CIFAR-10 accuracy by 0.2-0.4 points, within about one sd).
``batch`` None or 0: all m, as the paper.

Privacy: neither choice changes the accounting. B is a function of the public anchors, their seeded
random labels and the current weights only; the weights are the post-processing of earlier noisy
releases. Paper 000 Sec. 3.1: "All these matrices are publishable because D^(a) is non-sensitive",
and the proof of Theorem 3.1 bounds the sensitivities by the clipping alone, for any given B
(max ||w - w'|| = max ||W_n,:|| <= S1, max ||r - r'|| <= S2); Theorem 3.2 then composes the T steps by
RDP composition, which holds for adaptively chosen mechanisms. A stale or warm-started B is such a
given B: it is built from nothing but the previous basis (itself public) and public data (a draw of
the anchors that depends on the public seed and step only), never from a private gradient, embedding
or residual. So every step is the same subsampled Gaussian whatever
``every`` and ``warm`` are.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import fnmatch

import numpy as np
import torch

from ...errors import GSDError
from ..config import DEFAULT_ANCHOR_BATCH, check_anchor_batch, check_anchor_every, parse_groups
from ..transforms import Parts, StepContext, Transform


def split_groups(names: Sequence[str], sizes: Sequence[int], groups: Sequence[Sequence[str]] | None) -> list[list[int]]:
    """Column-index lists, one per group, over the flattened parameter vector (parameters in ``names``
    order, each flattened). ``groups``: glob patterns per group; a parameter goes to the first group
    that matches it; parameters no group matches form one more group. ``None``: one group."""
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    if not groups:
        return [list(range(int(offsets[-1])))]
    member: list[list[int]] = [[] for _ in groups]
    rest: list[int] = []
    for i, n in enumerate(names):
        cols = list(range(int(offsets[i]), int(offsets[i + 1])))
        for g, pats in enumerate(groups):
            if any(fnmatch.fnmatch(n, p) for p in pats):
                member[g].extend(cols)
                break
        else:
            rest.extend(cols)
    for g, pats in enumerate(groups):
        if not member[g]:
            raise GSDError(f"GEP group {','.join(pats)!r} matches no trained parameter; names look like {', '.join(names[:4])}")
    if rest:
        member.append(rest)
    return member


def share_quota(k: int, group_sizes: Sequence[int], m: int) -> list[int]:
    """k_g = floor(k sqrt(p_g) / sum_j sqrt(p_j)), clamped to [1, min(m, p_g)] (paper 000 Sec. 3.2)."""
    if k < 1:
        raise GSDError(f"--k (GEP basis size) must be at least 1 (got {k})")
    roots = [math.sqrt(p) for p in group_sizes]
    total = sum(roots)
    return [max(1, min(int(k * r / total), m, p)) for r, p in zip(roots, group_sizes)]


def clamp_notes(k: int, group_sizes: Sequence[int], m: int, asked_batch: int | None, batch: int, ks: Sequence[int]) -> list[str]:
    """One line per setting GEP could not take as given (all public numbers): ``--anchor-batch`` above the
    public examples (but for the default, :data:`~gsd_cli.train.config.DEFAULT_ANCHOR_BATCH`, which means "that many,
    or all of fewer": a run that never set it was warned twice about it) or below ``--k``, and ``--k`` above what the groups can hold (each group's share at
    most the anchors of a recomputation and its parameter count: :func:`share_quota`)."""
    notes = []
    if asked_batch and int(asked_batch) > m and int(asked_batch) != DEFAULT_ANCHOR_BATCH:  # the default takes all of fewer
        notes.append(f"--anchor-batch {asked_batch} is more than the {m} public examples: every basis recomputation uses all {m}")
    elif asked_batch and int(asked_batch) < batch:
        notes.append(f"--anchor-batch {asked_batch} is below --k {k}: raised to {batch} anchors per basis recomputation")
    total = sum(math.sqrt(p) for p in group_sizes)
    if any(int(k * math.sqrt(p) / total) > min(batch, p) for p in group_sizes):
        notes.append(f"--k {k} is more than GEP's basis can hold here: it uses {sum(ks)} directions in {len(ks)} group(s) (each "
                     f"group's share at most the {batch} anchors of a recomputation and its parameter count); lower --k, "
                     "or give more --public-examples / --anchor-batch")
    return notes


def power_basis(G: torch.Tensor, k: int, iters: int, generator: torch.Generator | None,
                start: torch.Tensor | None = None) -> torch.Tensor:
    """Algorithm 1 stage 1 on one group: orthonormal rows B (k x p) spanning approximately the top-k
    right singular subspace of G (m x p). The products run in G's precision (the basis is an
    approximation by design); the orthonormalisation (QR of the p x k matrix) in float64, so that
    B B^T = I to rounding and B-GEP's reconstruction is a projection. ``start``: a k x p matrix to
    start from (a warm start: the previous basis) instead of a Gaussian one from ``generator``.
    Everything stays on G's device."""
    if start is not None:
        if tuple(start.shape) != (k, G.shape[1]):
            raise ValueError(f"warm start of shape {tuple(start.shape)}, expected {(k, G.shape[1])}")
        B = start.to(G.device, G.dtype)
    else:
        B = torch.randn(k, G.shape[1], generator=generator, dtype=torch.float64).to(G.device, G.dtype)
    for _ in range(max(1, iters)):
        A = G @ B.T  # m x k
        B = A.T @ G  # k x p
        Q, _ = torch.linalg.qr(B.T.double())  # orthonormal columns = orthonormal rows of B
        B = Q.T.to(G.dtype).contiguous()
    return B


def _as_index(cols: list[int]):
    """A slice when the columns are contiguous (views, no copies), else an index tensor."""
    if cols and cols[-1] - cols[0] + 1 == len(cols):
        return slice(cols[0], cols[-1] + 1)
    return torch.as_tensor(cols, dtype=torch.long)


class Anchor:
    """The anchor basis: public gradients at the current weights -> one basis per group, recomputed
    every ``every`` steps and at each epoch's first step (``every=1``: every step, as paper 000), each
    recomputation warm-started from the previous basis when ``warm`` (see the module docstring).
    ``refreshes`` counts the recomputations."""

    def __init__(
        self,
        public_x: torch.Tensor,
        num_classes: int,
        k: int,
        groups: list[list[int]],
        power_iters: int,
        seed: int,
        gradients: Callable[[torch.nn.Module, torch.Tensor, torch.Tensor, Sequence[str]], torch.Tensor],
        multilabel: bool = False,
        every: int = 1,
        warm: bool = False,
        batch: int | None = None,
    ):
        check_anchor_every(every)
        check_anchor_batch(batch)
        self.x = public_x
        self.num_classes = num_classes
        self.groups = [_as_index(list(g)) for g in groups]
        self.p = sum(len(g) for g in groups)
        m = public_x.shape[0]  # never fewer anchors than basis directions: k_g <= the anchors used
        self.batch = m if not batch else min(max(int(batch), k), m)
        self.ks = share_quota(k, [len(g) for g in groups], self.batch)
        self.notes = clamp_notes(k, [len(g) for g in groups], m, batch, self.batch, self.ks)  # public: said, not silent
        self.power_iters = power_iters
        self.seed = seed
        self.gradients = gradients
        self.multilabel = multilabel
        self.every = int(every)
        self.warm = bool(warm)
        self.bases: list[torch.Tensor] = []
        self.step = -1  # the step whose basis is held
        self.refreshed_at = -1  # the step whose anchor gradients made the held basis
        self.epoch = -1  # the epoch of that step
        self.refreshes = 0

    @property
    def k(self) -> int:
        return sum(self.ks)

    def labels(self, step: int) -> torch.Tensor:
        """Uniformly random labels in the model's label space, redrawn every step from (seed, step)."""
        gen = torch.Generator().manual_seed(int(np.random.default_rng([self.seed, step, 7]).integers(2**62)))
        m = self.x.shape[0]
        if self.multilabel:
            return torch.randint(0, 2, (m, self.num_classes), generator=gen).float()
        return torch.randint(0, self.num_classes, (m,), generator=gen)

    def rows(self, step: int) -> torch.Tensor | None:
        """The anchors of a recomputation at ``step``: ``batch`` of the m drawn uniformly without
        replacement from (seed, step) (public randomness), in increasing order; None: all m."""
        m = self.x.shape[0]
        if self.batch >= m:
            return None
        gen = torch.Generator().manual_seed(int(np.random.default_rng([self.seed, step, 13]).integers(2**62)))
        return torch.randperm(m, generator=gen)[: self.batch].sort().values

    def settings(self) -> dict:
        """The basis settings, for the run's summary."""
        return {"power_iters": self.power_iters, "anchor_every": self.every, "anchor_warm": self.warm,
                "anchor_batch": self.batch}

    def due(self, ctx: StepContext) -> bool:
        """Whether step ``ctx.step`` recomputes the basis: no basis yet, a new epoch, or ``every``
        steps since the last recomputation."""
        return (not self.bases or ctx.epoch != self.epoch or not 0 <= ctx.step - self.refreshed_at < self.every)

    def compute(self, ctx: StepContext) -> None:
        """The basis of step ``ctx.step``: recomputed when :meth:`due`, else the held one."""
        if self.step == ctx.step:
            return
        if not self.due(ctx):
            self.step = ctx.step
            return
        # Only public inputs: the anchors, their labels from (seed, step), the current weights and, for
        # a warm start, the previous basis (made of the same). No private gradient reaches B.
        starts = self.bases if self.warm and self.bases and ctx.epoch == self.epoch else [None] * len(self.ks)
        x, y, rows = self.x, self.labels(ctx.step), self.rows(ctx.step)
        if rows is not None:  # a public draw of ``batch`` anchors (labels drawn for all m, then taken)
            x, y = x[rows.to(x.device)], y[rows]
        G = self.gradients(ctx.model, x, y, ctx.names)
        gen = torch.Generator().manual_seed(int(np.random.default_rng([self.seed, ctx.step, 11]).integers(2**62)))
        self.bases = [power_basis(G[:, self._on(idx, G)], kg, self.power_iters, gen, start)
                      for idx, kg, start in zip(self.groups, self.ks, starts)]
        del G
        self.step = self.refreshed_at = ctx.step
        self.epoch = ctx.epoch
        self.refreshes += 1

    @staticmethod
    def _on(idx, t: torch.Tensor):
        return idx if isinstance(idx, slice) else idx.to(t.device)

    def embed(self, G: torch.Tensor) -> torch.Tensor:
        """W = [G_g B_g^T]_g, n x k."""
        return torch.cat([G[:, self._on(idx, G)] @ B.T.to(G.dtype) for idx, B in zip(self.groups, self.bases)], dim=1)

    def back(self, W: torch.Tensor) -> torch.Tensor:
        """W B: map embeddings (n x k, or k) back to parameter space."""
        squeeze = W.dim() == 1
        W2 = W.unsqueeze(0) if squeeze else W
        out = torch.empty(W2.shape[0], self.p, dtype=W2.dtype, device=W2.device)
        col = 0
        for idx, B in zip(self.groups, self.bases):
            kg = B.shape[0]
            out[:, self._on(idx, out)] = W2[:, col : col + kg] @ B.to(W2.dtype)
            col += kg
        return out[0] if squeeze else out


class GEPProject(Transform):
    """Algorithm 1, lines 4-5: ``grad`` -> ``embedding`` = G B^T and ``residual`` = G - (G B^T) B
    (from the unclipped embedding); ``residual=False`` (B-GEP) drops the residual."""

    def __init__(self, anchor: Anchor, residual: bool = True):
        self.anchor = anchor
        self.residual = residual

    def begin_step(self, ctx: StepContext) -> None:
        self.anchor.compute(ctx)

    def per_example(self, parts: Parts, ctx: StepContext) -> Parts:
        G = parts.pop("grad")
        W = self.anchor.embed(G)
        out = {**parts, "embedding": W}
        if self.residual:
            R = G - self.anchor.back(W)
            out["residual"] = R
            err = ctx.info.setdefault("residual_ratio", [0.0, 0.0])
            err[0] += float(torch.linalg.vector_norm(R)) ** 2
            err[1] += float(torch.linalg.vector_norm(G)) ** 2
        return out

    def norm_bounds(self, bounds: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in bounds.items() if k != "grad"}  # embedding and residual start unbounded


class GEPReconstruct(Transform):
    """Algorithm 1, line 8: v = w~ B + r~ (just w~ B when the residual is not released)."""

    def __init__(self, anchor: Anchor):
        self.anchor = anchor

    def aggregated(self, parts: Parts, ctx: StepContext) -> Parts:
        parts = dict(parts)
        v = self.anchor.back(parts.pop("embedding"))
        if "residual" in parts:
            v = v + parts.pop("residual")
        parts["grad"] = v
        return parts


def anchor_for(cfg, public_x: torch.Tensor, model: torch.nn.Module, names: Sequence[str], num_classes: int,
               multilabel: bool, chunk: int, device: torch.device) -> Anchor:
    """The :class:`Anchor` of a ``gsd train`` run (``cfg``: its :class:`~gsd_cli.train.config.TrainConfig`):
    the public examples ``public_x`` (on ``device``), the groups of ``cfg.groups``, per-sample anchor
    gradients in chunks of ``chunk`` on ``device`` (the basis then lives there too), and
    ``cfg.anchor_every`` / ``cfg.anchor_warm`` / ``cfg.anchor_batch``. The anchor gradients come from the
    per-layer rules of the private rows (:meth:`~gsd_cli.train.clipsum.step.LazyClipSum.rows`: checked once,
    on a synthetic batch, and the engine kept across recomputations, instead of a fresh engine whose
    independence check recomputes a chunk at every recomputation), else the ``auto`` per-sample engine
    (:mod:`gsd_cli.gradients.engines`: vmap where the rules refuse the model); ``cfg.clip_engine ==
    "materialise"`` keeps vmap."""
    from ...gradients import gradient_matrix
    from ..clipsum.step import LazyClipSum

    params = dict(model.named_parameters())
    groups = split_groups(names, [params[n].numel() for n in names], parse_groups(cfg.groups, cfg.model))
    kept: dict = {}

    def anchor_grads(model_, x, y, names_):
        if engine == "auto":
            key = (id(model_), tuple(names_))
            rows = kept.get(key) or kept.setdefault(key, LazyClipSum("auto", None))
            wanted = set(names_)
            G = torch.empty(x.shape[0], sum(q.numel() for n, q in model_.named_parameters() if n in wanted), device=device)
            if all(rows.rows(model_, names_, x[i : i + chunk].to(device), y[i : i + chunk].to(device), G[i : i + chunk])
                   for i in range(0, x.shape[0], chunk)):
                return G
        batches = ((x[i : i + chunk], y[i : i + chunk]) for i in range(0, x.shape[0], chunk))
        return gradient_matrix(model_, batches, x.shape[0], names_, None, engine, device, "none")

    engine = "vmap" if getattr(cfg, "clip_engine", "auto") == "materialise" else "auto"
    return Anchor(public_x, num_classes, cfg.k, groups, cfg.power_iters, cfg.seed, anchor_grads, multilabel,
                  every=cfg.anchor_every, warm=cfg.anchor_warm, batch=getattr(cfg, "anchor_batch", None))
