"""The test suite never reaches the user's folders (issue 64): tests/conftest.py points HOME, the XDG folders,
the privacy ledger, the ledger keys and gsd's caches into one temporary folder (``$GSD_TEST_SANDBOX``) when it
is imported, so a module-scoped fixture (which runs before the per-test fixtures), a test that calls
``monkeypatch.undo()`` (which drops the per-test settings) and a process a test starts all see it.
``.ci/run`` proves the same from outside: the suite under a read-only, empty HOME leaves it empty."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def _where() -> dict[str, Path]:
    """Where gsd would write the user's things, as this process's environment says now."""
    from gsd_cli.data.roots import default_cache_dir, default_data_root
    from gsd_cli.privacy.budget.key import key_path
    from gsd_cli.privacy.budget.location import default_location

    return {"HOME": Path.home(), "ledger": Path(default_location()), "ledger key": key_path("0" * 32),
            "cache": default_cache_dir(), "data root": default_data_root(),
            "XDG_CONFIG_HOME": Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"),
            "XDG_CACHE_HOME": Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")}


def _all_in_sandbox(where: dict[str, Path], tmp_path_factory) -> None:
    """Every path of ``where`` in the session's sandbox or in pytest's temporary folder (the per-test ledger)."""
    sandbox = os.environ.get("GSD_TEST_SANDBOX")
    assert sandbox, "tests/conftest.py set no $GSD_TEST_SANDBOX: the tests would reach the user's folders"
    roots = [Path(sandbox).resolve(), tmp_path_factory.getbasetemp().resolve()]
    outside = {k: str(p) for k, p in where.items() if p is None or not any(Path(p).resolve().is_relative_to(r) for r in roots)}
    assert not outside, f"outside the tests' temporary folders {[str(r) for r in roots]}: {outside}"


@pytest.fixture(scope="module")
def seen_by_a_module_fixture():
    """Set up before any per-test fixture of the module's tests (as test_distributed_train.py's ``runs``)."""
    return _where()


def test_a_module_scoped_fixture_sees_the_sandbox(seen_by_a_module_fixture, tmp_path_factory):
    _all_in_sandbox(seen_by_a_module_fixture, tmp_path_factory)


def test_monkeypatch_undo_keeps_the_sandbox(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HOME", "/nonexistent")
    monkeypatch.undo()  # drops conftest's per-test ledger and cache as well
    _all_in_sandbox(_where(), tmp_path_factory)


def test_a_process_started_by_a_test_sees_the_sandbox(tmp_path_factory):
    code = ("import os, sys\n"
            "from gsd_cli.privacy.budget.location import default_location\n"
            "from gsd_cli.privacy.budget.key import key_path\n"
            "print(default_location()); print(key_path('0' * 32)); print(os.path.expanduser('~'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    _all_in_sandbox(dict(zip(("ledger", "ledger key", "HOME"), map(Path, out.stdout.split("\n")[:3]))), tmp_path_factory)
