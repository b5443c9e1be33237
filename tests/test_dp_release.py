"""Issue 17: DP releases whose private randomness is secret, one neighbouring relation, honest outputs.

Each test here fails on the code before the fix: DP-GSD seeded from the printed --seed, the ledger
booking fresh repeats once, summary.json holding test metrics and N, NaN pixels reaching the model,
and the private set accepted as public data.
"""

import json
import re

import numpy as np
import pytest
import torch

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.privacy import Ledger
from gsd_cli.ranking import rank

KW = dict(k=2, examples=30, model="fmnist-cnn", params="fc*", engine="vmap")  # one engine: auto times itself


def _one_line_error(code, err, what=""):
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and what in lines[0], err


@pytest.fixture
def declared(tiny, tmp_path):
    """conftest's ``tiny`` sets (120 examples; the private npz declares its classes) and their folder."""
    return {**tiny, "dir": tmp_path}


def test_two_dp_ranks_with_the_same_arguments_and_seed_differ(tmp_path, capsys):
    """The old code drew the DP sample from --seed: the release was a deterministic function of the
    printed outputs and the data, i.e. epsilon infinite. Now two identical runs differ."""
    outs = []
    for i in range(2):
        path = tmp_path / f"r{i}.json"
        code = main(["rank", "--dp", "--epsilon", "50", "--public", "mnist-b", "digits", "-m", "30", "-k", "2",
                     "--model", "fmnist-cnn", "--params", "fc*", "--seed", "3", "--json", str(path), "-q", "--no-cache"])
        assert code == 0, capsys.readouterr().err
        outs.append(json.loads(path.read_text()))
    a, b = ([(r["public"], r["distance"]) for r in o["results"]] for o in outs)  # the DP selection's releases
    assert a != b
    for doc in outs:
        pv = doc["privacy"]
        assert doc["dp"] is True and doc["seed"] == 3
        assert pv["neighbouring"] == "add or remove one example" and pv["insecure_seed"] is None
        assert "operating-system entropy" in pv["private_randomness"]
        # nothing in the output seeds the private side: the only seed printed is the public one
        assert "dp_seed" not in json.dumps(doc) and "noise_seed" not in json.dumps(doc)


def test_dp_release_is_not_a_function_of_public_outputs_for_neighbouring_sets(declared):
    """A distinguishing attack on the old code: with all but one example known, rerun under both
    hypotheses (the example absent / present) and match the released subspace bit for bit. Now
    reruns on the *same* data give other releases, so matching identifies nothing; with
    --insecure-seed the release is reproducible again and every output says it is not DP."""
    d = declared["dir"]
    raw = np.load(d / "priv.npz")
    np.savez(d / "minus.npz", x=raw["x"][:-1], y=raw["y"][:-1], classes=raw["classes"])  # D and D' = D + {x}
    kw = dict(KW, dp=True, epsilon=20.0, labels="own")
    for name in ("minus.npz", "priv.npz"):
        src = f"npz:{d / name}"
        v1 = rank(src, [declared["public"]], **kw).results[0].distance
        v2 = rank(src, [declared["public"]], **kw).results[0].distance
        assert v1 != v2
    a = rank(declared["private"], [declared["public"]], **kw, insecure_seed=11)
    b = rank(declared["private"], [declared["public"]], **kw, insecure_seed=11)
    assert a.results[0].distance == b.results[0].distance
    assert a.dp is False and a.to_dict()["privacy"]["insecure_seed"] == 11
    assert any("NOT differentially private" in w for w in a.warnings)
    from gsd_cli.report import to_csv

    import csv
    import io

    row = next(csv.DictReader(io.StringIO(to_csv(a))))
    assert row["dp"] == "false"


