"""Where randomness comes from: public randomness from ``--seed``, private randomness from the OS.

Two kinds of random draws happen in ``gsd``:

* **public** ones, which touch no private data: the initial weights w0, the public examples and
  their random labels, the sketch of ``--dp-sketch``. They come from ``--seed``, which every output
  prints, so that a ranking can be reproduced.
* **private** ones, which a differential-privacy guarantee needs secret: under DP-GSD the private
  examples drawn, their random labels and the exponential mechanism's draw; in training the Poisson
  subsamples and the Gaussian noise. They come from the operating system's entropy
  (:func:`secrets.randbits`), are never written to a publishable output, and are kept only where a
  resume needs them (a training run's checkpoint, which is private).

A DP release whose private randomness could be recomputed from its public outputs is not private at
all: holding every example but one, an adversary reruns the release under both hypotheses for the
last example and matches it bit for bit. That is why ``--seed`` never seeds private randomness.

For experiments that must be repeatable, ``--insecure-seed N`` (one option for ``gsd rank``,
``gsd train`` and ``gsd compare``) seeds the private randomness from N instead. Every output of such
a run says ``"dp": false``: its privacy guarantee holds only while N stays secret, and N is printed.
"""

from __future__ import annotations

import secrets
import zlib

import numpy as np

from ..errors import GSDError

#: What every output of an ``--insecure-seed`` run says about itself.
INSECURE_NOTE = (
    "--insecure-seed {seed}: the private randomness (examples drawn, labels, DP noise) is reproducible from a "
    "printed seed, so this output is NOT differentially private; use it for experiments only"
)


#: the largest seed: torch's generators take a 64-bit seed, and gsd derives further seeds from it in 64-bit
#: integers (``--seed 2**64`` stopped with "Overflow when unpacking long long")
MAX_SEED = 2**63 - 1


def check_seed(option: str, value) -> None:
    """A seed (``--seed``, ``--insecure-seed``) is None or a whole number from 0 to :data:`MAX_SEED` (numpy's
    seed sequences take no negative numbers, torch's generators no more than 64 bits)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= MAX_SEED:
        raise GSDError(f"{option} {value}: give a whole number from 0 to 2^63 - 1 ({MAX_SEED})")


def check_insecure_seed(seed: int | None) -> None:
    """``None`` (secret randomness) or a whole number >= 0."""
    check_seed("--insecure-seed", seed)


def private_rng(stream: str, insecure_seed: int | None = None, *words: int) -> np.random.Generator:
    """A generator for private randomness.

    Secret (``insecure_seed=None``, the default): 128 bits from the operating system
    (:func:`secrets.randbits`), different on every call. With ``insecure_seed`` (experiments only;
    the output must then be marked not DP): derived from the seed, the name of the ``stream`` (so
    two uses of one seed draw independent streams) and ``words`` (e.g. a repeat's public seed)."""
    if insecure_seed is None:
        return np.random.default_rng(secrets.randbits(128))
    check_insecure_seed(insecure_seed)
    return np.random.default_rng([int(insecure_seed), zlib.crc32(stream.encode()), *[int(w) % 2**32 for w in words]])


def randomness_statement(insecure_seed: int | None) -> str:
    """One line for a ``privacy`` block: where the private randomness came from."""
    if insecure_seed is None:
        return "secret: operating-system entropy, never written to an output"
    return "INSECURE: " + INSECURE_NOTE.format(seed=insecure_seed)
