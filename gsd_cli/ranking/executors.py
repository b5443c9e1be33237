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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol

from .. import data as gdata
from ..errors import GSDError
from ..registry import Registry
from ..side import Subspace

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


def get_executor(executor: "str | Executor | None") -> Executor:
    """An executor object from a registered name (default ``local``) or an object with ``run``."""
    if executor is None:
        executor = "local"
    if isinstance(executor, str):
        return _EXECUTORS.get(executor)()
    if not callable(getattr(executor, "run", None)):
        raise GSDError("an executor needs a run(tasks, compute) method")
    return executor


@register_executor("local")
class LocalExecutor:
    """One task after another, in this process (today's path)."""

    def run(self, tasks, compute):
        for task in tasks:
            yield task, compute(task)


def public_subspaces(tasks: Iterable[PublicTask], compute: Callable[[PublicTask], Subspace], *,
                     executor: "str | Executor | None" = None, memo: dict | None = None, cache=None) -> dict[int, Subspace]:
    """Every task's subspace, by position: from ``memo`` (a dict kept across calls), else from the
    disk ``cache`` (a :class:`gsd_cli.cache.SubspaceCache`), else computed by the executor and then
    stored in both. A cache that cannot be written never fails the ranking: ``cache.put`` warns once
    and stops writing (:meth:`gsd_cli.cache.SubspaceCache.put`)."""
    tasks = list(tasks)
    out: dict[int, Subspace] = {}
    pending = []
    for i, t in enumerate(tasks):
        kept = recall(memo, t.memo_key)
        if kept is not None:
            out[i] = kept
            continue
        key = t.cache_key() if cache is not None else None
        hit = cache.get(key, t.name) if key is not None else None
        if hit is not None:
            out[i] = remember(memo, t.memo_key, t.sample.source, hit)
        else:
            pending.append((i, key))
    where = {id(tasks[i]): (i, key) for i, key in pending}
    for task, sub in get_executor(executor).run([tasks[i] for i, _ in pending], compute):
        i, key = where[id(task)]
        if key is not None:
            cache.put(key, sub)
        out[i] = remember(memo, task.memo_key, task.sample.source, sub)
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
