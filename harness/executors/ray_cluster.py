"""The ``ray`` executor (``harness run --executor ray [--ray-address ADDRESS] [--ray-resources SPEC=NAME:AMOUNT]``).

Runs execute in Ray actors, ``--workers`` per model endpoint (default 2), each a
:func:`~harness.executors.worker.worker_main` as in the ``processes`` executor, scheduled with that model's resources
(``--ray-resources``; default half a CPU, since most runs only wait on a server, lowered so that every actor
fits the cluster's CPUs at once). The driver (this process) stays the
only writer of the ledger: each actor connects back to it over TCP (:mod:`multiprocessing.connection`, with a random
key of this run) and speaks the same channel (:mod:`harness.executors.channel`), so claims, the group commit, resume,
``--cache``, Ctrl-C and progress are those of :class:`~harness.executors.processes.ProcessMatrixRun`. An actor on
another node than the driver opens its own backends (an embedded model is loaded on its node; on the driver's node
it uses the driver's server) and ships each run's
sandbox back at the run's end (bounded by the scenario's write limit), so ``results/runs/<run_id>/`` is complete on the
driver. An actor whose process dies ends the channel: its started runs end as ``infra_error``, a new actor takes its
place. Ray is imported only by this module, which only ``--executor ray`` imports.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import secrets
import socket
import struct
import time
from collections.abc import Mapping
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any

import ray

from harness.endpoints import BackendFactory, Endpoint, PlannedRun
from harness.executors.processes import ProcessMatrixRun, Worker, WorkerFailed
from harness.executors.resources import DEFAULT_ACTORS, DEFAULT_RESOURCES
from harness.executors.worker import BackendRecipe, worker_main
from harness.ledger import Ledger
from harness.loop import RunOptions
from harness.runner import MatrixEvents, MatrixResult

__all__ = ["DEFAULT_ACTORS", "RayMatrixRun"]

_CONNECT_TIMEOUT_S = 300.0  # an actor the cluster cannot place (resources it lacks) is an error, not a hang
_HANDSHAKE_TIMEOUT_S = 10  # a connection silent this long at a read of the key exchange is a stranger's, dropped
_ENDED_CHECK_S = 1.0  # while waiting for connections, how often to look for launched actors that already ended


@ray.remote
class _Actor:
    """One worker of the driver's matrix, living in a Ray worker process."""

    def serve(self, address: tuple[str, int], key: bytes, recipes: dict[str, BackendRecipe], max_runs: int,
              driver_node: str, tag: int) -> None:  # fmt: skip
        conn = Client(address, authkey=key)
        conn.send(tag)  # which of the driver's launches this is: the actors connect in any order
        ship = ray.get_runtime_context().get_node_id() != driver_node
        worker_main(conn, recipes, max_runs, ship_sandboxes=ship)


class _ActorProcess:
    """An actor, seen as the driver sees a worker process (its death shows as the end of its channel)."""

    sentinel = None
    exitcode = None

    def __init__(self, actor: Any, done: Any) -> None:
        self.actor, self.done = actor, done

    def kill(self) -> None:
        ray.kill(self.actor, no_restart=True)

    def join(self, timeout: float | None = None) -> None:
        ray.wait([self.done], timeout=timeout)

    def is_alive(self) -> bool:
        ready, _ = ray.wait([self.done], timeout=0)
        return not ready


@dataclass(frozen=True)
class _Launched:
    """An actor started and not yet connected: the tag it sends first, its model, its process."""

    tag: int
    model: str
    process: _ActorProcess


