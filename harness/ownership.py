"""Run ownership: which process may run a planned identity now, whatever happened to earlier ones.

Design
------
A run owns its identity by holding an exclusive advisory ``flock`` on the identity's lock file,
``<ledger>.locks/<identity>.lock`` beside the ledger, from just before its start row until its
end row is written. The kernel releases the lock when the process dies, however it dies
(``kill -9``, a crash, a container restart), so ownership never depends on process ids, which
are reused (pid 1 in every container). The runner (:mod:`harness.runner`) takes the lock and
then decides, in the start row's transaction, whether the ledger already holds a finished run
of the identity; while it holds the lock, any unfinished run of the identity is a dead one.

* Lock files are empty, made once per identity and never deleted (deleting a lock file
  another process has open would let two owners lock two different files).
* Owners hold ``LOCK_EX``; :func:`owned_elsewhere` (``--dry-run``) probes with ``LOCK_SH``
  and never creates anything. A would-be owner that finds only such probes waits for them
  (a moment) instead of taking the identity for in flight.
* Threads of one process conflict like processes: each lock is its own open file.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.ledger import IdentityHolder

__all__ = ["Claim", "ClaimTaker", "RunLock", "lock_folder", "owned_elsewhere", "take_lock"]


@dataclass(frozen=True)
class Claim:
    """A run's hold on its identity, taken before its start row (see :data:`ClaimTaker`).

    Attributes:
        policy: called inside the start row's transaction with every run already recorded
            under the identity; True lets the run start.
        facts: recorded in the start row's ``config`` (e.g. ``{"lock": "ledger.sqlite.locks/<identity>.lock"}``).
        release: gives the identity up; called once the run has ended (or did not start).
    """

    policy: Callable[[Sequence[IdentityHolder]], bool]
    facts: Mapping[str, Any] = field(default_factory=dict)
    release: Callable[[], None] = lambda: None


ClaimTaker = Callable[[str], Claim | None]
"""Takes a run identity (hex) and returns its :class:`Claim`, or None when a live run owns it now."""


def lock_folder(ledger_path: str | Path) -> Path:
    """``<ledger>.locks``: the folder of the ledger's lock files (``results/ledger.sqlite.locks`` by default).

    Beside the real file: a ledger reached through a symlink shares its locks with every other name of it.
    """
    path = Path(os.path.realpath(ledger_path))
    return path.with_name(path.name + ".locks")


def _lock_file(ledger_path: str | Path, identity: str, folder: Path | None = None) -> Path:
    if not identity or not all(c in "0123456789abcdef" for c in identity):
        raise ValueError(f"a run identity is lowercase hex, not {identity!r}")
    return (folder or lock_folder(ledger_path)) / f"{identity}.lock"


class RunLock:
    """An exclusive ``flock`` on one identity's lock file, held until :meth:`release` or the process ends.

    Attributes:
        path: the lock file.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        """Unlock and close the file (idempotent); the file stays for the next owner."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file releases its flock


def take_lock(ledger_path: str | Path, identity: str, *, folder: Path | None = None) -> RunLock | None:
    """Take the identity's lock if no live process (or thread) owns it.

    Args:
        ledger_path: the ledger file; the lock lives in :func:`lock_folder` of it (created if missing).
        identity: the run identity (lowercase hex).
        folder: :func:`lock_folder` of ``ledger_path`` when the caller has it already (a matrix takes many locks).

    Returns:
        The held lock, or None when a live owner holds it now.

    Raises:
        OSError: the lock folder or file cannot be created or opened (e.g. a read-only folder).
    """
    path = _lock_file(ledger_path, identity, folder)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except FileNotFoundError:  # the first lock, or the folder was deleted: make it (once, not on every run)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, flags, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # granted only when no owner holds LOCK_EX: just probes
            except BlockingIOError:
                os.close(fd)
                return None
            fcntl.flock(fd, fcntl.LOCK_EX)  # the probes let go at once (or an owner got in first: wait it out)
    except BaseException:
        os.close(fd)
        raise
    return RunLock(fd, path)


def owned_elsewhere(ledger_path: str | Path, identity: str) -> bool:
    """Whether a live process holds the identity's lock now; creates nothing (``--dry-run``).

    Returns:
        True when an owner holds it; False when the lock is free or was never made.
    """
    try:
        fd = os.open(_lock_file(ledger_path, identity), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
