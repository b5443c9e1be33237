"""Built-in datasets in their real on-disk layouts (tiny generated copies), csv:, splits, listing."""

import pickle
import struct

import numpy as np
import pytest
from PIL import Image

from gsd_cli import DatasetError
from gsd_cli.cli import main
from gsd_cli.data import describe_dataset, draw, list_datasets, resolve
from gsd_cli.data.published import CHEST_FINDINGS


def _png(path, rng, size=(12, 10), mode="L"):
    path.parent.mkdir(parents=True, exist_ok=True)
    shape = size if mode == "L" else (*size, 3)
    Image.fromarray((rng.uniform(size=shape) * 255).astype(np.uint8)).save(path)


@pytest.fixture
def count_opens(monkeypatch):
    import PIL.Image

    opened = []
    real = PIL.Image.open

    def counting(fp, *a, **k):
        opened.append(str(fp))
        return real(fp, *a, **k)

    monkeypatch.setattr(PIL.Image, "open", counting)
    return opened


# --- torchvision layouts --------------------------------------------------------------------------

def test_cifar10_python_pickles(tmp_path):
    rng = np.random.default_rng(0)
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    labels = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        y = rng.integers(0, 10, size=4).tolist()
        labels[name] = y
        with open(base / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, size=(4, 3072), dtype=np.uint8), "labels": y}, f)
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    tr, te, all_ = resolve("cifar10:train", root=tmp_path), resolve("cifar10:test", root=tmp_path), resolve("cifar10", root=tmp_path)
    assert (len(tr), len(te), len(all_)) == (20, 4, 24)
    assert tr.labels(range(20)).tolist() == sum((labels[f"data_batch_{i}"] for i in range(1, 6)), [])
    assert te.labels(range(4)).tolist() == labels["test_batch"]
    assert all_.labels([20, 21]).tolist() == labels["test_batch"][:2]
    assert tr.images([0])[0].shape == (32, 32, 3) and tr.num_classes == 10


def test_cifar_in_named_subfolder_and_malformed(tmp_path):
    sub = tmp_path / "cifar100" / "cifar-100-python"
    sub.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for name in ("train", "test"):
        with open(sub / name, "wb") as f:
            pickle.dump({"data": rng.integers(0, 256, size=(3, 3072), dtype=np.uint8), "fine_labels": [5, 99, 0]}, f)
    with open(sub / "meta", "wb") as f:
        pickle.dump({"fine_label_names": [f"c{i}" for i in range(100)]}, f)
    src = resolve("cifar100:test", root=tmp_path)
    assert src.labels([0, 1, 2]).tolist() == [5, 99, 0] and src.num_classes == 100
    (sub / "test").write_bytes(b"not a pickle")
    with pytest.raises(DatasetError, match="cannot read.*cifar.html"):
        resolve("cifar100:test", root=tmp_path)


