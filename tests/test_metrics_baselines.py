"""Baselines beside GSD (issue 24): each against an independent computation on tiny inputs, and
``gsd rank --metric`` end to end (labelled not private everywhere, refused with --dp)."""

from __future__ import annotations

import csv
import itertools
import json
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

from gsd_cli.cli import main
from gsd_cli.data import ArraySource, Sample
from gsd_cli.distance.baselines.features import gaussian_fit, head_input_features
from gsd_cli.distance.baselines.frechet import frechet_distance
from gsd_cli.distance.baselines.logme import log_evidence, logme
from gsd_cli.distance.baselines.otdd import bures_wasserstein_sq, label_cost, otdd_distance
from gsd_cli.distance.baselines.task2vec import fisher_diagonal, task2vec_distance
from gsd_cli.errors import GSDError
from gsd_cli.ranking import rank

TINY = ["--model", "fmnist-cnn", "--device", "cpu", "-m", "40", "--k", "3", "-q", "--no-cache"]


def _random_spd(rng, d):
    A = rng.normal(size=(d, d))
    return A @ A.T + 0.1 * np.eye(d)


# ------------------------------------------------------------------------------ Frechet


def test_frechet_distance_of_diagonal_gaussians_in_closed_form():
    """Diagonal covariances commute: FD^2 = ||mu1 - mu2||^2 + sum (sqrt a_i - sqrt b_i)^2; the same
    after rotating both by one orthogonal matrix (the means rotate too)."""
    mu1, mu2 = np.array([0.0, 1.0, -2.0]), np.array([1.0, 1.0, 0.5])
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 1.0, 0.25])
    expected = np.sqrt(np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(a) - np.sqrt(b)) ** 2))
    assert frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected, rel=1e-9)
    Q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    got = frechet_distance(Q @ mu1, Q @ np.diag(a) @ Q.T, Q @ mu2, Q @ np.diag(b) @ Q.T)
    assert got == pytest.approx(expected, rel=1e-7)
    assert frechet_distance(mu1, np.diag(a), mu1, np.diag(a)) == pytest.approx(0.0, abs=1e-6)


def test_gaussian_fit_is_the_sample_mean_and_covariance():
    X = np.random.default_rng(1).normal(size=(50, 4))
    mu, C = gaussian_fit(X, ridge=0.0)
    assert np.allclose(mu, X.mean(0)) and np.allclose(C, np.cov(X, rowvar=False, bias=True))


# ------------------------------------------------------------------------------ OTDD


def _brute_force_ot(M):
    """Uniform measures on n and n points: the optimal plan is a permutation (Birkhoff)."""
    n = M.shape[0]
    return min(sum(M[i, p[i]] for i in range(n)) / n for p in itertools.permutations(range(n)))


def test_otdd_without_labels_is_brute_force_w2_over_permutations():
    pytest.importorskip("ot")
    rng = np.random.default_rng(2)
    X1, X2 = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)) + 1.0
    M = ((X1[:, None, :] - X2[None, :, :]) ** 2).sum(-1)
    got = otdd_distance(X1, np.zeros(4, int), X2, np.zeros(4, int), labels=False)
    assert got == pytest.approx(np.sqrt(_brute_force_ot(M)), rel=1e-9)


def test_otdd_with_labels_is_brute_force_with_the_gaussian_label_cost():
    """Two classes on each side (two points each); the label cost is W2^2 between the class
    Gaussians, computed here by the Frechet formula (scipy's sqrtm, another code path)."""
    pytest.importorskip("ot")
    rng = np.random.default_rng(3)
    X1, X2 = rng.normal(size=(4, 2)), rng.normal(size=(4, 2)) * 2
    y1, y2 = np.array([0, 0, 1, 1]), np.array([5, 7, 5, 7])
    g1 = {c: gaussian_fit(X1[y1 == c]) for c in (0, 1)}
    g2 = {c: gaussian_fit(X2[y2 == c]) for c in (5, 7)}
    M = np.array([[np.sum((X1[i] - X2[j]) ** 2) + frechet_distance(*g1[y1[i]], *g2[y2[j]]) ** 2 for j in range(4)]
                  for i in range(4)])
    assert np.allclose(label_cost(X1, y1, X2, y2), M - ((X1[:, None] - X2[None]) ** 2).sum(-1), rtol=1e-6, atol=1e-9)
    assert otdd_distance(X1, y1, X2, y2) == pytest.approx(np.sqrt(_brute_force_ot(M)), rel=1e-6)


