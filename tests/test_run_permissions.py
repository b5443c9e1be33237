"""Private outputs of a ``gsd train`` run are not world-readable (issue 60, item 4): ``private-summary.json``,
``metrics.jsonl``, ``curves.png`` and ``checkpoint.json`` are 0600, the run folder gsd owns is 0700, and the
publishable ``summary.json`` (and the weights) keep the ordinary mode; a folder that holds the user's other files
is never chmod-ed."""

import os
import stat

from gsd_cli.train import TrainConfig, train
from gsd_cli.train.checkpoint import RUN_DIR_MODE, own_run_dir

PRIVATE = ("private-summary.json", "metrics.jsonl", "curves.png", "checkpoint.json")
PUBLIC = ("summary.json", "checkpoint.safetensors")


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def test_a_runs_private_files_are_0600_in_a_0700_folder_and_its_public_ones_unchanged(tiny, tmp_path):
    mine = tmp_path / "mine"  # a folder the user made for the run, empty: gsd owns it
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    cfg = TrainConfig(private=tiny["private"], method="dpsgd", epsilon=4.0, epochs=1, batch_size=30, deterministic_noise=True,
                      physical_batch=16)
    for out in (tmp_path / "new", mine):
        train(cfg, out)
        assert _mode(out) == RUN_DIR_MODE, oct(_mode(out))
        for name in PRIVATE:
            assert _mode(out / name) == 0o600, (name, oct(_mode(out / name)))
        for name in PUBLIC:
            assert _mode(out / name) == 0o666 & ~_umask(), (name, oct(_mode(out / name)))


def test_a_folder_holding_the_users_other_files_keeps_its_mode(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    os.chmod(run, 0o755)
    for name in ("checkpoint.json", "summary.json", ".gsd-run.lock", ".gsd-x.json.tmp"):
        (run / name).write_text("{}")
    (run / "my-notes.txt").write_text("the user's")
    assert not own_run_dir(run) and _mode(run) == 0o755
    (run / "my-notes.txt").unlink()
    assert own_run_dir(run) and _mode(run) == 0o700
