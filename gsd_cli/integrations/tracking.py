"""Experiment tracking: ``--log tensorboard`` and ``--log mlflow`` for ``gsd train`` and ``gsd rank``.

A :class:`Tracker` receives what the run writes anyway, nothing more:

* ``gsd train`` (:func:`train_tracked`): every row of ``metrics.jsonl`` as it is written (one point
  per epoch, x-axis = epoch), the run's public settings as parameters, and at the end the privacy
  ledger of ``summary.json`` (``budget``: every release and the total epsilon and delta) as parameters
  ``privacy.*`` and as the text/artifact ``privacy_ledger.json``. The rows are read back from
  ``metrics.jsonl`` when the trainer reports an epoch done (its ``progress`` callback), so the trainer
  itself is unchanged and what is logged is exactly what the file holds.
* ``gsd rank`` (:func:`log_ranking`, and :func:`track_catalog` for ``--catalog``, job by job as each
  finishes): one run per ranking with each candidate's distance and rank (``distance/<candidate>``,
  ``rank/<candidate>``), the settings, the DP-GSD privacy block (``privacy.*``) and the ranking's JSON.

Every run carries the tag ``dp`` (``true``/``false``: whether the output is differentially private,
as the run's own summary says) and ``gsd.publishable = false``: the rows of ``metrics.jsonl`` hold
test metrics of the private data, which no guarantee covers (:mod:`gsd_cli.train.release`). Send
them only to a tracking server as private as the run folder.

Backends (optional extras, imported only when asked for):

* ``tensorboard`` (``pip install 'gsd-cli[tensorboard]'``): :class:`torch.utils.tensorboard.SummaryWriter`
  in ``<log_dir>/tb`` (``gsd train``: ``log_dir`` = the run folder; ``gsd rank``: the working folder,
  one sub-folder ``<job>-<time>`` per ranking). Tags and parameters become text summaries.
* ``mlflow`` (``pip install 'gsd-cli[mlflow]'``, mlflow-skinny is enough): one MLflow run (experiment
  ``$MLFLOW_EXPERIMENT_NAME``, else ``gsd``) in ``$MLFLOW_TRACKING_URI`` when set, else in the local
  file store ``file:<log_dir>/mlruns`` (MLflow 3 keeps its file store in maintenance mode behind
  ``MLFLOW_ALLOW_FILE_STORE``; gsd allows it while opening a ``file:`` store, unless that variable is
  set: mlflow-skinny has no SQL store; with full MLflow, ``MLFLOW_TRACKING_URI=sqlite:///mlflow.db``).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable, Iterable, Protocol, Sequence

from ..errors import GSDError

BACKENDS = ("tensorboard", "mlflow")
INSTALL = "install it with: pip install 'gsd-cli[{extra}]'"
EXPERIMENT = "gsd"


class Tracker(Protocol):
    """What gsd sends to an experiment tracker (one run of it)."""

    def set_tags(self, tags: dict[str, str]) -> None: ...

    def log_params(self, params: dict[str, str]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...

    def log_text(self, text: str, name: str) -> None: ...

    def close(self, failed: bool = False) -> None: ...


def check_backends(kinds: Iterable[str]) -> list[str]:
    """The backends ``kinds`` (each once, in order), after checking each is known and installed:
    a :class:`GSDError` naming the extra to install otherwise (before any work is done)."""
    kinds = list(dict.fromkeys(kinds or ()))
    for kind in kinds:
        if kind not in BACKENDS:
            raise GSDError(f"unknown --log {kind!r}; use one of {', '.join(BACKENDS)}")
        try:
            if kind == "tensorboard":
                import tensorboard  # noqa: F401  (torch.utils.tensorboard needs it)
            else:
                import mlflow  # noqa: F401
        except ImportError:
            raise GSDError(f"--log {kind} needs {'TensorBoard' if kind == 'tensorboard' else 'MLflow'}; "
                           + INSTALL.format(extra=kind)) from None
    return kinds


class TensorBoardTracker:
    """A :class:`Tracker` writing TensorBoard event files to ``log_dir`` (a new event file per run;
    nothing there is overwritten). Tags and parameters are text summaries ``tags/<name>`` and ``params``."""

    def __init__(self, log_dir: str | Path):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))

    def set_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.writer.add_text(f"tags/{k}", str(v), 0)

    def log_params(self, params: dict[str, str]) -> None:
        if params:
            table = "| parameter | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in params.items())
            self.writer.add_text("params", table, 0)

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)

    def log_text(self, text: str, name: str) -> None:
        self.writer.add_text(name, "```\n" + text + "\n```", 0)

    def close(self, failed: bool = False) -> None:
        self.writer.flush()
        self.writer.close()


_MLFLOW_NAME = re.compile(r"[^\w.\-/ ]")


def mlflow_key(name: str) -> str:
    """A metric or parameter name MLflow accepts (letters, digits, ``_ - . / space``; others -> ``_``)."""
    return _MLFLOW_NAME.sub("_", str(name))[:250]


class MLflowTracker:
    """A :class:`Tracker` logging one MLflow run through :class:`mlflow.MlflowClient` (no global
    active run): in ``tracking_uri`` (None: ``$MLFLOW_TRACKING_URI``, else MLflow's default),
    experiment ``experiment`` (created when missing), named ``run_name``."""

    def __init__(self, tracking_uri: str | None, run_name: str | None = None, experiment: str | None = None):
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        local = tracking_uri is not None and tracking_uri.startswith("file:")
        saved = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
        if local and saved is None:  # a file: store asked for (the store object is cached per URI)
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        try:
            self.client = MlflowClient(tracking_uri=tracking_uri)
            name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
            exp = self.client.get_experiment_by_name(name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
            self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        except Exception as e:  # noqa: BLE001  (MLflow's own errors: a bad URI, a refused store)
            raise GSDError(f"--log mlflow: cannot open a run in {tracking_uri or 'the default store'}: "
                           f"{' '.join(str(e).split())[:300]}") from None
        finally:
            if local and saved is None:
                os.environ.pop("MLFLOW_ALLOW_FILE_STORE", None)

    def set_tags(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, str(v))

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(mlflow_key(k), str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters per batch
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(mlflow_key(k), float(v), now, int(step)) for k, v in metrics.items()]
        for i in range(0, len(items), 1000):
            self.client.log_batch(self.run_id, metrics=items[i : i + 1000])

    def log_text(self, text: str, name: str) -> None:
        self.client.log_text(self.run_id, text, name)

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


class Trackers:
    """Several trackers as one (each call goes to every one)."""

    def __init__(self, trackers: Sequence[Tracker]):
        self.trackers = list(trackers)

    def __getattr__(self, name: str) -> Callable:
        def call(*args, **kwargs):
            for t in self.trackers:
                getattr(t, name)(*args, **kwargs)

        return call


def open_trackers(kinds: Sequence[str], log_dir: str | Path, run_name: str, tb_subdir: str | None = None) -> Trackers:
    """One tracker per backend in ``kinds``: TensorBoard in ``<log_dir>/tb[/<tb_subdir>]``, MLflow in
    ``$MLFLOW_TRACKING_URI`` or ``file:<log_dir>/mlruns``, each run named ``run_name``."""
    log_dir = Path(log_dir).expanduser()
    out = []
    for kind in check_backends(kinds):
        if kind == "tensorboard":
            out.append(TensorBoardTracker(log_dir / "tb" / tb_subdir if tb_subdir else log_dir / "tb"))
        else:
            uri = os.environ.get("MLFLOW_TRACKING_URI") or (log_dir / "mlruns").resolve().as_uri()
            out.append(MLflowTracker(uri, run_name))
    return Trackers(out)


def flat_metrics(row: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of one ``metrics.jsonl`` row (nested dicts as ``a/b``; booleans, strings, lists and
    missing values left out)."""
    out: dict[str, float] = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(flat_metrics(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = float(v)
    return out


def flat_params(d: dict, prefix: str = "") -> dict[str, str]:
    """A settings dict as ``{name: text}`` (nested dicts as ``a.b``; None as ``None``)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if isinstance(v, (list, tuple)) else str(v)
    return out


def _dp_tag(dp) -> str:
    return "true" if dp else "false"


def ledger_params(budget: dict) -> dict[str, str]:
    """The privacy ledger (``Ledger.to_dict()``) as parameters ``privacy.*``."""
    params = {"privacy.total_epsilon": str(budget.get("total_epsilon")), "privacy.total_delta": str(budget.get("total_delta")),
              "privacy.composition": str(budget.get("composition"))}
    for i, e in enumerate(budget.get("entries", [])):
        params[f"privacy.entry{i}.name"] = str(e.get("name"))
        params[f"privacy.entry{i}.epsilon"] = str(e.get("epsilon"))
        params[f"privacy.entry{i}.delta"] = str(e.get("delta"))
    return params


class MetricsFollower:
    """A ``progress(kind, done, total)`` callback for :func:`gsd_cli.train.train`: at each finished
    epoch it logs the rows of ``<out>/metrics.jsonl`` up to that epoch not logged yet (opening the
    trackers at the first one: the run folder must be empty when training starts), then calls
    ``inner`` (the caller's own progress callback)."""

    def __init__(self, out: Path, open_fn: Callable[[], Trackers], inner: Callable | None = None, tags: dict | None = None):
        self.out = Path(out)
        self.open_fn = open_fn
        self.inner = inner
        self.tags = tags or {}
        self.trackers: Trackers | None = None
        self.logged = 0  # last epoch logged

    def open(self) -> Trackers:
        if self.trackers is None:
            self.trackers = self.open_fn()
            self.trackers.set_tags(self.tags)
        return self.trackers

    def __call__(self, kind: str, done: int, total: int) -> None:
        if kind == "epoch" and done > self.logged:
            self.flush(done)
        if self.inner is not None:
            self.inner(kind, done, total)

    def flush(self, upto: int | None = None) -> None:
        from ..train.checkpoint import METRICS

        f = self.out / METRICS
        if not f.is_file():
            return
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        for row in rows:
            epoch = int(row.get("epoch", 0))
            if self.logged < epoch and (upto is None or epoch <= upto):
                self.open().log_metrics(flat_metrics(row), epoch)
                self.logged = epoch

    def close(self, failed: bool = False) -> None:
        if self.trackers is not None:
            self.trackers.close(failed)


def train_tracked(config, out: str | Path, *, log: Sequence[str], log_dir: str | Path | None = None,
                  progress: Callable | None = None, **train_kwargs) -> dict | None:
    """:func:`gsd_cli.train.train` (same arguments, same result) with each ``metrics.jsonl`` row, the
    settings, the ``dp`` tag and the final privacy ledger sent to the trackers ``log`` (``tensorboard``,
    ``mlflow``) under ``log_dir`` (default: the run folder ``out``; see the module docstring). Under
    torchrun only process 0 logs."""
    from ..train import train

    kinds = check_backends(log)
    if not kinds or os.environ.get("RANK", "0") != "0":
        return train(config, out, progress=progress, **train_kwargs)
    base = Path(log_dir) if log_dir is not None else Path(out)
    selection = train_kwargs.get("selection")
    # DP: no selection, one chosen from public facts alone (reads_private False: nothing to choose, or declined), or a DP one
    dp = config.private_seed is None and (selection is None or selection.get("reads_private") is False
                                          or bool(selection.get("privacy") and selection.get("dp", True)))
    tags = {"dp": _dp_tag(dp), "gsd.command": "train", "gsd.method": config.method, "gsd.publishable": "false"}
    follower = MetricsFollower(Path(out), lambda: open_trackers(kinds, base, Path(out).name), progress, tags)
    failed = True
    try:
        summary = train(config, out, progress=follower, **train_kwargs)
        if summary is not None:
            follower.flush()
            trackers = follower.open()
            trackers.set_tags({"dp": _dp_tag(summary.get("dp"))})  # the run's own verdict
            trackers.log_params({**flat_params(config.to_dict(), "settings."), **ledger_params(summary["budget"]),
                                 "privacy.sigma": str(summary.get("sigma")), "privacy.steps": str(summary.get("steps"))})
            trackers.log_text(json.dumps(summary["budget"], indent=2), "privacy_ledger.json")
            trackers.log_metrics({"privacy/total_epsilon": summary["budget"]["total_epsilon"]}, follower.logged)
        failed = False
        return summary
    finally:
        follower.close(failed)


def ranking_metrics(ranking) -> dict[str, float]:
    """Each candidate's ``distance/<name>`` and ``rank/<name>`` (over repeats also ``sd/<name>``)."""
    out = {}
    for r in ranking.results:
        out[f"distance/{r.public}"] = float(r.distance)
        out[f"rank/{r.public}"] = float(r.rank)
        sd = getattr(r, "sd", None)
        if sd is not None and sd == sd:
            out[f"sd/{r.public}"] = float(sd)
    return out


def log_ranking(ranking, name: str, log: Sequence[str], log_dir: str | Path = ".") -> None:
    """Send one ranking (:class:`gsd_cli.ranking.Ranking`) to the trackers ``log`` as one run named
    ``name``: distances and ranks, settings, the ``dp`` tag, the privacy block and the JSON."""
    kinds = check_backends(log)
    if not kinds:
        return
    doc = ranking.to_dict()
    folder = re.sub(r"[^\w.-]", "_", name) + time.strftime("-%Y%m%d-%H%M%S")
    trackers = open_trackers(kinds, log_dir, name, tb_subdir=folder)
    try:
        trackers.set_tags({"dp": _dp_tag(doc.get("dp")), "gsd.command": "rank", "gsd.private": str(doc.get("private"))})
        settings = {k: v for k, v in doc.items() if k not in ("results", "runs", "privacy", "warnings", "repeat_seeds")}
        params = flat_params(settings, "settings.")
        if doc.get("privacy"):
            params.update(flat_params({k: v for k, v in doc["privacy"].items() if not isinstance(v, (list, dict))}, "privacy."))
        trackers.log_params(params)
        trackers.log_metrics(ranking_metrics(ranking), 0)
        if doc.get("privacy"):
            trackers.log_text(json.dumps(doc["privacy"], indent=2), "privacy.json")
        trackers.log_text(json.dumps(doc, indent=2, default=str), "ranking.json")
    finally:
        trackers.close()


def track_catalog(log: Sequence[str], log_dir: str | Path = ".", inner: Callable | None = None) -> Callable:
    """An ``on_job(run)`` callback for :func:`gsd_cli.ranking.catalog.run_jobs`: logs each job's ranking as it
    finishes (:func:`log_ranking`, one run per job named after it), then calls ``inner(run)``."""
    kinds = check_backends(log)
    seen = [0]

    def on_job(run) -> None:
        for job, rk in run.results[seen[0]:]:
            log_ranking(rk, job.name, kinds, log_dir)
        seen[0] = len(run.results)
        if inner is not None:
            inner(run)

    return on_job
