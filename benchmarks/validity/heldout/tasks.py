"""The held-out benchmark's private tasks and their public candidates (data: :mod:`.prepare`).

Round 1: eight tasks from five kinds of image; rounds 2-5 (``split2.json`` ... ``split5.json``): four
new held-out tasks each, all realistic. ``realistic``: no candidate is a split of the private set's own
distribution (the case of a real user, whose public data comes from elsewhere). Every pool has at
least six candidates, among them a small few-class set (``faces``: 200 images, 2 classes, or
``pub-shoes``: 3 classes), a set of another resolution (``digits``: 8x8) and one of another colour
(RGB ``pub-photos`` for grey tasks, grey sets for RGB tasks). Which tasks are selection and which
held out is in ``split.json`` (:func:`split`), written before any run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .prepare import NAMES, data_dir

SPLIT = Path(__file__).with_name("split.json")


@dataclass(frozen=True)
class Task:
    name: str
    kind: str  # digits, clothing, silhouettes, textures, medical, photos
    train: str
    test: str
    candidates: tuple[str, ...]
    model: str  # the trained model (28x28 grey or 32x32 RGB)
    realistic: bool  # no candidate from the private set's own distribution
    same: str | None = None  # the same-distribution candidate, where there is one
    #: the untransformed source offered as a candidate, where the private set is a transform of MNIST, Fashion-MNIST
    #: or the animal silhouettes (rotated, inverted, blurred, over noise or photo crops...) and the public split of that
    #: source (``pub-mnist``, ``pub-fashion``, ``pub-animal``) is among its candidates. From the task definitions in
    #: :mod:`.prepare`'s docstring (read there, not measured); set in :data:`SOURCES` below.
    source: str | None = None


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("mnist", "digits", "mnist-train", "mnist-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-photos"), "fmnist-cnn", False, "pub-mnist"),
    Task("mnist-neg", "digits", "mnist-neg-train", "mnist-neg-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("mnist-m", "rgb-digits", "mnist-m-train", "mnist-m-test",
         ("pub-mnist", "digits", "pub-photos", "pub-fashion", "pub-animal", "faces"), "fmnist-cnn@32x3", True),
    Task("fashion", "clothing", "fashion-train", "fashion-test",
         ("pub-mnist", "pub-animal", "digits", "faces", "pub-textures", "pub-photos"), "fmnist-cnn", True),
    Task("animal", "silhouettes", "animal-train", "animal-test",
         ("pub-animal", "pub-mnist", "pub-shoes", "digits", "faces", "pub-textures"), "fmnist-cnn", False, "pub-animal"),
    Task("textures", "textures", "textures-train", "textures-test",
         ("pub-textures", "pub-photos", "pub-mnist", "pub-fashion", "faces", "pub-shoes"), "fmnist-cnn", False, "pub-textures"),
    Task("medical", "medical", "medical-train", "medical-test",
         ("pub-textures", "pub-photos", "pub-mnist", "pub-fashion", "faces", "digits"), "fmnist-cnn", True),
    Task("photos", "rgb-photos", "photos-train", "photos-test",
         ("pub-photos", "pub-textures", "pub-fashion", "pub-mnist", "faces", "digits"), "fmnist-cnn@32x3", False, "pub-photos"),
    # round 2: all held out (split2.json), defined after round 1's results were seen, before any run on them
    Task("mnist-rot", "digits", "mnist-rot-train", "mnist-rot-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("fashion-m", "rgb-clothing", "fashion-m-train", "fashion-m-test",
         ("pub-fashion", "pub-mnist", "pub-photos", "pub-animal", "faces", "digits"), "fmnist-cnn@32x3", True),
    Task("animal-rot", "silhouettes", "animal-rot-train", "animal-rot-test",
         ("pub-animal", "pub-mnist", "pub-fashion", "pub-shoes", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("scenes", "natural-patches", "scenes-train", "scenes-test",
         ("pub-textures", "pub-photos", "pub-mnist", "pub-fashion", "faces", "digits"), "fmnist-cnn", True),
    # round 3: all held out (split3.json), defined after round 2's results were seen, before any run on them
    Task("glyphs", "glyphs", "glyphs-train", "glyphs-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("scans", "medical", "scans-train", "scans-test",
         ("pub-textures", "pub-photos", "pub-mnist", "pub-fashion", "faces", "digits"), "fmnist-cnn", True),
    Task("mnist-clutter", "digits", "mnist-clutter-train", "mnist-clutter-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("fashion-flip", "clothing", "fashion-flip-train", "fashion-flip-test",
         ("pub-fashion", "pub-shoes", "pub-mnist", "pub-animal", "faces", "digits"), "fmnist-cnn", True),
    # round 4: all held out (split4.json), defined after round 3's results were seen, before any run on them
    Task("letters", "glyphs", "letters-train", "letters-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("fashion-lowres", "clothing", "fashion-lowres-train", "fashion-lowres-test",
         ("pub-fashion", "pub-shoes", "pub-mnist", "pub-animal", "faces", "digits"), "fmnist-cnn", True),
    Task("mnist-noisy", "digits", "mnist-noisy-train", "mnist-noisy-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("photos2", "rgb-photos", "photos2-train", "photos2-test",
         ("pub-photos", "pub-textures", "pub-fashion", "pub-mnist", "faces", "digits"), "fmnist-cnn@32x3", True),
    # round 5: all held out (split5.json), defined after round 4 and the in-sample probe variants were seen
    Task("mnist-blur", "digits", "mnist-blur-train", "mnist-blur-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("fashion-noisy", "clothing", "fashion-noisy-train", "fashion-noisy-test",
         ("pub-fashion", "pub-shoes", "pub-mnist", "pub-animal", "faces", "digits"), "fmnist-cnn", True),
    Task("letters-uz", "glyphs", "letters-uz-train", "letters-uz-test",
         ("pub-mnist", "digits", "pub-fashion", "pub-animal", "faces", "pub-textures"), "fmnist-cnn", True),
    Task("graphics", "graphics", "graphics-train", "graphics-test",
         ("pub-textures", "pub-photos", "pub-mnist", "pub-fashion", "faces", "digits"), "fmnist-cnn", True),
)}
#: each transformed task's untransformed source candidate (:attr:`Task.source`), from prepare.py's docstring: mnist-neg
#: (MNIST inverted), mnist-m (MNIST blended into photo crops), mnist-rot (rotated), mnist-clutter (shrunk over fragments
#: of other digits), mnist-noisy (over intensity ramps with pixel noise), mnist-blur (blurred and faint): pub-mnist;
#: fashion-m (in photo crops), fashion-flip (upside down and inverted), fashion-lowres (14x14, enlarged back),
#: fashion-noisy (over ramps with pixel noise): pub-fashion; animal-rot (rotated): pub-animal. The other tasks are not
#: transforms of a candidate's source (glyphs, letters, patches of photos) or are a split of it (``same``).
SOURCES = {"mnist-neg": "pub-mnist", "mnist-m": "pub-mnist", "mnist-rot": "pub-mnist", "mnist-clutter": "pub-mnist",
           "mnist-noisy": "pub-mnist", "mnist-blur": "pub-mnist", "fashion-m": "pub-fashion", "fashion-flip": "pub-fashion",
           "fashion-lowres": "pub-fashion", "fashion-noisy": "pub-fashion", "animal-rot": "pub-animal"}
TASKS = {n: (dataclasses.replace(t, source=SOURCES[n]) if n in SOURCES else t) for n, t in TASKS.items()}
ROUND1 = ("mnist", "mnist-neg", "mnist-m", "fashion", "animal", "textures", "medical", "photos")
ROUND2 = ("mnist-rot", "fashion-m", "animal-rot", "scenes")
SPLIT2 = Path(__file__).with_name("split2.json")
ROUND3 = ("glyphs", "scans", "mnist-clutter", "fashion-flip")
SPLIT3 = Path(__file__).with_name("split3.json")
ROUND4 = ("letters", "fashion-lowres", "mnist-noisy", "photos2")
SPLIT4 = Path(__file__).with_name("split4.json")
ROUND5 = ("mnist-blur", "fashion-noisy", "letters-uz", "graphics")
SPLIT5 = Path(__file__).with_name("split5.json")
#: round 5's pre-registered comparison arms (benchmarks/validity/heldout/variants.py; not gsd's default)
FEW_SHOT_RULE = (
    "auto:few10 and auto:few25: gsd's advice (gsd_cli.train.advice.advise) with the probe's gains replaced by those of a "
    "few-shot probe, the same ridge fitted on 10 or 25 private examples per class of each draw and scored on the rest, "
    "averaged over 5 splits (validity.heldout.variants), computed from the same stage-1 features. Proposed after the "
    "in-sample comparison on rounds 1-4 (heldout_probe_variants.md); written down before any run on round 5. A variant "
    "would be proposed as gsd's default only if on round 5 it has at least as many (task, seed) cells within 0.5 points of "
    "tuned DP-SGD as auto:probe and a larger mean gain on the tasks where the oracle gains 3 or more; the change itself "
    "would then need another new round")
#: round 3's pre-registered exploratory arm (scored beside auto:probe; not gsd's default)
SAME_CLASSES_RULE = (
    "auto:probe-same: auto:probe's decision (gsd_cli.train.advice.advise with the probe), except that where it trains the "
    "second phase with a candidate T and the advice restricted to the candidates whose every class is a private class by "
    "name (their stage 1 trains the private head) would train the second phase with another candidate S, S is taken "
    "unless T's probe gain is larger than S's with confidence (one-sided paired t-test over the probe's repeats, alpha "
    "0.05). Motivated by round 2 (the probe refits a head and cannot see the trained head that such a set hands over); "
    "written down before any run on round 3, and not gsd's default: a later round would have to confirm it")



def null(task: str) -> str:
    """The null public set of GEP for ``task``: uniform noise of the private data's shape."""
    return "noise-32rgb" if TASKS[task].model.endswith("x3") else "noise-28"


