"""Audit of the DP feature probe (:mod:`gsd_cli.privacy.probe_mechanism`, issue 52 item 1): a
distinguishing test of its Gaussian releases on a worst-case neighbouring pair, and the exact privacy
loss of that pair in closed form.

What is audited, and against which claim. The probe's theorem adds two curves: the M Gaussian releases
of the fit part A (proof (c), RDP M alpha / (2 z^2)) and permute-and-flip on the score part B (proof
(e), epsilon_pf). By proof (a) an added example lands in A or in B, never in both, so one example meets
only one of the two mechanisms: the whole claim (``--epsilon``) is the sum, but what an add/remove pair
can lose is at most the larger part. That slack is large: at --epsilon 2 (delta 1e-5, pf_share 0.5)
the M releases, read as one Gaussian, lose at most 0.91 and permute-and-flip 1, so even with the noise
halved the whole mechanism stays (2, 1e-5)-DP (the halved releases lose at most 1.97, 1.83 on the pair
below) and no audit of the whole claim could flag it. The audit therefore tests what the proof claims
of the part it exercises: the M Gaussian releases' own epsilon, :func:`~gsd_cli.privacy.probe_mechanism.selection_epsilon`
with epsilon_pf = 0 at the z that :func:`~gsd_cli.privacy.probe_mechanism.calibrate` gives (about half
of ``--epsilon`` at the default share: 1.00 at --epsilon 2); ``details`` carries the whole claim
beside it. Permute-and-flip is the one of ``gsd audit --method dp-select`` (the same
:func:`gsd_cli.privacy.selection.permute_and_flip`, audited there at its exact loss).

Neighbours (add/remove one example, the relation the theorem is for): D = ``examples`` public
examples with fixed features and labels under each of M models, D' = D plus one canary x whose
features lie along a coordinate axis (phi = 5 e_1) under every model. Both go through the mechanism's
own steps 1-3: :func:`~gsd_cli.privacy.probe_mechanism.split_parts` with a fixed public salt (the proof
holds for every salt; the canary's identity is the first ``canary-i`` the salt puts in the fit part A),
:func:`~gsd_cli.privacy.probe_mechanism.normalise`, :func:`~gsd_cli.privacy.probe_mechanism.one_hot` and
:func:`~gsd_cli.privacy.probe_mechanism.noisy_fit_statistics` per model. The canary adds v_c(x) to model
c's statistic; with f = (e_1 + e_D) / sqrt(2), ||upper(f f^T)||^2 = 3/4 and ||f y^T||^2 = 1, so
||v_c|| = sqrt(7) / 2: the largest change any normalised feature vector makes (proof (b)'s remark),
7% below the sqrt(2) the noise is calibrated to. Over the M releases the shift is V = (v_1, .., v_M),
||V|| = sqrt(7 M) / 2, and the noise is N(0, sigma^2 I) with sigma = z sqrt(2).

Statistic. s = <release - T(D), V> / (||V|| sigma), in units of the *claimed* sigma (z sqrt(2), written
here, not read from the code under audit): N(0, 1) under D and N(mu, 1) under D', mu = ||V|| / sigma
= sqrt(7 M) / (2 sqrt(2) z). By Neyman-Pearson this projection is the optimal test between the pair
(the likelihood ratio is a monotone function of s), and the pair's exact (epsilon, delta) trade-off is
that of mu-GDP (Dong, Roth, Su 2019, Corollary 2.13; Balle and Wang 2018):
delta(epsilon) = Phi(-epsilon / mu + mu / 2) - e^epsilon Phi(-epsilon / mu - mu / 2), inverted at the
claimed delta for ``details["exact_loss"]`` (0.85 at --epsilon 2, M = 2: below the part's claim 1.00,
as the theorem says; with the noise halved 1.83, above it). Three kinds of tests share the 95%
(Bonferroni): the threshold tests (no assumption beyond the definition of (epsilon, delta)-DP: for
every t of :data:`THRESHOLDS`, {s > t} with D' over D and {s <= mu - t} with D over D', Clopper-Pearson
bounds and epsilon >= log((p_lower - delta) / p_upper), as :mod:`.step`) and a *replay* statistic
(the release equals the one the code would make from D with the public seed of the block, which
flags noise drawn from a public seed, ``bug="public-seed"``, and has no power against correct code)
at half the error probability together; the Gaussian-DP fit of :func:`.bound.gdp_mu_bounds` (Nasr et
al. 2023: s is Gaussian with one sd under both neighbours, exactly so here) at the other half, its
lower bound on mu converted to epsilon at delta by :func:`.bound.gdp_epsilon`.

Draws. ``draws`` releases under each neighbour (default :data:`DRAWS` = 1,000,000), through the real
:func:`~gsd_cli.privacy.probe_mechanism.noisy_fit_statistics` with secret randomness (one generator
from the OS for the whole audit, or ``insecure_seed``), :data:`BLOCK` at a time: the function is called
once per model and block with a :class:`TrialsGenerator`, which hands it ``BLOCK`` independent noise
vectors for the one it asks for (its own ``noise_std(z)``, its own shape), so every draw goes through
the mechanism's code and a million cost about 3 s on the shared 2-core CPU. ``bug="half-scale"`` calls it at
z / 2 (the noise halved, the claim unchanged).

Power (why the counts suffice). At --epsilon 2, M = 2, the part's claim is 1.00 and mu = 0.231 (0.462
with the noise halved). The Gaussian-DP fit's standard error is about sqrt(2 / N) = 0.0014 at
N = 10^6, so its 97.5% lower bound on mu is within 0.003 of the truth: 0.84 for the correct mechanism
(no false alarm unless mu is overestimated by 0.037, 26 standard errors) and 1.81 with the noise
halved, 0.8 above the claim: the flag does not depend on luck, and it holds down to N = 1,000 (lower
bound about 1.7). The assumption-free threshold tests flag halved noise on their own from
N of about 3 x 10^5 (1.35 at 10^6: 1.1 x 10^-3 of the draws under D fall 1.75 claimed sds into a tail
against 2.9 x 10^-4 under D'); for the correct mechanism they give 0.55-0.62. A public-seed draw is
flagged by the replay test from a few dozen draws (every draw equal under D, none under D').
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import GSDError
from .bound import AuditResult, clopper_pearson, gdp_epsilon, gdp_mu_bounds

BUGS = ("half-scale", "public-seed")
#: thresholds of the tail tests, in units of the claimed noise's sd, fixed before any draw
THRESHOLDS = (0.5, 1.0, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0)
#: default releases per neighbour, and how many are drawn per call of the mechanism
DRAWS, BLOCK = 1_000_000, 50_000
#: the partition's salt: public and fixed (the theorem holds for every salt, proof (a))
SALT = b"gsd audit dp-probe: a public salt"
#: the canary's features under every model: along a coordinate axis, where ||v(x)|| is largest
CANARY_SCALE = 5.0


class TrialsGenerator:
    """A generator that answers the mechanism's one request for noise, ``normal(loc, scale, size)``,
    with ``n`` independent draws of it (shape ``(n, *size)``) from ``rng``: the mechanism's own code
    then releases ``n`` copies at once. Any other request is refused (the audit must know every draw)."""

    def __init__(self, rng: np.random.Generator, n: int):
        self.rng, self.n, self.calls = rng, int(n), 0

    def normal(self, loc=0.0, scale=1.0, size=None):
        self.calls += 1
        shape = (self.n,) if size is None else (self.n, *np.atleast_1d(size).astype(int).tolist())
        return self.rng.normal(loc, scale, size=shape)

    def __getattr__(self, name):
        raise GSDError(f"the DP probe's noise asked its generator for {name!r}: the audit knows only normal()")


def probe_neighbours(models: int = 2, examples: int = 8, num_classes: int = 2, dims: int = 2):
    """(D, D'), each a dict of ``features`` (one (n, dims) array per model), ``labels`` and ``identities``:
    ``examples`` public examples (features from a fixed public seed), and the same plus the canary
    (features 5 e_1 under every model, label 1, the first identity ``canary-i`` in part A of :data:`SALT`)."""
    from ..privacy import probe_mechanism as pm

    if models < 2 or examples < 0 or num_classes < 2 or dims < 1:
        raise GSDError("the DP probe audit needs at least 2 models, 2 classes and 1 feature")
    pub = np.random.default_rng(20240052)  # public: the examples of D are known to the auditor
    feats = [pub.normal(size=(examples, dims)) for _ in range(models)]
    labels = pub.integers(0, num_classes, size=examples)
    ids = [f"example-{i}" for i in range(examples)]
    canary = next(f"canary-{i}" for i in range(1000) if pm.split_parts([f"canary-{i}"], SALT)[0])
    x = np.zeros((1, dims))
    x[0, 0] = CANARY_SCALE
    D = {"features": feats, "labels": labels, "identities": ids}
    D2 = {"features": [np.vstack([f, x]) for f in feats], "labels": np.append(labels, 1),
          "identities": [*ids, canary]}
    return D, D2


def canary_shift_by_hand(models: int) -> float:
    """||V||: the canary's change of the M statistics, written apart from the mechanism's code. Its
    normalised row is f = (e_1 + e_D) / sqrt(2): upper(f f^T) has the three entries 1/2 (squares sum to
    3/4) and f y^T has ||f|| ||y|| = 1, so ||v_c||^2 = 7/4 per model."""
    return math.sqrt(models * (0.75 + 1.0))


def exact_gaussian_loss(mu: float, delta: float) -> float:
    """The pair's exact epsilon at ``delta``: mu-GDP's curve (module docstring) at ``mu``."""
    return gdp_epsilon(mu, delta)


def _fit_inputs(data: dict, num_classes: int):
    """Per model, the fit part's normalised rows and one-hot labels, by the mechanism's steps 1-2."""
    from ..privacy import probe_mechanism as pm

    parts = pm.split_parts(data["identities"], SALT)
    y = pm.one_hot(np.asarray(data["labels"], dtype=np.int64)[parts], num_classes)
    return [(pm.normalise(phi)[parts], y) for phi in data["features"]], parts


def _tail_bound(k_in: int, k_out: int, n: int, delta: float, level: float) -> tuple[float, float, float]:
    """epsilon >= log((lower(P_in) - delta) / upper(P_out)) from k_in of n draws in the region under
    one neighbour and k_out of n under the other (two-sided Clopper-Pearson at ``level``, one side each)."""
    lo = clopper_pearson(k_in, n, level)[0] - delta
    hi = clopper_pearson(k_out, n, level)[1]
    return (math.log(lo / hi) if lo > 0 and hi > 0 else 0.0), lo + delta, hi


def audit_dp_probe(epsilon: float = 2.0, delta: float = 1e-5, *, draws: int = DRAWS, models: int = 2, pf_share: float = 0.5,
                   insecure_seed: int | None = None, bug: str | None = None, confidence: float = 0.95) -> AuditResult:
    """Audit the DP feature probe calibrated to (``epsilon``, ``delta``) for ``models`` models (module
    docstring): ``draws`` releases of its M Gaussian fit statistics under each neighbour. The result's
    claim is those releases' epsilon (the theorem's part (c) at the calibrated z); ``details`` has the
    whole claim, ``exact_loss`` (the pair's, in closed form) and the Gaussian-DP fit (``gdp``).
    ``bug``: ``half-scale`` (the noise halved) or ``public-seed`` (noise from the block's public seed)."""
    from ..privacy import check_delta
    from ..privacy import probe_mechanism as pm
    from ..privacy.randomness import private_rng
    from .dpgsd import check_draw_audit

    check_draw_audit(epsilon, draws, insecure_seed, bug, BUGS, "DP probe")
    check_delta(delta)
    z, eps_pf = pm.calibrate(epsilon, delta, models, pf_share)
    claim = pm.selection_epsilon(models, z, 0.0, delta)  # the M Gaussian releases' part of the theorem
    whole = pm.selection_epsilon(models, z, eps_pf, delta)
    sigma = z * math.sqrt(2.0)  # the claimed noise, from the docstring (sigma = z sqrt 2), not from the code
    z_used = z / 2 if bug == "half-scale" else z
    num_classes = 2
    D, D2 = probe_neighbours(models, num_classes=num_classes)
    fit_d, _ = _fit_inputs(D, num_classes)
    fit_d2, parts2 = _fit_inputs(D2, num_classes)
    if not parts2[-1]:  # pragma: no cover - probe_neighbours picks the canary in part A
        raise GSDError("the DP probe audit's canary is not in the fit part")
    centre = [pm.fit_statistics(f, y) for f, y in fit_d]
    shift = [pm.fit_statistics(f, y) - c for (f, y), c in zip(fit_d2, centre)]  # v_c(x), by the mechanism's code
    norm_v = math.sqrt(sum(float(v @ v) for v in shift))
    direction = [v / (norm_v * sigma) for v in shift]
    rng = private_rng("audit-dp-probe", insecure_seed)

    def release(fit, n: int, gen, zz: float) -> list[np.ndarray]:
        g = TrialsGenerator(gen, n)
        out = [pm.noisy_fit_statistics(f, y, zz, g) for f, y in fit]
        if g.calls != len(fit) or any(o.shape != (n, c.shape[0]) for o, c in zip(out, centre)):
            raise GSDError("the DP probe's noise was not drawn from the generator it was given (one draw per model)")
        return out

    def stat(rel: list[np.ndarray]) -> np.ndarray:
        return sum((r - c) @ d for r, c, d in zip(rel, centre, direction))

    sa, sb, ra, rb = [], [], [], []
    for j, start in enumerate(range(0, draws, BLOCK)):
        n = min(BLOCK, draws - start)
        # the bug: the block's generator reproduced from its public seed j, the same under D and D'
        gens = (np.random.default_rng(j), np.random.default_rng(j)) if bug == "public-seed" else (rng, rng)
        a, b = release(fit_d, n, gens[0], z_used), release(fit_d2, n, gens[1], z_used)
        ref = release(fit_d, n, np.random.default_rng(j), z)  # what the code makes from D with block j's public seed
        sa.append(stat(a))
        sb.append(stat(b))
        ra.append(sum(np.abs(x - y).sum(1) for x, y in zip(a, ref)))
        rb.append(sum(np.abs(x - y).sum(1) for x, y in zip(b, ref)))
    s_d, s_d2, r_d, r_d2 = (np.concatenate(x) for x in (sa, sb, ra, rb))
    mu_claimed = norm_v / sigma

    # half of the error for the counting tests (2 per threshold + the replay), half for the Gaussian-DP fit
    alpha = 1.0 - confidence
    level = alpha / 2 / (2 * len(THRESHOLDS) + 1)
    best, how = 0.0, {}
    for t in THRESHOLDS:
        for name, k_in, k_out, region in (
            ("D' over D", int((s_d2 > t).sum()), int((s_d > t).sum()), f"s > {t:g}"),
            ("D over D'", int((s_d <= mu_claimed - t).sum()), int((s_d2 <= mu_claimed - t).sum()), f"s <= mu - {t:g}"),
        ):
            e, lo, hi = _tail_bound(k_in, k_out, draws, delta, level)
            if e > best:
                best, how = e, {"statistic": "projection", "test": name, "region": region, "threshold_sd": t, "p_lower": lo,
                                "p_upper": hi, "correct": k_in + (draws - k_out)}
    tol = 1e-9 * max(1.0, sigma)
    eq_d, eq_d2 = int((r_d <= tol).sum()), int((r_d2 <= tol).sum())
    e, lo, hi = _tail_bound(eq_d, eq_d2, draws, delta, level)
    if e > best:
        best, how = e, {"statistic": "replay", "test": "D over D'", "region": "release equals the public-seed replay of D",
                        "p_lower": lo, "p_upper": hi, "correct": eq_d + (draws - eq_d2)}
    mu_hat, mu_lo, _ = gdp_mu_bounds(s_d, s_d2, 1 - alpha / 2)
    eps_gdp = gdp_epsilon(mu_lo, delta) if np.isfinite(mu_lo) else 0.0
    gdp = {"mu_hat": mu_hat, "mu_lower": mu_lo, "mu_claimed": mu_claimed, "epsilon_lower": eps_gdp,
           "claimed_mechanism_epsilon_exact": exact_gaussian_loss(mu_claimed, delta),
           "noise_below_claim": bool(mu_lo > mu_claimed)}
    counted = how
    if eps_gdp > best:
        best, how = eps_gdp, {"statistic": "Gaussian-DP fit (Nasr et al. 2023)", "mu_lower": mu_lo,
                              "correct": int(counted.get("correct", draws))}
    mu_exact = canary_shift_by_hand(models) / sigma
    details = {"models": models, "pf_share": pf_share, "noise_multiplier": z, "noise_std": sigma, "epsilon_pf": eps_pf,
               "epsilon_requested": float(epsilon), "claim_whole_mechanism": whole, "claim_gaussian_releases": claim,
               "audited": f"the {models} Gaussian fit releases (theorem part (c)); permute-and-flip: gsd audit --method dp-select",
               "draws_per_neighbour": draws, "exact_loss": exact_gaussian_loss(mu_exact, delta), "mu_exact": mu_exact,
               "exact_loss_as_run": exact_gaussian_loss(canary_shift_by_hand(models) / (z_used * math.sqrt(2.0)), delta),
               "canary_shift": norm_v, "canary_shift_by_hand": canary_shift_by_hand(models), "best_test": how,
               "best_counting_test": counted, "gdp": gdp, "bug": bug,
               "replay_equal_under_D": eq_d, "replay_equal_under_D'": eq_d2,
               "mean_shift_sd": float(s_d2.mean() - s_d.mean()),
               "neighbours": ("D = 8 public examples under each model, D' = D + one canary with features 5 e1 "
                              "in the fit part (add/remove one example)"),
               "confidence_split": "counting tests (thresholds and replay) and Gaussian-DP fit at half the error probability each",
               "dp_randomness": "insecure seed" if insecure_seed is not None else "operating system"}
    return AuditResult("dp-probe", float(claim), float(delta), float(best), 2 * draws, 2 * draws,
                       int(how.get("correct", draws)), confidence, details)


__all__ = ["BUGS", "DRAWS", "THRESHOLDS", "TrialsGenerator", "audit_dp_probe", "canary_shift_by_hand", "exact_gaussian_loss",
           "probe_neighbours"]
