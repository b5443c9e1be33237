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
    group_column = "patient_id"    # csv: splits keep a patient's rows together (folder: groups = "file.csv")

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

**Relative paths.** Every relative path written in a catalogue (``data_root``, ``root``, ``path``,
``weights``, the file of ``model = "net.py:make"``) is relative to the folder of the TOML file, never to the working folder and never to
``data_root``. One rule for every key is what a reader of the file can check without knowing which
key is resolved against which other; it keeps a catalogue and the data beside it movable together
(and runnable from any folder, in CI); and ``data_root`` keeps its one meaning, the folder where the
*built-in* names (``cifar10``, ``chestxray``...) are looked for, as ``--data-root`` is on the command
line. A ``path`` that is missing beside the file but exists under ``data_root`` is an error that says
so and gives the path to write (``path = "/data/derm/labels.csv"``), never a silent fallback.

**Runs.** :func:`run_jobs` runs every selected job and keeps going: the datasets of all jobs are
resolved first and every one that cannot be used is reported together; a job that fails (a bad
dataset or option: a :class:`GSDError`) is recorded with its one-line error and the other jobs still
run; ``on_job`` sees the run after each job (``gsd rank`` rewrites its outputs there). With
``fail_fast`` the first failure stops the run (unusable datasets before any job starts).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import GSDError
from ..models.spec import split_file_reference

#: Options a job may set (the flat options of :class:`gsd_cli.ranking.RankConfig`).
OPTIONS = ("k", "examples", "seed", "model", "params", "labels", "row_norm", "device", "chunk_size", "engine",
           "dp", "epsilon", "clip", "mechanism", "dp_sketch", "gibbs_sweeps", "gram", "memory_budget",
           "repeats", "dp_repeats", "weights", "peft", "insecure_seed", "classes", "subspace_method", "batchnorm",
           "top", "regret_clip", "score_share")
CHECKS = ("fail_above", "expect_best")
#: the type each numeric or boolean option (and check) must have in a catalogue
OPTION_TYPES = {"k": "an integer", "examples": "an integer", "seed": "an integer", "chunk_size": "an integer",
                "dp_sketch": "an integer or a string", "gibbs_sweeps": "an integer", "repeats": "an integer", "dp": "true or false",
                "epsilon": "a number", "clip": "a number", "fail_above": "a number", "expect_best": "a string",
                "top": "an integer", "regret_clip": "a number", "score_share": "a number",
                "dp_repeats": "a string", "gram": "a string", "subspace_method": "a string", "weights": "a string", "peft": "a string",
                "insecure_seed": "an integer", "model": "a string", "batchnorm": "a string",
                "params": "a list of strings", "device": "a string", "labels": "a string", "row_norm": "a string",
                "engine": "a string", "mechanism": "a string", "memory_budget": "a string",
                "classes": "an integer or a string"}


def _is(value, kind: str) -> bool:
    if kind == "an integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "a number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "true or false":
        return isinstance(value, bool)
    if kind == "a list of strings":
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if kind == "an integer or a string":
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
    return isinstance(value, str)