#: the rule that assigns tasks to the selection and held-out stages (written to split.json with the result)
SPLIT_RULE = ("tasks ordered by sha256('gsd-issue-42:<salt>:<task>'); the first four are held out, the rest are "
              "selection; salt = the smallest integer from 0 for which the held-out tasks cover at least 3 kinds "
              "and at least 2 realistic tasks, and the selection tasks at least 1 realistic task and 3 kinds")


def assign(tasks: dict[str, Task] | None = None) -> tuple[int, list[str], list[str]]:
    """(salt, selection, held out) by :data:`SPLIT_RULE`; a function of the task names and kinds only."""
    import hashlib

    tasks = tasks or {n: TASKS[n] for n in ROUND1}
    for salt in range(1000):
        order = sorted(tasks, key=lambda t: hashlib.sha256(f"gsd-issue-42:{salt}:{t}".encode()).hexdigest())
        held, sel = order[:4], order[4:]
        ok = (len({tasks[t].kind for t in held}) >= 3 and sum(tasks[t].realistic for t in held) >= 2
              and sum(tasks[t].realistic for t in sel) >= 1 and len({tasks[t].kind for t in sel}) >= 3)
        if ok:
            return salt, sorted(sel, key=list(tasks).index), sorted(held, key=list(tasks).index)
    raise RuntimeError("no salt below 1000 satisfies the split rule")


