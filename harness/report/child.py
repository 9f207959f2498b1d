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

__all__ = ["ChildCall", "ForkedChild", "can_fork", "child_started", "fork_is_safe", "receive"]

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


class ForkedChild:
    """What :class:`ChildCall` and :class:`harness.report.plot_worker.PlotWorker` share: a forked child process, a
    pipe to it, its one answer read with :func:`receive`, and :meth:`close`.

    A subclass calls :meth:`_start` in its constructor and :meth:`_answer` to wait for the answer; it overrides
    :meth:`_told_to_stop` when its child can be asked to end rather than stopped.
    """

    _task = "working"
    """What the child does, for :func:`receive`'s sentence (a subclass names it)."""

    def _start(self, target: Callable[..., None], args: tuple[Any, ...], *, duplex: bool, name: str | None = None) -> None:
        """Fork ``target(child_end, parent_end, *args)`` (a daemon) and keep this end of the pipe."""
        context = multiprocessing.get_context("fork")  # made only where forking is safe (fork_is_safe)
        self._conn, child = context.Pipe(duplex=duplex)
        self._process = context.Process(target=target, args=(child, self._conn, *args), name=name, daemon=True)
        self._process.start()
        child.close()
        self._answered = False

    def _answer(self) -> Any:
        """The child's value (waited for; the child is closed either way).

        Raises:
            Exception: what the child raised, re-raised here.
            ReportError: the child died without a whole answer (its exit code or signal in the message).
        """
        try:
            ok, value = receive(self._conn, self._process, self._task)
            self._answered = True
        finally:
            self.close()
        if not ok:
            raise value
        return value

    def _told_to_stop(self) -> bool:
        """Ask a running child to end by itself; whether it was asked (here never: it is stopped instead)."""
        return False

    def close(self) -> None:
        """End the child and wait for it: asked to stop where :meth:`_told_to_stop` can, else stopped if it still runs
        and its answer is not wanted (idempotent)."""
        if self._process.exitcode is None and not self._answered and not self._told_to_stop():
            self._process.terminate()
        self._process.join()
        self._conn.close()


class ChildCall(ForkedChild, Generic[_T]):
    """``function(*args)`` in a forked child, started by the constructor (requires :func:`can_fork`; use it where
    :func:`fork_is_safe`).

    The value must pickle; so must the exception, else its text comes back as a :class:`RuntimeError`. Call
    :meth:`result` or :meth:`close` (in ``finally``): the child is waited for either way.
    """

    _task = "reading the ledger's turns"

    def __init__(self, function: Callable[..., _T], *args: Any) -> None:
        self._start(_call, (function, args), duplex=False)

    def result(self) -> _T:
        """The child's value; waits for it.

        Raises:
            Exception: what the function raised in the child, re-raised here.
            ReportError: the child died without a whole answer (killed mid-send too; its exit code in the message).
        """
        value: _T = self._answer()
        return value


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


def child_started(parents: Connection) -> None:
    """What a forked child does first: close the fork's copy of the parent's end of the pipe (with it open, a parent
    killed leaves the child blocked for ever, waiting to read or to write) and ignore Ctrl-C (it reaches the parent,
    which ends the child)."""
    import signal

    parents.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call(conn: Connection, parents: Connection, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    child_started(parents)
    try:
        answer: tuple[bool, Any] = (True, function(*args))
    except Exception as exc:  # noqa: BLE001 - re-raised in the parent
        answer = (False, exc)
    try:
        conn.send(answer)
    except OSError:
        return  # the parent is gone (killed): nobody to answer
    except Exception as exc:  # noqa: BLE001 - a value or exception that does not pickle: its text
        conn.send((False, RuntimeError(f"a report's child process could not send its answer: {exc!r}")))
