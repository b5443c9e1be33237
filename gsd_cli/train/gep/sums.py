"""GEP's clipped sums without the per-example residual vectors (issue 37): the step of
``--clip-engine auto``/``ghost`` for GEP (``--clip-engine materialise`` keeps the transform chain's
per-example path, :class:`~gsd_cli.train.gep.GEPProject` then the two clips).

Paper 000, Algorithm 1, lines 4-7: with the anchor basis B (k x p, orthonormal rows), each example's
gradient g_i splits into its embedding w_i = B g_i (k) and its residual r_i = g_i - B^T w_i (p); w_i is
clipped to S1, r_i to S2, each sum gets its noise. Only the clip weights of the residuals need
per-example information, and B's orthonormal rows give them without forming r_i:

    ||r_i||^2 = ||g_i||^2 - ||w_i||^2                       (Pythagoras: r_i is orthogonal to B's rows)
    sum_i c_i r_i = sum_i c_i g_i - B^T (sum_i c_i w_i)     (c_i = min(1, S2 / ||r_i||))

so the residual side is one weighted sum of the chunk's gradient rows (c^T G) and one k-vector mapped
back, instead of the n x p matrix R = G - W B (an n x k x p product) and its norms. The embedding is
the chain's: W = G B^T (:meth:`~gsd_cli.train.gep.Anchor.embed`) clipped by the same
:class:`~gsd_cli.train.transforms.Clip`.

Float tolerance. ||g||^2 - ||w||^2 cancels when g_i lies almost in B's span: its absolute error is
about float32 rounding times ||g_i||^2 (W is a float32 product; B's rows are orthonormal to float32
rounding), so the relative error of ||r_i||^2 grows as ||g_i||^2 / ||r_i||^2. Every example whose
residual holds less than ``EXACT_BELOW`` of its squared norm (||r_i||^2 < 0.1 ||g_i||^2 by the identity)
therefore takes the chain's own computation instead: r_i = g_i - w_i B formed, its norm, and c_i r_i
added as that vector, exactly as the materialised path releases it. For the others the identity's
relative error in ||r_i||^2 is at most about 10 times float32 rounding (measured: below 1e-5;
``tests/test_gep_sum.py`` checks near-in-subspace gradients). An example whose gradient or embedding
is not finite contributes zero to both sums, as :class:`~gsd_cli.train.transforms.Clip` zeroes it.
How many examples take the formed residual depends on the private gradients: it changes the step's
time (k p multiply-adds per such example), never what the step releases.

The mechanism is unchanged: the same embedding and residual, clipped to the same S1 and S2, the same
noise (the chain's :class:`~gsd_cli.train.transforms.GaussianNoise` on the two sums) and the same
accounting; the sums equal the per-example path's to float rounding (tests against it)."""

from __future__ import annotations

import torch

from ..transforms import Clip

#: residual share of ||g_i||^2 below which an example's residual is formed (cancellation; docstring)
EXACT_BELOW = 0.1


def gep_clipped_sums(G: torch.Tensor, anchor, s1: float, s2: float | None, ctx) -> dict:
    """The float64 sums ``{"embedding": sum_i clip_S1(w_i), "residual": sum_i clip_S2(r_i)}`` of one
    chunk's gradient rows ``G`` (n x p) on ``anchor``'s basis (``s2`` None: B-GEP, the embedding only),
    with the chain's metrics in ``ctx.info`` (clipped counts, the residual ratio)."""
    W = anchor.embed(G)
    out = {"embedding": Clip(s1, "embedding").per_example({"embedding": W}, ctx)["embedding"].sum(0, dtype=torch.float64)}
    if s2 is None:
        return out
    sqg = torch.linalg.vector_norm(G, dim=1).double().pow(2)
    sqw = W.double().pow(2).sum(1)
    ok = torch.isfinite(sqg) & torch.isfinite(sqw)
    sqr = torch.where(ok, (sqg - sqw).clamp_min(0.0), torch.zeros_like(sqg))
    exact = ok & (sqr < EXACT_BELOW * sqg)
    fused = ok & ~exact
    res = torch.zeros(G.shape[1], dtype=torch.float64, device=G.device)
    norms = sqr.sqrt()
    c = torch.where(fused, (s2 / norms.clamp_min(1e-12)).clamp(max=1.0), torch.zeros_like(norms))
    if bool(fused.any()):  # c is 0 on the other rows; a non-finite row is zeroed first (0 * NaN is NaN)
        Gf, Wf = (G, W) if bool(ok.all()) else (torch.where(ok.view(-1, 1), G, 0.0), torch.where(ok.view(-1, 1), W, 0.0))
        cf = c.to(G.dtype)  # both products in the rows' precision (no float64 copy of G or B)
        res += (cf @ Gf).double() - anchor.back(cf @ Wf).double()
    clipped = int(((norms > s2) & fused).sum())
    if bool(exact.any()):  # the residual vectors of the examples near B's span, as GEPProject forms them
        Re = G[exact] - anchor.back(W[exact])
        ne = Re.norm(dim=1, keepdim=True)
        res += (Re * (s2 / ne.clamp_min(1e-12)).clamp(max=1.0)).sum(0, dtype=torch.float64)
        sqr[exact] = ne.squeeze(1).double().pow(2)
        clipped += int((ne > s2).sum())
    info = ctx.info.setdefault("clipped_residual", [0, 0])
    info[0] += clipped
    info[1] += G.shape[0]
    err = ctx.info.setdefault("residual_ratio", [0.0, 0.0])
    err[0] += float(torch.where(ok, sqr, torch.full_like(sqr, float("nan"))).sum())
    err[1] += float(sqg.sum())
    out["residual"] = res
    return out


class GEPClipSum:
    """The loop's hook for GEP's chain (:func:`~gsd_cli.train.step.private_step`'s ``clip_sum``): each
    chunk's gradient rows by the per-layer rules where the model allows them (``rows``: a
    :class:`~gsd_cli.train.clipsum.step.LazyClipSum` without a clip norm, vmap otherwise), then
    :func:`gep_clipped_sums`. ``reason`` says how the rows are computed."""

    def __init__(self, mode: str, anchor, s1: float, s2: float | None, loss=None):
        from ..clipsum.step import LazyClipSum

        self.rows_engine = LazyClipSum(mode, None, loss)
        self.anchor, self.s1, self.s2 = anchor, float(s1), None if s2 is None else float(s2)

    @property
    def reason(self) -> str:
        return "GEP residual by the orthogonal split; rows: " + (self.rows_engine.reason or "undecided")

    def rows(self, model, names, x, y, out) -> bool:
        return self.rows_engine.rows(model, names, x, y, out)

    def hook(self, model, names, x, y):
        return self

    def __call__(self, model, names, x, y, ctx) -> dict:
        from ..clipsum.step import gradient_rows

        wanted = set(names)
        p = sum(q.numel() for n, q in model.named_parameters() if n in wanted)
        return gep_clipped_sums(gradient_rows(self.rows_engine, model, names, x, y, p, ctx.device), self.anchor, self.s1, self.s2, ctx)


__all__ = ["EXACT_BELOW", "GEPClipSum", "gep_clipped_sums"]