def test_insecure_seed_cli_marks_outputs_and_needs_dp(tmp_path, capsys):
    path = tmp_path / "r.json"
    code = main(["rank", "--dp", "--epsilon", "50", "--insecure-seed", "4", "--public", "mnist-b", "-m", "30", "-k", "2",
                 "--model", "fmnist-cnn", "--params", "fc*", "--json", str(path), "-q", "--no-cache"])
    out = " ".join(capsys.readouterr().out.split())  # rich wraps lines
    assert code == 0 and "NOT DP" in out and "NOT differentially private" in out
    assert json.loads(path.read_text())["dp"] is False
    code = main(["rank", "--insecure-seed", "4", "--public", "mnist-b", "-m", "30", "-q"])
    _one_line_error(code, capsys.readouterr().err, "--insecure-seed")


def test_dp_rank_never_prints_the_private_set_size(declared):
    """m = min(-m, N) reveals N when the set is smaller than -m: the requested m is printed instead."""
    r = rank(declared["private"], [declared["public"]], **{**KW, "examples": 500}, dp=True, epsilon=5.0)
    assert r.private_examples == 500 and r.privacy["examples"] == 500
    released = json.dumps({k: v for k, v in r.to_dict().items() if k in ("private_examples", "privacy")})
    assert not re.search(r"(?<![\d.])120(?![\d.])", released), released  # N=120 as a number, not a digit run in a float
    with pytest.raises(GSDError, match="examples"):
        rank(declared["private"], [declared["public"]], **{**KW, "examples": None}, dp=True, epsilon=5.0)


def test_dp_rank_needs_declared_classes(tmp_path, capsys):
    """This npz declares no classes: the model's output size would be max(label) + 1 of the
    private labels. DP refuses it unless --classes says; a plain ranking still reads it off."""
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "undeclared.npz", x=rng.uniform(size=(40, 16, 16)).astype(np.float32), y=rng.integers(0, 4, 40))
    tiny = {"private": f"npz:{tmp_path / 'undeclared.npz'}"}
    code = main(["rank", "--dp", "--epsilon", "5", "--private", tiny["private"], "--public", "mnist-b", "-m", "20", "-k", "2",
                 "--model", "fmnist-cnn", "--params", "fc*", "-q", "--no-cache"])
    _one_line_error(code, capsys.readouterr().err, "--classes")
    r6 = rank(tiny["private"], ["mnist-b"], **KW, dp=True, epsilon=5.0, classes=6)
    r4 = rank(tiny["private"], ["mnist-b"], **KW, dp=True, epsilon=5.0, classes="w,x,y,z")
    assert r6.dp and r4.dp and r6.num_params > r4.num_params  # the declared count sizes the head
    assert rank(tiny["private"], ["mnist-b"], **KW).dp is False


def test_ledger_books_the_total_of_fresh_repeats_and_refuses_unproven():
    led = Ledger()
    led.add_selection({"mechanism": "sequential", "exact": True, "delta": 0.0, "epsilon": 0.5, "total_epsilon": 1.5,
                       "releases": 3, "dp_repeats": "fresh"})
    led.add("training", 2.0, 1e-5)
    assert led.epsilon == pytest.approx(3.5) and led.entries[0].epsilon == 1.5
    led = Ledger()
    led.add_selection({"mechanism": "sequential", "exact": True, "delta": 0.0, "epsilon": 0.5})
    assert led.epsilon == 0.5
    with pytest.raises(GSDError, match="cannot be booked"):
        Ledger().add_selection({"mechanism": "matrix", "exact": False, "delta": None, "epsilon": 0.5})


def test_train_books_fresh_repeats_at_their_total(declared, tmp_path):
    from gsd_cli.train import TrainConfig, train

    sel = rank(declared["private"] + ":train", ["mnist-b", "digits"], **KW, dp=True, epsilon=0.5, repeats=3, dp_repeats="fresh",
               distance="dp-energy")  # the DP selection refuses repeats
    assert sel.privacy["total_epsilon"] == 1.5
    cfg = TrainConfig(private=declared["private"], method="dpsgd", epsilon=2.0, epochs=1, batch_size=20, physical_batch=32)
    s = train(cfg, tmp_path / "run", selection=sel.to_dict())
    entries = s["budget"]["entries"]
    assert entries[0]["epsilon"] == 1.5 and s["budget"]["total_epsilon"] == pytest.approx(1.5 + s["epsilon"])
    unproven = rank(declared["private"] + ":train", ["mnist-b"], **KW, dp=True, epsilon=0.5, mechanism="matrix", gibbs_sweeps=1)
    with pytest.raises(GSDError, match="cannot be booked"):
        train(cfg, tmp_path / "run2", selection=unproven.to_dict())
    assert not (tmp_path / "run2").exists()


