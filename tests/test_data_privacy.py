"""The data layer under differential privacy: splits decided per example, declared class lists,
non-finite pixels refused when read, official splits kept through catalogues, and overlap between
public and private sets (issue 17)."""

import hashlib
import shutil
import struct
import time

import numpy as np
import pytest
import torch
from PIL import Image

from gsd_cli import DatasetError, GSDError
from gsd_cli.ranking.catalog import load_catalog
from gsd_cli.data import (
    DEFAULT_PRIVATE, DEFAULT_PUBLIC, ArraySource, draw, read_images, require_declared_classes, resolve,
    shared_examples, with_classes,
)
from gsd_cli.data.splits import fixed_split, in_test
from gsd_cli.train.splits import private_parts


def _png(path, rng, size=(6, 5), mode="L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = size if mode == "L" else (*size, 3)
    Image.fromarray((rng.uniform(size=shape) * 255).astype(np.uint8)).save(path)


def _folder(root, per_class=40, classes=("cats", "dogs"), seed=0):
    rng = np.random.default_rng(seed)
    for cls in classes:
        for i in range(per_class):
            _png(root / cls / f"{i:03d}.png", rng)
    return root


def _parts_by_file(spec):
    """{relative file: 'train' | 'test'} of a file-backed set's hash split."""
    out = {}
    for part in ("train", "test"):
        src = resolve(f"{spec}:{part}")
        out.update({k: part for k in src.example_keys()})
    return out


def _identities(src):
    """Each example's file (file-backed sets) or content hash (in memory), in order."""
    files = [src.example_file(i) for i in range(len(src))]
    return files if all(files) else src.example_keys()


# --- 1. splits decided per example ------------------------------------------------------------------

def test_split_rule_is_the_documented_hash():
    for key in ("cats/000.png", "sha256:00", "HAM_0000001", "a b/ü.png"):
        h = int.from_bytes(hashlib.sha256(b"gsd-split-v1\0" + key.encode()).digest()[:8], "big")
        assert in_test(key) == (h / 2**64 < 0.2)
    assert 0.17 < np.mean([in_test(f"{i}.png") for i in range(5000)]) < 0.23


def test_adding_or_removing_one_file_moves_no_other(tmp_path):
    root = _folder(tmp_path / "set")
    before = _parts_by_file(f"folder:{root}")
    assert set(before.values()) == {"train", "test"} and len(before) == 80
    _png(root / "cats" / "000a.png", np.random.default_rng(9))  # sorts early: every later index shifts
    after = _parts_by_file(f"folder:{root}")
    assert set(after) == set(before) | {"cats/000a.png"}
    assert {k: after[k] for k in before} == before
    (root / "dogs" / "017.png").unlink()
    removed = _parts_by_file(f"folder:{root}")
    assert removed == {k: v for k, v in after.items() if k != "dogs/017.png"}


def test_split_does_not_depend_on_the_name_or_place(tmp_path):
    root = _folder(tmp_path / "one")
    shutil.copytree(root, tmp_path / "other name")
    assert _parts_by_file(f"folder:{root}") == _parts_by_file(f"folder:{tmp_path / 'other name'}")
    src = resolve(f"folder:{root}")
    src.name = "renamed"
    assert fixed_split(src, "test").example_keys() == resolve(f"folder:{root}:test").example_keys()


def test_adding_one_row_to_an_npz_moves_no_other(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, size=(200, 8, 8), dtype=np.uint8), rng.integers(0, 4, 200)
    path = tmp_path / "a.npz"

    def rows_in_test():
        te = resolve(f"npz:{path}:test")
        return {im.tobytes() for im in np.stack(te.images(range(len(te))))}

    np.savez(path, x=x, y=y)
    before = rows_in_test()
    extra = rng.integers(0, 256, size=(1, 8, 8), dtype=np.uint8)
    np.savez(path, x=np.concatenate([extra, x]), y=np.r_[3, y])  # the same file with one row more, in front
    after = rows_in_test()
    assert before and before <= after and len(after - before) <= 1  # the old test rows all stay; at most the new one joins
    assert 20 < len(before) < 60  # about 20% of 200


def _ham(base, lesions, rng, start=0):
    """HAM10000 layout: ``lesions`` = [(lesion_id, dx, images)], images numbered from ``start``."""
    lines, i = ["lesion_id,image_id,dx,dx_type,age,sex,localization"], start
    for lesion, dx, n in lesions:
        for _ in range(n):
            part = "HAM10000_images_part_1" if i % 2 else "HAM10000_images_part_2"
            _png(base / part / f"ISIC_{i:07d}.jpg", rng, size=(4, 4), mode="RGB")
            lines.append(f"{lesion},ISIC_{i:07d},{dx},histo,50,male,back")
            i += 1
    return lines


def _ham_sides(root):
    """{image id: (lesion, 'train'|'test')} of ham10000 under ``root``."""
    meta = {}
    for line in (root / "ham10000" / "HAM10000_metadata.csv").read_text().splitlines()[1:]:
        lesion, image = line.split(",")[:2]
        meta[image] = lesion
    out = {}
    for part in ("train", "test"):
        src = resolve(f"ham10000:{part}", root=root)
        for i in range(len(src)):
            image = src.example_file(i).rsplit("/", 1)[1][:-4]
            out[image] = (meta[image], part)
    return out


def test_ham10000_splits_per_lesion_and_adding_an_image_moves_no_other(tmp_path):
    rng = np.random.default_rng(0)
    base = tmp_path / "ham10000"
    dxs = ["nv", "mel", "bkl", "bcc", "akiec", "vasc", "df"]
    lesions = [(f"HAM_{j:07d}", dxs[j % 7], 1 + j % 3) for j in range(60)]
    lines = _ham(base, lesions, rng)
    (base / "HAM10000_metadata.csv").write_text("\n".join(lines) + "\n")
    before = _ham_sides(tmp_path)
    by_lesion = {}
    for lesion, side in before.values():
        by_lesion.setdefault(lesion, set()).add(side)
    assert all(len(s) == 1 for s in by_lesion.values())  # every lesion whole
    assert {next(iter(s)) for s in by_lesion.values()} == {"train", "test"}
    assert all((next(iter(by_lesion[les])) == "test") == in_test(les) for les in by_lesion)  # the lesion id decides
    # one more image of an existing lesion and one new lesion: no other image moves
    more = _ham(base, [("HAM_0000005", "df", 1), ("HAM_0009999", "nv", 1)], rng, start=1000)
    (base / "HAM10000_metadata.csv").write_text("\n".join(lines + more[1:]) + "\n")
    after = _ham_sides(tmp_path)
    assert {k: after[k] for k in before} == before
    assert after["ISIC_0001000"][1] == next(iter(by_lesion["HAM_0000005"]))


# --- 2. class lists from declared metadata ----------------------------------------------------------

def test_npz_class_list_declared_or_read_off_the_labels(tmp_path):
    x, y = np.random.default_rng(0).integers(0, 256, size=(10, 4, 4), dtype=np.uint8), np.arange(10) % 4
    np.savez(tmp_path / "plain.npz", x=x, y=y)
    np.savez(tmp_path / "count.npz", x=x, y=y, num_classes=np.int64(6))
    np.savez(tmp_path / "names.npz", x=x, y=y, classes=np.array(["a", "b", "c", "d", "e"]))
    np.savez(tmp_path / "short.npz", x=x, y=y, num_classes=np.int64(3))
    plain = resolve(f"npz:{tmp_path / 'plain.npz'}")
    assert plain.num_classes == 4 and plain.classes_declared is False
    assert resolve(f"npz:{tmp_path / 'plain.npz'}:train").classes_declared is False  # subsets carry it
    with pytest.raises(DatasetError, match=r"plain.npz declares no class list .*not private.*'classes' array.*--classes N"):
        require_declared_classes(plain)
    count = resolve(f"npz:{tmp_path / 'count.npz'}")
    assert count.num_classes == 6 and count.classes_declared  # not max(label) + 1
    require_declared_classes(count)
    require_declared_classes(resolve(f"npz:{tmp_path / 'count.npz'}:test"))
    names = resolve(f"npz:{tmp_path / 'names.npz'}")
    assert names.num_classes == 5 and names.classes == ["a", "b", "c", "d", "e"] and names.classes_declared
    with pytest.raises(DatasetError, match="declares 3 classes"):
        resolve(f"npz:{tmp_path / 'short.npz'}")


def test_declared_sources(tmp_path):
    for name in (DEFAULT_PRIVATE, *DEFAULT_PUBLIC, "mnist-a:train"):
        assert resolve(name).classes_declared, name
    assert resolve(f"folder:{_folder(tmp_path / 'f', per_class=3)}").classes_declared
    rng = np.random.default_rng(0)
    for i in range(4):
        _png(tmp_path / "img" / f"{i}.png", rng)
    rows = "".join(f"img/{i}.png,{'ab'[i % 2]},{i % 2},{i % 3}\n" for i in range(4))
    (tmp_path / "t.csv").write_text("file,label,cat,n\n" + rows)
    (tmp_path / "m.csv").write_text("file,cat,dog\n" + "".join(f"img/{i}.png,{i % 2},{int(i > 1)}\n" for i in range(4)))
    from gsd_cli.data.csvsource import csv_source

    assert csv_source(tmp_path / "t.csv").classes_declared is False  # distinct strings seen
    assert csv_source(tmp_path / "t.csv", label_column="n").classes_declared is False  # max + 1
    assert csv_source(tmp_path / "m.csv").classes_declared is False  # columns that happen to hold 0/1
    assert csv_source(tmp_path / "m.csv", label_columns=["cat", "dog"]).classes_declared  # named columns


def test_with_classes(tmp_path):
    x, y = np.random.default_rng(0).integers(0, 256, size=(10, 4, 4), dtype=np.uint8), np.arange(10) % 4
    np.savez(tmp_path / "p.npz", x=x, y=y)
    src = resolve(f"npz:{tmp_path / 'p.npz'}")
    for spec in (7, "7", "a,b,c,d,e,f,g"):
        d = with_classes(src, spec)
        assert d.classes_declared and d.num_classes == 7 and len(d) == 10
        assert d.labels(range(10)).tolist() == y.tolist()
        require_declared_classes(d)
        assert fixed_split(d, "train").classes_declared and fixed_split(d, "train").num_classes == 7
    assert with_classes(src, "a,b,c,d,e,f,g").classes[0] == "a"
    for bad in ("3", 2, "0", "a,,b", "a,a", "x", 2.5):
        with pytest.raises(DatasetError, match="classes"):
            with_classes(src, bad)
    # string labels: names match the label values, and fix their order
    rng = np.random.default_rng(0)
    for i in range(4):
        _png(tmp_path / "img" / f"{i}.png", rng)
    (tmp_path / "s.csv").write_text("file,label\n" + "".join(f"img/{i}.png,{'ba'[i % 2]}\n" for i in range(4)))
    s = resolve(f"csv:{tmp_path / 's.csv'}")
    assert s.classes == ["a", "b"] and s.labels(range(4)).tolist() == [1, 0, 1, 0] and not s.classes_declared
    d = with_classes(s, "b,c,a")
    assert d.classes == ["b", "c", "a"] and d.num_classes == 3 and d.labels(range(4)).tolist() == [0, 2, 0, 2]
    with pytest.raises(DatasetError, match="has a class name that is not in --classes a,c; list every class"):
        with_classes(s, "a,c")
    with pytest.raises(DatasetError, match="declare them all by name"):
        with_classes(s, 3)


# --- 3. non-finite pixels -----------------------------------------------------------------------------

def test_nan_pixel_in_an_npz_is_refused_naming_the_example(tmp_path):
    x = np.random.default_rng(0).uniform(size=(30, 5, 5)).astype(np.float32)
    x[17, 2, 3] = np.nan
    np.savez(tmp_path / "x.npz", x=x, y=np.arange(30) % 3)
    with pytest.raises(DatasetError, match=r"x.npz: example 17 has NaN or infinite pixel values; fix or remove it"):
        resolve(f"npz:{tmp_path / 'x.npz'}")
    x[17, 2, 3], x[4, 0, 0] = 0.5, np.inf
    np.savez(tmp_path / "x.npz", x=x, y=np.arange(30) % 3)
    with pytest.raises(DatasetError, match="example 4 has NaN or infinite"):
        resolve(f"npz:{tmp_path / 'x.npz'}:train")


def test_read_images_sample_and_evaluate_refuse_non_finite():
    from gsd_cli.train.evaluate import evaluate

    x = np.random.default_rng(0).uniform(size=(12, 4, 4)).astype(np.float32)
    x[5, 1, 1] = -np.inf
    src = ArraySource("arr", x, np.arange(12) % 2, 2)
    assert len(read_images(src, [0, 1, 2])) == 3
    with pytest.raises(DatasetError, match="^arr: example 5 has NaN or infinite pixel values; fix or remove it$"):
        read_images(src, range(12))
    sample = draw(src, None, seed=0)
    with pytest.raises(DatasetError, match="example 5"):
        sample.tensor(4, 1)
    with pytest.raises(DatasetError, match="example 5"):
        list(sample.batches(4, 1, chunk=3))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 2))
    with pytest.raises(DatasetError, match="example 5"):
        evaluate(model, src, 4, 1, "cpu", batch=4)
    assert evaluate(model, ArraySource("ok", x[:5], np.arange(5) % 2, 2), 4, 1, "cpu")["examples"] == 5


