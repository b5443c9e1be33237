"""``gsd pretrain`` and ``--weights BASE`` (issue 61, item 2): a base built from public sets only, its card, its
weights loaded with a new head by every trainer and by the ranking, and every bad base refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import gsd_cli
from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.models.peft import build_model
from gsd_cli.train.pretrain import pretrain_base

SMALL = dict(model="fmnist-cnn", examples=40, epochs=1, batch_size=32, seed=0, device="cpu")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("pretrain") / "base"
    pretrain_base(["digits", "textures"], folder, **SMALL)
    return folder


def _card(folder: Path) -> dict:
    return json.loads((folder / "card.json").read_text())


def test_pretrain_writes_weights_and_a_card_that_matches_them(base):
    card = _card(base)
    blob = (base / "weights.safetensors").read_bytes()
    assert card["format"] == "gsd-base-1" and card["weights_sha256"] == hashlib.sha256(blob).hexdigest()
    state = load_file(str(base / "weights.safetensors"))
    assert card["tensors"] == {k: list(v.shape) for k, v in sorted(state.items())}
    assert card["model"] == "fmnist-cnn" and (card["input_size"], card["channels"]) == (28, 1) and card["head"] == "fc2"
    assert state["fc2.weight"].shape[0] == card["head_classes"] == 13  # digits' 10 classes, then textures' 3
    assert card["gsd_version"] == gsd_cli.__version__ and "NOT differentially private" in card["privacy"]
    tr = card["training"]
    assert (tr["seed"], tr["epochs"], tr["lr"], tr["batch_size"], tr["examples_cap"]) == (0, 1, 1e-3, 32, 40)
    assert len(tr["train_loss"]) == 1 and tr["best_epoch"] == 1 and tr["seconds"] >= 0


def test_the_card_records_each_set_its_size_classes_and_fingerprint(base):
    sets = _card(base)["sets"]
    assert [s["name"] for s in sets] == ["digits", "textures"]
    assert [(s["examples"], s["train_examples"] + s["validation_examples"]) for s in sets] == [(40, 40), (40, 40)]
    assert [(s["classes"], s["offset"]) for s in sets] == [(10, 0), (3, 10)]
    assert sets[1]["class_names"] == ["brick", "grass", "gravel"]
    for s in sets:
        fp = s["fingerprint"]
        assert fp["name"] == s["name"] and fp["examples"] == 40 and len(fp["content"]["sha256"]) == 64


def test_the_same_settings_give_the_same_base_on_the_same_machine_and_the_card_says_which(base, tmp_path):
    card = pretrain_base(["digits", "textures"], tmp_path / "again", **SMALL)
    assert card["weights_sha256"] == _card(base)["weights_sha256"]
    m = card["training"]["machine"]  # another CPU instruction set or thread count may give other floats
    assert m["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and m["threads"] == torch.get_num_threads()
    assert m["torch"] == torch.__version__


@pytest.mark.parametrize("given", ["folder", "file"])
def test_weights_base_loads_every_tensor_but_the_head(base, given):
    source = base if given == "folder" else base / "weights.safetensors"
    saved = load_file(str(base / "weights.safetensors"))
    _, model, _, info = build_model("fmnist-cnn", 10, seed=3, weights=str(source))
    _, fresh, _, _ = build_model("fmnist-cnn", 10, seed=3)
    own, new = model.state_dict(), fresh.state_dict()
    body = [k for k in own if not k.startswith("fc2.")]
    assert body and all(torch.equal(own[k], saved[k]) for k in body)
    assert not any(torch.equal(own[k], new[k]) for k in body if own[k].numel() > 1)  # not the seed's initialisation
    assert own["fc2.weight"].shape == (10, saved["fc2.weight"].shape[1])  # a new head, sized to the private task
    assert torch.equal(own["fc2.weight"], new["fc2.weight"]) and torch.equal(own["fc2.bias"], new["fc2.bias"])
    stage0 = info["stage0"]
    assert stage0["head_keys_dropped"] == ["fc2.bias", "fc2.weight"]
    assert stage0["base"]["card_sha256"] == hashlib.sha256((base / "card.json").read_bytes()).hexdigest()
    assert stage0["base"]["path"] == str(base.resolve()) and stage0["base"]["public"] == ["digits", "textures"]


def test_pretraining_books_nothing_in_the_ledger(tmp_path, monkeypatch):
    from gsd_cli.privacy.budget import BudgetLedger, DataIdentity

    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("GSD_LEDGER", str(ledger))
    pretrain_base(["digits"], tmp_path / "b1", **SMALL)
    assert not ledger.exists()  # no ledger: none is made
    led = BudgetLedger(ledger)
    led.set_budget(DataIdentity("d" * 64, "other", "arrays"), 1.0, 1e-5)  # a ledger that exists, about another set
    before = json.dumps(led.status(), sort_keys=True)
    card = pretrain_base(["digits"], tmp_path / "b2", **SMALL)
    assert json.dumps(BudgetLedger(ledger).status(), sort_keys=True) == before
    assert any("none known as private data" in c for c in card["checked"])


def test_a_set_that_is_not_public_is_refused_before_training(tmp_path, monkeypatch):
    from gsd_cli.data import resolve
    from gsd_cli.privacy.budget import BudgetLedger
    from gsd_cli.privacy.budget.identity import data_identity

    with pytest.raises(GSDError, match="mnist-a:test is not public data here"):  # the default private set, by name
        pretrain_base(["digits", "mnist-a:test"], tmp_path / "a", **SMALL)
    src = resolve("mnist-a")
    x = np.stack(src.images(np.arange(5))).astype(np.float32)
    np.savez(tmp_path / "copy.npz", x=np.concatenate([x, np.random.default_rng(0).uniform(size=(20, 28, 28))]), y=np.arange(25) % 10)
    with pytest.raises(GSDError, match="shares 5 of 25 examples with the private set mnist-a"):  # by content
        pretrain_base([f"npz:{tmp_path / 'copy.npz'}"], tmp_path / "b", **SMALL)
    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("GSD_LEDGER", str(ledger))
    BudgetLedger(ledger).set_budget(data_identity(resolve("faces")), 1.0, 1e-5)  # faces is private data to this ledger
    with pytest.raises(GSDError, match="faces is private data to the privacy ledger"):
        pretrain_base(["digits", "faces"], tmp_path / "c", **SMALL)
    assert not any((tmp_path / n).exists() for n in "abc")  # refused before any file was written


def _edited(base: Path, tmp_path: Path, how: str) -> Path:
    """A copy of ``base`` broken in one way."""
    bad = tmp_path / "bad"
    shutil.copytree(base, bad)
    card, wfile = _card(bad), bad / "weights.safetensors"
    state = load_file(str(wfile))
    if how == "digest":
        card["weights_sha256"] = "0" * 64
    elif how == "missing weights":
        wfile.unlink()
    elif how == "no card":
        (bad / "card.json").unlink()
        return bad
    elif how in ("extra tensor", "missing tensor"):
        if how == "extra tensor":
            state["extra.weight"] = torch.zeros(2)
        else:
            state.pop("conv1.weight")
        save_file(state, str(wfile))
        card["weights_sha256"] = hashlib.sha256(wfile.read_bytes()).hexdigest()  # the digest fits: the tensors do not
    elif how == "card shape":
        card["tensors"]["conv1.weight"] = [1, 2, 3]
    (bad / "card.json").write_text(json.dumps(card))
    return bad


BAD_BASES = [
    ("other architecture", "resnet20", None, "the base was built for model fmnist-cnn, not resnet20"),
    ("other input size", "fmnist-cnn@32", None, "built for input size 28"),
    ("other channels", "fmnist-cnn@28x3", None, "built for channel count 1"),
    ("digest", "fmnist-cnn", "digest", "is not the file card.json describes"),
    ("missing weights", "fmnist-cnn", "missing weights", "weights.safetensors is missing"),
    ("no card", "fmnist-cnn", "no card", "folder without a base's card.json"),
    ("extra tensor", "fmnist-cnn", "extra tensor", "1 not on the card (extra.weight)"),
    ("missing tensor", "fmnist-cnn", "missing tensor", "1 tensor(s) of the card missing (conv1.weight)"),
    ("card shape", "fmnist-cnn", "card shape", "shapes in weights.safetensors differ from card.json: conv1.weight"),
]


@pytest.mark.parametrize("name,model,how,needle", BAD_BASES, ids=[b[0] for b in BAD_BASES])
@pytest.mark.parametrize("command", ["rank", "train"])
def test_a_bad_base_is_refused_in_one_line(base, tmp_path, capsys, name, model, how, needle, command):
    folder = _edited(base, tmp_path, how) if how else base
    argv = (["rank", "-m", "20", "-k", "2", "--public", "digits"] if command == "rank" else
            ["train", "--method", "dpsgd", "--epochs", "1", "--out", str(tmp_path / "run")])
    got = main([*argv, "--model", model, "--weights", str(folder), "-q"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == 2 and len(lines) == 1 and lines[0].startswith("error: --weights"), err
    assert needle in " ".join(err.split()), err
    assert not (tmp_path / "run").exists()


def test_rank_at_a_base_ranks_at_its_weights(base, monkeypatch):
    """gsd rank --weights BASE: the ranking's model is the base's body (and a new head), so the distances change."""
    import gsd_cli.models.peft as peft

    built = []

    def spy(*args, **kwargs):
        got = build_model(*args, **kwargs)
        built.append((kwargs.get("weights"), got[1]))
        return got

    monkeypatch.setattr(peft, "build_model", spy)
    kw = dict(model="fmnist-cnn", examples=40, k=3, device="cpu")
    plain = gsd_cli.rank("mnist-a", ["digits", "noise"], **kw)
    at_base = gsd_cli.rank("mnist-a", ["digits", "noise"], weights=str(base), **kw)
    saved = load_file(str(base / "weights.safetensors"))
    nets = [net for w, net in built if w == str(base)]
    assert nets and all(torch.equal(net.state_dict()["conv1.weight"].cpu(), saved["conv1.weight"]) for net in nets)
    assert at_base.weights == str(base)
    assert {r.public: r.distance for r in plain} != {r.public: r.distance for r in at_base}


def test_a_run_from_a_base_records_it_in_its_summary(base, tmp_path):
    from gsd_cli.train import TrainConfig, train

    cfg = TrainConfig(private="mnist-a", method="dpsgd", model="fmnist-cnn", weights=str(base), epochs=1, batch_size=250,
                      lr=0.5, epsilon=2.0)
    train(cfg, tmp_path / "run", device="cpu")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    stage0 = summary["stages"][0]
    assert stage0["weights"] == "pre-trained" and stage0["format"] == "gsd base"
    assert stage0["base"]["card_sha256"] == hashlib.sha256((base / "card.json").read_bytes()).hexdigest()
    assert stage0["base"]["path"] == str(base.resolve())


def test_the_command_builds_a_base_and_says_it_is_not_dp(tmp_path, capsys):
    got = main(["pretrain", "--public", "digits", "faces", "-m", "30", "--epochs", "1", "--model", "fmnist-cnn",
                "--out", str(tmp_path / "b"), "--device", "cpu", "-q"])
    cap = capsys.readouterr()
    assert got == 0, cap.err
    text = " ".join(cap.out.split())
    assert "reads public data only; the base is NOT differentially private" in text and "--weights" in text
    assert [s["name"] for s in _card(tmp_path / "b")["sets"]] == ["digits", "faces"]
    assert main(["pretrain", "--public", "digits", "--out", str(tmp_path / "b"), "-q"]) == 2  # never overwritten
    assert "exists and is not an empty folder" in capsys.readouterr().err


def test_a_catalogue_gives_the_candidates_and_its_private_sets_are_refused(tmp_path):
    toml = tmp_path / "gsd.toml"
    toml.write_text('[[jobs]]\nprivate = "mnist-a"\ncandidates = ["digits", "faces"]\n\n'
                    '[[jobs]]\nprivate = "textures"\ncandidates = ["digits"]\n')
    card = pretrain_base(None, tmp_path / "b", catalog=toml, **SMALL)
    assert [s["name"] for s in card["sets"]] == ["digits", "faces"]  # every job's candidates, once each
    assert any("private set textures" in c for c in card["checked"])
    with pytest.raises(GSDError, match="--public textures is not public data here"):  # a job's private set
        pretrain_base(["textures"], tmp_path / "c", catalog=toml, **SMALL)


def test_a_catalogue_job_names_a_base_relative_to_itself(base, tmp_path, monkeypatch):
    from gsd_cli.ranking.catalog import load_catalog, run_catalog

    shutil.copytree(base, tmp_path / "cat" / "mybase")
    toml = tmp_path / "cat" / "gsd.toml"
    toml.write_text('[[jobs]]\nprivate = "mnist-a"\ncandidates = ["digits", "noise"]\n[jobs.options]\n'
                    'model = "fmnist-cnn"\nweights = "mybase"\nexamples = 30\nk = 2\n')
    monkeypatch.chdir(tmp_path)  # not the catalogue's folder
    assert load_catalog(toml).jobs[0].options["weights"] == str(tmp_path / "cat" / "mybase")
    [(_, ranking)] = run_catalog(toml)
    assert ranking.weights == str(tmp_path / "cat" / "mybase")


def test_the_second_phase_from_a_base_trains_stage_1_and_2_on_the_peft_choice_alone(base, tmp_path):
    """Paper 004's Figure 2 from a base (issue 61, item 2): stage 1 on the candidate and then DP fine-tuning both start
    from the base's weights and train the --peft parameters alone: every frozen tensor of the final model is the base's."""
    from gsd_cli.train import TrainConfig, train

    cfg = TrainConfig(private="mnist-a", method="second-phase", public="mnist-b", model="fmnist-cnn", weights=str(base),
                      peft="head", epochs=1, batch_size=250, lr=0.5, epsilon=2.0, public_examples=200, public_epochs=1,
                      public_val=0.0, public_lr=3e-3)
    train(cfg, tmp_path / "run", device="cpu")
    trained = load_file(str(tmp_path / "run" / "checkpoint.safetensors"))
    stage1 = load_file(str(tmp_path / "run" / "stage1.safetensors"))
    start = load_file(str(base / "weights.safetensors"))
    frozen = [n for n in start if not n.startswith("fc2.")]
    assert frozen and all(torch.equal(_tensor(trained, n), start[n]) for n in frozen), "frozen layers are the base's"
    assert sorted(stage1) == ["param.fc2.bias", "param.fc2.weight"], "stage 1 trained the --peft choice alone"
    assert json.loads((tmp_path / "run" / "stage1.json").read_text())["settings"]["weights"] == str(base)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stages"][0]["format"] == "gsd base" and summary["settings"]["peft"] == "head"


def _tensor(tensors: dict, name: str) -> torch.Tensor:
    """``name`` in a saved file whose keys may carry a prefix (a checkpoint's ``model.``)."""
    hits = [k for k in tensors if k == name or k.endswith("." + name)]
    assert len(hits) == 1, (name, sorted(tensors)[:8])
    return tensors[hits[0]]


def test_auto_select_from_a_base_probes_at_its_weights_against_the_base_alone(base, tmp_path, capsys):
    """Issue 61: --auto-select with --weights ranks at the base's weights (the trained model, not the probe network),
    its feature probe's baseline is the base's features and stage 1 starts from the base; the decision names the base
    alone as the contestant without a candidate."""
    code = main(["train", "--private", "mnist-a", "--auto-select", "--public", "mnist-b", "--weights", str(base),
                 "--model", "fmnist-cnn", "--rank-k", "2", "--rank-examples", "40", "--probe-repeats", "2",
                 "--public-examples", "120", "--public-epochs", "1", "--epochs", "1", "--epsilon", "8", "-q",
                 "--out", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["selection"]["model"] == "fmnist-cnn" and summary["selection"]["weights"] == str(base)
    private = json.loads((tmp_path / "run" / "private-summary.json").read_text())
    probe = json.dumps(private)
    assert f"the base alone (--weights {base})" in probe and "untrained" not in probe


def test_stage_1_from_a_gsd_base_centres_its_grid_on_the_scratch_rate(base, tmp_path):
    """Issue 61's pilot: from gsd's small bases stage 1 chose 27x paper 004's pre-trained CNN rate; a base gets the
    scratch rate's grid, published weights (a plain weights file) keep paper 004's."""
    from gsd_cli.train import TrainConfig
    from gsd_cli.train.second_phase import CNN_LR, SCRATCH_LR, pretrained_start, stage1_settings

    spec, net, _, _ = build_model("fmnist-cnn", 10, 0)
    plain = tmp_path / "plain.safetensors"
    shutil.copy(base / "weights.safetensors", plain)
    assert not pretrained_start(None) and not pretrained_start(str(base)) and not pretrained_start(str(base / "weights.safetensors"))
    assert pretrained_start(str(plain)) and pretrained_start("IMAGENET1K_V1")
    for weights, centre in ((str(base), SCRATCH_LR), (str(plain), CNN_LR), (None, SCRATCH_LR)):
        s = stage1_settings(TrainConfig(method="second-phase", public="mnist-b", weights=weights), net, spec)
        assert s.lrs[1] == centre and len(s.lrs) == 3, weights
