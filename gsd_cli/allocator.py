"""Keep freed memory in the process: glibc's malloc without a page fault per large CPU tensor.

PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves every block above its mmap
threshold (at most 32 MB on 64-bit systems) by a fresh ``mmap`` and gives it back to the system on
``free``; the next block of that size is new memory again, and the kernel zero-fills it page by page
on first touch. The per-sample gradients of the default ``gsd rank`` allocate activations of about
200 MB per chunk (64 images at 224x224 under vmap), so every chunk paid for its memory again: 7.7
million minor page faults and 18.6 s of system time in a 50 s run on the 2-core CPU. With freed
memory kept in the heap the same run takes 1.3 s of system time, 0.33 million faults and 38 s wall,
for the same results to the last bit (the allocator moves no arithmetic) and 8 % more peak memory
(``benchmarks/bench_end_to_end.py`` records both; the README's "Speed" section has the figures).

:func:`keep_freed_memory` sets, with glibc's ``mallopt`` (``man 3 mallopt``), ``M_MMAP_MAX = 0``
(large blocks from the heap, not from their own mappings) and ``M_TRIM_THRESHOLD = -1``
("disables trimming completely", the manual page: free memory at the top of the heap is kept for the
next chunk, not returned).
The process keeps what it used at its peak until it ends, which a command does soon; where a long
library session should return memory, do not call it. It is what the ``MALLOC_MMAP_MAX_=0`` and
``MALLOC_TRIM_THRESHOLD_`` environment variables do, set from inside the process; jemalloc or tcmalloc
(``LD_PRELOAD``), which the PyTorch CPU tuning guides recommend for the same reason, do as well.

The ``gsd`` command calls it at start-up, and the training processes that ``gsd train --nproc N``
spawns take the setting of the process that spawns them; ``GSD_MALLOC=system`` leaves the C library's defaults (as
does any platform without glibc: macOS and Windows allocators are left alone). Library users call it
themselves (``gsd_cli.keep_freed_memory()``) or set the environment variables above. No torch import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

#: ``mallopt`` parameters (glibc's <malloc.h>)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
#: ``M_TRIM_THRESHOLD`` value that turns trimming off (man 3 mallopt).
NO_TRIM = -1
#: Environment variable: ``system`` (or ``default``, ``off``, ``0``) leaves malloc as the C library set it.
ENV = "GSD_MALLOC"

_STATE = {"applied": False}


def _libc():
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def applied() -> bool:
    """Whether :func:`keep_freed_memory` is in effect in this process (the processes that
    ``gsd train --nproc`` spawns take the setting of the process that spawns them)."""
    return _STATE["applied"]


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse (module docstring). Returns ``True`` when the
    setting is in effect (now or from an earlier call), ``False`` when left alone: not glibc, or
    ``GSD_MALLOC=system``. Safe to call more than once; it changes no computed value."""
    if os.environ.get(ENV, "").strip().lower() in ("system", "default", "off", "0", "no", "false"):
        return False
    if _STATE["applied"]:
        return True
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM) == 1
    _STATE["applied"] = ok
    return ok
