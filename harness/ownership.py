"""Run ownership: which process may run a planned identity now, whatever happened to earlier ones.

Design
------
A run owns its identity by holding an exclusive lock on one byte of the ledger's lock file,
``<ledger>.locks/runs.lock`` beside the ledger, from just before its start row until its end row
is written. The byte is the identity's own: its offset is the identity's first 15 hex digits read
as a number (:func:`lock_byte`, below 2**60). The lock is an open-file-description byte-range
lock (Linux ``F_OFD_SETLK``): it belongs to the open file, not to the process, and the kernel
releases it when the file's last descriptor closes, so when the process dies, however it dies
(``kill -9``, a crash, a container restart). Ownership thus never depends on process ids, which
are reused (pid 1 in every container). The runner (:mod:`harness.runner`) takes the lock and then
decides, in the start row's transaction, whether the ledger already holds a finished run of the
identity; while it holds the lock, any unfinished run of the identity is a dead one.

* One lock file per ledger, empty, made once and never deleted (deleting it while another
  process has it open would let two owners lock two different files). A matrix whose next lock
  finds another file under the name stops (:class:`LockFile`). Taking a lock opens that
  existing file (no new file per identity: making one cost a new inode on every run).
* Each lock opens the file anew, so threads of one process conflict like processes: an OFD lock
  conflicts with every other open file description, also one in the same process.
* :func:`owned_elsewhere` (``--dry-run``) asks with ``F_OFD_GETLK``, which takes no lock, and
  creates nothing; a probe therefore never makes an owner wait or skip.
* Two identities whose first 15 hex digits agree (one chance in 2**60 for a pair of SHA-256
  identities) share a byte: while one runs, the other is reported as running elsewhere.
* Ledgers run before this layout held ``flock`` locks on per-identity files,
  ``<ledger>.locks/<identity>.lock``. Those files are left alone and mean nothing now: a run
  recorded with one resumes as any other. An older harness process running on the same ledger
  at the same moment as this one does not see this one's locks (nor this one its).
* Where the platform has no OFD locks (not Linux), each identity keeps its own ``flock``ed file,
  ``<ledger>.locks/<identity>.lock``, as before.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.errors import LedgerSwapped
from harness.ledger import IdentityHolder, file_id, swapped

if TYPE_CHECKING:
    from harness.endpoints import PlannedRun

__all__ = [
    "LOCK_FILE",
    "Claim",
    "ClaimTaker",
    "LockFile",
    "RunLock",
    "lock_byte",
    "lock_folder",
    "lock_in_the_way",
    "lock_path",
    "lock_refusal",
    "mark_running",
    "owned_elsewhere",
    "take_lock",
]

LOCK_FILE = "runs.lock"
"""The name of the ledger's one lock file in :func:`lock_folder`."""

_OFD = hasattr(fcntl, "F_OFD_SETLK") and struct.calcsize("P") == 8  # the layout below is the 64-bit one
_FLOCK = struct.Struct("hhqqi4x")
"""``struct flock`` (Linux, 64-bit): ``l_type``, ``l_whence``, ``l_start``, ``l_len``, ``l_pid`` (0 for OFD locks)."""
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Claim:
    """A run's hold on its identity, taken before its start row (see :data:`ClaimTaker`).

    Attributes:
        policy: called inside the start row's transaction with every run already recorded
            under the identity; True lets the run start.
        facts: recorded in the start row's ``config`` (e.g. ``{"lock": "ledger.sqlite.locks/runs.lock",
            "lock_byte": 123}``).
        release: gives the identity up; called once the run has ended (or did not start).
    """

    policy: Callable[[Sequence[IdentityHolder]], bool]
    facts: Mapping[str, Any] = field(default_factory=dict)
    release: Callable[[], None] = lambda: None


ClaimTaker = Callable[[str], Claim | None]
"""Takes a run identity (hex) and returns its :class:`Claim`, or None when a live run owns it now."""


def lock_folder(ledger_path: str | Path) -> Path:
    """``<ledger>.locks``: the folder of the ledger's lock file (``results/ledger.sqlite.locks`` by default).

    Beside the real file: a ledger reached through a symlink shares its locks with every other name of it.
    """
    path = Path(os.path.realpath(ledger_path))
    return path.with_name(path.name + ".locks")


def lock_byte(identity: str) -> int:
    """The offset of ``identity``'s byte in the lock file: its first 15 hex digits as a number (0 <= offset < 2**60).

    Raises:
        ValueError: ``identity`` is not lowercase hex.
    """
    if not identity or not _HEX.issuperset(identity):
        raise ValueError(f"a run identity is lowercase hex, not {identity!r}")
    return int(identity[:15], 16)


