"""One writer per run folder: an operating-system lock held for a training run's whole life.

Two ``gsd train`` with one ``--out``, or a ``--resume`` while the run still goes, would both train and both
book in the privacy ledger, and leave one folder holding parts of two runs (which even passes the resume
checks). So a run holds an exclusive lock on :data:`~gsd_cli.train.checkpoint.RUN_LOCK` (``.gsd-run.lock``)
in its folder from before it reads the ledger, books or writes anything until it ends (:func:`lock_run`); a
second writer is refused at once with one line, exit 2 (:class:`RunInUse`: "... is in use by another gsd
train (pid N); wait for it or give another --out").

* The lock is the operating system's: ``fcntl.flock`` (POSIX; over NFS, Linux maps it to a byte-range lock the
  server keeps), else ``msvcrt.locking`` (Windows). It goes when its process ends, however it ends (a crash,
  ``kill -9``), so a lock file left behind never blocks a later run. Where neither exists, nothing is locked.
* The file stays in the folder (removing it as a run ends would let two later runs lock two different files)
  and holds its last holder's process id, for the message. A new run's folder that holds nothing else counts
  as empty (:func:`gsd_cli.train.checkpoint.prepare_run_dir`).
* A new run creates its folder to lock it; a run that stops before writing anything (a bad option found later)
  removes the lock file, and the folder if it created it: no empty folder is left behind.
* One process locks a folder once: :func:`lock_run` on a folder this process holds is a no-op (``gsd train``
  holds it from before ``--auto-select``'s booking, then calls :func:`gsd_cli.train.train`, which takes it too).
  The processes of one run share it: ``train(nproc=N)``'s caller holds it and its N processes take none
  (:func:`held_by_launcher`); under ``torchrun`` or in a process group, process 0 holds it for all.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from ..errors import GSDError
from . import checkpoint as ckpt

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None
try:
    import msvcrt
except ImportError:
    msvcrt = None

#: the folders this process holds (real path -> how many nested lock_run hold it)
_HELD: dict[str, int] = {}
#: Windows: the byte locked, past the process id the file holds (a locked byte cannot be read by others)
_WINDOWS_BYTE = 1 << 20


class RunInUse(GSDError):
    """Another process holds the run folder's lock: one line, exit 2, nothing booked or written."""


def _key(path: Path) -> str:
    return os.path.realpath(path)


def _try_lock(fd: int) -> bool:
    """Lock ``fd`` exclusively without waiting: False when another process holds it."""
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        elif msvcrt is not None:  # pragma: no cover - Windows
            os.lseek(fd, _WINDOWS_BYTE, os.SEEK_SET)
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:  # EWOULDBLOCK / EAGAIN / EACCES: held by another process
        return False
    return True


def _holder(fd: int) -> str:
    """`` (pid N)`` from the lock file, or nothing where it holds no process id (being written)."""
    try:
        text = os.pread(fd, 32, 0) if hasattr(os, "pread") else b""
    except OSError:
        text = b""
    pid = text.decode("ascii", "replace").strip()
    return f" (pid {pid})" if pid.isdigit() else ""


def _refusal(path: Path, resume: bool, holder: str) -> RunInUse:
    if resume:
        return RunInUse(f"run folder {path} is in use by another gsd train{holder}; wait for it to end, then --resume it")
    return RunInUse(f"--out {path} is in use by another gsd train{holder}; wait for it or give another --out")


def _lock_file(path: Path, resume: bool) -> int:
    """An open descriptor of the folder's lock file, locked by this process (:class:`RunInUse` if another holds it)."""
    file = path / ckpt.RUN_LOCK
    while True:
        try:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise GSDError(f"cannot lock the run folder {path}: {e.strerror or e}; give a folder you can write to") from None
        if not _try_lock(fd):
            holder = _holder(fd)
            os.close(fd)
            raise _refusal(path, resume, holder)
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(file))
        except OSError:
            same = False
        if same:  # not a file its last holder removed as this process opened it (then again, with the new one)
            return fd
        os.close(fd)


def _write_pid(fd: int) -> None:
    """This process's id into the held lock file (for a second writer's message)."""
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"{os.getpid()}\n".encode())