def write_split() -> dict:
    """Write split.json (refuses to overwrite: the split is frozen before any run)."""
    if SPLIT.is_file():
        raise SystemExit(f"{SPLIT} exists: the split is frozen (delete it only to start the benchmark over)")
    salt, sel, held = assign()
    doc = {"selection": sel, "held_out": held, "rule": SPLIT_RULE, "salt": salt,
           "tasks": {n: {"kind": t.kind, "realistic": t.realistic, "private_train": t.train, "candidates": list(t.candidates)}
                     for n, t in TASKS.items() if n in ROUND1},
           "note": "written before any training or ranking run; nothing (default, threshold, learning rate, epochs) "
                   "is chosen on a held-out cell. The commit that froze it: git log -1 --format=%H -- split.json"}
    SPLIT.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


@functools.cache
def register() -> None:
    """Make every benchmark set resolvable by name (an npz source each)."""
    from ..npz_sets import register_npz

    register_npz(NAMES, data_dir(), "python -m validity.heldout prepare")


@functools.cache
def sizes() -> dict[str, int]:
    """Examples of every set (the public sizes are what the ``largest`` arm reads)."""
    from gsd_cli.data import resolve

    register()
    return {n: len(resolve(n)) for n in {c for t in TASKS.values() for c in (t.train, *t.candidates)}}


