"""Issue 61, item 1: a stage 1 that learns, at no privacy cost. All of the public set by default (a cap stated),
a seeded validation split of the public examples, the learning rate and the length chosen on it, the best
epoch's weights kept, augmentation of the training batches, stage1.json and one public line, the cache key."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gsd_cli import data as gdata
from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.models.peft import build_model
from gsd_cli.train import TrainConfig
from gsd_cli.train.second_phase import stage1_cache, stage1_fit
from gsd_cli.train.second_phase.stage1_fit import Stage1Settings, fit_public, params_of, validation_mask

CPU = torch.device("cpu")


def _npz(path, n, seed, classes=3, size=16):
    rng = np.random.default_rng(seed)
    base = rng.uniform(size=(classes, size, size))
    y = np.arange(n) % classes
    x = np.clip(base[y] + 0.2 * rng.normal(size=(n, size, size)), 0, 1)
    np.savez(path, x=(x * 255).astype(np.uint8), y=y, classes=np.array([f"c{i}" for i in range(classes)]))
    return f"npz:{path}"


@pytest.fixture
def pub(tmp_path):
    return _npz(tmp_path / "pub.npz", 60, 0)


def _fit(pub, settings, **kw):
    """fit_public of fmnist-cnn's Linear layers on every example of ``pub``; returns (record, model, names)."""
    src = gdata.resolve(pub)
    sample = gdata.draw(src, None, 0)
    spec, model, names, _ = build_model("fmnist-cnn", 3, 0, params=["fc*"])
    for n, p in model.named_parameters():
        p.requires_grad_(n in names)
    y = torch.as_tensor(np.asarray(sample.labels(), dtype=np.int64))
    return fit_public(model, names, sample, y, spec, settings, CPU, **kw), model, names


def _scripted(monkeypatch, accs):
    """Validation accuracies in the order asked (all losses equal), in place of the real evaluation."""
    it = iter(accs)
    monkeypatch.setattr(stage1_fit, "_evaluate", lambda *a, **k: (next(it), 1.0))


def _keep_params(seen):
    return lambda state, tensors: seen.append({k: v.clone() for k, v in tensors.items() if k.startswith("param.")})


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


# -- the validation split ------------------------------------------------------------------------

def test_the_validation_split_is_seeded_per_example_and_keyed_by_the_dataset(tmp_path):
    src = gdata.resolve(_npz(tmp_path / "a.npz", 2000, 1))
    other = gdata.resolve(_npz(tmp_path / "b.npz", 2000, 1))
    every = gdata.draw(src, None, 0)
    mask = validation_mask([every], 0.1, seed=7)
    assert 0.08 < mask.mean() < 0.12
    assert np.array_equal(mask, validation_mask([every], 0.1, seed=7))  # seeded
    assert not np.array_equal(mask, validation_mask([every], 0.1, seed=8))
    part = gdata.Sample(src, every.indices[:500])  # a per-example rule: another draw holds the same examples out
    assert np.array_equal(validation_mask([part], 0.1, seed=7), mask[:500])
    assert not np.array_equal(validation_mask([gdata.Sample(other, every.indices)], 0.1, seed=7), mask)  # by dataset
    assert not validation_mask([every], 0.0, seed=7).any()


def test_stage1_holds_out_part_of_the_public_set_and_says_so(pub, tmp_path):
    from gsd_cli.train.second_phase import run_second_phase

    cfg = TrainConfig(private="mnist-a", public=pub, method="second-phase", model="fmnist-cnn", params=["fc*"], public_epochs=2,
                      public_val=0.2, seed=5)
    spec, model, names, _ = build_model("fmnist-cnn", 3, 5, params=["fc*"])
    rec = run_second_phase(model, names, cfg, spec, tmp_path, CPU, num_classes=3, multilabel=False)
    c = rec["search"]
    drawn = gdata.draw(gdata.resolve(pub), None, 5)
    assert rec["public_examples"] == 60 and c["val_examples"] == int(validation_mask([drawn], 0.2, 5).sum()) > 0
    assert c["train_examples"] + c["val_examples"] == 60 and c["val_acc"] is not None