def test_summary_json_is_publishable_and_the_rest_is_marked_private(declared, tmp_path):
    from gsd_cli.train import TrainConfig, train
    from gsd_cli.train.release import NON_DP_SUMMARY_FIELDS

    cfg = TrainConfig(private=declared["private"], method="dpsgd", epsilon=2.0, epochs=2, batch_size=20, physical_batch=32)
    s = train(cfg, tmp_path / "run")
    pub = json.loads((tmp_path / "run" / "summary.json").read_text())
    priv = json.loads((tmp_path / "run" / "private-summary.json").read_text())
    assert s["dp"] is True and pub["dp"] is True and "publishable" in pub["publishable"]
    assert not set(NON_DP_SUMMARY_FIELDS) & set(pub) and pub["privacy"]["size"]["how"] == "dp-estimate"
    assert pub["privacy"]["sampling_rate"] == pytest.approx(20 / pub["privacy"]["size"]["size"])  # from the DP estimate, not N
    text = json.dumps(pub)

    def leaves(d, path=""):
        if isinstance(d, dict):
            for k, v in d.items():
                yield from leaves(v, f"{path}.{k}")
        elif isinstance(d, list):
            for i, v in enumerate(d):
                yield from leaves(v, f"{path}[{i}]")
        else:
            yield path, d

    n = s["private_train_examples"]
    assert [p for p, v in leaves(pub) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == n
            and not p.endswith(".k")] == []  # (settings.k happens to be 100 = N here)
    assert "accuracy" not in text and "noise_seed" not in text
    assert priv["publishable"] is False and priv["test"] == s["test"] and priv["private_train_examples"] == s["private_train_examples"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"test_accuracy", "mean_batch", "fraction_clipped_grad"} <= set(rows[0]["not_dp"])
    assert "epsilon_spent" not in rows[0]["not_dp"]


