"""Matrix expansion and execution: scenarios x models x temperatures x seeds x tool modes x
parsers x streaming x repetitions, each cell run through :func:`harness.loop.run_once`.

A scenario file declares its default axes in ``[matrix]``; :class:`~harness.matrix.MatrixOverrides`
(the CLI flags) replace any axis for every scenario. Runs are grouped by model so that each
backend is opened (and an embedded server started) once. The runner prints nothing: it reports
progress through :class:`MatrixEvents` and raises on interrupts; :mod:`harness.console` and the
CLI turn those into terminal output. It also decides run ownership (:func:`claim_identity`): a run
holds its identity's lock (:mod:`harness.ownership`) for its lifetime, and the ledger applies
:func:`identity_free` inside the start row's transaction.
"""

from __future__ import annotations

import itertools
import queue
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.backends import open_backend, parse_model_spec
from harness.endpoints import BackendFactory, Concurrency, Endpoint, PlannedRun, check_memory_together, open_endpoints
from harness.errors import LedgerError, UsageError
from harness.executors import check_executor
from harness.ledger import Attempt, IdentityHolder, Ledger, RunEnd
from harness.loop import IdentityTaken, RunOptions, RunPlan, RunSummary, run_once
from harness.matrix import MatrixOverrides
from harness.ownership import Claim, ClaimTaker, LockFile, lock_refusal, mark_running
from harness.run_options import QUIT_BY_USER, STOPPED_BY_ERROR, STOPPED_BY_USER, StopEvent, quit_reason, stop_for
from harness.scenarios import Scenario
from harness.startup import start_model
from harness.vocab import Outcome, is_scored

if TYPE_CHECKING:
    from harness.executors.processes import ProcessMatrixRun

__all__ = [
    "MAX_PLANNED_RUNS", "BackendFactory", "MatrixEvents", "MatrixQuit", "MatrixResult", "PlannedRun", "QuitNow",
    "expand_matrix", "claim_identity", "end_from_totals", "identity_free", "plan_matrix", "run_config", "run_matrix",
]  # fmt: skip

MAX_PLANNED_RUNS = 1_000_000


def expand_matrix(scenarios: Iterable[Scenario], overrides: MatrixOverrides = MatrixOverrides()) -> list[RunPlan]:
    """Expand scenarios and overrides into planned runs, in a stable order.

    Order: scenario, model, tool mode, parser, think, stream, temperature, seed, repetition.

    Raises:
        UsageError: an override is out of range, a model spec is malformed, or the matrix has
            more than :data:`MAX_PLANNED_RUNS` runs.
    """
    matrices = [(scenario, scenario.matrix.merge(overrides)) for scenario in scenarios]
    total = sum(m.size for _, m in matrices)
    if total > MAX_PLANNED_RUNS:
        raise UsageError(f"the matrix has {total:,} runs; the limit is {MAX_PLANNED_RUNS:,}. Use fewer axis values or repeats.")
    plans: list[RunPlan] = []
    for scenario, m in matrices:
        for model in m.models:
            parse_model_spec(model)
        for model in m.models:
            for tool_mode, parser, think, stream in itertools.product(m.tool_modes, m.parsers, m.think, m.streams):
                for temperature in m.temperatures:
                    for seed in m.seeds:
                        for repetition in range(m.repeats):
                            plan = RunPlan(scenario, model, float(temperature), int(seed), tool_mode, parser, repetition)
                            plans.append(replace(plan, think=think, stream=stream))
    unique: dict[tuple[Any, ...], RunPlan] = {}
    for p in plans:  # the same file given twice (or two identical files) plans each run once
        key = (p.scenario.content_hash, p.model, p.temperature, p.seed, p.tool_mode, p.parser, p.repetition, p.think, p.stream)
        unique.setdefault(key, p)
    return list(unique.values())


