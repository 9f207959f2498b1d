"""The ``processes`` executor (``harness run --executor processes``): runs execute in worker processes, the driver
(this process) stays the only writer of the ledger.

Design
------
The driver spawns ``--workers`` processes (default: the CPU count; the ``spawn`` context, never ``fork`` after threads
exist), each a :func:`~harness.executors.worker.worker_main` hosting its runs in threads. It hands them runs, up to
``--jobs`` in flight per model endpoint, to the worker with the fewest; a worker's runs reach the ledger only through
:class:`~harness.executors.channel.LedgerProxy`, whose calls the driver applies in its one thread, in the order they
arrive. The messages that arrive together (one :func:`~multiprocessing.connection.wait`) are committed as one
transaction (a group commit, :meth:`Ledger.group <harness.ledger.Ledger.group>`), and only then acknowledged. Turns are
notices, not waited for (:mod:`~harness.executors.channel`): a crash of the driver loses at most the turns of runs that
have not ended (resume runs them again); a run's end row is acknowledged only after every turn before it is committed.
The driver also takes and releases each run's claim (the identity's lock, released after its end row commits), and
reports progress from the rows it wrote: a run's ``run_finished`` summary is built from its end row and its turns'
labels, also after the commit.

A worker that dies (``kill -9``, out of memory): its runs not yet started go back to the queue; a run it had started
gets an ``infra_error`` end row (redone on resume); a run that had ended is reported as ended. A new worker takes its
place. Ctrl-C: the first stops handing out runs and tells the workers to stop (runs end as ``interrupted`` before
their next model call; the driver waits for them); the second kills the workers, applies the turns and end rows they
had sent that are still unread in the pipes, ends the other runs in flight as ``interrupted`` at once and raises
:class:`~harness.runner.MatrixQuit`. A failure of the driver itself (its ledger cannot be written, a worker's harness
bug) kills the workers at once too: nothing their runs send would be read any more. A ledger file moved, replaced or
deleted meanwhile (a start row refused with :class:`~harness.errors.LedgerSwapped`), or its lock file (a claim refused
with the same error, :class:`~harness.ownership.LockFile`), stops the matrix as a first Ctrl-C does, and the driver
raises that error once the runs in flight have ended.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, cast

from harness.endpoints import BackendFactory, Endpoint, PlannedRun
from harness.errors import HarnessError, LedgerError, LedgerSwapped
from harness.executors import worker_count, worker_cpu
from harness.executors.channel import RunTask
from harness.executors.worker import BackendRecipe, recipe_for, unpack_sandbox, worker_main
from harness.ledger import Attempt, Ledger, RunEnd, RunStart, TurnRecord
from harness.loop import RunOptions, RunSummary
from harness.ownership import Claim
from harness.run_options import STOPPED_BY_ERROR, STOPPED_BY_USER, quit_reason, stop_for, stop_reason
from harness.runner import MatrixEvents, MatrixQuit, MatrixResult, QuitNow, _end_abandoned, end_from_totals, run_config
from harness.vocab import Outcome

__all__ = ["ProcessMatrixRun", "Worker", "WorkerFailed"]

_DEATHS_BEFORE_GIVING_UP = 3  # workers that die before sending anything, in a row


class WorkerFailed(HarnessError):
    """A worker process failed in a way a run cannot record: a harness bug in it, or workers that die at start."""


@dataclass
class Worker:
    """A worker as the driver sees it.

    Attributes:
        process: ``kill()``, ``join(timeout)``, ``is_alive()``, ``exitcode`` and ``sentinel`` (a handle
            :func:`~multiprocessing.connection.wait` can watch, or None: its death shows as the end of ``conn``).
        conn: the driver's end of the channel (:mod:`harness.executors.channel`).
        models: the model specs it serves (None: every one).
        runs: the run ids it has now.
        heard: it has sent something.
        cpu: the CPU it is pinned to (:func:`~harness.executors.worker_cpu`), or None.
    """

    process: Any
    conn: Connection
    models: frozenset[str] | None = None
    runs: set[str] = field(default_factory=set)
    heard: bool = False
    cpu: int | None = None


@dataclass
class Flight:
    """A run handed to a worker, as the driver knows it from the rows it wrote."""

    run_id: str
    planned: PlannedRun
    model: str
    worker: Worker
    dispatched: float
    claim: Claim | None = None
    start: RunStart | None = None
    end: RunEnd | None = None
    labels: list[str] = field(default_factory=list)
    refused: bool = False  # its start row was refused: the ledger file was swapped (LedgerSwapped)


class ProcessMatrixRun:
    """The worker processes of one :func:`harness.runner.run_matrix` call and the runs they have in flight.

    Args:
        ledger: the open ledger; only this object writes it.
        options: the matrix's options (``claim`` set by the runner; ``workers``: processes, None for the CPU count).
        result: filled in as runs finish.
        events: progress, called from this thread only.
        backend_factory: how the driver opened backends; workers open theirs the same way (it must be picklable).
    """

    def __init__(self, ledger: Ledger, options: RunOptions, result: MatrixResult, events: MatrixEvents,
                 backend_factory: BackendFactory) -> None:  # fmt: skip
        assert options.stop is not None and options.claim is not None
        self.ledger, self.options, self.result, self.events, self.stop = ledger, options, result, events, options.stop
        self.factory = backend_factory
        self.task_options = replace(options, claim=None, stop=None, on_retry=None, extra_config={})
        self.workers: list[Worker] = []
        self.flights: dict[str, Flight] = {}
        self.queues: dict[str, deque[PlannedRun]] = {}
        self.in_flight: dict[str, int] = {}
        self.quitting = self.stopped = False
        self.deaths = 0
        self.replies: dict[int, tuple[Worker, list[tuple[int, bool, Any]]]] = {}  # per pump: sent after its commit
        self.after: list[Callable[[], None]] = []  # per pump: run after its commit
        self.failure: LedgerSwapped | None = None  # raised once the runs in flight have ended

    def run(self, endpoints: dict[str, Endpoint], todos: dict[str, list[PlannedRun]]) -> None:
        """Run every todo; returns when all are done. Raises as :meth:`harness.runner.run_matrix` does."""
        self.queues = {model: deque(plans) for model, plans in todos.items() if plans}
        self.in_flight = dict.fromkeys(self.queues, 0)
        self.recipes = {model: recipe_for(model, endpoints[model], self.factory) for model in self.queues}
        self.extra = {model: run_config(self.options, endpoints[model]) for model in self.queues}
        total = sum(len(q) for q in self.queues.values())
        try:
            self.workers.extend(self._start_workers(total))
            while self.flights or (not self.stopped and any(self.queues.values())):
                with _held():
                    if self.stop.is_set():
                        self._stop()
                    self._dispatch()
                self._pump(0.2)
            if self.failure is not None:
                raise self.failure
        except KeyboardInterrupt as interrupt:
            self._interrupted(interrupt)
        except BaseException:
            stop_for(self.stop, STOPPED_BY_ERROR)
            self._kill_workers()  # nothing their runs send is read any more: they go at once, not after 10 s each
            self._end_after_error()
            raise
        finally:
            self._shut_down()

    def _end_in_flight(self, error: str) -> int:
        """After the workers were killed: apply what they had sent (a ledger refusing those rows: the runs still end),
        end their runs still in flight as ``interrupted`` saying ``error``, and release their claims; how many ended."""
        try:
            with contextlib.suppress(LedgerError):
                self._salvage()
            return _end_abandoned(self.ledger, sorted(run_id for run_id, f in self.flights.items() if f.end is None), error)
        finally:
            for flight in self.flights.values():
                if flight.claim is not None:
                    flight.claim.release()

    def _end_after_error(self) -> None:
        """:meth:`_end_in_flight` when an error stopped the matrix (as threads end theirs, none is left without an end
        row or held); a ledger refusing rows is left as it is: the error that stopped the matrix is the one to report."""
        with contextlib.suppress(LedgerError):
            self._end_in_flight(STOPPED_BY_ERROR)

    def _interrupted(self, interrupt: KeyboardInterrupt) -> None:
        """First Ctrl-C: stop and wait for the runs in flight; a second one, :class:`QuitNow`, or one while an error was
        stopping the matrix (as with threads): quit at once, the error carried by :class:`MatrixQuit` to be reported."""
        stop_for(self.stop, STOPPED_BY_USER)
        try:
            if isinstance(interrupt, QuitNow) or self.failure is not None:
                raise interrupt
            self.events.stopping(self._begun())
            self._stop()
            while self.flights:
                self._pump(0.2)
        except KeyboardInterrupt:
            self.quitting = True
            self._kill_workers()  # nothing but the driver writes the ledger, and it writes the end rows now
            error = self.failure  # reported as it would have been without the quit, as with threads
            raise MatrixQuit(self._end_in_flight(quit_reason(self.stop, error=error is not None)), error) from error
        except BaseException:
            self._kill_workers()  # the driver failed while it waited (its output, say): as in run()
            self._end_after_error()
            raise
        raise interrupt

    def _begun(self) -> int:
        """Runs in flight that started (their start row is in the ledger) and have not ended: those a stop ends as
        ``interrupted`` when their model call returns. A run handed to a worker that has not started it is in no model
        call: it stops before its first (skipped, ``("skipped",)``, when the stop reaches the worker first; else it
        starts and ends as interrupted at once)."""
        return sum(f.start is not None and f.end is None for f in self.flights.values())

    def _salvage(self, seconds: float = 2.0) -> None:
        """Apply the turns, attempts and end rows the killed workers sent that are still unread in the pipes (one group
        commit; a bounded drain that never waits for more): a run interrupted by a second Ctrl-C keeps every turn its
        worker had sent, and a run whose end row was sent has ended. Claims and starts are not applied (those runs had
        no row yet), nor replies sent."""
        deadline = time.monotonic() + seconds
        for worker in self.workers:
            worker.process.join(1)  # dead (a Ray actor too): a message the kill cut short reads as the end of its channel
        with self.ledger.group():
            for worker in self.workers:
                try:
                    while time.monotonic() < deadline and worker.conn.poll():
                        kind, _, run_id, *payload = worker.conn.recv()
                        flight = self.flights.get(run_id)
                        if kind in ("turn", "attempt", "end") and flight is not None and flight.end is None:
                            with contextlib.suppress(LedgerError):  # e.g. a run already ended: the others still count
                                getattr(self, f"_on_{kind}")(flight, *payload)
                except (EOFError, OSError):
                    continue

    def _kill_workers(self) -> None:
        """Kill every worker process at once (``quitting`` stays as it was: the backends are still closed unless the
        caller exits at once after a second Ctrl-C)."""
        for worker in self.workers:
            worker.process.kill()

    def _stop(self) -> None:
        """No new run starts; the workers' runs end as interrupted before their next model call."""
        if self.stopped:
            return
        self.stopped = True
        for worker in self.workers:
            _send(worker, ("stop", stop_reason(self.stop)))

    def _dispatch(self) -> None:
        if self.stopped or not self.workers:
            return
        for model, queue in self.queues.items():
            serving = [w for w in self.workers if w.models is None or model in w.models]
            while queue and serving and self.in_flight[model] < self.options.jobs:
                planned = queue.popleft()
                worker = min(serving, key=lambda w: len(w.runs))
                run_id = uuid.uuid4().hex
                self.flights[run_id] = Flight(run_id, planned, model, worker, time.perf_counter())
                worker.runs.add(run_id)
                self.in_flight[model] += 1
                _send(worker, ("run", RunTask(run_id, model, planned.plan, self.task_options, self.extra[model])))

    def _pump(self, timeout: float) -> None:
        """Apply every message that arrives within ``timeout`` seconds as one group commit; bury the workers that died.

        Replies, claim releases and progress events wait for the group's commit, so nothing is acknowledged (to a
        worker, another process or the user) before it is durable.
        """
        conns = {worker.conn: worker for worker in self.workers}
        sentinels = {worker.process.sentinel: worker for worker in self.workers if worker.process.sentinel is not None}
        ready = wait([*conns, *sentinels], timeout)  # where Ctrl-C lands: never halfway through applying a message
        with _held():
            self.replies, self.after = {}, []
            with self.ledger.group():
                for item in ready:
                    if item in conns and not self._drain(conns[item]) and conns[item].process.sentinel is None:
                        self._bury(conns[item])  # its channel ended: it died (a worker without a sentinel)
                for item in ready:
                    if item in sentinels:
                        self._bury(sentinels[item])
            for worker, replies in self.replies.values():
                _send(worker, ("replies", replies))
            for action in self.after:
                action()

    def _drain(self, worker: Worker) -> bool:
        """Apply what ``worker`` sent; False when its channel has ended (it died)."""
        while worker.conn.poll():
            try:
                message = worker.conn.recv()
            except (EOFError, OSError):
                return False
            worker.heard = True
            kind, request, run_id, *payload = message
            ok = True
            try:
                value = getattr(self, f"_on_{kind}")(self.flights[run_id], *payload)
            except LedgerSwapped as exc:  # refused before writing anything: stop, as on Ctrl-C, then raise it
                ok, value, self.flights[run_id].refused = False, str(exc), True
                self.failure = self.failure or exc
                stop_for(self.stop, STOPPED_BY_ERROR)
            if request:
                self.replies.setdefault(id(worker), (worker, []))[1].append((request, ok, value))
        return True

    # -- what the workers' runs ask for (each applied here, in arrival order) --------------------------------
    def _on_claim(self, flight: Flight, identity: str) -> dict[str, Any] | None:
        assert self.options.claim is not None
        flight.claim = self.options.claim(identity)
        return None if flight.claim is None else dict(flight.claim.facts)

    def _on_start(self, flight: Flight, record: RunStart, claimed: bool) -> bool:
        policy = flight.claim.policy if claimed and flight.claim is not None else None
        started = self.ledger.start_run(record, claim=policy)
        flight.start = record if started else None
        return started

    def _on_attempt(self, flight: Flight, record: Attempt) -> None:
        self.ledger.record_attempt(record)

    def _on_turn(self, flight: Flight, record: TurnRecord) -> None:
        self.ledger.record_turn(record)
        flight.labels.extend(m for m in record.failure_modes if m not in flight.labels)

    def _on_cached(self, flight: Flight, identity: str, request_hash: str) -> TurnRecord | None:
        return self.ledger.cached_turn(identity, request_hash)

    def _on_end(self, flight: Flight, record: RunEnd) -> None:
        self.ledger.end_run(record)
        flight.end = record

    def _on_sandbox(self, flight: Flight, files: dict[str, bytes]) -> None:
        assert flight.start is not None
        unpack_sandbox(Path(flight.start.sandbox), files)

    def _on_retrying(self, flight: Flight, attempt: Attempt) -> None:
        self.events.retrying(flight.planned.plan, attempt, self.options.retry.max_attempts)

    def _on_done(self, flight: Flight, outcome: tuple[Any, ...]) -> None:
        self._land(flight.run_id)
        if outcome[0] == "taken":
            self.result.note_taken(outcome[1])
            self.after.append(functools.partial(self.events.run_taken, flight.planned.plan, in_flight=outcome[1]))
        elif outcome[0] == "bug" and not flight.refused:  # a refused start: the driver raises its failure
            self.after.append(functools.partial(_fail, outcome[1]))  # once the other runs' rows are committed
        elif flight.end is not None:
            self._finished(flight)

    # -- bookkeeping -----------------------------------------------------------------------------------------
    def _land(self, run_id: str) -> Flight:
        """The run is no longer in flight: forget it and give its identity up."""
        flight = self.flights.pop(run_id)
        flight.worker.runs.discard(run_id)
        self.in_flight[flight.model] -= 1
        if flight.claim is not None:
            self.after.append(flight.claim.release)  # once its end row is committed
        return flight

    def _finished(self, flight: Flight) -> None:
        assert flight.start is not None and flight.end is not None
        end = flight.end
        summary = RunSummary(flight.run_id, flight.planned.plan, cast(Outcome, end.outcome), end.turns,
                             end.prompt_tokens + end.completion_tokens, flight.labels, end.checks,
                             Path(flight.start.sandbox), end.error, time.perf_counter() - flight.dispatched)  # fmt: skip
        self.after.append(functools.partial(self._report, summary))

    def _report(self, summary: RunSummary) -> None:
        self.result.summaries.append(summary)
        self.events.run_finished(summary)

    def _bury(self, worker: Worker) -> None:
        """A worker died: requeue its runs not started, end its started ones as ``infra_error``, replace it."""
        if worker not in self.workers:
            return
        self._drain(worker)  # what it sent before it died
        self.workers.remove(worker)
        worker.conn.close()
        if worker.process.sentinel is not None:  # a process (a Ray actor has none): reap it, or its exit code reads None
            worker.process.join(5)
        code = worker.process.exitcode
        self.deaths = 0 if worker.heard else self.deaths + 1
        if self.deaths >= _DEATHS_BEFORE_GIVING_UP:
            raise WorkerFailed(f"{self.deaths} worker processes in a row died before running anything (exit code {code}).")
        for run_id in sorted(worker.runs):
            flight = self._land(run_id)
            if flight.start is None:
                if not self.stopped:
                    self.queues[flight.model].appendleft(flight.planned)
                continue
            if flight.end is None:
                flight.end = self._end_dead(run_id, code)
            self._finished(flight)
        if not self.stopped and any(self.queues.values()):
            self.workers.append(self._replace(worker))

    def _end_dead(self, run_id: str, code: int | None) -> RunEnd:
        error = f"the worker process running it died (exit code {code}); the run is redone on resume"
        return end_from_totals(self.ledger, run_id, "infra_error", error)

    def _start_workers(self, runs: int) -> list[Worker]:
        """The workers for ``runs`` runs to do: ``--workers`` processes (default: the CPU count), no more than can run
        at once."""
        count = worker_count(self.options.workers, runs, self.options.jobs, len(self.queues))
        return [self._spawn(worker_cpu(index, count)) for index in range(count)]

    def _replace(self, dead: Worker) -> Worker:
        """A worker to take the place of ``dead`` (on its CPU)."""
        return self._spawn(dead.cpu)

    def _spawn(self, cpu: int | None = None) -> Worker:
        with _held():  # Ctrl-C in the middle of a spawn left a child reading half its start-up data (a traceback)
            return _spawn(self.recipes, self.options.jobs * len(self.recipes), cpu)

    def _shut_down(self) -> None:
        for worker in self.workers:
            if self.quitting:
                worker.process.kill()
            else:
                _send(worker, ("quit",))
        for worker in self.workers:
            worker.process.join(None if self.quitting else 10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.conn.close()
        self.workers = []


@contextmanager
def _held() -> Iterator[None]:
    """Hold Ctrl-C back (in the main thread) while the driver applies messages; its handler runs right after.

    So Ctrl-C never lands between a row's commit and its acknowledgement (the worker would wait for ever). The SIGINT
    handler in place (the CLI's counts deliveries itself) is swapped for one that notes the signal, then restored and
    called once for it.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield  # no Python handler to defer (one set outside Python)
        return
    noted: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if noted and callable(previous):
            previous(signal.SIGINT, noted[0])
        elif noted and previous == signal.SIG_DFL:
            raise KeyboardInterrupt


def _fail(text: str) -> None:
    raise WorkerFailed(f"a run failed in a worker process; this is a harness bug, please report it:\n{text}")


def _spawn(recipes: dict[str, BackendRecipe], max_runs: int, cpu: int | None) -> Worker:
    context = multiprocessing.get_context("spawn")
    driver_end, worker_end = context.Pipe(duplex=True)
    process = context.Process(target=worker_main, args=(worker_end, recipes, max_runs), kwargs={"cpu": cpu},
                              name="harness-worker", daemon=True)  # fmt: skip
    process.start()
    worker_end.close()
    return Worker(process, driver_end, cpu=cpu)


def _send(worker: Worker, message: tuple[Any, ...]) -> None:
    try:
        worker.conn.send(message)
    except (OSError, ValueError):
        pass  # it died: its sentinel says so
