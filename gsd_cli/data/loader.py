"""The input pipeline: chunks of model input, the next prepared while the current one is used.

Each chunk is read (:func:`gsd_cli.data.base.read_images`: decode, non-finite pixels refused) and
turned into model input (:func:`gsd_cli.data.transform.to_model_input`: one resize per image) exactly
once. With ``ahead >= 1`` a background thread prepares the next ``ahead`` chunks while the caller
computes on the current one (decoding in Pillow and resizing in torch release the GIL, so the two
overlap on two cores). Chunks come out in order and each is computed on its own, so the values are
the same as without the thread; an error in a chunk (an unreadable file) is raised when that chunk
is reached, after the chunks before it. At most ``ahead`` chunks wait beyond the one in use, so
memory stays bounded; closing the iterator early cancels what was not started.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Sequence

import torch

from .base import ImageSource, read_images
from .transform import to_model_input

#: Chunks prepared ahead by default (one background thread): two chunks in memory at a time.
AHEAD = 1


def model_batches(source: ImageSource, indices: Sequence[int], size: int, channels: int, chunk: int,
                  device: torch.device | str | None = None, ahead: int = AHEAD) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(offset, x)``: x the model input of ``indices[offset:offset+chunk]`` of ``source`` on
    ``device``, in order. ``ahead``: chunks prepared in advance by one background thread (0: none,
    everything in the caller's thread)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 (got {chunk})")
    starts = range(0, len(indices), chunk)

    def prepare(start: int) -> torch.Tensor:
        return to_model_input(read_images(source, indices[start : start + chunk]), size, channels, device)

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
        pool.shutdown(wait=True)
