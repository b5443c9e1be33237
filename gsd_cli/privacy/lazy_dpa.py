"""dp-accounting's events and RDP accountant without the rest of the package (issue 53).

Any import from ``dp_accounting`` runs the package's ``__init__``, which imports every accountant and
the calibration: the PLD accountant (``scipy.signal``, ``scipy.stats``) and ``mechanism_calibration``
(``scipy.optimize``), 0.4-0.8 s of a ``gsd train`` run on the 2-core CPU that a run with the RDP
accountant and a cached noise multiplier never uses.

:func:`events` and :func:`rdp` register the package's module without running its ``__init__`` and
import only the submodules they need (``dp_event``, ``privacy_accountant``, ``rdp``): dp-accounting's
own files, unchanged. The first use of any other name of the package (``dp_accounting.pld``,
``dp_accounting.calibrate_dp_mechanism``, :func:`full`) runs the real ``__init__`` in that same module
object, so every module and class keeps one identity (an event built before is the same class after)
and the package is then exactly the one ``import dp_accounting`` gives. ``import dp_accounting.pld``
(a submodule by name) imports that subpackage alone. Where the package is already imported, it is used
as it is."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading

NAME = "dp_accounting"
_lock = threading.RLock()
_state = threading.local()  # .importing: True while this thread's import system fills the package


def _set_importing(value: bool) -> None:
    _state.importing = value


def _complete_on_use(name: str):
    """PEP 562 hook of the light package: a name its ``__init__`` would define loads the whole package."""
    if getattr(_state, "importing", False) or name.startswith("__"):
        raise AttributeError(name)  # the import system asking for a submodule not imported yet: it imports it
    return getattr(full(), name)


def _light():
    with _lock:
        module = sys.modules.get(NAME)
        if module is not None:
            return module
        spec = importlib.util.find_spec(NAME)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {NAME!r}", name=NAME)
        module = importlib.util.module_from_spec(spec)
        module.__getattr__ = _complete_on_use
        sys.modules[NAME] = module
        return module


def _submodule(name: str):
    with _lock:
        _light()
        _set_importing(True)
        try:
            return importlib.import_module(f"{NAME}.{name}")
        except BaseException:
            if getattr(sys.modules.get(NAME), "__getattr__", None) is _complete_on_use and not _loaded_submodules():
                sys.modules.pop(NAME, None)  # nothing of it imported: as before the first call
            raise
        finally:
            _set_importing(False)


def _loaded_submodules() -> list[str]:
    return [m for m in sys.modules if m.startswith(NAME + ".")]


def events():
    """``dp_accounting.dp_event``."""
    return _submodule("dp_event")


def rdp():
    """``dp_accounting.rdp.rdp_privacy_accountant`` (``RdpAccountant``, ``compute_epsilon``)."""
    return _submodule("rdp.rdp_privacy_accountant")


def pld():
    """``dp_accounting.pld.pld_privacy_accountant`` (``PLDAccountant``): imported when ``--accountant pld`` asks."""
    return _submodule("pld.pld_privacy_accountant")


def full():
    """The whole ``dp_accounting`` package (its ``__init__`` run; once)."""
    with _lock:
        module = _light()
        if module.__dict__.get("__getattr__") is not _complete_on_use:
            return module  # imported in full (by us or anyone)
        _set_importing(True)
        try:
            module.__spec__.loader.exec_module(module)
            del module.__getattr__
        finally:
            _set_importing(False)
        return module


def is_light() -> bool:
    """Whether ``dp_accounting`` is imported without its ``__init__`` (tests)."""
    module = sys.modules.get(NAME)
    return module is not None and module.__dict__.get("__getattr__") is _complete_on_use