class RayMatrixRun(ProcessMatrixRun):
    """:class:`ProcessMatrixRun` with Ray actors for workers; see the module docstring.

    Args:
        ledger, options, result, events, backend_factory: as for :class:`ProcessMatrixRun` (``options.workers``:
            actors per model endpoint; ``options.ray_address``: the cluster, None for a local one started here;
            ``options.ray_resources``: model spec -> an actor's resources).
    """

    def __init__(self, ledger: Ledger, options: RunOptions, result: MatrixResult, events: MatrixEvents,
                 backend_factory: BackendFactory) -> None:  # fmt: skip
        super().__init__(ledger, options, result, events, backend_factory)
        self.started_ray = False
        self.default_resources: dict[str, float] = dict(DEFAULT_RESOURCES)
        self.tags = itertools.count(1)

    def run(self, endpoints: dict[str, Endpoint], todos: dict[str, list[PlannedRun]]) -> None:
        """Connect to (or start) the cluster, run every todo in actors, then let go of the cluster."""
        if not any(todos.values()):
            return
        if not ray.is_initialized():
            # Ray's own start-up lines (INFO, a token-authentication WARNING) would mix with the progress; errors still show
            ray.init(address=self.options.ray_address, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
            self.started_ray = True
        host = "127.0.0.1" if self.options.ray_address is None else ray.util.get_node_ip_address()
        self.server = socket.create_server((host, 0))
        self.server.settimeout(_CONNECT_TIMEOUT_S)
        self.address, self.key = self.server.getsockname()[:2], secrets.token_bytes(32)
        self.node = ray.get_runtime_context().get_node_id()
        try:
            super().run(endpoints, todos)
        finally:
            self.server.close()
            if self.started_ray:
                ray.shutdown()

    def _start_workers(self, runs: int) -> list[Worker]:
        """Launch every actor at once, then take their connections as they come: their start-ups overlap."""
        count = self.options.workers or DEFAULT_ACTORS
        self.default_resources = _default_resources(self.options.ray_resources, list(self.queues), count)
        return self._connect([self._launch(model) for model in self.queues for _ in range(count)])

    def _replace(self, dead: Worker) -> Worker:
        assert dead.models is not None
        return self._connect([self._launch(next(iter(dead.models)))])[0]

    def _launch(self, model: str) -> _Launched:
        """Start one actor for ``model``; it connects back later (:meth:`_connect`)."""
        wanted = dict(self.options.ray_resources.get(model) or self.default_resources)
        cpus, gpus = wanted.pop("CPU", 0.0), wanted.pop("GPU", 0.0)
        actor = _Actor.options(num_cpus=cpus, num_gpus=gpus, resources=wanted).remote()  # type: ignore[attr-defined]
        recipe = self.recipes[model]  # made once per model by ProcessMatrixRun.run
        per_actor = -(-self.options.jobs // (self.options.workers or DEFAULT_ACTORS))
        tag = next(self.tags)
        done = actor.serve.remote(self.address, self.key, {model: recipe}, per_actor, self.node, tag)
        return _Launched(tag, model, _ActorProcess(actor, done))

    def _connect(self, launched: list[_Launched]) -> list[Worker]:
        """The workers of ``launched`` (in that order), each paired with the connection that names its launch."""
        waiting = {launch.tag: launch for launch in launched}
        workers: dict[int, Worker] = {}
        while waiting:
            conn = self._accept(list(waiting.values()))
            try:
                tag = conn.recv() if conn.poll(_HANDSHAKE_TIMEOUT_S) else None
            except (EOFError, OSError):  # it died right after connecting: its launch waits for another connection
                tag = None
            launch = waiting.pop(tag, None) if isinstance(tag, int) else None
            if launch is None:  # holds the key but names no launch of ours now: never used
                conn.close()
                continue
            workers[launch.tag] = Worker(launch.process, conn, frozenset({launch.model}))
        return [workers[launch.tag] for launch in launched]

    def _accept(self, waiting: list[_Launched]) -> Connection:
        """The next connection that proves it holds this run's key; a stranger's is closed and the wait goes on.

        Raises:
            WorkerFailed: an actor of ``waiting`` ended before it connected (or sent its tag), or none connected
                within :data:`_CONNECT_TIMEOUT_S`.
        """
        deadline = time.monotonic() + _CONNECT_TIMEOUT_S
        while (left := deadline - time.monotonic()) > 0:
            self.server.settimeout(min(left, _ENDED_CHECK_S))
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                _raise_if_ended(waiting)
                continue
            conn = _handshake(sock, self.key)
            if conn is not None:
                return conn
        raise WorkerFailed(
            f"no Ray actor connected within {_CONNECT_TIMEOUT_S:.0f} s; check that the cluster has the resources "
            "--ray-resources asks for and that its nodes can reach this machine."
        )


def _raise_if_ended(waiting: list[_Launched]) -> None:
    """Raise WorkerFailed when an actor of ``waiting`` has ended (it will never connect); its error in the sentence."""
    for launch in waiting:
        if launch.process.is_alive():
            continue
        try:
            ray.get(launch.process.done, timeout=0)
            why = "it returned"
        except Exception as exc:  # noqa: BLE001 - Ray's error for the actor's end, whatever its kind, is the reason
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise WorkerFailed(f"a Ray actor for {launch.model} ended before it connected to the driver ({why[:300]}); "
                           "check the cluster's logs and that its nodes can reach this machine.")  # fmt: skip


def _default_resources(asked: Mapping[str, Mapping[str, float]], models: list[str], count: int) -> dict[str, float]:
    """An actor's resources for the models ``asked`` (``--ray-resources``) names none for: :data:`DEFAULT_RESOURCES`,
    its CPU share lowered (to 4 decimals) so that ``count`` actors of every such model fit the cluster's CPUs at once
    beside the actors of the models that ask for CPUs themselves.

    The driver waits for every actor it launched to connect, so an actor the cluster cannot place would hold the
    whole matrix until the connect timeout (seen: 16 models x 2 actors x 0.5 CPU on a 2-CPU cluster).
    """
    defaults = [model for model in models if model not in asked]
    cpus_asked = sum(asked[model].get("CPU", 0.0) for model in models if model in asked) * count
    free = ray.cluster_resources().get("CPU", 0.0) - cpus_asked
    share = DEFAULT_RESOURCES["CPU"]
    if defaults and free > 0:
        share = min(share, math.floor(free / (count * len(defaults)) * 10_000) / 10_000)
    return {**DEFAULT_RESOURCES, "CPU": share}


def _handshake(sock: socket.socket, key: bytes) -> Connection | None:
    """Authenticate both ways on an accepted socket; None (the socket closed) for a peer without the key, one that
    sends junk or one silent for longer than :data:`_HANDSHAKE_TIMEOUT_S` at a read."""
    sock.settimeout(None)
    wait = struct.pack("ll", int(_HANDSHAKE_TIMEOUT_S), 0)  # a struct timeval; a read past it fails with EAGAIN
    for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
        sock.setsockopt(socket.SOL_SOCKET, option, wait)
    conn = Connection(os.dup(sock.fileno()))
    try:
        deliver_challenge(conn, key)
        answer_challenge(conn, key)
    except (AuthenticationError, OSError, EOFError):
        conn.close()
        return None
    finally:
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", 0, 0))
        sock.close()  # the connection holds its own descriptor of the socket
    return conn
