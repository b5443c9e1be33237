"""A round of the held-out benchmark as data: its spec (``rounds/round<N>.json``) read into a frozen record.

A spec declares everything a round is: its tasks (private train and test sets, the model, the public candidates,
the kind, whether a candidate is the untransformed source of a transformed private set), the data builder, the
seeds and the privacy budget, the training settings of every method, the tuning grid and where its result is,
the steps run on each cell (rankings, the feature probe, the DP advice), the arms that decide among the
candidates, the figure sets and their bootstrap, the targets and the frozen file committed before its first run.
:mod:`.run` runs a spec, :mod:`.score` scores its results; nothing about a round is written in code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPECS = HERE / "rounds"
#: the committed results of every round (``<results>/runs.jsonl``, ``rankings/``, ``decisions.jsonl``)
RESULTS = HERE.parents[1] / "results"


@dataclass(frozen=True)
class Task:
    """A private task and its public candidates (``source``: the candidate whose transform the private set is)."""

    name: str
    kind: str
    train: str
    test: str
    model: str
    candidates: tuple[str, ...]
    realistic: bool = True
    source: str | None = None
    same: str | None = None
    base: str | None = None  # the base (a key of the round's ``bases``) its from-base methods start from
    size: int | None = None  # the private set's size: ``train`` is a seeded subset ``<set>~<size>`` (:func:`expand`)
    group: str | None = None  # the task these sizes of it come from (None: the task is its own)
    related: tuple[str, ...] = ()  # the candidates related to it from another source (documentation, and a figure)
    harmful: tuple[str, ...] = ()  # the candidates declared harmful


@dataclass(frozen=True)
class Round:
    """One round's spec (the fields of ``rounds/round<N>.json``; ``what`` is prose)."""

    round: int
    label: str
    frozen: str  # the pre-registration file, committed before the round's first run (relative to this folder)
    data: str  # the data builder's module (under ``benchmarks``): build(), NAMES, data_dir()
    results: str  # the results folder under benchmarks/results/
    out: str  # benchmarks/results/<out>.{json,md}: the scores
    seeds: tuple[int, ...]
    epsilon: float
    delta: float
    base: dict  # the training settings every method shares
    methods: dict  # each method's own settings
    no_candidate: tuple[str, ...]  # the methods trained without public data (the baseline: the best of them per task)
    candidate_methods: tuple[str, ...]  # the methods trained with each candidate
    tuning: dict  # round (whose tasks), tasks, seeds, grid per method, runs, out (the tuned file)
    rank: dict  # the ranking's settings (model, k, examples)
    steps: tuple[str, ...]  # what each cell computes besides the trainings (rank, advised, advised-native, probe, dp)
    gsd_ranking: str  # the step whose rows give GSD's distances (rank: the plain ranking; advised)
    arms: dict  # the arms that decide: name -> {decider, ranking, probe, what}
    validated: str  # the method whose accuracy GSD's and the probe's orders are compared with
    probe_pick: str  # the method of the probe-pick and random arms
    sets: dict  # figure sets: name -> {rounds, label}
    bootstrap: dict  # draws, key (a template of set and figure), names (figure name overrides)
    tasks: dict[str, Task]
    decimals: int = 2  # how the markdown writes points
    tolerance: float = 0.5  # points: "within 0.5 of the baseline"
    select_epsilon: float | None = None  # the DP advice's share of the total epsilon
    null: dict | None = None  # GEP with uniform noise: {method, sets: model -> set}
    agreement: tuple = ()  # pairs of arms whose decisions are compared
    targets: tuple = ()  # {name, figure, at_least | at_most | above, set}
    scored: tuple[str, ...] = ()  # the tasks scored (default: every task)
    package_note: dict | None = None
    sizes: tuple[int, ...] = ()  # private set sizes (seeded subsets): each task runs at each (a task's own ``sizes`` wins)
    bases: dict | None = None  # name -> {model, public, epochs}: bases built from public sets only (run.build_bases)
    data_rounds: tuple[int, ...] = ()  # earlier rounds whose sets this round's tasks use as candidates
    dp: dict | None = None  # DP advice steps: name -> {select_epsilon, fallback} (gsd_cli.advice.select.dp_plan)
    rule: str = ""  # the pre-registered pass/fail rule, in words
    what: str = ""
    path: Path = field(default=SPECS, compare=False)

    @property
    def scored_tasks(self) -> list[str]:
        return list(self.scored or self.tasks)

    @property
    def frozen_path(self) -> Path:
        return HERE / self.frozen

    @property
    def results_dir(self) -> Path:
        return RESULTS / self.results

    def options(self, task: str) -> list[tuple[str, str | None]]:
        """Every (method, public set) of a task's oracle, in order: the no-candidate methods, then each method with
        each candidate."""
        cands = self.tasks[task].candidates
        return [(m, None) for m in self.no_candidate] + [(m, c) for m in self.candidate_methods for c in cands]

    def gsd_method(self, method: str) -> str:
        """The gsd method a method of the spec trains (``methods[m]["method"]``, default the name itself)."""
        return self.methods[method].get("method", method)

    def from_base(self, method: str) -> bool:
        return bool(self.methods[method].get("from_base"))

    def method_of(self, gsd_method: str, from_base: bool) -> str:
        """The spec's method that trains ``gsd_method`` from the base (or not): how a decision of gsd's names it."""
        for m in self.methods:
            if self.gsd_method(m) == gsd_method and self.from_base(m) == from_base:
                return m
        raise SystemExit(f"round {self.round}: no method trains {gsd_method} {'from a base' if from_base else 'from scratch'}")

    def null_set(self, task: str) -> str | None:
        return self.null["sets"][self.tasks[task].model] if self.null else None


