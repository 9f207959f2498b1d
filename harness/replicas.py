"""Replicas of one model: a spec naming several servers of the same weights, and the runs spread over them.

``--model "openai:qwen2.5-7b@http://gpu1:8000/v1,http://gpu2:8000/v1"`` (and the same for ``ollama:``) names two
replicas (:func:`harness.backends.replica_specs`). :func:`open_replicas` opens one backend per replica and asks each
for its identity before anything runs:

* a replica that does not answer is left out of the matrix, with a warning (its digest cannot be checked);
  when none answers, the model is skipped as a single server would be;
* replicas that report a model digest (:attr:`~harness.backends.base.BackendIdentity.identity_digest`: Ollama's
  manifest digest from ``/api/tags``) must report the same one, else the matrix is refused with one sentence naming
  two replicas that differ;
* replicas that report none (OpenAI-compatible servers: the API has no digest) are checked by model name only (each
  is sent the same name), and named once in a warning as unverified.

:class:`ReplicaSet` is then the model's backend. Its :meth:`~ReplicaSet.for_run` handle takes a replica when its run
starts (:meth:`~harness.backends.base.Backend.start_run`) and gives it back when the run ends, so all turns of a run
go to one replica; :class:`Rotation` chooses it: the replica in rotation with the fewest runs in flight (then the
fewest runs so far). The runner allows ``jobs x replicas`` runs of the model at once, and a replica takes at most
``--jobs`` new runs at once: while one is out of rotation, the runs beyond the others' places wait for a place.

A replica that fails with an infrastructure error (:data:`REPLICA_FAILURES`: connection refused or dropped, a
timeout; not an HTTP error status, which a live server sends) is out of rotation for :data:`DEFAULT_COOLDOWN_S`
(30 s), doubled each time it fails again after coming back (60, 120, ... up to :data:`MAX_COOLDOWN_S`, 8 min) and
reset by a reply. Failures during one outage (runs in flight meeting the same dead server) count once. The run that
met the failure moves to the replica in rotation with the fewest runs in flight, even one already serving ``--jobs``
runs (its server queues the request; waiting there could deadlock two runs moving in opposite directions), and the
loop's retry (:mod:`harness.retry`) goes there; its failed attempt is recorded as usual, naming the failed server's
URL. With every replica out of rotation, a run goes to the one back soonest and, failing there, ends ``infra_error``
as with one server. A run records the replica it started on in its ``config`` (``replica``, with the matrix's
replicas, those that answered at planning, as ``replicas``) and as its ``base_url``; which replica served it is not
part of its identity (:attr:`harness.loop.RunPlan.named_model`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from harness.backends import parse_model_spec, replica_specs
from harness.backends.base import Backend, BackendIdentity, GenerateOptions, Reply
from harness.errors import BackendError, BackendTimeout, BackendUnavailable, UsageError

__all__ = ["DEFAULT_COOLDOWN_S", "MAX_COOLDOWN_S", "REPLICA_FAILURES", "ReplicaSet", "Rotation", "open_replicas"]

DEFAULT_COOLDOWN_S = 30.0
"""Seconds a replica stays out of rotation after its first failure."""
MAX_COOLDOWN_S = 480.0
"""The longest a replica stays out of rotation, seconds (the cooldown doubles on repeat failures up to this)."""
REPLICA_FAILURES: tuple[type[BackendError], ...] = (BackendUnavailable, BackendTimeout)
"""The errors that take a replica out of rotation: the server is not there (or stopped answering)."""


@dataclasses.dataclass
class _Place:
    """One replica's state in a :class:`Rotation` (times from its clock, seconds)."""

    in_flight: int = 0
    runs: int = 0
    back_at: float = 0.0
    cooldown_s: float = 0.0


