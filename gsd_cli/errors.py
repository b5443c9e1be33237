"""Project exceptions.

A :class:`GSDError` is a *user* error: bad input that the user can fix (an unknown dataset, ``k``
larger than the batch, a ``--params`` pattern that matches nothing). Its message says what to do.
The CLI prints it on one line and exits with status 2; library users catch it like any exception.
"""

from __future__ import annotations


class GSDError(Exception):
    """Bad input or an impossible request; the message says what to do."""


class DatasetError(GSDError):
    """A dataset could not be found, read or understood."""


class ModelError(GSDError):
    """A model name, parameter selection or input shape is wrong."""
