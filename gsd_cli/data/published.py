"""Datasets as their publishers distribute them, under the data root.

* ``chestxray``: NIH ChestX-ray14. ``Data_Entry_2017_v2020.csv`` (the 2020 revision, preferred) or
  ``Data_Entry_2017.csv``; column ``Image Index`` names the PNG, ``Finding Labels`` lists findings
  separated by ``|``. 14 findings, multi-label; ``No Finding`` is the all-zero row. Images in
  ``images/`` or in the published parts ``images_001/images/`` .. ``images_012/images/``. Splits from
  the official ``train_val_list.txt`` (``:train``) and ``test_list.txt`` (``:test``) when present
  (patient-wise: no patient on both sides), else the per-example hash split of :mod:`.splits` on the
  image name. Rows whose PNG is not on disk are left out (``describe()`` says how many).
* ``kagchest``: Kaggle "Chest X-Ray Images (Pneumonia)": ``chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}``.
* ``ham10000``: ``HAM10000_metadata.csv`` (column ``image_id`` names ``ISIC_*.jpg``, column ``dx`` the
  class among akiec, bcc, bkl, df, mel, nv, vasc); images in ``HAM10000_images_part_1/`` and
  ``HAM10000_images_part_2/`` (any case). No official split: ``:train``/``:test`` split the *lesions*
  (``lesion_id``): a lesion is in ``:test`` iff the hash of its id is below 0.2 (:func:`.splits.in_test`;
  a lesion's images share its id as their identity), so one lesion's images are never on both sides,
  and adding or removing one image or lesion moves no other (a stratified partition would move many;
  see :mod:`.splits`).
* ``kagskin``: Kaggle "Skin Cancer: Malignant vs. Benign": ``{train,test}/{benign,malignant}`` (also
  under ``data/``).
* ``mnist_m``: MNIST-M as commonly distributed: ``mnist_m_{train,test}/`` PNGs with
  ``mnist_m_{train,test}_labels.txt`` (lines ``00000000.png 5``), or ``{train,test}/<digit>/`` folders.

Each is looked for in ``ROOT/<name>`` (and the publishers' own folder names, listed in
:data:`FOLDERS`) and then in ``ROOT`` itself. Only the drawn files are opened. Hidden files (``._*``
of macOS, ``.DS_Store``, ``Thumbs.db``, any dot-file) are never taken for images. The CSVs are read
as UTF-8 with or without a byte-order mark.

Where a listed image is not on disk (ChestX-ray14's CSV with only some ``images_*`` parts unpacked)
the row is left out and the source records a note saying how many are there (:func:`notes_of`):
the library emits no warnings of its own, the CLI prints each note as one ``warning:`` line.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import DatasetError
from .base import ImageSource
from .files import FileListSource, is_hidden
from .splits import TEST_FRACTION, SubsetSource, fixed_split

IMAGE_EXT = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".ppm", ".webp")

CHEST_FINDINGS = (
    "Atelectasis", "Cardiomegaly", "Effusion", "Infiltration", "Mass", "Nodule", "Pneumonia", "Pneumothorax",
    "Consolidation", "Edema", "Emphysema", "Fibrosis", "Pleural_Thickening", "Hernia",
)
HAM_CLASSES = ("akiec", "bcc", "bkl", "df", "mel", "nv", "vasc")

FOLDERS = {
    "chestxray": ("chestxray", "ChestX-ray14", "chestx-ray14", "chestxray14", "CXR8", "NIH", "nih-chest-xrays"),
    "kagchest": ("kagchest/chest_xray", "kagchest", "chest_xray", "chest-xray-pneumonia/chest_xray", "chest-xray-pneumonia"),
    "ham10000": ("ham10000", "HAM10000", "skin-cancer-mnist-ham10000"),
    "kagskin": ("kagskin/data", "kagskin", "skin-cancer-malignant-vs-benign/data", "skin-cancer-malignant-vs-benign"),
    "mnist_m": ("mnist_m", "mnist-m", "MNIST-M", "mnistm"),
}
LAYOUTS = {
    "chestxray": "Data_Entry_2017[_v2020].csv + images/*.png or images_001..012/images/*.png [+ train_val_list.txt, test_list.txt]",
    "kagchest": "chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}/*.jpeg",
    "ham10000": "HAM10000_metadata.csv + HAM10000_images_part_1/*.jpg + HAM10000_images_part_2/*.jpg",
    "kagskin": "{train,test}/{benign,malignant}/*.jpg",
    "mnist_m": "mnist_m_{train,test}/*.png + mnist_m_{train,test}_labels.txt, or {train,test}/<digit>/*.png",
}
URLS = {
    "chestxray": "https://nihcc.app.box.com/v/ChestXray-NIHCC (also kaggle.com/datasets/nih-chest-xrays/data)",
    "kagchest": "https://www.kaggle.com/datasets/paultimothymooney/chest-xray-pneumonia",
    "ham10000": "https://doi.org/10.7910/DVN/DBW86T (also kaggle.com/datasets/kmader/skin-cancer-mnist-ham10000)",
    "kagskin": "https://www.kaggle.com/datasets/fanconic/skin-cancer-malignant-vs-benign",
    "mnist_m": "http://yaroslav.ganin.net (as distributed e.g. in github.com/fungtion/DANN)",
}


def _missing(key: str, root: Path, detail: str = "") -> DatasetError:
    looked = ", ".join(str(root / f) for f in FOLDERS[key][:2]) + f" and {root}"
    return DatasetError(
        f"{key}: {detail or 'not found'} (looked in {looked}); expected {LAYOUTS[key]} as published at {URLS[key]}; "
        f"set --data-root or name the folder in a catalogue"
    )


def _candidates(key: str, root: Path, exact: bool) -> list[Path]:
    return [root] if exact else [root / f for f in FOLDERS[key]] + [root]


def notes_of(source: ImageSource) -> list[str]:
    """The notes a source (or the source it is a part of: a split, a re-classed set) recorded when it
    was read, such as how many listed images are missing; the caller decides how to show them."""
    notes, seen = [], set()
    while source is not None and id(source) not in seen:
        seen.add(id(source))
        notes += [n for n in getattr(source, "notes", ()) if n not in notes]
        source = getattr(source, "parent", None)
    return notes


def _present_note(source: ImageSource, present: int, total: int, listed_in: str, where: Path) -> None:
    """Record on ``source`` that only ``present`` of the ``total`` images listed are on disk."""
    if present < total:
        source.notes = [f"{source.name}: only {present:,} of the {total:,} images listed in {listed_in} are in {where} "
                        f"({100 * present / total:.2g}%); the {total - present:,} others are left out"]


def _images_in(folder: Path) -> list[Path]:
    return sorted(Path(e.path) for e in os.scandir(folder)
                  if e.is_file() and not is_hidden(e.name) and e.name.lower().endswith(IMAGE_EXT))


def _class_folders(base: Path, split_dirs: list[str], classes: tuple[str, ...], name: str, key: str, root: Path, layout: str, descr: str) -> FileListSource:
    files, labels = [], []
    for sd in split_dirs:
        for c, cls in enumerate(classes):
            folder = base / sd / cls
            if not folder.is_dir():
                raise _missing(key, root, f"folder {folder} is missing")
            found = _images_in(folder)
            files += found
            labels += [c] * len(found)
    if not files:
        raise _missing(key, root, f"no images under {base}")
    return FileListSource(name, files, np.asarray(labels, dtype=np.int64), classes, descr, layout, base)


# --- ChestX-ray14 -----------------------------------------------------------------------------------

def chestxray(split: str | None, root: Path, exact: bool = False, name: str | None = None) -> ImageSource:
    name = name or ("chestxray" if split is None else f"chestxray:{split}")
    for base in _candidates("chestxray", root, exact):
        csv_file = next((base / f for f in ("Data_Entry_2017_v2020.csv", "Data_Entry_2017.csv") if (base / f).is_file()), None)
        if csv_file is not None:
            break
    else:
        raise _missing("chestxray", root, "no Data_Entry_2017.csv or Data_Entry_2017_v2020.csv")
    where: dict[str, str] = {}
    for folder in [base / "images", *sorted(base.glob("images_*/images")), *sorted(p for p in base.glob("images_*") if p.is_dir())]:
        if folder.is_dir():
            for e in os.scandir(folder):
                if e.name.lower().endswith(".png") and not is_hidden(e.name):
                    where.setdefault(e.name, e.path)
    index = {f: i for i, f in enumerate(CHEST_FINDINGS)}
    files, rows, names = [], [], []
    with open(csv_file, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or "Image Index" not in reader.fieldnames or "Finding Labels" not in reader.fieldnames:
            raise _missing("chestxray", root, f"{csv_file} has no 'Image Index' and 'Finding Labels' columns")
        total = 0
        for r in reader:
            total += 1
            file = where.get(r["Image Index"])
            if file is None:
                continue
            y = np.zeros(len(CHEST_FINDINGS), dtype=np.float32)
            for finding in r["Finding Labels"].split("|"):
                finding = finding.strip()
                if finding == "No Finding":
                    continue
                if finding not in index:
                    raise _missing("chestxray", root, f"{csv_file}: unknown finding {finding!r} for {r['Image Index']}")
                y[index[finding]] = 1.0
            files.append(file)
            rows.append(y)
            names.append(r["Image Index"])
    if not files:
        raise _missing("chestxray", root, f"{csv_file} lists {total} images but none of them is in {base}/images or {base}/images_*/images")
    full = FileListSource(
        "chestxray", files, np.stack(rows), CHEST_FINDINGS,
        f"NIH ChestX-ray14 from {base} ({len(files)} of {total} rows of {csv_file.name} have their PNG)",
        LAYOUTS["chestxray"], base, keys=names,  # an image's identity: its published name, wherever it lies
    )
    _present_note(full, len(files), total, csv_file.name, base)
    if split is None:
        full.name = name
        return full
    lists = {"train": base / "train_val_list.txt", "test": base / "test_list.txt"}
    if split not in lists:
        raise DatasetError(f"chestxray has splits train (train_val_list.txt) and test (test_list.txt); not :{split}")
    if not all(p.is_file() for p in lists.values()):
        return fixed_split(full, split, name)
    wanted = set(lists[split].read_text().split())
    keep = [i for i, n in enumerate(names) if n in wanted]
    if not keep:
        raise _missing("chestxray", root, f"none of the images of {lists[split].name} is on disk")
    return SubsetSource(full, keep, name, description=f"{full.description} [{split}: official {lists[split].name}]")


# --- Kaggle folders ---------------------------------------------------------------------------------

def kagchest(split: str | None, root: Path, exact: bool = False, name: str | None = None) -> ImageSource:
    name = name or ("kagchest" if split is None else f"kagchest:{split}")
    splits = ("train", "val", "test")
    if split is not None and split not in splits:
        raise DatasetError(f"kagchest has splits train, val, test; not :{split}")
    for base in _candidates("kagchest", root, exact):
        if any((base / s / "NORMAL").is_dir() for s in splits):
            break
    else:
        raise _missing("kagchest", root)
    have = [s for s in splits if (base / s).is_dir()] if split is None else [split]
    return _class_folders(base, have, ("NORMAL", "PNEUMONIA"), name, "kagchest", root, LAYOUTS["kagchest"],
                          f"Kaggle chest X-ray pneumonia from {base} ({'+'.join(have)})")


def kagskin(split: str | None, root: Path, exact: bool = False, name: str | None = None) -> ImageSource:
    name = name or ("kagskin" if split is None else f"kagskin:{split}")
    splits = ("train", "test")
    if split is not None and split not in splits:
        raise DatasetError(f"kagskin has splits train, test; not :{split}")
    for base in _candidates("kagskin", root, exact):
        if any((base / s / "benign").is_dir() for s in splits):
            break
    else:
        raise _missing("kagskin", root)
    have = [s for s in splits if (base / s).is_dir()] if split is None else [split]
    return _class_folders(base, have, ("benign", "malignant"), name, "kagskin", root, LAYOUTS["kagskin"],
                          f"Kaggle skin cancer malignant vs benign from {base} ({'+'.join(have)})")


# --- HAM10000 ---------------------------------------------------------------------------------------

def ham10000(split: str | None, root: Path, exact: bool = False, name: str | None = None) -> ImageSource:
    name = name or ("ham10000" if split is None else f"ham10000:{split}")
    for base in _candidates("ham10000", root, exact):
        if (base / "HAM10000_metadata.csv").is_file():
            break
    else:
        raise _missing("ham10000", root, "no HAM10000_metadata.csv")
    where: dict[str, str] = {}
    for folder in sorted(p for p in base.iterdir() if p.is_dir() and p.name.lower().startswith("ham10000_images")):
        for e in os.scandir(folder):
            if e.name.lower().endswith(".jpg") and not is_hidden(e.name):
                where.setdefault(e.name[:-4], e.path)
    files, labels, lesions, total = [], [], [], 0
    with open(base / "HAM10000_metadata.csv", newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        if not reader.fieldnames or not {"image_id", "dx"} <= set(reader.fieldnames):
            raise _missing("ham10000", root, "HAM10000_metadata.csv has no 'image_id' and 'dx' columns")
        for r in reader:
            total += 1
            if r["dx"] not in HAM_CLASSES:
                raise _missing("ham10000", root, f"HAM10000_metadata.csv: unknown dx {r['dx']!r} for {r['image_id']}")
            if r["image_id"] in where:
                files.append(where[r["image_id"]])
                labels.append(HAM_CLASSES.index(r["dx"]))
                lesions.append(r.get("lesion_id") or r["image_id"])
    if not files:
        raise _missing("ham10000", root, f"HAM10000_metadata.csv lists {total} images but none is in {base}/HAM10000_images_part_*")
    full = FileListSource("ham10000", files, np.asarray(labels, dtype=np.int64), HAM_CLASSES,
                          f"HAM10000 from {base} ({len(files)} of {total} metadata rows have their JPG)", LAYOUTS["ham10000"], base,
                          keys=lesions)  # one lesion's images share its key, so any hash split keeps them together
    _present_note(full, len(files), total, "HAM10000_metadata.csv", base)
    if split is None:
        full.name = name
        return full
    if split not in ("train", "test"):
        raise DatasetError(f"ham10000 has :train and :test (a per-lesion hash split); not :{split}")
    part = fixed_split(full, split, name)
    part.description = f"{full.description} [{split}: per-lesion hash split, ~{int(TEST_FRACTION * 100)}% test]"
    return part


# --- MNIST-M ----------------------------------------------------------------------------------------

def mnist_m(split: str | None, root: Path, exact: bool = False, name: str | None = None) -> ImageSource:
    name = name or ("mnist_m" if split is None else f"mnist_m:{split}")
    if split is not None and split not in ("train", "test"):
        raise DatasetError(f"mnist_m has splits train, test; not :{split}")
    wanted = ["train", "test"] if split is None else [split]
    classes = tuple(str(d) for d in range(10))
    for base in _candidates("mnist_m", root, exact):
        if any((base / f"mnist_m_{s}_labels.txt").is_file() for s in wanted):
            files, labels = [], []
            for s in wanted:
                lab = base / f"mnist_m_{s}_labels.txt"
                if not lab.is_file():
                    if split is None:
                        continue
                    raise _missing("mnist_m", root, f"{lab} is missing")
                for n, line in enumerate(lab.read_text().splitlines(), 1):
                    if not line.strip():
                        continue
                    parts = line.split()
                    if len(parts) != 2 or not parts[1].isdigit():
                        raise _missing("mnist_m", root, f"{lab}:{n} is not 'FILE LABEL'")
                    files.append(base / f"mnist_m_{s}" / parts[0])
                    labels.append(int(parts[1]))
            return FileListSource(name, files, np.asarray(labels, dtype=np.int64), classes,
                                  f"MNIST-M from {base}", LAYOUTS["mnist_m"], base)
        if any((base / s / "0").is_dir() for s in wanted):
            have = [s for s in wanted if (base / s).is_dir()]
            return _class_folders(base, have, classes, name, "mnist_m", root, LAYOUTS["mnist_m"], f"MNIST-M from {base}")
    raise _missing("mnist_m", root)


PUBLISHED: dict[str, Callable[..., ImageSource]] = {
    "chestxray": chestxray, "kagchest": kagchest, "ham10000": ham10000, "kagskin": kagskin, "mnist_m": mnist_m,
}
PUBLISHED_ALIASES = {"mnist-m": "mnist_m", "mnistm": "mnist_m", "ham": "ham10000", "chestx-ray14": "chestxray"}