class Rotation:
    """Which replica takes the next run, and which are out of rotation; thread-safe.

    Args:
        count: number of replicas (indexes ``0 .. count-1``), >= 1.
        limit: runs a replica takes at once (``--jobs``); :meth:`take` waits for a place. None: no limit.
        cooldown_s: seconds out of rotation after a first failure.
        max_cooldown_s: cap of the doubled cooldown, seconds.
        clock: monotonic seconds (``time.monotonic``; :meth:`take` waits in real time).
    """

    def __init__(self, count: int, *, limit: int | None = None, cooldown_s: float = DEFAULT_COOLDOWN_S,
                 max_cooldown_s: float = MAX_COOLDOWN_S, clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._places = [_Place() for _ in range(count)]
        self._limit, self._cooldown_s, self._max_cooldown_s, self._clock = limit, cooldown_s, max_cooldown_s, clock
        self._lock = threading.Condition()

    def in_rotation(self, index: int) -> bool:
        """Whether replica ``index`` takes runs now (it has not failed, or its cooldown has passed)."""
        with self._lock:
            return self._places[index].back_at <= self._clock()

    def in_flight(self) -> list[int]:
        """Runs each replica holds now, by index."""
        with self._lock:
            return [p.in_flight for p in self._places]

    def take(self) -> int:
        """A replica for a new run, counted in flight until :meth:`release`: the one in rotation with the fewest runs
        in flight, then the fewest runs taken, then the lowest index. When every replica in rotation holds ``limit``
        runs (one is out of rotation, so the runner's ``limit x count`` runs outnumber the places), waits until one
        ends or a replica comes back; with none in rotation, at once the one back soonest (its run will likely fail)."""
        with self._lock:
            while True:
                now = self._clock()
                index = self._pick(exclude=None, free=True)
                if index is None and not any(p.back_at <= now for p in self._places):
                    index = min(range(len(self._places)), key=lambda i: (self._places[i].back_at, self._places[i].in_flight, i))
                if index is not None:
                    self._places[index].in_flight += 1
                    self._places[index].runs += 1
                    return index
                back = [p.back_at - now for p in self._places if p.back_at > now]
                self._lock.wait(timeout=max(0.01, min(back)) if back else None)

    def move(self, index: int) -> int:
        """Where a run on replica ``index``, which just failed it, goes next: the replica in rotation with the fewest runs
        in flight (its count moves there), or ``index`` itself when no other is in rotation."""
        with self._lock:
            target = self._pick(exclude=index)
            if target is None:
                return index
            self._places[index].in_flight -= 1
            self._places[target].in_flight += 1
            self._lock.notify_all()
            return target

    def release(self, index: int) -> None:
        """A run on replica ``index`` has ended."""
        with self._lock:
            self._places[index].in_flight -= 1
            self._lock.notify_all()

    def failed(self, index: int) -> None:
        """Replica ``index`` failed: out of rotation for the cooldown (doubled when it failed before and has not answered
        since); a failure while it is already out belongs to the same outage and changes nothing."""
        with self._lock:
            place, now = self._places[index], self._clock()
            if place.back_at > now:
                return
            place.cooldown_s = min(self._max_cooldown_s, place.cooldown_s * 2) if place.cooldown_s else self._cooldown_s
            place.back_at = now + place.cooldown_s
            self._lock.notify_all()  # with none left in rotation, a waiting run takes the one back soonest

    def answered(self, index: int) -> None:
        """Replica ``index`` answered: its next failure starts from the first cooldown again (unless it is out now)."""
        with self._lock:
            place = self._places[index]
            if place.back_at <= self._clock():
                place.cooldown_s = 0.0

    def _pick(self, *, exclude: int | None, free: bool = False) -> int | None:
        """The replica in rotation (other than ``exclude``; with ``free``, holding fewer than ``limit`` runs) with the
        fewest runs in flight, then the fewest runs taken, then the lowest index; None when there is none."""
        now, limit = self._clock(), self._limit
        live = [i for i, p in enumerate(self._places) if p.back_at <= now and i != exclude
                and not (free and limit is not None and p.in_flight >= limit)]  # fmt: skip
        return min(live, key=lambda i: (self._places[i].in_flight, self._places[i].runs, i)) if live else None


class ReplicaSet(Backend):
    """One model served by several replicas; each run's :meth:`for_run` handle talks to one of them.

    Args:
        spec: the spec listing the replicas.
        replicas: an open backend per replica that answered at planning (closed by :meth:`close`).
        identities: what each of them reported, in the same order.
        rotation: chooses replicas; default a :class:`Rotation` over them without a limit.
    """

    def __init__(self, spec: str, replicas: Sequence[Backend], identities: Sequence[BackendIdentity], *,
                 rotation: Rotation | None = None) -> None:  # fmt: skip
        if not replicas or len(replicas) != len(identities):
            raise ValueError("a replica set needs one identity per replica, and at least one replica")
        self.spec, self.replicas, self.identities = spec, list(replicas), list(identities)
        self.rotation = rotation or Rotation(len(self.replicas))
        self.urls = [ident.base_url or "" for ident in self.identities]
        self._agreed = next((ident for ident in self.identities if ident.identity_digest), self.identities[0])

    def identity_of(self, index: int) -> BackendIdentity:
        """Replica ``index``'s identity with the digest the replicas agree on (one that reported none gets the others')."""
        return dataclasses.replace(
            self.identities[index], model_digest=self._agreed.model_digest, manifest_digest=self._agreed.manifest_digest
        )

    def identity(self) -> BackendIdentity:
        """The first replica's identity with the agreed digest: what planning resolves identities with."""
        return self.identity_of(0)

    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
        """One request on a replica taken for it alone (runs use :meth:`for_run`); raises as the replica's backend."""
        handle = self.for_run()
        handle.start_run()
        try:
            return handle.generate(messages, tools, options)
        finally:
            handle.end_run()

    def request_settings(self, options: GenerateOptions, *, tools: bool) -> dict[str, Any]:
        """As the first replica's (every replica is of one kind)."""
        return self.replicas[0].request_settings(options, tools=tools)

    def can_think(self) -> bool | None:
        """As the first replica in rotation that answers says; raises the last error when none does."""
        return self._first_answer(lambda backend: backend.can_think())

    def provenance(self) -> dict[str, Any]:
        """As the first replica in rotation that answers reports; raises the last error when none does."""
        return self._first_answer(lambda backend: backend.provenance())

    def warm_up(self) -> float | None:
        """Warm every replica in rotation up; one that fails is taken out of rotation (:meth:`Rotation.failed`).

        Returns:
            The slowest warm-up, ms (None when no replica has anything to warm).

        Raises:
            BackendError: every replica failed (the last one's error).
        """
        times: list[float] = []
        error: BackendError | None = None
        for index, backend in enumerate(self.replicas):
            if not self.rotation.in_rotation(index):
                continue
            try:
                took = backend.warm_up()
            except BackendError as exc:
                self.rotation.failed(index)
                error = exc
                continue
            if took is not None:
                times.append(took)
        if error is not None and all(not self.rotation.in_rotation(i) for i in range(len(self.replicas))):
            raise error
        return max(times) if times else None

    def for_run(self) -> Backend:
        """A handle for one run; it takes its replica in :meth:`~Backend.start_run` and gives it back in
        :meth:`~Backend.end_run`."""
        return _ReplicaRun(self)

    def close(self) -> None:
        """Close every replica's backend."""
        for backend in self.replicas:
            backend.close()

    def _first_answer(self, ask: Callable[[Backend], Any]) -> Any:
        order = sorted(range(len(self.replicas)), key=lambda i: not self.rotation.in_rotation(i))
        error: BackendError | None = None
        for index in order:
            try:
                return ask(self.replicas[index])
            except BackendError as exc:
                error = exc
        assert error is not None
        raise error


class _ReplicaRun(Backend):
    """One run's handle on a :class:`ReplicaSet`: every request goes to the replica it took, until that one fails."""

    def __init__(self, replicas: ReplicaSet) -> None:
        self._set, self.spec = replicas, replicas.spec
        self._index: int | None = None
        self._handle: Backend | None = None

    def start_run(self) -> None:
        if self._index is None:
            self._bind(self._set.rotation.take())

    def end_run(self) -> None:
        if self._index is not None and self._handle is not None:
            self._handle.end_run()
            self._set.rotation.release(self._index)
            self._index = self._handle = None

    def run_facts(self) -> dict[str, Any]:
        self.start_run()
        assert self._index is not None
        return {"replica": self._set.urls[self._index], "replicas": list(self._set.urls)}

    def identity(self) -> BackendIdentity:
        self.start_run()
        assert self._index is not None
        return self._set.identity_of(self._index)

    def request_settings(self, options: GenerateOptions, *, tools: bool) -> dict[str, Any]:
        return self._set.request_settings(options, tools=tools)

    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
        self.start_run()
        assert self._index is not None and self._handle is not None
        index, rotation = self._index, self._set.rotation
        try:
            reply = self._handle.generate(messages, tools, options)
        except REPLICA_FAILURES:
            rotation.failed(index)
            target = rotation.move(index)
            if target != index:  # the loop's retry of this request goes to the other replica
                self._handle.end_run()
                self._bind(target)
            raise
        rotation.answered(index)
        return reply

    def _bind(self, index: int) -> None:
        self._index, self._handle = index, self._set.replicas[index].for_run()
        self._handle.start_run()


def open_replicas(spec: str, open_one: Callable[[str], Backend], warnings: list[str], *, jobs: int | None = None) -> ReplicaSet:
    """Open every replica a spec lists and check that they serve one model (see the module docstring).

    Args:
        spec: a spec listing replicas (:func:`harness.backends.replica_specs`).
        open_one: opens the backend of one replica's single-URL spec.
        warnings: gets one sentence per replica left out, and one naming the replicas checked by model name only.
        jobs: runs each replica takes at once (``--jobs``; :class:`Rotation`'s ``limit``); None: no limit.

    Returns:
        The replicas that answered, as one backend.

    Raises:
        UsageError: two replicas report different model digests (every backend is closed).
        BackendError: no replica answered; the first replica's error (every backend is closed).
    """
    opened: list[tuple[Backend, BackendIdentity]] = []
    failures: list[tuple[str, BackendError]] = []
    try:
        for replica in replica_specs(spec):
            backend = open_one(replica)
            try:
                opened.append((backend, backend.identity()))
            except BackendError as exc:
                backend.close()
                failures.append((parse_model_spec(replica)[2] or replica, exc))
        _check_digests(spec, [ident for _, ident in opened])
    except BaseException:
        for backend, _ in opened:
            backend.close()
        raise
    if not opened:
        raise failures[0][1]
    for url, error in failures:
        others = f"the other {len(opened)}" if len(opened) > 1 else "the other one"
        warnings.append(f"{spec}: replica {url} is left out of this matrix and its runs go to {others}: {error}")
    unverified = [ident.base_url or "" for _, ident in opened if ident.identity_digest is None]
    if unverified:
        warnings.append(
            f"{spec}: {_replicas(unverified)} {'report' if len(unverified) > 1 else 'reports'} no model digest, so "
            "the replicas are checked by model name only (unverified); make sure they serve the same weights."
        )
    return ReplicaSet(spec, [b for b, _ in opened], [i for _, i in opened], rotation=Rotation(len(opened), limit=jobs))


def _check_digests(spec: str, identities: Sequence[BackendIdentity]) -> None:
    """Refuse replicas whose reported digests differ (those reporting none are not compared)."""
    known = [ident for ident in identities if ident.identity_digest]
    other = next((ident for ident in known if ident.identity_digest != known[0].identity_digest), None)
    if other is not None:
        first = known[0]
        raise UsageError(
            f"The replicas {first.base_url} and {other.base_url} of {spec} serve different models (digest "
            f"{_short(first.identity_digest)} against {_short(other.identity_digest)}); list only servers of the same weights."
        )


def _short(digest: str | None) -> str:
    text = digest or ""
    return text[:19] if text.startswith("sha256:") else text[:12]


def _replicas(urls: Sequence[str]) -> str:
    return f"replica {urls[0]}" if len(urls) == 1 else "replicas " + ", ".join(urls)
