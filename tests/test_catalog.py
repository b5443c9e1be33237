"""Catalogues and the CI flags of gsd rank (exit codes 0 / 1 / 2)."""

import json

import pytest

from gsd_cli import GSDError
from gsd_cli.ranking.catalog import load_catalog, run_catalog
from gsd_cli.cli import main

FAST = ["-k", "2", "-m", "60", "--labels", "own", "-q", "--engine", "vmap"]  # all examples, own labels: no dependence on the tmp path


def _catalog(tmp_path, npz_pair, extra=""):
    text = f"""
[datasets.priv]
source = "npz"
path = "{npz_pair['priv']}"
notes = "the private task"

[datasets.near]
source = "npz"
path = "{npz_pair['near']}"

[datasets.far-train]
source = "npz"
path = "{npz_pair['far']}"
split = "train"

[[jobs]]
name = "main"
private = "priv"
candidates = ["near", "far-train"]
[jobs.options]
k = 2
examples = 20
engine = "vmap"
expect_best = "near"

[[jobs]]
private = "near"
candidates = ["far-train", "digits:test"]
[jobs.options]
k = 2
examples = 16
engine = "vmap"
{extra}
"""
    path = tmp_path / "gsd.toml"
    path.write_text(text)
    return path


def test_catalogue_round_trip(tmp_path, npz_pair):
    cat = load_catalog(_catalog(tmp_path, npz_pair))
    assert list(cat.datasets) == ["priv", "near", "far-train"] and cat.datasets["priv"].notes == "the private task"
    assert [j.name for j in cat.jobs] == ["main", "near"] and cat.jobs[0].checks == {"expect_best": "near"}
    assert len(cat.resolve("far-train")) == 47  # the per-example hash split keeps about 80% of 60
    ran = run_catalog(cat, "priv")
    assert len(ran) == 1
    job, rk = ran[0]
    assert rk.private == "priv" and rk.k == 2 and rk.winner.public == "near"
    assert {r.public for r in rk} == {"near", "far-train"}


def test_catalogue_errors(tmp_path, npz_pair):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[jobs]]\nprivate = 'x'\ncandidates = ['y']\n[jobs.options]\nkay = 3\n")
    with pytest.raises(GSDError, match="unknown option.*kay"):
        load_catalog(bad)
    bad.write_text("[datasets.x]\nsource = 'npz'\n[[jobs]]\nprivate = 'x'\ncandidates = ['digits']\n")
    with pytest.raises(GSDError, match="needs path"):
        run_catalog(bad)
    bad.write_text("not = [toml")
    assert main(["rank", "--catalog", str(bad), "--public", "digits"]) == 2
    assert main(["rank", "--catalog", str(bad)]) == 2
    with pytest.raises(GSDError, match="no job with private 'nope'"):
        run_catalog(_catalog(tmp_path, npz_pair), "nope")


def test_cli_catalogue_all_jobs_json_csv_markdown(tmp_path, npz_pair):
    cat = _catalog(tmp_path, npz_pair)
    out = tmp_path / "out"
    out.mkdir()
    rc = main(["rank", "--catalog", str(cat), "-q", "--json", str(out / "r.json"), "--csv", str(out / "r.csv"),
               "--markdown", str(out / "r.md")])
    assert rc == 0
    doc = json.loads((out / "r.json").read_text())
    assert [j["job"] for j in doc["jobs"]] == ["main", "near"] and doc["failures"] == []
    assert doc["jobs"][1]["private_examples"] == 16
    csv_lines = (out / "r.csv").read_text().splitlines()
    assert csv_lines[0].startswith("job,rank,public") and len(csv_lines) == 1 + 2 + 2
    assert [line.split(",")[0] for line in csv_lines[1:]] == ["main", "main", "near", "near"]
    md = (out / "r.md").read_text()
    assert "| rank | public | distance | examples |" in md and "`far-train`" in md and "All checks passed." in md
    # --private picks one job; options given on the command line win over the job's
    rc = main(["rank", "--catalog", str(cat), "--private", "near", "-m", "12", "-q", "--json", str(out / "one.json")])
    doc = json.loads((out / "one.json").read_text())
    assert rc == 0 and [j["job"] for j in doc["jobs"]] == ["near"] and doc["jobs"][0]["private_examples"] == 12


def test_catalogue_check_failure_exit_1(tmp_path, npz_pair):
    cat = _catalog(tmp_path, npz_pair).read_text().replace('expect_best = "near"', 'expect_best = "far-train"')
    (tmp_path / "c.toml").write_text(cat)
    md = tmp_path / "c.md"
    assert main(["rank", "--catalog", str(tmp_path / "c.toml"), "--private", "priv", "--markdown", str(md)]) == 1
    assert "Checks failed" in md.read_text() and "expected far-train to rank first" in md.read_text()


