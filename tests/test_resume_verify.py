"""Resume verifies the run folder (issue 19): checkpoint.json against the digest in the weights'
safetensors metadata, its secret seed, old checkpoints, a folder that is not a run, stage 1."""

from __future__ import annotations

import json

import pytest
import torch

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.train import TrainConfig, train
from gsd_cli.train import checkpoint as ckpt


def _cfg(tiny, **kw):
    base = dict(private=tiny["private"], public=None, method="dpsgd", epsilon=4.0, epochs=3, batch_size=30,
                physical_batch=16)
    base.update(kw)
    return TrainConfig(**base)


def _one_line(code, err, *words):
    assert code == 2, err
    info = ("plan:", "booked epsilon", "created the privacy ledger", "private:")  # a run's information lines
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith(info)]
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], err


@pytest.fixture
def broken(tiny, tmp_path, interrupt):
    """A run interrupted after its first epoch (secret seed from the operating system)."""
    run = tmp_path / "run"
    with pytest.raises(interrupt.error):
        train(_cfg(tiny), run, progress=interrupt("epoch", 1))
    return run


def _edit(run, fn):
    f = run / ckpt.CKPT_META
    meta = json.loads(f.read_text())
    fn(meta)
    f.write_text(json.dumps(meta, indent=2))


def test_the_weights_carry_the_digest_and_no_secret(broken):
    info = ckpt.tensor_metadata(broken / ckpt.CKPT_WEIGHTS)
    meta = json.loads((broken / ckpt.CKPT_META).read_text())
    assert info["gsd_digest"] == ckpt.state_digest(meta) and info["gsd_epoch"] == "1"
    text = json.dumps(info)
    assert meta["secret"]["noise_seed"] not in text and "sampling_rate" not in text  # nothing private in the weights
    assert ckpt.load_meta(broken)["epoch"] == 1


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.update(epoch=2), ["epoch 2 in checkpoint.json but 1 in the weights"]),
    (lambda m: m["settings"].update(epsilon=8.0), ["does not match", "edited"]),
    (lambda m: m["privacy"].update(epsilon_spent=0.1), ["does not match"]),
    (lambda m: m["secret"].update(noise_seed="12345"), ["does not match"]),
])
def test_an_edited_checkpoint_is_refused(tiny, broken, capsys, edit, words):
    _edit(broken, edit)
    with pytest.raises(GSDError, match="does not match"):
        train(_cfg(tiny), broken, resume=True)
    code = main(["train", "--resume", str(broken), "-q"])
    _one_line(code, capsys.readouterr().err, *words)


@pytest.mark.parametrize("edit", [
    lambda m: m.pop("secret"),
    lambda m: m["secret"].pop("noise_seed"),
    lambda m: m["secret"].update(noise_seed=None),
    lambda m: m["secret"].update(noise_seed="not a number"),
])
def test_a_checkpoint_without_its_secret_seed_is_one_line(broken, capsys, edit):
    _edit(broken, edit)
    code = main(["train", "--resume", str(broken), "-q"])
    _one_line(code, capsys.readouterr().err, "no secret seed")


def test_an_old_checkpoint_without_the_digest_is_refused_clearly(tiny, broken, capsys):
    _edit(broken, lambda m: m.update(format=1))
    code = main(["train", "--resume", str(broken), "-q"])
    _one_line(code, capsys.readouterr().err, "older gsd", "format 1")
    # weights without a digest (written by hand, or another program) beside a current checkpoint.json
    from safetensors.torch import load_file, save_file

    _edit(broken, lambda m: m.update(format=ckpt.FORMAT))
    save_file(load_file(str(broken / ckpt.CKPT_WEIGHTS)), str(broken / ckpt.CKPT_WEIGHTS))
    code = main(["train", "--resume", str(broken), "-q"])
    _one_line(code, capsys.readouterr().err, "without the digest")


def test_weights_of_another_run_are_refused(tiny, tmp_path, broken, interrupt, capsys):
    other = tmp_path / "other"
    with pytest.raises(interrupt.error):
        train(_cfg(tiny), other, progress=interrupt("epoch", 1))
    (broken / ckpt.CKPT_WEIGHTS).write_bytes((other / ckpt.CKPT_WEIGHTS).read_bytes())  # same epoch, other seed
    code = main(["train", "--resume", str(broken), "-q"])
    _one_line(code, capsys.readouterr().err, "does not match")
    (broken / ckpt.CKPT_WEIGHTS).unlink()
    code = main(["train", "--resume", str(broken), "-q"])
    _one_line(code, capsys.readouterr().err, "missing or unreadable")


