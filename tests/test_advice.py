"""gsd train --auto-select's advice (gsd_cli.advice.decide, issue 42): public data only when a candidate is
closer than the in-run noise references with confidence, the second phase only with a candidate whose labels
can prepare the model, and no setting without a rule."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

from gsd_cli.advice.decide import (
    REFERENCE, Candidate, advise, closer_than_reference, is_reference, reference_sources, second_phase_usable,
    split_usable,
)


@dataclass
class Row:
    public: str
    distance: float | None


@dataclass
class Run:
    rows: list

    def __iter__(self):
        return iter(self.rows)


@dataclass
class FakeRanking:
    """What advise reads of a (repeat) ranking: rows best first, each repeat's rows, privacy."""

    draws: dict  # name -> per-repeat distances
    privacy: dict | None = None
    dp: bool = False
    results: list = field(default_factory=list)
    runs: list = field(default_factory=list)

    def __post_init__(self):
        means = {n: float(np.mean(v)) for n, v in self.draws.items()}
        self.results = [Row(n, means[n]) for n in sorted(means, key=means.get)]
        reps = len(next(iter(self.draws.values())))
        self.runs = [Run([Row(n, v[i]) for n, v in self.draws.items()]) for i in range(reps)] if reps > 1 else []

    def __iter__(self):
        return iter(self.results)

    @property
    def winner(self):
        return self.results[0]


REFS = {f"{REFERENCE}@28": [0.80, 0.79, 0.81], f"{REFERENCE}@7": [0.74, 0.73, 0.75]}
FACTS = {"mnist-b": Candidate("mnist-b", 5000, 10), "faces": Candidate("faces", 200, 2),
         "noise": Candidate("noise", 2500, 10), "digits": Candidate("digits", 1797, 10)}


def test_a_close_labelled_candidate_gets_the_second_phase():
    r = FakeRanking({"mnist-b": [0.38, 0.40, 0.39], "faces": [0.58, 0.60, 0.59], **REFS})
    d = advise(r, "auto", candidates=FACTS, private_classes=10)
    assert (d.method, d.public, d.fell_back, d.refused) == ("second-phase", "mnist-b", False, False)
    assert "p = " in d.message and d.distance == pytest.approx(0.39) and d.reference == pytest.approx(0.74)


def test_a_few_class_candidate_never_gets_the_second_phase():
    """The issue's failure: faces (200 images, 2 classes) ranked first for a 10-class task was pretrained on."""
    r = FakeRanking({"faces": [0.45, 0.46, 0.44], "digits": [0.70, 0.69, 0.71], **REFS})
    d = advise(r, "auto", candidates=FACTS, private_classes=10)
    assert (d.method, d.public) == ("second-phase", "digits")  # the closest usable one, itself closer than noise
    r = FakeRanking({"faces": [0.45, 0.46, 0.44], "digits": [0.76, 0.77, 0.75], **REFS})
    d = advise(r, "auto", candidates=FACTS, private_classes=10)
    assert (d.method, d.public) == ("gep", "faces")  # GEP uses its gradient subspace only
    assert "2 classes" in second_phase_usable(FACTS["faces"], 10)
    assert "fewer than 100 per private class" in second_phase_usable(Candidate("small", 500, 10), 10)
    assert second_phase_usable(Candidate("unlabelled", 5000, None), 10) is not None
    assert second_phase_usable(Candidate("ok", 1000, 10), 10) is None
    usable, why_not = split_usable({n: f"src-{n}" for n in FACTS}, FACTS, 10)  # in the given order, sources kept
    assert list(usable.items()) == [("mnist-b", "src-mnist-b"), ("noise", "src-noise"), ("digits", "src-digits")]
    assert list(why_not) == ["faces"] and "2 classes" in why_not["faces"]


