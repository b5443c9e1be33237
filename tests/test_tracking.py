"""Experiment tracking (gsd_cli.integrations.tracking): --log tensorboard and --log mlflow for gsd train and
gsd rank --catalog, read back with TensorBoard's EventAccumulator and MLflow's client."""

import json
import sys

import pytest

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.integrations.tracking import check_backends, flat_metrics, log_ranking, train_tracked
from gsd_cli.train import TrainConfig


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def _text(acc, tag) -> str:
    return acc.Tensors(f"{tag}/text_summary")[-1].tensor_proto.string_val[0].decode()


def _mlflow_runs(store):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    exp = client.get_experiment_by_name("gsd")
    return client, client.search_runs([exp.experiment_id])


@pytest.fixture
def local_mlflow(monkeypatch):
    """MLflow's local file store, whatever the user's environment says."""
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for the test's own reading client


def test_train_logs_metrics_and_ledger_to_tensorboard_and_mlflow(tiny, tmp_path, local_mlflow):
    run = tmp_path / "run"
    cfg = TrainConfig(private=tiny["private"], public=tiny["public"], method="gep", epsilon=3.0, epochs=2, batch_size=30,
                      k=4, public_examples=10, insecure_seed=1, physical_batch=64)
    seen = []
    s = train_tracked(cfg, run, log=["tensorboard", "mlflow"], progress=lambda *a: seen.append(a))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and ("epoch", 2, 2) in seen  # the caller's progress still called

    acc = _events(run / "tb")
    for key in ("test_accuracy", "epsilon_spent", "fraction_clipped_embedding"):
        assert [(e.step, round(e.value, 5)) for e in acc.Scalars(key)] == [(r["epoch"], round(r[key], 5)) for r in rows]
    assert _text(acc, "tags/dp") == "false"  # --insecure-seed: not DP, and the run says so
    assert json.loads(_text(acc, "privacy_ledger.json").strip("`\n")) == s["budget"]

    client, runs = _mlflow_runs(run / "mlruns")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    r = runs[0]
    assert r.data.tags["dp"] == "false" and r.data.tags["gsd.publishable"] == "false"
    history = client.get_metric_history(r.info.run_id, "test_accuracy")
    assert [(m.step, m.value) for m in history] == [(x["epoch"], pytest.approx(x["test_accuracy"])) for x in rows]
    assert float(r.data.params["privacy.total_epsilon"]) == pytest.approx(s["budget"]["total_epsilon"])
    assert r.data.params["settings.method"] == "gep" and r.data.metrics["privacy/total_epsilon"] == pytest.approx(s["epsilon"])
    ledger = client.download_artifacts(r.info.run_id, "privacy_ledger.json", str(tmp_path))
    assert json.loads(open(ledger).read()) == s["budget"]


def test_flat_metrics_keeps_numbers_only():
    row = {"epoch": 2, "lr": 0.1, "test_primary": "accuracy", "not_dp": ["x"], "ok": True, "test_macro_auc": None,
           "test_auc_per_finding": {"Effusion": 0.7, "Mass": None}}
    assert flat_metrics(row) == {"epoch": 2.0, "lr": 0.1, "test_auc_per_finding/Effusion": 0.7}


@pytest.mark.parametrize("kind,module", [("mlflow", "mlflow"), ("tensorboard", "tensorboard")])
def test_a_missing_extra_names_it(kind, module, monkeypatch, capsys, tiny, tmp_path):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(GSDError, match=rf"pip install 'gsd-cli\[{kind}\]'"):
        check_backends([kind])
    code = main(["train", "--private", tiny["private"], "--public", tiny["public"], "--log", kind, "--out", str(tmp_path / "r"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and f"gsd-cli[{kind}]" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_bad_log_options(capsys, tiny, tmp_path):
    with pytest.raises(GSDError, match="unknown --log 'wandb'"):
        check_backends(["wandb"])
    code = main(["train", "--private", tiny["private"], "--log-dir", str(tmp_path), "--out", str(tmp_path / "r"), "-q"])
    assert code == 2 and "--log-dir is only used with --log" in capsys.readouterr().err


def test_ranking_goes_to_mlflow_with_its_dp_tag(tmp_path, local_mlflow):
    from gsd_cli.ranking import rank

    rk = rank("mnist-a", ["mnist-b", "noise"], examples=40, k=3, model="fmnist-cnn", params="fc*", engine="vmap", device="cpu")
    log_ranking(rk, "job one", ["mlflow"], tmp_path)
    client, runs = _mlflow_runs(tmp_path / "mlruns")
    r = runs[0]
    assert r.data.tags["dp"] == "false" and r.info.run_name == "job one"
    assert r.data.metrics == {**{f"distance/{x.public}": pytest.approx(x.distance) for x in rk},
                              **{f"rank/{x.public}": x.rank for x in rk}}
    assert r.data.params["settings.k"] == "3"
    doc = json.loads(open(client.download_artifacts(r.info.run_id, "ranking.json", str(tmp_path))).read())
    assert doc["results"][0]["public"] == rk.winner.public


def test_catalog_ranking_logs_each_job_to_tensorboard(tmp_path, capsys, npz_pair):
    cat = tmp_path / "cat.toml"
    cat.write_text(f"""
[datasets.priv]
source = "npz"
path = "{npz_pair['priv']}"

[[jobs]]
name = "plain"
private = "priv"
candidates = ["npz:{npz_pair['near']}", "npz:{npz_pair['far']}"]
[jobs.options]
k = 2
examples = 30
model = "fmnist-cnn"

[[jobs]]
name = "private"
private = "priv"
candidates = ["npz:{npz_pair['near']}", "npz:{npz_pair['far']}"]
[jobs.options]
k = 2
examples = 30
model = "fmnist-cnn"
dp = true
epsilon = 5.0
""")
    logs = tmp_path / "logs"
    code = main(["rank", "--catalog", str(cat), "--log", "tensorboard", "--log-dir", str(logs), "-q",
                 "--json", str(tmp_path / "r.json")])
    assert code == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "r.json").read_text())
    folders = sorted((logs / "tb").iterdir())
    assert [f.name.split("-")[0] for f in folders] == ["plain", "private"]
    for folder, job in zip(folders, result["jobs"]):
        acc = _events(folder)
        assert _text(acc, "tags/dp") == ("true" if job["dp"] else "false")
        for r in job["results"]:
            assert acc.Scalars(f"distance/{r['public']}")[0].value == pytest.approx(r["distance"], rel=1e-6)
    assert _text(_events(folders[1]), "tags/dp") == "true"  # DP-GSD with secret randomness
    assert "epsilon" in _text(_events(folders[1]), "privacy.json")
