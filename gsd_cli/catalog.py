"""Catalogues: a TOML file naming datasets and rank jobs, for re-running rankings (in CI, say).

.. code-block:: toml

    data_root = "/data"            # optional: the data root of built-in names (relative: to this file)

    [datasets.chest]               # a name usable in jobs (and in --private)
    source = "chestxray"           # built-in name, embedded name, or folder / csv / npz / hf
    root = "nih"                   # built-ins: the dataset's own folder (relative: to this file)
    split = "test"                 # optional: train, test (val)
    notes = "NIH ChestX-ray14, official test list"

    [datasets.derm]
    source = "csv"
    path = "derm/labels.csv"       # generic sources: the file or folder
    image_column = "file"          # csv: columns, when not found by name
    label_column = "diagnosis"     # or label_columns = ["a", "b"] (0/1 columns, multi-label)

    [[jobs]]
    name = "chest-ci"              # optional; default: the private dataset's name
    private = "chest"
    candidates = ["kagchest", "cifar100", "derm"]
    [jobs.options]                 # any of rank()'s options (see OPTIONS), and the CI checks
    k = 16
    examples = 500
    repeats = 5                    # mean +- sd, intervals and ties (see gsd rank --repeats)
    # model = "resnet152"; weights = "resnet152.safetensors" (relative to this file); peft = "paper"
    expect_best = "kagchest"
    fail_above = 0.9

Names in ``private``/``candidates`` are catalogue datasets or any name ``gsd rank`` accepts. An entry
with no ``split`` that ``gsd train`` uses as its private set is split as the dataset is on the command
line (:meth:`Catalog.resolve` with ``split``): official or grouped splits are kept.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import GSDError

#: Options a job may set (the flat options of :class:`gsd_cli.ranking.RankConfig`).
OPTIONS = ("k", "examples", "seed", "model", "params", "labels", "row_norm", "device", "chunk_size", "engine",
           "dp", "epsilon", "clip", "mechanism", "dp_sketch", "gibbs_sweeps", "gram", "memory_budget",
           "repeats", "dp_repeats", "weights", "peft", "insecure_seed", "classes")
CHECKS = ("fail_above", "expect_best")
#: the type each numeric or boolean option (and check) must have in a catalogue
OPTION_TYPES = {"k": "an integer", "examples": "an integer", "seed": "an integer", "chunk_size": "an integer",
                "dp_sketch": "an integer", "gibbs_sweeps": "an integer", "repeats": "an integer", "dp": "true or false",
                "epsilon": "a number", "clip": "a number", "fail_above": "a number", "expect_best": "a string",
                "dp_repeats": "a string", "gram": "a string", "weights": "a string", "peft": "a string",
                "insecure_seed": "an integer"}


def _is(value, kind: str) -> bool:
    if kind == "an integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "a number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "true or false":
        return isinstance(value, bool)
    return isinstance(value, str)
DATASET_KEYS = ("source", "root", "path", "split", "image_column", "label_column", "label_columns", "notes")


@dataclass
class DatasetEntry:
    name: str
    source: str
    root: str | None = None
    path: str | None = None
    split: str | None = None
    image_column: str | None = None
    label_column: str | None = None
    label_columns: list[str] | None = None
    notes: str = ""


@dataclass
class Job:
    name: str
    private: str
    candidates: list[str]
    options: dict = field(default_factory=dict)
    checks: dict = field(default_factory=dict)


@dataclass
class Catalog:
    path: Path
    datasets: dict[str, DatasetEntry]
    jobs: list[Job]
    data_root: str | None = None

    def resolve(self, name: str, download: bool = False, split: str | None = None):
        """A catalogue dataset (or any other name) as an :class:`ImageSource` named ``name``.

        ``split`` ('train', 'test', 'val') resolves an entry that names no split at that split, exactly
        as the dataset named on the command line would: its official split where it has one
        (ChestX-ray14's patient-wise lists, the Kaggle folders, torchvision's), HAM10000's lesion
        grouping, else the per-example hash split; the source is then named ``name:split``. An entry
        that already is a split cannot be split again."""
        from .data import resolve

        e = self.datasets.get(name)
        if e is None:
            return resolve(name if split is None else f"{name}:{split}", root=self.data_root, download=download)
        if split is not None and e.split is not None and split != e.split:
            raise GSDError(f"catalogue dataset {name!r} is already the split {e.split!r}; name its {split} set separately")
        part = e.split or split
        src = self._source(e, part, download)
        src.name = name if e.split is not None or split is None else f"{name}:{split}"
        return src

    def _source(self, e: DatasetEntry, split: str | None, download: bool):
        """Entry ``e`` at ``split`` (None: all of it)."""
        from .data import resolve
        from .data.csvsource import csv_source, hf_source
        from .data.splits import fixed_split

        full = e.source if split is None else f"{e.source}:{split}"
        if e.source == "csv":
            src = csv_source(self._file(e), name=e.name, image_column=e.image_column, label_column=e.label_column,
                             label_columns=e.label_columns)
            return src if split is None else fixed_split(src, split, f"{e.name}:{split}")
        if e.source == "hf":
            return hf_source(self._file(e), name=e.name, split=split)
        if e.source in ("folder", "npz"):
            return resolve(f"{e.source}:{self._file(e)}" + (f":{split}" if split else ""))
        if e.root is not None:
            from .data.published import PUBLISHED
            from .data.registry import canonical

            key = canonical(e.source)
            if key in PUBLISHED:
                return PUBLISHED[key](split, self._rel(e.root), exact=True, name=e.name)
            return resolve(full, root=self._rel(e.root), download=download)
        return resolve(full, root=self.data_root, download=download)

    def _rel(self, p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else self.path.parent / q

    def _file(self, e: DatasetEntry) -> Path:
        if not e.path:
            raise GSDError(f"{self.path}: dataset {e.name!r} (source {e.source}) needs path = \"...\"")
        return self._rel(e.path)


def load_catalog(path: str | Path) -> Catalog:
    """Parse and check a catalogue; errors name the file and the entry."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise GSDError(f"catalogue {path}: no such file")
    try:
        doc = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise GSDError(f"catalogue {path}: not valid TOML ({e})") from None
    unknown = set(doc) - {"data_root", "datasets", "jobs"}
    if unknown:
        raise GSDError(f"catalogue {path}: unknown key(s) {', '.join(sorted(unknown))}; use data_root, [datasets.NAME], [[jobs]]")
    datasets = {}
    for name, d in (doc.get("datasets") or {}).items():
        if not isinstance(d, dict) or "source" not in d:
            raise GSDError(f"catalogue {path}: [datasets.{name}] needs source = \"...\"")
        bad = set(d) - set(DATASET_KEYS)
        if bad:
            raise GSDError(f"catalogue {path}: [datasets.{name}] has unknown key(s) {', '.join(sorted(bad))}; use {', '.join(DATASET_KEYS)}")
        datasets[name] = DatasetEntry(name=name, **d)
    jobs = []
    for i, j in enumerate(doc.get("jobs") or [], 1):
        if not isinstance(j, dict) or "private" not in j or not j.get("candidates"):
            raise GSDError(f"catalogue {path}: job {i} needs private = \"...\" and candidates = [...]")
        bad = set(j) - {"name", "private", "candidates", "options"}
        if bad:
            raise GSDError(f"catalogue {path}: job {i} has unknown key(s) {', '.join(sorted(bad))}")
        opts = dict(j.get("options") or {})
        badopt = set(opts) - set(OPTIONS) - set(CHECKS)
        if badopt:
            raise GSDError(f"catalogue {path}: job {i} has unknown option(s) {', '.join(sorted(badopt))}; use {', '.join(OPTIONS + CHECKS)}")
        for key, kind in OPTION_TYPES.items():
            if key in opts and opts[key] is not None and not _is(opts[key], kind):
                raise GSDError(f"catalogue {path}: job {i} option {key} = {opts[key]!r} should be {kind}")
        checks = {c: opts.pop(c) for c in CHECKS if c in opts}
        jobs.append(Job(name=j.get("name") or j["private"], private=j["private"], candidates=list(j["candidates"]),
                        options=opts, checks=checks))
    root = doc.get("data_root")
    cat = Catalog(path, datasets, jobs)
    for job in jobs:  # a weights file is named relative to the catalogue (a torchvision weight name stays a name)
        w = job.options.get("weights")
        if w and cat._rel(w).is_file():
            job.options["weights"] = str(cat._rel(w))
    cat.data_root = str(cat._rel(root)) if root else None
    return cat