def test_noise_like_candidates_fall_back_to_dpsgd():
    r = FakeRanking({"noise": [0.735, 0.74, 0.745], **REFS})  # no closer than the closest reference
    d = advise(r, "auto", candidates=FACTS, private_classes=10)
    assert (d.method, d.public, d.fell_back) == ("dpsgd", None, True) and "closer than noise" in d.message
    for m in ("gep", "second-phase"):  # an explicit method is refused (the CLI: exit 2 unless --no-fallback)
        d = advise(r, m, candidates=FACTS, private_classes=10)
        assert d.refused and "--no-fallback" in d.message


def test_the_bar_is_the_closest_reference_in_each_draw():
    # closer than the @28 reference in every draw, but not than the @7 one in the second: margins to the
    # per-draw minimum are +0.04, -0.01, +0.05: not significant over 3 draws
    r = FakeRanking({"x": [0.70, 0.74, 0.70], **REFS})
    t = closer_than_reference(r, "x")
    beats, fig = t.closer, t.figures
    assert not beats and fig["p_value"] > 0.05 and fig["closest_reference"].endswith("@7")
    assert fig["mean_margin"] == pytest.approx((0.04 - 0.01 + 0.05) / 3)
    # the t-test against an independent computation
    from scipy import stats

    assert fig["p_value"] == pytest.approx(stats.ttest_1samp([0.04, -0.01, 0.05], 0, alternative="greater").pvalue)


def test_one_draw_gives_no_confidence():
    r = FakeRanking({"mnist-b": [0.3], f"{REFERENCE}@28": [0.8]})
    d = advise(r, "auto", candidates=FACTS, private_classes=10)
    assert d.method == "dpsgd" and "no confidence" in d.message


def test_a_private_selection_uses_its_winner_only_over_the_references():
    r = FakeRanking({"mnist-b": [0.5]}, privacy={"epsilon": 1, "reference_margin": 2.0, "margin_laplace_scale": 0.1}, dp=True)
    assert advise(r, "auto", candidates=FACTS, private_classes=10).public == "mnist-b"
    r = FakeRanking({"mnist-b": [0.5]}, privacy={"epsilon": 1}, dp=True)  # no margin released: not used
    assert advise(r, "auto", candidates=FACTS, private_classes=10).public is None
    r = FakeRanking({f"{REFERENCE}@28": [0.5]}, privacy={"epsilon": 1}, dp=True)  # the DP winner is noise
    d = advise(r, "auto", candidates=FACTS, private_classes=10)
    assert (d.method, d.public) == ("dpsgd", None)
    assert advise(r, "gep", candidates=FACTS, private_classes=10).refused


def test_reference_sources_are_public_deterministic_and_subset_stable():
    refs = reference_sources(224, 3, 50, 10, seed=3)
    assert [r.name for r in refs] == [f"{REFERENCE}@{g}{c}" for g in (56, 28) for c in ("", "-rgb")]
    assert all(is_reference(r.name) for r in refs) and not is_reference("noise")
    a, b = refs[0].images([4, 7]), reference_sources(224, 3, 50, 10, seed=3)[0].images([7])
    assert np.array_equal(a[1], b[0]) and a[0].shape == (56, 56) and refs[1].images([0])[0].shape == (56, 56, 3)
    assert not np.array_equal(refs[0].images([0])[0], reference_sources(224, 3, 50, 10, seed=4)[0].images([0])[0])
    x = np.stack(refs[3].images(range(50)))
    assert x.min() >= 0 and x.max() <= 1 and abs(x.mean() - 0.5) < 0.02
    assert [r.name for r in reference_sources(28, 1, 5, 10, 0)] == [f"{REFERENCE}@28", f"{REFERENCE}@7"]
    twice = reference_sources(28, 1, 5, 10, 0, draws=2)  # under DP: two noise sets of each kind
    assert [r.name for r in twice][2:] == [f"{REFERENCE}@28#2", f"{REFERENCE}@7#2"] and twice[2].seed == 1
    assert [r.name for r in reference_sources(8, 1, 5, 10, 0)] == [f"{REFERENCE}@8"]
    assert set(refs[0].labels(range(50))) <= set(range(10))


