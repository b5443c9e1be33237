"""Issue 53, "spend work where it decides something": ``gsd train --auto-select`` (``--method auto``, the feature
probe) probes first and ranks only the candidates whose pretrained features help, with the same decision as
ranking every candidate first; the noise references' cache keys need no generated image."""

from __future__ import annotations

import numpy as np
import pytest

import gsd_cli.advice.select as select
from gsd_cli.data.fingerprint import content_digest, sample_fingerprint
from gsd_cli.data.reference import NoiseSource, reference_sources
from gsd_cli.train import TrainConfig
from gsd_cli.advice.decide import Candidate, advise

from test_advice import REFS, FakeRanking
from test_probe import _probe

FACTS = {"mnist-b": Candidate("mnist-b", 5000, 10), "digits": Candidate("digits", 1797, 10),
         "faces": Candidate("faces", 200, 2), "noise": Candidate("noise", 2500, 10)}


def _ranked_only(draws: dict, not_ranked: list[str]) -> FakeRanking:
    r = FakeRanking({**draws, **REFS})
    r.not_ranked = not_ranked
    return r


def test_advice_from_the_helpful_candidates_alone_is_the_advice_from_all():
    """The same probe and rows: ranking only the helpful candidates changes no decision (the largest confident gain
    among those closer than noise), in each of the four outcomes."""
    rows = {"mnist-b": [0.50, 0.51, 0.49], "digits": [0.40, 0.41, 0.39], "noise": [0.80, 0.81, 0.79]}
    probes = [
        _probe(**{"mnist-b": [0.20, 0.22, 0.21], "digits": [0.05, 0.06, 0.04], "noise": [0.0, 0.01, -0.01]}),  # both help
        _probe(**{"mnist-b": [0.03, -0.02, 0.01], "digits": [-0.05, -0.06, -0.04], "noise": [0.0, 0.01, -0.01]}),  # none
        _probe(**{"mnist-b": [0.03, -0.02, 0.01], "digits": [-0.05, -0.06, -0.04], "noise": [0.3, 0.31, 0.32]}),  # noise: far
        _probe(**{"mnist-b": [0.03, -0.02, 0.01], "digits": [0.05, 0.06, 0.04], "noise": [0.3, 0.31, 0.32]}),  # digits, not noise
    ]
    expected = [("second-phase", "mnist-b"), ("dpsgd", None), ("dpsgd", None), ("second-phase", "digits")]
    facts = {n: FACTS[n] for n in rows}
    for p, want in zip(probes, expected):
        full = advise(FakeRanking({**rows, **REFS}), "auto", candidates=facts, private_classes=10, probe=p)
        helping = [n for n in rows if p.test(n, 0.05)[0]]
        lazy = advise(_ranked_only({n: rows[n] for n in helping}, sorted(set(rows) - set(helping))), "auto",
                      candidates=facts, private_classes=10, probe=p)
        assert (full.method, full.public) == (lazy.method, lazy.public) == want, (full.message, lazy.message)
        for n in set(rows) - set(helping):  # their probe figures stay in the evidence
            assert lazy.evidence[n]["ranked"] is False and lazy.evidence[n]["probe_helps"] is False
    # none helps: the line says what the probe found; some help but none is closer than noise: that
    lazy = advise(_ranked_only({}, sorted(rows)), "auto", candidates=facts, private_classes=10, probe=probes[1])
    assert "no candidate's pretrained features beat those of the untrained model" in lazy.message and "the best, mnist-b" in lazy.message
    lazy = advise(_ranked_only({"noise": rows["noise"]}, ["digits", "mnist-b"]), "auto", candidates=facts, private_classes=10,
                  probe=probes[2])
    assert "no candidate whose pretrained features beat those of the untrained model is closer than noise" in lazy.message
    assert (lazy.method, lazy.public) == ("dpsgd", None)


def _count_ranked(monkeypatch) -> list:
    seen: list = []
    real = select.rank

    def spy(private, publics, **options):
        seen.append([getattr(p, "name", str(p)) for p in publics])
        return real(private, publics, **options)

    monkeypatch.setattr(select, "rank", spy)
    return seen


