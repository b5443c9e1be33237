"""DICOM images (``.dcm``, and files with no image extension found by their ``DICM`` preamble).

``folder:`` and ``csv:`` sources read DICOM files through :func:`read_dicom` (``pydicom``, an optional
extra: ``pip install 'gsd-cli[dicom]'``). Only the drawn files are opened. One file becomes one
image, float32 in [0, 1], by the steps of the DICOM grey-scale pipeline (PS3.4 N.2.1.1), using
pydicom's own functions:

1. the stored values (one frame: a multi-frame file is refused unless a frame is chosen, ``frame=I``);
2. the Modality LUT or Rescale Slope / Intercept (:func:`pydicom.pixels.apply_modality_lut`);
3. the VOI LUT, else the first window (Window Center / Width) of the file
   (:func:`pydicom.pixels.apply_voi_lut`; no VOI in the file: the values are kept);
4. scaled to [0, 1] by the range those values can take (:func:`output_range`: the stored bits'
   range after the modality step, or the VOI LUT's output range), not by the image's own minimum
   and maximum, so one value means one grey in every file of a series; MONOCHROME1 (0 = white) is
   inverted.

The values stay float64 until that last step: a 16-bit image keeps its full depth (two stored values
1 apart stay 1/65535 apart), nothing is quantised to 8 bits. Steps 2-4 are a function of the stored
value alone, so for 8- and 16-bit pixels they are computed once per stored value up to the image's
maximum (from its minimum for signed pixels) and looked up per pixel (the same float32 values as applying them to every pixel). RGB and YBR files (converted to RGB by
pydicom) are scaled by their stored bits. Anything else (PALETTE COLOR...) and unreadable files are
one-line :class:`DatasetError`\\ s: not a DICOM file, no pixel data, a compressed transfer syntax
whose decoder plugin is not installed (the message names the plugins pydicom would use).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import DatasetError

#: Extensions read as DICOM without looking at the file.
DICOM_EXTENSIONS = (".dcm", ".dicom")
#: Names that carry the DICM preamble but hold no image (a DICOMDIR is a media directory).
NOT_IMAGES = ("dicomdir",)
INSTALL = "install it with: pip install 'gsd-cli[dicom]'"
MONOCHROME = ("MONOCHROME1", "MONOCHROME2")
#: Photometric interpretations pydicom returns as RGB (``pixel_array(raw=False)`` converts YBR).
COLOUR = ("RGB", "YBR_FULL", "YBR_FULL_422", "YBR_PARTIAL_420", "YBR_ICT", "YBR_RCT")


def has_dicom_preamble(file: str | Path) -> bool:
    """Whether bytes 128..131 of ``file`` are ``DICM`` (the DICOM file format's preamble, PS3.10 7.1).
    Reads 132 bytes; an unreadable file is not DICOM here (the reader reports it when drawn)."""
    try:
        with open(file, "rb") as f:
            head = f.read(132)
    except OSError:
        return False
    return len(head) == 132 and head[128:132] == b"DICM"


def is_dicom_file(file: str | Path, image_extensions: tuple[str, ...] = ()) -> bool:
    """A ``.dcm`` / ``.dicom`` file, or a file with the DICOM preamble whose extension is not one of
    ``image_extensions`` (extension-less files, or names like a UID ``1.2.840.113619.2.1``).
    A ``DICOMDIR`` is never an image."""
    name = os.path.basename(str(file)).lower()
    if name in NOT_IMAGES:
        return False
    if name.endswith(DICOM_EXTENSIONS):
        return True
    if image_extensions and name.endswith(image_extensions):
        return False
    return has_dicom_preamble(file)


def pydicom_module(name: str = "DICOM"):
    """``pydicom``, or a one-line error saying how to install it."""
    try:
        import pydicom
        import pydicom.pixels  # the pixel pipeline (pydicom >= 3)
    except ImportError:
        raise DatasetError(f"{name}: reading DICOM files needs pydicom; {INSTALL}") from None
    return pydicom


def read_dicom(file: str | Path, name: str, frame: int | None = None) -> np.ndarray:
    """One DICOM file as float32 ``H x W`` (grey) or ``H x W x 3`` (colour) in [0, 1] (module docstring).

    ``frame``: the frame of a multi-frame file (from 0); None refuses multi-frame files."""
    pydicom = pydicom_module(name)
    from pydicom.errors import InvalidDicomError

    try:
        ds = pydicom.dcmread(file)
    except InvalidDicomError:
        raise DatasetError(f"{name}: {file} is not a DICOM file (no 'DICM' preamble); remove or replace it") from None
    except (OSError, EOFError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DatasetError(f"{name}: cannot read DICOM file {file} ({type(e).__name__}); remove or replace it") from None
    return dicom_to_array(ds, file, name, frame)


def dicom_to_array(ds, file: str | Path, name: str, frame: int | None = None) -> np.ndarray:
    """A read pydicom ``Dataset`` as float32 in [0, 1]: see :func:`read_dicom`."""
    from pydicom.pixels import pixel_array

    if not any(tag in ds for tag in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        sop = getattr(ds, "file_meta", {}).get("MediaStorageSOPClassUID") or ds.get("SOPClassUID")
        kind = str(getattr(sop, "name", sop or "unknown"))
        if str(sop) == "1.2.840.10008.1.3.10":
            raise DatasetError(f"{name}: {file} is a DICOMDIR (a media directory, not an image); remove it")
        if "Image" in kind or "Rows" in ds:  # an image's header without its pixels: the file was cut short
            raise DatasetError(f"{name}: {file} has no pixel data but is an image ({kind}): the file is probably "
                               "truncated or damaged; copy it again or remove it")
        raise DatasetError(f"{name}: {file} has no pixel data (a DICOM without an image: {kind}); remove it")
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    if frames > 1 and frame is None:
        raise DatasetError(f"{name}: {file} is multi-frame ({frames} frames); choose one with the source option "
                           f"frame=I (0..{frames - 1}), e.g. folder:PATH?frame=0")
    index = 0 if frame is None else int(frame)
    if not 0 <= index < frames:
        raise DatasetError(f"{name}: {file} has {frames} frame(s); frame={frame} is not one of 0..{frames - 1}")
    photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).strip().upper()
    if photometric not in MONOCHROME + COLOUR:
        raise DatasetError(f"{name}: {file} has photometric interpretation {photometric}, which gsd does not read; "
                           "convert it to MONOCHROME2 or RGB")
    try:
        arr = pixel_array(ds, index=index if frames > 1 else None)
    except RuntimeError as e:  # pydicom: every decoder plugin of this transfer syntax is missing
        raise DatasetError(f"{name}: cannot decode {file}: {_missing_decoder(ds, e)}") from None
    except NotImplementedError:
        ts = ds.file_meta.get("TransferSyntaxUID", "?")
        raise DatasetError(f"{name}: cannot decode {file}: pydicom does not support its transfer syntax "
                           f"{getattr(ts, 'name', ts)}; convert it (e.g. to Explicit VR Little Endian)") from None
    except (ValueError, AttributeError, KeyError, TypeError, OSError) as e:
        raise DatasetError(f"{name}: cannot decode the pixel data of {file} ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]}); remove or replace it") from None
    if photometric in COLOUR:
        if arr.ndim != 3 or arr.shape[-1] != 3:
            raise DatasetError(f"{name}: {file} is {photometric} but its pixels have shape {arr.shape}; remove or replace it")
        top = 2.0 ** int(ds.get("BitsStored", 8) or 8) - 1
        return (np.clip(arr.astype(np.float64), 0, top) / top).astype(np.float32)
    if arr.ndim != 2:
        raise DatasetError(f"{name}: {file} is {photometric} but its pixels have shape {arr.shape}; remove or replace it")
    try:
        lo, hi = output_range(ds)
        if arr.dtype.kind in "iu" and arr.dtype.itemsize <= 2 and arr.size > 4096:
            # the grey-scale steps are a function of the stored value alone: computed once per value
            # that occurs (at most 65,536), then looked up: the same float32 values, bit for bit
            # (tests/test_dicom.py), at a fraction of the float64 passes over every pixel
            base = 0 if arr.dtype.kind == "u" else int(arr.min())  # unsigned: indexed by the values themselves
            table = _grey(np.arange(base, int(arr.max()) + 1, dtype=arr.dtype), ds, lo, hi, photometric)
            return table[arr if base == 0 else arr.astype(np.int32) - base]
        return _grey(arr, ds, lo, hi, photometric)
    except (ValueError, AttributeError, KeyError, TypeError, IndexError, NotImplementedError) as e:
        raise DatasetError(f"{name}: {file}: cannot apply its modality / VOI transform ({type(e).__name__}: "
                           f"{' '.join(str(e).split())[:200]}); fix the file's LUT or window") from None


def _grey(arr: np.ndarray, ds, lo: float, hi: float, photometric: str) -> np.ndarray:
    """Stored grey values -> float32 in [0, 1]: modality LUT / rescale, VOI LUT / window, scaled by the
    output range ``(lo, hi)``, MONOCHROME1 inverted (steps 2-4 of the module docstring)."""
    from pydicom.pixels import apply_modality_lut, apply_voi_lut

    values = apply_modality_lut(arr, ds)
    if ds.get("VOILUTSequence") and np.issubdtype(values.dtype, np.floating):
        values = np.rint(values).astype(np.int64)  # a LUT is indexed by integers (pydicom warns on floats)
    values = apply_voi_lut(values, ds)
    x = np.clip((np.asarray(values, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    if photometric == "MONOCHROME1":
        x = 1.0 - x
    return x.astype(np.float32)


def _lut_depth(item) -> int:
    """The bits of a LUT's output (third value of its LUT Descriptor)."""
    return int(item.LUTDescriptor[2])


def output_range(ds) -> tuple[float, float]:
    """``(lo, hi)``: the range of the values after the modality and VOI steps, which is mapped to [0, 1].

    A VOI LUT Sequence (applied in preference to a window, as pydicom does): ``[0, 2**bits - 1]`` of
    its LUT Descriptor. Otherwise the range after the modality step, which windowing keeps (pydicom's
    :func:`~pydicom.pixels.apply_windowing` maps to it): a Modality LUT Sequence's
    ``[0, 2**bits - 1]``; else the stored values' range (Bits Stored, signed when Pixel Representation
    is 1) times Rescale Slope plus Rescale Intercept."""
    voi = ds.get("VOILUTSequence")
    if voi and voi[0].get("LUTDescriptor") is not None and voi[0].get("LUTData") is not None:
        return 0.0, 2.0 ** _lut_depth(voi[0]) - 1
    if ds.get("ModalityLUTSequence"):
        return 0.0, 2.0 ** _lut_depth(ds.ModalityLUTSequence[0]) - 1
    bits = int(ds.BitsStored)
    if int(ds.get("PixelRepresentation", 0) or 0) == 1:
        lo, hi = -(2.0 ** (bits - 1)), 2.0 ** (bits - 1) - 1
    else:
        lo, hi = 0.0, 2.0**bits - 1
    if "RescaleSlope" in ds and "RescaleIntercept" in ds:
        slope, intercept = float(ds.RescaleSlope), float(ds.RescaleIntercept)
        lo, hi = sorted((lo * slope + intercept, hi * slope + intercept))
    if hi <= lo:
        raise ValueError(f"empty value range [{lo}, {hi}] (Rescale Slope 0?)")
    return lo, hi


def _missing_decoder(ds, error: Exception) -> str:
    """What to install to decode ``ds``'s compressed pixel data (from pydicom's decoder)."""
    ts = ds.file_meta.get("TransferSyntaxUID")
    try:
        from pydicom.pixels import get_decoder

        missing = get_decoder(ts).missing_dependencies
    except Exception:  # noqa: BLE001 - the message below still names the transfer syntax
        missing = []
    what = "; ".join(missing) if missing else " ".join(str(error).split())[:200]
    return (f"its transfer syntax {getattr(ts, 'name', ts)} is compressed and no pydicom decoder plugin for it "
            f"is installed; install one ({what}), see pydicom's pixel data handlers")
