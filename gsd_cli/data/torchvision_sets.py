"""torchvision's datasets under the data root, in torchvision's own on-disk layouts.

``cifar10`` is ``torchvision.datasets.CIFAR10(root)``, and so on: the files are where torchvision puts
them (``ROOT/cifar-10-batches-py/``, ``ROOT/MNIST/raw/``, ``ROOT/train_32x32.mat``...), in the data
root itself or in ``ROOT/<name>/``. ``download=True`` (``--download``) lets torchvision fetch them
where there is internet. Files already on disk are checked for presence, not re-hashed, so copies that
were re-packed still load; a file that cannot be parsed gives a one-line error.

A plain name is every official split together; ``NAME:train``, ``NAME:test`` (``:val`` where the set
has one) select one. Images are produced one index at a time from torchvision's ``__getitem__``, so
file-per-image sets (Flowers102, DTD, GTSRB, EuroSAT) open only the drawn files.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import DatasetError
from .base import ImageSource
from .files import _pil_to_array


@dataclass(frozen=True)
class TVSpec:
    cls: str
    splits: dict  # split name -> constructor keyword arguments
    layout: str  # relative to the data root
    url: str
    kwargs: dict = field(default_factory=dict)
    markers: tuple = ()  # paths under the root whose presence means the set is there (for `datasets list`)


_MNIST_LAYOUT = "{d}/raw/{{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte"
TORCHVISION: dict[str, TVSpec] = {
    "cifar10": TVSpec("CIFAR10", {"train": {"train": True}, "test": {"train": False}},
                      "cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}", "https://www.cs.toronto.edu/~kriz/cifar.html", markers=("cifar-10-batches-py",)),
    "cifar100": TVSpec("CIFAR100", {"train": {"train": True}, "test": {"train": False}},
                       "cifar-100-python/{train,test,meta}", "https://www.cs.toronto.edu/~kriz/cifar.html", markers=("cifar-100-python",)),
    "svhn": TVSpec("SVHN", {"train": {"split": "train"}, "test": {"split": "test"}},
                   "{train,test}_32x32.mat", "http://ufldl.stanford.edu/housenumbers/", markers=("train_32x32.mat", "test_32x32.mat")),
    "mnist": TVSpec("MNIST", {"train": {"train": True}, "test": {"train": False}},
                    _MNIST_LAYOUT.format(d="MNIST"), "http://yann.lecun.com/exdb/mnist/", markers=("MNIST/raw",)),
    "fashionmnist": TVSpec("FashionMNIST", {"train": {"train": True}, "test": {"train": False}},
                           _MNIST_LAYOUT.format(d="FashionMNIST"), "https://github.com/zalandoresearch/fashion-mnist", markers=("FashionMNIST/raw",)),
    "kmnist": TVSpec("KMNIST", {"train": {"train": True}, "test": {"train": False}},
                     _MNIST_LAYOUT.format(d="KMNIST"), "https://github.com/rois-codh/kmnist", markers=("KMNIST/raw",)),
    "qmnist": TVSpec("QMNIST", {"train": {"what": "train"}, "test": {"what": "test"}},
                     "QMNIST/raw/qmnist-{train,test}-{images-idx3-ubyte,labels-idx2-int}", "https://github.com/facebookresearch/qmnist", markers=("QMNIST/raw",)),
    "emnist": TVSpec("EMNIST", {"train": {"train": True}, "test": {"train": False}},
                     "EMNIST/raw/emnist-balanced-{train,test}-{images-idx3,labels-idx1}-ubyte (the 'balanced' split, 47 classes)",
                     "https://www.nist.gov/itl/products-and-services/emnist-dataset", {"split": "balanced"}, markers=("EMNIST/raw",)),
    "stl10": TVSpec("STL10", {"train": {"split": "train"}, "test": {"split": "test"}},
                    "stl10_binary/{train,test}_{X,y}.bin", "https://cs.stanford.edu/~acoates/stl10/", markers=("stl10_binary",)),
    "flowers102": TVSpec("Flowers102", {"train": {"split": "train"}, "val": {"split": "val"}, "test": {"split": "test"}},
                         "flowers-102/{jpg/,imagelabels.mat,setid.mat}", "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/", markers=("flowers-102",)),
    "dtd": TVSpec("DTD", {"train": {"split": "train"}, "val": {"split": "val"}, "test": {"split": "test"}},
                  "dtd/dtd/{images/,labels/}", "https://www.robots.ox.ac.uk/~vgg/data/dtd/", markers=("dtd/dtd",)),
    "gtsrb": TVSpec("GTSRB", {"train": {"split": "train"}, "test": {"split": "test"}},
                    "gtsrb/GTSRB/{Training/,Final_Test/Images/}, gtsrb/GT-final_test.csv", "https://benchmark.ini.rub.de/gtsrb_dataset.html", markers=("gtsrb/GTSRB",)),
    "usps": TVSpec("USPS", {"train": {"train": True}, "test": {"train": False}},
                   "{usps.bz2,usps.t.bz2}", "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html#usps", markers=("usps.bz2", "usps.t.bz2")),
}
#: Other names users write for the same sets.
TORCHVISION_ALIASES = {"fmnist": "fashionmnist", "fashion-mnist": "fashionmnist", "flower": "flowers102",
                       "flowers": "flowers102", "texture": "dtd", "cifar-10": "cifar10", "cifar-100": "cifar100"}

_lock = threading.Lock()


@contextlib.contextmanager
def _presence_only(cls):
    """While files already on disk are opened, check that they exist rather than their MD5."""
    module = sys.modules[cls.__module__]
    if not hasattr(module, "check_integrity"):
        yield
        return
    from unittest import mock  # here, not at the top: it imports asyncio (~25 ms on every `gsd` start)

    with _lock, mock.patch.object(module, "check_integrity", lambda fpath, md5=None: os.path.isfile(fpath)):
        yield


def _targets(ds) -> np.ndarray:
    for attr in ("targets", "labels", "_labels"):
        y = getattr(ds, attr, None)
        if y is not None:
            y = np.asarray(y)
            return (y[:, 0] if y.ndim == 2 else y).astype(np.int64)  # QMNIST keeps 8 columns, class first
    samples = getattr(ds, "_samples", None)
    if samples is not None:
        return np.asarray([t for _, t in samples], dtype=np.int64)
    raise DatasetError(f"{type(ds).__name__}: cannot find its labels")


class TorchvisionSource(ImageSource):
    """One or more splits of a torchvision dataset, opened by index."""

    def __init__(self, name: str, parts: Sequence, num_classes: int, classes: Sequence[str], layout: str, root: Path,
                 splits: Sequence[str] = ()):
        self.name = name
        self.splits = list(splits)  # the official splits it holds (what overlap checks compare)
        self._parts = list(parts)
        self._y = np.concatenate([_targets(p) for p in self._parts]) if self._parts else np.zeros(0, np.int64)
        self._offsets = np.cumsum([0] + [len(p) for p in self._parts])
        self.num_classes = int(num_classes)
        self.classes = list(classes)
        self.layout = layout
        self.root = str(root)
        self.description = f"torchvision {type(self._parts[0]).__name__} from {root}"

    def __len__(self) -> int:
        return int(self._offsets[-1])

    def labels(self, indices: Sequence[int]) -> np.ndarray:
        return self._y[np.asarray(indices, dtype=np.int64)]

    def images(self, indices: Sequence[int]) -> list[np.ndarray]:
        out = []
        for i in np.asarray(indices, dtype=np.int64):
            part = int(np.searchsorted(self._offsets, i, side="right")) - 1
            img = self._parts[part][int(i - self._offsets[part])][0]
            out.append(_pil_to_array(img))
        return out

    def describe(self) -> dict:
        d = super().describe()
        d.update(layout=self.layout, root=self.root, class_names=self.classes)
        if len(self):
            d["image_size"] = list(self.images([0])[0].shape)
        return d


def import_torchvision(module: str = "torchvision.datasets"):
    """``module`` of torchvision, or a one-line :class:`GSDError` saying that torchvision failed to import
    and why (a torchvision built for another torch, e.g. a CUDA build beside a CPU torch), never a
    later, misleading error such as "no images found"."""
    import importlib

    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 - ImportError, or RuntimeError/OSError of a mismatched build
        import torch

        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise DatasetError(f"torchvision failed to import ({type(e).__name__}: {first}); install the torchvision build "
                           f"that matches torch {torch.__version__} (same version pairing and CPU/CUDA variant)") from None


def torchvision_source(key: str, split: str | None, root: Path, download: bool = False, name: str | None = None) -> ImageSource:
    """``key`` (a name of :data:`TORCHVISION`) under ``root`` or ``root/key``; ``split`` None = all."""
    tvd = import_torchvision("torchvision.datasets")

    spec = TORCHVISION[key]
    name = name or (key if split is None else f"{key}:{split}")
    if split is not None and split not in spec.splits:
        raise DatasetError(f"{key} has splits {', '.join(spec.splits)}; use {key}:{next(iter(spec.splits))}")
    cls = getattr(tvd, spec.cls)
    wanted = list(spec.splits) if split is None else [split]
    where = [root] if download else [root, root / key]
    last = ""
    for base in where:
        try:
            parts = []
            for s in wanted:
                kw = dict(spec.kwargs, **spec.splits[s])
                if download:
                    parts.append(cls(str(base), download=True, **kw))
                else:
                    with _presence_only(cls):
                        parts.append(cls(str(base), download=False, **kw))
        except RuntimeError as e:  # torchvision: "Dataset not found ..."
            last = str(e).splitlines()[0] if str(e) else type(e).__name__
            continue
        except ImportError as e:
            raise DatasetError(f"{name}: torchvision needs {e.name} to read it; pip install {e.name}") from None
        except Exception as e:  # unpickling, .mat or idx parse errors: the files are there but malformed
            raise DatasetError(
                f"{name}: cannot read the files under {base} ({type(e).__name__}: {str(e)[:80]}); "
                f"expected {base}/{spec.layout} as published at {spec.url}"
            ) from None
        classes = getattr(parts[0], "classes", None) or [str(c) for c in range(int(max(_targets(p).max(initial=-1) for p in parts)) + 1)]
        return TorchvisionSource(name, parts, len(classes), [str(c) for c in classes], spec.layout, base, wanted)
    raise DatasetError(
        f"{name}: not found in {root} or {root / key} ({last}); expected ROOT/{spec.layout} "
        f"as published at {spec.url}; add --download to fetch it, or set --data-root"
    )