def identity_free(holders: Sequence[IdentityHolder]) -> bool:
    """The resume policy, for a run that holds its identity's lock: may it start, given the runs already recorded?

    An identity is taken by a run that ended with a scored outcome (:func:`harness.vocab.is_scored`);
    ``infra_error`` and ``interrupted`` runs are redone. A run without an end row is a dead one
    (its process no longer holds the lock), also redone; its start row stays, as the ledger is
    append-only. Process ids are never consulted: they are reused (pid 1 in every container).

    Args:
        holders: every run recorded under the identity.

    Returns:
        True when none of them holds it.
    """
    return not any(holder.outcome is not None and is_scored(holder.outcome) for holder in holders)


def claim_identity(ledger_path: str | Path, *, resume: bool = True) -> ClaimTaker:
    """The runner's ownership rule for one ledger: the identity's lock, then :func:`identity_free` (with ``resume``).

    Args:
        ledger_path: the ledger file.
        resume: False accepts any recorded runs (``--no-resume``), but still takes the lock.

    Returns:
        A :data:`~harness.ownership.ClaimTaker` for :attr:`RunOptions.claim <harness.loop.RunOptions.claim>`:
        it locks the identity's byte of ``<ledger>.locks/runs.lock`` (:func:`harness.ownership.take_lock`) or
        returns None when a live run holds it; the claim records the lock file's path (``lock``) and the byte
        (``lock_byte``) in the start row's config.

    Raises (from the taker):
        LedgerError: the lock file cannot be made (e.g. the ledger's folder is read-only); ``LedgerSwapped``: it was
            deleted or replaced while this matrix held locks in it (:class:`harness.ownership.LockFile`).
    """
    locks = LockFile(ledger_path)  # the folder found once: each run's lock is then one open and one fcntl
    folder, policy = locks.folder, identity_free if resume else _accept_any

    def take(identity: str) -> Claim | None:
        try:
            lock = locks.take(identity)
        except OSError as exc:
            raise LedgerError(lock_refusal(folder, identity, exc)) from exc
        if lock is None:
            return None
        facts: dict[str, Any] = {"lock": f"{folder.name}/{lock.path.name}"}  # beside the ledger
        if lock.offset is not None:
            facts["lock_byte"] = lock.offset
        return Claim(policy, facts, lock.release)

    return take


def _accept_any(holders: Sequence[IdentityHolder]) -> bool:
    return True


class MatrixEvents:
    """What :func:`run_matrix` reports while it runs; subclass and override what you need (each default does nothing).

    Methods are called from one thread at a time.
    """

    def planned(self, result: MatrixResult) -> None:
        """Identities are resolved (``result.planned``, ``result.already_done``); no run has started yet."""

    def model_starting(self, model: str) -> None:
        """``model`` is about to be loaded (an embedded server starts) and sent its one warm-up request."""

    def run_finished(self, summary: RunSummary) -> None:
        """A run has ended and its end row is in the ledger."""

    def run_taken(self, plan: RunPlan, *, in_flight: bool) -> None:
        """``plan``'s identity was found taken when its run was to start (another process on the ledger is running it,
        ``in_flight``, or has finished it since the matrix was planned): it is settled without running here."""

    def stopping(self, in_flight: int) -> None:
        """The first Ctrl-C: no new run starts; the ``in_flight`` runs that began end as interrupted when their call returns."""

    def retrying(self, plan: RunPlan, attempt: Attempt, max_attempts: int) -> None:
        """A model call of ``plan``'s run failed (``attempt``, recorded in the ledger) and will be tried again."""


class QuitNow(KeyboardInterrupt):
    """Raise from a SIGINT handler for a second Ctrl-C, also one that arrived together with the first.

    Python runs a signal handler once for several signals that arrive while the main thread
    cannot run (a worker holding the GIL in C code), so a handler that counts signals as they
    are delivered (the CLI's, through :func:`signal.set_wakeup_fd`) raises this for the second:
    :func:`run_matrix` then quits at once, as on a second :exc:`KeyboardInterrupt`.
    """