def lock_path(folder: Path, identity: str) -> Path:
    """The file that holds ``identity``'s lock in the lock ``folder``: :data:`LOCK_FILE` (one for every identity), or
    ``<identity>.lock`` where the platform has no OFD locks."""
    return folder / (LOCK_FILE if _OFD else f"{identity}.lock")


def lock_refusal(folder: Path, identity: str, exc: OSError) -> str:
    """The sentence for ``identity``'s lock that :func:`take_lock` could not take in ``folder`` (``exc``): what is in
    the way (:func:`lock_in_the_way`) and what to do, else that the folder is not writable."""
    return lock_in_the_way(folder, identity) or (
        f"cannot lock run {identity[:12]} in {folder} ({exc.strerror or exc}); check that the ledger's folder is writable."
    )


def lock_in_the_way(folder: Path, identity: str) -> str | None:
    """The sentence of :func:`lock_refusal` when something that is no lock holds the name of the lock ``folder`` (a
    file, a FIFO, a dangling symlink) or of ``identity``'s lock file in it (a folder, a symlink or a FIFO), or that this
    user cannot look into the folder; else None. Only ``stat`` calls, nothing opened: ``--dry-run`` asks it to say what the real run would, and a FIFO never makes
    it wait."""
    try:
        if os.path.lexists(folder) and not folder.is_dir():  # e.g. `harness export --out ledger.sqlite.locks`
            return f"{folder} is not a folder, but the ledger keeps its run locks there; move or remove it and run again."
        file = lock_path(folder, identity)
        if file.is_symlink() or (file.exists() and not file.is_file()):
            return f"{file} is not a lock file (a folder, a symlink or a FIFO); delete it and run again."
    except OSError as exc:  # red team: a lock folder this user cannot search (EACCES)
        return f"cannot look into {folder} ({exc.strerror or exc}); give this user access to it, or use another --ledger."
    return None