def expand(name: str, fields_: dict, sizes: tuple[int, ...]) -> dict[str, Task]:
    """A task of the spec as the tasks that run: itself, or one per private size (``<name>@<size>``, its training set
    the seeded subset ``<train>~<size>``, :func:`subset_indices`)."""
    if not sizes:
        return {name: Task(name, **fields_)}
    return {f"{name}@{n}": Task(f"{name}@{n}", **{**fields_, "train": f"{fields_['train']}~{n}"}, size=n, group=name)
            for n in sizes}


def subset_indices(total: int, size: int) -> list[int]:
    """The rows of a private set's seeded subset of ``size`` (of ``total``): the first ``size`` of one permutation
    drawn from a fixed, public seed (0), sorted, so that a smaller size is a part of a larger one. The subset depends
    on the set's length only, never on its examples."""
    import numpy as np

    if size > total:
        raise SystemExit(f"a subset of {size} examples of a set of {total}")
    return sorted(int(i) for i in np.random.default_rng(0).permutation(total)[:size])


def load(n: int, directory: Path = SPECS) -> Round:
    """Round ``n``'s spec (``rounds/round<n>.json``); an unknown field stops with its name."""
    path = directory / f"round{n}.json"
    if not path.is_file():
        have = sorted(int(p.stem[5:]) for p in directory.glob("round*.json"))
        raise SystemExit(f"no spec for round {n} ({path}); rounds with a spec: {have}")
    return parse(json.loads(path.read_text()), path)


def parse(doc: dict, path: Path = SPECS) -> Round:
    known = {f.name for f in fields(Round)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise SystemExit(f"{path}: unknown spec fields {unknown}")
    tasks = {}
    for n, t in doc["tasks"].items():
        t = {k: tuple(v) if isinstance(v, list) else v for k, v in t.items()}
        tasks.update(expand(n, t, tuple(t.pop("sizes", doc.get("sizes", ())))))
    tup = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) for k, v in doc.items()
           if isinstance(v, list) and k != "tasks"}
    return Round(**{**doc, **tup, "tasks": tasks, "path": path})


def rounds(directory: Path = SPECS) -> list[int]:
    """The rounds that have a spec."""
    return sorted(int(p.stem[5:]) for p in directory.glob("round*.json"))


def tuning_tasks(spec: Round) -> list[Task]:
    """The tuning tasks of a round tuned per size (``tuning.tasks``: {round, task, candidate, base}), one per size:
    an earlier round's task on its seeded subset, from the named base. Empty for a round tuned the old way."""
    out = []
    for entry in spec.tuning["tasks"] if spec.tuning.get("sizes") else ():
        t = load(entry["round"]).tasks[entry["task"]]
        out += [replace(t, name=f"{t.name}@{k}", train=f"{t.train}~{k}", size=k, group=t.name, base=entry["base"])
                for k in spec.tuning["sizes"]]
    return out
