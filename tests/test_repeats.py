"""Rankings over repeats: intervals, ties, seeds, R=1 = the plain ranking, DP budgets, CLI."""

import csv
import json
import math

import numpy as np
import pytest

import gsd_cli.distance.registry
import gsd_cli.subspace.dppca
import gsd_cli.ranking
from gsd_cli import rank
from gsd_cli.cli import main
from gsd_cli.data import ArraySource
from gsd_cli.errors import GSDError
from gsd_cli.ranking import (
    RepeatRanking, holm, paired_tie_test, rank_repeats, repeat_seed, t_interval, total_epsilon,
)

KW = dict(model="fmnist-cnn", examples=40, k=4, engine="vmap", device="cpu", params="fc*")


def _sources():
    """A private set, two public sets from the private set's own distribution, one far set."""
    base = np.random.default_rng(0).uniform(size=(4, 16, 16))

    def make(name, seed, far=False):
        r = np.random.default_rng(seed)
        y = r.integers(0, 4, size=120)
        x = r.uniform(size=(120, 16, 16)) * 0.8 + 0.1 * r.normal(size=(120, 16, 16)) if far else base[y] + 0.05 * r.normal(size=(120, 16, 16))
        return ArraySource(name, np.clip(x, 0, 1).astype(np.float32), y, num_classes=4)

    return make("priv", 1), [make("twin-a", 2), make("twin-b", 3), make("far", 4, far=True)]


def test_t_interval_covers_a_known_mean_at_the_stated_rate():
    rng = np.random.default_rng(0)
    for n in (3, 5, 10):
        hits = 0
        for _ in range(2000):
            mean, sd, lo, hi = t_interval(rng.normal(0.6, 0.05, size=n))
            hits += lo <= 0.6 <= hi
        assert 0.935 <= hits / 2000 <= 0.965, (n, hits / 2000)  # +-3 binomial sd around 0.95
    mean, sd, lo, hi = t_interval([0.5])
    assert mean == 0.5 and math.isnan(sd) and math.isnan(lo) and math.isnan(hi)
    # 90% interval is narrower than 95%
    x = rng.normal(size=6)
    assert (t_interval(x, 0.9)[3] - t_interval(x, 0.9)[2]) < (t_interval(x)[3] - t_interval(x)[2])


def test_paired_test_and_holm():
    rng = np.random.default_rng(1)
    w = rng.normal(0.5, 0.05, size=8)
    assert paired_tie_test(w + rng.normal(0, 0.01, 8), w) > 0.05  # same mean, paired noise
    assert paired_tie_test(w + 0.1 + rng.normal(0, 0.01, 8), w) < 1e-4  # farther, consistently
    assert paired_tie_test(w - 0.1, w) == 1.0 and paired_tie_test(w + 0.1, w) == 0.0  # constant differences
    assert math.isnan(paired_tie_test([0.3], [0.2]))
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])


def test_repeat_seeds():
    assert repeat_seed(7, 0) == 7
    seeds = [repeat_seed(7, r) for r in range(6)]
    assert len(set(seeds)) == 6 and seeds == [repeat_seed(7, r) for r in range(6)]
    assert repeat_seed(8, 1) != repeat_seed(7, 1)
    with pytest.raises(GSDError):
        repeat_seed(0, -1)


def test_twin_of_the_winner_is_tied_and_a_far_candidate_is_not():
    priv, pubs = _sources()
    r = rank_repeats(priv, pubs, repeats=6, seed=3, **KW)
    assert isinstance(r, RepeatRanking) and r.repeats == 6 and len(r.runs) == 6
    order = [x.public for x in r]
    assert set(order[:2]) == {"twin-a", "twin-b"} and order[2] == "far"
    assert r[0].winner and not r[0].tied and r[0].p_value is None
    assert r[1].tied and r[1].p_value >= 0.05
    assert not r[2].tied and r[2].p_value < 0.05
    assert sum(x.win_fraction for x in r) == pytest.approx(1.0) and r[2].win_fraction < r[0].win_fraction
    for x in r:
        assert len(x.distances) == 6 and x.distance == x.mean == pytest.approx(np.mean(x.distances))
        assert x.ci_low < x.mean < x.ci_high and x.sd == pytest.approx(np.std(x.distances, ddof=1))


