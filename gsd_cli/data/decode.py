"""One image file -> float32 pixels in [0, 1], decoded no larger than the model needs.

:func:`open_image` reads any file a file-backed source lists: DICOM (:mod:`.dicom`) or any image PIL
reads (:func:`pil_to_array`: 8-bit, 16-bit grey ``I;16`` without loss, float TIFF...).

With ``draft=S`` (the model's input side, given by the input pipeline, :mod:`.loader`), a JPEG is
decoded by PIL's ``Image.draft``: libjpeg scales it in the DCT by 1/2, 1/4 or 1/8, to the smallest
of those scales at which both sides are still >= S (a 1024 x 1024 photo for a 224 x 224 model is
decoded at 256 x 256), and the resize to S x S then starts from there. That is 3-4x less work than
decoding every pixel of the photo only to average them away. The pixels differ slightly from a full
decode followed by the same resize (the DCT scaling is a different low-pass filter): on 1024 x 1024
photo-like JPEGs resized to 224, by 0.0015 on average and at most 0.03 on the [0, 1] scale (0.4/255
and 7/255; ``tests/test_decode.py`` holds it under 0.005 mean and 0.06 max). Other formats are
decoded whole: PNG, TIFF and DICOM have no reduced-scale decoding.

:data:`DECODE` describes this; the cache of public subspaces keys file-backed samples on it
(:mod:`.fingerprint`), so a change to the decoded pixels must change it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .dicom import is_dicom_file, read_dicom

#: Extensions PIL reads (torchvision's ``IMG_EXTENSIONS``); anything else is looked at as DICOM.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: How a file is decoded for a model input of side S (part of the public-subspace cache key of
#: file-backed samples): bump ``version`` whenever the decoded pixels change for some file.
DECODE = {"jpeg": "PIL Image.draft: DCT scaling 1/1..1/8 to the smallest size with both sides >= S", "version": 1}


def pil_to_array(img) -> np.ndarray:
    """A PIL image as float32 in [0, 1]: 8-bit grey/colour by /255, 16-bit grey (mode I;16, usual for
    X-rays) by /65535, 32-bit integer grey by its type's range, float grey refused outside [0, 1]."""
    if img.mode.startswith("I;16"):  # float32 division: for each of the 65,536 values the float64 quotient
        return np.divide(np.asarray(img), np.float32(65535.0), dtype=np.float32)  # rounded to float32, one pass (tests/test_decode.py)
    if img.mode == "I":
        a = np.asarray(img).astype(np.float64)
        top = 65535.0 if a.max(initial=0) <= 65535 else 2.0**32 - 1
        return (np.clip(a, 0, None) / top).astype(np.float32)
    if img.mode == "F":  # float TIFF: values must lie in [0, 1], as in an npz (never clipped silently)
        a = np.asarray(img, dtype=np.float32)
        finite = a[np.isfinite(a)]
        if finite.size and (finite.min() < -1e-6 or finite.max() > 1 + 1e-6):
            raise ValueError(f"float pixel values {finite.min():.3g}..{finite.max():.3g} outside [0, 1]; rescale the image to [0, 1]")
        return np.clip(a, 0.0, 1.0)
    if img.mode in ("LA", "1"):
        img = img.convert("L")
    elif img.mode not in ("L", "RGB"):
        img = img.convert("RGB")
    return np.asarray(img, dtype=np.float32) / 255.0


def open_image(file: str | Path, name: str, frame: int | None = None, draft: int | None = None) -> np.ndarray:
    """One image file as float32 in [0, 1]: DICOM (:func:`gsd_cli.data.dicom.read_dicom`, ``frame`` of
    a multi-frame file) or any image PIL reads (:func:`pil_to_array`); unreadable -> DatasetError.
    ``draft``: the side the image will be resized to; a JPEG is then decoded at the smallest DCT
    scale that keeps both sides >= ``draft`` (module docstring); None decodes every pixel."""
    from PIL import Image, UnidentifiedImageError

    if is_dicom_file(file, IMAGE_EXTENSIONS):
        return read_dicom(file, name, frame)
    try:
        with Image.open(file) as img:
            if draft is not None and img.format == "JPEG":
                img.draft(img.mode, (int(draft), int(draft)))
            return pil_to_array(img)
    except Image.DecompressionBombError as e:  # PIL refuses images over 2 x Image.MAX_IMAGE_PIXELS
        raise DatasetError(f"{name}: image {file} is too large to open ({e}); shrink it or remove it") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:  # PIL raises SyntaxError for some broken files
        why = str(e) if "outside [0, 1]" in str(e) else type(e).__name__
        raise DatasetError(f"{name}: cannot read image {file} ({why}); remove or replace it") from None
