"""The private part of the DP feature probe (issue 52, item 1): which of M feature maps lets a linear
probe separate the private classes best, released as one index under differential privacy.

The non-private probe (:mod:`gsd_cli.advice.probe`) fits a ridge probe of the private examples on each
model's features and compares accuracies. Here the caller has already computed, by public functions
(stage 1 of the second phase on public data, then the input of the head), the feature matrix of the
same n private examples under each of M models: index 0 is the untrained model, 1..M-1 the
candidates' stage-1 models. This module sees only those matrices, the labels, and a partition of the
examples; it imports no model code. It releases one index (0: "no candidate helps") and nothing else
computed from the private data.

The mechanism
-------------
1. **Partition.** Each example goes to the fit part A or the score part B by a rule that looks at the
   example alone: :func:`split_parts`, the low bit of HMAC-SHA256(salt, identity). The identity must
   be a function of the example itself (e.g. a hash of its bytes), never of its position in the data
   set, or adding one example could move the others. The salt is the caller's (OS randomness,
   :func:`new_salt`); the proof below holds for every fixed salt, so its secrecy is not used.
2. **Features.** For model c and example x with feature vector phi (d_c numbers, any scale):
   f = concat(phi / ||phi||, [1]) / sqrt(2) (phi = 0 gives [0, ..., 0, 1] / sqrt(2)); D_c = d_c + 1.
   So ||f||_2 = 1 (1/sqrt(2) when phi = 0): in every case ||f||_2 <= 1. The constant coordinate is
   the probe's bias.
3. **Fit (part A; Gaussian mechanism).** Per model, T_c = (upper(S_c), vec(B_c)) with
   S_c = sum_{x in A} f f^T (its upper triangle with the diagonal, D_c (D_c + 1) / 2 numbers) and
   B_c = sum_{x in A} f y^T (y one-hot over C classes). Released: T_c + N(0, sigma^2 I),
   sigma = z sqrt(2), z the noise multiplier, i.i.d. noise from the caller's private generator.
4. **Solve (post-processing).** S~ = the noisy upper triangle mirrored to a symmetric matrix;
   W_c = (S~ + lambda_c I)^-1 B~ with lambda_c = ridge + sigma (2 sqrt(D_c) + 6) (:func:`ridge_lambda`,
   a public function of z, D_c and the public ``ridge``). S_c is positive semi-definite and the
   noise matrix E (symmetric, entries of std sigma) has ||E|| about 2 sigma sqrt(D_c) (its extreme
   eigenvalue), with Gaussian concentration of scale sigma above that (||E|| is a sqrt(2)-Lipschitz
   function of the released noise vector), so S~ + lambda_c I >= (lambda_c - ||E||) I is positive
   definite except with probability about exp(-9). If it is not (Cholesky fails), its eigenvalues
   are clipped at the floor ``ridge`` (:func:`ridge_weights`); either way W_c is a function of the
   release and public constants.
5. **Score (part B).** u_c = #{x in B : argmax_k (W_c^T f_c(x))_k = y(x)} (ties go to the first k);
   the untrained model's u_0 gets a public head start (:func:`head_start`, a function of M and
   epsilon_pf only), so that a candidate is chosen only when it beats the untrained model with confidence.
6. **Select.** permute-and-flip (:func:`gsd_cli.privacy.selection.permute_and_flip`) on u with
   epsilon_pf and sensitivity 1; the index it returns is the release.

Theorem
-------
Neighbours: add or remove one example (as everywhere in gsd, :mod:`gsd_cli.privacy.accountant`).
For every salt, every public ``ridge`` > 0, every z > 0 and epsilon_pf > 0, the released index
satisfies (alpha, rho(alpha))-RDP at every order alpha > 1 with

    rho(alpha) = M alpha / (2 z^2) + min(epsilon_pf, alpha epsilon_pf^2 / 2)      (:func:`selection_curve`)

and hence (epsilon(delta), delta)-DP for every delta in (0, 1), epsilon(delta) the conversion of that
curve at gsd's orders :data:`gsd_cli.privacy.budget.compose.ORDERS` by dp-accounting's
``compute_epsilon`` (Canonne, Kamath, Steinke 2020, Prop. 12; :func:`selection_epsilon`), the
conversion gsd uses for every RDP curve.

Proof.
(a) *Partition.* The part of x is a function of (salt, x) alone, so if D' = D + {x} then
    (D'_A, D'_B) = (D_A + {x}, D_B) or (D_A, D_B + {x}): each later step sees neighbouring or equal inputs.
(b) *Sensitivity of the fit statistics.* Adding x to A adds v(x) = (upper(f f^T), vec(f y^T)) to
    T_c (removing subtracts it), and
        ||upper(f f^T)||_2 <= ||f f^T||_F = ||f||^2 <= 1,   ||f y^T||_F = ||f|| ||y|| <= 1,
    so ||v(x)||_2 <= sqrt(1 + 1) = sqrt(2) =: Delta. (The bound is not attained by normalised
    features: sum_{i<=j} f_i^2 f_j^2 = (||f||^4 + sum_i f_i^4) / 2 <= 3/4 when one coordinate of f is
    1/sqrt(2), so their largest change is sqrt(7)/2 ~ 1.3229, reached when phi lies along a
    coordinate axis; sqrt(2) is reached by f = e_i, which step 2 never produces. The noise is
    calibrated to sqrt(2) all the same: conservative by 7%.)
(c) *Gaussian mechanism.* T_c + N(0, sigma^2 I) with L2 sensitivity Delta is
    (alpha, alpha Delta^2 / (2 sigma^2))-RDP = (alpha, alpha / (2 z^2))-RDP (Mironov 2017, Prop. 7;
    dp-accounting's ``GaussianDpEvent(z)``). The M releases use the same part A with independent
    noise; RDP curves of (adaptively) composed mechanisms add (Mironov 2017, Prop. 1): M alpha / (2 z^2).
(d) *Post-processing.* W_c depends on the data only through the release (lambda_c and the floor
    are public), so it costs nothing more (Mironov 2017, Prop. 2).
(e) *Selection.* For every fixed W (the released statistics fix it), adding or removing one
    example of B changes each u_c by 0 or 1 (the score counts examples one by one), and an example
    of A does not change u at all: per-coordinate sensitivity 1. Permute-and-flip with epsilon_pf and
    sensitivity 1 (the general epsilon / (2 Delta) of McKenna and Sheldon 2020, Algorithm 1 and their
    privacy theorem; the monotone form is not used) is epsilon_pf-DP, hence
    (alpha, min(epsilon_pf, alpha epsilon_pf^2 / 2))-RDP (:func:`gsd_cli.privacy.budget.compose.pure_dp_curve`:
    Mironov 2017 and Bun and Steinke 2016, Prop. 3.3). Its mechanism is chosen after (c) sees the
    release (adaptive), which Prop. 1 of Mironov 2017 allows: the curves add, giving rho.
(f) *Conversion.* compute_epsilon is a valid RDP-to-(epsilon, delta) conversion at each order; the
    minimum over the orders is then valid too.                                                  QED

This is *basic sequential* composition of the two parts: conservative. By (a) one example lands in
exactly one part, so parallel composition would give max(M alpha / (2 z^2), pure-DP curve) in place
of their sum; that tighter bound is not used.

Calibration (:func:`calibrate`): epsilon_pf = pf_share epsilon, and the smallest z (by bisection) with
selection_epsilon <= epsilon, tight within 1e-3 relative. Not every epsilon can be certified: as
z grows the curve tends to the pure-DP curve of epsilon_pf alone, whose conversion at gsd's orders
(the largest is 1024) is about epsilon_pf + 0.0035 at delta = 1e-5: with pf_share = 0.5, a target below
about 0.007 (e.g. 1e-3) is refused, with the figure.

Refusals. Those that depend on public inputs (epsilon, delta, the number of models, shapes) are
:class:`gsd_cli.errors.GSDError`; those that turn on private values (a label out of range, a feature
that is not a finite number) are :class:`gsd_cli.errors.PrivateError`. An empty part A or B is not
refused (its size is private): the mechanism runs and stays private.

Entry points: :func:`plan_dp_probe` fixes the public accounting (z, epsilon_pf, the curve) before any private
computation, so a caller books it first; :func:`run_dp_probe` runs the mechanism at the plan's numbers (the
call ``gsd audit --method dp-probe`` runs end to end, :mod:`gsd_cli.audit.dpprobe`); :func:`dp_probe` is both.

Randomness: the caller's private generator (:func:`gsd_cli.privacy.randomness.private_rng`), never
one seeded from a public seed. The module imports only numpy at import time (dp-accounting is loaded
by the accounting functions when called).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from ..errors import GSDError, PrivateError
from .probe_accounting import _check_delta, _check_positive, calibrate, selection_curve, selection_epsilon  # noqa: F401

#: the L2 sensitivity the fit statistics' noise is calibrated to (module docstring, proof (b))
FIT_SENSITIVITY = math.sqrt(2.0)
#: the per-coordinate sensitivity of the scores u (proof (e))
SCORE_SENSITIVITY = 1.0
#: the margin, in units of sigma, of the ridge above the noise matrix's edge 2 sigma sqrt(D)
RIDGE_MARGIN = 6.0
#: the shortest salt :func:`split_parts` accepts
MIN_SALT_BYTES = 16


# ------------------------------------------------------------------------------------------ the partition

def new_salt() -> bytes:
    """32 bytes from the operating system, for :func:`split_parts`."""
    return secrets.token_bytes(32)


def split_parts(identities: Sequence[str], salt: bytes) -> np.ndarray:
    """True (part A, fit) or False (part B, score) per example: the low bit of
    HMAC-SHA256(salt, identity). Each example's part depends on its own identity alone (module
    docstring, proof (a)); ``identities`` must be functions of the examples, not their positions."""
    if not isinstance(salt, (bytes, bytearray)) or len(salt) < MIN_SALT_BYTES:
        raise GSDError(f"the probe's salt must be at least {MIN_SALT_BYTES} bytes from the operating system (new_salt())")
    key = bytes(salt)
    out = np.empty(len(identities), dtype=bool)
    for i, ident in enumerate(identities):
        if not isinstance(ident, str):
            raise GSDError(f"an example's identity must be a string (got {type(ident).__name__})")
        out[i] = bool(hmac.new(key, ident.encode("utf-8"), hashlib.sha256).digest()[-1] & 1)
    return out


# ------------------------------------------------------------------------------------------ statistics

def normalise(phi: np.ndarray) -> np.ndarray:
    """(n, d) feature vectors -> (n, d + 1) rows concat(phi / ||phi||, [1]) / sqrt(2) (phi = 0:
    [0, ..., 0, 1] / sqrt(2)); computed without overflow for any finite scale."""
    phi = np.asarray(phi, dtype=np.float64)
    n, d = phi.shape
    scale = np.max(np.abs(phi), axis=1, keepdims=True) if d else np.zeros((n, 1))
    safe = np.where(scale > 0, scale, 1.0)
    unit = phi / safe
    norm = np.linalg.norm(unit, axis=1, keepdims=True)
    unit = np.where(norm > 0, unit / np.where(norm > 0, norm, 1.0), 0.0)
    return np.concatenate([unit, np.ones((n, 1))], axis=1) / math.sqrt(2.0)


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    y = np.zeros((len(labels), num_classes))
    y[np.arange(len(labels)), np.asarray(labels, dtype=np.int64)] = 1.0
    return y


@lru_cache(maxsize=64)
def _upper(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.triu_indices(dim)`` (row-major, with the diagonal), read-only and kept: it is a quarter of a
    release's time at the small dimensions the probe and its audit use."""
    rows, cols = np.triu_indices(dim)
    rows.setflags(write=False)
    cols.setflags(write=False)
    return rows, cols


