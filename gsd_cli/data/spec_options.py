"""Options of a generic source spec: ``KIND:PATH?key=value&key=value`` (then ``:train`` / ``:test``).

.. code-block:: text

    folder:xrays?groups=patients.csv          images grouped by patient (a CSV file,group)
    folder:ct?frame=0                         the first frame of multi-frame DICOM files
    csv:labels.csv?group_column=patient_id    rows grouped by a column
    csv:labels.csv?group_column=patient_id:train

The options are those of the source's Python function (:data:`KIND_OPTIONS`: the parameters of
:class:`gsd_cli.data.files.FolderSource` and :func:`gsd_cli.data.csvsource.csv_source`), and the
same keys a catalogue entry takes. A path that really contains ``?`` (an existing file) is taken as
it is. Relative paths in values (``groups=``) are relative to the working folder.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DatasetError

#: The options each kind takes in its spec.
KIND_OPTIONS = {
    "folder": ("groups", "frame"),
    "csv": ("group_column", "image_column", "label_column", "frame"),
}


def split_options(kind: str, text: str, spec: str) -> tuple[str, dict[str, str]]:
    """``(path, options)`` of ``PATH?key=value&...`` for a source of ``kind`` (``spec``: the whole name,
    for messages). A kind without options, a text without ``?`` or an existing path come back whole."""
    allowed = KIND_OPTIONS.get(kind)
    if not allowed or "?" not in text or Path(text).expanduser().exists():
        return text, {}
    path, _, query = text.rpartition("?")
    options: dict[str, str] = {}
    for part in query.split("&"):
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if key not in allowed or not eq or not value:
            raise DatasetError(f"{spec!r}: bad option {part!r} of {kind}:PATH?...; use key=value with key one of "
                               f"{', '.join(allowed)} (e.g. {kind}:PATH?{allowed[0]}=...)")
        if key in options:
            raise DatasetError(f"{spec!r}: option {key!r} given twice")
        options[key] = value
    return path, options


def join_options(path: str, options: dict) -> str:
    """The spec text ``path?key=value&...`` of :func:`split_options`' output (``path`` without options)."""
    given = {k: v for k, v in options.items() if v is not None}
    return path + ("?" + "&".join(f"{k}={v}" for k, v in given.items()) if given else "")
