"""WAL checkpoints off the appenders' path: a daemon thread copies committed pages into the main file.

In WAL mode every commit appends the changed pages to the ``-wal`` file; a *checkpoint* copies them back into the
main file (and syncs both files to disk) so the WAL can be reused from its start. SQLite's default runs a checkpoint
inside the commit that takes the WAL past 1,000 pages, so one append in about 150 waits for it: on the per-turn
benchmark 1 % of commits held 53 % of all commit time.

A writable :class:`~harness.ledger.store.Ledger` instead sets its connection's ``wal_autocheckpoint`` to
:data:`INLINE_BOUND_PAGES` and, every :data:`COMMITS_PER_CHECKPOINT` appends (a group commit's count each), wakes a :class:`Checkpointer`: a
daemon thread with its own connection that runs ``PRAGMA wal_checkpoint(PASSIVE)``. A passive checkpoint takes no
write lock (appends go on meanwhile) and SQLite runs it without the interpreter lock, so the loop keeps working
while the pages are copied and synced. When the thread cannot keep up (or appends never pause long enough for it
to finish a whole WAL, which the WAL's reuse from its start needs), the commit that takes the WAL past the bound
checkpoints inline as before, so the WAL stays near ``INLINE_BOUND_PAGES`` pages (40 MB at 4 KiB pages) whatever
happens (a few dozen pages past it when the thread's checkpoint holds SQLite's checkpoint lock at that moment: the
next commit tries again).

Durability is unchanged: a commit that returned survives the process's crash (its pages are in the WAL), and a
checkpoint cut short is simply run again later (the WAL still holds its pages). A power cut can lose the commits
since the WAL was last synced (``synchronous=NORMAL``); every checkpoint syncs it, about every 100 appends here as
about every 150 before.

The thread starts at the first wake (a ledger opened only to read, to migrate or for a few appends never starts
one) and :meth:`Checkpointer.stop` (called by ``Ledger.close``) ends it and closes its connection before the
ledger's own connection closes (the last connection to close checkpoints the rest and removes the WAL). It is the
only thread the ledger starts: the report forks children only while the process runs a single thread
(:func:`harness.report.child.fork_is_safe`), and the ``processes`` executor spawns its workers (fork and exec at once), so no
fork copies it in the middle of a SQLite call. Any other ``os.fork`` (a caller's ``multiprocessing`` with the ``fork``
start method, say) waits for the checkpoint in progress to return first (:func:`os.register_at_fork`): a child forked
while the thread was inside SQLite could hang at its first SQLite call on a mutex the thread held (seen: 4 forks in
661 beside a busy ledger). The child has no thread; its copy of the ledger checkpoints inline at the bound.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref
from pathlib import Path
from urllib.parse import quote

from harness.ledger.opening import file_id

__all__ = ["COMMITS_PER_CHECKPOINT", "INLINE_BOUND_PAGES", "Checkpointer"]

COMMITS_PER_CHECKPOINT = 100
"""Appends between two wakes of the checkpoint thread (a turn's commit writes about 7 pages: near SQLite's 1,000)."""
INLINE_BOUND_PAGES = 10_000
"""The writer's ``wal_autocheckpoint``: past this many WAL pages a commit checkpoints inline, as SQLite does by default."""


class Checkpointer:
    """Passive WAL checkpoints of the ledger at ``path`` in a daemon thread of its own, on request.

    Args:
        path: the ledger file (opened by the thread with a connection of its own).
        opened: ``(st_dev, st_ino)`` of the file the writer opened (:func:`~harness.ledger.opening.file_id`): the thread
            opens ``path`` only while it still names that file. Another file put there after a move keeps the writer's
            ``-wal`` and ``-shm`` under its name: a connection to it would copy the writer's pages into it.

    Attributes:
        checkpoints: checkpoints run so far (tests read it).
        last: the last checkpoint's ``(busy, wal_pages, pages_checkpointed)`` as SQLite reports it, or None.
    """

    def __init__(self, path: Path, opened: tuple[int, int] | None = None) -> None:
        self.path, self.opened = path, opened
        self.checkpoints = 0
        self.last: tuple[int, int, int] | None = None
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()
        self._inside = threading.Lock()  # held while the thread is in a SQLite call; a fork waits for it
        _LIVE.add(self)

    def wake(self) -> None:
        """Ask for a checkpoint now (returns at once; starts the thread on the first call)."""
        if self._thread is None:
            with self._guard:
                if self._stopping:
                    return
                if self._thread is None:
                    self._thread = threading.Thread(target=self._main, name="ledger-checkpoint", daemon=True)
                    self._thread.start()
        self._wake.set()

    @property
    def running(self) -> bool:
        """Whether the thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    def release(self) -> None:
        """Tell the thread to end after the checkpoint in progress, without waiting (for a ledger never closed)."""
        self._stopping = True
        self._wake.set()

    def stop(self) -> None:
        """End the thread (after the checkpoint in progress, if any) and close its connection; idempotent."""
        with self._guard:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if thread is not None:
            thread.join()

    def _main(self) -> None:
        try:
            with self._inside:
                # mode=rw: a ledger moved or deleted meanwhile is not made anew, empty, under its old name
                if self.opened is not None and file_id(self.path) != self.opened:
                    return  # moved, replaced or deleted before the first wake: the writer's inline bound checkpoints
                db = sqlite3.connect(f"file:{quote(str(self.path))}?mode=rw", uri=True, isolation_level=None,
                                     check_same_thread=False, timeout=0)  # fmt: skip
                if self.opened is not None and file_id(self.path) != self.opened:  # swapped while it connected
                    db.close()
                    return
        except sqlite3.Error:
            return  # the writer's inline bound still checkpoints
        try:
            while True:
                self._wake.wait()
                if self._stopping:
                    return
                with self._inside:
                    try:
                        row = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    except sqlite3.Error:
                        row = None  # busy (another checkpoint runs) or the disk refused: the inline bound covers it
                    if row is not None:  # counted before a fork may copy the process
                        self.last = (int(row[0]), int(row[1]), int(row[2]))
                        self.checkpoints += 1
                # wakes that came during the checkpoint are dropped: never two back to back, so a writer past the
                # bound finds the checkpoint lock free between them (load made the thread win it again and again)
                self._wake.clear()
                if self._stopping:  # set before its wake: a stop during the checkpoint is not lost with the wake
                    return
        finally:
            with self._inside:
                db.close()


_LIVE: weakref.WeakSet[Checkpointer] = weakref.WeakSet()
"""Every checkpointer of this process, for the fork hooks below."""
_HELD: list[Checkpointer] = []


def _before_fork() -> None:
    """Wait until no checkpoint thread is inside a SQLite call and keep them out of SQLite until the fork is done."""
    for checkpointer in list(_LIVE):
        checkpointer._inside.acquire()
        _HELD.append(checkpointer)


def _after_fork() -> None:
    """Let the threads back into SQLite (in the parent; in the child, release the copies of the locks)."""
    while _HELD:
        _HELD.pop()._inside.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork)