def fit_statistics(f: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The exact statistic T = concat(upper(sum f f^T) incl. the diagonal, row-major; vec(sum f y^T))
    of normalised rows ``f`` (n, D) and one-hot ``y`` (n, C)."""
    f = np.asarray(f, dtype=np.float64)
    s = f.T @ f
    b = f.T @ np.asarray(y, dtype=np.float64)
    return np.concatenate([s[_upper(f.shape[1])], b.ravel()])


def noise_std(z: float) -> float:
    """sigma = z * sqrt(2): the std of each coordinate's Gaussian noise (proof (b), (c))."""
    return float(z) * FIT_SENSITIVITY


def noisy_fit_statistics(f: np.ndarray, y: np.ndarray, z: float, rng: np.random.Generator) -> np.ndarray:
    """The Gaussian mechanism of step 3: :func:`fit_statistics` + N(0, (z sqrt 2)^2 I) from ``rng``."""
    t = fit_statistics(f, y)
    return t + rng.normal(0.0, noise_std(z), size=t.shape)


def ridge_lambda(z: float, dim: int, ridge: float) -> float:
    """lambda = ridge + sigma (2 sqrt(D) + RIDGE_MARGIN): a public function of (z, D, ridge), above the
    noise matrix's extreme eigenvalue (about 2 sigma sqrt(D)) with high probability."""
    return float(ridge) + noise_std(z) * (2.0 * math.sqrt(dim) + RIDGE_MARGIN)


def unpack(t: np.ndarray, dim: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(S, B) from a (noisy) statistic: the upper triangle mirrored to a symmetric S, B as (D, C)."""
    k = dim * (dim + 1) // 2
    s = np.zeros((dim, dim))
    s[_upper(dim)] = t[:k]
    s = s + s.T - np.diag(np.diag(s))
    return s, np.asarray(t[k:], dtype=np.float64).reshape(dim, num_classes)


def ridge_weights(t: np.ndarray, dim: int, num_classes: int, z: float, ridge: float) -> np.ndarray:
    """W = (S~ + lambda I)^-1 B~ (step 4, post-processing); if S~ + lambda I is not positive definite,
    its eigenvalues are first clipped at ``ridge``."""
    s, b = unpack(t, dim, num_classes)
    a = s + ridge_lambda(z, dim, ridge) * np.eye(dim)
    try:
        np.linalg.cholesky(a)
        return np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        w, v = np.linalg.eigh(a)
        return v @ ((v.T @ b) / np.maximum(w, float(ridge))[:, None])


def scores(f: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> int:
    """u = #{x : argmax_k (W^T f(x))_k = y(x)} (ties: the first k)."""
    return 0 if len(labels) == 0 else int(np.sum(np.argmax(np.asarray(f) @ weights, axis=1) == np.asarray(labels)))


# ------------------------------------------------------------------------------------------ accounting
# selection_curve, selection_epsilon, calibrate: gsd_cli.privacy.probe_accounting (imported above)

# ------------------------------------------------------------------------------------------ the mechanism

@dataclass(frozen=True)
class DPProbePlan:
    """The DP probe's public accounting, fixed from public numbers before any private computation (so a
    caller books it first): ``models`` (M), the noise multiplier ``z`` and permute-and-flip's ``epsilon_pf``
    calibrated to the target, the certified ``epsilon`` (<= the target) at ``delta``, and the RDP ``curve``
    at gsd's orders (for the ledger)."""

    models: int
    z: float
    epsilon_pf: float
    epsilon: float
    delta: float
    curve: tuple


@dataclass(frozen=True)
class DPProbeRelease(DPProbePlan):
    """What the DP probe releases: the ``winner`` (0 = the untrained model, "no candidate helps") and the public
    accounting of its :class:`DPProbePlan`."""

    winner: int


def _validate(features, labels, parts, num_classes) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, int]:
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 2:
        raise GSDError(f"the probe needs a whole number of classes >= 2 (got {num_classes})")
    if isinstance(features, np.ndarray) or not isinstance(features, Sequence):
        raise GSDError("the probe's features must be a list of (n, d) arrays, one per model")
    if len(features) < 2:
        raise GSDError(f"the probe needs at least 2 models (the untrained one and a candidate), got {len(features)}")
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise GSDError(f"the probe's labels must be a 1-d array (got shape {labels.shape})")
    n = len(labels)
    if n and not np.issubdtype(labels.dtype, np.integer):
        raise GSDError(f"the probe's labels must be integers (got {labels.dtype})")
    parts = np.asarray(parts)
    if parts.shape != (n,) or (n and parts.dtype != np.bool_):
        raise GSDError(f"the probe's parts must be a boolean array of the {n} examples (got {parts.dtype} {parts.shape})")
    feats = []
    for c, phi in enumerate(features):
        phi = np.asarray(phi)
        if phi.ndim != 2 or phi.shape[0] != n or phi.shape[1] < 1:
            raise GSDError(f"the probe's features of model {c} must have shape ({n}, d) with d >= 1 (got {phi.shape})")
        if not np.issubdtype(phi.dtype, np.number) or np.issubdtype(phi.dtype, np.complexfloating):
            raise GSDError(f"the probe's features of model {c} must be real numbers (got {phi.dtype})")
        if not np.all(np.isfinite(phi)):
            raise PrivateError(f"the probe's features of model {c} contain a value that is not a finite number")
        feats.append(phi)
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        raise PrivateError(f"the probe's labels must be in 0..{num_classes - 1}")
    return feats, labels.astype(np.int64), parts.astype(bool), int(num_classes)


#: the untrained model's head start, in units of permute-and-flip's noise scale 2 / epsilon_pf, beyond ln M
#: (:func:`head_start`): a candidate no better than the untrained model wins with probability at most
#: about e^-3 = 5%, the confidence the non-private advice asks for (alpha 0.05)
HEAD_START_T = 3.0


def head_start(models: int, epsilon_pf: float) -> float:
    """The public bonus added to the untrained model's score (index 0) before the selection:
    (2 / epsilon_pf)(ln M + :data:`HEAD_START_T`). Permute-and-flip picks an r with
    u_r >= u* - (2 Delta / epsilon)(ln M + t) except with probability e^-t (McKenna and Sheldon 2020,
    Theorem 2, as for the exponential mechanism), so a candidate is chosen over the untrained model
    only when its count beats the untrained model's by about this much: DP-SGD alone unless a candidate
    helps with confidence against the selection's own noise. It does not cover the fits' own noise,
    which moves the counts of alike models apart (with every model's features the same and noisy fits,
    the untrained model still won only 45-85% of draws in ``tests/test_probe_mechanism.py``): the
    pre-registered benchmark measures what remains. A constant added to one coordinate (a function of public numbers only)
    leaves every coordinate's sensitivity as it was, so the selection is still epsilon_pf-DP."""
    return 2.0 / float(epsilon_pf) * (math.log(models) + HEAD_START_T)


def dp_probe_at(features: Sequence[np.ndarray], labels: np.ndarray, parts: np.ndarray, num_classes: int, *, z: float,
                epsilon_pf: float, rng: np.random.Generator, ridge: float = 1.0, prefer_untrained: bool = True,
                observe: Callable[[int, np.ndarray], None] | None = None) -> int:
    """The mechanism (module docstring, steps 2-6) at a given noise multiplier ``z`` and
    permute-and-flip epsilon ``epsilon_pf``: the winning index. Its cost is
    :func:`selection_curve` (len(features), z, epsilon_pf); :func:`plan_dp_probe` calibrates both to a
    target (epsilon, delta) and :func:`run_dp_probe` runs the plan: what a caller should use.
    ``prefer_untrained``: the untrained model's score gets :func:`head_start` (public; the same privacy).
    ``observe(c, release)``: called with each model's Gaussian release of step 3 (what part (c) of the
    theorem makes DP), for the audit (:mod:`gsd_cli.audit.dpprobe`); None in ``gsd train``."""
    feats, y, parts, num_classes = _validate(features, labels, parts, num_classes)
    z = _check_positive("noise multiplier z", z)
    epsilon_pf = _check_positive("epsilon_pf", epsilon_pf)
    ridge = _check_positive("ridge", ridge)
    u = np.zeros(len(feats))
    if prefer_untrained:
        u[0] += head_start(len(feats), epsilon_pf)
    for c, phi in enumerate(feats):
        f = normalise(phi)
        released = noisy_fit_statistics(f[parts], one_hot(y[parts], num_classes), z, rng)
        if observe is not None:
            observe(c, released.copy())
        w = ridge_weights(released, f.shape[1], num_classes, z, ridge)
        u[c] += scores(f[~parts], y[~parts], w)
    from .selection import permute_and_flip

    return permute_and_flip(u, epsilon_pf, SCORE_SENSITIVITY, rng)


def plan_dp_probe(epsilon: float, delta: float, models: int, pf_share: float = 0.5) -> DPProbePlan:
    """The :class:`DPProbePlan` of M = ``models`` models at the target (``epsilon``, ``delta``):
    :func:`calibrate`, then the curve and the certified epsilon of what it gives."""
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    z, eps_pf = calibrate(epsilon, delta, models, pf_share)
    return DPProbePlan(models=int(models), z=z, epsilon_pf=eps_pf, epsilon=selection_epsilon(models, z, eps_pf, delta),
                       delta=delta, curve=tuple(selection_curve(models, z, eps_pf)))


def run_dp_probe(plan: DPProbePlan, features: Sequence[np.ndarray], labels: np.ndarray, parts: np.ndarray, num_classes: int, *,
                 rng: np.random.Generator, ridge: float = 1.0, prefer_untrained: bool = True,
                 observe: Callable[[int, np.ndarray], None] | None = None) -> int:
    """The released index of the mechanism run at ``plan``'s noise multiplier and permute-and-flip epsilon
    (:func:`dp_probe_at` with ``z=plan.z``, ``epsilon_pf=plan.epsilon_pf``): the call that ``gsd audit
    --method dp-probe`` runs end to end. ``features`` must hold ``plan.models`` models."""
    if isinstance(features, np.ndarray) or not isinstance(features, Sequence) or len(features) != plan.models:
        raise GSDError(f"the DP probe was planned for {plan.models} models; give their features as a list of {plan.models} arrays")
    return dp_probe_at(features, labels, parts, num_classes, z=plan.z, epsilon_pf=plan.epsilon_pf, rng=rng, ridge=ridge,
                       prefer_untrained=prefer_untrained, observe=observe)


def dp_probe(features: Sequence[np.ndarray], labels: np.ndarray, parts: np.ndarray, num_classes: int, *, epsilon: float,
             delta: float, rng: np.random.Generator, ridge: float = 1.0, pf_share: float = 0.5,
             prefer_untrained: bool = True) -> DPProbeRelease:
    """The DP feature probe: which of the M = len(features) models (0 = untrained) gives the best
    ridge probe of the private examples, (epsilon, delta)-DP under add/remove-one (module docstring):
    :func:`plan_dp_probe`, then :func:`run_dp_probe`.

    ``features``: per model, the (n, d_c) features of the same n private examples; ``labels``: (n,)
    integers in 0..num_classes-1; ``parts``: (n,) booleans from :func:`split_parts` (True = fit);
    ``rng``: the caller's private generator (:func:`gsd_cli.privacy.randomness.private_rng`)."""
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    _validate(features, labels, parts, num_classes)
    plan = plan_dp_probe(epsilon, delta, len(features), pf_share)
    winner = run_dp_probe(plan, features, labels, parts, num_classes, rng=rng, ridge=ridge, prefer_untrained=prefer_untrained)
    return DPProbeRelease(winner=int(winner), models=plan.models, z=plan.z, epsilon_pf=plan.epsilon_pf, epsilon=plan.epsilon,
                          delta=plan.delta, curve=plan.curve)


__all__ = ["DPProbePlan", "DPProbeRelease", "HEAD_START_T", "head_start", "calibrate", "dp_probe", "dp_probe_at", "plan_dp_probe",
           "run_dp_probe", "fit_statistics", "new_salt", "noisy_fit_statistics",
           "normalise", "ridge_lambda", "ridge_weights", "scores", "selection_curve", "selection_epsilon", "split_parts"]