class MatrixQuit(KeyboardInterrupt):
    """A second Ctrl-C, or a Ctrl-C while the matrix waited for its runs in flight after an error: the runs still
    waiting on a model call were recorded as ``interrupted``.

    Worker threads may still be blocked in a model call, so the caller should exit the process
    at once (the CLI calls ``os._exit(130)``); every committed turn is safe in the ledger.

    Attributes:
        abandoned: runs in flight recorded as interrupted without their pending reply.
        error: the error that had stopped the matrix (also the ``__cause__``), to report as it would have been; None
            after a first Ctrl-C.
    """

    def __init__(self, abandoned: int, error: BaseException | None = None) -> None:
        super().__init__(abandoned)
        self.abandoned, self.error = abandoned, error


@dataclass
class MatrixResult:
    """What a matrix came to.

    Attributes:
        planned: every planned run with its identity.
        summaries: one per run executed now, in completion order.
        skipped: ``(model, reason, runs)`` for models whose server could not be used at all;
            those runs were not started (nothing was recorded; re-run once fixed).
        already_done: planned runs skipped because the ledger already had them.
        running_elsewhere: planned runs skipped because another live run held their identity
            (another process on the ledger); :func:`plan_matrix` counts those it sees running.
        warnings: sentences for the user (e.g. Ollama parallelism).
        ledger_not_made: every run was skipped (its server down) and no ledger existed, so :func:`run_matrix` made none.
    """

    planned: list[PlannedRun] = field(default_factory=list)
    summaries: list[RunSummary] = field(default_factory=list)
    skipped: list[tuple[str, str, int]] = field(default_factory=list)
    already_done: int = 0
    running_elsewhere: int = 0
    warnings: list[str] = field(default_factory=list)
    ledger_not_made: bool = False

    def note_taken(self, in_flight: bool) -> None:
        """Count a planned run another process on the ledger took: running it now (``in_flight``) or done since."""
        self.running_elsewhere += in_flight
        self.already_done += not in_flight


def plan_matrix(
    plans: Sequence[RunPlan],
    ledger: Ledger | None,
    *,
    jobs: int = 1,
    embedded_slots: int = 1,
    backend_factory: BackendFactory = open_backend,
    resume: bool = True,
) -> MatrixResult:
    """Resolve identities, what is already done and what another process runs now, without running anything (``--dry-run``).

    What :func:`run_matrix` would run now (with resume) is every planned run neither ``done`` nor
    ``running``; the runs of ``skipped`` models are not run.

    Args:
        plans: from :func:`expand_matrix`.
        ledger: the ledger to compare against, or None when there is none yet (nothing done).
        jobs: the real run's ``--jobs`` (the warnings about requests queueing at a server are the real run's).
        embedded_slots: the real run's ``--embedded-slots``: backends are opened as it would open them (an embedded
            model's memory check counts that many slots of context, and the slot count is part of the identities).
        backend_factory: opens a backend from a spec.
        resume: False for ``--no-resume``: a done run another process runs again now counts as running.
    """
    result = MatrixResult()
    concurrency = Concurrency(jobs, embedded_slots)
    endpoints = open_endpoints(plans, ledger, concurrency, backend_factory=backend_factory, result=result)
    for endpoint in endpoints.values():
        endpoint.backend.close()
    if ledger is not None:
        mark_running(result.planned, ledger.path, resume=resume)
    check_memory_together({m: e for m, e in endpoints.items() if any(p.to_do(resume=resume) for p in e.plans)})  # as run_matrix
    result.already_done = sum(p.done for p in result.planned)
    result.running_elsewhere = sum(p.running for p in result.planned)
    return result