def select_jobs(catalog: Catalog, private: str | None = None) -> list[Job]:
    """Every job, or those whose private dataset (or job name) is ``private``."""
    if private is None:
        jobs = catalog.jobs
    else:
        jobs = [j for j in catalog.jobs if private in (j.private, j.name)]
    if not jobs:
        have = ", ".join(sorted({j.private for j in catalog.jobs})) or "none"
        raise GSDError(f"catalogue {catalog.path}: no job" + (f" with private {private!r} (have: {have})" if private else "s"))
    return jobs


def run_catalog(catalog: Catalog | str | Path, private: str | None = None, *, download: bool = False,
                overrides: dict | None = None, **rank_kwargs) -> list[tuple[Job, object]]:
    """Run the selected jobs; returns ``[(job, Ranking), ...]``. ``overrides`` (options given on the
    command line) win over a job's options; ``rank_kwargs`` (``cache``, ``progress``...) pass through."""
    from .ranking import RankConfig, rank

    if not isinstance(catalog, Catalog):
        catalog = load_catalog(catalog)
    out = []
    for job in select_jobs(catalog, private):
        config = RankConfig.from_options(**{**job.options, **(overrides or {})})
        priv = catalog.resolve(job.private, download)
        pubs = [catalog.resolve(c, download) for c in job.candidates]
        out.append((job, rank(priv, pubs, config, **rank_kwargs)))
    return out