def test_bures_wasserstein_agrees_with_pot():
    ot = pytest.importorskip("ot")
    rng = np.random.default_rng(4)
    m1, m2 = rng.normal(size=(2, 3)), rng.normal(size=(3, 3))
    S1 = np.stack([_random_spd(rng, 3) for _ in range(2)])
    S2 = np.stack([_random_spd(rng, 3) for _ in range(3)])
    pot = np.asarray(ot.gaussian.bures_wasserstein_distance(m1, m2, S1, S2)) ** 2
    assert np.allclose(bures_wasserstein_sq(m1, S1, m2, S2), pot, rtol=1e-6)


def test_otdd_without_pot_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ot", None)  # import ot raises ImportError
    with pytest.raises(GSDError, match=r"pip install 'gsd-cli\[ot\]'"):
        otdd_distance(np.zeros((2, 2)), np.zeros(2, int), np.ones((2, 2)), np.zeros(2, int))


# ------------------------------------------------------------------------------ LogME


def test_logme_fixed_point_reaches_the_maximum_of_the_evidence():
    """Algorithm 1's fixed point against a direct numerical maximisation of L(alpha, beta) (dense
    formula, Nelder-Mead over log alpha, log beta from several starts)."""
    from scipy.optimize import minimize

    rng = np.random.default_rng(5)
    F = rng.normal(size=(40, 5))
    labels = (F[:, 0] + 0.5 * rng.normal(size=40) > 0).astype(int)
    best = []
    for c in (0, 1):
        y = (labels == c).astype(float)
        f = lambda t: -log_evidence(F, y, np.exp(t[0]), np.exp(t[1]))  # noqa: E731
        best.append(max(-minimize(f, x0, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12, "maxiter": 4000}).fun
                        for x0 in ([0.0, 0.0], [3.0, -1.0], [-3.0, 2.0])) / len(F))
    assert logme(F, labels, iters=1000, tol=1e-10) == pytest.approx(np.mean(best), abs=1e-6)


def test_logme_is_higher_for_features_that_carry_the_labels():
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 3, 200)
    informative = np.eye(3)[labels] + 0.3 * rng.normal(size=(200, 3))
    noise = rng.normal(size=(200, 3))
    assert logme(informative, labels) > logme(noise, labels) + 0.1


# ------------------------------------------------------------------------------ Task2Vec


def test_task2vec_distance_properties():
    F = np.array([1.0, 2.0, 3.0, 0.5])
    assert task2vec_distance(F, F) == pytest.approx(0.0, abs=1e-12)
    assert task2vec_distance(F, 7.0 * F) == pytest.approx(0.0, abs=1e-12)  # normalised: scale-free
    G = np.array([3.0, 0.1, 1.0, 2.0])
    assert task2vec_distance(F, G) == pytest.approx(task2vec_distance(G, F)) and 0 < task2vec_distance(F, G) < 1
    # disjoint supports: orthogonal after normalisation
    assert task2vec_distance(np.array([1.0, 0, 1, 0]), np.array([0, 2.0, 0, 2])) == pytest.approx(1.0)


