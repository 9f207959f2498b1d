"""Opening a ledger file: read-only (also in a read-only folder) or writable, with one sentence for each failure.

A WAL-mode SQLite file opened with ``mode=ro`` still needs its ``-shm`` file, which SQLite cannot
create in a read-only folder. When there is no ``-wal`` file (every row is in the main file) the
file is opened with ``immutable=1`` instead; SQLite then reads it without any lock or ``-shm``.
With a ``-wal`` file present, ``immutable=1`` would silently ignore the rows in it, so it is never
used then: ``mode=ro`` works when the ``-shm`` file exists too, and otherwise the user is told to copy
the three files to a writable folder.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from harness.errors import LedgerError

__all__ = [
    "cannot_create",
    "close_writable",
    "connect_readonly",
    "connect_writable",
    "file_id",
    "file_uri",
    "not_writable",
    "swapped",
]


def file_uri(path: Path, query: str) -> str:
    """SQLite's URI of ``path`` (made absolute, percent-encoded) with ``query``, e.g. ``mode=ro``."""
    return f"file:{quote(str(path.absolute()))}?{query}"


def _connect(target: str | Path, *, uri: bool) -> sqlite3.Connection:
    return sqlite3.connect(target, uri=uri, check_same_thread=False, isolation_level=None, timeout=30)


