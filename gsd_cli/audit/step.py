"""A many-trial distinguishing audit of one private step: tight where the one-run audit is loose.

The one-run audit (:mod:`.trainers`) recovers about a third of a Gaussian mechanism's epsilon at
delta = 1e-5, so it cannot tell the claimed noise from half of it. The classic audit (Jagielski,
Ullman, Oprea 2020; Nasr et al. 2021) can: release the same step many times on two neighbouring
datasets, D and D' = D + one canary, and bound epsilon by a threshold test. For an (epsilon,
delta)-DP release M and every set S of outputs, P[M(D') in S] <= e^epsilon P[M(D) in S] + delta
(the definition), so with Clopper-Pearson bounds p' >= lo on P[M(D') in S] and p <= hi on
P[M(D) in S], at a confidence split over the thresholds tried (Bonferroni),

    epsilon >= log((lo - delta) / hi)            (and the same with D and D' swapped)

holds at 95% confidence for any correct implementation. The thresholds are fixed in advance in units
of the *claimed* noise (the auditor does not know a bug's), and the statistic is the release along
the canary's clipped direction.

Beside the threshold tests, a Gaussian-DP fit (Nasr, Hayes, Steinke, Balle et al. 2023, "Tight
auditing of differentially private machine learning"): the release along the canary's direction is
Gaussian with the same sd under D and D' (exactly, for a full-batch Gaussian step), so the step is
mu-GDP with mu = mean shift / sd (Dong, Roth, Su 2019), and a lower confidence bound on mu converts to a
lower bound on epsilon at delta (:func:`.bound.gdp_epsilon`). It flags 0.7x the claimed noise with
tens of thousands of trials, where the threshold tests need halved noise.

The step is the method's own transform :class:`~gsd_cli.train.transforms.Chain` from
:func:`gsd_cli.train.methods.build_method` at the sigma :func:`gsd_cli.privacy.calibrate_noise`
gives for one full-batch step (q = 1, T = 1): its per-example transforms (the clip, NormTopK) run on
the examples of D and D' once, as :func:`gsd_cli.train.loop.private_step` runs them, and its
aggregation transforms (the Gaussian noise) run on ``trials`` copies of each sum at once, drawing
independent noise for every copy. Methods whose aggregation is more than added noise (GEP's
reconstruction, RGP's) are audited by the one-run audit only.
"""

from __future__ import annotations

import math
import secrets

import numpy as np
import torch

from ..errors import GSDError
from ..privacy import calibrate_noise, epsilon_of, training_event
from .bound import AuditResult, clopper_pearson
from .trainers import inject_bug

STEP_METHODS = ("dpsgd", "second-phase")  # a Dirac canary: NormTopK (topagg) would zero it
#: thresholds, in units of the claimed noise's standard deviation, above the mean under D
THRESHOLDS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5)


def _bound(above_d: int, above_d2: int, trials: int, delta: float, level: float) -> tuple[float, dict]:
    best, how = 0.0, {}
    for (k1, k2, name) in ((above_d2, above_d, "D' over D"), (trials - above_d, trials - above_d2, "D over D' (below)")):
        lo = clopper_pearson(k1, trials, level)[0] - delta
        hi = clopper_pearson(k2, trials, level)[1]
        if lo > 0 and hi > 0 and math.log(lo / hi) > best:
            # correct guesses of the test "in S: D', else D" (or its mirror): hits under one, misses under the other
            best, how = math.log(lo / hi), {"test": name, "p_lower": lo + delta, "p_upper": hi, "correct": k1 + (trials - k2)}
    return best, how


