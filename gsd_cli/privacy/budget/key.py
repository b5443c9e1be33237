"""The ledger's secret key: what makes the identities it stores reveal nothing to a reader without it.

The ledger must tell whether two runs read a common person, so it stores an identity per example. An
unkeyed digest of the image (what gsd 0.4 stored) is a membership oracle: whoever reads the ledger
(a team's server, a backup, a copied file) hashes a candidate image and learns whether it is in a
private set. So every identity the ledger stores is keyed:

    stored(d) = HMAC-SHA256(K, d)  (hex, as long as d),

where d is the example's identity (:func:`gsd_cli.data.base.example_identity`, a SHA-256 of the
decoded image in canonical form) or a data set's digest, and K is 256 bits from the operating system
(:func:`secrets.token_bytes`), one key per ledger. HMAC with a secret key is a pseudorandom function
(Bellare, "New Proofs for NMAC and HMAC", CRYPTO 2006: HMAC is a PRF when its compression function
is one), so to anyone without K the stored values are indistinguishable from random strings chosen
independently per distinct identity: they show *which stored rows are equal* (the overlaps between
sets, which the ledger must know) and how many there are, and nothing about which image any of them
is. Equality is kept because HMAC is a function: the same image in two sets gives the same stored
value, so the ledger's overlap logic is unchanged.

The key is **kept apart from the ledger**: in its own file, created 0600 in a 0700 folder,
``$XDG_CONFIG_HOME/gsd/ledger-keys/<ledger id>.key`` by default (the ledger is under
``$XDG_DATA_HOME``), or wherever ``--ledger-key PATH`` / ``$GSD_LEDGER_KEY`` says. The ledger keeps
only its id and a check value HMAC(K, "gsd-ledger-key-check" + id), which tells a wrong key from the
right one and, being a PRF output on a fixed message, says nothing about K. Whoever holds the key
*and* the ledger can test membership (hash a candidate image, key it, look it up): guard the key
like the private data. A team sharing a server ledger shares its key file the same way.

Why keying the set digests too: a data set's digest is a function of its images, so an unkeyed one
would let a reader confirm a guessed whole set (for a one-image set, a single image).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import uuid
from pathlib import Path

from ...errors import GSDError

#: ``$GSD_LEDGER_KEY``: the file of the ledger's key (``gsd --ledger-key PATH``).
KEY_ENV = "GSD_LEDGER_KEY"
#: Bytes of a ledger key (256 bits).
KEY_BYTES = 32
_CHECK = b"gsd-ledger-key-check\n"


class LedgerKeyError(GSDError):
    """The ledger's key is missing, unreadable or not this ledger's: one line, exit 2, nothing booked."""


def new_ledger_id() -> str:
    """A new ledger's id (random; public: it names the key file, and says nothing about the key)."""
    return uuid.uuid4().hex


def key_path(ledger_id: str, given: str | os.PathLike | None = None) -> Path:
    """Where the key of the ledger ``ledger_id`` is: ``given``, else ``$GSD_LEDGER_KEY``, else
    ``$XDG_CONFIG_HOME/gsd/ledger-keys/<ledger_id>.key`` (``~/.config/...``)."""
    if given is not None and str(given).strip():
        return Path(given).expanduser()
    if os.environ.get(KEY_ENV, "").strip():
        return Path(os.environ[KEY_ENV]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "gsd" / "ledger-keys" / f"{ledger_id}.key"


def check_value(key: bytes, ledger_id: str) -> str:
    """What the ledger keeps to recognise its key: HMAC-SHA256(K, tag + id)."""
    return hmac.new(key, _CHECK + ledger_id.encode(), hashlib.sha256).hexdigest()


class LedgerKey:
    """A ledger's secret key K; :meth:`keyed` is the stored form of an identity."""

    def __init__(self, key: bytes, path: Path):
        if len(key) != KEY_BYTES:
            raise LedgerKeyError(f"{path} is not a gsd ledger key ({len(key)} bytes, a key has {KEY_BYTES}); give the right --ledger-key")
        self._key = key
        self.path = path

    def __repr__(self) -> str:  # never the key itself
        return f"LedgerKey({str(self.path)!r})"

    def keyed(self, digest: str) -> str:
        """HMAC-SHA256(K, ``digest``) in hex, cut to the length of ``digest`` (32 or 64 hex digits)."""
        return hmac.new(self._key, digest.encode(), hashlib.sha256).hexdigest()[:len(digest)]

    def check(self, ledger_id: str) -> str:
        return check_value(self._key, ledger_id)


def make_key(ledger_id: str, given: str | os.PathLike | None = None) -> LedgerKey:
    """A new key for the ledger ``ledger_id``, written to :func:`key_path` (created 0600, its folder 0700;
    an existing file is never overwritten: it is read instead when it is a key)."""
    path = key_path(ledger_id, given)
    if path.exists():
        return read_key(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = secrets.token_bytes(KEY_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.hex() + "\n")
    except FileExistsError:  # made meanwhile by another process
        return read_key(path)
    except OSError as e:
        raise LedgerKeyError(f"the ledger's key cannot be written to {path} ({e.strerror or e}); "
                             "give a writable place with --ledger-key PATH (or $GSD_LEDGER_KEY)") from None
    return LedgerKey(key, path)


def read_key(path: Path) -> LedgerKey:
    """The key in the file ``path`` (:class:`LedgerKeyError` when it is missing or not a key)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        raise LedgerKeyError(f"no ledger key at {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LedgerKeyError(f"the ledger key {path} cannot be read ({getattr(e, 'strerror', None) or e}); check its permissions") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise LedgerKeyError(f"{path} is not a gsd ledger key (not hex); give the right --ledger-key") from None
    return LedgerKey(key, path)


def load_key(ledger_id: str, check: str, shown_ledger: str, given: str | os.PathLike | None = None) -> LedgerKey:
    """The key of the ledger ``ledger_id`` (whose check value is ``check``), or one line saying where it
    was looked for and what to do."""
    path = key_path(ledger_id, given)
    try:
        key = read_key(path)
    except LedgerKeyError as e:
        raise LedgerKeyError(f"the ledger {shown_ledger} needs its secret key to read or book private data sets, and {e}; "
                             f"give the key file with --ledger-key PATH or $GSD_LEDGER_KEY (whoever created the ledger has it, "
                             f"by default in ~/.config/gsd/ledger-keys/{ledger_id}.key)") from None
    if not hmac.compare_digest(key.check(ledger_id), check):
        raise LedgerKeyError(f"{path} is not the key of the ledger {shown_ledger} (another ledger's key); "
                             "give this ledger's key with --ledger-key PATH or $GSD_LEDGER_KEY")
    return key