def test_same_seed_same_repeats_and_r1_is_the_plain_ranking():
    priv, pubs = _sources()
    pubs = pubs[1:]
    plain = rank(priv, pubs, seed=5, **KW)
    one = rank_repeats(priv, pubs, repeats=1, seed=5, **KW)
    assert [(x.public, x.distance) for x in one] == [(x.public, x.distance) for x in plain]
    assert [(x.public, x.distance, x.principal_angles_deg) for x in one.runs[0]] == [
        (x.public, x.distance, x.principal_angles_deg) for x in plain
    ]
    assert not any(x.tied for x in one) and math.isnan(one[0].sd)
    doc = json.loads(json.dumps(one.to_dict(), allow_nan=False))  # strict JSON: NaN -> null
    assert doc["results"][0]["sd"] is None and doc["runs"][0]["seed"] == 5
    assert type(plain) is gsd_cli.ranking.Ranking  # rank(..., repeats=1), the default
    a = rank(priv, pubs, seed=5, repeats=2, **KW)  # rank(..., repeats=R) goes through rank_repeats
    b = rank_repeats(priv, pubs, repeats=2, seed=5, **KW)
    assert isinstance(a, RepeatRanking)
    assert [x.distances for x in a] == [x.distances for x in b]
    assert [(x.public, x.distance) for x in a.runs[0]] == [(x.public, x.distance) for x in plain]
    assert a.repeat_seeds == [5, repeat_seed(5, 1)] and a.runs[1].seed == repeat_seed(5, 1)
    c = rank_repeats(priv, pubs, repeats=2, seed=6, **KW)
    assert [x.distances for x in c] != [x.distances for x in a]


def test_cache_reuses_subspaces_of_earlier_repeats(monkeypatch):
    priv, pubs = _sources()
    pubs = pubs[:1]
    calls = []
    real = gsd_cli.distance.registry.sample_subspace  # every side is computed through the distance's context
    monkeypatch.setattr(gsd_cli.distance.registry, "sample_subspace", lambda *a, **k: calls.append(1) or real(*a, **k))
    memo = {}
    two = rank_repeats(priv, pubs, repeats=2, seed=1, memo=memo, **KW)
    assert len(calls) == 2 * 2
    three = rank_repeats(priv, pubs, repeats=3, seed=1, memo=memo, **KW)
    assert len(calls) == 3 * 2  # only the third repeat is computed
    assert [x.distances[:2] for x in three if x.public] == [
        {y.public: y for y in two}[x.public].distances for x in three
    ]


@pytest.mark.parametrize("distance, module, release", [("dp-gsd", "gsd_cli.subspace.dppca", "private_top_k_subspace"),
                                                        ("dp-energy", "gsd_cli.distance.dpenergy", "private_energies")])