# -- the length and the learning rate chosen on validation ----------------------------------------

def test_the_best_epoch_is_kept_not_the_last(pub, monkeypatch):
    """Validation accuracy 0.5, 0.9, 0.6, 0.4: the weights after epoch 2, though four epochs ran."""
    _scripted(monkeypatch, [0.5, 0.9, 0.6, 0.4])
    seen = []
    rec, model, names = _fit(pub, Stage1Settings(lrs=(1e-2,), epochs=4, val=0.2, patience=0), checkpoint=_keep_params(seen))
    assert rec.best_epoch == 2 and rec.epochs_run == 4 and rec.val_acc == 0.9
    final = params_of(model, names)
    assert _same(final, seen[1]) and not _same(final, seen[3])


def test_stage1_stops_patience_epochs_after_its_best(pub, monkeypatch):
    _scripted(monkeypatch, [0.5, 0.9, 0.6, 0.4, 0.95])
    rec, _, _ = _fit(pub, Stage1Settings(lrs=(1e-2,), epochs=10, val=0.2, patience=2))
    assert rec.epochs_run == 4 and rec.best_epoch == 2 and rec.trials[0]["stopped_early"]


def test_the_learning_rate_is_chosen_on_validation(pub, monkeypatch):
    """Three learning rates, two epochs each: the second trial's second epoch is the best of all six."""
    _scripted(monkeypatch, [0.3, 0.4, 0.6, 0.8, 0.5, 0.7])
    seen = []
    rec, model, names = _fit(pub, Stage1Settings(lrs=(1e-3, 3e-3, 9e-3), epochs=2, val=0.2, patience=0), checkpoint=_keep_params(seen))
    assert rec.lr == 3e-3 and rec.best_epoch == 2 and [t["lr"] for t in rec.trials] == [1e-3, 3e-3, 9e-3]
    assert _same(params_of(model, names), seen[3])
    # each trial starts from the same weights: the third trial's first epoch equals a lone run at 9e-3
    _scripted(monkeypatch, [0.1])
    alone = []
    _fit(pub, Stage1Settings(lrs=(9e-3,), epochs=1, val=0.2, patience=0), checkpoint=_keep_params(alone))
    assert _same(alone[0], seen[4])


def test_a_best_rate_at_the_grids_edge_extends_the_grid_at_most_twice(pub, monkeypatch):
    """Issue 61's pilot: the best at the top of the grid tries 3x more, while it stays there, at most EXTEND times."""
    assert stage1_fit.EXTEND == 2
    _scripted(monkeypatch, [0.3, 0.4, 0.5, 0.6, 0.7])  # one epoch each: every new trial is the best
    rec, _, _ = _fit(pub, Stage1Settings(lrs=(1e-3, 3e-3, 9e-3), epochs=1, val=0.2, patience=0))
    assert [t["lr"] for t in rec.trials] == [1e-3, 3e-3, 9e-3, 0.027, 0.081] and rec.lr == 0.081
    assert rec.lrs == [1e-3, 3e-3, 9e-3, 0.027, 0.081]
    _scripted(monkeypatch, [0.6, 0.4, 0.3, 0.2])  # the best at the bottom: a third of it, then no more (worse)
    rec, _, _ = _fit(pub, Stage1Settings(lrs=(1e-3, 3e-3, 9e-3), epochs=1, val=0.2, patience=0))
    assert [t["lr"] for t in rec.trials] == [1e-3, 3e-3, 9e-3, 0.000333] and rec.lr == 1e-3
    _scripted(monkeypatch, [0.3, 0.6, 0.4])  # an inner best: the grid alone
    rec, _, _ = _fit(pub, Stage1Settings(lrs=(1e-3, 3e-3, 9e-3), epochs=1, val=0.2, patience=0))
    assert len(rec.trials) == 3 and rec.lr == 3e-3
    _scripted(monkeypatch, [0.3])  # one rate (given, or the probe's quick stage 1): nothing to extend
    rec, _, _ = _fit(pub, Stage1Settings(lrs=(1e-3,), epochs=1, val=0.2, patience=0))
    assert len(rec.trials) == 1


