"""Grouped (patient) splits: group_column of csv:, groups files of folder:, catalogue keys, and what
gsd datasets show / check report about groups."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from gsd_cli.ranking.catalog import load_catalog
from gsd_cli.cli import app, main
from gsd_cli.data import describe_dataset, resolve
from gsd_cli.data.check import check_datasets
from gsd_cli.data.splits import fixed_split, in_test
from gsd_cli.errors import DatasetError


def _images(root, names):
    rng = np.random.default_rng(0)
    for n in names:
        (root / n).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8), mode="L").save(root / n)


def _patients(n_patients, per=3, extra=()):
    """``[(file, label, patient)]``: ``per`` images per patient, then ``extra`` rows."""
    rows = [(f"img/p{p}_{j}.png", str((p + j) % 2), f"P{p}") for p in range(n_patients) for j in range(per)]
    return rows + list(extra)


def _write_csv(path, rows, header="file,label,patient_id", split=None):
    lines = [header + (",split" if split else "")]
    lines += [",".join(r) + (f",{split(r)}" if split else "") for r in rows]
    path.write_text("\n".join(lines) + "\n")
    _images(path.parent, [r[0] for r in rows])
    return path


def _sides(src):
    """{file key: 'train' | 'test'} of a source's hash split."""
    out = {}
    for part in ("train", "test"):
        out.update({k: part for k in fixed_split(src, part).example_keys()})
    return out


def test_group_column_keeps_each_patient_on_one_side(tmp_path):
    csv = _write_csv(tmp_path / "a.csv", _patients(40))
    src = resolve(f"csv:{csv}?group_column=patient_id")
    sides = _sides(src)
    by_patient = {}
    for key, g in zip(src.example_keys(), src.example_groups()):
        by_patient.setdefault(g, set()).add(sides[key])
    assert all(len(s) == 1 for s in by_patient.values())  # no patient on both sides
    assert all((next(iter(s)) == "test") == in_test(g) for g, s in by_patient.items())  # the group id decides
    assert 0 < sum(next(iter(s)) == "test" for s in by_patient.values()) < 40
    # without the group column the same rows split per image: some patient straddles
    plain = _sides(resolve(f"csv:{csv}"))
    assert any(len({plain[k] for k in src.example_keys() if k.startswith(f"img/p{p}_")}) == 2 for p in range(40))


def test_adding_a_patient_moves_no_other_example(tmp_path):
    rows = _patients(30)
    before = _sides(resolve(f"csv:{_write_csv(tmp_path / 'a.csv', rows)}?group_column=patient_id"))
    more = rows + [(f"img/new_{j}.png", "1", "PNEW") for j in range(4)]  # a new patient with 4 images
    (tmp_path / "b").mkdir()
    after = _sides(resolve(f"csv:{_write_csv(tmp_path / 'b' / 'b.csv', more)}?group_column=patient_id"))
    assert {k: after[k] for k in before} == before
    assert len({after[f"img/new_{j}.png"] for j in range(4)}) == 1
    fewer = [r for r in rows if r[2] != "P3"]  # and removing one
    (tmp_path / "c").mkdir()
    removed = _sides(resolve(f"csv:{_write_csv(tmp_path / 'c' / 'c.csv', fewer)}?group_column=patient_id"))
    assert removed == {k: v for k, v in before.items() if not k.startswith("img/p3_")}


def test_folder_groups_file_and_spec_forms(tmp_path):
    root = tmp_path / "xr"
    names = [f"{c}/{p}_{j}.png" for c in ("a", "b") for p in range(12) for j in range(2)]
    _images(root, names)
    groups = tmp_path / "groups.csv"
    groups.write_text("file,patient\n" + "".join(f"{n},{n.split('/')[1].split('_')[0]}\n" for n in names)
                      + "other/x.png,P99\n")  # a row for a file not in the folder: ignored
    train = resolve(f"folder:{root}?groups={groups}:train")
    test = resolve(f"folder:{root}:test?groups={groups}")  # the split may come first
    assert len(train) + len(test) == 48
    g_train, g_test = set(train.example_groups()), set(test.example_groups())
    assert g_train and g_test and not g_train & g_test
    assert g_test == {g for g in g_train | g_test if in_test(g)}
    assert "per-group hash split" in test.description


