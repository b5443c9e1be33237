"""One writer per run folder (issue 64, gsd_cli.train.runlock): two ``gsd train`` with one ``--out``, or a
``--resume`` while the run still goes, both exited 0 and left one folder holding parts of two runs. The second
writer now gets one line, exit 2, before it books or writes anything. The writers here are real processes: a
``gsd_cli.train.train`` run in a child process that stops at a chosen point of its progress until told to go on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gsd_cli.cli import main
from gsd_cli.errors import GSDError

#: a child process that trains ``argv[2]`` into ``argv[1]`` (2 epochs of DP-SGD) and, when its progress reaches
#: (``argv[3]``, ``argv[4]``), touches ``argv[5]``/started and waits for ``argv[5]``/go
_TRAINER = """
import sys, time
from pathlib import Path
from gsd_cli.train import TrainConfig, train
out, private, kind, n, flags = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
def progress(k, done, total):
    if (k, done) == (kind, n):
        (flags / "started").touch()
        while not (flags / "go").exists():
            time.sleep(0.05)
train(TrainConfig(private=private, method="dpsgd", epochs=2, batch_size=30, epsilon=4.0, insecure_seed=3), out, device="cpu",
      resume=len(sys.argv) > 6, progress=progress)
"""
#: a child process that holds ``argv[1]``'s run lock (a new run's) until its stdin closes
_HOLDER = """
import sys
from gsd_cli.train.runlock import lock_run
with lock_run(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()
"""
TRAIN = ["--method", "dpsgd", "--epochs", "2", "--batch-size", "30", "--epsilon", "4", "--insecure-seed", "3", "-q"]


def _start(code: str, *args, tmp_path: Path, wait_for: Path | None = None, **kw) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, stderr=subprocess.PIPE, text=True, **kw)
    deadline = time.monotonic() + 240
    while wait_for is not None and not wait_for.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the first writer did not reach its waiting point: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)
    return proc


def _finish(proc: subprocess.Popen, flags: Path) -> None:
    (flags / "go").touch()
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-2000:]


def _trainings() -> int:
    from gsd_cli.privacy import budget as B

    return sum(1 for d in B.BudgetLedger().status() for r in d["runs"] if r["what"].startswith("training"))


def _one_line(code: int, err: str, pid: int) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert f"is in use by another gsd train (pid {pid})" in lines[0], lines
    return lines[0]


def _snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_two_runs_with_one_out_the_second_is_refused_before_booking(tiny, tmp_path, capsys):
    run, flags = tmp_path / "run", tmp_path / "flags"
    flags.mkdir()
    first = _start(_TRAINER, run, tiny["private"], "step", 1, flags, tmp_path=tmp_path, wait_for=flags / "started")
    try:
        before = _snapshot(run)
        code = main(["train", "--private", tiny["private"], *TRAIN, "--out", str(run)])
        line = _one_line(code, capsys.readouterr().err, first.pid)
        assert "wait for it or give another --out" in line
        assert _snapshot(run) == before and _trainings() == 1  # the first run's booking alone; its folder untouched
    finally:
        _finish(first, flags)
    assert json.loads((run / "summary.json").read_text())["epochs"] == 2 and _trainings() == 1


def test_a_resume_while_the_run_still_goes_is_refused(tiny, tmp_path, capsys):
    """The issue's case: --resume of a run that has written its first checkpoint and is still training."""
    run, flags = tmp_path / "run", tmp_path / "flags"
    flags.mkdir()
    first = _start(_TRAINER, run, tiny["private"], "epoch", 1, flags, tmp_path=tmp_path, wait_for=flags / "started")
    try:
        before = _snapshot(run)
        assert json.loads(before["checkpoint.json"])["epoch"] == 1  # resumable: the resume checks would pass
        code = main(["train", "--resume", str(run), "-q"])
        line = _one_line(code, capsys.readouterr().err, first.pid)
        assert "--resume" in line and _snapshot(run) == before and _trainings() == 1
        code = main(["train", "--private", tiny["private"], *TRAIN, "--out", str(run)])  # in use, not "not empty"
        _one_line(code, capsys.readouterr().err, first.pid)
        assert _snapshot(run) == before and _trainings() == 1
    finally:
        _finish(first, flags)
    assert json.loads((run / "checkpoint.json").read_text())["epoch"] == 2


def test_the_library_refuses_a_folder_another_process_holds_and_a_killed_holder_frees_it(tiny, tmp_path):
    from gsd_cli.train import TrainConfig, train
    from gsd_cli.train.runlock import RunInUse, lock_run

    run = tmp_path / "run"
    holder = _start(_HOLDER, run, tmp_path=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "locked"
        cfg = TrainConfig(private=tiny["private"], method="dpsgd", epochs=1, batch_size=30, epsilon=4.0, insecure_seed=3)
        with pytest.raises(RunInUse, match=f"in use by another gsd train \\(pid {holder.pid}\\)"):
            train(cfg, run, device="cpu")
        assert [p.name for p in run.iterdir()] == [".gsd-run.lock"]
        assert not Path(os.environ["GSD_LEDGER"]).exists()  # refused before the ledger was even opened
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: the operating system frees the lock, its file stays
        holder.wait(30)
    with lock_run(run) as path:  # a lock file left behind blocks no one
        assert path == run and (run / ".gsd-run.lock").read_text().strip() == str(os.getpid())
    assert run.is_dir() and not any(run.iterdir())  # nothing written: the lock file goes (the folder is the holder's)


def test_nested_locks_in_one_process_and_what_a_failed_run_leaves(tmp_path):
    from gsd_cli.train.runlock import lock_run

    run = tmp_path / "run"
    with lock_run(run):
        with lock_run(run):  # the command, then the library's train inside it: one lock, no deadlock
            (run / "summary.json").write_text("{}")
        assert (run / ".gsd-run.lock").is_file()
    assert sorted(p.name for p in run.iterdir()) == [".gsd-run.lock", "summary.json"]  # kept: a later run sees it busy or done
    with pytest.raises(GSDError, match="exists and is not empty"):
        with lock_run(run):
            pass
    with lock_run(tmp_path / "empty"):  # a new run that wrote nothing: no empty folder left behind
        pass
    assert not (tmp_path / "empty").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    with pytest.raises(GSDError, match="exists and is not empty"):
        with lock_run(tmp_path / "mine"):
            pass
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]  # no lock file in a folder that is not a run's
    (tmp_path / "given").mkdir()
    with pytest.raises(RuntimeError):
        with lock_run(tmp_path / "given"):
            raise RuntimeError("a bad option found later")
    assert (tmp_path / "given").is_dir() and not any((tmp_path / "given").iterdir())  # the user's empty folder, as it was


def test_a_two_process_run_holds_the_lock_once_for_all_its_processes(tiny, tmp_path):
    """train(nproc=2): the caller holds the lock and its processes take none (they would refuse each other, or wait
    for their own launcher forever)."""
    from gsd_cli.train import TrainConfig, train

    cfg = TrainConfig(private=tiny["private"], method="dpsgd", epochs=1, batch_size=30, epsilon=4.0, insecure_seed=3)
    summary = train(cfg, tmp_path / "run", device="cpu", nproc=2)
    assert summary["processes"] == 2 and (tmp_path / "run" / ".gsd-run.lock").is_file()


def test_under_torchrun_process_0_alone_checks_and_locks(tmp_path, monkeypatch):
    """Every process of a torchrun launch runs the gsd command; process 0 locks the folder, so the others must neither
    lock it nor find it busy (they would refuse their own run)."""
    from gsd_cli.train.runlock import RunInUse, check_run_dir, lock_run

    fcntl = pytest.importorskip("fcntl")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("RANK", "1")
    with lock_run(tmp_path / "new"):
        assert not (tmp_path / "new").exists()  # process 0 creates and locks it
    run = tmp_path / "run"
    run.mkdir()
    with open(run / ".gsd-run.lock", "w") as held:  # process 0's lock (another open file: flock tells them apart)
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert check_run_dir(run) == run
        with lock_run(run):
            pass
        monkeypatch.setenv("RANK", "0")
        with pytest.raises(RunInUse, match="is in use by another gsd train"):
            check_run_dir(run)