def test_fisher_diagonal_is_the_mean_squared_gradient_by_autograd():
    """A model so sure of its class that y ~ p(y|x) is the argmax: the Fisher diagonal is then the
    mean over examples of the squared gradient of log p(argmax | x), by a plain autograd loop."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with torch.no_grad():
        net[1].weight.mul_(0.01)
        net[1].bias.copy_(torch.tensor([40.0, 0.0, 0.0]))  # class 0 with probability ~1
    x = np.random.default_rng(7).uniform(size=(6, 4, 4)).astype(np.float32)
    sample = Sample(ArraySource("tiny", x, np.zeros(6, int), 3), np.arange(6))
    common = dict(input_size=4, channels=1, names=["1.weight", "1.bias"], device=torch.device("cpu"), engine="vmap")
    got = fisher_diagonal(net, sample, common, seed=0)
    xs = sample.tensor(4, 1, "cpu")
    want = torch.zeros_like(got)
    for i in range(6):
        net.zero_grad()
        torch.log_softmax(net(xs[i : i + 1]).double(), -1)[0, 0].backward()
        want += torch.cat([net[1].weight.grad.flatten(), net[1].bias.grad]).double() ** 2
    assert torch.allclose(got, want / 6, rtol=1e-4, atol=1e-30)


def test_head_input_features_are_the_penultimate_activations():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    x = torch.randn(5, 1, 2, 2)
    feats = head_input_features(net, [x[:2], x[2:]], torch.device("cpu"))
    assert torch.allclose(feats, net[:3](x).double(), atol=1e-6)


# ------------------------------------------------------------------------------ through the ranking


@pytest.mark.parametrize("metric", ["frechet", "otdd", "task2vec", "logme"])
def test_gsd_rank_metric_end_to_end_says_not_private(capsys, tmp_path, metric):
    if metric == "otdd":
        pytest.importorskip("ot")
    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    code = main(["rank", "--metric", metric, "--public", "mnist-b", "noise", *TINY, "--json", str(js), "--csv", str(cs)])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(js.read_text())
    assert doc["metric"] == metric and doc["dp"] is False and doc["privacy"] is None
    assert {r["public"] for r in doc["results"]} == {"mnist-b", "noise"}
    assert all(np.isfinite(r["distance"]) for r in doc["results"])
    assert any("not differentially private" in w for w in doc["warnings"])
    rows = list(csv.DictReader(cs.open()))
    assert {r["metric"] for r in rows} == {metric} and {r["dp"] for r in rows} == {"false"}
    flat = " ".join(out.split())
    assert f"{metric} (not DP" in flat and "not differentially private" in flat


def test_a_baseline_is_refused_with_dp(capsys):
    code = main(["rank", "--metric", "frechet", "--dp", "--epsilon", "1", "--public", "noise", *TINY])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err and out == ""
    assert len(err.strip().splitlines()) == 1 and "not differentially private" in err and "--dp" in err
    with pytest.raises(GSDError, match="not differentially private"):
        rank("mnist-a", ["noise"], examples=20, k=2, model="fmnist-cnn", device="cpu", distance="logme", dp=True, epsilon=1.0)


def test_an_unknown_metric_is_a_one_line_error(capsys):
    code = main(["rank", "--metric", "fid", "--public", "noise", *TINY])
    out, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "unknown --metric 'fid'" in err and "frechet" in err


def test_baselines_rank_the_same_distribution_first_and_keep_out_of_the_subspace_cache(tmp_path):
    """mnist-b (the other half of the private set's distribution) against noise; nothing is written
    to the disk cache of public subspaces (a baseline's sides are no subspaces)."""
    from gsd_cli.ranking.cache import SubspaceCache

    cache = SubspaceCache(tmp_path / "cache")
    r = rank("mnist-a", ["noise", "mnist-b"], examples=60, k=3, model="fmnist-cnn", device="cpu", distance="frechet", cache=cache)
    assert r.winner.public == "mnist-b" and r.metric == "frechet"
    assert not list((tmp_path / "cache").glob("*.safetensors"))
    plain = rank("mnist-a", ["noise", "mnist-b"], examples=60, k=3, model="fmnist-cnn", device="cpu")
    assert plain.metric == "gsd" and plain.to_dict()["metric"] == "gsd"


def test_the_validity_line_is_printed_from_the_shipped_figures():
    """The note under a GSD table comes from gsd_cli/report/heldout.json (written by python -m benchmarks validity --round N
    score --update-package), not from numbers in the printing code: the pre-registered rounds first, the rounds
    designed after their miss apart, the no-harm count beside the cells where the advice chose DP-SGD itself."""
    from rich.console import Console

    from gsd_cli.ranking import Ranking, RankResult
    from gsd_cli.report import print_ranking
    from gsd_cli.report.validity import heldout, validity_line

    doc = heldout()
    assert doc is not None and doc["pre_registered"]["rounds"] == [2, 3] and doc["later"]["rounds"] == [4, 5]
    line = validity_line("gsd")
    p, q = doc["pre_registered"], doc["later"]
    lo, hi = p["gain"]["ci"]
    assert f"pre-registered rounds 2-3: {len(p['tasks'])} tasks" in line and "bootstrap over tasks" in line
    assert f"in {p['cells_ok']} of {p['cells']} cells, {p['dpsgd_by_choice']} of them by choosing DP-SGD itself" in line
    assert f"always DP-SGD: {p['cells']} of {p['cells']}" in line and f"{p['gain']['mean']:+.1f} [{lo:+.1f}, {hi:+.1f}]" in line
    assert f"{p['spearman_gsd']['mean']:+.2f}" in line and f"{100 * p['oracle_share']['mean']:.0f}% [" in line
    assert line.index("Rounds 4-5, designed after that miss") > line.index(f"{p['cells_ok']} of {p['cells']}")
    assert f"{q['cells_ok']} of {q['cells']} cells" in line and "3 epochs" in line
    assert "in-sample" not in line and "6 of 6" not in line  # the in-sample figures of issue 33 are no longer printed
    assert validity_line("frechet") is None and validity_line("dp-gsd") is None

    def shown(metric):
        rk = Ranking(private="p", model="fmnist-cnn", k=2, examples=4, seed=0, labels="random", row_norm="unit", params=None,
                     num_params=10, device="cpu", engine="vmap", private_examples=4, uniform_baseline=0.9, metric=metric,
                     results=[RankResult("a", 0.1, 1, 4, [1.0, 2.0], 0.0, True)] if metric == "gsd" else [RankResult("a", 0.1, 1, 4, [], 0.0, True)])
        console = Console(record=True, width=400)
        print_ranking(rk, console, validity=True)  # gsd rank --validity (issue 64: not by default)
        return console.export_text()

    table = shown("gsd")
    assert "Earlier (held-out benchmark, pre-registered" in table and "validity" not in shown("otdd")
    # round 6 (the latest pre-registered round, gsd_cli/report/heldout6.json) first, its DP advice beside the non-private one
    from gsd_cli.report.validity import heldout6

    r6 = heldout6()
    assert r6 is not None and line.index("round 6") < line.index("Earlier (held-out benchmark")
    assert f"in {r6['non_private']['no_harm']} of {r6['non_private']['cells']} cells ({r6['non_private']['dpsgd_by_choice']} by choosing DP-SGD)" in line
    assert f"--select-epsilon {r6['select_epsilon']:g} at the same total epsilon (DP)" in line and "targets missed" in line
    dp = validity_line("dp-energy")  # gsd rank --dp's default: what auto-select does with a private selection's winner
    assert "--select-epsilon" in dp and "noise references" in dp and "validity: Advice" in shown("dp-energy")
    assert "noise references" in line
    # round 7 (gsd_cli/report/heldout7.json) leads: per private size, whether public data paid, then both advices,
    # the eligibility rule's refusals beside the feature probe's top candidate, and the DP advice's declines
    from gsd_cli.report.validity import heldout7

    r7 = heldout7()
    assert r7 is not None and line.index("round 7") < line.index("round 6") < line.index("Earlier (held-out")
    og = r6["oracle_gain"]  # where public data could not pay, the note says how little the oracle gained
    assert "Round 6 (from scratch, no task with a related public set from another source" in line
    assert f"the oracle (the best choice in hindsight) gained {og['mean']:+.2f} [{og['ci'][0]:+.2f}, {og['ci'][1]:+.2f}] points" in line
    for st in r7["sets"].values():
        r, dp = st["pick_refused"], st["dp"]
        assert f"kept the feature probe's top candidate out in {r['cells']} of {r['of']} cells" in line
        assert f"{dp['no_harm']} of {dp['cells']} cells, mean gain" in line and f"it chose no candidate in {dp['dpsgd_by_choice']} of them" in line
        assert f"{st['sizes'][0]:,} private examples ({st['oracle_loso']['of']} tasks) public data " in line


def test_logme_of_degenerate_features_is_finite():
    """Features that carry nothing (all zero, or one constant column) gave a ZeroDivisionError (alpha -> 0)."""
    import numpy as np

    from gsd_cli.distance.baselines.logme import logme

    labels = np.arange(40) % 4
    for F in (np.zeros((40, 8)), np.ones((40, 1)), np.r_[np.ones((39, 3)), np.zeros((1, 3))]):
        assert np.isfinite(logme(F, labels))