def audit_step(cfg, *, trials: int = 200_000, examples: int = 8, dims: int = 16, insecure_seed: int | None = None,
               bug: str | None = None, confidence: float = 0.95) -> AuditResult:
    """Distinguishing audit of one full-batch step of ``cfg.method`` (one of :data:`STEP_METHODS`)
    at (``cfg.epsilon``, ``cfg.delta``): ``examples`` random per-example gradients in ``dims``
    dimensions form D, D' adds a canary of norm 10 C (clipped to C by the method), and the step is
    released ``trials`` times under each. ``bug``: as :func:`gsd_cli.audit.inject_bug`."""
    from ..privacy.randomness import private_rng
    from ..train.methods import build_method
    from ..train.transforms import StepContext, chain_step_event

    if cfg.method not in STEP_METHODS or cfg.sparsify:
        raise GSDError(f"the step audit takes --method {', '.join(STEP_METHODS)} (without --sparsify); got {cfg.method}")
    if trials < 1000 or examples < 1 or dims < 2:
        raise GSDError("the step audit needs at least 1000 trials, 1 example and 2 dimensions")
    probe = build_method(cfg, 1.0)
    sigma = calibrate_noise(probe.step_event, cfg.epsilon, cfg.delta, 1.0, 1, cfg.accountant)
    method = build_method(cfg, sigma)
    chain_step_event(method.chain)  # the same check as gsd train
    claimed = epsilon_of(training_event(method.step_event(sigma), 1.0, 1), cfg.delta, cfg.accountant)
    noise_std = method.chain.releases()[0].std  # the claimed noise: what the auditor knows
    inject_bug(method.chain, bug)

    rng = private_rng("audit-step", insecure_seed)
    torch_seed = int(rng.integers(2**63)) if insecure_seed is not None else secrets.randbits(63)
    gen = torch.Generator().manual_seed(torch_seed)
    rows = torch.from_numpy(rng.normal(size=(examples, dims))).to(torch.float32)
    rows[:, 0] = 0.0  # the real examples are orthogonal to the canary's direction
    canary = torch.zeros(1, dims)
    canary[0, 0] = 10.0 * cfg.clip
    ctx = StepContext(step=0, generator=gen)
    stats = []
    for data in (rows, torch.cat([rows, canary])):
        method.chain.begin_step(ctx)
        parts = method.chain.per_example({"grad": data}, ctx)
        sums = {k: v.sum(0, keepdim=True).expand(trials, -1).contiguous() for k, v in parts.items()}
        released = method.chain.aggregated(sums, ctx)["grad"]
        stats.append(released[:, 0].double().numpy() / noise_std)  # in units of the claimed noise
    s_d, s_d2 = stats
    # Two families at half the error probability each (Bonferroni): the threshold tests (no assumption
    # beyond the definition) and the Gaussian-DP fit (Nasr et al. 2023: the statistic is Gaussian with
    # one sd under both neighbours, exactly so for a full-batch Gaussian step), far more powerful.
    level = (1 - confidence) / (2 * len(THRESHOLDS))  # two tests per threshold, one-sided each, half the budget
    best, how = 0.0, {}
    for t in THRESHOLDS:
        e, h = _bound(int((s_d > t).sum()), int((s_d2 > t).sum()), trials, cfg.delta, level)
        if e > best:
            best, how = e, {**h, "threshold_sd": t}
    from .bound import gdp_epsilon, gdp_mu_bounds

    mu_hat, mu_lo, _ = gdp_mu_bounds(s_d, s_d2, 1 - (1 - confidence) / 2)
    eps_gdp = gdp_epsilon(mu_lo, cfg.delta)
    gdp = {"mu_hat": mu_hat, "mu_lower": mu_lo, "mu_claimed": 1.0 / float(sigma), "epsilon_lower": eps_gdp,
           "claimed_mechanism_epsilon_exact": gdp_epsilon(1.0 / float(sigma), cfg.delta),
           "noise_below_claim": bool(mu_lo > 1.0 / float(sigma))}
    if eps_gdp > best:
        best, how = eps_gdp, {"test": "Gaussian-DP fit (Nasr et al. 2023)", "mu_lower": mu_lo,
                              "correct": int(how.get("correct", 0))}
    return AuditResult(
        method=f"{cfg.method} (step)", claimed_epsilon=float(claimed), delta=cfg.delta, epsilon_lower_bound=float(best),
        canaries=1, guesses=2 * trials, correct=int(how.get("correct", 0)), confidence=confidence,
        details={"audit": "many-trial distinguishing test of one step (q=1, T=1)", "trials": trials, "sigma": float(sigma),
                 "bug": bug, "best": how, "mean_shift_sd": float(np.mean(s_d2) - np.mean(s_d)), "gdp": gdp,
                 "confidence_split": "threshold tests and Gaussian-DP fit at half the error probability each"},
    )
