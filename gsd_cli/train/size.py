"""The size that sets a training run's mechanism: declared, or estimated under DP; never read off N.

A DP-SGD step samples each private example with probability q, and a run takes T steps; the
accountant's epsilon is a function of (q, T, sigma), and sigma is calibrated from (q, T). If q = B / N
and T = epochs * round(N / B) came from the exact private size N, then (i) the published
(sigma, q, T, epsilon) would determine N (scan N through the accountant until the published epsilon
comes out), and (ii) two neighbouring data sets would run two *different* mechanisms, which the
add/remove analysis of one subsampled Gaussian does not cover. So the size that sets the mechanism
comes from one of three places (:func:`mechanism_size`):

* ``--expected-size N0`` (declared, public): q = B / N0, T = epochs * round(N0 / B);
* ``--sampling-rate q`` (declared, public): T = epochs * round(1 / q);
* neither (the default): a DP estimate N~ = round(N + Laplace(1 / epsilon_N)), clamped to at least
  B (post-processing), with epsilon_N = ``--size-epsilon`` (default 2% of ``--epsilon``). The count
  N has sensitivity 1 under add/remove-one, so N~ is epsilon_N-DP (the Laplace mechanism, Dwork,
  McSherry, Nissim, Smith 2006; Dwork & Roth 2014, Theorem 3.6). The training run is then calibrated
  to (epsilon - epsilon_N, delta) for the q and T that N~ gives, and the whole release (N~, then the
  model) is (epsilon, delta)-DP by basic composition, which holds when the second mechanism is
  chosen after seeing the first's output (Dwork & Roth 2014, Theorem 3.16; Dwork, Rothblum, Vadhan
  2010): each training mechanism that N~ can select is (epsilon - epsilon_N, delta)-DP.

In each case the Poisson subsample itself still ranges over the real private examples (that is the
mechanism the accountant books: each example in with probability q, independently of the others and
of N); only the rate and the step count are fixed from public or privately released values. The
exact N remains a private output (``private-summary.json``), as do the realised batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import GSDError
from ..privacy.size_budget import SIZE_EPSILON_SHARE, size_epsilon  # noqa: F401 (the epsilon share, kept importable from here)


@dataclass(frozen=True)
class MechanismSize:
    """What sets the mechanism's sampling: ``q`` and ``steps_per_epoch``, where they came from
    (``how``: ``declared-size``, ``declared-rate`` or ``dp-estimate``), the size they stand for
    (``size``: N0 or N~; None for a declared rate) and the epsilon spent to estimate it (0 if declared)."""

    q: float
    steps_per_epoch: int
    how: str
    size: int | None
    epsilon: float

    def statement(self) -> dict:
        """The ``size`` entry of a run's privacy block (publishable: every value in it is public or DP)."""
        text = {
            "declared-size": "the sampling rate and the step count come from the declared --expected-size (public); "
                             "the private set's exact size is not used by the mechanism",
            "declared-rate": "the sampling rate is the declared --sampling-rate (public); the step count is "
                             "epochs x round(1 / q); the private set's exact size is not used by the mechanism",
            "dp-estimate": "the sampling rate and the step count come from a Laplace estimate of the private set's size "
                           "(epsilon_size-DP, sensitivity 1 under add/remove), composed with the training by basic "
                           "composition; the exact size is not used by the mechanism",
        }.get(self.how, "a run started by gsd 0.1: the sampling rate is batch_size / N for the exact private size N, which "
                        "it reveals; kept on --resume so that the run's mechanism does not change")
        return {"how": self.how, "size": self.size, "epsilon_size": self.epsilon, "sampling_rate": self.q,
                "steps_per_epoch": self.steps_per_epoch, "statement": text}


def check_size_settings(batch_size: int, expected_size, sampling_rate, declared_size_epsilon, epsilon: float) -> None:
    """User errors in the size settings, before any data is read (all of them are public)."""
    if expected_size is not None and sampling_rate is not None:
        raise GSDError("give --expected-size or --sampling-rate, not both")
    if expected_size is not None:
        if isinstance(expected_size, bool) or not isinstance(expected_size, (int, np.integer)) or expected_size < 2:
            raise GSDError(f"--expected-size must be a whole number >= 2 (got {expected_size!r})")
        if batch_size > expected_size:
            raise GSDError(f"--batch-size {batch_size} is larger than --expected-size {expected_size}; lower it")
    if sampling_rate is not None:
        if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, (int, float)) or not 0 < sampling_rate <= 1:
            raise GSDError(f"--sampling-rate must be in (0, 1] (got {sampling_rate!r})")
    if declared_size_epsilon is not None and (expected_size is not None or sampling_rate is not None):
        raise GSDError("--size-epsilon is only used when the size is estimated; drop it, or drop --expected-size/--sampling-rate")
    if declared_size_epsilon is not None:
        size_epsilon(epsilon, declared_size_epsilon)


