"""The trainers: a :class:`Method` is a :class:`~gsd_cli.train.transforms.Chain` of per-sample
gradient transforms plus the dp-accounting event of one of its steps; :func:`build_method` makes the
one ``TrainConfig.method`` names. DP-SGD and GEP (paper 000), and the other trainers of the source
papers: RGP (paper 001), TopAgg (paper 002), and random sparsification (paper 003) on top of DP-SGD
or GEP.

The other trainers are each one Poisson-subsampled Gaussian mechanism per step under add/remove-one neighbours, accounted
by the same accountant as DP-SGD and GEP (:mod:`gsd_cli.privacy`):

========== ======================================================= ================ ==================
method     released per step                                       L2 sensitivity   noise std
========== ======================================================= ================ ==================
rgp        sum of clipped carrier gradients (all layers' dL, dR     C                sigma C
           and the other parameters' gradients, one vector)
topagg     sum of NormTopK(clip_C(g_i), K)                          sqrt(K) C        sqrt(K) sigma C
dpsgd+RS   sum of clip_C(mask * g_i), masked after the noise        C                sigma C
gep+RS     GEP's embedding and residual of mask * g_i               S1, S2           sigma S1, sigma S2
========== ======================================================= ================ ==================

so every one has noise multiplier sigma on its single release (GEP: two releases of one subsample,
effective multiplier sigma / sqrt(2)), and :func:`~gsd_cli.train.transforms.chain_step_event` checks
before training that the noise each chain adds is exactly the accounted one for its norm bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from ..privacy import dpsgd_step_event, gep_step_event
from .config import TrainConfig
from .gep import Anchor, GEPProject, GEPReconstruct
from .rgp import RGP, RGPCarriers, RGPReconstruct
from .sparsify import MaskedGradients, RandomSparsify, SparsifyRelease
from .topagg import NormTopK, topagg_sensitivity
from .transforms import Chain, clip, gaussian_noise

PRIVACY = {
    "dpsgd": "each step clips every per-sample gradient to C and adds N(0, (sigma C)^2 I) to the sum of a Poisson subsample: "
             "a subsampled Gaussian with multiplier sigma",
    "gep": "embedding (clip S1, noise sigma S1) and residual (clip S2, noise sigma S2) of one Poisson subsample: one subsampled "
           "Gaussian with multiplier sigma / sqrt(2); the public anchors cost nothing, and neither does reusing their basis "
           "(--anchor-every, --anchor-warm: it is built from public data and released weights only)",
    "rgp": "the per-sample gradients of the low-rank carriers (and of the parameters not reparametrized) are clipped to C as one "
           "vector and N(0, (sigma C)^2 I) is added to their sum: a subsampled Gaussian with multiplier sigma; the carriers come "
           "from released weights only",
    "topagg": "clip to C, then NormTopK (norm <= sqrt(K) C: sensitivity sqrt(K) C), noise N(0, K sigma^2 C^2 I): a subsampled "
              "Gaussian with multiplier sigma, the same epsilon as DP-SGD with sigma",
    "second-phase": "stage 1 trains on public data only (no privacy cost); stage 2 is DP-SGD: clip C, noise N(0, (sigma C)^2 I) "
                    "on the sum of a Poisson subsample, a subsampled Gaussian with multiplier sigma",
    "sparsify": "the random mask is independent of the data (seeded by --seed and the epoch): same mechanism, same epsilon as "
                "without it; the noise outside the mask is dropped (post-processing)",
}


@dataclass
class Method:
    """A trainer: its transform chain and the dp-accounting event of one step as a function of sigma."""

    chain: Chain
    step_event: Callable[[float], object]
    description: str
    details: dict = field(default_factory=dict)
    # per-sample gradients of one chunk, (model, names, x, y, ctx) -> parts; None: the full per-sample
    # gradients {"grad": G} (RGP computes the gradients of its carriers instead); ``.width`` is the
    # row width of its parts (for an empty subsample)
    per_sample: Callable | None = None
    # DP-SGD's clipped sums by ghost norms and book-keeping (a :class:`~gsd_cli.train.clipsum.step.LazyClipSum`;
    # None: the per-sample gradient matrix); the path is chosen on the first chunk (``--clip-engine``)
    clip_sum: object | None = None


def build_method(cfg: TrainConfig, sigma: float, anchor: Anchor | None = None, *, model=None, names=None, rgp=None) -> Method:
    """The transform chain of ``cfg.method`` with noise multiplier ``sigma`` (``model`` and ``names``
    for RGP, or an :class:`~gsd_cli.train.rgp.RGP` state ``rgp`` to share)."""
    if cfg.method in ("rgp", "topagg"):
        return _with_rows(cfg, build_other(cfg, sigma, model=model, names=names, rgp=rgp))
    if cfg.sparsify:
        return _with_rows(cfg, sparsified(cfg, build_method(dataclasses.replace(cfg, sparsify=0.0), sigma, anchor), anchor))
    if cfg.method in ("dpsgd", "second-phase"):  # second-phase: stage 2 is DP-SGD from theta_0
        ch = Chain(clip(cfg.clip), gaussian_noise(sigma * cfg.clip, "grad", sensitivity=cfg.clip))
        fused = None
        if getattr(cfg, "clip_engine", "auto") != "materialise":
            from .clipsum.step import LazyClipSum, fusable

            assert fusable(ch)
            fused = LazyClipSum(cfg.clip_engine, cfg.clip)
        return Method(ch, dpsgd_step_event, "DP-SGD: clip each per-sample gradient to C, sum, add N(0, (sigma C)^2 I)",
                      clip_sum=fused)
    assert anchor is not None
    s1, s2 = cfg.clip_embedding, cfg.clip_residual
    parts = [GEPProject(anchor, residual=cfg.residual), clip(s1, "embedding")]
    if cfg.residual:
        parts.append(clip(s2, "residual"))
    parts.append(gaussian_noise(sigma * s1, "embedding", sensitivity=s1))
    if cfg.residual:
        parts.append(gaussian_noise(sigma * s2, "residual", sensitivity=s2))
    parts.append(GEPReconstruct(anchor))
    if cfg.residual:
        m = Method(Chain(*parts), lambda z: gep_step_event(z, z),
                   "GEP: embedding (clip S1, noise sigma S1) and residual (clip S2, noise sigma S2) of one subsample")
    else:
        m = Method(Chain(*parts), lambda z: gep_step_event(z, None), "B-GEP: embedding only (clip S1, noise sigma S1)")
    if getattr(cfg, "clip_engine", "auto") != "materialise":  # the residual's clipped sum without R (gep.sums)
        from .gep.sums import GEPClipSum

        m.clip_sum = GEPClipSum(cfg.clip_engine, anchor, s1, s2 if cfg.residual else None)
        return m
    return _with_rows(cfg, m)


def _with_rows(cfg, method: Method) -> Method:
    """A method whose chain needs every example's vector (GEP, TopAgg, random sparsification): its
    per-sample gradients by the per-layer rules where the model allows them
    (:meth:`~gsd_cli.train.clipsum.step.LazyClipSum.rows`; ``--clip-engine materialise``: torch.func's vmap).
    RGP computes its own (carrier) gradients."""
    if method.per_sample is None and getattr(cfg, "clip_engine", "auto") != "materialise":
        from .clipsum.step import LazyClipSum

        method.clip_sum = LazyClipSum(cfg.clip_engine, None)
    return method


def build_other(cfg, sigma: float, *, model=None, names=None, rgp: RGP | None = None):
    """RGP or TopAgg as a :class:`Method` with noise multiplier ``sigma``."""
    C = cfg.clip
    if cfg.method == "topagg":
        s = topagg_sensitivity(C, cfg.topk_fraction)
        ch = Chain(clip(C), NormTopK(cfg.topk_fraction), gaussian_noise(sigma * s, "grad", sensitivity=s))
        return Method(ch, dpsgd_step_event,
                      f"TopAgg: clip to C, NormTopK(K={cfg.topk_fraction:g}), sum, add N(0, K sigma^2 C^2 I) (sensitivity sqrt(K) C)",
                      {"topagg": {"topk_fraction": cfg.topk_fraction, "sensitivity": s, "noise_std": sigma * s}})
    assert cfg.method == "rgp"
    if rgp is None:
        if model is None or names is None:
            raise ValueError("RGP needs the model and the trained parameter names")
        rgp = RGP(model, names, cfg.rgp_rank, cfg.power_iters, cfg.rgp_warmup, cfg.seed)
    ch = Chain(RGPCarriers(rgp), clip(C), gaussian_noise(sigma * C, "grad", sensitivity=C), RGPReconstruct(rgp))
    per_sample = rgp.per_sample
    full = sum(rgp.sizes.values())
    details = {
        "rgp": {"rank": cfg.rgp_rank, "power_iters": cfg.power_iters, "warmup_steps": cfg.rgp_warmup,
                "layers": [{"name": l.mname, "shape": list(l.shape), "rank": l.r} for l in rgp.layers],
                "per_example_floats": rgp.width, "full_per_example_floats": full},
        "rgp_state": rgp,
    }
    m = Method(ch, dpsgd_step_event,
               f"RGP: rank-{cfg.rgp_rank} carrier gradients ({rgp.width} of {full} coordinates per example) clipped to C, "
               "N(0, (sigma C)^2 I) on their sum, update reconstructed by Eq. 3", details)
    m.per_sample = _PerSample(per_sample, rgp)
    if getattr(cfg, "clip_engine", "auto") != "materialise":  # the clipped sums of the carriers by ghost clipping
        from .clipsum.step import RGPClipSum, fusable

        assert fusable(ch)
        m.clip_sum = RGPClipSum(cfg.clip_engine, C, rgp)
    return m


class _PerSample:
    """The loop's per-sample hook with the row width it produces (for an empty subsample)."""

    def __init__(self, fn, rgp: RGP):
        self.fn = fn
        self.rgp = rgp

    @property
    def width(self) -> int:
        return self.rgp.width

    def __call__(self, model, names, x, y, ctx):
        return self.fn(model, names, x, y, ctx)


def sparsified(cfg, method, anchor=None):
    """``method`` (DP-SGD or GEP) with random sparsification at final rate ``cfg.sparsify``: the mask
    before everything (before clipping; GEP: before the projection, and on the anchor gradients) and
    on the released update."""
    rs = RandomSparsify(cfg.sparsify, cfg.seed)
    if anchor is not None:
        if isinstance(anchor.gradients, MaskedGradients):
            anchor.gradients.rs = rs
        else:
            anchor.gradients = MaskedGradients(anchor.gradients, rs)
    ch = Chain(rs, *method.chain.transforms, SparsifyRelease(rs))
    details = {**method.details, "sparsify": {"final_rate": cfg.sparsify, "schedule": "linear 0 -> R over epochs (gradual cooling)",
                                              "refresh": "once per epoch"}}
    return type(method)(ch, method.step_event, method.description + f"; random sparsification (final rate {cfg.sparsify:g}, "
                        "mask independent of the data, before clipping)", details, method.per_sample)


def method_privacy(method: str, sparsify: float = 0.0) -> str:
    """The privacy statement of ``method`` (``--help``, README, ``gsd compare``)."""
    text = PRIVACY[method]
    return text + ("; with --sparsify: " + PRIVACY["sparsify"] if sparsify else "")


__all__ = ["Method", "build_method", "build_other", "sparsified", "method_privacy", "PRIVACY"]