def test_groups_file_errors(tmp_path):
    root = tmp_path / "xr"
    _images(root, ["a/1.png", "a/2.png", "b/3.png"])
    bad = tmp_path / "g.csv"
    bad.write_text("file,group\na/1.png,P1\n")
    with pytest.raises(DatasetError, match=r"2 image\(s\) have no row.*a/2.png"):
        resolve(f"folder:{root}?groups={bad}")
    bad.write_text("file,group\na/1.png,P1\na/2.png,\nb/3.png,P2\n")
    with pytest.raises(DatasetError, match="empty group cell.*line"):
        resolve(f"folder:{root}?groups={bad}")
    bad.write_text("file,group\na/1.png,P1\na/1.png,P2\na/2.png,P1\nb/3.png,P2\n")
    with pytest.raises(DatasetError, match="two groups"):
        resolve(f"folder:{root}?groups={bad}")
    with pytest.raises(DatasetError, match="groups file .* not found"):
        resolve(f"folder:{root}?groups={tmp_path / 'none.csv'}")
    with pytest.raises(DatasetError, match="bad option 'group=x'.*groups, frame"):
        resolve(f"folder:{root}?group=x")
    csv = _write_csv(tmp_path / "a.csv", _patients(3))
    with pytest.raises(DatasetError, match="no group column 'patient'"):
        resolve(f"csv:{csv}?group_column=patient")


def test_show_reports_groups_and_warns_on_a_straddling_split_column(tmp_path):
    rows = _patients(20)
    csv = _write_csv(tmp_path / "a.csv", rows, split=lambda r: "test" if r[0] == "img/p4_0.png" else "train")
    d = describe_dataset(f"csv:{csv}?group_column=patient_id")
    groups = {r[2] for r in rows}
    n_test = sum(in_test(g) for g in groups)
    assert (d["groups"], d["groups_test"], d["groups_train"]) == (20, n_test, 20 - n_test)
    assert d["examples_test"] == 3 * n_test and d["groups_on_both_sides"] == 0
    assert (d["data_split_column"], d["groups_across_data_split"], d["groups_across_data_split_first"]) == ("split", 1, ["P4"])
    result = CliRunner().invoke(app, ["datasets", "show", f"csv:{csv}?group_column=patient_id"])
    assert result.exit_code == 0, result.output
    assert "groups: 20" in result.output and f"groups_test: {n_test}" in result.output
    assert "warning:" in result.output and "P4" in result.output
    # gsd datasets check: a problem (exit 1) naming the group and its parts
    report = check_datasets([f"csv:{csv}?group_column=patient_id"])
    assert report.datasets[0].problems == {"group across splits": ["P4 (split: test, train)"]}
    result = CliRunner().invoke(app, ["datasets", "check", f"csv:{csv}?group_column=patient_id"])
    assert result.exit_code == 1 and "group across splits: 1: P4" in result.output
    # a clean split column: no warning
    clean = _write_csv(tmp_path / "b.csv", rows, split=lambda r: "test" if r[2] == "P4" else "train")
    assert describe_dataset(f"csv:{clean}?group_column=patient_id")["groups_across_data_split"] == 0
    assert check_datasets([f"csv:{clean}?group_column=patient_id"]).ok


def test_show_of_a_part_counts_its_own_groups(tmp_path):
    csv = _write_csv(tmp_path / "a.csv", _patients(20))
    d = describe_dataset(f"csv:{csv}?group_column=patient_id:test")
    assert d["groups"] == d["groups_test"] == sum(in_test(f"P{p}") for p in range(20)) and d["groups_train"] == 0


def test_catalogue_entries_take_group_keys(tmp_path):
    _write_csv(tmp_path / "a.csv", _patients(20))
    root = tmp_path / "xr"
    _images(root, [f"c/{p}.png" for p in range(10)])
    (tmp_path / "g.csv").write_text("file,group\n" + "".join(f"c/{p}.png,G{p // 2}\n" for p in range(10)))
    (tmp_path / "cat.toml").write_text(
        '[datasets.derm]\nsource = "csv"\npath = "a.csv"\ngroup_column = "patient_id"\n'
        '[datasets.xr]\nsource = "folder"\npath = "xr"\ngroups = "g.csv"\n'
        '[[jobs]]\nprivate = "derm"\ncandidates = ["xr"]\n')
    cat = load_catalog(tmp_path / "cat.toml")
    derm_test = cat.resolve("derm", split="test")
    assert derm_test.name == "derm:test"
    assert set(derm_test.example_groups()) == {f"P{p}" for p in range(20) if in_test(f"P{p}")}
    xr = cat.resolve("xr")
    assert xr.example_groups() == [f"G{p // 2}" for p in range(10)]
    assert set(cat.resolve("xr", split="train").example_groups()) == {f"G{g}" for g in range(5) if not in_test(f"G{g}")}


def test_bad_spec_option_is_exit_2(tmp_path, capsys):
    csv = _write_csv(tmp_path / "a.csv", _patients(3))
    assert main(["datasets", "show", f"csv:{csv}?colour=red"]) == 2
    err = capsys.readouterr().err
    assert "bad option 'colour=red'" in err and "Traceback" not in err
