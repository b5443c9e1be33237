"""Empirical privacy audits (issue 20): lower bounds on epsilon, observed, beside the claimed one.

* :func:`audit_training`: the one-run white-box canary audit of Steinke, Nasr and Jagielski (2023)
  of a trainer (dpsgd, gep, rgp, topagg, second-phase stage 2, ``--sparsify``) through its real
  transform chain, Poisson sampling, clip and noise (:mod:`.trainers`).
* :func:`audit_dpgsd`: a distinguishing audit of DP-GSD's exponential mechanism on neighbouring
  low-dimensional matrices, and the exact privacy loss of the pair (:mod:`.dpgsd`).
* :func:`audit_dp_energy`, :func:`audit_dp_select`: the DP energy distance's Laplace mechanism and
  the DP selection (permute-and-flip and the chosen score), on a worst-case neighbouring pair with its
  exact privacy loss (:mod:`.dpenergy`, :mod:`.dpselect`).
* :func:`audit_dp_probe`: the DP feature probe (``gsd train``'s DP advice) run end to end (fit, score,
  permute-and-flip) at M models, each part on its own worst-case add-one pair with its exact loss and
  against its own claim; flags halved fit noise, a halved z at the call site, permute-and-flip at twice
  its epsilon and noise from a public seed (:mod:`.dpprobe`).
* :func:`audit_step`: a many-trial distinguishing audit of one full-batch step of dpsgd or
  second-phase stage 2 (:mod:`.step`), tight enough to flag halved noise, which the one-run audit
  cannot.
* :mod:`.bound`: the statistics (the one-run bound, Clopper-Pearson).

An audit lower bound can refute a privacy claim (epsilon_emp > claimed: a bug in the code or the
analysis, at 95% confidence) but never prove one: epsilon_emp <= claimed says only that this
audit, with these canaries, found nothing.
"""

from .bound import AuditResult, audit_epsilon, clopper_pearson, distinguishing_epsilon, one_run_epsilon, one_run_p_value
from .dpgsd import audit_dpgsd, exact_privacy_loss
from .dpenergy import audit_dp_energy
from .dpselect import audit_dp_select
from .dpprobe import audit_dp_probe
from .pipeline import audit_dpgsd_pipeline
from .step import STEP_METHODS, audit_step
from .trainers import BUGS, audit_config, audit_training, inject_bug

METHODS = ("dpsgd", "gep", "rgp", "topagg", "second-phase", "dpsgd+rs", "gep+rs", "dpgsd", "dp-energy", "dp-select", "dp-probe")


def audit(method: str, epsilon: float = 2.0, delta: float = 1e-5, *, canaries: int = 1000, insecure_seed: int | None = None,
          bug: str | None = None, settings: dict | None = None, **kw) -> AuditResult:
    """Audit ``method`` (one of :data:`METHODS`) at (``epsilon``, ``delta``): DP-GSD by
    :func:`audit_dpgsd` (``canaries`` draws per neighbour; pure DP, delta unused), the DP probe by
    :func:`audit_dp_probe` (``canaries`` draws per neighbour and part, at ``delta``; ``models`` in ``kw``), every trainer by
    :func:`audit_training` with ``settings`` (TrainConfig fields) and ``kw`` (its options)."""
    from ..errors import GSDError
    from ..privacy import check_delta, check_epsilon
    from ..privacy.randomness import check_seed

    if method not in METHODS:
        raise GSDError(f"unknown --method {method!r}; use one of {', '.join(METHODS)}")
    check_epsilon(epsilon)
    check_seed("--seed", kw.get("seed", (settings or {}).get("seed")))
    check_seed("--insecure-seed", insecure_seed)
    if method == "dpgsd":
        return audit_dpgsd_both(epsilon, draws=canaries, insecure_seed=insecure_seed, bug=bug, **kw)
    if method == "dp-energy":
        return audit_dp_energy_both(epsilon, draws=canaries, insecure_seed=insecure_seed, bug=bug, **kw)
    if method == "dp-select":
        return audit_dp_energy_both(epsilon, draws=canaries, insecure_seed=insecure_seed, bug=bug, distance="dp-select", **kw)
    check_delta(delta)
    if method == "dp-probe":
        return audit_dp_probe(epsilon, delta, draws=canaries, insecure_seed=insecure_seed, bug=bug, **kw)
    cfg = audit_config(method, epsilon, delta, **(settings or {}))
    return audit_training(cfg, canaries=canaries, insecure_seed=insecure_seed, bug=bug, **kw)


def _trials(trials: int | None, epsilon: float, confidence: float) -> tuple[int, dict]:
    """The pipeline audit's trials per neighbour: as given, or (None) the fewest that would flag a
    perfectly replayed pipeline at ``epsilon`` (:func:`~.pipeline.trials_to_flag`), with what was chosen."""
    from .pipeline import replay_power, trials_to_flag

    if trials is not None:
        return int(trials), {"pipeline_trials": int(trials), "pipeline_can_flag_replay": replay_power(int(trials), confidence) > epsilon}
    n, enough = trials_to_flag(epsilon, confidence)
    return n, {"pipeline_trials": n, "pipeline_trials_auto": True, "pipeline_can_flag_replay": enough}