def test_ties_go_to_the_lower_loss_then_to_the_default_lr():
    from gsd_cli.train.second_phase.stage1_fit import _better

    assert _better({"acc": 0.8, "loss": 0.5, "lr": 1e-3}, {"acc": 0.8, "loss": 0.6, "lr": 3e-3}, 3e-3)
    assert not _better({"acc": 0.8, "loss": 0.6, "lr": 9e-3}, {"acc": 0.8, "loss": 0.6, "lr": 3e-3}, 3e-3)


def test_without_validation_one_lr_every_epoch_the_last_kept(pub):
    seen = []
    rec, model, names = _fit(pub, Stage1Settings(lrs=(1e-3, 3e-3, 9e-3), epochs=3, val=0.0), checkpoint=_keep_params(seen))
    assert rec.lr == 3e-3 and rec.val_examples == 0 and rec.epochs_run == 3 and rec.val_acc is None
    assert _same(params_of(model, names), seen[-1])


# -- augmentation ---------------------------------------------------------------------------------

def test_the_augmentation_is_torchvisions_map_per_example():
    from torchvision.transforms.v2 import InterpolationMode, functional as TF

    from gsd_cli.train.second_phase.augment import apply_params

    x = torch.rand(4, 1, 20, 28) * 2 - 1
    p = {"shift": torch.tensor([[2, -1], [0, 3], [-3, -3], [1, 0]]), "flip": torch.tensor([True, False, True, False]),
         "angle": torch.zeros(4), "scale": torch.ones(4)}
    ref = torch.stack([TF.affine(TF.horizontal_flip(xi) if f else xi, angle=0.0, translate=[int(s[0]), int(s[1])], scale=1.0,
                                 shear=[0.0, 0.0], fill=-1.0, interpolation=InterpolationMode.NEAREST)
                       for xi, f, s in zip(x, p["flip"], p["shift"])])
    assert torch.equal(apply_params(x, p, bilinear=False), ref)
    x = torch.rand(3, 3, 32, 32) * 2 - 1
    p = {"shift": torch.tensor([[1, 2]] * 3), "flip": torch.zeros(3, dtype=torch.bool), "angle": torch.tensor([7.0, -7.0, 3.0]),
         "scale": torch.tensor([1.05, 0.93, 1.0])}
    ref = torch.stack([TF.affine(xi, angle=float(a), translate=[1, 2], scale=float(s), shear=[0.0, 0.0], fill=-1.0,
                                 interpolation=InterpolationMode.BILINEAR) for xi, a, s in zip(x, p["angle"], p["scale"])])
    inside = (slice(None), slice(None), slice(5, -5), slice(5, -5))  # the border's blend with the fill aside
    assert torch.allclose(apply_params(x, p, bilinear=True)[inside], ref[inside], atol=1e-4)


def test_only_training_batches_are_augmented(pub, monkeypatch):
    from gsd_cli.train.second_phase import augment as aug

    seen = []
    real = aug.augment
    monkeypatch.setattr(stage1_fit, "augment", lambda x, kind, gen: (seen.append((len(x), kind)), real(x, kind, gen))[1])
    rec, _, _ = _fit(pub, Stage1Settings(lrs=(1e-2,), epochs=2, val=0.2, patience=0, augment="affine", batch_size=16))
    assert sum(n for n, _ in seen) == 2 * rec.train_examples and {k for _, k in seen} == {"affine"}
    assert aug.resolve_augment("auto", 28) == "affine" and aug.resolve_augment("auto", 8) == "none"
    with pytest.raises(GSDError, match="--public-augment"):
        aug.resolve_augment("mixup", 28)