# -- end to end: gsd train --auto-select ----------------------------------------------------------

def _train(main, capsys, tmp_path, name, *args):
    code = main(["train", "--auto-select", "--epochs", "1", "--batch-size", "100", "--expected-size", "400", "-q",
                 "--delta", "1e-3", *args, "--out", str(tmp_path / name)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args", [
    ["--rank-examples", "64", "--rank-k", "4"],
    ["--rank-examples", "100", "--rank-k", "8", "--rank-model", "fmnist-cnn"],
    # the DP probe's draw (from --insecure-seed) with the stage 1 it was written with (before issue 61's validation split)
    ["--rank-examples", "64", "--rank-k", "4", "--select-epsilon", "1", "--insecure-seed", "1", "--public-examples", "2000",
     "--public-epochs", "5", "--public-val", "0", "--public-augment", "none"],
])
def test_noise_as_the_only_candidate_trains_dpsgd_and_says_why(capsys, tmp_path, args):
    from gsd_cli.cli import main

    code, out, err = _train(main, capsys, tmp_path, "run", "--public", "noise", *args)
    assert code == 0, err
    assert "training without public data (--method dpsgd)" in out and "DP-SGD without public data" in out
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["method"] == "dpsgd" and s["selection"]["advice"]["fell_back"]
    code, out, err = _train(main, capsys, tmp_path, "gep", "--public", "noise", "--method", "gep", *args)
    assert code == 2 and "--no-fallback" in err and "Traceback" not in err and not (tmp_path / "gep").exists()


def test_a_close_candidate_is_used_and_the_references_are_shown(capsys, tmp_path):
    from gsd_cli.cli import main

    # enough private examples and stage-1 epochs for the feature probe to see the gain with confidence
    code, out, err = _train(main, capsys, tmp_path, "run", "--public", "mnist-b", "faces", "--rank-examples", "300",
                            "--rank-k", "4", "--public-examples", "500", "--public-epochs", "2")
    assert code == 0, err
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (s["method"], s["public"]) == ("second-phase", "mnist-b")
    p = json.loads((tmp_path / "run" / "private-summary.json").read_text())  # a non-private selection's figures
    probe = p["selection"]["advice"]["evidence"]["probe"]
    # faces (200 images, 2 classes) cannot be the second phase's for a 10-class task: not probed (issue 53)
    assert probe["repeats"] == 3 and set(probe["gains"]) == {"mnist-b"} and "linear probe" in out
    assert "in-run noise references" in out and not any(is_reference(r["public"]) for r in p["selection"]["results"])
    assert len(p["selection"]["references"]) == 4 and "references" not in s["selection"]
    capsys.readouterr()
    code = main(["train", "--public", "mnist-b", "--method", "auto", "-q", "--out", str(tmp_path / "no")])
    err = capsys.readouterr().err
    assert code == 2 and "--auto-select" in err and not (tmp_path / "no").exists()


# -- under DP: the released margin over the references ------------------------------------------------

def test_the_reference_margin_has_sensitivity_four_c_squared_by_brute_force():
    """T = min_r (s_w - s_r) - max_kind |s_k1 - s_k2| on energies s_j = sum_i a_ij, a_ij in [0, C^2]
    (C = 1): one row replaced moves T by at most 4 C^2, and the bound is nearly reached."""
    from gsd_cli.distance.dpselect import reference_margin

    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(2000):
        K, m = int(rng.integers(4, 8)), int(rng.integers(1, 6))
        A = rng.uniform(0, 1, size=(m, K)) ** rng.uniform(0.2, 3)
        B = A.copy()
        B[int(rng.integers(m))] = rng.choice([0.0, 1.0], size=K) if rng.uniform() < 0.5 else rng.uniform(0, 1, size=K)
        refs = list(range(1, K))
        kinds = [refs[i:i + 2] for i in range(0, len(refs), 2)]
        ta, tb = (reference_margin(X.sum(0), 0, refs, kinds) for X in (A, B))
        worst = max(worst, abs(ta - tb))
    assert worst <= 4.0 + 1e-12 and worst > 3.0