def audit_dpgsd_both(epsilon: float, *, draws: int = 2000, trials: int | None = None, insecure_seed: int | None = None,
                     bug: str | None = None, confidence: float = 0.95, **kw) -> AuditResult:
    """``gsd audit --method dpgsd``: the sampler (:func:`audit_dpgsd`, ``draws`` per neighbour) and the
    pipeline a user runs (:func:`audit_dpgsd_pipeline`, ``trials`` rankings per neighbour; None: the
    fewest that would flag a replayed pipeline at ``epsilon``, at most 100), each at half the error
    probability (Bonferroni), the larger bound reported. ``bug``: one of the sampler's
    bugs (``public-seed`` in the sampler call) or ``pipeline-public-seed`` (the DP-GSD distance's
    generator seeded from ``--seed``)."""
    half = 1 - (1 - confidence) / 2
    sampler_bug = bug if bug in (None, "public-seed") else None
    pipe_bug = "public-seed" if bug == "pipeline-public-seed" else None
    if bug is not None and sampler_bug is None and pipe_bug is None:
        from ..errors import GSDError

        raise GSDError(f"unknown DP-GSD bug {bug!r}; use public-seed (the sampler's) or pipeline-public-seed")
    trials, auto = _trials(trials, epsilon, half)
    a = audit_dpgsd(epsilon, draws=draws, insecure_seed=insecure_seed, bug=sampler_bug, confidence=half, **kw)
    b = audit_dpgsd_pipeline(epsilon, trials=trials, insecure_seed=insecure_seed, bug=pipe_bug, confidence=half,
                             clip=kw.get("clip", 1.0))
    best = max((a, b), key=lambda r: r.epsilon_lower_bound)
    details = {**(a.details or {}), "sampler": a.to_dict(), "pipeline": b.to_dict(), "best_audit": best.method,
               "confidence_split": "Bonferroni: each audit at half the error probability", **auto}
    # the counts of the audit whose bound is reported (correct guesses and guesses of one test, never mixed)
    return AuditResult("dpgsd", float(epsilon), 0.0, best.epsilon_lower_bound, best.canaries, best.guesses, best.correct,
                       confidence, details)


def audit_dp_energy_both(epsilon: float, *, draws: int = 2000, trials: int | None = None, examples: int = 200,
                         insecure_seed: int | None = None, bug: str | None = None, confidence: float = 0.95,
                         clip: float = 1.0, distance: str = "dp-energy") -> AuditResult:
    """``gsd audit --method dp-energy`` (``distance="dp-energy"``: the Laplace noisy order,
    :func:`audit_dp_energy`) or ``--method dp-select`` (``"dp-select"``: ``gsd rank --dp``'s default,
    the DP selection, :func:`audit_dp_select`): the mechanism (``draws`` per neighbour) and the pipeline
    a user runs (:func:`audit_dpgsd_pipeline` with that ``distance``, ``trials`` rankings per neighbour
    of ``examples`` rows; None: as for DP-GSD), each at half the error probability (Bonferroni), the
    larger bound reported.
    ``bug``: the mechanism's (``half-scale``, ``public-seed``) or ``pipeline-public-seed``."""
    from .dpenergy import BUGS as ENERGY_BUGS
    from .dpselect import BUGS as SELECT_BUGS

    bugs, label = (SELECT_BUGS, "DP selection") if distance == "dp-select" else (ENERGY_BUGS, "DP energy")
    half = 1 - (1 - confidence) / 2
    mech_bug = bug if bug in bugs else None
    pipe_bug = "public-seed" if bug == "pipeline-public-seed" else None
    if bug is not None and mech_bug is None and pipe_bug is None:
        from ..errors import GSDError

        raise GSDError(f"unknown {label} bug {bug!r}; use {', '.join(bugs)} (the mechanism's) or pipeline-public-seed")
    trials, auto = _trials(trials, epsilon, half)
    mech = audit_dp_select if distance == "dp-select" else audit_dp_energy
    a = mech(epsilon, draws=draws, clip=clip, insecure_seed=insecure_seed, bug=mech_bug, confidence=half)
    b = audit_dpgsd_pipeline(epsilon, trials=trials, examples=examples, clip=clip, insecure_seed=insecure_seed, bug=pipe_bug,
                             confidence=half, distance=distance)
    best = max((a, b), key=lambda r: r.epsilon_lower_bound)
    details = {**(a.details or {}), "sampler": a.to_dict(), "pipeline": b.to_dict(), "best_audit": best.method,
               "confidence_split": "Bonferroni: each audit at half the error probability", **auto}
    # the counts of the audit whose bound is reported (correct guesses and guesses of one test, never mixed)
    return AuditResult(distance, float(epsilon), 0.0, best.epsilon_lower_bound, best.canaries, best.guesses, best.correct,
                       confidence, details)


__all__ = [
    "audit_dp_energy", "audit_dp_energy_both", "audit_dp_probe", "audit_dp_select",
    "AuditResult", "BUGS", "METHODS", "STEP_METHODS", "audit", "audit_config", "audit_dpgsd", "audit_dpgsd_both",
    "audit_dpgsd_pipeline", "audit_step", "audit_epsilon", "audit_training", "clopper_pearson",
    "distinguishing_epsilon", "exact_privacy_loss", "inject_bug", "one_run_epsilon", "one_run_p_value",
]
