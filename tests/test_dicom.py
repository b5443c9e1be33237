"""DICOM input (gsd_cli.data.dicom): files written here with pydicom, read through folder: and csv:.

Expected values are computed in the tests from the DICOM standard's formulas (PS3.3 C.11.2.1.2.1 for
LINEAR windows), not by calling the code under test."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pydicom = pytest.importorskip("pydicom")

from pydicom.dataset import Dataset, FileMetaDataset  # noqa: E402
from pydicom.uid import ExplicitVRLittleEndian, JPEGLSLossless, SecondaryCaptureImageStorage, generate_uid  # noqa: E402

from gsd_cli.data import describe_dataset, draw, resolve  # noqa: E402
from gsd_cli.data.check import check_datasets  # noqa: E402
from gsd_cli.data.dicom import read_dicom  # noqa: E402
from gsd_cli.errors import DatasetError  # noqa: E402


def write_dicom(path, pixels, photometric="MONOCHROME2", bits_stored=None, window=None, rescale=None, signed=False,
                voi_lut=None, syntax=ExplicitVRLittleEndian, pixel_data=True, preamble=True):
    """A minimal secondary-capture DICOM file holding ``pixels`` (frames x H x W, H x W or H x W x 3)."""
    arr = np.asarray(pixels)
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = syntax
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.PatientID = "P0"
    colour = photometric == "RGB"
    ds.SamplesPerPixel = 3 if colour else 1
    if colour:
        ds.PlanarConfiguration = 0
    ds.PhotometricInterpretation = photometric
    ds.Rows, ds.Columns = arr.shape[-3:-1] if colour else arr.shape[-2:]
    if arr.ndim == (4 if colour else 3):
        ds.NumberOfFrames = arr.shape[0]
    ds.BitsAllocated = arr.dtype.itemsize * 8
    ds.BitsStored = bits_stored or ds.BitsAllocated
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = 1 if signed else 0
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    if rescale is not None:
        ds.RescaleSlope, ds.RescaleIntercept = rescale
    if voi_lut is not None:
        item = Dataset()
        item.LUTDescriptor = [len(voi_lut), 0, 8]
        item.add_new(0x00283006, "US", [int(v) for v in voi_lut])  # LUT Data (VR US or OW: say which)
        ds.VOILUTSequence = [item]
    if pixel_data is True:
        ds.PixelData = arr.tobytes()
    elif pixel_data is not None:
        ds.PixelData = pixel_data
        ds["PixelData"].VR = "OB"
    ds.save_as(path, enforce_file_format=True)
    if not preamble:
        path.write_bytes(path.read_bytes()[132:])
    return path


def _linear_window(v, center, width):
    """PS3.3 C.11.2.1.2.1 (LINEAR), output in [0, 1]."""
    c, w = center - 0.5, width - 1
    return np.where(v <= c - w / 2, 0.0, np.where(v > c + w / 2, 1.0, (v - c) / w + 0.5))


def test_16_bit_values_one_apart_stay_distinct(tmp_path):
    px = np.array([[1000, 1001], [0, 65535]], dtype=np.uint16)
    img = read_dicom(write_dicom(tmp_path / "a.dcm", px), "t")
    assert img.dtype == np.float32 and img.shape == (2, 2)
    np.testing.assert_allclose(img, px / 65535.0, rtol=0, atol=1e-7)
    assert img[0, 1] > img[0, 0]  # kept apart at full depth...
    assert round(1000 / 65535 * 255) == round(1001 / 65535 * 255)  # ...where 8 bits would have merged them


def test_bits_stored_sets_the_range(tmp_path):
    px = np.array([[0, 1], [2048, 4095]], dtype=np.uint16)
    img = read_dicom(write_dicom(tmp_path / "a.dcm", px, bits_stored=12), "t")
    np.testing.assert_allclose(img, px / 4095.0, atol=1e-7)


def test_monochrome1_is_the_inverse_of_monochrome2(tmp_path):
    px = np.array([[0, 60], [200, 255]], dtype=np.uint8)
    m2 = read_dicom(write_dicom(tmp_path / "m2.dcm", px), "t")
    m1 = read_dicom(write_dicom(tmp_path / "m1.dcm", px, photometric="MONOCHROME1"), "t")
    np.testing.assert_allclose(m2, px / 255.0, atol=1e-7)
    np.testing.assert_allclose(m1, 1.0 - px / 255.0, atol=1e-7)


def test_window_from_the_file_is_applied(tmp_path):
    px = np.array([[0, 90, 100, 110], [120, 130, 150, 255]], dtype=np.uint8)
    img = read_dicom(write_dicom(tmp_path / "w.dcm", px, window=(110, 41)), "t")
    np.testing.assert_allclose(img, _linear_window(px.astype(float), 110, 41), atol=1e-6)
    plain = read_dicom(write_dicom(tmp_path / "p.dcm", px), "t")
    assert not np.allclose(img, plain)


def test_rescale_then_window_in_hounsfield_units(tmp_path):
    """CT: signed stored values, HU = stored + (-1024), a soft-tissue window (40, 400)."""
    hu = np.array([[-1024, -200, -160], [40, 240, 3000]])
    px = (hu + 1024).astype(np.int16)
    img = read_dicom(write_dicom(tmp_path / "ct.dcm", px, signed=True, rescale=(1, -1024), window=(40, 400)), "t")
    np.testing.assert_allclose(img, _linear_window(hu.astype(float), 40, 400), atol=1e-6)
    # no window: the stored range (signed 16 bits) after the rescale maps to [0, 1]
    raw = read_dicom(write_dicom(tmp_path / "ct2.dcm", px, signed=True, rescale=(1, -1024)), "t")
    lo, hi = -32768 - 1024, 32767 - 1024
    np.testing.assert_allclose(raw, (hu - lo) / (hi - lo), atol=1e-6)


def test_voi_lut_sequence(tmp_path):
    px = np.array([[0, 10], [100, 255]], dtype=np.uint8)
    img = read_dicom(write_dicom(tmp_path / "lut.dcm", px, voi_lut=255 - np.arange(256)), "t")
    np.testing.assert_allclose(img, (255 - px) / 255.0, atol=1e-7)


def test_rgb(tmp_path):
    px = np.random.default_rng(0).integers(0, 256, (3, 4, 3), dtype=np.uint8)
    img = read_dicom(write_dicom(tmp_path / "rgb.dcm", px, photometric="RGB"), "t")
    assert img.shape == (3, 4, 3)
    np.testing.assert_allclose(img, px / 255.0, atol=1e-7)


def _folder(tmp_path, n=4):
    root = tmp_path / "xr"
    rng = np.random.default_rng(0)
    for c in ("normal", "sick"):
        (root / c).mkdir(parents=True)
        for i in range(n):
            name = f"{i}.dcm" if i % 2 else f"1.2.840.{i}"  # a UID-named file, no image extension
            write_dicom(root / c / name, rng.integers(0, 65536, (6, 5), dtype=np.uint16))
    (root / "normal" / "notes").write_text("not an image")
    return root


def test_folder_reads_dcm_and_extensionless_dicom(tmp_path):
    root = _folder(tmp_path)
    src = resolve(f"folder:{root}")
    assert len(src) == 8 and src.classes == ["normal", "sick"]
    assert {k.split("/")[1] for k in src.example_keys()} == {"1.2.840.0", "1.dcm", "1.2.840.2", "3.dcm"}  # not 'notes' 
    x = draw(src, m=8, seed=0).tensor(8, 1)
    assert x.shape == (8, 1, 8, 8)
    assert describe_dataset(f"folder:{root}")["image_size"] == [6, 5]


def test_only_the_drawn_files_are_opened(tmp_path, monkeypatch):
    root = _folder(tmp_path, n=10)
    src = resolve(f"folder:{root}")
    opened = []
    real = pydicom.dcmread
    monkeypatch.setattr(pydicom, "dcmread", lambda f, *a, **k: (opened.append(str(f)), real(f, *a, **k))[1])
    sample = draw(src, m=3, seed=1)
    sample.tensor(8, 1)
    assert sorted(opened) == sorted(src.example_file(int(i)) for i in sample.indices)


def test_csv_rows_naming_dicom_files(tmp_path):
    root = _folder(tmp_path)
    rows = ["file,label"] + [f"{p.relative_to(tmp_path).as_posix()},{p.parent.name}" for p in sorted(root.rglob("*"))
                             if p.is_file() and p.name != "notes"]
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    src = resolve(f"csv:{tmp_path / 'labels.csv'}")
    assert len(src) == 8
    imgs = src.images(range(8))
    assert all(i.shape == (6, 5) and i.dtype == np.float32 for i in imgs)


def test_multi_frame_refused_or_frame_chosen(tmp_path):
    root = tmp_path / "mf"
    (root / "a").mkdir(parents=True)
    frames = np.stack([np.full((4, 4), v, dtype=np.uint8) for v in (10, 20, 30)])
    write_dicom(root / "a" / "cine.dcm", frames)
    write_dicom(root / "a" / "cine2.dcm", frames)
    with pytest.raises(DatasetError, match=r"multi-frame \(3 frames\).*frame="):
        resolve(f"folder:{root}").images([0])
    img = resolve(f"folder:{root}?frame=1").images([0])[0]
    np.testing.assert_allclose(img, 20 / 255.0, atol=1e-7)
    with pytest.raises(DatasetError, match="frame=5"):
        resolve(f"folder:{root}?frame=5").images([0])
    with pytest.raises(DatasetError, match="integer"):
        resolve(f"folder:{root}?frame=x")


def test_bad_files_are_one_line_errors(tmp_path):
    (tmp_path / "fake.dcm").write_bytes(b"not dicom at all" * 20)
    with pytest.raises(DatasetError, match="not a DICOM file"):
        read_dicom(tmp_path / "fake.dcm", "t")
    nopix = write_dicom(tmp_path / "nopix.dcm", np.zeros((2, 2), np.uint8), pixel_data=None)
    with pytest.raises(DatasetError, match="no pixel data"):
        read_dicom(nopix, "t")
    from pydicom.encaps import encapsulate

    jls = write_dicom(tmp_path / "jls.dcm", np.zeros((4, 4), np.uint8), syntax=JPEGLSLossless,
                      pixel_data=encapsulate([b"\xff\xd8\xff\xf7" + b"\0" * 20]))
    with pytest.raises(DatasetError) as e:
        read_dicom(jls, "t")
    msg = str(e.value)
    assert "\n" not in msg and "JPEG-LS" in msg and "pylibjpeg" in msg and "install" in msg


def test_check_flags_a_dcm_without_preamble(tmp_path):
    root = tmp_path / "f"
    (root / "a").mkdir(parents=True)
    write_dicom(root / "a" / "good.dcm", np.zeros((2, 2), np.uint8))
    write_dicom(root / "a" / "raw.dcm", np.zeros((2, 2), np.uint8), preamble=False)
    report = check_datasets([f"folder:{root}"])
    assert not report.ok
    assert report.datasets[0].problems["unreadable"] == [f"{root / 'a' / 'raw.dcm'} (not DICOM: no 'DICM' preamble)"]


def test_without_pydicom_the_error_names_the_extra(tmp_path, monkeypatch):
    root = _folder(tmp_path, n=2)
    monkeypatch.setitem(sys.modules, "pydicom", None)  # import pydicom -> ImportError
    monkeypatch.setitem(sys.modules, "pydicom.pixels", None)
    with pytest.raises(DatasetError, match=r"install it with: pip install 'gsd-cli\[dicom\]'"):
        resolve(f"folder:{root}")
    with pytest.raises(DatasetError, match=r"gsd-cli\[dicom\]"):
        read_dicom(root / "sick" / "1.dcm", "t")
