"""The ``ray`` executor: each public subspace of a ranking is one Ray task on the cluster's workers.

>>> from gsd_cli.ranking import rank
>>> r = rank("mnist-a", ["mnist-b", "noise"], examples=200, executor="ray")    # doctest: +SKIP

:class:`RayExecutor` connects to the cluster at ``address`` (``ray.init(address)``: ``"auto"``,
``"HOST:6379"``, ``"ray://HOST:10001"``; default ``$RAY_ADDRESS``, else a Ray instance started on
this machine), submits one task per public candidate, at most ``tasks_in_flight`` at a time, and
yields each subspace as it arrives (so the disk cache is written, and the ranking compares it with the
private side and drops it, as the run goes: the driver holds the private basis and the few results in
flight, never every public basis of a large catalogue). Ray itself is an optional extra, imported only here and only
when the executor is built: ``pip install 'gsd-cli[ray]'``.

**What crosses the network.** To a worker: the public sample (its source object: a file-backed
source's paths, which the worker reads itself, or an in-memory public set, put once in the object
store and shared by every task), the seed of its labels, and a :class:`~gsd_cli.ranking.executors.PublicRecipe`
(settings, the model's spec; the worker rebuilds w0). Back: one public subspace, p x k float64 and
k singular values. Never the private examples, their gradients, the private subspace, the driver's
model or the distance object (DP-GSD's holds the secret generator): the private side is always
computed in the driver, by the pipeline, before any task is submitted.

**Scheduling.** ``num_cpus`` per task (torch runs that many threads in it), ``num_gpus`` per task
(default: 1 when the cluster has GPUs and ``device`` is not ``cpu``; the worker then resolves
``auto`` to its GPU). A worker that dies is retried by Ray (``max_retries``), as is a task that raised
``OSError`` (a file system hiccup); a :class:`GSDError` on a worker (bad input) is not, and comes back
as the same one-line error. ``jobs_in_flight``: catalogue jobs that overlap (their public tasks
queued together so the workers stay busy; their driver work takes turns, see
:class:`~gsd_cli.ranking.executors.DriverTurns`). ``tasks_in_flight``: the most tasks one job has
submitted and not yet handed on (default: twice the tasks the cluster runs at once, so the workers
never wait on the driver); the next is submitted as each result arrives. The object store and the
driver then hold a bounded number of results and public sources, whatever the catalogue's size; each
source is put in the store once while tasks that need it are in flight, and released after.

**Workers keep their model.** The task function is never retired after a call (``max_calls=0``; Ray
would otherwise start a new process for every GPU task), so a worker process keeps the model it built
from the spec between tasks (:class:`~gsd_cli.ranking.executors.PublicRecipe`), as the local run uses
one model for every candidate. ``models_built`` counts the models each worker process built (by pid)
for this executor's tasks; ``most_in_flight`` is the most tasks one run had in flight.

**Determinism.** A task's result depends on its inputs only (seeded public draws and labels, w0 from
the seed, the private side's engine), not on the worker or the order of completion: the results of
a run equal a local run's to the float rounding of the device and thread count.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path

from ..errors import GSDError
from .executors import DriverTurns, PublicSide, register_executor

#: test hook only: a folder in which an "arm" file named for a candidate (the last part of its name)
#: makes one task for it kill its worker (the file is removed first): tests see Ray retry a dead worker
FAIL_ONCE_ENV = "GSD_TEST_RAY_FAIL_ONCE"
INSTALL = "install it with: pip install 'gsd-cli[ray]'"


def import_ray():
    """The ``ray`` module, or a one-line :class:`GSDError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise GSDError(f"--executor ray needs Ray, which is not installed; {INSTALL}") from None
    return ray


@register_executor("ray")
class RayExecutor:
    """Public subspaces as Ray tasks (module docstring). ``init``: more keywords of ``ray.init`` when
    this executor starts Ray itself."""

    def __init__(self, address: str | None = None, *, num_cpus: float = 1, num_gpus: float | None = None,
                 max_retries: int = 3, jobs_in_flight: int = 4, tasks_in_flight: int | None = None,
                 init: dict | None = None):
        self.ray = import_ray()
        if (num_cpus <= 0 or (num_gpus is not None and num_gpus < 0) or max_retries < 0 or jobs_in_flight < 1
                or (tasks_in_flight is not None and tasks_in_flight < 1)):
            raise GSDError("the ray executor needs num_cpus > 0, num_gpus >= 0, max_retries >= 0, jobs_in_flight >= 1 "
                           "and tasks_in_flight >= 1")
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.max_retries, self.jobs_in_flight, self.init = max_retries, jobs_in_flight, dict(init or {})
        self.tasks_in_flight = tasks_in_flight
        self.turns = DriverTurns()
        self.started = False  # whether this executor started Ray (close() then stops it)
        self.submitted = 0  # tasks submitted so far
        self.most_in_flight = 0  # the most tasks one run had submitted and not yet handed on
        self.models_built: Counter = Counter()  # worker pid -> models it built for this executor's tasks
        self._generation = 0  # stop() starts a new one: the runs of the older ones end
        self._lock = threading.Lock()
        self._refs: dict[int, list] = {}  # id(object) -> [object kept alive, its ObjectRef, tasks in flight using it]
        self._remote = None
        self._unreachable: str | None = None

    def connect(self) -> None:
        """Join the cluster at ``address`` (or ``$RAY_ADDRESS``), or start a local one; once."""
        ray = self.ray
        if ray.is_initialized():
            return
        if self._unreachable is not None:  # tried once (Ray waits ~20 s): the next jobs fail at once
            raise GSDError(self._unreachable)
        try:
            ray.init(address=self.address, include_dashboard=False, logging_level="warning", **self.init)
        except (ConnectionError, ValueError, RuntimeError) as e:
            where = self.address or os.environ.get("RAY_ADDRESS") or "a local instance"
            self._unreachable = (f"cannot connect to the Ray cluster at {where}: {' '.join(str(e).split())[:300]}; "
                                 "check --ray-address (e.g. ray://HOST:10001 or HOST:6379)")
            raise GSDError(self._unreachable) from None
        self.started = True

    def stop(self) -> None:
        """Make every run now waiting on this executor end (within a second) with an error: the
        overlapping jobs of a catalogue whose consumer stopped (an error, Ctrl-C). Later runs are not
        affected."""
        self._generation += 1

    def close(self) -> None:
        """Stop Ray if this executor started it; forget the objects put in its store."""
        self._refs.clear()
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()
        self.started = False

    def run(self, tasks, compute):
        """Yield ``(task, subspace)`` as each task finishes (any order), with at most ``tasks_in_flight``
        submitted and not yet handed on: the next task is submitted as each result arrives."""
        if not tasks:
            return
        if not isinstance(compute, PublicSide):
            raise GSDError("the ray executor computes the public sides of a ranking (a PublicSide), not an arbitrary function")
        self.connect()
        generation = self._generation
        recipe = compute.recipe()
        options = self._options(recipe.device)
        window = self._window(options)
        progress = compute.ctx.common.get("progress")
        todo, owner = iter(tasks), {}
        recipe_ref = self._put(recipe)

        def submit_next() -> bool:
            t = next(todo, None)
            if t is None:
                return False
            owner[self._submit((recipe_ref, self._put(t.sample.source), t.sample.indices, t.seed), options)] = t
            self.most_in_flight = max(self.most_in_flight, len(owner))
            return True

        while len(owner) < window and submit_next():
            pass
        try:
            while owner:
                if self._generation != generation:
                    raise GSDError("the run was stopped before every public subspace was computed")
                with self.turns.waiting():  # another job's driver work may run meanwhile
                    ready, _ = self.ray.wait(list(owner), num_returns=1, timeout=1.0)
                for ref in ready:
                    task = owner.pop(ref)  # the driver keeps no reference to a result it has handed on
                    self._release(task.sample.source)
                    sub, pid, built = self._get(ref, task.name)
                    self.models_built[pid] += built
                    del ref
                    submit_next()  # the workers go on while the driver compares this one
                    if progress is not None:
                        progress(task.name, len(task.sample), len(task.sample))
                    yield task, sub
                    del sub
                ready = None
        finally:
            for ref, t in owner.items():  # a failed or abandoned run leaves no task behind
                self._release(t.sample.source)
                try:
                    self.ray.cancel(ref)
                except Exception:  # noqa: BLE001 (Ray already shut down)
                    pass
            owner.clear()
            self._release(recipe)

    def _window(self, options: dict) -> int:
        """Tasks one run keeps in flight: ``tasks_in_flight``, else twice the tasks the cluster can run
        at once (its CPUs, or GPUs for GPU tasks, over what one task asks for)."""
        if self.tasks_in_flight is not None:
            return self.tasks_in_flight
        res = self.ray.cluster_resources()
        slots = res.get("CPU", 1) / options["num_cpus"]
        if options["num_gpus"]:
            slots = min(slots, res.get("GPU", 0) / options["num_gpus"])
        return max(2, 2 * int(slots))

    def _options(self, device: str) -> dict:
        gpus = self.num_gpus
        has_gpu = self.ray.cluster_resources().get("GPU", 0) > 0
        if device.startswith("cuda") and not has_gpu and not gpus:
            raise GSDError("--device cuda was asked for but the Ray cluster has no GPU; use --device auto or cpu")
        if gpus is None:
            gpus = 1 if has_gpu and device != "cpu" else 0
        return dict(num_cpus=self.num_cpus, num_gpus=gpus, max_retries=self.max_retries, retry_exceptions=[OSError])

    def _put(self, obj):
        """``ray.put(obj)`` once while tasks that need it are in flight (a source shared by several
        candidates or overlapping jobs is sent once); each call is one use, ended by :meth:`_release`."""
        with self._lock:
            kept = self._refs.get(id(obj))
            if kept is None or kept[0] is not obj:
                kept = self._refs[id(obj)] = [obj, self.ray.put(obj), 0]
            kept[2] += 1
            return kept[1]

    def _release(self, obj) -> None:
        """End one use of ``obj``; after its last one the driver drops its reference (Ray frees the
        object once no task that was given it is left)."""
        with self._lock:
            kept = self._refs.get(id(obj))
            if kept is not None and kept[0] is obj:
                kept[2] -= 1
                if kept[2] <= 0:
                    del self._refs[id(obj)]

    def _submit(self, args: tuple, options: dict):
        """One task: ``args`` = (recipe ref, public source ref, indices, label seed), all it receives."""
        if self._remote is None:
            # max_calls=0: the worker process is never retired after a task (Ray's default retires it after
            # every GPU task), so it keeps the model it built between tasks
            self._remote = self.ray.remote(max_calls=0)(public_subspace_task)
        self.submitted += 1
        return self._remote.options(**options).remote(*args)

    def _get(self, ref, name: str):
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:  # the worker's own exception (a GSDError: its one line)
            raise (e.cause if isinstance(e.cause, Exception) else e) from None
        except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.OutOfMemoryError) as e:
            raise GSDError(f"public candidate {name}: its Ray worker died {self.max_retries + 1} time(s) "
                           f"({type(e).__name__}); see the workers' logs (ray logs) for memory or GPU errors") from None


def public_subspace_task(recipe, source, indices, seed):
    """The body of one Ray task, on a worker: the public side of ``source[indices]``, with this worker
    process's id and the number of models it built for it (0 when it kept the last task's)."""
    import torch

    from .. import data as gdata
    from . import executors

    _fail_once_for_tests(source.name)
    try:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
    except Exception:  # noqa: BLE001 (outside Ray: one thread)
        cpus = 1
    torch.set_num_threads(max(1, int(cpus)))
    before = executors.WORKER_BUILDS[0]
    sub = recipe.compute(gdata.Sample(source, indices), seed)
    return sub, os.getpid(), executors.WORKER_BUILDS[0] - before


def _fail_once_for_tests(name: str) -> None:
    folder = os.environ.get(FAIL_ONCE_ENV)
    if not folder:
        return
    arm = Path(folder) / Path(name).name  # "near", or "mid.npz" for npz:/data/mid.npz
    try:
        arm.unlink()
    except FileNotFoundError:
        return
    os._exit(1)  # a worker that dies, as an out-of-memory kill would