#: the rule written into each later round's split file
ROUND_RULES = {
    2: ("round 2: every task is held out. Defined after round 1's held-out results had been seen (which "
        "makes round 1's held-out tasks in-sample for any change made since), and written before any "
        "training or ranking run on them; nothing is chosen on them"),
    3: ("round 3: every task is held out. Defined after round 2's held-out results had been seen, and written "
        "before any training or ranking run on them; nothing is chosen on them. gsd's advice and probe decide as in round 2's runs "
        "(later commits refactored them; round 2's scores re-run with them gave the same figures), so round 2 "
        "and round 3 are both held out for the advice under test and are also scored together"),
    4: ("round 4: every task is held out. Defined after round 3's held-out results had been seen, and written "
        "before any training or ranking run on them; nothing is chosen on them. gsd's advice and probe decide as "
        "in rounds 2 and 3 (since then only the wording of the probe's line changed), so rounds 2, 3 and 4 are all "
        "held out for the advice under test and are also scored together. The exploratory arm auto:probe-same "
        "(split3.json) is scored again; two of the four tasks (fashion-lowres, mnist-noisy) offer candidates whose "
        "classes are the private task's"),
    5: ("round 5: every task is held out. Defined after round 4's held-out results and the in-sample probe variants had "
        "been seen, and written before any training or ranking run on them; nothing is chosen on them. gsd's advice and "
        "probe decide as in rounds 2-4, so rounds 2-5 are all held out for it. The pre-registered comparison arms are "
        "in few_shot_arms"),
}
ROUNDS = {2: (ROUND2, SPLIT2), 3: (ROUND3, SPLIT3), 4: (ROUND4, SPLIT4), 5: (ROUND5, SPLIT5)}
#: the stages of the later rounds (``run``/``rank --stage held-out-N``)
ROUND_STAGES = tuple(f"held-out-{n}" for n in ROUNDS)
#: the files whose last commit rounds 3-5 name as the gsd under test
_ADVICE_FILES = ("../../../gsd_cli/train/advice.py", "../../../gsd_cli/train/probe.py", "../../../gsd_cli/train/select.py",
                 "../../../gsd_cli/train/second_phase.py")
UNDER_TEST = {3: ("../../../gsd_cli",), 4: _ADVICE_FILES, 5: _ADVICE_FILES}


def write_round(n: int) -> dict:
    """Write round ``n``'s split file (2-5): its tasks, all held out, the rule, from round 3 the gsd
    commit under test and the exploratory arm, and in round 5 the few-shot arms. Refuses to overwrite: a round is frozen before any run."""
    import subprocess

    tasks, path = ROUNDS[n]
    if path.is_file():
        raise SystemExit(f"{path} exists: round {n}'s split is frozen")
    doc = {"held_out": list(tasks), "rule": ROUND_RULES[n]}
    if n in UNDER_TEST:
        doc["gsd_cli_commit"] = subprocess.run(["git", "-C", str(path.parent), "log", "-1", "--format=%H", "--", *UNDER_TEST[n]],
                                               capture_output=True, text=True, check=False).stdout.strip()
        doc["exploratory_arm"] = SAME_CLASSES_RULE
    if n == 5:
        doc["few_shot_arms"] = FEW_SHOT_RULE
    doc["tasks"] = {t: {"kind": TASKS[t].kind, "realistic": TASKS[t].realistic, "private_train": TASKS[t].train,
                        "candidates": list(TASKS[t].candidates)} for t in tasks}
    doc["note"] = f"the commit that froze it: git log -1 --format=%H -- {path.name}"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def read_round(n: int) -> dict:
    """Round ``n``'s split file (2-5)."""
    path = ROUNDS[n][1]
    if not path.is_file():
        raise SystemExit(f"{path} is missing: python -m validity.heldout split{n} (before any run)")
    return json.loads(path.read_text())


def split() -> dict:
    """``split.json``: which tasks are selection and which held out, the rule, and the commit that froze it."""
    if not SPLIT.is_file():
        raise SystemExit(f"{SPLIT} is missing: python -m validity.heldout split (before any run)")
    return json.loads(SPLIT.read_text())
