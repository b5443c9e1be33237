"""The ``gsd`` command: a thin layer over the library (every command is one library call).

``app`` (``app.py``) holds the Typer app and the console-script entry ``main``; each command group is
one module that registers on it: ``rank``, ``train``, ``compare``, ``pretrain`` (commands, listed in that order) and
the groups ``datasets``, ``cache``, ``models``. Options and help texts shared by several commands are
in ``options.py``; the consoles, the progress bar and the error line in ``common.py``.
"""

from __future__ import annotations

# Importing a module registers its commands on `app`; `gsd --help` lists the commands, then the
# groups, each in the order they register: keep this order.
# isort: off
from . import rank, train, compare, pretrain  # noqa: F401
from . import datasets, cache, models  # noqa: F401
from . import audit  # noqa: F401
from . import budget  # noqa: F401
# isort: on
from .app import app, main, reflow_help
from .budget import budget_app
from .cache import cache_app
from .datasets import datasets_app
from .models import models_app

reflow_help(app, datasets_app, cache_app, models_app, budget_app)

__all__ = ["app", "budget_app", "cache_app", "datasets_app", "main", "models_app"]
