"""Issue 19, catalogues: not all-or-nothing, every missing dataset at once, relative paths, and
``gsd datasets check``."""

import json

import numpy as np
import pytest
from PIL import Image

from gsd_cli import GSDError
from gsd_cli.ranking.catalog import CatalogError, load_catalog, run_catalog, run_jobs
from gsd_cli.cli import main
from gsd_cli.data.check import check_datasets

OPTS = 'k = 2\nexamples = 16\nengine = "vmap"\n'


def _cat(tmp_path, npz_pair, jobs, datasets=""):
    text = f'[datasets.priv]\nsource = "npz"\npath = "{npz_pair["priv"]}"\n[datasets.near]\nsource = "npz"\npath = "{npz_pair["near"]}"\n'
    text += datasets + "".join(f'\n[[jobs]]\nname = "{n}"\nprivate = "{p}"\ncandidates = {json.dumps(c)}\n[jobs.options]\n{OPTS}{x}\n'
                               for n, p, c, x in jobs)
    path = tmp_path / "gsd.toml"
    path.write_text(text)
    return path


GONE = '[datasets.gone]\nsource = "npz"\npath = "nowhere/gone.npz"\n[datasets.lost]\nsource = "folder"\npath = "lost"\n'


def test_a_bad_job_does_not_stop_the_others(tmp_path, npz_pair):
    cat = _cat(tmp_path, npz_pair, [("a", "priv", ["gone"], ""), ("b", "priv", ["near"], ""),
                                    ("c", "priv", ["near"], 'mechanism = "bogus"\ndp = true\nepsilon = 1.0'),
                                    ("d", "near", ["lost", "priv"], "")], GONE)
    seen = []
    run = run_jobs(cat, on_job=lambda r: seen.append((len(r.results), len(r.errors))))
    assert [j.name for j, _ in run.results] == ["b"] and [j.name for j, _ in run.errors] == ["a", "c", "d"]
    assert seen == [(0, 1), (1, 1), (1, 2), (1, 3)]  # the caller sees the run after every job
    assert set(run.unusable) == {"gone", "lost"} and "relative to the catalogue's folder" in run.unusable["gone"]
    assert all("\n" not in m for _, m in run.errors)
    with pytest.raises(CatalogError, match="3 of 4 job") as e:
        run_catalog(cat)
    assert [j.name for j, _ in e.value.run.results] == ["b"]
    with pytest.raises(GSDError, match="2 dataset.*gone.*lost"):  # fail fast: every unusable dataset, before any job
        run_jobs(cat, fail_fast=True)


def test_cli_keeps_finished_jobs_and_exits_2(tmp_path, npz_pair, capsys):
    cat = _cat(tmp_path, npz_pair, [("a", "priv", ["near"], "fail_above = 0.0"), ("b", "priv", ["gone"], ""),
                                    ("c", "near", ["priv"], "")], GONE)
    out = tmp_path / "out"
    out.mkdir()
    files = ["--json", str(out / "r.json"), "--csv", str(out / "r.csv"), "--markdown", str(out / "r.md")]
    assert main(["rank", "--catalog", str(cat), "-q", *files]) == 2  # a failed job (2) wins over a failed check (1)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert any("job 'b' failed" in line and "gone" in line for line in lines) and "check failed" in err
    assert sum("cannot be used" in line for line in lines) == 1  # every unusable dataset on one line
    doc = json.loads((out / "r.json").read_text())
    assert [j["job"] for j in doc["jobs"]] == ["a", "c"] and doc["errors"][0]["job"] == "b"
    assert doc["failures"] and set(doc["unusable_datasets"]) == {"gone"}  # only the datasets of its jobs
    assert [r.split(",")[0] for r in (out / "r.csv").read_text().splitlines()[1:]] == ["a", "c"]
    md = (out / "r.md").read_text()
    assert "Jobs that failed" in md and "`b`" in md and "Checks failed" in md
    # --fail-fast: the old behaviour, one error and nothing ranked
    assert main(["rank", "--catalog", str(cat), "-q", "--fail-fast"]) == 2
    assert "cannot be used" in capsys.readouterr().err