def run_matrix(  # long: planning, then the ledger (opened only with runs to do), then the executor, in one try
    plans: Sequence[RunPlan],
    ledger: Ledger | Callable[[], Ledger],
    options: RunOptions = RunOptions(),
    *,
    resume: bool = True,
    events: MatrixEvents | None = None,
    backend_factory: BackendFactory = open_backend,
) -> MatrixResult:
    """Run every plan not already in the ledger, ``options.jobs`` at once per model endpoint (or replica: :mod:`harness.replicas`).

    Each model gets one backend (an embedded server with ``options.embedded_slots`` slots); runs of different models
    proceed side by side, each endpoint with its own limit. With ``resume``, every run whose identity the ledger
    already holds is skipped (:func:`identity_free`; ``infra_error``/``interrupted`` runs are redone) and each run
    claims its identity as it starts (:func:`claim_identity`: its lock, held until its end row, then
    :func:`identity_free` in the start transaction), so a matrix killed halfway completes exactly the planned set and
    two matrices on one ledger never run an identity twice. Without ``resume`` every plan runs, but a run still takes
    its lock, and one whose identity a live run holds now is skipped.

    Args:
        plans: from :func:`expand_matrix`.
        ledger: an open, writable ledger (thread-safe), or a function opening one once the models fit in memory (never
            called when every run is skipped: their servers are down, so no empty ledger is made).
        options: how runs are executed (sandbox folder, concurrency, retries, cache, cassettes);
            its ``stop`` event, when set, stops the matrix (runs in flight end as ``interrupted`` before their next
            call); an error sets it too (a :class:`~harness.run_options.StopEvent`, the default, then says so).
        resume: skip and claim as above; False runs every plan.
        events: receives progress (see :class:`MatrixEvents`).
        backend_factory: opens a backend from a spec (tests pass their own).

    Returns:
        The planned set, the summaries of runs executed now, and what was skipped.

    Raises:
        LedgerError: the ledger cannot be written.
        UsageError: as :func:`~harness.executors.check_executor` (replicas with another executor; Ray missing).
        KeyboardInterrupt: after runs in flight were recorded as ``interrupted`` (first Ctrl-C).
        MatrixQuit: a second Ctrl-C (or a :class:`QuitNow`), or one while an error waits for the runs in flight; exit at once.
    """
    result, events, stop = MatrixResult(), events or MatrixEvents(), options.stop or StopEvent()
    opened = ledger if isinstance(ledger, Ledger) else None  # none yet: nothing in it is done
    check_executor(plans, options.executor)
    concurrency = Concurrency(options.jobs, options.embedded_slots)
    endpoints = open_endpoints(plans, opened, concurrency, backend_factory=backend_factory, result=result)
    todos = {model: [p for p in e.plans if p.to_do(resume=resume)] for model, e in endpoints.items()}
    result.already_done = sum(len(e.plans) - len(todos[m]) for m, e in endpoints.items())
    matrix: _MatrixRun | ProcessMatrixRun | None = None
    try:
        check_memory_together({model: e for model, e in endpoints.items() if todos[model]})  # before anything starts
        if opened is None and result.skipped and not any(todos.values()):  # every run skipped (a server down): no ledger
            result.ledger_not_made = True
            events.planned(result)
            return result
        db = ledger if isinstance(ledger, Ledger) else ledger()  # created only now: a refused start creates none
        claim = claim_identity(db.path, resume=resume)
        mark_running(result.planned, db.path, resume=resume)  # for the opening line, as --dry-run counts; still tried
        matrix = _executor(db, replace(options, stop=stop, claim=claim), result, events, backend_factory)
        events.planned(result)
        _start_models(endpoints, todos, db, events)
        matrix.run(endpoints, todos)
    finally:
        if matrix is None or not matrix.quitting:  # after a second Ctrl-C the caller exits at once (calls may be in flight)
            for endpoint in endpoints.values():
                endpoint.backend.close()
    return result


def _start_models(endpoints: dict[str, Endpoint], todos: dict[str, list[PlannedRun]], db: Ledger, events: MatrixEvents) -> None:
    """Send each model with runs to do its warm-up request and record its provenance (:func:`start_model`)."""
    for model, endpoint in endpoints.items():
        if todos[model]:  # one warm-up request and the provenance, recorded with each run (harness.startup)
            events.model_starting(model)
            endpoint.start_config = start_model(endpoint.backend, db)


