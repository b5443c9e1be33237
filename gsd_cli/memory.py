"""Memory checks before large allocations: an estimate of the bytes against the memory available, so
that an impossible request (``--dp-sketch 100000000000``, a head of 10^9 classes, ``--weights /dev/zero``)
is one line naming the figure and what to change, not an allocator's error halfway through a run.

The available memory is the CUDA device's free memory (``torch.cuda.mem_get_info``) for a CUDA
device, else the operating system's ``MemAvailable`` (``/proc/meminfo``; ``sysconf`` elsewhere),
capped by an address-space limit (``ulimit -v``) when one is set.
"""

from __future__ import annotations

import os
import re

from .errors import GSDError

#: the most classes a label space may have (the largest public label spaces have ~10^5)
MAX_CLASSES = 1_000_000


def human(n: float) -> str:
    """Bytes as ``1.3 GB`` (powers of 1000, as free(1) -h and the allocator's message say)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} EB"


def available_bytes(device=None) -> int | None:
    """Free memory of ``device`` (CUDA) or of the machine (None when it cannot be told)."""
    try:
        if device is not None and str(device).startswith("cuda"):
            import torch

            return int(torch.cuda.mem_get_info(torch.device(device))[0])
    except Exception:  # noqa: BLE001 - no CUDA or no answer: no check
        return None
    avail = None
    try:
        with open("/proc/meminfo") as f:
            m = re.search(r"^MemAvailable:\s+(\d+) kB", f.read(), re.M)
        avail = int(m.group(1)) * 1024 if m else None
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY and soft > 0:
            avail = soft if avail is None else min(avail, soft)
    except (ImportError, ValueError, OSError):
        pass
    return avail


def check_fits(nbytes: float, what: str, fix: str, device=None) -> None:
    """Raise :class:`GSDError` when ``nbytes`` (an estimate) exceeds the memory available."""
    avail = available_bytes(device)
    if avail is not None and nbytes > avail:
        raise GSDError(f"{what} needs about {human(nbytes)} of memory but {human(avail)} is available; {fix}")


def out_of_memory_message(e: BaseException) -> str | None:
    """The one-line user error for an allocator's failure (None when ``e`` is not one)."""
    text = " ".join(str(e).split())
    name = type(e).__name__
    if not (isinstance(e, MemoryError) or name == "OutOfMemoryError" or "can't allocate memory" in text
            or "out of memory" in text.lower() or "Unable to allocate" in text):
        return None
    m = re.search(r"allocate (?:memory: you tried to allocate )?(\d+) bytes", text) or re.search(r"allocate ([\d.]+ [KMGTP]i?B)", text)
    asked = ""
    if m:
        asked = f" {human(int(m.group(1)))}" if m.group(1).isdigit() else f" {m.group(1)}"
    avail = available_bytes()
    have = f" ({human(avail)} available)" if avail is not None else ""
    return (f"out of memory: an allocation of{asked or ' memory'} failed{have}; lower --examples, --chunk-size, "
            "--memory-budget, --classes or --batch-size, or use a smaller model")
