"""gsd_cli.allocator: glibc's malloc keeps freed memory, so a large block reused costs no page faults.

Each check runs in a fresh interpreter (the setting is process-wide; pytest's own process is left as
it was) and counts the minor page faults of allocating, touching and freeing a 64 MB block 20 times:
with glibc's defaults every round maps fresh memory (about 16,000 faults a round); with the setting
only the first round does.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the setting is glibc's")

ROUNDS = 20
PAGES = (64 << 20) // 4096

PROBE = """
import ctypes, json, resource, sys
SETUP
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
faults = []
for _ in range(ROUNDS):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(size)
    ctypes.memset(p, 1, size)  # touch every page
    libc.free(p)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""


def _probe(setup: str, env: dict | None = None) -> dict:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GSD_MALLOC"}
    run_env.update(env or {})
    done = subprocess.run([sys.executable, "-c", PROBE.replace("SETUP", setup).replace("ROUNDS", str(ROUNDS))], capture_output=True, text=True,
                          env=run_env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # after what the command printed


def test_defaults_fault_every_round():
    """The baseline the setting fixes: without it a freed 64 MB block is unmapped and faults again."""
    r = _probe("applied = None")
    assert min(r["faults"][1:]) > PAGES // 2


def test_keep_freed_memory_reuses_the_block():
    r = _probe("from gsd_cli.allocator import keep_freed_memory\napplied = keep_freed_memory()")
    assert r["applied"] is True
    assert r["faults"][0] > PAGES // 2  # the first touch of new memory faults
    assert max(r["faults"][1:]) < PAGES // 20  # reused: at most a few hundred faults, not 16,000


def test_gsd_command_applies_it():
    """``gsd`` (its entry point) sets it before any command runs."""
    r = _probe("from gsd_cli.cli.app import main\nassert main(['--version']) == 0\n"
               "from gsd_cli.allocator import _STATE\napplied = _STATE['applied']")
    assert r["applied"] is True
    assert max(r["faults"][1:]) < PAGES // 20


@pytest.mark.parametrize("value", ["system", "off"])
def test_opt_out_leaves_glibc_defaults(value):
    r = _probe("from gsd_cli.cli.app import main\nassert main(['--version']) == 0\n"
               "from gsd_cli.allocator import keep_freed_memory\napplied = keep_freed_memory()",
               env={"GSD_MALLOC": value})
    assert r["applied"] is False
    assert min(r["faults"][1:]) > PAGES // 2


def test_repeated_calls_are_harmless():
    r = _probe("from gsd_cli.allocator import keep_freed_memory\napplied = [keep_freed_memory() for _ in range(3)]")
    assert r["applied"] == [True, True, True]


def _worker_state():
    from gsd_cli.allocator import applied

    return applied()


def test_training_processes_take_the_parents_setting(monkeypatch):
    """``gsd train --nproc N`` spawns its processes from the gsd command: they keep freed memory when
    the command does, and not otherwise."""
    from gsd_cli import allocator
    from gsd_cli.train.distributed.launch import spawn

    monkeypatch.setitem(allocator._STATE, "applied", True)  # as after the gsd command's start-up
    assert spawn(_worker_state, 2, device="cpu") is True
    monkeypatch.setitem(allocator._STATE, "applied", False)
    assert spawn(_worker_state, 2, device="cpu") is False