def test_insecure_seed_train_is_reproducible_and_marked_not_dp(declared, tmp_path):
    from safetensors.torch import load_file

    from gsd_cli.train import TrainConfig, train

    # bit for bit with a fixed clipping path: auto times each layer's path on the first step, and on a busy machine two
    # runs can time them differently (the same update to float rounding; --resume keeps the measured paths)
    cfg = TrainConfig(private=declared["private"], method="dpsgd", epsilon=2.0, epochs=1, batch_size=20, physical_batch=32, insecure_seed=9,
                      clip_engine="materialise")
    a = train(cfg, tmp_path / "a")
    train(cfg, tmp_path / "b")
    wa, wb = load_file(str(tmp_path / "a" / "checkpoint.safetensors")), load_file(str(tmp_path / "b" / "checkpoint.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["dp"] is False and json.loads((tmp_path / "a" / "summary.json").read_text())["dp"] is False
    assert any("NOT differentially private" in n for n in a["notes"])


def test_nan_pixel_in_a_private_npz_is_refused(declared, capsys):
    d = declared["dir"]
    raw = np.load(d / "priv.npz")
    x = raw["x"].astype(np.float32) / 255
    x[17, 3, 4] = np.nan
    np.savez(d / "nan.npz", x=x, y=raw["y"], classes=raw["classes"])
    code = main(["rank", "--private", f"npz:{d / 'nan.npz'}", "--public", "mnist-b", "-m", "120", "-k", "2", "--model", "fmnist-cnn",
                 "--params", "fc*", "-q", "--no-cache"])
    _one_line_error(code, capsys.readouterr().err, "17")
    x[::5, 0, 0] = np.inf  # every fifth example: the first training step meets one
    np.savez(d / "nan.npz", x=x, y=raw["y"], classes=raw["classes"])
    code = main(["train", "--private", f"npz:{d / 'nan.npz'}", "--method", "dpsgd", "--epochs", "1", "--batch-size", "20",
                 "--out", str(d / "run"), "-q"])
    _one_line_error(code, capsys.readouterr().err, "infinite")


def test_clip_zeroes_non_finite_rows():
    from gsd_cli.subspace.dppca import clip_rows
    from gsd_cli.train import StepContext, clip

    G = torch.tensor([[3.0, 4.0], [float("nan"), 1.0], [float("inf"), 0.0], [0.3, 0.4]])
    out = clip_rows(G, 1.0)
    assert torch.equal(out[1], torch.zeros(2)) and torch.equal(out[2], torch.zeros(2))
    assert torch.allclose(out[0], torch.tensor([0.6, 0.8])) and torch.equal(out[3], G[3])
    ctx = StepContext(step=0, model=None, names=[], generator=torch.Generator(), device=torch.device("cpu"), info={})
    parts = clip(1.0).per_example({"grad": G}, ctx)
    assert torch.isfinite(parts["grad"]).all() and torch.equal(parts["grad"][1], torch.zeros(2))
    assert torch.isfinite(parts["grad"].sum(0)).all()


@pytest.mark.parametrize("dp", [False, True])
def test_the_private_set_as_a_candidate_is_refused(declared, dp, capsys):
    d = declared["dir"]
    raw = np.load(d / "priv.npz")
    np.savez(d / "copy.npz", x=raw["x"][:40], y=raw["y"][:40])  # a renamed copy sharing 40 examples
    np.savez(d / "whole.npz", x=raw["x"], y=raw["y"], classes=raw["classes"])  # a byte copy under another path
    extra = ["--dp", "--epsilon", "5"] if dp else []
    for cand in (declared["private"], f"npz:{d / 'whole.npz'}", f"npz:{d / 'copy.npz'}"):
        code = main(["rank", "--private", declared["private"], "--public", "mnist-b", cand, "-m", "40", "-k", "2",
                     "--model", "fmnist-cnn", "--params", "fc*", "-q", "--no-cache", *extra])
        if dp and cand.endswith(("copy.npz", "whole.npz")):  # under DP shared examples (a whole copy too) are left out, not refused
            assert code == 0, capsys.readouterr().err
            continue
        _one_line_error(code, capsys.readouterr().err, "private")


@pytest.mark.parametrize("method", ["gep", "second-phase"])
def test_the_private_set_as_training_public_data_is_refused(declared, method, capsys, tmp_path):
    args = ["train", "--private", declared["private"], "--public", declared["private"], "--method", method, "--epochs", "1",
            "--batch-size", "20", "--public-examples", "30", "--out", str(tmp_path / "run"), "-q"]
    _one_line_error(main(args), capsys.readouterr().err, "private")
    assert not (tmp_path / "run").exists()
    # --auto-select that would pick the private npz (distance 0) is refused too, before any training
    args = ["train", "--private", declared["private"], "--auto-select", "--public", declared["public"], declared["private"],
            "--method", method, "--epochs", "1", "--batch-size", "20", "--rank-examples", "30", "--rank-k", "2",
            "--out", str(tmp_path / "run"), "-q"]
    _one_line_error(main(args), capsys.readouterr().err, "private")
    code = main(["compare", "--private", declared["private"], "--public", declared["private"], "--methods", f"dpsgd,{method}",
                 "--seeds", "1", "--epochs", "1", "--batch-size", "20", "--out", str(tmp_path / "cmp"), "-q"])
    _one_line_error(code, capsys.readouterr().err, "private")
    assert not (tmp_path / "cmp").exists()