def test_ci_flags_and_exit_codes(npz_pair, tmp_path, capsys):
    priv, near, far = (f"npz:{npz_pair[n]}" for n in ("priv", "near", "far"))
    base = ["rank", "--private", priv, "--public", near, far, *FAST]
    assert main(base + ["--expect-best", near]) == 0
    assert main(base + ["--expect-best", far]) == 1
    assert "expected" in capsys.readouterr().err
    assert main(base + ["--fail-above", "1.0"]) == 0
    assert main(base + ["--fail-above", "0.0"]) == 1
    assert "above 0" in capsys.readouterr().err
    md = tmp_path / "x.md"
    assert main(base + ["--markdown", str(md)]) == 0
    assert md.read_text().count("\n| ") == 3 and "★" in md.read_text()
    assert main(base + ["--markdown", str(tmp_path / "no" / "x.md")]) == 2  # bad input: exit 2
    assert main(["rank", "--private", "nosuchset"]) == 2
    assert main(["rank", "--catalog", str(tmp_path / "none.toml")]) == 2


def test_catalogue_with_repeats(tmp_path, npz_pair):
    """A job's ``repeats`` option (or --repeats on the command line) gives means, intervals and ties per job;
    JSON, CSV (a job column; each job's repeat columns), Markdown and the plot (one panel per job) follow."""
    from PIL import Image

    cat = _catalog(tmp_path, npz_pair, extra="repeats = 3")
    ran = run_catalog(cat)
    assert [getattr(rk, "repeats", 1) for _, rk in ran] == [1, 3]
    assert len(ran[1][1].winner.distances) == 3
    out = tmp_path / "out"
    out.mkdir()
    rc = main(["rank", "--catalog", str(cat), "-q", "--json", str(out / "r.json"), "--csv", str(out / "r.csv"),
               "--markdown", str(out / "r.md"), "--plot", str(out / "r.png")])
    assert rc == 0
    doc = json.loads((out / "r.json").read_text())
    assert "repeats" not in doc["jobs"][0] and doc["jobs"][1]["repeats"] == 3 and len(doc["jobs"][1]["runs"]) == 3
    header, *rows = (out / "r.csv").read_text().splitlines()
    cols = header.split(",")
    assert cols[:3] == ["job", "rank", "public"] and "distance" in cols and "distance_repeat_2" in cols
    by_job = [dict(zip(cols, r.split(","))) for r in rows]
    assert by_job[0]["distance_repeat_0"] == "" and by_job[2]["distance"] == "" and by_job[2]["repeats"] == "3"
    md = (out / "r.md").read_text()
    assert "| rank | public | distance | examples |" in md and "| rank | public | mean ± sd | 95% CI | wins | examples |" in md
    w, h = Image.open(out / "r.png").size
    assert h > 1.8 * (1.2 + 0.45 * 2) * 120  # two stacked panels of two candidates (one would be 252 px high)
    # --repeats on the command line wins over the job options, for every job
    rc = main(["rank", "--catalog", str(cat), "-q", "-R", "2", "--json", str(out / "two.json")])
    assert rc == 0 and [j["repeats"] for j in json.loads((out / "two.json").read_text())["jobs"]] == [2, 2]


def test_catalogue_option_types(tmp_path, npz_pair):
    bad = _catalog(tmp_path, npz_pair, extra='repeats = "five"')
    with pytest.raises(GSDError, match="repeats = 'five' should be an integer"):
        load_catalog(bad)
    assert main(["rank", "--catalog", str(bad)]) == 2


def test_catalogue_job_weights_and_peft(tmp_path, npz_pair):
    """A job's ``weights`` (a file named relative to the catalogue) and ``peft`` build the model exactly as
    ``gsd rank --weights --peft`` does: same distances; --peft on the command line wins for every job."""
    from safetensors.torch import save_file

    from gsd_cli.models.peft import build_model
    from gsd_cli.ranking import rank

    _, net, _, _ = build_model("probe", 4, seed=7)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp_path / "w.safetensors"))
    cat_file = _catalog(tmp_path, npz_pair, extra='weights = "w.safetensors"\npeft = "head"')
    (job, rk), = run_catalog(cat_file, "near")
    assert rk.weights == str(tmp_path / "w.safetensors") and rk.peft == "head"
    cat = load_catalog(cat_file)
    direct = rank(cat.resolve("near"), [cat.resolve("far-train"), cat.resolve("digits:test")], k=2, examples=16,
                  engine="vmap", weights=str(tmp_path / "w.safetensors"), peft="head")
    assert rk.num_params == direct.num_params < 1000  # the head only
    assert [(r.public, r.distance) for r in rk] == [(r.public, r.distance) for r in direct]
    plain = run_catalog(cat_file, "priv")[0][1]
    assert plain.weights is None and plain.num_params > rk.num_params
    out = tmp_path / "o.json"
    assert main(["rank", "--catalog", str(cat_file), "-q", "--peft", "bitfit", "--json", str(out)]) == 0
    assert [j["peft"] for j in json.loads(out.read_text())["jobs"]] == ["bitfit", "bitfit"]
    bad = _catalog(tmp_path, npz_pair, extra="peft = 3")
    with pytest.raises(GSDError, match="peft = 3 should be a string"):
        load_catalog(bad)
