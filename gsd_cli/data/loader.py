"""The input pipeline: chunks of model input, the next prepared while the current one is used.

Each chunk is read (:func:`gsd_cli.data.base.read_images`: decode, non-finite pixels refused) and
turned into model input (:func:`gsd_cli.data.transform.to_model_input`: one resize per image) exactly
once. With ``ahead >= 1`` a background thread prepares the next ``ahead`` chunks while the caller
computes on the current one (decoding in Pillow and resizing in torch release the GIL, so the two
overlap on two cores). Chunks come out in order and each is computed on its own, so the values are
the same as without the thread; an error in a chunk (an unreadable file) is raised when that chunk
is reached, after the chunks before it. At most ``ahead`` chunks wait beyond the one in use, so
memory stays bounded; closing the iterator early cancels what was not started.

Closing never waits on a pool from one of that pool's own threads (:func:`_shutdown`): an iterator
dropped in a reference cycle is closed by the garbage collector in whatever thread allocates at that
moment, a decoding thread included, and joining the input thread from there (which waits for that very
decoding thread's image) would hang for good.

A file-backed source (folders, CSV lists, DICOM) is decoded by a pool of ``workers`` threads, one
image per task, in the order of ``indices`` (PIL, pydicom's pixel copy and torch's resize release
the GIL, so the threads use every core). Each thread also resizes its image at once, on the device
(:func:`chunk_input`): a chunk then holds ``chunk`` images at the model's size and at most
``workers`` images at their native size, whatever their native size and the set's size. JPEGs are
decoded at a reduced scale no smaller than the model's input (:mod:`.decode`). In-memory and other
sources are read in the calling thread, as before (a user's dataset need not be thread-safe).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Iterator, Sequence

import torch

from .base import ImageSource, read_images
from .transform import to_model_input

#: Chunks prepared ahead by default (one background thread): two chunks in memory at a time.
AHEAD = 1


#: the name prefixes of the input pipeline's threads (the input thread waits on the decoding threads)
THREAD_PREFIXES = ("gsd-input", "gsd-decode")


def _shutdown(pool: ThreadPoolExecutor) -> None:
    """``pool.shutdown``: waiting for its threads, unless this is a thread of the input pipeline (module
    docstring; the input thread waits on the decoding threads, so neither may wait on the other's pool):
    then the work not started is cancelled and the threads end on their own."""
    if threading.current_thread().name.startswith(THREAD_PREFIXES):
        pool.shutdown(wait=False, cancel_futures=True)
    else:
        pool.shutdown(wait=True)


def decode_workers() -> int:
    """Threads that decode a file-backed chunk by default: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def file_backed(source: ImageSource, indices: Sequence[int]) -> bool:
    """Whether ``source`` reads its examples from files (decoded by the thread pool)."""
    return len(indices) > 0 and source.example_file(int(indices[0])) is not None


def chunk_input(source: ImageSource, indices: Sequence[int], size: int, channels: int,
                device: torch.device | str | None = None, pool: Executor | None = None) -> torch.Tensor:
    """The model input ``(len(indices), channels, size, size)`` of ``indices`` of ``source``.

    ``pool``: threads that decode one image each (file-backed sources); each image is also resized
    (on ``device``) by the thread that decoded it, into its row of the output, so no chunk of
    native-size images is ever held. The tensor is the same as without a pool (bilinear resizing treats
    images independently; ``tests/test_decode.py``); the first unreadable file, in ``indices`` order,
    raises."""
    if pool is None or len(indices) < 2:
        return to_model_input(read_images(source, indices, size), size, channels, device)
    out = torch.empty(len(indices), channels, size, size, device=device)

    def one(j: int) -> None:
        out[j : j + 1] = to_model_input(read_images(source, [indices[j]], size), size, channels, device)

    for _ in pool.map(one, range(len(indices))):  # in order: the first error raised is the first file's
        pass
    return out


def model_batches(source: ImageSource, indices: Sequence[int], size: int, channels: int, chunk: int,
                  device: torch.device | str | None = None, ahead: int = AHEAD,
                  workers: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(offset, x)``: x the model input of ``indices[offset:offset+chunk]`` of ``source`` on
    ``device``, in order. ``ahead``: chunks prepared in advance by one background thread (0: none,
    everything in the caller's thread). ``workers``: threads decoding a file-backed source's images
    (None: :func:`decode_workers`; 1: none, the images are read where the chunk is prepared)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 (got {chunk})")
    starts = range(0, len(indices), chunk)
    workers = decode_workers() if workers is None else int(workers)
    decoders = None
    if workers > 1 and file_backed(source, indices):
        decoders = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gsd-decode")

    def prepare(start: int) -> torch.Tensor:
        return chunk_input(source, indices[start : start + chunk], size, channels, device, decoders)

    try:
        yield from _chunks(starts, prepare, ahead)
    finally:
        if decoders is not None:
            _shutdown(decoders)


def _chunks(starts: range, prepare, ahead: int) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, prepare(start))`` in order, ``ahead`` of them prepared by a background thread."""
    if ahead < 1 or len(starts) < 2:
        for start in starts:
            yield start, prepare(start)
        return
    todo = iter(starts)
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gsd-input")
    pending: deque = deque()
    try:
        for start in todo:
            pending.append((start, pool.submit(prepare, start)))
            if len(pending) >= ahead:
                break
        while pending:
            start, job = pending.popleft()
            x = job.result()  # re-raises the chunk's error here, in order
            nxt = next(todo, None)
            if nxt is not None:
                pending.append((nxt, pool.submit(prepare, nxt)))
            yield start, x
            del x
    finally:
        for _, job in pending:
            job.cancel()
        _shutdown(pool)
