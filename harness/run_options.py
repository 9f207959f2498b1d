"""How runs are executed, as opposed to what they are: :class:`RunOptions`, shared by every run of a matrix
(re-exported by :mod:`harness.loop`), and :class:`StopEvent`, which stops them saying why."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.ledger import Attempt
from harness.ownership import ClaimTaker
from harness.retry import DEFAULT_RETRY, RetryPolicy

__all__ = [
    "QUIT_BY_USER",
    "STOPPED_BY_ERROR",
    "STOPPED_BY_READER",
    "STOPPED_BY_USER",
    "RunOptions",
    "StopEvent",
    "quit_reason",
    "stop_for",
    "stop_reason",
]

STOPPED_BY_USER = "interrupted by the user"
"""The error of an ``interrupted`` run's end row when the user stopped the matrix (Ctrl-C, or a caller's stop event)."""
QUIT_BY_USER = f"{STOPPED_BY_USER} (second Ctrl-C)"
"""The same when the user quit at once: the run was ended without the reply it was waiting for."""
STOPPED_BY_ERROR = "the matrix stopped before this run ended (an error, not the model)"
"""The same when an error stopped the matrix (its output cannot be written, its ledger refused a row, a bug)."""
STOPPED_BY_READER = "the matrix stopped before this run ended: its output's reader stopped reading (not the model)"
"""The same when the program reading the command's output left (``harness run | head``)."""


class StopEvent(threading.Event):
    """A :attr:`RunOptions.stop` event that says why it was set: the error its runs' ``interrupted`` end rows record.

    Attributes:
        reason: :data:`STOPPED_BY_USER` unless :meth:`set_for` set the event first with another reason.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reason = STOPPED_BY_USER
        self._reason_lock = threading.Lock()

    def set_for(self, reason: str) -> None:
        """Set the event saying ``reason``; an event already set keeps its reason (the first cause stopped the runs)."""
        with self._reason_lock:
            if not self.is_set():
                self.reason = reason
            self.set()


def stop_for(stop: threading.Event, reason: str) -> None:
    """Set ``stop`` saying ``reason`` (:meth:`StopEvent.set_for`); any other event is only set."""
    if isinstance(stop, StopEvent):
        stop.set_for(reason)
    else:
        stop.set()


def stop_reason(stop: threading.Event) -> str:
    """Why ``stop`` was set: a :class:`StopEvent`'s reason; any other event is the user's (:data:`STOPPED_BY_USER`)."""
    return stop.reason if isinstance(stop, StopEvent) else STOPPED_BY_USER


def quit_reason(stop: threading.Event, *, error: bool = False) -> str:
    """The error of the ``interrupted`` end row of a run a quit (a second Ctrl-C) ended without its reply: the reason the
    matrix was stopping for (a :class:`StopEvent`'s, e.g. its output's reader gone, or an error: the quit only cut the
    wait short), :data:`STOPPED_BY_ERROR` for any other event set after an error (``error``), else :data:`QUIT_BY_USER`."""
    reason = stop.reason if isinstance(stop, StopEvent) else STOPPED_BY_ERROR if error else STOPPED_BY_USER
    return QUIT_BY_USER if reason == STOPPED_BY_USER else reason


@dataclass(frozen=True)
class RunOptions:
    """How runs are executed, as opposed to what they are (:class:`harness.loop.RunPlan`); shared by every run of a matrix.

    Attributes:
        runs_dir: parent folder of run sandboxes (``<runs_dir>/<run_id>/`` is created and kept).
        jobs: concurrent runs per model endpoint (per replica: :mod:`harness.replicas`) in a matrix, >= 1 (in ``config``).
        embedded_slots: parallel slots of each embedded model's server, >= 1 (``--embedded-slots``); with fewer slots
            than ``jobs`` requests queue at the server. More than 1 enters the run identity.
        retry: how infrastructure errors are retried; every failed attempt is recorded.
        use_cache: reuse the reply recorded for the same run identity and request messages (repeats stay apart).
        claim: when set, called with the run's identity before its start row: None (a live run owns it) or a
            :class:`~harness.ownership.Claim` whose policy must accept the runs already recorded under it in the start
            row's transaction, released when the run ends (:func:`harness.runner.claim_identity`); None: no claim.
        stop: when set, the run ends as ``interrupted`` before its next model call, its end row saying why
            (:func:`stop_reason`: a :class:`StopEvent`'s reason, else :data:`STOPPED_BY_USER`).
        record_dir: when set, every reply is also written to ``<record_dir>/<run_id>.jsonl``,
            a replay cassette.
        extra_config: extra facts stored in the run's ``config`` column.
        on_retry: called with each failed attempt that will be retried, once it is recorded (the runner's progress).
        executor: where a matrix's runs execute (:func:`harness.runner.run_matrix`): ``threads`` in this process,
            ``processes``, worker processes (:mod:`harness.executors.processes`), or ``ray``, Ray actors
            (:mod:`harness.executors.ray_cluster`); a single run ignores it.
        workers: worker processes for ``processes`` (None: the CPU count); actors per model endpoint for ``ray``.
        ray_address: the Ray cluster for ``ray`` (None: a local one, started for the matrix).
        ray_resources: model spec -> one actor's Ray resources (``{"GPU": 1}``) for ``ray``.
    """

    runs_dir: Path = Path("results") / "runs"
    jobs: int = 1
    embedded_slots: int = 1
    retry: RetryPolicy = DEFAULT_RETRY
    use_cache: bool = False
    claim: ClaimTaker | None = None
    stop: threading.Event | None = None
    record_dir: Path | None = None
    extra_config: Mapping[str, Any] = field(default_factory=dict)
    on_retry: Callable[[Attempt], None] | None = None
    executor: str = "threads"
    workers: int | None = None
    ray_address: str | None = None
    ray_resources: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