@pytest.mark.parametrize("candidates", [["mnist-b", "faces", "noise"], ["faces", "noise"]])
def test_probe_first_makes_the_same_decision_with_fewer_subspaces(monkeypatch, candidates):
    """On MNIST halves: the helpful candidate (mnist-b) is ranked and chosen either way, the others are not ranked;
    with no helpful candidate nothing is ranked at all and the run trains DP-SGD, as ranking everything decides."""
    cfg = TrainConfig(private="mnist-a", method="auto", model="fmnist-cnn", params=["fc*"], public_examples=400, public_epochs=2,
                      public_batch_size=100, public_augment="none")  # (2 augmented epochs of 360 examples: no confident gain)
    opts = dict(train_settings=cfg, probe_repeats=3, model="fmnist-cnn", k=4, examples=200, device="cpu", repeats=3)
    seen = _count_ranked(monkeypatch)
    r_all, d_all = select.advised_selection("mnist-a", candidates, "auto", gate="all", **opts)
    r_lazy, d_lazy = select.advised_selection("mnist-a", candidates, "auto", gate="helping", **opts)
    assert (d_all.method, d_all.public) == (d_lazy.method, d_lazy.public)
    assert d_lazy.public == ("mnist-b" if "mnist-b" in candidates else None)
    from gsd_cli.data.reference import is_reference

    lazy_calls = [[n for n in c if not is_reference(n)] for c in seen[1:]]  # the first call ranked every candidate
    assert lazy_calls == ([["mnist-b"]] * 4 if "mnist-b" in candidates else [])  # its three draws, then their ranking
    ranked = {r.public for r in r_lazy}
    assert ranked == ({"mnist-b"} if d_lazy.public else set()) and set(r_lazy.not_ranked) == set(candidates) - ranked
    if d_lazy.public:  # its rows are the full ranking's: a candidate's draws do not depend on the others
        row = {r.public: r for r in r_all}["mnist-b"]
        assert [r.distances for r in r_lazy if r.public == "mnist-b"] == [row.distances]
        assert d_lazy.evidence["probe"]["gains"]["mnist-b"] == d_all.evidence["probe"]["gains"]["mnist-b"]
    else:  # the settings a ranking states, though none ran
        assert (r_lazy.k, r_lazy.examples, r_lazy.repeats, r_lazy.num_params) == (r_all.k, r_all.examples, r_all.repeats, r_all.num_params)
        assert r_lazy.repeat_seeds == r_all.repeat_seeds and len(r_lazy.results) == 0


def test_a_noise_reference_is_keyed_by_what_it_is_drawn_from_not_by_its_images(monkeypatch):
    refs = reference_sources(224, 3, 100, 10, seed=0)
    key = {r.name: sample_fingerprint(r, np.arange(50)) for r in refs}

    def no_images(self, indices):
        raise AssertionError("an image was generated to be hashed")

    monkeypatch.setattr(NoiseSource, "images", no_images)
    again = {r.name: sample_fingerprint(r, np.arange(50)) for r in refs}
    assert again == key and all(k["content"]["how"] == "generated" for k in key.values())
    assert len({str(k["content"]) for k in key.values()}) == len(refs)  # each grid and colour its own
    other = reference_sources(224, 3, 100, 10, seed=1)[0]
    assert content_digest(other, np.arange(50)) != content_digest(refs[0], np.arange(50))
    assert "numpy" in key[refs[0].name]["libraries"]  # the generator's version fixes the draws


