"""Progress off a terminal (issue 19): plain lines per finished dataset / epoch with elapsed time and an
estimate of the time left; gsd train --help reads at 80 columns."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console

from gsd_cli.cli import common


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_train_prints_one_line_per_epoch_with_an_estimate():
    lines, clock = [], Clock()
    p = common.plain_progress(lines.append, clock, after=0)
    p("epoch", 0, 4)
    for epoch in range(4):
        for s in range(1, 11):
            clock.t += 1.0
            p("step", s, 10)
        p("epoch", epoch + 1, 4)
    assert lines[0] == "step 2/10 of the epoch: 1.0s a step, about 8.0s left in it"  # timed from step 1 on (issue 36)
    epochs = [l for l in lines if l.startswith("epoch ")]
    assert epochs[0] == "epoch 1/4 done in 10s (10s elapsed, about 30s left)"
    assert epochs[-1] == "epoch 4/4 done in 10s (40s elapsed)" and len(lines) == 5


def test_rank_prints_an_estimate_after_the_second_chunk_and_a_line_per_dataset():
    lines, clock = [], Clock()
    p = common.plain_progress(lines.append, clock, after=0)
    for name in ("mnist-a", "digits"):
        for done in (64, 128, 192, 200):
            clock.t += 2.0
            p(name, done, 200)
    assert lines == [  # timed from the first chunk on (issue 44): 2 s per 64 examples, 72 left
        "mnist-a: 128/200 after 4.0s, about 2.2s left",
        "mnist-a: 200/200 done in 8.0s (8.0s elapsed)",
        "digits: 128/200 after 4.0s, about 2.2s left",
        "digits: 200/200 done in 8.0s (16s elapsed)",
    ]


def test_the_estimates_leave_out_what_happens_once_before_the_first_unit():
    """Issue 44: "about 38s left" of 3.6 s steps. A first epoch of one 3.6 s step plus 30 s of warm-up
    (the clipping paths timed, the first pass), then 3.6 s epochs: the estimate after epoch 2 is the
    18 epochs left at 3.6 s, not at the mean with the warm-up in it (the same for a dataset's first chunk)."""
    lines, clock = [], Clock()
    p = common.plain_progress(lines.append, clock, after=0)
    p("epoch", 0, 20)
    for epoch in range(20):
        clock.t += 3.6 + (30.0 if epoch == 0 else 0.0)
        p("step", 1, 1)
        p("epoch", epoch + 1, 20)
    assert lines[1] == "epoch 2/20 done in 3.6s (37s elapsed, about 1m04s left)"  # 18 x 3.6 s (was 5m34s: the mean with the warm-up)
    lines.clear()
    p = common.plain_progress(lines.append, clock, after=0)
    clock.t += 30.0  # reading and decoding before the first chunk
    for done in (64, 128, 192, 640):
        clock.t += 0.5
        p("faces", done, 640)
    assert lines[0] == "faces: 128/640 after 31s, about 4.0s left"  # 0.5 s per 64 examples (was "about 4m34s left" at the first chunk)


def test_the_bar_on_a_terminal_estimates_epochs_longer_than_30s(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(common, "err", Console(file=io.StringIO(), force_terminal=True, get_time=clock, width=100))
    bar, p = common.progress_bar(False, width=8, eta=True)
    try:
        p("epoch", 0, 10)
        for epoch in range(3):
            clock.t += 60.0 + (100.0 if epoch == 0 else 0.0)  # a minute an epoch, the first with its warm-up
            p("epoch", epoch + 1, 10)
        task = next(t for t in bar.tasks if t.description == "epoch")
        assert task.time_remaining == 7 * 60  # from the units after the first (rich's 30 s window gave none)
    finally:
        bar.stop()


def test_a_short_command_prints_nothing_and_a_resumed_run_counts_from_its_epoch():
    lines, clock = [], Clock()
    p = common.plain_progress(lines.append, clock, after=15)
    p("epoch", 0, 2)
    clock.t = 5
    p("epoch", 1, 2)
    assert lines == []
    clock.t = 100
    p("epoch", 2, 2)
    assert lines == ["epoch 2/2 done in 1m35s (1m40s elapsed)"]
    lines.clear()
    p = common.plain_progress(lines.append, Clock(), after=0)
    p("epoch", 7, 10)  # resumed after epoch 7: no line for the epochs done before
    assert lines == []


def test_progress_bar_off_a_terminal_writes_plain_lines(monkeypatch):
    buf = io.StringIO()
    monkeypatch.setattr(common, "err", Console(file=buf, force_terminal=False, width=200))
    monkeypatch.setattr(common, "PLAIN_AFTER", 0.0)
    bar, p = common.progress_bar(False)
    p("digits", 10, 10)
    bar.stop()
    assert buf.getvalue().startswith("digits: 10/10 done in ")
    buf.truncate(0)
    bar, p = common.progress_bar(True)  # --quiet: nothing
    p("digits", 10, 10)
    bar.stop()
    assert buf.getvalue().strip("\0") == ""


def test_train_help_reads_at_80_columns():
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "NO_COLOR": "1"}
    text = subprocess.run([sys.executable, "-m", "gsd_cli.cli", "train", "--help"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert "…" not in text and max(len(l) for l in text.splitlines()) <= 80
    for panel in ("Data", "Privacy", "Model", "Optimisation", "GEP", "Second phase", "Auto-select", "Run folder"):
        assert f"─ {panel}" in text, panel
    assert "--data-root" in text
    # every help text gets a column of at least 28 characters
    import re

    for line in text.splitlines():
        m = re.match(r"│ (--[\w-]+).*?  (\S.*\S)\s*│$", line)
        if m and "<" in line:
            start = line.index(m.group(2))
            assert 80 - start >= 28, line


def test_a_dp_private_side_is_shown_without_its_time():
    """Issue 32: the private side of a DP ranking reports once, m of m, and its line has no time (the
    time grows with min(m, N))."""
    from gsd_cli.cli import common
    from gsd_cli.distance.side import DP_PROGRESS

    assert common.DP_PROGRESS == DP_PROGRESS
    t = iter([0.0, 5.0, 9.0, 12.0])
    lines = []
    p = common.plain_progress(lines.append, lambda: next(t), after=0)
    p("mnist-a" + DP_PROGRESS, 2000, 2000)
    p("digits", 1797, 1797)
    assert lines[0] == "mnist-a (DP): 2000/2000 done" and "done in" in lines[1]


def test_a_name_with_colons_or_brackets_is_printed_as_given(monkeypatch):
    """A private part's name, "mnist-a:train", followed by the line's colon read as rich's emoji code ":train:" (a
    tram was printed); brackets would be markup. Plain lines and the bar print names as they are."""
    buf = io.StringIO()
    monkeypatch.setattr(common, "err", Console(file=buf, force_terminal=False, width=200))
    monkeypatch.setattr(common, "PLAIN_AFTER", 0.0)
    bar, p = common.progress_bar(False, private=True)
    p("mnist-a:train", 10, 10)
    bar.stop()
    assert buf.getvalue().startswith("private: mnist-a:train: 10/10 done in ")
    clock = Clock()
    term = io.StringIO()
    monkeypatch.setattr(common, "err", Console(file=term, force_terminal=True, get_time=clock, width=120))
    bar, p = common.progress_bar(False, width=30)
    p("mnist-a:train:[b]x", 1, 10)
    bar.refresh()
    bar.stop()
    assert "mnist-a:train:[b]x" in term.getvalue() and "\U0001f68b" not in term.getvalue()


def test_a_second_pass_over_a_set_is_timed_from_its_own_chunks():
    """Issue 53, seen in `gsd train --auto-select` off a terminal: the probe read the private set before 15 s
    (silent), then the ranking read it again, and the estimate mixed the two passes: "mnist-a:train: 128/1991 after
    18s, about 8m15s left" of a 40 s ranking. A count that goes back starts a pass with its own rate and time."""
    lines, clock = [], Clock()
    p = common.plain_progress(lines.append, clock, after=15)
    for done in (64, 128, 2000):  # the probe's pass: 3 s, before anything is printed
        clock.t += 1.0
        p("mnist-a:train", done, 2000)
    clock.t += 20.0  # the probe's stage 1 and the references
    p("references", 64, 64)
    for draw in range(3):  # the ranking's draws: 2 s per 64 examples
        for done in (64, 128, 192, 2000):
            clock.t += 2.0 if done < 2000 else 2.0 * 1808 / 64
            p("mnist-a:train", done, 2000)
        clock.t += 5.0
        p("references", 64, 64)
    mine = [l for l in lines if l.startswith("mnist-a:train")]
    assert mine == ["mnist-a:train: 128/2000 after 4.0s, about 58s left",  # 1872 x 2 s / 64 (was timed from the probe's chunk: 12m40s)
                    "mnist-a:train: 2000/2000 done in 1m02s (1m25s elapsed)"]  # the one done line, of the pass that was shown


def test_the_bar_restarts_a_set_read_again(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(common, "err", Console(file=io.StringIO(), force_terminal=True, get_time=clock, width=100))
    bar, p = common.progress_bar(False, width=8, eta=True)
    try:
        for draw in range(2):
            for done in (100, 200, 1000):
                clock.t += 1.0 + (50.0 if draw == 0 and done == 100 else 0.0)
                p("digits", done, 1000)
        task = next(t for t in bar.tasks if t.description == "digits")
        assert task.elapsed == 2.0 and task.completed == 1000  # from the second pass's first chunk (was 55 s: both passes)
    finally:
        bar.stop()