def test_dp_repeats_shared_spends_once_and_fresh_composes(monkeypatch, distance, module, release):
    """DP-GSD and the DP energy order: shared repeats release once, fresh ones R times (the default DP
    distance, the DP selection, refuses repeats: tests/test_dp_select.py)."""
    import importlib

    from dp_accounting.pld import common, privacy_loss_distribution

    priv, pubs = _sources()
    pubs = pubs[1:]
    draws = []
    mod = importlib.import_module(module)
    real = getattr(mod, release)
    monkeypatch.setattr(mod, release, lambda *a, **k: draws.append(1) or real(*a, **k))
    kw = dict(KW, dp=True, epsilon=2.0, repeats=3, distance=distance)
    shared = rank_repeats(priv, pubs, dp_repeats="shared", **kw)
    assert len(draws) == 1
    pv = shared.privacy
    assert pv["total_epsilon"] == 2.0 and pv["releases"] == 1 and pv["dp_repeats"] == "shared" and pv["delta"] == 0
    # DP-GSD: one private subspace against each repeat's public side, which varies; DP energy: the one
    # release of energies in repeat 1's candidate subspaces, shown in every repeat
    assert all(len(set(x.distances)) == (3 if distance == "dp-gsd" else 1) for x in shared)
    fresh = rank_repeats(priv, pubs, dp_repeats="fresh", **kw)
    assert len(draws) == 1 + 3
    assert fresh.privacy["total_epsilon"] == 6.0 and fresh.privacy["releases"] == 3
    assert fresh.privacy["epsilon_per_release"] == 2.0
    # dp-accounting's PLD of a pure (epsilon, 0)-DP release, composed R times, gives the same total
    for eps, R in ((2.0, 3), (0.5, 5), (1.0, 1)):
        pld = privacy_loss_distribution.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, 0))
        assert pld.self_compose(R).get_epsilon_for_delta(0) == pytest.approx(total_epsilon(eps, R, "fresh"), rel=1e-9)
        assert total_epsilon(eps, R, "shared") == eps
    with pytest.raises(GSDError, match="dp-repeats"):
        rank_repeats(priv, pubs, dp_repeats="sometimes", **kw)
    with pytest.raises(GSDError, match="repeats"):
        rank_repeats(priv, pubs, repeats=0, **KW)


def _one_line_error(code, err, what):
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and what in lines[0], err


def test_cli_repeats_json_csv_plot(capsys, npz_pair, tmp_path):
    j, c, p = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.png"
    args = ["rank", "--private", f"npz:{npz_pair['priv']}", "--public", f"npz:{npz_pair['near']}", f"npz:{npz_pair['far']}",
            "--model", "fmnist-cnn", "-m", "40", "--k", "4", "--engine", "vmap", "-q"]
    code = main(args + ["--repeats", "3", "--json", str(j), "--csv", str(c), "--plot", str(p)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "3 repeats" in out and "paired t-test" in out and "±" in out
    doc = json.loads(j.read_text())
    assert doc["repeats"] == 3 and len(doc["runs"]) == 3 and len(doc["results"][0]["distances"]) == 3
    assert set(doc["runs"][0]["distances"]) == {r["public"] for r in doc["results"]}
    rows = list(csv.DictReader(c.open()))
    assert [r["public"] for r in rows] == [r["public"] for r in doc["results"]]
    assert float(rows[0]["distance_repeat_2"]) == pytest.approx(doc["results"][0]["distances"][2], abs=1e-6)
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code = main(args + ["--plot", str(tmp_path / "one.png")])  # R=1 plots too, and says no tie test is possible
    out, err = capsys.readouterr()
    assert code == 0 and "no tie test" in out and (tmp_path / "one.png").exists()
    code = main(args + ["--repeats", "2", "--dp", "--epsilon", "2", "--metric", "dp-energy", "--dp-repeats", "fresh", "--json", str(j),
                        "--csv", str(c)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "total epsilon=4" in out and "2 x 2 = 4" in " ".join(out.split())
    assert json.loads(j.read_text())["privacy"]["total_epsilon"] == 4.0
    assert {r["total_epsilon"] for r in csv.DictReader(c.open())} == {"4"}


def test_cli_repeats_and_plot_errors(capsys, tmp_path):
    for extra, what in (
        (["--repeats", "0"], "--repeats"),
        (["--plot", str(tmp_path / "nope" / "p.png")], "does not exist"),
        (["--plot", str(tmp_path)], "is a folder"),
        (["--plot", str(tmp_path / "p.jpg")], ".png"),
        (["--dp-repeats", "fresh"], "--dp-repeats"),
    ):
        code = main(["rank", "--model", "fmnist-cnn", "-m", "20", "--k", "2", "-q", *extra])
        _one_line_error(code, capsys.readouterr()[1], what)
    assert not list(tmp_path.iterdir())