def run_config(options: RunOptions, endpoint: Endpoint) -> dict[str, Any]:
    """What each run of ``endpoint`` records in its start row's config beside its plan: ``jobs``, the endpoint's
    ``endpoint_parallel`` and what its model's start recorded (:func:`start_model`)."""
    return {"jobs": options.jobs, "endpoint_parallel": endpoint.parallel, **endpoint.start_config}


def _executor(db: Ledger, options: RunOptions, result: MatrixResult, events: MatrixEvents,
              backend_factory: BackendFactory) -> _MatrixRun | ProcessMatrixRun:  # fmt: skip
    """The executor ``options.executor`` names; worker processes are imported only when chosen."""
    if options.executor == "processes":
        from harness.executors.processes import ProcessMatrixRun

        return ProcessMatrixRun(db, options, result, events, backend_factory)
    if options.executor == "ray":
        from harness.executors.ray_cluster import RayMatrixRun  # Ray importable: check_executor asked

        return RayMatrixRun(db, options, result, events, backend_factory)
    if options.executor != "threads":
        raise UsageError(f"unknown executor {options.executor!r}; use threads, processes or ray.")
    return _MatrixRun(db, options, result, events)


class _MatrixRun:
    """The thread pools of one :func:`run_matrix` call and the runs they have in flight."""

    def __init__(self, ledger: Ledger, options: RunOptions, result: MatrixResult, events: MatrixEvents) -> None:
        assert options.stop is not None
        self.ledger, self.options, self.result, self.events, self.stop = ledger, options, result, events, options.stop
        self.lock = threading.Lock()
        self.running: dict[str, RunPlan] = {}  # run id -> its plan, for the runs in flight
        self.pools: list[ThreadPoolExecutor] = []
        self.futures: list[Future[None]] = []
        self.quitting = False

    def run(self, endpoints: dict[str, Endpoint], todos: dict[str, list[PlannedRun]]) -> None:
        try:
            for model, endpoint in endpoints.items():
                if not todos[model]:
                    continue
                pool = ThreadPoolExecutor(max_workers=self.options.jobs * endpoint.replicas, thread_name_prefix="run")
                self.pools.append(pool)
                options = replace(self.options, extra_config=run_config(self.options, endpoint), on_retry=self.retrying)
                self.futures.extend(pool.submit(self.execute, p, endpoint, options) for p in todos[model])
            finished: queue.SimpleQueue[Future[None] | None] = queue.SimpleQueue()
            watch = _EndWatch(len(self.futures), finished.put)
            for future in self.futures:  # a run wakes this thread only when it failed or was the last
                future.add_done_callback(watch.ended)
            while (failed := self._next_end(finished)) is not None:
                failed.result()  # re-raise LedgerError or a harness bug from a worker
        except BaseException as stopped:  # Ctrl-C, or an error: its runs in flight end before their next call
            self._stop(stopped)
            raise
        finally:  # after a quit, do not wait for the model calls in flight (none is left otherwise)
            self._shut_down(wait=not self.quitting)

    def _stop(self, cause: BaseException) -> None:
        """Stop the matrix for ``cause`` (a first Ctrl-C, or an error: the runs in flight end as ``interrupted`` saying
        which) and wait for the runs in flight. A Ctrl-C meanwhile (a second one, or one that came with the first:
        :class:`QuitNow`) ends them at once and raises :class:`MatrixQuit`, carrying the error."""
        error = None if isinstance(cause, KeyboardInterrupt) else cause
        try:  # from here on a Ctrl-C quits at once, also one that comes while the user is being told
            stop_for(self.stop, STOPPED_BY_USER if error is None else STOPPED_BY_ERROR)
            if isinstance(cause, QuitNow):
                raise cause  # two Ctrl-Cs came together
            try:
                if error is None:  # the runs past their stop check (a pool thread that has not reached it skips its run)
                    with self.lock:
                        self.events.stopping(len(self.running))
            except Exception:  # telling the user failed: that error is raised once the runs have ended
                self._shut_down(wait=True)
                raise
            self._shut_down(wait=True)
        except KeyboardInterrupt:
            with self.lock:
                abandoned = sorted(self.running)
            recorded = _end_abandoned(self.ledger, abandoned, quit_reason(self.stop, error=error is not None))
            self.quitting = True
            raise MatrixQuit(recorded, error) from error

    def _shut_down(self, *, wait: bool) -> None:
        for pool in self.pools:
            pool.shutdown(wait=wait, cancel_futures=True)

    @staticmethod
    def _next_end(finished: queue.SimpleQueue[Future[None] | None]) -> Future[None] | None:
        """The next failed run's future, or None once every run has ended; waits in slices of 0.2 s (where Ctrl-C lands)."""
        while True:
            try:
                return finished.get(timeout=0.2)
            except queue.Empty:
                continue

    def execute(self, planned: PlannedRun, endpoint: Endpoint, options: RunOptions) -> None:
        if self.stop.is_set():
            return
        handle = endpoint.backend.for_run()
        run_id = uuid.uuid4().hex
        with self.lock:
            self.running[run_id] = planned.plan
        try:
            summary = run_once(planned.plan, handle, self.ledger, options, run_id=run_id)
        except IdentityTaken as taken:  # another matrix on this ledger finished it or is running it now
            with self.lock:
                self.result.note_taken(taken.in_flight)
                self.events.run_taken(planned.plan, in_flight=taken.in_flight)
            return
        finally:
            with self.lock:
                self.running.pop(run_id, None)
        with self.lock:
            self.result.summaries.append(summary)
            self.events.run_finished(summary)

    def retrying(self, attempt: Attempt) -> None:
        with self.lock:  # events are called from one thread at a time
            self.events.retrying(self.running[attempt.run_id], attempt, self.options.retry.max_attempts)


