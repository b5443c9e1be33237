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


class PrivateError(GSDError):
    """A refusal whose occurrence depends on the private data (a privacy budget that the data shares
    examples with, a private training set left empty): the CLI prints it on a line labelled
    ``private:`` and exits 2, and that exit status is itself a private output (docs/budget.md). Use it
    for any refusal that turns on private examples rather than on public inputs."""


class DataWarning(UserWarning):
    """Something about a dataset's files that the user should look at but that does not stop the work (a class folder
    holding sub-folders, whose images count as that class; images of mixed sizes or modes). Issued once per dataset
    with :func:`warnings.warn`; the CLI prints it as one ``private: warning:`` line (labelled private: it describes the
    files of a set that may be the private one), and ``gsd datasets check`` lists it in its report."""