# -- stage1.json, the line, the cap, the cache key ------------------------------------------------

def test_stage1_json_and_one_public_line(tmp_path, capsys):
    priv = _npz(tmp_path / "priv.npz", 120, 2)
    pub = _npz(tmp_path / "pub.npz", 80, 3)
    run = tmp_path / "run"
    code = main(["train", "--private", priv, "--method", "second-phase", "--public", pub, "--model", "fmnist-cnn",
                 "--params", "fc*", "--epochs", "1", "--batch-size", "30", "--public-epochs", "2", "--out", str(run)])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = [l for l in (out + err).splitlines() if l.startswith("stage 1 on")]
    assert len(lines) == 1, out + err
    line = lines[0]
    assert "public data only, no privacy cost" in line and "all 80 examples (cap 50,000)" in line and "augment affine" in line
    assert "chosen of 0.001, 0.003, 0.009" in line and "validation accuracy" in line and "held out for validation" in line
    rec = json.loads((run / "stage1.json").read_text())["record"]
    c = rec["search"]
    assert rec["lr"] in c["lrs"] and rec["examples_cap"] == 50_000 and rec["cap"] == "default" and rec["line"] == line
    assert {"best_epoch", "epochs_run", "val_acc", "val_examples", "train_examples", "augment", "trials"} <= set(c)
    assert rec["seconds"] >= 0 and c["train_examples"] + c["val_examples"] == rec["public_examples"] == 80
    s = json.loads((run / "summary.json").read_text())
    assert s["stages"][1]["line"] == line  # public: the summary holds it


def test_all_examples_by_default_up_to_the_cap(pub, tmp_path, monkeypatch):
    from gsd_cli.train import second_phase
    from gsd_cli.train.config import ANCHOR_EXAMPLES, public_count

    assert public_count(TrainConfig(method="second-phase")) == stage1_fit.STAGE1_CAP == 50_000
    assert public_count(TrainConfig(method="gep")) == ANCHOR_EXAMPLES == 2000  # GEP's anchors keep their default
    assert public_count(TrainConfig(method="gep", public_examples=300)) == 300
    monkeypatch.setattr(second_phase, "STAGE1_CAP", 50)
    cfg = TrainConfig(private="mnist-a", public=pub, method="second-phase", model="fmnist-cnn", params=["fc*"], public_epochs=1)
    spec, model, names, _ = build_model("fmnist-cnn", 3, 0, params=["fc*"])
    rec = second_phase.run_second_phase(model, names, cfg, spec, tmp_path, CPU, num_classes=3, multilabel=False)
    assert rec["public_examples"] == 50 and "50 of 60 examples (cap 50)" in rec["line"]


def _key(cfg, model, names, spec):
    from gsd_cli.train.second_phase import STAGE1_KEYS, stage1_settings

    sample = gdata.draw(gdata.resolve(cfg.public), cfg.public_examples or stage1_fit.STAGE1_CAP, cfg.seed)
    y = torch.as_tensor(np.asarray(sample.labels(), dtype=np.int64))
    settings = {k: getattr(cfg, k, None) for k in STAGE1_KEYS}
    return stage1_cache.stage1_key(model, names, sample, y, settings, stage1_settings(cfg, model, spec), num_classes=3,
                                   multilabel=False, private_classes=None, device=CPU)


