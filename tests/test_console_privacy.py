"""Issue 43, section 3: the console of a DP command is as public as its summary.

Each test runs a DP command on two neighbouring private sets (the same file path holding sets that
differ in one example) and compares what a reviewer would publish: the exit status, every stdout and
stderr line that does not start with ``private:``, and the written public files. Private figures may
appear only on lines labelled ``private:``. The runs use declared sizes (``--expected-size``) so that
the mechanism itself is the same for both sets; DP releases (the noisy distances of ``gsd rank --dp``)
are masked where a line shows one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from gsd_cli.cli import common, main

CLASSES = np.array([str(i) for i in range(10)])
TRAIN = ["--model", "fmnist-cnn", "--params", "fc*", "--epochs", "1", "--batch-size", "10", "--expected-size", "40",
         "--clip-engine", "materialise", "--physical-batch", "64"]
RANK = ["--model", "fmnist-cnn", "--params", "fc*", "--no-cache", "--engine", "vmap", "-k", "2", "-m", "30"]
#: a duration as the console prints one (2.9s, 38s, 1m35s, 1h02m): masked where a public line may time
#: synthetic or public work (the plan's estimate); epoch and step times are checked to be private
TIME = re.compile(r"\b\d+(\.\d+)?s\b|\b\d+m\d\ds\b|\b\d+h\d\dm\b")


def _images(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


def _write(path, x):
    np.savez(path, x=x, y=(np.arange(len(x)) % 10).astype(np.int64), classes=CLASSES)


def _run(capsys, argv):
    code = main(argv)
    cap = capsys.readouterr()
    return code, cap.out.splitlines(), cap.err.splitlines()


def _public(lines):
    """The lines a reviewer publishes: all but those labelled private, durations masked."""
    return [TIME.sub("<time>", line) for line in lines if not line.startswith(common.PRIVATE_LABEL)]


def _released(lines):
    """Public lines of a DP ranking with its DP release masked: the table's rows and rules (which
    candidates are shown, in which order, with which noisy distances) and the line naming those not
    chosen. The title and caption are wrapped to the table's width, which the released names set: the
    rest is compared as one text with every space and line break taken out."""
    kept = [line for line in _public(lines) if not line.lstrip().startswith(("┏", "┃", "┡", "│", "└", "Not chosen"))]
    return ["".join("".join(kept).split())]


def _wide(monkeypatch):
    """``gsd rank`` prints on consoles 1,000 columns wide: a table's row is one line, and so is the line
    naming the candidates not chosen (:func:`_released` leaves both out)."""
    from rich.console import Console

    from gsd_cli.cli import rank as rank_cli

    monkeypatch.setattr(rank_cli, "out", Console(width=1000))
    monkeypatch.setattr(rank_cli, "err", Console(width=1000, stderr=True))


def _neighbours(tmp_path, base, target, argv_of, capsys, files=()):
    """Run ``argv_of()`` with ``private.npz`` holding ``base`` (with ``target``) and then ``base`` without
    it, in the same folder; ``files``: public files of the run compared as JSON. Returns both results."""
    got = []
    for x in (base, np.delete(base, target, axis=0)):
        _write(tmp_path / "private.npz", x)
        for f in ("run", *files):
            p = tmp_path / f
            shutil.rmtree(p) if p.is_dir() else p.unlink(missing_ok=True)
        Path(os.environ["GSD_LEDGER"]).unlink(missing_ok=True)  # each neighbour starts from a new ledger ("created ...")
        code, out, err = _run(capsys, argv_of())
        docs = {f: json.loads((tmp_path / f).read_text()) for f in files if (tmp_path / f).is_file()}
        got.append((code, out, err, docs))
    return got


def _same_public(got, released=False):
    (c1, o1, e1, f1), (c2, o2, e2, f2) = got
    view = _released if released else _public
    assert c1 == c2, (c1, c2, e1, e2)
    assert view(o1) == view(o2), "\n".join(view(o1) + ["---"] + view(o2))
    assert _public(e1) == _public(e2), "\n".join(_public(e1) + ["---"] + _public(e2))
    assert f1 == f2


# --- 1. a copy of the private set minus one example: no refusal on content under DP ----------------

def test_dp_rank_does_not_refuse_a_copy_minus_the_target(tmp_path, capsys, monkeypatch):
    """The public set is the private set minus example #7. Before: refused (exit 2) exactly when #7 was
    not in the private set (equal content), ran (exit 0) when it was."""
    _wide(monkeypatch)
    base = _images(40, 1)
    _write(tmp_path / "public.npz", np.delete(base, 7, axis=0))
    argv = lambda: ["rank", "--dp", "--epsilon", "4", "--private", f"npz:{tmp_path / 'private.npz'}",  # noqa: E731
                    "--public", f"npz:{tmp_path / 'public.npz'}", "digits", *RANK]
    got = _neighbours(tmp_path, base, 7, argv, capsys)
    assert [g[0] for g in got] == [0, 0], got[1][2]
    _same_public(got, released=True)
    # without --dp the content check stays: the same examples under another path are refused
    code, _, err = _run(capsys, ["rank", "--private", f"npz:{tmp_path / 'private.npz'}", "--public", f"npz:{tmp_path / 'public.npz'}",
                                 "-q", *RANK])
    assert code == 2 and "same content" in " ".join(err), err


def test_dp_training_does_not_refuse_gep_anchors_that_copy_the_set_minus_the_target(tmp_path, capsys):
    """The anchors are the private set minus the target #5 (and minus one example #40 that keeps the neighbour
    without #5 from being left empty: a run with *no* private example left is refused on a private line,
    a documented private output, tests/test_sweep_round4.py)."""
    base = np.concatenate([_images(40, 2), _images(1, 9)])
    _write(tmp_path / "public.npz", np.delete(base[:40], 5, axis=0))
    _write(tmp_path / "test.npz", _images(20, 3))
    argv = lambda: ["train", "--private", f"npz:{tmp_path / 'private.npz'}", "--private-test", f"npz:{tmp_path / 'test.npz'}",  # noqa: E731
                    "--method", "gep", "--public", f"npz:{tmp_path / 'public.npz'}", "--k", "2", "--public-examples", "39",
                    "--anchor-batch", "0", *TRAIN, "--out", str(tmp_path / "run"), "-q"]
    got = _neighbours(tmp_path, base, 5, argv, capsys, files=("run/summary.json",))
    assert [g[0] for g in got] == [0, 0], got[1][2]
    _same_public(got)


def test_dp_refusal_by_name_and_path_is_the_same_for_neighbours(tmp_path, capsys):
    """What is still refused under DP is refused on public inputs: the private file named again (by another
    spelling of its path, or by a catalogue entry that reads it), for both neighbours alike."""
    base = _images(40, 4)
    cat = tmp_path / "c.toml"
    cat.write_text(f'[datasets.mine]\nsource = "npz"\npath = "{tmp_path / "private.npz"}"\n')
    for public in (f"npz:{tmp_path / '.' / 'private.npz'}", "mine"):
        argv = lambda: ["train", "--private", f"npz:{tmp_path / 'private.npz'}", "--method", "gep", "--public", public,  # noqa: E731
                        "--catalog", str(cat), "--k", "2", "--public-examples", "20", *TRAIN, "--out", str(tmp_path / "run"), "-q"]
        got = _neighbours(tmp_path, base, 3, argv, capsys)
        assert [g[0] for g in got] == [2, 2]
        _same_public(got)
        assert "is private data" in got[0][2][-1]


def test_same_dataset_under_dp_reads_names_and_paths_only(tmp_path):
    from gsd_cli import data as gdata
    from gsd_cli.data.identity import origin, same_dataset
    from gsd_cli.ranking.catalog import load_catalog

    x = _images(50, 5)
    _write(tmp_path / "a.npz", x)
    shutil.copy(tmp_path / "a.npz", tmp_path / "copy.npz")
    a, copy = gdata.resolve(f"npz:{tmp_path / 'a.npz'}"), gdata.resolve(f"npz:{tmp_path / 'copy.npz'}")
    assert "same content" in same_dataset(a, copy)  # non-DP: content
    assert same_dataset(a, copy, by_content=False) is None  # DP: a copy under another path is left to the per-example rule
    cat = tmp_path / "c.toml"
    cat.write_text(f'[datasets.alias]\nsource = "npz"\npath = "{tmp_path / "a.npz"}"\n')
    alias = load_catalog(cat).resolve("alias")
    assert "same path" in same_dataset(a, alias, by_content=False)
    train, test = (gdata.resolve(f"npz:{tmp_path / 'a.npz'}:{s}") for s in ("train", "test"))
    assert origin(train)[1] == ("train",) and origin(a)[1] == ()
    assert same_dataset(train, test, by_content=False) is None  # two parts of one file
    assert "same path" in same_dataset(train, alias, by_content=False)  # the whole holds the part
    assert "same path" in same_dataset(load_catalog(cat).resolve("alias", split="test"), test, by_content=False)


# --- 2. how many private examples the public data holds: private, and only once booked ------------

def _overlap_setup(tmp_path):
    base = _images(40, 6)
    _write(tmp_path / "public.npz", np.concatenate([_images(25, 7), base[:5]]))  # anchors holding 5 private examples
    _write(tmp_path / "test.npz", _images(20, 8))
    return base, lambda *extra: ["train", "--private", f"npz:{tmp_path / 'private.npz'}", "--private-test", f"npz:{tmp_path / 'test.npz'}",
                                 "--method", "gep", "--public", f"npz:{tmp_path / 'public.npz'}", "--k", "2",
                                 "--public-examples", "30", "--anchor-batch", "0", *TRAIN, "--out", str(tmp_path / "run"), "-q", *extra]


def test_the_count_of_shared_examples_is_on_a_private_line_only(tmp_path, capsys):
    base, argv = _overlap_setup(tmp_path)
    got = _neighbours(tmp_path, base, 2, argv, capsys, files=("run/summary.json",))  # example #2 is shared: 5 against 4
    assert [g[0] for g in got] == [0, 0], got[1][2]
    _same_public(got)
    for (_, out, err, _), n in zip(got, (5, 4)):
        hits = [line for line in out + err if "among the public examples" in line]
        assert hits and all(line.startswith("private: warning: ") for line in hits), hits
        assert f"{n} private training example(s)" in hits[0]


def test_a_run_refused_by_its_budget_says_nothing_of_the_overlap(tmp_path, capsys):
    """The count was printed before the booking, so also on a run the budget refused."""
    base, argv = _overlap_setup(tmp_path)
    got = []
    for x in (base, np.delete(base, 2, axis=0)):
        _write(tmp_path / "private.npz", x)
        Path(os.environ["GSD_LEDGER"]).unlink(missing_ok=True)  # each neighbour in a ledger of its own
        assert _run(capsys, ["budget", "set", "--private", f"npz:{tmp_path / 'private.npz'}", "--epsilon", "1", "--delta", "1e-4"])[0] == 0
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        got.append(_run(capsys, argv()) + ({},))
    assert [g[0] for g in got] == [2, 2]
    for code, out, err, _ in got:
        assert not any("among the public" in line for line in out + err), err
        private = [line for line in out + err if line.startswith(common.PRIVATE_LABEL)]
        assert len(private) == 1 and private[0].startswith("private: error:") and "budget" in private[0], err  # the refusal only
    _same_public(got)


# --- 3. the delta warning: on the size that sets the mechanism, never the exact N -------------------

def test_delta_warning_is_a_function_of_the_declared_size(tmp_path, capsys):
    """N = 40 or 39 with --expected-size 40 and --delta 0.025 = 1/40: before, the warning appeared for
    N = 40 and not for N = 39, and named N. Now the public warning is on N0 = 40 for both."""
    base = _images(40, 9)
    _write(tmp_path / "test.npz", _images(20, 10))
    argv = lambda: ["train", "--private", f"npz:{tmp_path / 'private.npz'}", "--private-test", f"npz:{tmp_path / 'test.npz'}",  # noqa: E731
                    "--method", "dpsgd", "--delta", "0.025", *TRAIN, "--out", str(tmp_path / "run"), "-q"]
    got = _neighbours(tmp_path, base, 0, argv, capsys, files=("run/summary.json",))
    assert [g[0] for g in got] == [0, 0], got[1][2]
    _same_public(got)
    for (_, out, err, docs), n in zip(got, (40, 39)):
        public = _public(out + err)
        assert any("1/N = 0.025 for N = 40, the declared --expected-size" in line for line in public), public
        assert not any("N = 39" in line for line in public)
        private = [line for line in err if line.startswith("private:") and "--delta" in line]
        assert private == ([f"private: warning: --delta 0.025 is at or above 1/N = 0.025 for the N = 40 private training examples: "
                            "delta should be well below 1/N"] if n == 40 else [])
        assert any("N = 40, the declared" in note for note in docs["run/summary.json"]["notes"])


def test_delta_warning_on_the_dp_estimate_names_the_estimate(tmp_path):
    """Without a declared size the warning is on N~ (the DP estimate, in summary.json), not on N."""
    from gsd_cli.train import TrainConfig, train

    _write(tmp_path / "p.npz", _images(40, 11))
    _write(tmp_path / "t.npz", _images(20, 12))
    seen = []
    s = train(TrainConfig(private=f"npz:{tmp_path / 'p.npz'}", private_test=f"npz:{tmp_path / 't.npz'}", method="dpsgd", epochs=1,
                          batch_size=10, delta=0.02, model="fmnist-cnn", params=["fc*"], clip_engine="materialise", insecure_seed=3),
              tmp_path / "run", notify=seen.append)
    n_est = s["privacy"]["size"]["size"]
    from gsd_cli.train.release import PrivateNote

    public = [m for m in seen if not isinstance(m, PrivateNote) and "--delta" in m]
    assert public == ([f"--delta 0.02 is at or above 1/N = {1 / n_est:.3g} for N = {n_est}, the DP estimate of the private "
                       "set's size: delta should be well below 1/N"] if 0.02 >= 1 / n_est else [])
    assert all(isinstance(m, PrivateNote) for m in seen if "N = 40 private" in m)


# --- 4. the test set's size and the epoch times ---------------------------------------------------

def test_test_size_and_epoch_times_are_on_private_lines(tmp_path, capsys, monkeypatch):
    """The default split: the target example falls in the test part, so the test set has 1 example less.
    Progress lines (plain, off a terminal, from the first second) carry the times: labelled private."""
    from gsd_cli import data as gdata
    from gsd_cli.train.release import PRIVATE_LABEL

    assert common.PRIVATE_LABEL == PRIVATE_LABEL  # the CLI's copy (its start-up imports no torch)
    monkeypatch.setattr(common, "PLAIN_AFTER", 0.0)
    base = _images(60, 13)
    _write(tmp_path / "private.npz", base)
    test_idx = gdata.resolve(f"npz:{tmp_path / 'private.npz'}:test").indices
    target = int(test_idx[0])
    argv = lambda: ["train", "--private", f"npz:{tmp_path / 'private.npz'}", "--method", "dpsgd", *TRAIN,  # noqa: E731
                    "--out", str(tmp_path / "run")]
    got = _neighbours(tmp_path, base, target, argv, capsys, files=("run/summary.json",))
    assert [g[0] for g in got] == [0, 0], got[1][2]
    _same_public(got)
    for (_, out, err, _), n in zip(got, (len(test_idx), len(test_idx) - 1)):
        assert f"private: test ({n} examples): " in "\n".join(out)
        timed = [line for line in err if "done in" in line or "a step, about" in line]
        assert timed and all(line.startswith("private: ") for line in timed), err
        assert not any("test (" in line for line in _public(out + err))


def test_dp_rank_progress_lines_are_private(tmp_path, capsys, monkeypatch):
    """gsd rank --dp off a terminal: every progress line is labelled private (their times include the
    private side's, and whether they appear at all turns on the time elapsed)."""
    monkeypatch.setattr(common, "PLAIN_AFTER", 0.0)
    _wide(monkeypatch)
    base = _images(40, 14)
    argv = lambda: ["rank", "--dp", "--epsilon", "4", "--private", f"npz:{tmp_path / 'private.npz'}", "--public", "digits",  # noqa: E731
                    *RANK]
    got = _neighbours(tmp_path, base, 0, argv, capsys)
    assert [g[0] for g in got] == [0, 0], got[1][2]
    _same_public(got, released=True)
    for _, _, err, _ in got:
        progress = [line for line in err if "/30" in line or "done" in line]
        assert progress and all(line.startswith("private: ") for line in progress), err


# --- 5. a non-private --auto-select: its statistics of the private data on private lines and in the private file ---

def _auto_select_argv(tmp_path, *extra):
    """Run from ``tmp_path`` (the caller chdirs): relative names, so that the drawn examples, which are keyed by a set's
    name (gsd_cli.data.draw), are those of every run of the test; with the temporary folder's absolute path in the
    name each run was another instance, and in some the advice took another branch."""
    return lambda: ["train", "--private", "npz:private.npz", "--private-test", "npz:test.npz",
                    "--auto-select", "--public", "digits", "noise", "--rank-model", "fmnist-cnn", "--rank-k", "2",
                    "--rank-examples", "50", "--rank-repeats", "2", "--probe-repeats", "2", "--public-examples", "40",
                    "--public-epochs", "1", *TRAIN, "--out", str(tmp_path / "run"), "-q", *extra]


def test_non_private_auto_select_puts_its_statistics_on_private_lines_and_in_the_private_file(tmp_path, capsys, monkeypatch):
    """Issue 50, item 3. --rank-examples 50 above N (40 against 39): the ranking drew every private example, so its
    title's count, the distances, the references' distances, the probe's accuracies and p-values all differ
    between the neighbours. Before: on unprefixed lines, and in summary.json marked publishable."""
    base = _images(40, 15)
    _write(tmp_path / "test.npz", _images(20, 16))
    monkeypatch.chdir(tmp_path)
    got = _neighbours(tmp_path, base, 3, _auto_select_argv(tmp_path), capsys, files=("run/summary.json", "run/private-summary.json"))
    assert [g[0] for g in got] == [0, 0], got[1][2]
    _same_public([(c, o, e, {"s": d["run/summary.json"]}) for c, o, e, d in got])
    for (_, out, err, docs), n in zip(got, (40, 39)):
        lines = out + err
        ranked = {r["public"] for r in docs["run/private-summary.json"]["selection"]["results"]}
        # the lines joined: the table's title wraps where the temporary folder's path length puts it ("(40" / "examples)")
        private_text = " ".join(" ".join(line.removeprefix("private:").split()) for line in lines if line.startswith("private:"))
        assert f"({n} examples)" not in " ".join(" ".join(line.split()) for line in _public(lines))
        if ranked:  # the probe runs first and only the candidates it finds helpful are ranked (issue 53)
            assert f"({n} examples)" in private_text  # the ranking's title, on private lines only
            assert any("in-run noise references" in line for line in lines if line.startswith("private:"))
        left = docs["run/private-summary.json"]["selection"]
        assert any(line.startswith("private: Not ranked") for line in lines) == bool(left["not_ranked"]), lines
        assert any(line.startswith("private: Not closer than noise") for line in lines) == bool(left["stopped"]), lines
        assert any(line.startswith("private: --method auto:") for line in lines), lines  # the decision, with its figures
        pub, priv = docs["run/summary.json"], docs["run/private-summary.json"]
        assert pub["dp"] is False and "NOT differentially private" in pub["publishable"] and "private-summary.json" in pub["publishable"]
        assert pub["public_distance"] is None and pub["settings"]["public_distance"] is None
        assert "non-private selection" in pub["privacy"]["composition"]  # not "one mechanism" alone
        sel = pub["selection"]
        assert sel["candidates"] == ["digits", "noise"] and sel["examples"] == 50 and "private-summary.json" in sel["statistics"]
        assert not {"results", "references", "runs", "private_examples", "seconds", "engine", "warnings"} & set(sel)
        assert set(sel["advice"]) == {"method", "public", "fell_back", "refused"}
        assert priv["publishable"] is False and priv["selection"]["private_examples"] == n
        probe = priv["selection"]["advice"]["evidence"]["probe"]
        # probed first: every candidate the second phase can use (issue 53); ranked: those it finds helpful
        assert set(probe["gains"]) <= {"digits", "noise"} and len(probe["baseline"]) == max(map(len, probe["gains"].values()), default=0)
        # each candidate once: ranked, not ranked, or its ranking draws stopped (its test decided)
        parts = [ranked, set(priv["selection"]["not_ranked"]), set(priv["selection"]["stopped"])]
        assert set().union(*parts) == {"digits", "noise"} and sum(map(len, parts)) == 2
        keys, numbers = _walk(pub)
        assert not {"evidence", "probe", "baseline", "gains", "results", "references", "runs", "private_examples", "p_value",
                    "distance", "distances", "message"} & keys
        assert not {r["distance"] for r in priv["selection"]["results"]} & numbers


def _walk(doc, keys=None, numbers=None):
    """Every key and every number in a JSON document."""
    keys, numbers = (set() if keys is None else keys), (set() if numbers is None else numbers)
    if isinstance(doc, dict):
        keys.update(doc)
        for v in doc.values():
            _walk(v, keys, numbers)
    elif isinstance(doc, list):
        for v in doc:
            _walk(v, keys, numbers)
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        numbers.add(doc)
    return keys, numbers


def test_a_refusal_after_a_non_private_selection_gives_its_figures_on_a_private_line(tmp_path, capsys, monkeypatch):
    """--method second-phase with no candidate that passes the advice: exit 2 for both neighbours, the error line
    public (the same), the reasons with their distances and p-values on the private: line before it."""
    base = _images(40, 17)
    _write(tmp_path / "test.npz", _images(20, 18))
    monkeypatch.chdir(tmp_path)
    got = _neighbours(tmp_path, base, 5, _auto_select_argv(tmp_path, "--method", "second-phase"), capsys)
    assert [g[0] for g in got] == [2, 2], got[1][2]
    _same_public(got)
    for _, out, err, _ in got:
        # its figures: a p-value, or the draws after which the probe's test was decided (gsd_cli.advice.probe, a stopped
        # candidate: whether the best one stopped depends on the drawn examples)
        assert any(line.startswith("private: --method second-phase: no candidate") and ("p = " in line or "stopped after" in line)
                   for line in out), out
        assert "the figures are on the private: line above" in " ".join(" ".join(err).split())