def _probe(db: sqlite3.Connection) -> sqlite3.Connection:
    db.execute("PRAGMA busy_timeout=30000")
    db.execute("SELECT name FROM sqlite_master").fetchall()
    return db


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open an existing ledger for reading only, never writing beside it.

    Returns:
        A connection (autocommit, usable from any thread).

    Raises:
        LedgerError: no file; not an SQLite file; a read-only folder holding a ``-wal`` file
            without its ``-shm`` file (copy the files to a writable folder); or a ``-wal`` and ``-shm`` beside it that
            another process holds for another file (:func:`_orphan_journal`: a ledger moved while it was written).
    """
    if path.exists() and not path.is_file():
        raise _not_a_file(path)
    if not path.is_file():
        raise LedgerError(f"no ledger at {path}; run `harness run` first or pass --ledger PATH.")
    # read through another file's journal, a reader would see pages of two ledgers; SQLite names the journal after the
    # file's real path (symlinks resolved), so that is the name asked about
    problem = _orphan_journal(Path(os.path.realpath(path)))
    if problem:
        raise LedgerError(problem)
    db = _connect(file_uri(path, "mode=ro"), uri=True)
    try:
        return _probe(db)
    except sqlite3.DatabaseError as exc:
        db.close()
        first = exc
    wal = Path(f"{path}-wal")
    if not isinstance(first, sqlite3.OperationalError) or os.access(path.parent, os.W_OK):
        raise _unreadable(path, first)
    if wal.exists() and wal.stat().st_size > 0:
        raise LedgerError(
            f"{path} is in a read-only folder and rows are still in {wal.name} without its -shm file; copy the ledger "
            "with its -wal file into a writable folder and pass that copy with --ledger."
        )
    db = _connect(file_uri(path, "mode=ro&immutable=1"), uri=True)  # no -wal: every row is in the main file
    try:
        return _probe(db)
    except sqlite3.DatabaseError as exc:
        db.close()
        raise _unreadable(path, exc) from exc


def connect_writable(path: Path) -> sqlite3.Connection:
    """Open (creating it and its folders if missing) a ledger for appending, in WAL mode.

    Raises:
        LedgerError: the folder or file is not writable, the file is not an SQLite file, or
            the folder cannot be created.
    """
    problem = cannot_create(path)  # the same checks --dry-run makes, so both say the same
    if problem:
        raise LedgerError(problem)
    if path.exists() and (links := path.stat().st_nlink) > 1:  # SQLite keeps one -wal per name: writes under one name are lost
        raise LedgerError(
            f"the ledger {path} has {links} hard links; writing it under two names loses rows (SQLite keeps a journal per "
            "name), so copy it instead of linking it, or always pass the same --ledger path."
        )
    path = Path(os.path.realpath(path))  # one file, one journal and one lock folder, whatever symlink names it
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LedgerError(f"cannot create the folder {path.parent} for the ledger: {exc.strerror or exc}.") from exc
    problem = not_writable(path) or _orphan_journal(path)
    if problem:
        raise LedgerError(problem)
    try:
        db = _connect(path, uri=False)
    except sqlite3.Error as exc:
        raise _unreadable(path, exc) from exc
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        return _probe(db)
    except sqlite3.Error as exc:
        db.close()
        raise LedgerError(not_writable(path) or str(_unreadable(path, exc))) from exc


_SHM_LOCKS = (120, 9)
"""The bytes of a ``-shm`` file SQLite locks (os_unix.c: ``UNIX_SHM_BASE`` 120, its 8 lock slots, and ``UNIX_SHM_DMS``
128): a connection with the ``-shm`` open holds a read lock on the last, a read-only one in a read-only folder only a
read mark among the others."""
_SHARED = (0x40000000 + 2, 510)
"""The database file's SHARED range (os_unix.c: ``SHARED_FIRST``, ``SHARED_SIZE``): a connection in WAL mode holds a read
lock on it from its first read until it closes."""
_PROC_LOCKS = Path("/proc/locks")
"""Every file lock of this pid namespace (Linux): ``ID: POSIX ADVISORY READ PID MAJ:MIN:INODE START END``, the device
numbers in hex. Read instead of asking with ``F_GETLK``, which needs the file open: closing any descriptor of a file
drops every POSIX lock the process holds on it, SQLite's included (a probe in a process already holding the ledger let
another process delete the ``-wal`` in use: a run appended afterwards was lost, verify still passing). Locks of
processes in another pid namespace (another container sharing the file) are not listed, so those go unseen."""

_Lock = tuple[int, tuple[int, int], int, int]
"""``(pid, (st_dev, st_ino), first byte, last byte)`` of one lock (pid -1 for an OFD lock)."""


def _locks(inodes: set[int] | None = None) -> list[_Lock] | None:
    """The POSIX and OFD locks now (the last byte huge for a lock to the end of the file), only those on files with an
    inode number in ``inodes`` when given (a machine may hold thousands); None where there is no ``/proc/locks``."""
    try:
        text = _PROC_LOCKS.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    keys = None if inodes is None else tuple(f":{inode} " for inode in inodes)
    found = []
    for line in text.splitlines():
        if keys is not None and not any(key in line for key in keys):
            continue
        fields = line.split()
        if len(fields) < 8 or fields[1] not in ("POSIX", "OFDLCK"):
            continue  # a waiter (``->``), or a whole-file flock or lease: SQLite takes neither
        try:
            major, minor, inode = fields[5].split(":")
            device = os.makedev(int(major, 16), int(minor, 16))
            last = (1 << 63) if fields[7] == "EOF" else int(fields[7])
            found.append((int(fields[4]), (device, int(inode)), int(fields[6]), last))
        except ValueError:
            continue
    return found


def _holders(locks: list[_Lock], file: tuple[int, int] | None, start: int, length: int) -> frozenset[int]:
    """The processes holding a lock on ``length`` bytes of ``file`` (its ``(st_dev, st_ino)``) from ``start``."""
    return frozenset(pid for pid, where, first, last in locks if where == file and first < start + length and start <= last)


def _culprits(path: Path) -> tuple[str, frozenset[int]] | None:
    """``("shm", pids)``: processes holding the ``-shm`` beside ``path`` but not the file there (their ``-shm`` is
    another file's: one moved, deleted or replaced while they wrote it); ``("file", pids)``: processes holding the file
    but not that ``-shm``, while holding one elsewhere (they opened the file by another name). None when neither, or
    where ``/proc/locks`` cannot say. This process counts too (it may hold a ledger moved since)."""
    file, shm = file_id(path), file_id(Path(f"{path}-shm"))
    inodes = {found[1] for found in (file, shm) if found is not None}
    locks = _locks(inodes) if inodes else None
    if locks is None:
        return None
    shm_pids, file_pids = _holders(locks, shm, *_SHM_LOCKS), _holders(locks, file, *_SHARED)
    if shm_pids - file_pids:
        return "shm", shm_pids - file_pids
    lone = file_pids - shm_pids
    every = _locks() if lone else None  # the rare case: which of them have a -shm open elsewhere
    if every is None:
        return None
    elsewhere = {pid for pid, where, first, last in every if pid in lone and where != shm and _SHM_LOCKS[0] <= last
                 and first < sum(_SHM_LOCKS)}  # fmt: skip
    return ("file", frozenset(elsewhere)) if elsewhere else None


def _who(pids: frozenset[int]) -> str:
    """``"this process"``, ``"process 123"``, ``"processes 123 and 456"`` (another process when the kernel does not say)."""
    named = sorted("this process" if pid == os.getpid() else f"process {pid}" for pid in pids if pid > 0)
    if not named:
        return "another process"
    if len(named) == 1:
        return named[0]
    return "processes " + " and ".join(name.removeprefix("process ") for name in named)


def _orphan_journal(path: Path) -> str | None:
    """One sentence when the ledger at ``path`` and the ``-wal``/``-shm`` files beside it are not one ledger's in a live
    process (:func:`_culprits`): it holds the ``-shm`` but not the file (none there, or another one), or the file but
    not that ``-shm`` (it opened the file by another name). A ledger moved, deleted or replaced while a process writes
    it leaves that process's journal under the old name; SQLite would take it for this file's, or give this file a
    second journal (the writers then overwrite each other's pages: rows lost, files damaged). None otherwise, also where
    the platform cannot say. The locks are read from ``/proc/locks`` (no file of the ledger is opened, so none of this
    process's locks is dropped); the answer is asked again after a tenth of a second and must be the same, so processes
    caught opening or closing the ledger are not mistaken for one (under four processes opening and closing one ledger
    in loops for 40 s: 0 refused in 70,792 opens)."""
    found = _culprits(path)
    if found is None:
        return None
    time.sleep(0.1)
    if _culprits(path) != found:
        return None
    kind, pids = found
    if pids == {os.getpid()}:  # the ledger is still open here: no other process to let end
        return _held_here(kind, path)
    if kind == "shm":
        return (
            f"{_who(pids)} still writes a ledger it opened under the name {path} (its -wal and -shm files are there: "
            "that ledger was moved, deleted or replaced while it was written), so no ledger is opened there now; let "
            "that process end, or pass another --ledger path."
        )
    return (
        f"{_who(pids)} still writes the ledger {path} under another name (it was moved or renamed while that process "
        "wrote it, and its -wal and -shm files stay under the old name), so it is not opened now (one file with two "
        "journals loses rows); let that process end, then run again."
    )


def _held_here(kind: str, path: Path) -> str:
    """:func:`_orphan_journal`'s sentence when the only process holding the other journal is this one: a ledger it has
    open (a :class:`~harness.ledger.Ledger` not closed yet) was moved, deleted or replaced since it was opened."""
    if kind == "shm":
        return (
            f"this process still has a ledger open that it opened under the name {path} (its -wal and -shm files are "
            "there: that ledger was moved, deleted or replaced since), so no ledger is opened there now; close that "
            "ledger first, or pass another --ledger path."
        )
    return (
        f"this process already has the ledger {path} open under another name (it was moved or renamed since it was "
        "opened, and its -wal and -shm files stay under the old name), so it is not opened a second time (one file with "
        "two journals loses rows); close the ledger open under the old name first, then open it again."
    )


def cannot_create(path: Path) -> str | None:
    """Why a ledger could not be created at ``path`` now (one sentence), without creating anything; None if it could.

    The same problems :func:`connect_writable` would raise: the path is a folder or a device, a
    file stands where a folder is needed, or the nearest existing folder is not writable.
    """
    if path.exists():
        return None if path.is_file() else str(_not_a_file(path))
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"cannot create the folder {path.parent} for the ledger: {folder} is a file; pass --ledger with another path."
    if folder == path.parent:
        return not_writable(path)
    if not os.access(folder, os.W_OK | os.X_OK):
        return (
            f"the folder {folder} is not writable, so {path.parent} cannot be created for the ledger; "
            "pass --ledger with a path in a writable folder."
        )
    return None


def not_writable(path: Path) -> str | None:
    """One sentence when the ledger's folder or file cannot be written (a read-only folder or mount), else None."""
    if not os.access(path.parent, os.W_OK | os.X_OK):
        return (
            f"the folder {path.parent} is not writable, so the ledger {path.name} cannot be written there; pass "
            "--ledger with a path in a writable folder (verify, export and report also work on a read-only folder)."
        )
    if path.exists() and not os.access(path, os.W_OK):
        return f"the ledger file {path} is not writable; copy it to a writable file and pass that with --ledger."
    return None


def file_id(path: Path) -> tuple[int, int] | None:
    """``(st_dev, st_ino)`` of the file at ``path`` now (following symlinks), or None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def swapped(path: Path, opened: tuple[int, int]) -> str | None:
    """One sentence when ``path`` no longer names the file opened as the ledger (``opened``: its :func:`file_id` then),
    else None. One ``stat``; the rest only when the file was moved, replaced or deleted.

    The sentence says what happened, that the matrix stops, where the rows written so far are (the open file's name
    now, found among this process's open files where the platform lists them: ``/proc/self/fd``) and what to do.
    """
    now = file_id(path)
    if now == opened:
        return None
    moved_to = _open_name(opened)
    if moved_to == "":  # its name removed, another hard link made first keeps it
        what = "removed" if now is None else "replaced by another file"
        where = "the runs recorded so far are in the file it named, which lives on under another name (a hard link)"
        todo = "pass --ledger with that name, or move that file back to this one, and run again to resume"
    elif moved_to is None:
        what = "deleted" if now is None else "replaced by another file"
        where = "the runs recorded in it are lost once this process exits, the file being deleted"
        todo = "restore the ledger from a copy if you have one, then run again"
    else:
        what = f"moved to {moved_to}" if now is None else f"replaced by another file (the one it held is now {moved_to})"
        where = f"the runs recorded so far are in {moved_to}"
        todo = f"move that file back to {path}, or pass --ledger {moved_to}, and run again to resume"
    return f"the ledger {path} was {what} while the matrix ran, so the matrix stops ({where}); {todo}."


def close_writable(db: sqlite3.Connection, path: Path, opened: tuple[int, int]) -> None:
    """Close a writable ledger's connection; when ``path`` no longer names the file opened (``opened``: its
    :func:`file_id` then), first copy every row still in the ``-wal`` file into the open file.

    SQLite does not checkpoint a file moved since it was opened when its last connection closes, and it keeps the
    ``-wal`` file under the old name: the moved file alone would lack those rows. When nothing stands under the old name
    any more, the emptied ``-wal`` and ``-shm`` files left there are removed too.
    """
    now = file_id(path)
    if now != opened:
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error:
            pass  # the rows stay in the -wal file, as before
    db.close()
    if now is None:
        real = Path(os.path.realpath(path))
        wal = Path(f"{real}-wal")
        with contextlib.suppress(OSError):
            if wal.stat().st_size == 0 and not real.exists():
                wal.unlink()
                Path(f"{real}-shm").unlink(missing_ok=True)


def _open_name(opened: tuple[int, int]) -> str | None:
    """The name the open file ``opened`` (``(st_dev, st_ino)``) has now, from ``/proc/self/fd``; "" when it still has a
    name but not the one opened by (that was removed after another hard link was made: the kernel then shows the old
    name with `` (deleted)``, and no other name); None when it has none (deleted) or the platform does not say."""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return None
    for fd in fds:
        link = f"/proc/self/fd/{fd}"
        try:
            info, name = os.stat(link), os.readlink(link)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == opened and info.st_nlink > 0 and name.startswith("/"):
            return name if file_id(Path(name)) == opened else ""
    return None


def _unreadable(path: Path, exc: BaseException) -> LedgerError:
    return LedgerError(f"{path} is not a readable SQLite ledger ({exc}); pass another --ledger path or restore the file.")


def _not_a_file(path: Path) -> LedgerError:
    kind = "a folder" if path.is_dir() else "not a regular file (a device, pipe or socket)"
    return LedgerError(f"--ledger {path} is {kind}; pass the path of a ledger file.")