DATASET_KEYS = ("source", "root", "path", "split", "image_column", "label_column", "label_columns", "group_column",
                "groups", "frame", "notes")


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
    group_column: str | None = None  # csv: the column of group (patient) ids; the split keeps a group together
    groups: str | None = None  # folder: a CSV file,group (relative to the catalogue), gsd_cli.data.groups
    frame: int | None = None  # folder / csv: the frame read from multi-frame DICOM files
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
        from ..data import resolve

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
        from ..data import resolve
        from ..data.csvsource import csv_source, hf_source
        from ..data.splits import fixed_split

        full = e.source if split is None else f"{e.source}:{split}"
        if e.source == "csv":
            src = csv_source(self._file(e), name=e.name, image_column=e.image_column, label_column=e.label_column,
                             label_columns=e.label_columns, group_column=e.group_column, frame=e.frame)
            return src if split is None else fixed_split(src, split, f"{e.name}:{split}")
        if e.source == "folder" and (e.groups or e.frame is not None):
            from ..data.files import FolderSource

            src = FolderSource(self._file(e), e.name, self._rel(e.groups) if e.groups else None, e.frame)
            return src if split is None else fixed_split(src, split, f"{e.name}:{split}")
        if e.source == "hf":
            return hf_source(self._file(e), name=e.name, split=split)
        if e.source in ("folder", "npz"):
            return resolve(f"{e.source}:{self._file(e)}" + (f":{split}" if split else ""))
        if e.root is not None:
            from ..data.published import PUBLISHED
            from ..data.registry import canonical

            key = canonical(e.source)
            if key in PUBLISHED:
                return PUBLISHED[key](split, self._rel(e.root), exact=True, name=e.name)
            return resolve(full, root=self._rel(e.root), download=download)
        return resolve(full, root=self.data_root, download=download)

    def _rel(self, p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else self.path.parent / q

    def _file(self, e: DatasetEntry) -> Path:
        """``e.path``, relative to the catalogue's folder (see the module docstring)."""
        if not e.path:
            raise GSDError(f"{self.path}: dataset {e.name!r} (source {e.source}) needs path = \"...\"")
        file = self._rel(e.path)
        if e.source != "hf" and not file.exists():
            where = f"{file} (a relative path is relative to the catalogue's folder)"
            under = Path(self.data_root) / e.path if self.data_root and not Path(e.path).is_absolute() else None
            if under is not None and under.exists():
                raise GSDError(f"{self.path}: dataset {e.name!r}: path {e.path!r} is not at {where}; it is under "
                               f"data_root: write path = \"{under}\"")
            raise GSDError(f"{self.path}: dataset {e.name!r}: path {e.path!r} not found: {where}")
        return file


def load_catalog(path: str | Path) -> Catalog:
    """Parse and check a catalogue; errors name the file and the entry."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise GSDError(f"catalogue {path}: no such file")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a byte-order mark (Windows editors) is not TOML
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise GSDError(f"catalogue {path}: not valid TOML ({e})") from None
    unknown = set(doc) - {"data_root", "datasets", "jobs"}
    if unknown:
        raise GSDError(f"catalogue {path}: unknown key(s) {', '.join(sorted(unknown))}; use data_root, [datasets.NAME], [[jobs]]")
    for key, kind, example in (("datasets", dict, "[datasets.NAME] tables"), ("jobs", list, "[[jobs]] tables")):
        if key in doc and not isinstance(doc[key], kind):
            raise GSDError(f"catalogue {path}: {key} = {doc[key]!r} should be {example}; see gsd rank --help")
    if "data_root" in doc and not isinstance(doc["data_root"], str):
        raise GSDError(f"catalogue {path}: data_root = {doc['data_root']!r} should be a string (a folder)")
    datasets = {}
    for name, d in (doc.get("datasets") or {}).items():
        if not isinstance(d, dict) or "source" not in d:
            raise GSDError(f"catalogue {path}: [datasets.{name}] needs source = \"...\"")
        bad = set(d) - set(DATASET_KEYS)
        if bad:
            raise GSDError(f"catalogue {path}: [datasets.{name}] has unknown key(s) {', '.join(sorted(bad))}; use {', '.join(DATASET_KEYS)}")
        for key, value in d.items():
            want = "an integer" if key == "frame" else "a list of strings" if key == "label_columns" else "a string"
            if not _is(value, want) or (key == "label_columns" and isinstance(value, str)):
                raise GSDError(f"catalogue {path}: [datasets.{name}] {key} = {value!r} should be {want}")
        datasets[name] = DatasetEntry(name=name, **d)
    jobs = []
    for i, j in enumerate(doc.get("jobs") or [], 1):
        if not isinstance(j, dict) or "private" not in j or not j.get("candidates"):
            raise GSDError(f"catalogue {path}: job {i} needs private = \"...\" and candidates = [...]")
        if not isinstance(j["private"], str) or not isinstance(j.get("name", ""), str):
            raise GSDError(f"catalogue {path}: job {i}: private and name must be strings (private = \"...\")")
        if not isinstance(j["candidates"], list) or not all(isinstance(c, str) for c in j["candidates"]):
            raise GSDError(f"catalogue {path}: job {i}: candidates = {j['candidates']!r} should be a list of names, "
                           f"e.g. candidates = [{json.dumps(str(j['candidates']))}]")
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
        fa = opts.get("fail_above")
        if fa is not None and not (math.isfinite(fa) and fa >= 0):  # nan/inf: a check that could never fail
            raise GSDError(f"catalogue {path}: job {i} option fail_above = {fa!r}: give a finite distance >= 0 (distances lie in [0, 1])")
        checks = {c: opts.pop(c) for c in CHECKS if c in opts}
        jobs.append(Job(name=j.get("name") or j["private"], private=j["private"], candidates=list(j["candidates"]),
                        options=opts, checks=checks))
    root = doc.get("data_root")
    cat = Catalog(path, datasets, jobs)
    for job in jobs:  # a weights file or base folder is named relative to the catalogue (a torchvision weight name stays a name)
        w = job.options.get("weights")
        if w and (cat._rel(w).is_file() or (cat._rel(w) / "card.json").is_file()):
            job.options["weights"] = str(cat._rel(w))
        model = split_file_reference(job.options.get("model") or "")  # a user's model file (gsd_cli.models.spec)
        if model and cat._rel(model[0]).is_file():
            job.options["model"] = str(cat._rel(model[0])) + job.options["model"][len(model[0]):]
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


def _line(e: BaseException) -> str:
    return " ".join(str(e).split())


#: the error of a job that did not run because one of its datasets cannot be used (listed once per run)
BLOCKED = "not usable (named on the line above)"
#: where an unknown-dataset message's list of known names begins (said once per run)
_HINT_SEP = "; use one of "


@dataclass
class CatalogRun:
    """A catalogue run so far: ``results`` ``[(job, ranking)]`` of the jobs that finished, in order;
    ``errors`` ``[(job, message)]`` of the jobs that failed; ``unusable`` ``{dataset: message}`` for the
    datasets of the run that could not be resolved."""

    jobs: list[Job]
    results: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    unusable: dict = field(default_factory=dict)

    def unusable_line(self) -> str | None:
        """One line naming every dataset of the run that cannot be used, or None. A hint that several
        messages share (the list of known names after an unknown one) is said once, at the end."""
        if not self.unusable:
            return None
        parts, hints = [], {}
        for name, msg in self.unusable.items():
            head, sep, hint = msg.partition(_HINT_SEP)
            parts.append(f"{name}: {head}")
            if sep:
                hints.setdefault(hint, None)
        tail = "".join(f"{_HINT_SEP}{h}" for h in hints)
        return f"{len(self.unusable)} dataset(s) of this run cannot be used: " + "; ".join(parts) + tail

    def error_lines(self, first: int = 10) -> list[str]:
        """The unusable datasets (one line), then one line per failed job (those that failed only because
        of an unusable dataset: the first ``first``, then a count)."""
        head = [self.unusable_line()] if self.unusable else []
        lines, blocked = [], 0
        for job, msg in self.errors:
            blocked += msg.endswith(BLOCKED)
            if not msg.endswith(BLOCKED) or blocked <= first:
                lines.append(f"job {job.name!r} failed: {msg}")
        if blocked > first:
            lines.append(f"... and {blocked - first} more job(s) failed because a dataset above is not usable")
        return head + lines


class CatalogError(GSDError):
    """Some jobs of a catalogue failed; ``run`` (a :class:`CatalogRun`) holds the ones that finished."""

    def __init__(self, run: CatalogRun):
        self.run = run
        super().__init__(f"{len(run.errors)} of {len(run.jobs)} job(s) failed: " + "; ".join(run.error_lines()))


def run_jobs(catalog: Catalog | str | Path, private: str | None = None, *, download: bool = False,
             overrides: dict | None = None, fail_fast: bool = False, on_job=None, **rank_kwargs) -> CatalogRun:
    """Run the selected jobs, keeping going past a failed one (see the module docstring); returns the
    :class:`CatalogRun`. ``on_job(run)`` is called after each job, finished or failed, in job order. With
    ``fail_fast`` the first failure raises its :class:`GSDError` (every unusable dataset at once, before
    any job). ``executor`` (in ``rank_kwargs``; ``"ray"``, a name or an object) is built once for all
    jobs; one that computes elsewhere overlaps the jobs (:func:`gsd_cli.ranking.executors.in_turns`)."""
    from . import RankConfig, get_executor, rank
    from .executors import in_turns

    if not isinstance(catalog, Catalog):
        catalog = load_catalog(catalog)
    run = CatalogRun(select_jobs(catalog, private))
    sources = {}
    for name in dict.fromkeys(n for j in run.jobs for n in (j.private, *j.candidates)):
        try:
            sources[name] = catalog.resolve(name, download)
        except GSDError as e:
            run.unusable[name] = _line(e)
    if run.unusable and fail_fast:
        raise GSDError(run.unusable_line())
    executor = rank_kwargs["executor"] = get_executor(rank_kwargs.get("executor"))  # one for all jobs

    def attempt(job: Job):
        try:
            config = RankConfig.from_options(**{**job.options, **(overrides or {})})
            bad = [n for n in dict.fromkeys((job.private, *job.candidates)) if n in run.unusable]
            if bad and fail_fast:
                raise GSDError("; ".join(f"dataset {n}: {run.unusable[n]}" for n in bad))
            if bad:  # why is said once for the run (CatalogRun.unusable_line), not once per job
                return None, f"dataset(s) {', '.join(bad)} {BLOCKED}"
            return rank(sources[job.private], [sources[c] for c in job.candidates], config, **rank_kwargs), None
        except GSDError as e:
            if fail_fast:
                raise GSDError(f"job {job.name!r}: {_line(e)}") from None
            return None, _line(e)

    for job, (rk, error) in zip(run.jobs, in_turns(run.jobs, attempt, executor)):
        if error is None:
            run.results.append((job, rk))
        else:
            run.errors.append((job, error))
        if on_job is not None:
            on_job(run)
    return run


def run_catalog(catalog: Catalog | str | Path, private: str | None = None, *, download: bool = False,
                overrides: dict | None = None, fail_fast: bool = False, **rank_kwargs) -> list[tuple[Job, object]]:
    """Run the selected jobs; returns ``[(job, Ranking), ...]``. ``overrides`` (options given on the
    command line) win over a job's options; ``rank_kwargs`` (``cache``, ``progress``, ``executor``...) pass through.
    When a job fails the others still run, then :class:`CatalogError` (a :class:`GSDError`) names every
    failure and holds the finished jobs in ``.run``; ``fail_fast`` stops at the first failure."""
    run = run_jobs(catalog, private, download=download, overrides=overrides, fail_fast=fail_fast, **rank_kwargs)
    if run.errors:
        raise CatalogError(run)
    return run.results
