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


_SHM_DMS = 128
"""The byte of a ``-shm`` file every open SQLite connection holds a read lock on (os_unix.c: ``UNIX_SHM_DMS``)."""
_SHARED = (0x40000000 + 2, 510)
"""The database file's SHARED range (os_unix.c: ``SHARED_FIRST``, ``SHARED_SIZE``): a connection in WAL mode holds a read
lock on it from its first read until it closes."""
_PROC_LOCKS = Path("/proc/locks")
"""Every file lock on this machine (Linux): ``ID: POSIX ADVISORY READ PID MAJ:MIN:INODE START END``, the device numbers
in hex. Read instead of asking with ``F_GETLK``, which needs the file open: closing any descriptor of a file drops every
POSIX lock the process holds on it, SQLite's included (a probe in a process already holding the ledger let another
process delete the ``-wal`` in use: a run appended afterwards was lost, verify still passing)."""


def _locks() -> list[tuple[int, tuple[int, int], int, int]] | None:
    """The POSIX and OFD locks now, each as ``(pid, (st_dev, st_ino), first byte, last byte)`` (pid -1 when the kernel
    does not say which; the last byte huge for a lock to the end of the file); None where there is no ``/proc/locks``."""
    try:
        text = _PROC_LOCKS.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] == "->" or fields[1] not in ("POSIX", "OFDLCK"):
            continue  # a waiter (``->``), or a whole-file flock: SQLite takes neither
        try:
            major, minor, inode = fields[5].split(":")
            device = os.makedev(int(major, 16), int(minor, 16))
            last = (1 << 63) if fields[7] == "EOF" else int(fields[7])
            found.append((int(fields[4]), (device, int(inode)), int(fields[6]), last))
        except ValueError:
            continue
    return found


def _holder(locks: list[tuple[int, tuple[int, int], int, int]], path: str | Path, start: int, length: int) -> int:
    """The id of a process, not this one, holding a lock on ``length`` bytes of ``path`` from ``start`` (SQLite's locks
    are POSIX ones; -1 when the kernel does not say which process: an OFD lock, or a process of another pid namespace),
    else 0 (also when there is no such file)."""
    file = file_id(Path(path))
    me = os.getpid()
    for pid, where, first, last in locks:
        if where == file and pid != me and first < start + length and start <= last:
            return pid if pid > 0 else -1  # 0: a process in another pid namespace (a container), still a holder
    return 0


def _lone_holder(path: Path) -> tuple[str, int] | None:
    """``("shm", pid)`` when process ``pid`` holds the ``-shm`` beside ``path`` and no process holds the file,
    ``("file", pid)`` when it holds the file and none the ``-shm``; None otherwise or when the platform cannot say."""
    locks = _locks()
    if locks is None:
        return None
    shm_file = file_id(Path(f"{path}-shm"))
    shm = _holder(locks, f"{path}-shm", _SHM_DMS, 1)
    file = _holder(locks, path, *_SHARED)
    if bool(shm) == bool(file):
        return None
    if shm:
        return ("shm", shm)
    # the file without the -shm beside it: only when the holder has a -shm open elsewhere (the one under the name it
    # opened the file by); a process caught opening the ledger (the file's lock taken, no -shm yet) has none
    journal = any(pid == file and first <= _SHM_DMS <= last and where != shm_file for pid, where, first, last in locks)
    return ("file", file) if journal else None


def _orphan_journal(path: Path) -> str | None:
    """One sentence when the ledger at ``path`` and the ``-wal``/``-shm`` files beside it are not one ledger's in another
    process: it holds the ``-shm`` open but not the file (none there, or another one), or the file but not the ``-shm``
    (it opened the file under another name). A ledger moved, deleted or replaced while a process writes it leaves that
    process's journal under the old name; SQLite would take it for this file's, or give this file a second journal
    (the writers then overwrite each other's pages: rows lost, files damaged). None otherwise, also where the platform
    cannot say. The locks are read from ``/proc/locks`` (:func:`_locks`: no file of the ledger is opened, so none of
    this process's locks is dropped); the file held without the ``-shm`` counts only when its holder has a ``-shm``
    open elsewhere, and the answer is asked again after a tenth of a second, with the same process holding the same one
    of the two both times, so processes caught opening or closing the ledger are not mistaken for one (under four
    processes opening and closing one ledger in loops for 40 s: 0 refused in 70,792 opens)."""
    seen: list[tuple[str, int]] = []
    for pause in (0.1, 0.0):
        lone = _lone_holder(path)
        if lone is None or (seen and seen[0] != lone):
            return None  # another process each time: ones caught opening or closing the ledger
        seen.append(lone)
        time.sleep(pause)
    if seen[0][0] == "shm":
        return (
            f"another process still writes a ledger it opened under the name {path} (its -wal and -shm files are "
            "there: that ledger was moved, deleted or replaced while it was written), so no ledger is opened there now; "
            "let that process end, or pass another --ledger path."
        )
    return (
        f"another process still writes the ledger {path} under another name (it was moved or renamed while that process "
        "wrote it, and its -wal and -shm files stay under the old name), so it is not opened now (one file with two "
        "journals loses rows); let that process end, then run again."
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
