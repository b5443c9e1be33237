"""Executors: where the public subspaces of a ranking are computed.

The loop over public candidates is behind one small protocol, :class:`Executor`: given tasks (one
public sample each, under one ranking's settings) and the function that computes a task's subspace,
it yields ``(task, subspace)`` pairs, in any order. :class:`LocalExecutor` (``"local"``, the default)
runs them one after another in this process. An executor for a cluster is one new module with a
class decorated by :func:`register_executor`; it only ever sees *public* samples: the private side
is computed by the pipeline itself, where the private data is.

The caches are consulted in one place, :func:`public_subspaces`, before a task reaches the executor
(the in-memory ``memo`` of repeated rankings, then the disk cache of public subspaces), and written
after, so an executor never deals with caching.

An executor that computes elsewhere (:mod:`.ray_executor`) ships :meth:`PublicSide.recipe`, never the
``compute`` object itself: the recipe holds the ranking's settings and the model's *spec* (rebuilt
at w0 on the worker), not the model the private gradients were taken on, nor the distance object
(DP-GSD's holds the secret generator). An executor that waits on remote work may let the jobs of a
catalogue overlap (``jobs_in_flight`` > 1): the jobs' driver threads then take turns
(:class:`DriverTurns`), so the driver's work (private sides, comparisons) runs one job at a time,
exactly as in a sequential run, while the workers compute every job's public sides.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Protocol

from .. import data as gdata
from ..errors import GSDError
from ..registry import Registry
from ..distance.side import Subspace

if TYPE_CHECKING:
    from ..distance import Distance, SideContext

_EXECUTORS = Registry("executor")


@dataclass
class PublicTask:
    """One public candidate of one ranking: its sample, the seed of its random labels, and the keys
    under which its subspace is cached: ``memo_key`` in memory, ``cache_key()`` on disk (computed
    only when the memory misses: it reads the sample; None: not cached)."""

    sample: gdata.Sample
    seed: int
    memo_key: tuple | None = None
    cache_key: Callable[[], str | None] = field(default=lambda: None)

    @property
    def name(self) -> str:
        return self.sample.source.name


class Executor(Protocol):
    """Computes public subspaces: ``run(tasks, compute)`` yields ``(task, compute(task))`` for every task."""

    name: str

    def run(self, tasks: list[PublicTask], compute: Callable[[PublicTask], Subspace]) -> Iterator[tuple[PublicTask, Subspace]]: ...


def register_executor(name: str):
    """Class decorator: make ``name`` an executor (``rank(..., executor=name)``)."""
    return _EXECUTORS.register(name)


def executor_names() -> list[str]:
    return _EXECUTORS.names()


def get_executor(executor: "str | Executor | None", **options) -> Executor:
    """An executor object from a registered name (default ``local``), built with ``options``
    (``get_executor("ray", address="ray://head:10001")``), or an object with ``run`` as it is."""
    if executor is None:
        executor = "local"
    if isinstance(executor, str):
        return _EXECUTORS.get(executor)(**options)
    if not callable(getattr(executor, "run", None)):
        raise GSDError("an executor needs a run(tasks, compute) method")
    return executor


@register_executor("local")
class LocalExecutor:
    """One task after another, in this process (today's path)."""

    def run(self, tasks, compute):
        for task in tasks:
            yield task, compute(task)


@dataclass
class PublicSide:
    """The ``compute`` of one ranking's public tasks: ``distance.public_side(ctx, sample, seed)``."""

    distance: "Distance"
    ctx: "SideContext"

    def __call__(self, task: PublicTask) -> Subspace:
        return self.distance.public_side(self.ctx, task.sample, task.seed)

    def recipe(self) -> "PublicRecipe":
        """What a worker needs to compute a public side here, and nothing private (see :class:`PublicRecipe`)."""
        cfg = self.distance.config
        return PublicRecipe(
            distance=type(self.distance), config=cfg.replace(insecure_seed=None), dims=self.ctx.dims,
            common={k: v for k, v in self.ctx.common.items() if k not in ("progress", "device")},
            device=str(cfg.gradients.device),
        )


#: the model a worker process built for its last public side, by its spec (:meth:`PublicRecipe.compute`)
_WORKER_MODELS: dict = {}
#: how many models this process has built in :meth:`PublicRecipe.compute` (the Ray executor reports it per worker)
WORKER_BUILDS = [0]


@dataclass(frozen=True)
class PublicRecipe:
    """A public side, described for a worker: the distance's class and the ranking's settings (its
    ``insecure_seed`` dropped), the sides' shared settings (k, labels, engine... ``num_classes`` is
    the declared class count, as the model's shape), and the device as the user gave it (``auto``:
    the worker's GPU when it has one). The model is rebuilt from its spec at w0 (the seed, ``weights``
    and ``peft`` of the settings), never shipped: the driver's copy has seen the private data."""

    distance: type
    config: object
    dims: int
    common: dict
    device: str = "auto"

    def compute(self, sample: gdata.Sample, seed: int) -> Subspace:
        """The public side of ``sample`` (labels seeded by ``seed``), computed in this process."""
        from ..distance import SideContext
        from ..models.peft import build_model

        m = self.config.model
        key = (m.model, self.common["num_classes"], self.config.seed, m.weights, m.peft,
               None if m.params is None else tuple([m.params] if isinstance(m.params, str) else m.params), m.batchnorm)
        built = _WORKER_MODELS.get(key) if isinstance(m.model, str) else None
        if built is None:  # a worker process keeps the model between tasks (as the local executor's one model serves
            built = build_model(m.model, self.common["num_classes"], self.config.seed, weights=m.weights,  # every candidate)
                                peft=m.peft, params=m.params, batchnorm=m.batchnorm)
            WORKER_BUILDS[0] += 1
            if isinstance(m.model, str):
                _WORKER_MODELS.clear()  # one model per worker process: a catalogue's jobs share it while they can
                _WORKER_MODELS[key] = built
        _, net, names, _ = built
        if list(names) != list(self.common["names"]):
            raise GSDError(f"model {m.model} built on this worker has other parameters than the driver's; "
                           "install the same gsd-cli and weights on every worker")
        ctx = SideContext(net, dims=self.dims, common={**self.common, "device": self.device, "progress": None})
        return self.distance(self.config).public_side(ctx, sample, seed)


class DriverTurns:
    """A lock that the driver threads of overlapping catalogue jobs take turns on: a job holds it
    (:meth:`turn`) while it runs, and lets go only while its executor waits on remote work
    (:meth:`waiting`). Outside a turn (a plain ``rank()``) :meth:`waiting` does nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held = threading.local()

    @contextmanager
    def turn(self):
        with self._lock:
            self._held.value = True
            try:
                yield
            finally:
                self._held.value = False

    @contextmanager
    def waiting(self):
        if not getattr(self._held, "value", False):
            yield
            return
        self._held.value = False
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            self._held.value = True


def in_turns(items: list, attempt: Callable, executor) -> Iterator:
    """``attempt(item)`` for every item (catalogue jobs), yielded in order: one after another, or, when
    the executor computes elsewhere and lets jobs overlap (``jobs_in_flight`` > 1), in up to that many
    driver threads that take turns (:class:`DriverTurns`): each job's driver work (private side,
    comparisons) runs alone, as in a sequential run, while the cluster works on the public sides of
    all of them. When the consumer stops (an exception), the items not yet started are dropped and
    the executor's ``stop()``, if it has one, ends the runs still waiting."""
    width = min(int(getattr(executor, "jobs_in_flight", 1)), len(items))
    if width <= 1:
        yield from (attempt(item) for item in items)
        return
    from concurrent.futures import ThreadPoolExecutor

    def in_turn(item):
        with executor.turns.turn():
            return attempt(item)

    with ThreadPoolExecutor(width, thread_name_prefix="gsd-job") as pool:
        futures = [pool.submit(in_turn, item) for item in items]
        done = False
        try:
            for f in futures:
                yield f.result()
            done = True
        finally:
            for f in futures:
                f.cancel()
            if not done and callable(getattr(executor, "stop", None)):
                executor.stop()  # the jobs already running stop waiting instead of finishing

