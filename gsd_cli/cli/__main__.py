"""``python -m gsd_cli.cli``: the ``gsd`` command."""

import sys

from .app import main

sys.exit(main())
