"""Issue 50, item 6: the hostile-input sweep's cases. A run whose private training set the public data
empties is refused before any booking (on a ``private:`` line: the refusal turns on the private
examples); ``--no-fallback`` warns as ``--help`` promises; the audit's counts come from one test; every
error names the option typed; a clamped or ignored option says so in one line. Tiny inputs (fmnist-cnn's
fc layers, a few dozen examples); most cases stop before any gradient."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from gsd_cli.cli import main
from gsd_cli.errors import GSDError, PrivateError

SMALL = ["--model", "fmnist-cnn", "--params", "fc*", "--epochs", "1", "--batch-size", "30", "-q"]
RANK_SMALL = ["--rank-model", "fmnist-cnn", "--rank-k", "2", "--rank-examples", "30"]


@pytest.fixture
def sets(tmp_path):
    """A 10-class private npz (120 28x28 images, classes declared), a byte copy of it under another name, an
    unrelated public set and a one-class 80-image public set."""
    rng = np.random.default_rng(50)
    classes = np.array([str(i) for i in range(10)])
    np.savez(tmp_path / "priv.npz", x=rng.integers(0, 256, (120, 28, 28), dtype=np.uint8), y=np.arange(120) % 10, classes=classes)
    shutil.copy(tmp_path / "priv.npz", tmp_path / "privcopy.npz")
    np.savez(tmp_path / "far.npz", x=rng.integers(0, 256, (120, 28, 28), dtype=np.uint8), y=np.arange(120) % 10)
    np.savez(tmp_path / "oneclass.npz", x=rng.integers(0, 256, (80, 28, 28), dtype=np.uint8), y=np.zeros(80, np.int64))
    return {n: f"npz:{tmp_path / n}.npz" for n in ("priv", "privcopy", "far", "oneclass")}


def _lines(err: str) -> list[str]:
    return [" ".join(line.split()) for line in err.splitlines() if line.strip()]


# --- a copy of the private set as the public data: nothing left to train on ----------------------------

def _refused_privately(code: int, err: str, run) -> list[str]:
    lines = _lines(err)
    assert code == 2 and "Traceback" not in err, err
    refusal = [line for line in lines if "error:" in line]
    assert len(refusal) == 1 and refusal[0].startswith("private: error: every private training example"), lines
    assert "not a copy of the private data" in refusal[0]
    booked = [line for line in lines if line.startswith("booked epsilon")]
    assert not any(line.startswith("booked epsilon 2 ") for line in booked), booked  # refused before the training's booking
    assert not run.exists()  # and before any step (no run folder, no checkpoint)
    return booked


@pytest.mark.parametrize("method", ["gep", "second-phase"])
def test_a_byte_copy_as_the_public_set_is_refused_on_a_private_line(sets, tmp_path, capsys, method):
    run = tmp_path / "run"
    code = main(["train", "--private", sets["priv"], "--public", sets["privcopy"], "--method", method, *SMALL, "--k", "4",
                 "--public-examples", "200", "--public-epochs", "1", "--out", str(run)])
    assert _refused_privately(code, capsys.readouterr().err, run) == []  # nothing booked at all


def test_the_sweeps_case_auto_select_under_dp_with_no_fallback(sets, tmp_path, capsys):
    """The issue's command: --select-epsilon 0.5 --no-fallback with the copy as the only candidate (so the DP
    selection must pick it): before, GEP trained 6 DP steps on an empty set, "differentially private: yes"."""
    run = tmp_path / "run"
    code = main(["train", "--private", sets["priv"], "--auto-select", "--select-epsilon", "0.5", "--probe-repeats", "0", "--no-fallback", "--public",
                 sets["privcopy"], *RANK_SMALL, *SMALL, "--k", "4", "--public-examples", "200", "--out", str(run)])
    out, err = capsys.readouterr()
    assert "training with" in out and "privcopy" in out  # the (public) choice, then the private refusal
    booked = _refused_privately(code, err, run)
    assert len(booked) == 1 and booked[0].startswith("booked epsilon 0.5 ")  # the DP selection's alone: it did run


def test_the_refusal_is_the_documented_private_exception_for_a_copy_minus_the_target(sets, tmp_path, capsys):
    """Anchors that are the private set minus target #5: with #5 the run trains on it alone; without it
    nothing is left and the run is refused. That difference turns on #5's membership, which is why the
    refusal is on a private: line and its exit status is a private output (docs/train.md)."""
    with np.load(sets["priv"][4:]) as f:  # --private-test names the test set: every example is a training one
        x, y = np.delete(f["x"], 5, axis=0), np.delete(f["y"], 5)
    np.savez(tmp_path / "anchors.npz", x=x, y=y)
    np.savez(tmp_path / "without.npz", x=x, y=y, classes=np.array([str(i) for i in range(10)]))
    got = {}
    for name, private in (("with", sets["priv"]), ("without", f"npz:{tmp_path / 'without.npz'}")):
        code = main(["train", "--private", private, "--private-test", sets["far"], "--public", f"npz:{tmp_path / 'anchors.npz'}",
                     "--method", "gep", *SMALL, "--k", "4", "--public-examples", "200", "--expected-size", "100",
                     "--insecure-seed", "1", "--out", str(tmp_path / name)])
        got[name] = (code, capsys.readouterr().err)
    assert got["with"][0] == 0, got["with"][1]
    code, err = got["without"]
    assert code == 2 and _private_error_line(err).startswith("private: error: every private training example"), err


def test_the_library_raises_a_private_error_and_a_partial_copy_still_trains(sets, tmp_path):
    from gsd_cli.train import TrainConfig, train

    base = dict(private=sets["priv"], method="gep", k=4, epochs=1, batch_size=30, physical_batch=64, expected_size=100,
                model="fmnist-cnn", params=["fc*"])
    with pytest.raises(PrivateError, match="not a copy of the private data"):
        train(TrainConfig(**base, public=sets["privcopy"], public_examples=200), tmp_path / "all")
    assert not (tmp_path / "all").exists()
    s = train(TrainConfig(**base, public=sets["privcopy"], public_examples=40), tmp_path / "some")  # some left out, the rest train
    assert s["dp"] is True
    assert any("left out of the private training" in n for n in s["private_notes"])


def _private_error_line(err: str) -> str:
    (line,) = [line for line in _lines(err) if "error:" in line]
    assert "Traceback" not in err
    return line


def test_an_empty_private_training_set_is_refused_on_a_private_line(sets, tmp_path, capsys):
    """Wherever the private training set is empty (an empty file, or a per-example split that put every
    example in the test part), the refusal turns on the private data: a private: line."""
    np.savez(tmp_path / "empty.npz", x=np.zeros((0, 28, 28), np.uint8), y=np.zeros(0, np.int64),
             classes=np.array(["a", "b"]))
    code = main(["train", "--private", f"npz:{tmp_path / 'empty.npz'}", "--private-test", sets["far"], "--method", "dpsgd",
                 *SMALL, "--out", str(tmp_path / "r")])
    assert code == 2 and _private_error_line(capsys.readouterr().err).startswith("private: error:")
    from gsd_cli.data.splits import EmptyPartError, fixed_split
    from gsd_cli import data as gdata

    for seed in range(200):  # a one-example set whose example the hash split puts in the test part (p = 0.2 each)
        np.savez(tmp_path / "one.npz", x=np.random.default_rng(seed).integers(0, 256, (1, 28, 28), dtype=np.uint8),
                 y=np.zeros(1, np.int64), classes=np.array(["a", "b"]))
        try:
            fixed_split(gdata.resolve(f"npz:{tmp_path / 'one.npz'}"), "train")
        except EmptyPartError:
            break
    else:
        pytest.fail("no one-example set with an empty train part")
    code = main(["train", "--private", f"npz:{tmp_path / 'one.npz'}", "--method", "dpsgd", *SMALL, "--out", str(tmp_path / "r")])
    line = _private_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("private: error:") and "--private-test" in line, line
    code = main(["train", "--private", "nosuchname", "--method", "dpsgd", *SMALL, "--out", str(tmp_path / "r")])
    assert code == 2 and _private_error_line(capsys.readouterr().err).startswith("error:")  # a public input's error stays public


def test_a_private_error_keeps_its_label_across_processes(monkeypatch):
    """Several training processes hand process 0's error to the others by its message: a PrivateError stays
    one, so its line stays labelled private (checked on a world of two whose broadcast is a no-op)."""
    from gsd_cli.train.distributed import World

    class NoComm:
        def broadcast_object_list(self, box, src):
            pass

    world = World(rank=0, size=2)
    monkeypatch.setattr(world, "_dist", lambda: NoComm())

    def fail(cls):
        raise cls("why")

    with pytest.raises(PrivateError, match="why"):
        world.from_main(lambda: fail(PrivateError))
    with pytest.raises(GSDError) as e:
        world.from_main(lambda: fail(GSDError))
    assert type(e.value) is GSDError
    assert world.from_main(lambda: 7) == 7


# --- --no-fallback warns as --help promises ------------------------------------------------------------

def test_no_fallback_under_dp_warns_of_a_one_class_public_set(sets, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--private", sets["priv"], "--auto-select", "--select-epsilon", "0.5", "--method", "second-phase",
                 "--no-fallback", "--public", sets["oneclass"], *RANK_SMALL, *SMALL, "--public-examples", "80",
                 "--public-epochs", "1", "--expected-size", "100", "--out", str(run)])
    err = capsys.readouterr().err
    assert code == 0, err
    warned = [line for line in _lines(err) if line.startswith("warning: --no-fallback")]
    assert len(warned) == 1, err  # the DP feature probe had no candidate it could use: against its advice, and why
    assert "against the advice" in warned[0] and "has no labels of its own to pretrain on" in warned[0]


def test_no_fallback_warns_when_the_advice_refused_the_same_candidate(sets):
    """A refused decision that names the same candidate and method as the closest (the non-private
    probe's refusal of a one-class set) warned of nothing before."""
    from gsd_cli.advice.decide import Decision
    from gsd_cli.advice.select import forced_note

    refused = Decision("second-phase", sets["oneclass"], False, "--method second-phase: no candidate ... helps it",
                       refused=True)
    note = forced_note(sets["priv"], sets["oneclass"], "second-phase", refused)
    assert note.startswith(f"--no-fallback: training second-phase with {sets['oneclass']} against the advice")
    assert "no labels of its own" in note
    private = forced_note(sets["priv"], sets["oneclass"], "second-phase", refused, advice="on the private: line above")
    assert "helps it" not in private and "on the private: line above" in private  # a non-private advice stays private
    agreed = Decision("gep", sets["far"], False, "--method gep with far")
    assert forced_note(sets["priv"], sets["far"], "gep", agreed) is None  # the advice's own choice: nothing to say


# --- the audit's counts, and a tiny claim -------------------------------------------------------------

def test_audit_counts_come_from_the_audit_that_set_the_bound():
    from gsd_cli.audit import audit

    r = audit("dp-select", 2.0, canaries=50, trials=5, insecure_seed=1)
    best = r.details["sampler"] if r.details["best_audit"] == r.details["sampler"]["method"] else r.details["pipeline"]
    assert (r.canaries, r.guesses, r.correct) == (best["canaries"], best["guesses"], best["correct"])
    assert r.correct <= r.guesses and r.epsilon_lower_bound == best["epsilon_lower_bound"]


def test_audit_table_shows_draws_and_one_tests_counts_and_a_tiny_claim(capsys, tmp_path):
    js = tmp_path / "a.json"
    code = main(["audit", "--method", "dp-select", "--canaries", "50", "--trials", "5", "--epsilon", "1e-9",
                 "--insecure-seed", "1", "--json", str(js)])
    out = capsys.readouterr().out
    assert code == 0, out
    d = json.loads(js.read_text())
    row = next(line for line in out.splitlines() if "dp-select" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[1] == "1e-09"  # the claim, not 0.000
    assert cells[3] == str(d["guesses"] // 2) and cells[4] == f"{d['correct']}/{d['guesses']}"
    assert d["correct"] <= d["guesses"] and "draws per" in out and "canaries" not in out.split("dp-select")[0]
    assert "the table's counts are the" in " ".join(out.split())


# --- errors name the option typed -----------------------------------------------------------------------

@pytest.mark.parametrize("extra, said", [
    (["--select-epsilon", "0"], "--select-epsilon must be a positive"),
    (["--select-epsilon", "-1"], "--select-epsilon must be a positive"),
    (["--select-epsilon", "1e13"], "--select-epsilon 1e+13: at most"),
    (["--rank-repeats", "0"], "--rank-repeats must be a whole number >= 1"),
    (["--rank-repeats", "5000"], "--rank-repeats 5000: at most"),
    (["--rank-k", "0"], "--rank-k must be at least 1"),
    (["--rank-examples", "1"], "--rank-examples must be at least 2"),
    (["--select-epsilon", "1", "--rank-repeats", "2"], "--rank-repeats with the DP selection"),
])
def test_auto_select_errors_name_the_option_typed(sets, tmp_path, capsys, monkeypatch, extra, said):
    ledger = tmp_path / "never.sqlite"
    monkeypatch.setenv("GSD_LEDGER", str(ledger))
    code = main(["train", "--private", sets["priv"], "--auto-select", "--public", sets["far"], *SMALL, *extra,
                 "--out", str(tmp_path / "r")])
    lines = _lines(capsys.readouterr().err)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {said}"), lines
    assert " --epsilon" not in lines[0] and " --repeats" not in lines[0] and " --k " not in lines[0]
    assert not ledger.exists()  # before the ledger and any work


def test_gsd_rank_keeps_its_own_option_names(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GSD_LEDGER", str(tmp_path / "never.sqlite"))
    for extra, said in ((["--dp", "--epsilon", "0"], "error: --epsilon must be a positive"), (["-k", "0"], "error: --k must be"),
                        (["--repeats", "0"], "error: --repeats must be")):
        code = main(["rank", "-m", "20", "--model", "fmnist-cnn", "--params", "fc*", "-q", "--public", "mnist-b", *extra])
        lines = _lines(capsys.readouterr().err)
        assert code == 2 and len(lines) == 1 and lines[0].startswith(said), lines
    assert not (tmp_path / "never.sqlite").exists()


# --- clamped and ignored options say so in one line ---------------------------------------------------

def test_top_above_the_candidates_is_said(sets, capsys):
    code = main(["rank", "--dp", "--epsilon", "1", "--top", "50", "--private", sets["priv"], "--public", sets["far"],
                 sets["oneclass"], "mnist-b", "-m", "20", "-k", "2", "--model", "fmnist-cnn", "--params", "fc*", "-q", "--no-cache"])
    out, err = capsys.readouterr()
    assert code == 0, err
    text = " ".join((out + err).split())  # the ranking's warnings wrap at the terminal's width
    assert text.count("--top 50") == 1, text
    assert "warning: --top 50 is more than the 3 candidates: the DP selection chooses all 3, in order" in text


@pytest.mark.parametrize("extra, said", [
    (["--select-epsilon", "1"], "--probe-repeats is not used with --select-epsilon"),
    (["--method", "gep"], "--probe-repeats is not used with --method gep"),
])
def test_probe_repeats_that_do_not_apply_are_said(sets, tmp_path, capsys, extra, said):
    run = tmp_path / "run"
    run.mkdir()
    (run / "x").write_text("taken")  # the run stops at its folder, after the options are checked
    code = main(["train", "--private", sets["priv"], "--auto-select", "--public", sets["far"], "--probe-repeats", "5", *extra,
                 *SMALL, "--out", str(run)])
    lines = _lines(capsys.readouterr().err)
    assert code == 2
    warned = [line for line in lines if line.startswith("warning: --probe-repeats")]
    assert len(warned) == 1 and warned[0].startswith(f"warning: {said}") and warned[0].endswith("ignored"), lines


def test_a_long_probe_says_its_plan_under_quiet(sets, tmp_path, capsys, monkeypatch):
    """--probe-repeats 100 ran for minutes with no word under -q: a public plan line comes first."""
    import gsd_cli.advice.probe as probe
    import gsd_cli.advice.select as select

    def stop(*args, **kwargs):
        raise GSDError("stopped by the test")

    import gsd_cli.advice.decide as advice

    monkeypatch.setattr(probe, "probe_second_phase", stop)
    monkeypatch.setattr(select, "choosable", lambda ranking, sources, *a: list(sources))  # probe every candidate
    monkeypatch.setattr(advice, "second_phase_usable", lambda *a: None)  # (the probe runs first: every usable one)
    code = main(["train", "--private", sets["priv"], "--auto-select", "--public", sets["far"], "--probe-repeats", "100",
                 "--rank-repeats", "2", *RANK_SMALL, *SMALL, "--public-examples", "80", "--out", str(tmp_path / "run")])
    lines = _lines(capsys.readouterr().err)
    assert code == 2 and lines[-1] == "error: stopped by the test", lines
    plan = [line for line in lines if line.startswith("plan: the feature probe")]
    assert len(plan) == 1 and "100 draws" in plan[0] and "at most 100 stage-1 training(s)" in plan[0], lines