class _Lock:
    """A held lock: its folder, its descriptor, and whether this process created the folder."""

    def __init__(self, path: Path, resume: bool):
        self.path, self.resume, self.fd, self.created = path, resume, None, False

    def acquire(self) -> "_Lock":
        """The folder's checks (:func:`~gsd_cli.train.checkpoint.prepare_run_dir`) and its lock, in the order that
        tells a busy folder as busy and never creates a lock file in a folder that is not the run's."""
        path = self.path
        try:
            if path.is_dir() and (path / ckpt.RUN_LOCK).is_file():  # a run may be there now: its lock first
                self.fd = _lock_file(path, self.resume)
            ckpt.prepare_run_dir(path, self.resume, create=False)
            if self.fd is None:
                self.created = ckpt.make_run_dir(path)  # 0700: it will hold private files (checkpoint.own_run_dir)
                self.fd = _lock_file(path, self.resume)
                ckpt.prepare_run_dir(path, self.resume, create=False)  # under the lock: a writer may have begun meanwhile
            _write_pid(self.fd)  # only once the folder is this run's (a finished run's lock file is left as it was)
        except BaseException:
            self.release()
            raise
        return self

    def release(self) -> None:
        """Unlock; a new run's folder that holds nothing but the lock file loses it (and the folder, if created here)."""
        if self.fd is None:
            return
        try:
            if not self.resume and [p.name for p in self.path.iterdir()] == [ckpt.RUN_LOCK]:
                (self.path / ckpt.RUN_LOCK).unlink()
                if self.created:
                    self.path.rmdir()
        except OSError:
            pass  # left as it is: a folder holding only the lock file counts as empty
        finally:
            os.close(self.fd)
            self.fd = None


def check_run_dir(out: str | Path, resume: bool = False) -> Path:
    """:func:`lock_run`'s checks without taking the lock or creating anything: :class:`RunInUse` where another
    process holds the folder, then :func:`~gsd_cli.train.checkpoint.prepare_run_dir`'s (``gsd train`` checks an
    ``--out`` this way before its other checks, then locks it). In a process other than 0 of a ``torchrun``
    launch, nothing is checked: process 0 checks and locks the folder for them all."""
    path = Path(out).expanduser()
    if not _main_process():
        return path
    file = path / ckpt.RUN_LOCK
    if _key(path) not in _HELD and path.is_dir() and file.is_file():
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            fd = None
        if fd is not None:
            try:
                free = _try_lock(fd)  # released by the close below
                holder = "" if free else _holder(fd)
            finally:
                os.close(fd)
            if not free:
                raise _refusal(path, resume, holder)
    return ckpt.prepare_run_dir(path, resume, create=False)


def _main_process() -> bool:
    """False in a process other than 0 of a ``torchrun`` launch (process 0 holds the lock for the run)."""
    from .distributed import launched_by_torchrun

    return not launched_by_torchrun() or os.environ.get("RANK", "0") == "0"


def _count(key: str, step: int) -> None:
    _HELD[key] = _HELD.get(key, 0) + step
    if _HELD[key] <= 0:
        del _HELD[key]


@contextmanager
def lock_run(out: str | Path, resume: bool = False, world=None):
    """Hold the run folder ``out``'s lock for the ``with`` block (module docstring); yields the folder's path.

    First the folder's own checks (a new run: a folder that does not exist or is empty; ``resume``: one with a
    checkpoint); a new run's folder is created. :class:`RunInUse` (exit 2) when another process holds it.
    ``world`` (:class:`gsd_cli.train.distributed.World`): process 0 takes it, and its refusal is raised on every
    process; without one, every process but process 0 of a ``torchrun`` launch takes it."""
    path = Path(out).expanduser()
    key = _key(path)
    nested = key in _HELD
    taken: list[_Lock] = []

    def take() -> None:
        if not nested:
            taken.append(_Lock(path, resume).acquire())

    if world is not None:
        world.from_main(take)
    elif _main_process():
        take()
    counted = nested or bool(taken)
    if counted:
        _count(key, 1)
    try:
        yield path
    finally:
        if counted:
            _count(key, -1)
        for lock in taken:
            lock.release()


@contextmanager
def held_by_launcher(out: str | Path):
    """In one of the processes :func:`gsd_cli.train.train` starts with ``nproc=N``: the folder ``out`` counts as
    held (its caller holds the lock for the N processes), so :func:`lock_run` there takes none."""
    key = _key(Path(out).expanduser())
    _count(key, 1)
    try:
        yield
    finally:
        _count(key, -1)