#: the most steps a run may plan without ``--max-steps`` (``TrainConfig.max_steps``'s default): 100 epochs
#: of CIFAR-10 at batch 256 are 19,500; a plan above this is almost always a mistyped size or rate
MAX_STEPS = 100_000


class Info(str):
    """A public line of information for a trainer's ``notify`` (printed as information, not a warning)."""


def declared_steps_per_epoch(batch_size: int, expected_size, sampling_rate) -> int | None:
    """Steps per epoch of a declared size or rate (public: known before any data is read); None for the DP estimate."""
    if expected_size is not None:
        return max(1, round(expected_size / batch_size))
    if sampling_rate is not None:
        return max(1, round(1.0 / sampling_rate))
    return None


def check_plan(epochs: int, steps_per_epoch: int, max_steps: int, how: str) -> int:
    """The planned step count ``epochs x steps_per_epoch``, refused above ``max_steps`` (public: the plan
    is a function of public settings or of the DP size estimate). ``--sampling-rate 1e-300`` planned 1e301
    steps and hung; ``--expected-size 1e9`` on 48 examples planned 8e7."""
    how = {"declared-size": "--expected-size", "declared-rate": "--sampling-rate",
           "dp-estimate": "the DP estimate of the private set's size"}.get(how, how)
    total = int(epochs) * int(steps_per_epoch)
    if total > max_steps:
        shown = f"{total:,}" if total < 10**15 else f"{float(total):.3g}"
        raise GSDError(f"the run plans {shown} steps ({epochs} epochs x {steps_per_epoch:.6g} steps per epoch, from {how}), "
                       f"more than --max-steps {max_steps:,}: check --expected-size/--sampling-rate/--batch-size/--epochs, "
                       "or raise --max-steps to allow it")
    return total


def check_max_steps(max_steps) -> None:
    if isinstance(max_steps, bool) or not isinstance(max_steps, (int, np.integer)) or max_steps < 1:
        raise GSDError(f"--max-steps must be a whole number >= 1 (got {max_steps!r})")


def laplace_size(n: int, epsilon_n: float, rng: np.random.Generator, floor: int) -> int:
    """round(n + Laplace(1 / epsilon_n)), at least ``floor``: epsilon_n-DP for a count (sensitivity 1);
    rounding and the floor are post-processing."""
    return max(int(floor), int(round(n + rng.laplace(0.0, 1.0 / epsilon_n))))


def mechanism_size(n_private: int, batch_size: int, epsilon: float, *, expected_size: int | None = None,
                   sampling_rate: float | None = None, declared_size_epsilon: float | None = None,
                   rng: np.random.Generator | None = None, estimate: int | None = None) -> MechanismSize:
    """The sampling rate and the steps per epoch of a run (module docstring). ``n_private`` is read
    only by the DP estimate; ``rng``: its secret generator; ``estimate``: an estimate already drawn
    (a resumed run reuses its own, so no budget is spent twice)."""
    check_size_settings(batch_size, expected_size, sampling_rate, declared_size_epsilon, epsilon)
    if expected_size is not None:
        return MechanismSize(batch_size / expected_size, max(1, round(expected_size / batch_size)), "declared-size",
                             int(expected_size), 0.0)
    if sampling_rate is not None:
        return MechanismSize(float(sampling_rate), max(1, round(1.0 / sampling_rate)), "declared-rate", None, 0.0)
    eps_n = size_epsilon(epsilon, declared_size_epsilon)
    if estimate is None:
        if rng is None:
            raise GSDError("internal: the size estimate needs the run's secret generator")
        estimate = laplace_size(n_private, eps_n, rng, floor=batch_size)
    estimate = max(int(estimate), int(batch_size))
    return MechanismSize(batch_size / estimate, max(1, round(estimate / batch_size)), "dp-estimate", estimate, eps_n)


def run_size(cfg, n_train: int, meta: dict | None) -> MechanismSize:
    """The run's :class:`~gsd_cli.train.size.MechanismSize`: a resumed run keeps its own (no second
    estimate, no budget spent twice; a run started before sizes were declared keeps its q and T)."""
    from ..privacy.randomness import private_rng

    if meta is not None:
        saved = meta.get("privacy", {}).get("size")
        if saved is None:  # started by gsd 0.1: q = B / N, kept so that the run's mechanism does not change
            pv = meta.get("privacy", {})
            return MechanismSize(float(pv["sampling_rate"]), max(1, int(pv["steps"]) // max(1, cfg.epochs)), "exact-size (0.1 run)", None, 0.0)
        return mechanism_size(n_train, cfg.batch_size, cfg.epsilon, expected_size=cfg.expected_size, sampling_rate=cfg.sampling_rate,
                              declared_size_epsilon=cfg.size_epsilon, estimate=saved.get("size"))
    return mechanism_size(n_train, cfg.batch_size, cfg.epsilon, expected_size=cfg.expected_size, sampling_rate=cfg.sampling_rate,
                          declared_size_epsilon=cfg.size_epsilon, rng=private_rng("size", cfg.private_seed))