def test_an_untouched_run_still_resumes(tiny, broken):
    s = train(_cfg(tiny), broken, resume=True)
    assert s["epochs"] == 3 and json.loads((broken / ckpt.CKPT_META).read_text())["epoch"] == 3


@pytest.mark.parametrize("make", ["empty", "missing", "file", "other"])
def test_resume_on_a_folder_that_is_not_a_run(tmp_path, capsys, make):
    d = tmp_path / "d"
    if make == "empty":
        d.mkdir()
    elif make == "file":
        d.write_text("x")
    elif make == "other":
        d.mkdir()
        (d / "notes.txt").write_text("x")
    code = main(["train", "--resume", str(d), "-q"])
    err = capsys.readouterr().err
    _one_line(code, err, f"no gsd run in {d}")
    assert "needs public data" not in err


def test_an_edited_stage1_is_refused(tiny, tmp_path, interrupt, capsys):
    """Second phase stopped in stage 1: stage1.json (whose run settings the CLI reads) is verified too."""
    cfg = _cfg(tiny, method="second-phase", public=tiny["public"], public_examples=40, public_epochs=3, epochs=1,
               model="fmnist-cnn")
    run = tmp_path / "s1"
    with pytest.raises(interrupt.error):
        train(cfg, run, progress=interrupt("public", 1))
    f = run / "stage1.json"
    meta = json.loads(f.read_text())
    meta["run_settings"]["epsilon"] = 9.0
    f.write_text(json.dumps(meta))
    code = main(["train", "--resume", str(run), "-q"])
    _one_line(code, capsys.readouterr().err, "stage1.json does not match")


def _final_weights(run):
    from safetensors.torch import load_file

    return {k: v for k, v in load_file(str(run / ckpt.CKPT_WEIGHTS)).items() if k.startswith("model.")}


def test_a_resumed_run_reproduces_the_uninterrupted_one_bit_for_bit(tiny, tmp_path, interrupt, monkeypatch):
    """Issue 44: each layer's clipping path is timed at the run's first step; a resume reuses the
    checkpoint's paths instead of timing again. The timing is made to flip between the runs, as it
    may on a busy machine: the resumed run still ends on the uninterrupted run's bits."""
    import gsd_cli.gradients.engines as engines

    prefer = {"path": "materialised"}
    tuned = []

    def fake_timed(fn, device):  # the closures of clipsum.tune.tune_paths are named for their path
        fn()
        tuned.append(fn.__name__)
        return 1.0 if fn.__name__ == prefer["path"] else 2.0

    monkeypatch.setattr(engines, "timed", fake_timed)
    cfg = _cfg(tiny, epochs=2, batch_size=40, physical_batch=40, insecure_seed=3, clip_engine="auto")
    whole = train(cfg, tmp_path / "whole")
    paths = json.loads((tmp_path / "whole" / ckpt.CKPT_META).read_text())["clip_paths"]
    assert "materialised" in paths.values() and tuned, paths  # some layer's path was measured
    assert whole["clip_engine"].count("materialised") >= 1

    with pytest.raises(interrupt.error):
        train(cfg, tmp_path / "cut", progress=interrupt("epoch", 1))
    assert json.loads((tmp_path / "cut" / ckpt.CKPT_META).read_text())["clip_paths"] == paths
    prefer["path"] = "ghost"  # the machine now times the other way
    tuned.clear()
    resumed = train(cfg, tmp_path / "cut", resume=True)
    assert not tuned  # nothing timed again
    a, b = _final_weights(tmp_path / "whole"), _final_weights(tmp_path / "cut")
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["clip_engine"] == whole["clip_engine"]

    # the paths do move the bits: a run that measured the other way ends elsewhere (so the test can fail)
    other = train(cfg, tmp_path / "other")
    assert json.loads((tmp_path / "other" / ckpt.CKPT_META).read_text())["clip_paths"] != paths
    c = _final_weights(tmp_path / "other")
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_edited_clip_paths_are_refused(tiny, tmp_path, interrupt):
    cfg = _cfg(tiny, epochs=2, insecure_seed=3)
    with pytest.raises(interrupt.error):
        train(cfg, tmp_path / "run", progress=interrupt("epoch", 1))
    _edit(tmp_path / "run", lambda m: m["clip_paths"].update({"edited.layer": "ghost"}))
    with pytest.raises(GSDError, match="does not match"):
        train(cfg, tmp_path / "run", resume=True)
