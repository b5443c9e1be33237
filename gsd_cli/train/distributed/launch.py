"""``--nproc N``: start N training processes on this machine, one torch.distributed process group.

:func:`spawn` runs ``fn(*args, **kwargs)`` in N new processes (``torch.multiprocessing``, spawn start
method) that first join one process group (gloo on CPU, NCCL with one GPU per process; rendezvous
through a file in a new temporary folder, so no port is guessed), and returns process 0's result.
Process 0's progress and warnings come back to the caller's callbacks through a queue. A
:class:`~gsd_cli.errors.GSDError` in any process is raised here with its one-line message; any other
failure as a RuntimeError with the process's traceback; either way the other processes are stopped.
Each CPU process gets ``torch.get_num_threads() // N`` (at least 1) intra-op threads.
"""

from __future__ import annotations

import os
import queue as queue_mod
import shutil
import tempfile
from typing import Callable

import torch

from ...errors import GSDError, PrivateError


def check_nproc(nproc, device: torch.device) -> None:
    """``nproc``: a whole number >= 1; more than one needs torch.distributed, no launcher around
    (``torchrun`` starts its own processes), and a GPU per process on CUDA."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise GSDError(f"--nproc {nproc}: give a whole number >= 1")
    cores = os.cpu_count() or 1
    if device.type == "cpu" and nproc > 4 * cores:  # each process holds the model and a data loader: a bound, not a guess
        raise GSDError(f"--nproc {nproc}: at most {4 * cores} on this machine's {cores} CPU core(s) (each process holds the "
                       f"model and shares the cores); use --nproc {cores} or fewer")
    if nproc == 1:
        return
    import torch.distributed as dist

    from . import launched_by_torchrun

    if not dist.is_available():
        raise GSDError("--nproc needs torch.distributed, which this torch build lacks; train with --nproc 1")
    if launched_by_torchrun() or dist.is_initialized():
        raise GSDError("--nproc under torchrun (or in an initialised process group): the processes exist already; drop --nproc")
    if device.type == "cuda" and nproc > torch.cuda.device_count():
        raise GSDError(f"--nproc {nproc} on CUDA needs one GPU per process but {torch.cuda.device_count()} are visible; "
                       f"use --nproc {torch.cuda.device_count()} or --device cpu")


def _worker(rank, nproc, init_file, backend, threads, fn, args, kwargs, forward, messages, malloc=False):
    import torch.distributed as dist

    if malloc:  # the parent (the gsd command) keeps freed memory: so do its training processes
        from ...allocator import keep_freed_memory

        keep_freed_memory()

    torch.set_num_threads(threads)
    if backend == "nccl":
        os.environ.setdefault("LOCAL_RANK", str(rank))
        torch.cuda.set_device(rank)
    from . import TIMEOUT

    dist.init_process_group(backend, init_method="file://" + init_file, rank=rank, world_size=nproc, timeout=TIMEOUT)
    if rank == 0:
        if "progress" in forward:
            kwargs["progress"] = lambda kind, done, total: messages.put(("progress", (kind, done, total)))
        if "notify" in forward:
            kwargs["notify"] = lambda message: messages.put(("notify", message))
    try:
        result = fn(*args, **kwargs)
    except GSDError as e:  # a PrivateError stays one (its line is labelled private)
        messages.put(("private-error" if isinstance(e, PrivateError) else "error", str(e)))
        raise SystemExit(2) from None
    if rank == 0:
        messages.put(("result", result))
    dist.barrier()
    dist.destroy_process_group()


def spawn(fn: Callable, nproc: int, args: tuple = (), kwargs: dict | None = None, *, device: torch.device | str = "cpu",
          progress=None, notify=None):
    """``fn(*args, **kwargs)`` in ``nproc`` new processes of one process group on ``device`` (its
    type picks the backend); process 0's result. ``fn`` must be importable by name (a module-level
    function); ``progress`` and ``notify``, when given, reach process 0's ``fn`` as keyword
    arguments that forward to them."""
    kwargs = dict(kwargs or {})
    import torch.multiprocessing as mp

    from . import backend_for

    dev = torch.device(device)
    backend = backend_for(dev)
    forward = {k for k, v in (("progress", progress), ("notify", notify)) if v is not None}
    threads = max(1, torch.get_num_threads() // nproc) if dev.type == "cpu" else 1
    from ...allocator import applied
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    folder = tempfile.mkdtemp(prefix="gsd-rendezvous-")
    state = {"result": None, "errors": [], "got": False}

    def drain(wait: float = 0.0) -> None:
        while True:
            try:
                kind, value = messages.get(timeout=wait) if wait else messages.get_nowait()
            except queue_mod.Empty:
                return
            wait = 0.0
            if kind == "progress":
                progress(*value)
            elif kind == "notify":
                notify(value)
            elif kind in ("error", "private-error"):
                state["errors"].append((kind, value))
            else:
                state["result"], state["got"] = value, True

    procs = mp.start_processes(_worker, nprocs=nproc, join=False, start_method="spawn",
                               args=(nproc, os.path.join(folder, "store"), backend, threads, fn, args, kwargs, forward, messages, applied()))
    try:
        while not procs.join(timeout=0.05):
            drain()
        drain(wait=0.0 if state["got"] else 5.0)
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
        drain(wait=0.5)
        if state["errors"]:
            kind, message = state["errors"][0]
            raise (PrivateError if kind == "private-error" else GSDError)(message) from None
        raise RuntimeError(f"a training process failed ({nproc} processes):\n{e}") from None
    finally:
        for p in procs.processes:
            if p.is_alive():
                p.terminate()
        for p in procs.processes:
            p.join(5)
        shutil.rmtree(folder, ignore_errors=True)
    return state["result"]
