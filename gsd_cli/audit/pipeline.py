"""Audit of ``gsd rank --dp`` as a user runs it: the whole pipeline, not the sampler alone.

:mod:`.dpgsd` audits the exponential mechanism on hand-made matrices; a bug *around* it (the private
draw seeded from the public ``--seed``, a cache that returns an earlier private side, a draw that
ignores the secret generator) leaves the sampler correct and the release deterministic. This audit
runs :func:`gsd_cli.ranking.rank` with ``dp=True`` end to end on two neighbouring private data sets
written to files, D (``examples`` random images) and D' = D plus one canary image, against fixed public
candidates, with a tiny model, ``trials`` times each, trial i with the public seed i.

Statistic (fixed in advance): a *replay*. For each trial the auditor runs the pipeline once more on D
with the same arguments and seed; the test says "D" when the trial's released distances equal that
replay's to 1e-12. A correct pipeline draws its private randomness from the operating system, so two
runs never release equal continuous outputs (P = 0 under D and under D': no power, as it should be;
the DP energy distance is clamped at 0, so two releases whose distances are all 0 are equal by chance,
in about 1 ranking in 130 at the tests' settings, at a rate the test bounds like any other);
a pipeline whose private side is a function of public inputs releases the replay's exact output
under D and a different one under D' (P = 1 against 0). Clopper-Pearson bounds on both frequencies
give epsilon >= log(lo / hi) at the stated confidence (:func:`.bound.distinguishing_epsilon`).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import numpy as np

from ..errors import GSDError
from .bound import AuditResult, distinguishing_epsilon

BUGS = ("public-seed",)
#: the model of the audited rankings: small and fast, the pipeline's code path is what matters
MODEL, PARAMS, SIZE = "fmnist-cnn", "fc2*", 28


@contextlib.contextmanager
def _bug(bug: str | None):
    """``public-seed``: the private generator of the DP-GSD distance (and of DP energy, which inherits
    it) seeded from the public ``--seed`` (the bug of gsd before 0.2.0, put back for the audit's teeth)."""
    if bug is None:
        yield
        return
    if bug not in BUGS:
        raise GSDError(f"unknown DP-GSD pipeline bug {bug!r}; use one of {', '.join(BUGS)}")
    from ..distance import dpgsd

    real = dpgsd.private_rng
    dpgsd.private_rng = lambda stream, insecure_seed=None, *words: np.random.default_rng(words[0] if words else 0)
    try:
        yield
    finally:
        dpgsd.private_rng = real


def _write_sets(folder: Path, examples: int, rng: np.random.Generator) -> tuple[str, str, list[str]]:
    x = rng.integers(0, 256, size=(examples + 1, SIZE, SIZE), dtype=np.uint8)
    y = np.arange(examples + 1) % 2
    classes = np.array(["a", "b"])
    np.savez(folder / "D.npz", x=x[:examples], y=y[:examples], classes=classes)
    np.savez(folder / "D1.npz", x=x, y=y, classes=classes)  # D' = D + the canary (the last image)
    pubs = []
    for j in range(2):
        np.savez(folder / f"pub{j}.npz", x=rng.integers(0, 256, size=(examples, SIZE, SIZE), dtype=np.uint8), y=np.arange(examples) % 2)
        pubs.append(f"npz:{folder / f'pub{j}.npz'}")
    return f"npz:{folder / 'D.npz'}", f"npz:{folder / 'D1.npz'}", pubs


#: the most trials per neighbour ``trials=None`` (auto) runs: about a minute on a 2-core CPU; a perfectly
#: replayed pipeline is then flagged up to a claim of about 2.9 (a replay bug does not depend on epsilon:
#: audit a larger claim's pipeline at a smaller --epsilon)
AUTO_TRIALS_MAX = 100
#: the fewest trials auto runs
AUTO_TRIALS_MIN = 15


def replay_power(trials: int, confidence: float) -> float:
    """The bound the replay test gives a pipeline whose every release under D equals its replay and none
    under D' does (the most a bug can show): the test's statistic with ``trials`` of ``trials`` against 0."""
    return distinguishing_epsilon(np.zeros(trials), np.ones(trials), (0.5,), confidence)[0]


def trials_to_flag(epsilon: float, confidence: float, most: int = AUTO_TRIALS_MAX) -> tuple[int, bool]:
    """``(trials, enough)``: the fewest trials per neighbour (at least :data:`AUTO_TRIALS_MIN`) at which
    the replay test flags a perfectly replayed pipeline at the claim ``epsilon`` (its bound exceeds it),
    or ``(most, False)`` when ``most`` trials cannot."""
    if replay_power(most, confidence) <= epsilon:
        return most, False
    lo, hi = AUTO_TRIALS_MIN, most
    if replay_power(lo, confidence) > epsilon:
        return lo, True
    while hi - lo > 1:  # the bound grows with the trials
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if replay_power(mid, confidence) > epsilon else (mid, hi)
    return hi, True


def audit_dpgsd_pipeline(epsilon: float = 1.0, *, trials: int = 15, examples: int = 8, clip: float = 1.0,
                         insecure_seed: int | None = None, bug: str | None = None, confidence: float = 0.95,
                         distance: str = "dp-gsd") -> AuditResult:
    """Audit ``gsd rank --dp`` end to end at ``epsilon`` (module docstring): ``trials`` rankings under
    each neighbour plus one replay each (3 x ``trials`` rankings of a tiny model). ``bug``: one of
    :data:`BUGS`. ``insecure_seed``: each ranking's private randomness from (seed, trial, side),
    for a repeatable audit (a *fixed* insecure seed for every call would be flagged, rightly).
    ``distance``: the private ranking audited, ``dp-gsd`` (the Bingham draw) or ``dp-energy`` (the
    default of ``gsd rank --dp``: Laplace noise on each candidate's energy; its released distance is
    clamped to [0, 1], so give it enough ``examples`` that the energies are not all clamped, e.g. 200
    at epsilon 0.5, or the bug's releases under D and D' both clamp alike)."""
    from ..ranking import rank
    from ..privacy.randomness import check_insecure_seed

    check_insecure_seed(insecure_seed)
    if distance not in ("dp-gsd", "dp-energy", "dp-select"):
        raise GSDError(f"the pipeline audit runs dp-gsd, dp-energy or dp-select, not {distance!r}")
    if trials < 5 or examples < 2:
        raise GSDError("the DP-GSD pipeline audit needs at least 5 trials and 2 examples")
    if not epsilon > 0:
        raise GSDError(f"--epsilon must be positive (got {epsilon})")
    rng = np.random.default_rng(0x9A7)  # the audit's data: public, fixed
    out = {"D": [], "D'": [], "replay": []}
    from ..privacy.budget import unbooked

    # the audit's neighbours are synthetic images it writes itself: no user's data, nothing to book
    with tempfile.TemporaryDirectory(prefix="gsd-audit-") as tmp, _bug(bug), unbooked("the audit's synthetic neighbours"):
        d, d1, pubs = _write_sets(Path(tmp), examples, rng)

        def released(private: str, trial: int, side: int) -> np.ndarray:
            ins = None if insecure_seed is None else int(insecure_seed) * 1_000_003 + 3 * trial + side
            rk = rank(private, pubs, dp=True, epsilon=epsilon, clip=clip, examples=examples + 1, k=1, model=MODEL, params=PARAMS,
                      engine="vmap", seed=trial, labels="own", insecure_seed=ins, distance=distance)
            got = {r.public: r.distance for r in rk.results}  # a selection releases the chosen candidates only: NaN for the rest
            return np.array([got.get(n, np.nan) for n in sorted([*got, *rk.not_selected])])

        for i in range(trials):
            out["D"].append(released(d, i, 0))
            out["D'"].append(released(d1, i, 1))
            out["replay"].append(released(d, i, 2))
    ref = np.stack(out["replay"])

    def same(x: np.ndarray) -> np.ndarray:  # the same candidates released, with the same numbers to 1e-12
        return np.all(np.isclose(x, ref, rtol=0.0, atol=1e-12, equal_nan=True), axis=1).astype(float)

    same_d, same_d1 = same(np.stack(out["D"])), same(np.stack(out["D'"]))
    # region S = "equals the replay": the count under D is the statistic above 0.5
    e, how = distinguishing_epsilon(same_d1, same_d, (0.5,), confidence)
    details = {"audit": "gsd rank --dp end to end, replay test", "trials": trials, "examples": examples, "model": MODEL,
               "bug": bug, "equal_to_replay_under_D": int(same_d.sum()), "equal_to_replay_under_D'": int(same_d1.sum()),
               "best_test": how,
               "dp_randomness": "insecure seed per call" if insecure_seed is not None else "operating system"}
    correct = int(how.get("correct", 0)) if how else trials
    details["distance"] = distance
    name = "dpgsd (pipeline)" if distance == "dp-gsd" else f"{distance} (pipeline)"
    return AuditResult(name, float(epsilon), 0.0, float(e), 1, 2 * trials, correct, confidence, details)