def public_subspaces(tasks: Iterable[PublicTask], compute: Callable[[PublicTask], Subspace], *,
                     executor: "str | Executor | None" = None, memo: dict | None = None, cache=None,
                     consume: Callable[[int, Subspace], object] | None = None) -> dict[int, object]:
    """Every task's subspace, by position: from ``memo`` (a dict kept across calls), else from the
    disk ``cache`` (a :class:`gsd_cli.ranking.cache.SubspaceCache`), else computed by the executor and then
    stored in both. A cache that cannot be written never fails the ranking: ``cache.put`` warns once
    and stops writing (:meth:`gsd_cli.ranking.cache.SubspaceCache.put`).

    ``consume(position, subspace)``: called as each subspace arrives, and its (small) result is kept
    instead of the subspace, which is then dropped (unless ``memo`` keeps it): a ranking compares each
    public side with the private one as it comes, so the driver holds the private basis and the sides
    in flight, not every public basis of a large catalogue."""
    tasks = list(tasks)
    out: dict[int, object] = {}

    def keep(i: int, sub: Subspace):
        return sub if consume is None else consume(i, sub)

    pending = []
    for i, t in enumerate(tasks):
        kept = recall(memo, t.memo_key)
        if kept is not None:
            out[i] = keep(i, kept)
            continue
        key = t.cache_key() if cache is not None else None
        hit = cache.get(key, t.name) if key is not None else None
        if hit is not None:
            out[i] = keep(i, remember(memo, t.memo_key, t.sample.source, hit))
        else:
            pending.append((i, key))
    where = {id(tasks[i]): (i, key) for i, key in pending}
    for task, sub in get_executor(executor).run([tasks[i] for i, _ in pending], compute):
        i, key = where[id(task)]
        if key is not None:
            cache.put(key, sub)
        out[i] = keep(i, remember(memo, task.memo_key, task.sample.source, sub))
        del sub
    return out


def recall(memo: dict | None, key: tuple | None) -> Subspace | None:
    """The subspace kept in ``memo`` under ``key``, else None."""
    return memo[key][1] if memo is not None and key is not None and key in memo else None


def remember(memo: dict | None, key: tuple | None, source: gdata.ImageSource, sub: Subspace) -> Subspace:
    """Keep ``sub`` in ``memo`` under ``key``; its source is kept alive beside it (the source's id is
    in the key, so it must not be reused while the entry lives)."""
    if memo is not None and key is not None:
        memo[key] = ([source], sub)
    return sub