class RunLock:
    """An exclusive lock on one identity's byte of the lock file, held until :meth:`release` or the process ends.

    Attributes:
        path: the lock file.
        offset: the identity's byte in it (:func:`lock_byte`); None where each identity has its own file.
        file: ``(st_dev, st_ino)`` of the file locked (the name may be another file's by now: :class:`LockFile`).
    """

    def __init__(self, fd: int, path: Path, offset: int | None, file: tuple[int, int]) -> None:
        self._fd: int | None = fd
        self.path = path
        self.offset = offset
        self.file = file

    def fileno(self) -> int:
        """The held lock's descriptor. Raises ValueError once released."""
        if self._fd is None:
            raise ValueError("the lock was released")
        return self._fd

    def release(self) -> None:
        """Unlock and close the file (idempotent); the file stays for the next owner."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file releases its lock


def take_lock(ledger_path: str | Path, identity: str, *, folder: Path | None = None) -> RunLock | None:
    """Take the identity's lock if no live process (or thread) owns it.

    Args:
        ledger_path: the ledger file; the lock file lives in :func:`lock_folder` of it (created if missing).
        identity: the run identity (lowercase hex).
        folder: :func:`lock_folder` of ``ledger_path`` when the caller has it already (a matrix takes many locks).

    Returns:
        The held lock, or None when a live owner holds it now.

    Raises:
        ValueError: ``identity`` is not lowercase hex.
        OSError: the lock folder or file cannot be created or opened (e.g. a read-only folder), or the lock file is
            not a regular file (a FIFO or a device put in its place).
    """
    offset = lock_byte(identity)
    path = lock_path(folder or lock_folder(ledger_path), identity)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO put there must not block
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:  # the first lock, or the folder was deleted: make it (once, not on every run)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o644)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if _OFD:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0))
        elif not _flock_owner(fd):
            os.close(fd)
            return None
    except (BlockingIOError, PermissionError):  # EAGAIN (or EACCES, as POSIX allows): a live owner holds it
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return RunLock(fd, path, offset if _OFD else None, (info.st_dev, info.st_ino))


class LockFile:
    """One matrix's locks on one ledger: :func:`take_lock`, and every lock on the file the first one was on.

    Deleting (or replacing) the lock file while a matrix holds locks in it would let another process make a new one and
    lock, then run, the same identities. The next lock this matrix takes then opens the new file: :meth:`take` notices
    (one comparison of the ``(st_dev, st_ino)`` the lock's ``fstat`` gave) and refuses, so the matrix stops. The first
    lock file stays open (unlocked) for the object's life, so its inode number cannot pass to a new file meanwhile. Where each
    identity has its own file (no OFD locks) there is nothing to compare. The ledger itself moved (with its folder, say)
    or replaced is asked first (one ``stat``): no lock folder is then made anew under its old name, and the sentence is
    the ledger's (:func:`~harness.ledger.opening.swapped`), not the lock file's.

    Args:
        ledger_path: the ledger file.

    Attributes:
        folder: :func:`lock_folder` of the ledger.
    """

    def __init__(self, ledger_path: str | Path) -> None:
        self.ledger_path = Path(ledger_path)
        self.folder = lock_folder(ledger_path)
        self._ledger = file_id(self.ledger_path)  # the file the matrix writes (it exists by now)
        self._first: tuple[int, int] | None = None
        self._pin: int | None = None  # the first lock file, kept open (never locked): its inode number is not reused
        self._guard = threading.Lock()

    def __del__(self) -> None:
        if self._pin is not None:
            os.close(self._pin)

    def take(self, identity: str) -> RunLock | None:
        """:func:`take_lock` in :attr:`folder`.

        Raises:
            LedgerSwapped: the ledger's path no longer names the file it named when this object was made, or the lock
                file is not the one this object's first lock was on (it was deleted or replaced since); no lock is kept.
            ValueError, OSError: as :func:`take_lock`.
        """
        if self._ledger is not None and (problem := swapped(self.ledger_path, self._ledger)):
            raise LedgerSwapped(problem)
        lock = take_lock(self.ledger_path, identity, folder=self.folder)
        if lock is not None and lock.offset is None:
            return lock  # a file per identity: nothing to compare
        # refused: compare the file it is held in (another matrix's new file held it: CI, stop 27)
        path = lock.path if lock is not None else lock_path(self.folder, identity)
        here = lock.file if lock is not None else file_id(path)
        with self._guard:
            if lock is not None and self._first is None:
                self._first, self._pin = here, _pin(lock)
            moved = self._first is not None and here != self._first
        if moved:
            if lock is not None:
                lock.release()
            raise LedgerSwapped(
                f"the lock file {path} was deleted or replaced while this matrix held run locks in it, so another "
                "process could run the same identity as this one; the matrix stops: let every harness run on "
                f"{self.ledger_path} end, then run again (and leave {self.folder} alone while one runs)."
            )
        return lock


def _pin(lock: RunLock) -> int | None:
    """A descriptor of ``lock``'s file of its own (a new open file description: closing the lock's still releases the
    lock), so that while it is open the file system cannot give the file's inode number to a new lock file made after
    this one was deleted; :class:`LockFile` tells the two apart by that number. None where ``/proc`` is missing."""
    try:
        return os.open(f"/proc/self/fd/{lock.fileno()}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None


def _flock_owner(fd: int) -> bool:
    """The per-identity layout (no OFD locks): ``LOCK_EX``; one that finds only ``--dry-run`` probes (``LOCK_SH``)
    waits for them (a moment) instead of taking the identity for in flight. False: a live owner holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted only when no owner holds LOCK_EX: just probes
        except BlockingIOError:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX)  # the probes let go at once (or an owner got in first: wait it out)
    return True


def owned_elsewhere(ledger_path: str | Path, identity: str, *, folder: Path | None = None) -> bool:
    """Whether a live process (or another open file of this one) holds the identity's lock now; takes no lock and
    creates nothing (``--dry-run``). ``folder``: :func:`lock_folder` of ``ledger_path`` when the caller has it already.

    Returns:
        True when an owner holds it; False when the lock is free or was never made, or the lock file is not a regular
        file (a run then refuses it: :func:`take_lock`).
    """
    offset = lock_byte(identity)
    try:  # O_NONBLOCK: opening a FIFO put in the lock file's place for reading would wait for a writer forever
        fd = os.open(
            lock_path(folder or lock_folder(ledger_path), identity), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        )
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        if _OFD:
            asked = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
            return _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, asked))[0] != fcntl.F_UNLCK
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # the old layout: a shared lock for a moment
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


def mark_running(planned: Sequence[PlannedRun], ledger_path: str | Path, *, resume: bool = True) -> None:
    """Set each planned run's ``running``: a live process holds its identity's lock now (:func:`owned_elsewhere`: takes
    no lock, creates nothing), and, with ``resume``, it is not ``done`` (a done run is not run again; without
    ``resume``, ``--no-resume``, it is, unless another process runs it now). ``--dry-run`` and the real run's opening
    line count these as running in another process."""
    folder = lock_folder(ledger_path)  # once: every identity's lock is in the same file
    for item in planned:
        item.running = item.to_do(resume=resume) and owned_elsewhere(ledger_path, item.identity, folder=folder)
