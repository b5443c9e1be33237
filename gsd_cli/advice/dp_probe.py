"""Which candidate the second phase starts from, or none, decided under DP: the DP feature probe (issue 52).

The private advice of ``gsd train --auto-select --select-epsilon E``.

The non-private advice (:mod:`gsd_cli.advice.decide` with :mod:`gsd_cli.advice.probe`) reads the private
examples without noise. This one releases a single index under differential privacy and nothing else
computed from the private data:

1. **Public part, no privacy cost.** The candidates the second phase can use (:func:`gsd_cli.advice.decide.second_phase_usable`:
   the private task's declared classes and 100 examples per class, public facts) each get stage 1 of the
   second phase with the run's own settings and ``--seed`` (:func:`gsd_cli.train.second_phase.run_second_phase`,
   trained once: :mod:`gsd_cli.train.second_phase.stage1_cache`, so the training that follows reads it); the untrained
   model (``--seed``) is the other contestant.
2. **Private part.** Every private training example's features under each of these M models (the input of the
   head, :func:`gsd_cli.advice.probe.head_features`, projected to :data:`PROBE_DIM` numbers by a public random
   matrix, :func:`project`: a public function of the example), its label, and its
   part (fit or score) by a keyed hash of the example's identity (:func:`gsd_cli.data.identity.cached_identities`,
   a salt from the operating system): :func:`gsd_cli.privacy.probe_mechanism.dp_probe_at` fits a ridge probe per
   model from Gaussian-noised sufficient statistics and picks one model by permute-and-flip on the held-out
   counts of correct predictions. Its theorem is in :mod:`gsd_cli.privacy.probe_mechanism`: the index is
   (epsilon, delta_S)-DP under add/remove-one neighbours, epsilon = ``--select-epsilon`` and
   delta_S = :data:`SELECTION_DELTA_SHARE` x ``--delta``, with the noise calibrated from public numbers only
   (M, epsilon, delta_S), so the booking comes before any private computation.
3. **Decision.** Index 0 (the untrained model, or the base alone where the run starts from ``--weights``: issue 61):
   ``--method auto`` trains DP-SGD without a candidate (from the base where one is given),
   ``--method second-phase`` is refused (exit 2) unless ``--no-fallback``; index c: the second phase with
   candidate c. With no candidate the second phase can use, nothing is spent and ``auto`` trains DP-SGD.

The run's total is ``--epsilon`` (and ``--delta``): the training gets ``--epsilon`` - E and ``--delta`` - delta_S,
basic composition (Dwork and Roth 2014, Theorem 3.16, which holds for adaptively chosen mechanisms:
the training is chosen after the selection), and every output states the split.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import data as gdata
from ..errors import GSDError

#: the share of ``--delta`` the DP probe's Gaussian part uses; the training gets the rest
SELECTION_DELTA_SHARE = 0.1
#: what the booking and the outputs call the mechanism
MECHANISM = "DP feature probe"
#: the features' dimension in the DP probe: a public random projection (from ``--seed``) of the head's
#: input to this many numbers; the noise of the fit's statistics does not grow with it, their signal
#: shrinks as 1/D (D x D second moments of unit vectors), so fewer dimensions fit better at equal epsilon
PROBE_DIM = 16


def project(features: np.ndarray, seed: int, dim: int = PROBE_DIM) -> np.ndarray:
    """``features`` (n, d) times a public Gaussian matrix (d, ``dim``) drawn from ``seed`` and d alone
    (a function of each example by itself: the mechanism's sensitivity is unchanged); d <= ``dim``: as they are."""
    d = features.shape[1]
    if d <= dim:
        return features
    p = np.random.default_rng([int(seed), 0xD9B0, d]).standard_normal((d, dim)) / np.sqrt(dim)
    return features @ p


def private_features(train_part, nets: list, spec, seed: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """``(features per model, labels, indices)`` of every private training example: the head's input under each
    of ``nets`` (:func:`gsd_cli.advice.probe.head_features`), projected (:func:`project`); decoded chunk by chunk."""
    from .probe import head_features

    n = len(train_part)
    idx = np.arange(n)
    feats: list[list[np.ndarray]] = [[] for _ in nets]
    for start in range(0, n, 256):
        part = idx[start:start + 256]
        x = gdata.to_model_input(gdata.read_images(train_part, part, spec.input_size), spec.input_size, spec.channels, "cpu")
        for j, net in enumerate(nets):
            feats[j].append(head_features(net, x).numpy().astype(np.float64))
    features = [project(np.concatenate(f), seed) if f else np.zeros((0, 1)) for f in feats]
    labels = np.asarray(train_part.labels(idx), dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
    return features, labels, idx


def split_budget(total_epsilon: float, total_delta: float, select_epsilon: float) -> tuple[float, float, float]:
    """``(training epsilon, training delta, selection delta)`` of a run whose total is (``total_epsilon``,
    ``total_delta``) and whose DP probe spends ``select_epsilon``: basic composition. Refused in one line
    when the selection would leave the training nothing."""
    if not select_epsilon < total_epsilon:
        raise GSDError(f"--select-epsilon {select_epsilon:g} must be below --epsilon {total_epsilon:g}, the run's total "
                       "(the selection's epsilon plus the training's); give a smaller --select-epsilon or a larger --epsilon")
    delta_s = SELECTION_DELTA_SHARE * total_delta
    return total_epsilon - select_epsilon, total_delta - delta_s, delta_s


def dp_probe_advice(train_part, candidates: list, settings, method: str, *, epsilon: float, delta: float, seed: int = 0,
                    device: str | torch.device | None = "cpu", insecure_seed: int | None = None, book=None, progress=None):
    """The DP advice (module docstring) for ``method`` (``auto`` or ``second-phase``) on the private training
    source ``train_part`` among ``candidates`` (sources) with the run's :class:`~gsd_cli.train.TrainConfig`
    ``settings``: ``(decision, selection)``, a :class:`gsd_cli.advice.decide.Decision` and the selection's record
    for the run's summary (public: settings, the candidates, the released winner, the privacy statement).
    ``book(epsilon, delta, curve, mechanism)`` books the release before any private computation (the
    privacy ledger); ``insecure_seed``: the private draws from a seed (not DP; for tests)."""
    from ..gradients import resolve_device
    from ..privacy import probe_mechanism as pm
    from ..privacy.randomness import private_rng
    from .decide import FALLBACK, Decision, describe, split_usable, without
    from .probe import draw_model, stage1_of, start_of
    from ..timing import stage

    num_classes = int(train_part.num_classes)
    start = start_of(settings)  # index 0: the untrained model, or the base alone (--weights)
    named = {getattr(c, "name", str(c)): c for c in candidates}
    facts = {n: describe(c) for n, c in named.items()}
    usable, why_not = split_usable(named, facts, num_classes)
    record = {"method": MECHANISM, "candidates": sorted(named), "usable": sorted(usable), "dp": insecure_seed is None,
              "seed": int(seed), "model": str(settings.model)}
    if not usable:
        why = "; ".join(why_not.values()) or "no candidates"
        record.update(winner=None, privacy=None, spent="nothing: no candidate the second phase can use, so nothing to choose")
        if method == "auto":
            return Decision(FALLBACK, None, True, f"--method auto: training DP-SGD {without(start)}: {why}",
                            evidence={"dp_probe": record}), record
        return Decision(method, None, False, f"--method {method}: no candidate the second phase can use ({why}); train with --method "
                        "dpsgd", refused=True, evidence={"dp_probe": record}), record
    models = 1 + len(usable)
    # the plan (calibration, curve, certified epsilon) from public numbers alone; the mechanism runs at it
    # (pm.run_dp_probe: the call gsd audit --method dp-probe audits end to end)
    plan = pm.plan_dp_probe(epsilon, delta, models)
    z, eps_pf, curve, achieved = plan.z, plan.epsilon_pf, list(plan.curve), plan.epsilon
    privacy = {"dp": insecure_seed is None, "exact": True, "release": "dp-probe", "mechanism": MECHANISM,
               "epsilon": float(epsilon), "epsilon_achieved": achieved, "delta": float(delta), "models": models,
               "noise_multiplier": z, "epsilon_select": eps_pf,
               "guarantee": (f"the released index (the winner among {start} and {len(usable)} candidate(s)) is "
                             f"({achieved:.4g}, {delta:.3g})-DP under add/remove-one neighbours: {models} Gaussian releases of "
                             f"ridge statistics (noise multiplier {z:.4g}, L2 sensitivity sqrt(2)) and permute-and-flip at epsilon "
                             f"{eps_pf:.4g}, RDP curves added (gsd_cli.privacy.probe_mechanism)")}
    record["privacy"] = privacy
    if book is not None:
        book(epsilon, delta, curve, f"{MECHANISM}: {models} Gaussian ridge releases (z={z:.4g}) + permute-and-flip (epsilon {eps_pf:.4g})")
    dev = resolve_device(device)
    spec, model0, names = draw_model(settings, num_classes, int(seed), dev)
    nets = [model0]
    for i, (name, _) in enumerate(usable.items()):  # public: stage 1 on each usable candidate (cached)
        nets.append(stage1_of(model0, names, spec, settings, name, named, int(seed), train_part, dev)[0])
        if progress:
            progress("dp probe", i + 1, len(usable) + 1)
    from ..data.identity import cached_identities

    with stage("probe fits"):  # the features, the partition and the mechanism
        features, labels, idx = private_features(train_part, nets, spec, seed)
        rng = private_rng("dp-probe", insecure_seed)
        salt = rng.bytes(32) if insecure_seed is not None else pm.new_salt()
        parts = pm.split_parts(cached_identities(train_part, idx), salt)
        winner = pm.run_dp_probe(plan, features, labels, parts, num_classes, rng=rng)
    if progress:
        progress("dp probe", len(usable) + 1, len(usable) + 1)
    chosen = None if winner == 0 else list(usable)[winner - 1]
    record["winner"] = chosen
    evidence = {"dp_probe": record}
    if chosen is not None:
        return Decision("second-phase", chosen, False,
                        f"--method {method}: second-phase with {chosen} (the DP feature probe chose it over {start} and "
                        f"{len(usable) - 1} other candidate(s); epsilon {epsilon:g}, delta {delta:.3g})", evidence=evidence), record
    what = f"the DP feature probe chose {start} over {len(usable)} candidate(s) (epsilon {epsilon:g}, delta {delta:.3g})"
    if method == "auto":
        return Decision(FALLBACK, None, True, f"--method auto: training DP-SGD {without(start)}: {what}", evidence=evidence), record
    return Decision(method, list(usable)[0], False, f"--method {method}: {what}; train with --method dpsgd, or add --no-fallback to "
                    "train the second phase anyway", refused=True, evidence=evidence), record
