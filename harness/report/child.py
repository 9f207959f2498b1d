"""A function run in a forked child process, its value (or exception) sent back through a pipe.

Used by :func:`harness.report.frames.load_frames` to read the ledger's turns in one process while the parent reads
its runs: SQLite reads in threads convoy on the interpreter lock (the lock is given up and taken back for every row),
separate processes do not.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Generic, TypeVar

from harness.errors import ReportError

__all__ = ["ChildCall", "can_fork", "fork_is_safe", "receive"]

_T = TypeVar("_T")


def can_fork() -> bool:
    """Whether this platform starts processes by ``fork`` (a child then needs no imports and no pickled arguments)."""
    return "fork" in multiprocessing.get_all_start_methods()


def fork_is_safe() -> bool:
    """Whether a fork now gives a child that can work: the platform forks and this process runs no other thread.

    A thread that is inside a C library when the process forks (SQLite, which runs without the interpreter lock, holds
    its memory mutex in every call) leaves that lock held for ever in the child, which then hangs on its first call
    into the library (seen: a report forked while another thread queried a ledger hung opening its connection).
    """
    return can_fork() and threading.active_count() == 1


class ChildCall(Generic[_T]):
    """``function(*args)`` in a forked child, started by the constructor (requires :func:`can_fork`; use it where
    :func:`fork_is_safe`).

    The value must pickle; so must the exception, else its text comes back as a :class:`RuntimeError`. Call
    :meth:`result` or :meth:`close` (in ``finally``): the child is waited for either way.
    """

    def __init__(self, function: Callable[..., _T], *args: Any) -> None:
        context = multiprocessing.get_context("fork")
        self._conn, child = context.Pipe(duplex=False)
        self._process = context.Process(target=_call, args=(child, self._conn, function, args), daemon=True)
        self._process.start()
        child.close()
        self._answered = False

    def result(self) -> _T:
        """The child's value; waits for it.

        Raises:
            Exception: what the function raised in the child, re-raised here.
            ReportError: the child died without a whole answer (killed mid-send too; its exit code in the message).
        """
        try:
            ok, value = receive(self._conn, self._process, "reading the ledger's turns")
            self._answered = True
        finally:
            self.close()
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Stop the child if it still runs (its answer is not wanted) and wait for it."""
        if self._process.exitcode is None and not self._answered:
            self._process.terminate()
        self._process.join()
        self._conn.close()


def receive(conn: Connection, process: BaseProcess, task: str) -> tuple[bool, Any]:
    """A child's answer, ``(True, value)`` or ``(False, the exception it raised)``, read from ``conn``.

    Raises:
        ReportError: the child died before its whole answer arrived (it is waited for; ``task`` names what it was
            doing, its exit code or signal is in the message).
    """
    try:
        answer: tuple[bool, Any] = conn.recv()
    except (EOFError, OSError):  # OSError: "got end of file during message", the child died while it sent
        process.join()
        raise ReportError(_died(task, process.exitcode)) from None
    return answer


def _died(task: str, exitcode: int | None) -> str:
    """The sentence for a child process that ended without answering (a negative exit code: the signal's number)."""
    how = f"was killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"ended with exit code {exitcode}"
    return f"the report's child process {task} {how} before it answered; the report in that folder is incomplete: run it again."


def _call(conn: Connection, parents: Connection, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    import signal

    parents.close()  # the fork's copy of the parent's end: with it open, a parent killed leaves this child blocked for ever
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops this process
    try:
        answer: tuple[bool, Any] = (True, function(*args))
    except Exception as exc:  # noqa: BLE001 - re-raised in the parent
        answer = (False, exc)
    try:
        conn.send(answer)
    except Exception as exc:  # noqa: BLE001 - a value or exception that does not pickle: its text
        conn.send((False, RuntimeError(f"a report's child process could not send its answer: {exc!r}")))