def test_the_reference_margin_subtracts_the_largest_gap_between_draws_of_one_kind():
    from gsd_cli.distance.dpselect import reference_margin

    s = np.array([10.0, 7.0, 6.0, 4.0, 1.0])  # the winner, then two kinds of two draws: gaps 1 and 3
    assert reference_margin(s, 0, [1, 2, 3, 4]) == pytest.approx(3.0)
    assert reference_margin(s, 0, [1, 2, 3, 4], [[1, 2], [3, 4]]) == pytest.approx(0.0)
    assert reference_margin(s, 0, [1, 2, 3, 4], [[1], [3]]) == pytest.approx(3.0)  # one draw: no gap


def test_the_release_splits_epsilon_and_releases_the_margin_only_for_a_real_winner():
    import torch

    from gsd_cli.distance.dpselect import MARGIN_SHARE, release

    W = [torch.eye(4)[:, :1] for _ in range(3)]
    u, s = np.array([0.0, -50.0, -60.0]), np.array([100.0, 40.0, 30.0])
    sel = release(u, s, W, 1.0, 1.0, rng=np.random.default_rng(1), references=[1, 2], reference_kinds=[[1, 2]])
    assert sel.chosen == [0] and sel.epsilon_select + sel.epsilon_score + sel.extra["epsilon_margin"] == pytest.approx(1.0)
    assert sel.extra["epsilon_margin"] == pytest.approx(0.5 * MARGIN_SHARE)
    assert sel.extra["margin_sensitivity"] == 4.0 and sel.extra["margin_laplace_scale"] == pytest.approx(4.0 / sel.extra["epsilon_margin"])
    assert abs(sel.extra["reference_margin"] - 50.0) < 20 * sel.extra["margin_laplace_scale"]  # 100 - 40, less the gap 10
    sel = release(-u, s, W, 1.0, 1.0, rng=np.random.default_rng(1), references=[1, 2])  # a reference wins
    assert sel.chosen[0] in (1, 2) and sel.extra["reference_margin"] is None
    assert release(u, s, W, 1.0, 1.0, rng=np.random.default_rng(1)).extra == {}  # no references: as before
    # the margin's noise is centred on T: many releases of one fixed input
    got = [release(u, s, W, 1.0, 1.0, rng=np.random.default_rng(i), references=[1, 2], reference_kinds=[[1, 2]]).extra["reference_margin"]
           for i in range(4000)]
    assert np.median(got) == pytest.approx(50.0, abs=0.6)


def test_margin_threshold_is_the_laplace_tail():
    from gsd_cli.ranking.reference import margin_threshold

    t = margin_threshold(2.0, 0.05)
    assert 0.5 * np.exp(-t / 2.0) == pytest.approx(0.05)
    draws = np.random.default_rng(0).laplace(0, 2.0, size=200_000)
    assert (draws > t).mean() == pytest.approx(0.05, abs=0.003)


def test_a_private_selection_needs_its_margin_above_the_threshold():
    base = {"epsilon": 1, "margin_laplace_scale": 10.7}
    close = FakeRanking({"mnist-b": [0.5]}, privacy={**base, "reference_margin": 60.0}, dp=True)
    assert advise(close, "auto", candidates=FACTS, private_classes=10).public == "mnist-b"
    tie = FakeRanking({"noise": [0.8]}, privacy={**base, "reference_margin": 20.0}, dp=True)
    d = advise(tie, "auto", candidates=FACTS, private_classes=10)
    assert d.method == "dpsgd" and "not above" in d.message