def test_svhn_mat(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    y = np.array([[10], [1], [3], [10], [9]], dtype=np.uint8)  # SVHN stores digit 0 as 10
    savemat(tmp_path / "test_32x32.mat", {"X": rng.integers(0, 256, size=(32, 32, 3, 5), dtype=np.uint8), "y": y})
    src = resolve("svhn:test", root=tmp_path)
    assert src.labels(range(5)).tolist() == [0, 1, 3, 0, 9]
    assert src.images([2])[0].shape == (32, 32, 3)
    with pytest.raises(DatasetError, match="svhn:train: not found.*train,test}_32x32.mat.*stanford"):
        resolve("svhn:train", root=tmp_path)


def _idx(path, arr):
    codes = {np.uint8: 0x08}
    header = struct.pack(">HBB", 0, codes[np.uint8], arr.ndim) + b"".join(struct.pack(">I", d) for d in arr.shape)
    path.write_bytes(header + arr.astype(np.uint8).tobytes())


@pytest.mark.parametrize("name,folder", [("mnist", "MNIST"), ("fmnist", "FashionMNIST"), ("kmnist", "KMNIST")])
def test_mnist_idx_files(tmp_path, name, folder):
    raw = tmp_path / folder / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    ys = {}
    for part, n in (("train", 6), ("t10k", 3)):
        ys[part] = rng.integers(0, 10, size=n).astype(np.uint8)
        _idx(raw / f"{part}-images-idx3-ubyte", rng.integers(0, 256, size=(n, 28, 28)).astype(np.uint8))
        _idx(raw / f"{part}-labels-idx1-ubyte", ys[part])
    src = resolve(f"{name}:test", root=tmp_path)
    assert src.labels(range(3)).tolist() == ys["t10k"].tolist()
    assert len(resolve(name, root=tmp_path)) == 9
    assert src.images([0])[0].shape == (28, 28)


def test_torchvision_missing_says_where_and_exit_2(tmp_path, capsys):
    assert main(["datasets", "show", "stl10", "--data-root", str(tmp_path)]) == 2
    msg = capsys.readouterr().err
    assert str(tmp_path) in msg and "stl10_binary" in msg and "stanford.edu" in msg


# --- published layouts ------------------------------------------------------------------------------

@pytest.fixture
def chest_root(tmp_path):
    rng = np.random.default_rng(0)
    base = tmp_path / "chestxray"
    rows = [("a_000.png", "No Finding"), ("a_001.png", "Effusion|Hernia"), ("a_002.png", "Atelectasis"),
            ("b_000.png", "Cardiomegaly|Effusion"), ("b_001.png", "No Finding"), ("c_000.png", "Mass")]
    for i, (f, _) in enumerate(rows):
        part = "images_001" if i < 3 else "images_002"
        _png(base / part / "images" / f, rng)
    # c_000.png is listed but not on disk: left out
    (base / "images_002" / "images" / "c_000.png").unlink()
    lines = ["Image Index,Finding Labels,Follow-up #,Patient ID"] + [f"{f},{lab},0,1" for f, lab in rows]
    (base / "Data_Entry_2017_v2020.csv").write_text("\n".join(lines) + "\n")
    (base / "train_val_list.txt").write_text("a_000.png\na_001.png\na_002.png\n")
    (base / "test_list.txt").write_text("b_000.png\nb_001.png\nc_000.png\n")
    return tmp_path


def test_chestxray_multilabel_and_official_lists(chest_root, count_opens):
    src = resolve("chestxray", root=chest_root)
    assert src.multilabel and src.num_classes == 14 and len(src) == 5
    y = src.labels(range(5))
    assert y[0].sum() == 0  # No Finding = all zeros
    assert set(np.flatnonzero(y[1])) == {CHEST_FINDINGS.index("Effusion"), CHEST_FINDINGS.index("Hernia")}
    test = resolve("chestxray:test", root=chest_root)
    assert len(test) == 2 and test.labels([0])[0][CHEST_FINDINGS.index("Cardiomegaly")] == 1
    assert len(resolve("chestxray:train", root=chest_root)) == 3
    count_opens.clear()
    sample = draw(src, 2, seed=0)
    sample.tensor(16, 1)
    assert len(count_opens) == 2  # only the drawn files were opened
    d = describe_dataset("chestxray:test", root=chest_root)
    assert d["multilabel"] is True and d["examples"] == 2 and d["image_size"] == [12, 10]


def test_chestxray_images_folder_and_2017_csv(tmp_path):
    rng = np.random.default_rng(0)
    base = tmp_path / "chestxray"
    _png(base / "images" / "x.png", rng)
    _png(base / "images" / "y.png", rng)
    (base / "Data_Entry_2017.csv").write_text("Image Index,Finding Labels\nx.png,Pneumonia\ny.png,No Finding\n")
    src = resolve("chestxray:test", root=tmp_path)  # no official lists: the per-example hash split
    assert len(src) + len(resolve("chestxray:train", root=tmp_path)) == 2
    (base / "Data_Entry_2017.csv").write_text("Image Index,Finding Labels\nx.png,Flu\n")
    with pytest.raises(DatasetError, match="unknown finding 'Flu'"):
        resolve("chestxray", root=tmp_path)


def test_ham10000_metadata_and_lesion_split(tmp_path, count_opens):
    rng = np.random.default_rng(0)
    base = tmp_path / "ham10000"
    dxs = ["nv", "mel", "bkl", "bcc", "akiec", "vasc", "df"] * 10
    lines = ["lesion_id,image_id,dx,dx_type,age,sex,localization"]
    for i, dx in enumerate(dxs):
        part = "HAM10000_images_part_1" if i % 2 else "HAM10000_images_part_2"
        _png(base / part / f"ISIC_{i:07d}.jpg", rng, size=(4, 4), mode="RGB")
        lines.append(f"HAM_{i // 2:07d},ISIC_{i:07d},{dx},histo,50,male,back")
    (base / "HAM10000_metadata.csv").write_text("\n".join(lines) + "\n")
    src = resolve("ham10000", root=tmp_path)
    assert len(src) == 70 and src.num_classes == 7 and src.classes[src.labels([0])[0]] == "nv"
    tr, te = resolve("ham10000:train", root=tmp_path), resolve("ham10000:test", root=tmp_path)
    assert len(tr) + len(te) == 70 and len(te) > 0
    les = lambda s: {s.parent.files[i].split("ISIC_")[1] for i in s.indices}  # noqa: E731
    assert not les(tr) & les(te)
    lesion = lambda s: {int(f[:7]) // 2 for f in les(s)}  # noqa: E731
    assert not lesion(tr) & lesion(te)  # one lesion's images never on both sides
    count_opens.clear()
    draw(src, 5, seed=1).tensor(8, 3)
    assert len(count_opens) == 5


def test_kaggle_folders(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("val", 1), ("test", 2)):
        for cls in ("NORMAL", "PNEUMONIA"):
            for i in range(n):
                _png(tmp_path / "chest_xray" / split / cls / f"{cls}{i}.jpeg", rng)
    (tmp_path / "chest_xray" / "train" / "NORMAL" / ".DS_Store").write_text("x")
    assert len(resolve("kagchest", root=tmp_path)) == 12
    te = resolve("kagchest:test", root=tmp_path)
    assert te.labels(range(4)).tolist() == [0, 0, 1, 1] and te.classes == ["NORMAL", "PNEUMONIA"]
    for split in ("train", "test"):
        for c, cls in enumerate(("benign", "malignant")):
            for i in range(2 + c):
                _png(tmp_path / "kagskin" / "data" / split / cls / f"{i}.jpg", rng, mode="RGB")
    sk = resolve("kagskin:train", root=tmp_path)
    assert sk.labels(range(5)).tolist() == [0, 0, 1, 1, 1]


def test_mnist_m_labels_file_and_folders(tmp_path):
    rng = np.random.default_rng(0)
    base = tmp_path / "mnist_m"
    for i in range(4):
        _png(base / "mnist_m_test" / f"{i:08d}.png", rng, mode="RGB")
    (base / "mnist_m_test_labels.txt").write_text("".join(f"{i:08d}.png {7 - i}\n" for i in range(4)))
    src = resolve("mnist_m:test", root=tmp_path)
    assert src.labels(range(4)).tolist() == [7, 6, 5, 4] and src.images([3])[0].shape == (12, 10, 3)
    other = tmp_path / "other" / "mnist-m"
    _png(other / "train" / "0" / "a.png", rng)
    _png(other / "train" / "3" / "b.png", rng)
    for d in "12456789":
        (other / "train" / d).mkdir()
    assert resolve("mnist_m:train", root=tmp_path / "other").labels([0, 1]).tolist() == [0, 3]


# --- generic sources, splits, listing ------------------------------------------------------------

def test_csv_single_label_multilabel_and_relative_paths(tmp_path, count_opens):
    rng = np.random.default_rng(0)
    for i in range(6):
        _png(tmp_path / "img" / f"{i}.png", rng)
    (tmp_path / "one.csv").write_text("file,diagnosis\n" + "".join(f"img/{i}.png,{'ab'[i % 2]}\n" for i in range(6)))
    (tmp_path / "multi.csv").write_text("image,cat,dog\n" + "".join(f"img/{i}.png,{i % 2},{int(i > 3)}\n" for i in range(6)))
    (tmp_path / "ints.csv").write_text("path,label\n" + "".join(f"{tmp_path}/img/{i}.png,{i}\n" for i in range(6)))
    from gsd_cli.data.csvsource import csv_source

    one = csv_source(tmp_path / "one.csv", image_column="file", label_column="diagnosis")
    assert one.labels(range(6)).tolist() == [0, 1, 0, 1, 0, 1] and one.classes == ["a", "b"]
    multi = resolve(f"csv:{tmp_path / 'multi.csv'}")
    assert multi.multilabel and multi.labels([5]).tolist() == [[1.0, 1.0]] and multi.classes == ["cat", "dog"]
    ints = resolve(f"csv:{tmp_path / 'ints.csv'}")
    assert ints.num_classes == 6
    count_opens.clear()
    draw(ints, 3, seed=0).tensor(8, 1)
    assert len(count_opens) == 3
    with pytest.raises(DatasetError, match="no label column"):
        resolve(f"csv:{tmp_path / 'one.csv'}")  # 'diagnosis' is not a known name and not 0/1


def test_splits_disjoint_per_example_and_fixed(npz_pair, image_folder):
    from gsd_cli.data.splits import in_test

    for spec in ("mnist-a", "digits", f"npz:{npz_pair['priv']}"):
        full, tr, te = resolve(spec), resolve(spec + ":train"), resolve(spec + ":test")
        assert len(tr) + len(te) == len(full)
        assert not set(tr.indices) & set(te.indices)
        assert (resolve(spec + ":test").indices == te.indices).all()  # fixed
        keys = full.example_keys()
        assert [in_test(keys[i]) for i in range(len(full))] == [i in set(te.indices) for i in range(len(full))]
        if len(full) > 1000:  # about 20%, not exactly (binomial sd < 1%)
            assert abs(len(te) / len(full) - 0.2) < 0.04
    assert len(resolve("mnist-a")) == 2500  # a plain name keeps its meaning
    # the 12-file fixture happens to put no file in the test part: said, not an empty set
    assert len(resolve(f"folder:{image_folder}:train")) == 12
    with pytest.raises(DatasetError, match="test: empty.*name the train and test sets"):
        resolve(f"folder:{image_folder}:test")
    with pytest.raises(DatasetError, match="no official splits"):
        resolve("digits:val")


def test_datasets_list_and_show_cli(chest_root, capsys):
    rows = {r["name"]: r for r in list_datasets(chest_root)}
    assert rows["chestxray"]["present"] and not rows["cifar10"]["present"] and rows["mnist-a"]["present"]
    assert "texture" in rows["dtd"]["aliases"] and "textures" in rows  # embedded name unchanged
    assert main(["datasets", "list", "--data-root", str(chest_root)]) == 0
    assert "chestxray" in capsys.readouterr().out
    assert main(["datasets", "show", "chestxray:test", "--data-root", str(chest_root)]) == 0
    shown = capsys.readouterr().out
    assert "multilabel: True" in shown and "examples: 2" in shown
    assert main(["datasets", "show", "kagskin", "--data-root", str(chest_root)]) == 2
    err = capsys.readouterr().err
    assert "kagskin" in err and "benign,malignant" in err and "kaggle.com" in err


def test_hf_save_to_disk(tmp_path, count_opens):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    imgs = [Image.fromarray((rng.uniform(size=(9, 9, 3)) * 255).astype(np.uint8)) for _ in range(10)]
    feats = datasets.Features({"img": datasets.Image(), "fine": datasets.ClassLabel(names=["a", "b", "c"])})
    ds = datasets.Dataset.from_dict({"img": imgs, "fine": [i % 3 for i in range(10)]}, features=feats)
    small = datasets.Dataset.from_dict({"img": imgs[:4], "fine": [0, 1, 2, 0]}, features=feats)
    datasets.DatasetDict({"train": ds, "test": small}).save_to_disk(str(tmp_path / "dd"))
    ds.save_to_disk(str(tmp_path / "one"))
    src = resolve(f"hf:{tmp_path / 'dd'}:test")
    assert len(src) == 4 and src.classes == ["a", "b", "c"] and src.labels(range(4)).tolist() == [0, 1, 2, 0]
    assert src.images([1])[0].shape == (9, 9, 3)
    one = resolve(f"hf:{tmp_path / 'one'}")
    assert len(one) == 10
    tr, te = resolve(f"hf:{tmp_path / 'one'}:train"), resolve(f"hf:{tmp_path / 'one'}:test")
    assert len(tr) + len(te) == 10 and not set(tr.indices) & set(te.indices)
    with pytest.raises(DatasetError, match="has splits"):
        resolve(f"hf:{tmp_path / 'dd'}")