def test_the_helpful_candidates_are_ranked_one_at_a_time_largest_gain_first(monkeypatch):
    """Two helpful candidates: the larger gain is ranked first, and the second only when the first is not closer than
    noise (the private side and the references come from the memo, computed once)."""
    import gsd_cli.advice.probe as probe_mod
    from gsd_cli.data.reference import is_reference
    from gsd_cli.ranking.repeats import repeat_seed

    gains = {"mnist-b": [0.20, 0.22, 0.21], "digits": [0.05, 0.06, 0.04]}
    monkeypatch.setattr(probe_mod, "probe_second_phase", lambda private, sources, *a, **k: _probe(
        **{getattr(s, "name", s): gains.get(getattr(s, "name", s), [-0.01, 0.0, -0.02]) for s in sources}))
    cfg = TrainConfig(private="mnist-a", method="auto", model="fmnist-cnn")

    def run(rows: dict):
        calls, memos = [], []

        def fake_rank(private, publics, memo=None, **options):
            names = [getattr(p, "name", str(p)) for p in publics]
            calls.append([n for n in names if not is_reference(n)] + (["(one draw)"] if options.get("repeats") == 1 else []))
            memos.append(id(memo))
            draws = {n: [0.80, 0.79, 0.81] if is_reference(n) else rows[n] for n in names}
            if options.get("repeats") == 1:  # draw r of the repeat ranking: its seed
                r = [repeat_seed(0, i) for i in range(3)].index(options["seed"])
                draws = {n: [v[r]] for n, v in draws.items()}
            return FakeRanking(draws)

        monkeypatch.setattr(select, "rank", fake_rank)
        ranking, decision = select.advised_selection("mnist-a", ["mnist-b", "digits", "faces"], "auto", gate="helping",
                                                     train_settings=cfg, model="fmnist-cnn", examples=50)
        assert len(set(memos)) == 1  # one memo for every call
        return calls, ranking, decision

    close, far = [0.40, 0.41, 0.39], [0.90, 0.91, 0.89]
    one = ["mnist-b", "(one draw)"]
    calls, ranking, decision = run({"mnist-b": close, "digits": close})
    assert calls == [one, one, one, ["mnist-b"]] and (decision.method, decision.public) == ("second-phase", "mnist-b")
    assert ranking.not_ranked == ["digits", "faces"] and ranking.stopped == {}
    # mnist-b farther than noise in its first draw: decided (one-sided t-test over 3 draws: a loss caps t at 2), so
    # neither its other draws nor the private side's and references' for them are computed; digits is then ranked alone
    calls, ranking, decision = run({"mnist-b": far, "digits": close})
    two = ["digits", "(one draw)"]
    assert calls == [one, two, two, two, ["digits"]] and (decision.method, decision.public) == ("second-phase", "digits")
    assert ranking.stopped["mnist-b"]["draws"] == 1 and ranking.stopped["mnist-b"]["margins"] == [pytest.approx(0.80 - 0.90)]
    assert decision.evidence["mnist-b"]["stopped"]["of"] == 3 and decision.evidence["mnist-b"]["beats_reference"] is False
    calls, ranking, decision = run({"mnist-b": far, "digits": far})
    assert calls == [one, two] and (decision.method, decision.public) == ("dpsgd", None)
    assert "is closer than noise" in decision.message and "in 1 of 3 draws" in decision.message
    assert len(ranking.results) == 0 and set(ranking.stopped) == {"mnist-b", "digits"}


def test_each_draw_of_the_gate_reports_its_sets_under_its_own_tag():
    """The gate's draws read the private set and the references again: tagged "[r/3]" as `gsd rank --repeats`' draws
    are, each draw's sets get their own progress lines (untagged, draws 2 and 3 ran half a minute with none)."""
    from gsd_cli.advice.gate import draws_until_decided

    seen: list = []

    class Source:
        name = "mnist-b"

    def fake_rank(private, publics, memo=None, progress=None, **options):
        progress("mnist-a:train", 10, 10)
        return FakeRanking({"mnist-b": [0.4], **{n: [0.8] for n in REFS}})

    refs = [type("R", (), {"name": n})() for n in REFS]
    assert draws_until_decided(fake_rank, "mnist-a", Source(), refs, 3, {},
                               {"progress": lambda name, done, total: seen.append(name)}) is None
    assert seen == ["[1/3] mnist-a:train", "[2/3] mnist-a:train", "[3/3] mnist-a:train"]