def test_outputs_hold_the_finished_jobs_when_a_run_stops(tmp_path, npz_pair, monkeypatch):
    import gsd_cli.ranking as ranking

    cat = _cat(tmp_path, npz_pair, [("a", "priv", ["near"], ""), ("b", "near", ["priv"], "")])
    real, calls = ranking.rank, []

    def crash_second(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(ranking, "rank", crash_second)
    js = tmp_path / "r.json"
    assert main(["rank", "--catalog", str(cat), "-q", "--json", str(js)]) == 130
    assert [j["job"] for j in json.loads(js.read_text())["jobs"]] == ["a"]


def test_path_is_relative_to_the_catalogue_not_data_root(tmp_path, npz_pair):
    (tmp_path / "cfg" / "data").mkdir(parents=True)
    (tmp_path / "root" / "data").mkdir(parents=True)
    np.savez(tmp_path / "cfg" / "data" / "x.npz", **np.load(npz_pair["near"]))
    np.savez(tmp_path / "root" / "data" / "y.npz", **np.load(npz_pair["far"]))
    cat = tmp_path / "cfg" / "gsd.toml"
    cat.write_text('data_root = "../root"\n[datasets.x]\nsource = "npz"\npath = "data/x.npz"\n'
                   '[datasets.y]\nsource = "npz"\npath = "data/y.npz"\n[[jobs]]\nprivate = "x"\ncandidates = ["y"]\n')
    c = load_catalog(cat)
    assert len(c.resolve("x")) == 60  # beside the TOML file
    with pytest.raises(GSDError, match="under data_root: write path = .*root/data/y.npz"):
        c.resolve("y")  # not silently taken from data_root: the error gives the path to write


def test_datasets_check(tmp_path, npz_pair, capsys):
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    for i in range(4):
        Image.fromarray(np.full((8, 8), i * 40, np.uint8)).save(imgs / f"{i}.png")
    (imgs / "._0.png").write_bytes(b"\0\5\26\7")
    (imgs / ".DS_Store").write_bytes(b"x")
    (imgs / "3.png").write_bytes(b"")  # empty: unreadable
    rows = ["file,label", "imgs/0.png,a", "imgs/1.png,b", "imgs/2.png,", "imgs/9.png,a", "imgs/8.png,b", "imgs/7.png,a", "imgs/3.png,b"]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    cat = tmp_path / "gsd.toml"
    cat.write_text(f'[datasets.derm]\nsource = "csv"\npath = "labels.csv"\n[datasets.priv]\nsource = "npz"\npath = "{npz_pair["priv"]}"\n'
                   '[[jobs]]\nprivate = "priv"\ncandidates = ["derm", "missing-one"]\n')
    report = check_datasets(catalog=load_catalog(cat))
    by = {d.name: d for d in report.datasets}
    assert list(by) == ["priv", "derm", "missing-one"] and not report.ok
    assert not by["priv"].problems and by["priv"].examples == 60
    p = by["derm"].problems
    assert len(p["absent image"]) == 3 and len(p["empty label cell"]) == 1 and p["empty label cell"][0].endswith(":4 (label)")
    assert len(p["hidden file"]) == 2 and any(x.endswith("3.png (empty file)") for x in p["unreadable"])
    assert "cannot be used" in by["missing-one"].problems
    assert main(["datasets", "check", "--catalog", str(cat), "--first", "2"]) == 1
    text = capsys.readouterr().out
    assert "absent image: 3: " in text and "(1 more)" in text
    assert main(["datasets", "check", "--catalog", str(cat), "priv"]) == 0
    assert "priv: 60 examples" in capsys.readouterr().out
    assert main(["datasets", "check", "--catalog", str(tmp_path / "none.toml")]) == 2
    assert main(["datasets", "check", "--first", "0"]) == 2
