"""Audit of the DP feature probe (:mod:`gsd_cli.privacy.probe_mechanism`, issue 52 item 1; issue 60 item 3):
the released mechanism run end to end (fit, score, selection) at a user's number of models M, a
distinguishing test of each of its two parts on a worst-case neighbouring pair, and each pair's exact loss.

What is run. Every draw is one call of :func:`~gsd_cli.privacy.probe_mechanism.run_dp_probe` with the plan
of :func:`~gsd_cli.privacy.probe_mechanism.plan_dp_probe` (``calibrate``, then ``dp_probe_at`` at the
plan's z and epsilon_pf: the normalisation, the M noisy fit statistics through ``noise_std``, the ridge
solve, the counts on the score half with the untrained model's head start, permute-and-flip), with the
mechanism's own partition ``split_parts`` (a fixed public salt, :data:`SALT`: the proof holds for every
salt) and secret randomness (one generator from the OS for the whole audit, or ``insecure_seed``). M is
``models`` (default :data:`MODELS` = 4: the untrained model and 3 candidates, as in the README's
``--public mnist-b digits noise``).

Which claim, part by part. The theorem adds the M Gaussian releases of the fit half A (proof (c)) and
permute-and-flip on the score half B (proof (e)); by proof (a) an added example lands in A or in B, never
both, so what one example can lose is at most the larger part, and the whole claim has slack: halved fit
noise (at most 1.97 at --epsilon 2) or permute-and-flip at twice its epsilon (at most 2 x epsilon_pf / 2 =
epsilon_pf, below) both stay within the whole (2, 1e-5). No audit of the whole claim could flag either, so
each part is tested against the part's own claim, with a canary in that part:

* **fit** (canary in A): the M releases' own epsilon, :func:`~gsd_cli.privacy.probe_mechanism.selection_epsilon`
  with epsilon_pf = 0 at the plan's z (1.00 at --epsilon 2). The releases are read as the run makes them
  (``dp_probe_at``'s ``observe``), and everything after them is post-processing of them.
* **selection** (canary in B): epsilon_pf / 2, pure. With the fit releases fixed, adding an example of B
  adds 0 or 1 to *every* count u_c: the counts move one way. Permute-and-flip has the law of report-noisy-max
  with Exp(rate lambda) noise, lambda = epsilon_pf / (2 Delta), Delta = 1 (Ding et al. 2021; tested in
  ``tests/test_dp_select.py``). Fix every noise but E_r; r wins iff E_r > t = max_{j != r}(u_j + E_j) - u_r.
  Adding the example moves t to t' with t - 1 <= t' <= t + 1 (each u_j rises by 0 or 1), and for the
  exponential tail P[E > t - 1] <= e^lambda P[E > t] and P[E > t + 1] >= e^-lambda P[E > t]; so every index's
  probability changes by at most e^lambda = e^(epsilon_pf / 2) either way: the general epsilon_pf / (2 Delta)
  calibration is epsilon_pf / 2-DP on monotone neighbours (McKenna and Sheldon's monotone case; the theorem
  books the whole epsilon_pf and uses no monotone form). ``tests/test_audit_dp_probe.py`` checks it against
  the exact law (:func:`gsd_cli.audit.dpselect.pf_law`) on random monotone pairs.

The fit pair (:func:`probe_neighbours`). D = 8 public examples with fixed features under each model, D' =
D plus a canary with features 5 e_1 under every model, which ``split_parts`` puts in A. Its normalised row
f = (e_1 + e_D) / sqrt(2) has ||upper(f f^T)||^2 = 3/4 and ||f y^T||^2 = 1, so it moves each model's
statistic by ||v_c|| = sqrt(7) / 2, the most a normalised example can (proof (b)'s remark; the noise is
calibrated to sqrt(2)); over the M releases ||V|| = sqrt(7 M) / 2. Statistic: s = <release - T(D), V> /
(||V|| sigma) in units of the *claimed* sigma = z sqrt(2) (written here, not read from the code): N(0, 1)
under D and N(mu, 1) under D', mu = ||V|| / sigma, the Neyman-Pearson optimal test, and the pair's exact
(epsilon, delta) is mu-GDP's (Dong, Roth, Su 2019, Corollary 2.13) in closed form (0.85 at --epsilon 2: below
the part's claim 1.00; halved noise 1.83, above it). Tests: for every t of :data:`THRESHOLDS`, {s > t} with
D' over D and {s <= mu - t} with D over D' (Clopper-Pearson, epsilon >= log((p_lower - delta) / p_upper), as
:mod:`.step`), and a *replay* test (the first :data:`REPLAY_DRAWS` releases equal what the code makes from D
with draw i's public seed i: flags ``bug="public-seed"``, no power against correct code), together at half the
part's error probability; the Gaussian-DP fit of :func:`.bound.gdp_mu_bounds` (Nasr et al. 2023) at the other
half, its lower bound on mu converted at delta by :func:`.bound.gdp_epsilon`.

The selection pair (:func:`selection_neighbours`). One-dimensional features, 2 classes. The fit half A holds
n examples of each class (feature +1 labelled 1, -1 labelled 0, under every model), n = max(100, 50 sigma):
every model's ridge probe then predicts the sign, whatever the noise (its effect on the margin is about
sqrt(2) sigma / n, 1/35 of it). The score half B holds L examples labelled 1 that models 0 and 1 get right
(feature +1) and the others wrong (-1), L = ceil(60 / epsilon_pf) so the others' coins are below e^-30, and
k examples only model 1 gets right (k < 0: -k only model 0 gets right), k = floor(h) - 1 for the head start
h: under D the counts are u = (L + h, L + k, 0, ..), the untrained model ahead by g = h - k in [1, 2); D' adds
a canary to B that only model 1 gets right. Model 1 wins with probability e^(-epsilon_pf g / 2) / 2 under D
and e^(-epsilon_pf (g - 1) / 2) / 2 under D': a log ratio of exactly epsilon_pf / 2, the part's claim (and
epsilon_pf for permute-and-flip at twice its epsilon). Tests: {index = 1} and {index = 0}, each way
(Clopper-Pearson, pure DP), at half the error probability; the exact loss by enumerating permute-and-flip's
orders (:func:`exact_selection_loss`, apart from the mechanism's code).

Verdict. The result reports the part whose lower bound is the largest fraction of its claim (so it exceeds
its claim when either part does: ``consistent`` is false, ``gsd audit`` prints PRIVACY BUG and exits 1);
``details["parts"]`` has both. Three kinds of errors split the 95% (Bonferroni): each part at half.

Mutants (``bug``; the audit's teeth). Each is applied to the mechanism's own code for the audit's duration
(:func:`mutant`, restored after): ``half-scale`` halves the fit noise inside ``noise_std``; ``half-z`` makes
``run_dp_probe`` pass z / 2 to ``dp_probe_at``; ``double-pf-epsilon`` runs permute-and-flip at twice its
epsilon; ``public-seed`` draws each trial from its public seed i under both neighbours.

Power (--epsilon 2, M = 4, 5,000 draws per neighbour and part, the default :data:`DRAWS`; measured in
``docs/audit.md``, checked in ``tests/test_audit_dp_probe.py``): the fit part's Gaussian-DP fit has a standard
error of about sqrt(2 / N) = 0.02 on mu (0.231 correct, 0.462 with the noise halved, 0.268 at the claim), so
halved noise or a halved z lands far above the claim and a false alarm needs the estimate 4 standard errors
high; the selection part sees model 1 win with probability 0.206 under D against 0.340 under D' (correct: log
ratio 0.5, the claim) and 0.085 against 0.231 at twice the epsilon (log ratio 1.0, twice the claim).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np

from ..errors import GSDError
from .bound import AuditResult, clopper_pearson, gdp_epsilon, gdp_mu_bounds

#: the mutants of :func:`mutant` (applied to the mechanism's code) and what each breaks
MUTANTS = {"half-scale": "the fit noise halved inside noise_std",
           "half-z": "run_dp_probe passes z / 2 to dp_probe_at (the probe's z halved at the call site)",
           "double-pf-epsilon": "permute-and-flip run at twice its epsilon"}
BUGS = (*MUTANTS, "public-seed")
#: thresholds of the fit part's tail tests, in units of the claimed noise's sd, fixed before any draw
THRESHOLDS = (0.5, 1.0, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0)
#: default draws per neighbour (and part); the fit part's replay test uses the first REPLAY_DRAWS of them
DRAWS, REPLAY_DRAWS = 5_000, 1000
#: the default number of models M (the untrained one and 3 candidates) and the most the audit takes
MODELS, MAX_MODELS = 4, 8
#: the partition's salt: public and fixed (the theorem holds for every salt, proof (a))
SALT = b"gsd audit dp-probe: a public salt"
#: the fit-pair canary's features under every model: along a coordinate axis, where ||v(x)|| is largest
CANARY_SCALE = 5.0
#: the selection pair's fit half: n = max(FIT_MIN, FIT_MARGIN sigma) examples of each class
FIT_MIN, FIT_MARGIN = 100, 50.0
#: the selection pair's examples every model but 0 and 1 gets wrong: their coins below e^-LOSERS_LOG
LOSERS_LOG = 30.0


@contextmanager
def mutant(bug: str | None):
    """While active, the mechanism's own code carries ``bug`` (one of :data:`MUTANTS`; anything else:
    unchanged): ``noise_std`` halved, ``dp_probe_at`` called with z / 2, or ``permute_and_flip`` at twice
    its epsilon, each replaced in its module and restored on exit."""
    from ..privacy import probe_mechanism as pm
    from ..privacy import selection

    if bug not in MUTANTS:
        yield
        return
    if bug == "half-scale":
        module, name, real = pm, "noise_std", pm.noise_std
        fake = lambda z: real(z) / 2  # noqa: E731
    elif bug == "half-z":
        module, name, real = pm, "dp_probe_at", pm.dp_probe_at
        fake = lambda *a, z, **k: real(*a, z=z / 2, **k)  # noqa: E731
    else:
        module, name, real = selection, "permute_and_flip", selection.permute_and_flip
        fake = lambda u, epsilon, sensitivity, rng: real(u, 2 * epsilon, sensitivity, rng)  # noqa: E731
    setattr(module, name, fake)
    try:
        yield
    finally:
        setattr(module, name, real)


def _named(prefix: str, count: int, fit: bool, start: int = 0) -> list[str]:
    """``count`` identities ``prefix-i`` (i from ``start``) that :data:`SALT` puts in the fit half (``fit``) or
    the score half."""
    from ..privacy import probe_mechanism as pm

    out, i = [], start
    while len(out) < count:
        names = [f"{prefix}-{j}" for j in range(i, i + 2 * (count - len(out)) + 16)]
        out += [n for n, a in zip(names, pm.split_parts(names, SALT)) if bool(a) == fit][:count - len(out)]
        i += len(names)
    return out


def _with_parts(data: dict) -> dict:
    from ..privacy import probe_mechanism as pm

    return {**data, "parts": pm.split_parts(data["identities"], SALT)}


def probe_neighbours(models: int = MODELS, examples: int = 8, num_classes: int = 2, dims: int = 2):
    """The fit pair (D, D'), each a dict of ``features`` (one (n, dims) array per model), ``labels``,
    ``identities``, ``parts`` (by :data:`SALT`) and ``num_classes``: ``examples`` public examples (features
    from a fixed public seed), and the same plus the canary (features 5 e_1 under every model, label 1, the
    first identity ``canary-i`` in the fit half)."""
    if models < 2 or examples < 0 or num_classes < 2 or dims < 1:
        raise GSDError("the DP probe audit needs at least 2 models, 2 classes and 1 feature")
    pub = np.random.default_rng(20240052)  # public: the examples of D are known to the auditor
    feats = [pub.normal(size=(examples, dims)) for _ in range(models)]
    labels = pub.integers(0, num_classes, size=examples)
    ids = [f"example-{i}" for i in range(examples)]
    canary = _named("canary", 1, fit=True)[0]
    x = np.zeros((1, dims))
    x[0, 0] = CANARY_SCALE
    D = {"features": feats, "labels": labels, "identities": ids, "num_classes": num_classes}
    D2 = {"features": [np.vstack([f, x]) for f in feats], "labels": np.append(labels, 1), "identities": [*ids, canary],
          "num_classes": num_classes}
    return _with_parts(D), _with_parts(D2)


def selection_neighbours(models: int, epsilon_pf: float, z: float):
    """The selection pair (D, D', design) of the module docstring: dicts as :func:`probe_neighbours`', and
    ``design`` with the counts ``u_D``, ``u_D'`` (head start included) every draw scores, and the sizes."""
    from ..privacy import probe_mechanism as pm

    if models < 2:
        raise GSDError("the DP probe audit needs at least 2 models")
    n = max(FIT_MIN, math.ceil(FIT_MARGIN * z * math.sqrt(2.0)))
    head = pm.head_start(models, epsilon_pf)
    k = math.floor(head) - 1
    L = math.ceil(2 * LOSERS_LOG / epsilon_pf)
    # rows: (feature under each model, label), fit half first: +1 -> 1 and -1 -> 0 under every model
    right = {"both": [1, 1], "model-1": [-1, 1], "model-0": [1, -1]}
    kind, count = ("model-1", k) if k >= 0 else ("model-0", -k)
    rows = [([1] * models, 1)] * n + [([-1] * models, 0)] * n
    rows += [(right["both"] + [-1] * (models - 2), 1)] * L + [(right[kind] + [-1] * (models - 2), 1)] * count
    ids = _named("fit", 2 * n, fit=True) + _named("score", L + count, fit=False)
    canary_row = (right["model-1"] + [-1] * (models - 2), 1)
    canary = _named("canary", 1, fit=False)[0]

    def data(rs, names) -> dict:
        feats = np.array([r[0] for r in rs], dtype=np.float64)
        return _with_parts({"features": [feats[:, [c]] for c in range(models)], "labels": np.array([r[1] for r in rs]),
                            "identities": names, "num_classes": 2})

    u = np.zeros(models)
    u[0], u[1] = L + head + (count if kind == "model-0" else 0), L + (count if kind == "model-1" else 0)
    u2 = u.copy()
    u2[1] += 1
    design = {"u_D": u.tolist(), "u_D'": u2.tolist(), "fit_per_class": n, "score_both": L, "score_" + kind: count,
              "head_start": head, "lead_under_D": float(u[0] - u[1])}
    return data(rows, ids), data([*rows, canary_row], [*ids, canary]), design


def canary_shift_by_hand(models: int) -> float:
    """||V||: the fit canary's change of the M statistics, written apart from the mechanism's code. Its
    normalised row is f = (e_1 + e_D) / sqrt(2): upper(f f^T) has the three entries 1/2 (squares sum to
    3/4) and f y^T has ||f|| ||y|| = 1, so ||v_c||^2 = 7/4 per model."""
    return math.sqrt(models * (0.75 + 1.0))


def exact_gaussian_loss(mu: float, delta: float) -> float:
    """The fit pair's exact epsilon at ``delta``: mu-GDP's curve (module docstring) at ``mu``."""
    return gdp_epsilon(mu, delta)


def exact_selection_loss(u, u2, epsilon_pf: float) -> float:
    """max over indices j of |log P_D[j] / P_D'[j]| for permute-and-flip at ``epsilon_pf`` (sensitivity 1)
    on the counts ``u`` and ``u2``, its law by enumerating the M! orders (:func:`.dpselect.pf_law`)."""
    from .dpselect import pf_law

    p, p2 = pf_law(np.asarray(u, float), epsilon_pf / 2), pf_law(np.asarray(u2, float), epsilon_pf / 2)
    return float(max(abs(math.log(a / b)) for a, b in zip(p, p2) if a > 0 and b > 0))


def _run(plan, data: dict, gen, observe=None) -> int:
    """One release of the mechanism on ``data``: :func:`~gsd_cli.privacy.probe_mechanism.run_dp_probe`, looked
    up at call time (so a :func:`mutant` in force is the code that runs)."""
    from ..privacy import probe_mechanism as pm

    return pm.run_dp_probe(plan, data["features"], data["labels"], data["parts"], data["num_classes"], rng=gen,
                           observe=observe)


def _releases(plan, data: dict, gen) -> np.ndarray:
    """The M fit releases of one run on ``data``, concatenated (read through ``observe``)."""
    seen: list[np.ndarray] = []
    _run(plan, data, gen, lambda c, r: seen.append(np.asarray(r, dtype=np.float64)))
    if len(seen) != plan.models:
        raise GSDError(f"the DP probe made {len(seen)} fit releases, not one per model ({plan.models})")
    return np.concatenate(seen)


def _exact_statistics(data: dict) -> np.ndarray:
    """T(data): the M exact fit statistics, concatenated, by the mechanism's steps 1-3 without noise."""
    from ..privacy import probe_mechanism as pm

    a = data["parts"]
    y = pm.one_hot(np.asarray(data["labels"], dtype=np.int64)[a], data["num_classes"])
    return np.concatenate([pm.fit_statistics(pm.normalise(phi)[a], y) for phi in data["features"]])


def _tail_bound(k_in: int, k_out: int, n: int, delta: float, level: float) -> tuple[float, float, float]:
    """epsilon >= log((lower(P_in) - delta) / upper(P_out)) from k_in of n draws in the region under
    one neighbour and k_out of n under the other (two-sided Clopper-Pearson at ``level``, one side each)."""
    lo = clopper_pearson(k_in, n, level)[0] - delta
    hi = clopper_pearson(k_out, n, level)[1]
    return (math.log(lo / hi) if lo > 0 and hi > 0 else 0.0), lo + delta, hi


def _best_count(tests, n: int, delta: float, level: float, best: float = 0.0, how: dict | None = None):
    """The best :func:`_tail_bound` over ``tests`` = ``[(how, k_in, k_out)]`` of ``n`` draws each."""
    how = how or {}
    for info, k_in, k_out in tests:
        e, lo, hi = _tail_bound(k_in, k_out, n, delta, level)
        if e > best:
            best, how = e, {**info, "p_lower": lo, "p_upper": hi, "correct": k_in + (n - k_out), "trials": 2 * n}
    return best, how


def _fit_part(plan, draws: int, gen_for, delta: float, alpha: float) -> dict:
    """The fit part (module docstring) at error probability ``alpha``: ``draws`` end-to-end runs under each
    neighbour of :func:`probe_neighbours`, the M releases read as made; its bound, claim and tests."""
    from ..privacy import probe_mechanism as pm

    D, D2 = probe_neighbours(plan.models)
    if not D2["parts"][-1]:  # pragma: no cover - probe_neighbours picks the canary in the fit half
        raise GSDError("the DP probe audit's fit canary is not in the fit half")
    centre = _exact_statistics(D)
    shift = _exact_statistics(D2) - centre  # v(x), by the mechanism's code
    sigma = plan.z * math.sqrt(2.0)  # the claimed noise, from the docstring (sigma = z sqrt 2), not from the code
    norm_v = float(np.linalg.norm(shift))
    direction = shift / (norm_v * sigma)
    replays = min(draws, REPLAY_DRAWS)
    s_d, s_d2, eq_d, eq_d2 = np.empty(draws), np.empty(draws), 0, 0
    tol = 1e-9 * max(1.0, sigma)
    for i in range(draws):
        a, b = _releases(plan, D, gen_for(i)), _releases(plan, D2, gen_for(i))
        s_d[i], s_d2[i] = (a - centre) @ direction, (b - centre) @ direction
        if i < replays:  # what the code makes from D with draw i's public seed i
            ref = _releases(plan, D, np.random.default_rng(i))
            eq_d, eq_d2 = eq_d + int(np.abs(a - ref).sum() <= tol), eq_d2 + int(np.abs(b - ref).sum() <= tol)
    mu_claimed = norm_v / sigma
    level = alpha / 2 / (2 * len(THRESHOLDS) + 1)  # half for the counting tests, half for the Gaussian-DP fit
    tests = []
    for t in THRESHOLDS:
        tests.append(({"statistic": "projection", "test": "D' over D", "region": f"s > {t:g}"},
                      int((s_d2 > t).sum()), int((s_d > t).sum())))
        tests.append(({"statistic": "projection", "test": "D over D'", "region": f"s <= mu - {t:g}"},
                      int((s_d <= mu_claimed - t).sum()), int((s_d2 <= mu_claimed - t).sum())))
    best, how = _best_count(tests, draws, delta, level)
    best, how = _best_count([({"statistic": "replay", "test": "D over D'",
                               "region": "release equals the public-seed replay of D"}, eq_d, eq_d2)], replays, delta, level, best, how)
    counted = how
    mu_hat, mu_lo, _ = gdp_mu_bounds(s_d, s_d2, 1 - alpha / 2)
    eps_gdp = gdp_epsilon(mu_lo, delta) if np.isfinite(mu_lo) else 0.0
    if eps_gdp > best:
        best, how = eps_gdp, {"statistic": "Gaussian-DP fit (Nasr et al. 2023)", "mu_lower": mu_lo,
                              "correct": int(counted.get("correct", draws)), "trials": int(counted.get("trials", 2 * draws))}
    mu_exact = canary_shift_by_hand(plan.models) / sigma
    claim = pm.selection_epsilon(plan.models, plan.z, 0.0, delta)  # the M Gaussian releases' part of the theorem
    return {"claim": claim, "delta": delta, "epsilon_lower_bound": best, "best_test": how, "best_counting_test": counted,
            "exact_loss": exact_gaussian_loss(mu_exact, delta), "mu_exact": mu_exact, "canary_shift": norm_v,
            "canary_shift_by_hand": canary_shift_by_hand(plan.models), "noise_std_claimed": sigma,
            "gdp": {"mu_hat": mu_hat, "mu_lower": mu_lo, "mu_claimed": mu_claimed, "epsilon_lower": eps_gdp,
                    "claimed_mechanism_epsilon_exact": exact_gaussian_loss(mu_claimed, delta),
                    "noise_below_claim": bool(mu_lo > mu_claimed)},
            "replay_draws": replays, "replay_equal_under_D": eq_d, "replay_equal_under_D'": eq_d2,
            "mean_shift_sd": float(s_d2.mean() - s_d.mean()),
            "neighbours": (f"D = 8 public examples under each of {plan.models} models, D' = D + one canary with features "
                           "5 e1 in the fit half (add/remove one example)")}


def _selection_part(plan, draws: int, gen_for, alpha: float) -> dict:
    """The selection part (module docstring) at error probability ``alpha``: ``draws`` end-to-end runs under
    each neighbour of :func:`selection_neighbours`, the released index counted; its bound, claim and tests."""
    D, D2, design = selection_neighbours(plan.models, plan.epsilon_pf, plan.z)
    if D2["parts"][-1] or int(D["parts"].sum()) != 2 * design["fit_per_class"]:  # pragma: no cover - by _named
        raise GSDError("the DP probe audit's selection pair is not split as designed")
    idx_d = np.array([_run(plan, D, gen_for(i)) for i in range(draws)])
    idx_d2 = np.array([_run(plan, D2, gen_for(i)) for i in range(draws)])
    tests = []
    for j, who in ((1, "model 1 (the canary's)"), (0, "the untrained model")):
        k, k2 = int((idx_d == j).sum()), int((idx_d2 == j).sum())
        tests += [({"statistic": "released index", "test": "D' over D", "region": f"index = {j}: {who}"}, k2, k),
                  ({"statistic": "released index", "test": "D over D'", "region": f"index = {j}: {who}"}, k, k2)]
    best, how = _best_count(tests, draws, 0.0, alpha / len(tests))
    return {"claim": plan.epsilon_pf / 2, "delta": 0.0, "epsilon_lower_bound": best, "best_test": how,
            "exact_loss": exact_selection_loss(design["u_D"], design["u_D'"], plan.epsilon_pf), "design": design,
            "frequencies_D": np.bincount(idx_d, minlength=plan.models).tolist(),
            "frequencies_D'": np.bincount(idx_d2, minlength=plan.models).tolist(),
            "neighbours": (f"D = {2 * design['fit_per_class']} fit and {len(D['labels']) - 2 * design['fit_per_class']} "
                           "score examples, D' = D + one canary in the score half that only model 1 gets right "
                           "(add/remove one example)")}


def audit_dp_probe(epsilon: float = 2.0, delta: float = 1e-5, *, draws: int = DRAWS, models: int = MODELS,
                   pf_share: float = 0.5, insecure_seed: int | None = None, bug: str | None = None,
                   confidence: float = 0.95) -> AuditResult:
    """Audit the DP feature probe planned for (``epsilon``, ``delta``) and ``models`` models, run end to end
    (module docstring): ``draws`` runs under each neighbour of each part's pair. The result reports the part
    whose bound is the largest fraction of its claim (``details["reported_part"]``); ``details["parts"]`` has
    both, each with its claim, bound, exact loss and tests. ``bug``: a :data:`MUTANTS` key (applied to the
    mechanism's code while the audit runs) or ``public-seed`` (each draw from its public seed)."""
    from ..privacy import check_delta
    from ..privacy import probe_mechanism as pm
    from ..privacy.randomness import private_rng
    from .dpgsd import check_draw_audit

    check_draw_audit(epsilon, draws, insecure_seed, bug, BUGS, "DP probe")
    check_delta(delta)
    if isinstance(models, bool) or not isinstance(models, (int, np.integer)) or not 2 <= models <= MAX_MODELS:
        raise GSDError(f"--models {models}: the DP probe audit takes 2 to {MAX_MODELS} models (the untrained one and "
                       "1 to 7 candidates; permute-and-flip's exact law is enumerated over the M! orders)")
    plan = pm.plan_dp_probe(epsilon, delta, int(models), pf_share)
    rng = private_rng("audit-dp-probe", insecure_seed)

    def gen_for(i: int):  # the bug: draw i's generator reproduced from its public seed i, the same under D and D'
        return np.random.default_rng(i) if bug == "public-seed" else rng

    alpha = 1.0 - confidence
    with mutant(bug):
        parts = {"fit": _fit_part(plan, draws, gen_for, plan.delta, alpha / 2),
                 "selection": _selection_part(plan, draws, gen_for, alpha / 2)}
    name = max(parts, key=lambda p: parts[p]["epsilon_lower_bound"] / parts[p]["claim"])
    rep = parts[name]
    details = {"models": plan.models, "pf_share": pf_share, "noise_multiplier": plan.z, "noise_std": plan.z * math.sqrt(2.0),
               "epsilon_pf": plan.epsilon_pf, "epsilon_requested": float(epsilon), "claim_whole_mechanism": plan.epsilon,
               "claim_gaussian_releases": parts["fit"]["claim"], "claim_selection": parts["selection"]["claim"],
               "parts": parts, "reported_part": name, "exact_loss": rep["exact_loss"], "best_test": rep["best_test"],
               "draws_per_neighbour": draws, "bug": bug, "mutant": MUTANTS.get(bug),
               "audited": ("the released mechanism end to end (gsd_cli.privacy.probe_mechanism.run_dp_probe: fit, score, "
                           "permute-and-flip) at M models; each part against its own claim"),
               "confidence_split": "Bonferroni: the fit part and the selection part at half the error probability each",
               "dp_randomness": "insecure seed" if insecure_seed is not None else "operating system"}
    how = rep["best_test"]
    trials = int(how.get("trials", 2 * draws))
    return AuditResult("dp-probe", float(rep["claim"]), float(rep["delta"]), float(rep["epsilon_lower_bound"]), trials, trials,
                       int(how.get("correct", trials // 2)), confidence, details)


__all__ = ["BUGS", "DRAWS", "MODELS", "MUTANTS", "THRESHOLDS", "audit_dp_probe", "canary_shift_by_hand", "exact_gaussian_loss",
           "exact_selection_loss", "mutant", "probe_neighbours", "selection_neighbours"]