def test_the_cache_key_changes_with_every_stage1_setting(pub):
    from gsd_cli.advice.probe import _Settings

    spec, model, names, _ = build_model("fmnist-cnn", 3, 0, params=["fc*"])
    base = dict(private="mnist-a", public=pub, method="second-phase", model="fmnist-cnn", params=["fc*"])
    changes = {"base": {}, "examples": {"public_examples": 40}, "epochs": {"public_epochs": 7}, "lr": {"public_lr": 1e-3},
               "batch": {"public_batch_size": 32}, "val": {"public_val": 0.2}, "no-val": {"public_val": 0.0},
               "patience": {"public_patience": 5}, "augment": {"public_augment": "crop"}, "no-augment": {"public_augment": "none"},
               "seed": {"seed": 1}}
    keys = {name: _key(TrainConfig(**base, **kw), model, names, spec) for name, kw in changes.items()}
    keys["probe quick"] = _key(_Settings(TrainConfig(**base), pub, 0), model, names, spec)  # one lr, not the grid
    assert len(set(keys.values())) == len(keys), keys
    assert _key(TrainConfig(**base), model, names, spec) == keys["base"]


def test_the_probes_stage_1_is_quick_unless_asked_otherwise(pub):
    from gsd_cli.advice.probe import _Settings
    from gsd_cli.train.second_phase import stage1_settings

    spec, model, _, _ = build_model("fmnist-cnn", 3, 0)
    quick = stage1_settings(_Settings(TrainConfig(), pub, 0), model, spec)
    same = stage1_settings(_Settings(TrainConfig(probe_stage1="same"), pub, 0), model, spec)
    assert quick.lrs == (3e-3,) and same.lrs == stage1_settings(TrainConfig(), model, spec).lrs == (1e-3, 3e-3, 9e-3)


@pytest.mark.parametrize("flag, value", [("--public-val", "0.9"), ("--public-patience", "-1"), ("--public-augment", "mixup"),
                                         ("--probe-stage1", "slow")])
def test_bad_stage1_settings_are_refused_in_one_line(flag, value, capsys, tmp_path):
    auto = ["--auto-select"] if flag == "--probe-stage1" else []
    code = main(["train", "--private", "mnist-a", "--method", "second-phase", "--public", "mnist-b", *auto, flag, value, "-q",
                 "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    lines = [l for l in err.splitlines() if l.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0], err


def test_a_stage1_folder_from_before_the_validation_split_resumes_as_it_began(pub, tmp_path):
    """A run folder whose stage 1 was interrupted by a gsd without the validation split (its stage1.json has no
    search state and no public_val, public_patience or public_augment; its weights file no best weights) resumes
    as it began, one lr, every epoch, no augmentation: the same weights as an uninterrupted run of those settings."""
    from gsd_cli.train import second_phase as sp
    from gsd_cli.train.config import SAVED_BEFORE

    cfg = TrainConfig(private="mnist-a", public=pub, method="second-phase", model="fmnist-cnn", params=["fc*"], public_epochs=3,
                      **{k: SAVED_BEFORE[k] for k in sp.LEGACY})

    def stage1(out, progress=None):
        spec, model, names, _ = build_model("fmnist-cnn", 3, 0, params=["fc*"])
        out.mkdir(exist_ok=True)
        sp.run_second_phase(model, names, cfg, spec, out, CPU, num_classes=3, multilabel=False, progress=progress)
        return params_of(model, names)

    class Stop(Exception):
        pass

    def stop_after_1(kind, done, total):
        if done == 1:
            raise Stop

    with pytest.raises(Stop):
        stage1(tmp_path / "old", stop_after_1)
    meta = json.loads((tmp_path / "old" / "stage1.json").read_text())  # rewritten as the earlier gsd wrote it
    old = {k: v for k, v in meta.items() if k not in ("search", "weights_sha256")}
    old["settings"] = {k: v for k, v in meta["settings"].items() if k not in sp.LEGACY}
    tensors = {k: v for k, v in sp._load(tmp_path / "old" / "stage1.safetensors").items() if k.startswith(("param.", "adam."))}
    old["weights_sha256"] = sp._save(tmp_path / "old" / "stage1.safetensors", tensors, old)
    (tmp_path / "old" / "stage1.json").write_text(json.dumps(old))
    assert old["epochs_done"] == 1 and "search" not in old
    stage1_cache.clear()
    assert _same(stage1(tmp_path / "old"), stage1(tmp_path / "straight"))
