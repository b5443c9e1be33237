"""A map-style torch Dataset as a source (gsd_cli.data.from_torch_dataset) and in gsd_cli.rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import gsd_cli
from gsd_cli.data import ArraySource, draw, from_torch_dataset, require_declared_classes, resolve
from gsd_cli.data.splits import in_test
from gsd_cli.errors import DatasetError

FAST = dict(examples=30, k=4, model="fmnist-cnn", device="cpu", engine="hooks")


class Images(torch.utils.data.Dataset):
    """``n`` grey 12x12 images returned as ``kind``: CHW float tensors, uint8 tensors, PIL or numpy."""

    def __init__(self, n=40, seed=0, kind="float", classes=None, targets=False, shift=0.0):
        rng = np.random.default_rng(seed)
        self.x = np.clip(rng.uniform(size=(n, 12, 12)) * (1 - shift) + shift, 0, 1).astype(np.float32)
        self.y = rng.integers(0, 3, n)
        self.kind = kind
        if classes is not None:
            self.classes = classes
        if targets:
            self.targets = [int(v) for v in self.y]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        if self.kind == "float":
            img = torch.from_numpy(x)[None]  # 1 x H x W, as ToTensor gives
        elif self.kind == "uint8":
            img = torch.from_numpy(np.round(x * 255).astype(np.uint8))[None]
        elif self.kind == "pil":
            img = Image.fromarray(np.round(x * 255).astype(np.uint8), mode="L")
        elif self.kind == "normalized":
            img = (torch.from_numpy(x)[None] - 0.5) / 0.25
        else:
            img = x
        return img, int(self.y[i])


@pytest.mark.parametrize("kind,atol", [("float", 0), ("numpy", 0), ("uint8", 0.5 / 255 + 1e-7), ("pil", 0.5 / 255 + 1e-7)])
def test_images_come_back_as_arrays_in_0_1(kind, atol):
    ds = Images(kind=kind)
    src = from_torch_dataset(ds, "t", num_classes=3)
    imgs = src.images([0, 5])
    assert all(i.shape == (12, 12) and i.dtype == np.float32 for i in imgs)
    np.testing.assert_allclose(np.stack(imgs), ds.x[[0, 5]], rtol=0, atol=atol)
    np.testing.assert_array_equal(src.labels([0, 5, 7]), ds.y[[0, 5, 7]])


def test_channels_first_colour_tensor():
    class Colour(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.arange(3 * 4 * 5, dtype=torch.float32).reshape(3, 4, 5) / 60, 0

    img = from_torch_dataset(Colour(), "c", num_classes=2).images([1])[0]
    assert img.shape == (4, 5, 3) and img[0, 1, 2] == pytest.approx((2 * 20 + 1) / 60)


def test_normalized_images_are_refused_with_a_hint():
    with pytest.raises(DatasetError, match="outside \\[0, 1\\].*Normalize"):
        from_torch_dataset(Images(kind="normalized"), "n", num_classes=3).images([0])


def test_classes_declared_or_read_off_the_labels():
    assert from_torch_dataset(Images(), "a", num_classes=3).classes_declared
    named = from_torch_dataset(Images(classes=["x", "y", "z"]), "b")  # the dataset's own list (torchvision's)
    assert named.classes_declared and named.num_classes == 3 and named.classes == ["x", "y", "z"]
    bare = from_torch_dataset(Images(), "c")
    assert not bare.classes_declared and bare.num_classes == int(Images().y.max()) + 1
    with pytest.raises(DatasetError, match="declares no class list"):
        require_declared_classes(bare)
    with pytest.raises(DatasetError, match="a label is 2, outside its 2 classes"):
        from_torch_dataset(Images(), "d", num_classes=2).labels(range(40))


def test_targets_are_used_without_reading_images():
    class NoImages(Images):
        def __getitem__(self, i):
            raise AssertionError("an image was read")

    ds = NoImages(targets=True)
    np.testing.assert_array_equal(from_torch_dataset(ds, "t", num_classes=3).labels(range(40)), ds.y)


def test_a_failing_getitem_is_a_one_line_error():
    class Broken(Images):
        def __getitem__(self, i):
            raise FileNotFoundError(f"/data/{i}.png")

    src = from_torch_dataset(Broken(), "b", num_classes=3, multilabel=False)
    with pytest.raises(DatasetError, match=r"b: ds\[4\] failed \(FileNotFoundError: /data/4.png\)"):
        src.images([4])


def test_used_as_given_unless_a_split_is_asked_for():
    ds = Images(n=60)
    keys = [f"img-{i}" for i in range(60)]
    whole = from_torch_dataset(ds, "t", num_classes=3)
    assert len(whole) == 60
    test = from_torch_dataset(ds, "t", num_classes=3, keys=keys, split="test")
    assert test.name == "t:test"
    assert [keys[i] for i in test.indices] == [k for k in keys if in_test(k)]
    # removing an example (by its id) moves no other: an index hash would shift every later one
    fewer = Images(n=60)
    fewer.x, fewer.y = np.delete(fewer.x, 3, 0), np.delete(fewer.y, 3)
    kept = keys[:3] + keys[4:]
    test2 = from_torch_dataset(fewer, "t", num_classes=3, keys=kept, split="test")
    assert [kept[i] for i in test2.indices] == [k for k in keys if in_test(k) and k != "img-3"]
    # groups: a patient's examples stay together
    groups = [f"P{i // 4}" for i in range(60)]
    train = from_torch_dataset(ds, "t", num_classes=3, groups=groups, split="train")
    assert {groups[i] for i in train.indices} == {g for g in set(groups) if not in_test(g)}


def test_rank_matches_the_same_images_as_an_array_source():
    ds, pub = Images(n=40, seed=0), Images(n=40, seed=1)
    r_torch = gsd_cli.rank(from_torch_dataset(ds, "priv", num_classes=3), {"pub": pub, "noise": "noise"}, **FAST)
    r_array = gsd_cli.rank(ArraySource("priv", ds.x, ds.y, 3), [ArraySource("pub", pub.x, pub.y, 3), "noise"], **FAST)
    assert {r.public: r.distance for r in r_torch} == {r.public: r.distance for r in r_array}


def test_rank_takes_datasets_directly_and_wants_distinct_names():
    r = gsd_cli.rank(Images(seed=0), {"near": Images(seed=1), "far": Images(seed=2, shift=0.9)}, **FAST)
    assert r.to_dict()["private"] == "torch:Images" and {x.public for x in r} == {"near", "far"}
    with pytest.raises(DatasetError, match="two datasets are named 'torch:Images'"):
        gsd_cli.rank(Images(seed=0), [Images(seed=1)], **FAST)
    with pytest.raises(DatasetError, match="'x' is the dataset name 'noise'"):
        gsd_cli.rank(Images(seed=0), {"x": "noise"}, **FAST)


def test_resolve_and_draw_accept_a_dataset():
    src = resolve(Images())
    assert src.name == "torch:Images" and len(draw(src, m=10, seed=0)) == 10


def test_train_settings_record_a_source_by_name():
    from gsd_cli.train.config import TrainConfig

    d = TrainConfig(private=from_torch_dataset(Images(), "mine", num_classes=3)).to_dict()
    assert d["private"] == "mine" and d["private_test"] is None


def test_gep_training_with_a_public_source_object_records_its_name(tiny, tmp_path):
    """TrainConfig(public=<ImageSource>) trains and writes summary.json (it crashed in json.dumps)."""
    import json

    from gsd_cli.train import TrainConfig, train

    public = resolve(tiny["public"])
    s = train(TrainConfig(private=tiny["private"], public=public, method="gep", epsilon=3.0, epochs=1, batch_size=30,
                          k=4, public_examples=10, insecure_seed=1, physical_batch=64), tmp_path / "run")
    assert s["public"] == public.name
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["public"] == public.name