class _EndWatch:
    """Counts the runs' ends (a future's done callback, in the worker's thread) and hands on only what the waiting
    thread must act on: a run that failed or was cancelled (its future) and, after the last run, None. Waking the
    waiting thread at every run's end would make it contend for the interpreter lock with the runs still going."""

    def __init__(self, runs: int, put: Callable[[Future[None] | None], None]) -> None:
        self._left, self._put, self._lock = runs, put, threading.Lock()
        if runs == 0:
            put(None)

    def ended(self, future: Future[None]) -> None:
        """A run's future is done (successfully, failed or cancelled)."""
        if future.cancelled() or future.exception() is not None:
            self._put(future)
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._put(None)


def _end_abandoned(ledger: Ledger, run_ids: Sequence[str], error: str = QUIT_BY_USER) -> int:
    """Append an ``interrupted`` end row (saying ``error``) for runs whose worker is still waiting on a model call; how
    many were appended (a run not started yet, or already ended, gets none)."""
    recorded = 0
    for run_id in run_ids:
        try:
            recorded += ledger.end_from_turns(run_id, "interrupted", error) is not None  # None: nothing was started
        except LedgerError:
            continue  # its worker wrote the end row meanwhile
    return recorded


def end_from_totals(ledger: Ledger, run_id: str, outcome: Outcome, error: str) -> RunEnd:
    """Append the end row of a started run that cannot end itself (its worker is gone or stuck), with the turn totals
    the ledger holds for it, no checks and no answer (:meth:`~harness.ledger.Ledger.end_from_turns`); the row appended.

    Raises:
        LedgerError: the ledger cannot be written, the run already ended or was never started.
    """
    end = ledger.end_from_turns(run_id, outcome, error)
    if end is None:
        raise LedgerError(f"run {run_id} was never started: it has no end row to append.")
    return end