def test_gsd_rank_with_references_says_which_candidates_are_closer_than_noise(capsys, tmp_path):
    from gsd_cli.cli import main

    code = main(["rank", "--public", "mnist-b", "noise", "--references", "--repeats", "3", "-m", "100", "-k", "4",
                 "--model", "fmnist-cnn", "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "mnist-b: closer than noise" in out and "noise: not shown closer than noise" in out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [r["public"] for r in doc["results"]] == ["mnist-b", "noise"] and doc["results"][0]["winner"]
    assert [r["public"] for r in doc["references"]] == [f"{REFERENCE}@28", f"{REFERENCE}@7"]
    code = main(["rank", "--dp", "--epsilon", "1", "--references", "-m", "50"])
    assert code == 2 and "--references" in capsys.readouterr().err


def test_a_private_selection_adds_noise_of_each_candidates_shape(monkeypatch):
    """Under --select-epsilon (one draw, no paired test) the references also hold noise of each candidate's
    own shape: 28 x 28 noise resized to ResNet20's 32 fell between the 32 and 8 grids and was chosen."""
    import gsd_cli.advice.select as sel

    seen = {}

    def fake_rank(private, publics, **kw):
        seen["names"] = [getattr(p, "name", p) for p in publics]
        raise RuntimeError("stop")

    monkeypatch.setattr(sel, "rank", fake_rank)
    for dp, want in ((False, False), (True, True)):
        with pytest.raises(RuntimeError):
            sel.advised_selection("mnist-a", ["noise", "digits"], "auto", model="resnet20", examples=20, seed=0,
                                  **({"dp": True, "epsilon": 1.0} if dp else {}))
        refs = [n for n in seen["names"] if is_reference(n)]
        assert (f"{REFERENCE}@28" in refs and f"{REFERENCE}@8#2" in refs) == want  # noise's 28 x 28 and a second draw
        assert f"{REFERENCE}@32-rgb" in refs and f"{REFERENCE}@8" in refs


def test_a_noise_set_that_wins_the_rows_vote_by_a_hair_is_not_closer_than_noise():
    """The failure the energy margin fixes: a candidate a hair above every reference on every row wins the
    clipped-regret vote outright (all 500 rows), while its energy is the references' to 0.2%; a candidate
    with a real energy lead is used."""
    import torch

    from gsd_cli.distance.dpselect import clipped_regret, release
    from gsd_cli.ranking.reference import margin_threshold

    rng = np.random.default_rng(0)
    m, tau = 500, 0.02
    refs = 0.5 + 1e-5 * rng.standard_normal((m, 4))  # two kinds of noise, two draws each, near-identical
    W = [torch.eye(6)[:, :1] for _ in range(5)]

    def used(lead: float) -> float:
        A = np.c_[refs.max(axis=1) + lead, refs]
        u, s = clipped_regret(A, tau), A.sum(axis=0)
        assert u[0] == 0.0 and (u[1:] < -0.5 * m * min(lead, tau) + 1e-9).all()  # every row votes for the candidate
        hits = 0
        for i in range(1000):
            sel = release(u, s, W, 1.0, 1.0, rng=np.random.default_rng(i), references=[1, 2, 3, 4], reference_kinds=[[1, 2], [3, 4]])
            t = sel.extra["reference_margin"]
            hits += t is not None and t > margin_threshold(sel.extra["margin_laplace_scale"])
        return hits / 1000

    # a hair: T = 500 x 0.001 = 0.5 C^2 against a Laplace scale of 10.7, so P(used) = 1/2 exp(-(24.6 - 0.5) / 10.7)
    # = 0.053 (binomial sd 0.007); the vote's margin, 500 rows x 0.001 against a scale of 0.16, passed every time
    assert used(0.001) <= 0.075
    assert used(0.2) >= 0.95  # a real lead: T about 100 C^2 - allowance
