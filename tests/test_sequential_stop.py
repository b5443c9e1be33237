"""Issue 53, "spend repeats where they decide something": a candidate whose one-sided paired t-test is decided
(it fails whatever the remaining draws give, :func:`gsd_cli.ranking.reference.can_still_pass`) gets no more draws,
and the feature probe's decision is the one of every draw."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import gsd_cli.advice.probe as probe_mod
from gsd_cli.ranking.reference import can_still_pass
from gsd_cli.advice.probe import ProbeResult


def _brute_passes(observed, draws, alpha=0.05, low=-1.0, high=1.0, rng=None, tries=4000) -> bool:
    """Whether some completion in [low, high] passes, searched independently (scipy's t-test over every row at once,
    and one_sided_p's rule for equal values): the box's vertices and a grid on it, random points, and every
    completion with its remaining values equal on a fine grid."""
    from scipy import stats

    m = draws - len(observed)
    grid = np.linspace(low, high, 41)
    rows = [list(c) for c in itertools.product(grid if m <= 2 else [low, 0.0, high], repeat=m)]
    rows += [[c] * m for c in np.linspace(low, high, 4001)]
    if rng is not None:
        rows += [list(rng.uniform(low, high, m)) for _ in range(tries)]
    full = np.concatenate([np.tile(np.asarray(observed, float), (len(rows), 1)), np.asarray(rows)], axis=1)
    with np.errstate(all="ignore"):
        p = stats.ttest_1samp(full, 0.0, axis=1, alternative="greater").pvalue
    equal = np.isclose(full, full[:, :1]).all(axis=1)
    p = np.where(equal, np.where(full[:, 0] > 0, 0.0, 1.0), np.nan_to_num(p, nan=1.0))
    return bool((p < alpha).any())


def test_a_decided_test_fails_for_every_completion_brute_force():
    """Against an independent search: where the rule says decided, no completion passes; where a completion passes,
    the rule says undecided. The observed values are random, in both signs and near equal."""
    rng = np.random.default_rng(7)
    decided = undecided = 0
    for trial in range(300):
        draws = int(rng.integers(2, 6))
        k = int(rng.integers(1, draws))
        kind = trial % 3
        if kind == 0:
            obs = rng.uniform(-1, 1, k)
        elif kind == 1:
            obs = rng.normal(0.1, 0.05, k).clip(-1, 1)
        else:
            obs = 0.2 + rng.normal(0, 1e-3, k)
        rule = can_still_pass(obs, draws)
        brute = _brute_passes(obs, draws, rng=rng, tries=500)
        if brute:
            assert rule, (obs, draws)
        if not rule:
            decided += 1
            assert not brute, (obs, draws)
        else:
            undecided += 1
    assert decided > 30 and undecided > 30  # both outcomes are exercised


@pytest.mark.parametrize("obs, draws, passes", [
    ([-0.05], 3, False),   # a loss in one of three draws: t is at most 2 < 2.92 whatever follows
    ([0.0], 3, False),     # no gain: the same bound
    ([0.2], 3, True),      # two more draws of 0.2 give p = 0
    ([0.2, 0.21], 3, True),
    ([0.2, -0.01], 3, False),
    ([0.3, 0.31, 0.29], 3, True),   # all drawn: the test itself
    ([0.3, -0.31, 0.29], 3, False),
    ([0.5], 1, False),     # one draw: no test
])
def test_the_rule_on_cases_worked_by_hand(obs, draws, passes):
    assert can_still_pass(obs, draws) is passes


def test_with_one_loss_of_three_the_best_completion_is_t_equal_2():
    """The bound behind the first case: values (0, a, a) give t = 2 for any a > 0, below t_{0.95, 2} = 2.92."""
    from scipy import stats

    for a in (0.01, 0.3, 1.0):
        t = stats.ttest_1samp([0.0, a, a], 0.0).statistic
        assert t == pytest.approx(2.0)
    assert stats.t.ppf(0.95, 2) > 2.9


def test_too_many_observed_values_are_refused():
    with pytest.raises(ValueError):
        can_still_pass([0.1, 0.2, 0.3], 2)


def test_the_probe_stops_a_decided_candidate_and_keeps_the_decision(monkeypatch):
    """The real probe loop, with stage 1 faked and the linear probe's gains scripted per candidate and draw: a
    candidate that loses in its first draw gets no second or third stage 1; every decision (helps, mean gain of
    the helpful ones) is the one of every draw; with every test decided the draws stop."""
    from gsd_cli.data import ArraySource
    from gsd_cli.train import TrainConfig

    rng = np.random.default_rng(0)
    private = ArraySource("p", rng.random((40, 8, 8)).astype(np.float32), rng.integers(0, 2, 40), num_classes=2)
    script = {"good": [0.2, 0.22, 0.21], "bad": [-0.1, 0.3, 0.3], "later": [0.1, -0.02, 0.4]}
    calls: list = []

    def fake_stage1(model, names, settings, *a, **k):
        calls.append((settings.public, settings.seed))
        model._gain = script[settings.public][settings.seed]
        return {"head": "shared", "public_examples": 100, "lr": 0.1}

    def fake_accuracy(feats, labels, num_classes, s):
        return 0.5 + fake_accuracy.next_gain

    def fake_features(model, x, chunk=256):
        fake_accuracy.next_gain = getattr(model, "_gain", 0.0)
        return x.flatten(1)[:, :4]

    monkeypatch.setattr("gsd_cli.train.second_phase.run_second_phase", fake_stage1)
    monkeypatch.setattr(probe_mod, "linear_probe_accuracy", fake_accuracy)
    monkeypatch.setattr(probe_mod, "head_features", fake_features)
    cands = [ArraySource(n, rng.random((20, 8, 8)).astype(np.float32), rng.integers(0, 2, 20), num_classes=2) for n in script]
    cfg = TrainConfig(private="p", public="good", method="second-phase", model="fmnist-cnn")

    lazy = probe_mod.probe_second_phase(private, cands, cfg, examples=20, repeats=3, device="cpu")
    lazy_calls, calls[:] = list(calls), []
    full = probe_mod.probe_second_phase(private, cands, cfg, examples=20, repeats=3, device="cpu", stop_decided=False)
    assert sorted(lazy_calls) == [("bad", 0), ("good", 0), ("good", 1), ("good", 2), ("later", 0), ("later", 1)]
    assert len(calls) == 9
    assert lazy.stopped == {"bad": 1, "later": 2} and full.stopped == {}
    for n in script:
        assert lazy.test(n, 0.05)[0] == full.test(n, 0.05)[0]
    assert lazy.test("good", 0.05)[0] and lazy.mean_gain("good") == pytest.approx(full.mean_gain("good"))
    assert "stopped after 1 of 3 draws" in lazy.phrase("bad", 0.05)
    assert lazy.to_dict()["stopped"] == {"bad": 1, "later": 2}

    script.update(good=[-0.2, 0.3, 0.3], later=[-0.02, 0.1, 0.4])  # every test decided after the first draw: no second draw at all
    calls[:] = []
    none = probe_mod.probe_second_phase(private, cands, cfg, examples=20, repeats=3, device="cpu")
    assert len(calls) == 3 and none.stopped == {"good": 1, "bad": 1, "later": 1} and len(none.baseline) == 1
    assert none.repeats == 3 and not any(none.test(n, 0.05)[0] for n in script)


def test_a_stopped_candidate_never_helps_even_if_its_partial_draws_would():
    r = ProbeResult([0.5, 0.5, 0.5], {"a": [0.2, 0.2]}, examples=10, model="m", stopped={"a": 2}, planned=3)
    assert r.test("a", 0.05)[0] is False