def test_nan_in_a_float_tiff_names_the_file(tmp_path):
    root = _folder(tmp_path / "f", per_class=2)
    a = np.full((5, 6), 0.5, dtype=np.float32)
    a[2, 2] = np.nan
    Image.fromarray(a, mode="F").save(root / "dogs" / "bad.tif")
    src = resolve(f"folder:{root}")
    bad = next(i for i in range(len(src)) if src.example_file(i).endswith("bad.tif"))
    with pytest.raises(DatasetError, match=rf"example {bad} \(.*dogs/bad.tif\) has NaN or infinite"):
        read_images(src, range(len(src)))
    part = next(fixed_split(src, p) for p in ("train", "test") if "dogs/bad.tif" in fixed_split(src, p).example_keys())
    with pytest.raises(DatasetError, match=r"bad.tif\) has NaN"):  # the index is the part's, the file the same
        draw(part, None, seed=0).tensor(4, 1)


# --- 4. official splits survive a catalogue -----------------------------------------------------------

def _published_root(tmp_path):
    """Tiny copies of chestxray (with official lists), ham10000, kagchest, kagskin, mnist_m and mnist."""
    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    chest = root / "chestxray"
    rows, train, test = [], [], []
    for p in range(20):  # 20 patients, 2 images each; patients 0-5 are the official test patients
        for j in range(2):
            f = f"{p:08d}_{j:03d}.png"
            _png(chest / ("images_001" if p < 10 else "images_002") / "images" / f, rng)
            rows.append(f"{f},{'No Finding' if (p + j) % 3 else 'Effusion|Mass'},{j},{p}")
            (test if p < 6 else train).append(f)
    (chest / "Data_Entry_2017_v2020.csv").write_text("Image Index,Finding Labels,Follow-up #,Patient ID\n" + "\n".join(rows) + "\n")
    (chest / "train_val_list.txt").write_text("\n".join(train) + "\n")
    (chest / "test_list.txt").write_text("\n".join(test) + "\n")
    lesions = [(f"HAM_{j:07d}", ["nv", "mel", "bkl"][j % 3], 1 + j % 2) for j in range(30)]
    (root / "ham10000" / "HAM10000_metadata.csv").parent.mkdir(parents=True)
    (root / "ham10000" / "HAM10000_metadata.csv").write_text("\n".join(_ham(root / "ham10000", lesions, rng)) + "\n")
    for split, n in (("train", 3), ("val", 1), ("test", 2)):
        for cls in ("NORMAL", "PNEUMONIA"):
            for i in range(n):
                _png(root / "kagchest" / "chest_xray" / split / cls / f"{cls}{i}.jpeg", rng)
    for split in ("train", "test"):
        for cls in ("benign", "malignant"):
            for i in range(3):
                _png(root / "kagskin" / "data" / split / cls / f"{i}.jpg", rng, mode="RGB")
        for i in range(4):
            _png(root / "mnist_m" / f"mnist_m_{split}" / f"{i:08d}.png", rng, mode="RGB")
        (root / "mnist_m" / f"mnist_m_{split}_labels.txt").write_text("".join(f"{i:08d}.png {i}\n" for i in range(4)))
    raw = root / "MNIST" / "raw"  # torchvision's idx files
    raw.mkdir(parents=True)
    for part, n in (("train", 6), ("t10k", 3)):
        for kind, arr in (("images-idx3", rng.integers(0, 256, size=(n, 28, 28))), ("labels-idx1", rng.integers(0, 10, n))):
            header = struct.pack(">HBB", 0, 8, arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
            (raw / f"{part}-{kind}-ubyte").write_bytes(header + arr.astype(np.uint8).tobytes())
    return root


BUILT_INS = {"chestxray": "chestxray", "ham10000": "ham10000", "kagchest": "kagchest/chest_xray",
             "kagskin": "kagskin/data", "mnist_m": "mnist_m", "mnist": "."}


def test_catalogue_entries_keep_official_and_grouped_splits(tmp_path):
    root = _published_root(tmp_path)
    entries = "".join(f'[datasets.my-{k}]\nsource = "{k}"\nroot = "{root / folder}"\n\n' for k, folder in BUILT_INS.items())
    entries += "".join(f'[datasets.dr-{k}]\nsource = "{k}"\n\n' for k in BUILT_INS)  # through data_root
    (tmp_path / "cat.toml").write_text(f'data_root = "{root}"\n\n' + entries)
    cat = load_catalog(tmp_path / "cat.toml")
    for key in BUILT_INS:
        want = [resolve(f"{key}:{part}", root=root) for part in ("train", "test")]
        for entry in (f"my-{key}", f"dr-{key}"):
            got = private_parts(entry, catalog=cat)
            assert [_identities(g) for g in got] == [_identities(w) for w in want], (key, entry)
            assert [g.name for g in got] == [f"{entry}:train", f"{entry}:test"]
            assert [_identities(cat.resolve(entry, split=p)) for p in ("train", "test")] == [_identities(w) for w in want]
        assert [_identities(g) for g in private_parts(key, catalog=cat)] == [_identities(w) for w in want]
    # the official chestxray lists: patient-wise, 12 test images of patients 0-5
    test = resolve("chestxray:test", root=root)
    assert len(test) == 12 and all(int(f.rsplit("/", 1)[1][:8]) < 6 for f in _identities(test))
    with pytest.raises(GSDError, match="already the split"):
        load_catalog(_split_entry(tmp_path, root)).resolve("chest-test", split="train")


def _split_entry(tmp_path, root):
    (tmp_path / "split.toml").write_text(f'[datasets.chest-test]\nsource = "chestxray"\nroot = "{root / "chestxray"}"\nsplit = "test"\n')
    return tmp_path / "split.toml"


def test_generic_sets_split_alike_in_a_catalogue_and_on_the_command_line(tmp_path):
    root = _folder(tmp_path / "f")
    x = np.random.default_rng(1).integers(0, 256, size=(80, 6, 6), dtype=np.uint8)
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(80) % 5)
    (tmp_path / "cat.toml").write_text(
        f'[datasets.pics]\nsource = "folder"\npath = "{root}"\n\n[datasets.arr]\nsource = "npz"\npath = "{tmp_path / "d.npz"}"\n\n'
        '[datasets.digits-again]\nsource = "digits"\n')
    cat = load_catalog(tmp_path / "cat.toml")
    for entry, spec in (("pics", f"folder:{root}"), ("arr", f"npz:{tmp_path / 'd.npz'}"), ("digits-again", "digits")):
        got, want = private_parts(entry, catalog=cat), private_parts(spec)
        assert [_identities(g) for g in got] == [_identities(w) for w in want], entry


