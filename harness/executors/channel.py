"""The channel between a worker process and the driver: a worker's runs reach the ledger only through it.

Messages are tuples on one duplex :func:`multiprocessing.Pipe` per worker (pickled by it):

* worker -> driver: ``(kind, request, run_id, *payload)``. A ``request`` above 0 waits for its reply; 0 is a notice.
  Kinds: ``claim`` (identity), ``start`` (:class:`~harness.ledger.RunStart`, whether the run holds a claim),
  ``attempt``, ``end`` (their records), ``turn`` (its record, a notice), ``cached`` (identity, request hash), ``sandbox`` (the run's files, from
  a worker on another machine), ``retrying``
  (:class:`~harness.ledger.Attempt`, a notice) and ``done`` (a notice: ``("ran",)``, ``("taken", in_flight)``,
  ``("skipped",)`` for a run that arrived after ``stop``, or ``("bug", text)``).
* driver -> worker: ``("replies", [(request, ok, value), ...])`` (``ok`` False: ``value`` is the text of a
  :class:`~harness.errors.LedgerError`), ``("run", RunTask)``, ``("stop", reason)`` (what the runs it ends say:
  :func:`~harness.run_options.stop_reason`), ``("quit",)``.

The driver applies the messages in the order it receives them, commits the ones that arrive together as one transaction
(a group commit, :meth:`harness.ledger.Ledger.group`) and replies to a call only once its rows are committed. A turn
is a notice (:class:`LedgerProxy`): its run goes on without waiting for the commit, saving a round trip per turn (15 %
more turns per second at 64 runs in flight, ``benchmarks/concurrency.py``). What a crash of the driver can lose is
still bounded: a run's start row and end row are calls, and one worker's messages arrive in the order its run sent
them, so every turn of a run is committed before that run's end row is acknowledged. A crash loses at most the turns
of runs that have not ended, and resume runs those again.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from harness.errors import LedgerError
from harness.ledger import Attempt, ClaimPolicy, IdentityHolder, RunEnd, RunStart, TurnRecord
from harness.loop import RunOptions, RunPlan
from harness.ownership import Claim

__all__ = ["LedgerProxy", "RunTask", "WorkerLink"]


@dataclass(frozen=True)
class RunTask:
    """One run for a worker process.

    Attributes:
        run_id: the id the driver chose (and tracks the run by).
        model: the model spec; the worker opens its backend from the recipe sent at start (:mod:`.worker`).
        plan: what to run.
        options: how (picklable: without ``claim``, ``stop`` and ``on_retry``, which the worker supplies).
        extra_config: facts for the start row's ``config`` (``jobs``, ``endpoint_parallel``, the warm-up).
    """

    run_id: str
    model: str
    plan: RunPlan
    options: RunOptions
    extra_config: dict[str, Any] = field(default_factory=dict)


class _Waiter:
    def __init__(self) -> None:
        self.event = threading.Event()
        self.ok = False
        self.value: Any = "the driver went away"

    def resolve(self, ok: bool, value: Any) -> None:
        self.ok, self.value = ok, value
        self.event.set()


class WorkerLink:
    """The worker's end of its pipe, shared by the worker's run threads; its main thread delivers the replies.

    Args:
        conn: the worker's end of the duplex pipe.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Waiter] = {}
        self._broken = False

    def send(self, message: tuple[Any, ...]) -> None:
        """Send one message (thread-safe). Raises LedgerError when the driver is gone."""
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, EOFError) as exc:
            raise LedgerError(f"the driver process went away ({exc}); the run cannot be recorded.") from exc

    def call(self, kind: str, run_id: str, *payload: Any) -> Any:
        """Send a request and wait for the driver's reply; its value.

        Raises:
            LedgerError: the driver could not apply it (its message), or went away.
        """
        waiter = _Waiter()
        with self._lock:
            if self._broken:
                raise LedgerError("the driver process went away; the run cannot be recorded.")
            request = next(self._ids)
            self._pending[request] = waiter
        self.send((kind, request, run_id, *payload))
        waiter.event.wait()
        if not waiter.ok:
            raise LedgerError(str(waiter.value))
        return waiter.value

    def tell(self, kind: str, run_id: str, *payload: Any) -> None:
        """Send a notice (no reply)."""
        self.send((kind, 0, run_id, *payload))

    def deliver(self, request: int, ok: bool, value: Any) -> None:
        """Hand a reply to the run thread waiting for it."""
        with self._lock:
            waiter = self._pending.pop(request, None)
        if waiter is not None:
            waiter.resolve(ok, value)

    def break_all(self) -> None:
        """The driver is gone: every waiting call raises LedgerError, and so does every later one."""
        with self._lock:
            self._broken = True
            waiters, self._pending = list(self._pending.values()), {}
        for waiter in waiters:
            waiter.resolve(False, "the driver process went away; the run cannot be recorded.")


def _decided_by_driver(holders: Sequence[IdentityHolder]) -> bool:
    raise AssertionError("a worker's claim policy is applied by the driver, never in the worker")


class LedgerProxy:
    """A :class:`~harness.ledger.RunLedger` for one run in a worker process: each call goes to the driver.

    Every write but :meth:`record_turn` returns once the driver has committed it. The run's claim (:meth:`take_claim`) is taken and held by
    the driver, which releases it when the run is done (or its worker died).

    Args:
        link: the worker's link to the driver.
        run_id: the run this proxy serves.
    """

    def __init__(self, link: WorkerLink, run_id: str) -> None:
        self.link, self.run_id = link, run_id

    def take_claim(self, identity: str) -> Claim | None:
        """A :data:`~harness.ownership.ClaimTaker`: the driver takes the identity's lock (None: a live run holds it)."""
        facts = self.link.call("claim", self.run_id, identity)
        return None if facts is None else Claim(_decided_by_driver, facts)

    def start_run(self, record: RunStart, *, claim: ClaimPolicy | None = None) -> bool:
        """Append the start row; the driver applies the claim it holds for the run."""
        return bool(self.link.call("start", self.run_id, record, claim is not None))

    def record_attempt(self, record: Attempt) -> None:
        """Append one failed attempt."""
        self.link.call("attempt", self.run_id, record)

    def record_turn(self, record: TurnRecord, *, defer: bool = False) -> None:
        """Append one turn: sent as a notice, committed by the driver before this run's end row (see the module
        docstring), in its group commit whatever ``defer`` says. Raises LedgerError when the driver is gone."""
        self.link.tell("turn", self.run_id, record)

    def cached_turn(self, identity: str, request_hash: str) -> TurnRecord | None:
        """The driver's ledger's cached turn (``--cache``)."""
        found = self.link.call("cached", self.run_id, identity, request_hash)
        return found if isinstance(found, TurnRecord) else None

    def end_run(self, record: RunEnd) -> None:
        """Append the end row."""
        self.link.call("end", self.run_id, record)