# --- 5. does a public set share examples with the private set? --------------------------------------

def test_default_publics_share_nothing_with_the_default_private_and_fast():
    private = resolve(DEFAULT_PRIVATE)
    publics = [resolve(p) for p in DEFAULT_PUBLIC]
    t = time.perf_counter()
    assert [shared_examples(private, p) for p in publics] == [None] * len(publics)
    assert time.perf_counter() - t < 2.0  # all six; well under a second each
    assert shared_examples(resolve("mnist-a:train"), resolve("mnist-a:test")) is None


def test_shared_examples_by_content_name_and_path(tmp_path):
    a = resolve("mnist-a")
    np.savez(tmp_path / "copy.npz", x=np.round(np.stack(a.images(range(100))) * 255).astype(np.uint8),
             y=a.labels(range(100)))
    msg = shared_examples(a, resolve(f"npz:{tmp_path / 'copy.npz'}"))
    assert msg == f"npz:{tmp_path / 'copy.npz'} shares 100 of 100 examples with the private set mnist-a (same image content)"
    assert "mnist-a" in shared_examples(a, resolve("mnist-a:train")) and "by name" in shared_examples(a, resolve("mnist-a:train"))
    assert "by name" in shared_examples(resolve("mnist-a:test"), resolve("mnist-a"))
    assert shared_examples(resolve("mnist-b"), resolve("mnist-inverted")) is None  # inverted content differs
    renamed = ArraySource("look-alike", np.stack(a.images(range(10, 40))), a.labels(range(10, 40)), 10)
    assert "shares 30 of 30 examples" in shared_examples(a, renamed)
    found = [shared_examples(resolve(f"mnist-a:{p}"), renamed) for p in ("train", "test")]
    assert sum(int(m.split(" shares ")[1].split()[0]) for m in found if m) == 30  # each copy found on its side

    root = _folder(tmp_path / "pics")
    full, train, test = (resolve(f"folder:{root}{s}") for s in ("", ":train", ":test"))
    assert "by name" in shared_examples(full, train)
    assert shared_examples(train, test) is None
    (tmp_path / "link").symlink_to(root)
    assert "by name" in shared_examples(full, resolve(f"folder:{tmp_path / 'link'}:test"))  # real paths compared
    elsewhere = resolve(f"folder:{tmp_path / 'link'}")
    elsewhere.name = "elsewhere"  # as a catalogue names it
    msg = shared_examples(train, elsewhere)
    assert msg == f"elsewhere shares {len(train)} of 80 files with the private set {train.name} (same files on disk)"
    assert shared_examples(train, fixed_split(elsewhere, "test")) is None  # the other half: disjoint
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    assert f"shares {len(test)} of 80 examples" in shared_examples(test, resolve(f"folder:{copy}"))


def test_dataset_identity_resolves_aliases_and_paths(tmp_path):
    from gsd_cli.data.identity import dataset_identity

    assert dataset_identity("fmnist:test") == ("fashionmnist", "test")
    assert dataset_identity("ham") == ("ham10000", None)
    assert dataset_identity(f"folder:{tmp_path}/x/../y:train") == (f"folder:{tmp_path.resolve()}/y", "train")
