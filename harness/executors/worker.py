"""A worker process of the ``processes`` executor: runs the driver's tasks, each in a thread, through the channel.

Started by :mod:`harness.executors.processes` with the spawn context (:func:`worker_main`). Each worker opens its own
backend per model from a :class:`BackendRecipe` (once, on its first run of that model); an embedded model is reached
at the driver's server (:class:`ServedModel`), never loaded a second time. It ignores SIGINT: Ctrl-C is the driver's
to handle, which tells the worker to stop (its runs end as ``interrupted`` before their next model call).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from harness.backends import EmbeddedBackend
from harness.backends.base import Backend, BackendIdentity, GenerateOptions, Reply
from harness.backends.openai_compat import OpenAICompatBackend, openai_request_settings
from harness.backends.server_facts import EMBEDDED_PER_TOKEN_S
from harness.endpoints import BackendFactory, Endpoint
from harness.errors import LedgerError
from harness.executors.channel import LedgerProxy, RunTask, WorkerLink
from harness.loop import IdentityTaken, run_once
from harness.run_options import STOPPED_BY_USER, StopEvent
from harness.scenarios import Scenario

__all__ = ["BackendRecipe", "ServedModel", "pack_sandbox", "recipe_for", "sandbox_bound", "unpack_sandbox", "worker_main"]


@dataclass(frozen=True)
class BackendRecipe:
    """How a worker opens its own backend for one model (picklable).

    Attributes:
        model: the model spec.
        factory: opens it as the driver did (``factory(model, **kwargs)``).
        kwargs: ``api_key_env``, ``num_ctx``, ``parallel``, as :func:`harness.endpoints.open_endpoints` passed them
            (:attr:`Endpoint.open_kwargs <harness.endpoints.Endpoint.open_kwargs>`).
        served: an embedded model's server the driver started: ``(OpenAI API root, the driver's backend identity,
            timeout_s)``, for workers on the driver's machine.
    """

    model: str
    factory: BackendFactory
    kwargs: dict[str, Any] = field(default_factory=dict)
    served: tuple[str, BackendIdentity, float | None] | None = None

    def open(self, *, remote: bool = False) -> Backend:
        """The worker's backend for this model: the driver's embedded server unless ``remote`` (another machine:
        it loads the model itself), else as the driver opened it."""
        if self.served is not None and not remote:
            return ServedModel(*self.served)
        backend = self.factory(self.model, **self.kwargs)
        if isinstance(backend, EmbeddedBackend):  # this machine's memory, not the driver's: a refusal now, not an infra_error
            backend.check_memory()
        return backend


def recipe_for(model: str, endpoint: Endpoint, factory: BackendFactory) -> BackendRecipe:
    """The recipe for ``endpoint``, whose backend the driver opened (and, for an embedded model, started)."""
    backend = endpoint.backend
    served = None
    if isinstance(backend, EmbeddedBackend) and backend.base_url is not None:
        served = (backend.base_url, backend.identity(), backend.timeout_s)
    return BackendRecipe(model, factory, dict(endpoint.open_kwargs), served)


class ServedModel(Backend):
    """An embedded model served by the driver's llama.cpp server, seen from a worker: its replies, its identity.

    Args:
        base_url: the server's OpenAI API root (``http://127.0.0.1:PORT/v1``).
        identity: the driver's :meth:`EmbeddedBackend.identity` (digest, slots), reported for every run.
        timeout_s: the request deadline the driver's backend had.
    """

    kind = "embedded"

    def __init__(self, base_url: str, identity: BackendIdentity, timeout_s: float | None) -> None:
        self._client = OpenAICompatBackend(identity.model, base_url, timeout_s=timeout_s, per_token_s=EMBEDDED_PER_TOKEN_S)
        self._identity = identity
        self.spec = f"embedded:{identity.model}"

    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
        """One chat request to the driver's server (:meth:`EmbeddedBackend.generate`)."""
        reply = self._client.generate(messages, tools, options)
        reply.identity = self._identity
        return reply

    def identity(self) -> BackendIdentity:
        """The driver's embedded backend's identity."""
        return self._identity

    def request_settings(self, options: GenerateOptions, *, tools: bool) -> dict[str, Any]:
        """As :meth:`EmbeddedBackend.request_settings`."""
        return openai_request_settings(options, tools=tools)

    def close(self) -> None:
        """Close the HTTP client (the server is the driver's)."""
        self._client.close()


class _Backends:
    """The worker's backends, each opened once on first use (from any run thread)."""

    def __init__(self, recipes: dict[str, BackendRecipe], *, remote: bool) -> None:
        self.recipes, self.opened, self.lock, self.remote = recipes, dict[str, Backend](), threading.Lock(), remote

    def get(self, model: str) -> Backend:
        with self.lock:
            if model not in self.opened:
                self.opened[model] = self.recipes[model].open(remote=self.remote)
            return self.opened[model]

    def close(self) -> None:
        with self.lock:
            for backend in self.opened.values():
                backend.close()


def worker_main(conn: Connection, recipes: dict[str, BackendRecipe], max_runs: int, *, ship_sandboxes: bool = False,
                cpu: int | None = None) -> None:  # fmt: skip
    """The worker process: serve the driver's messages until it says ``quit`` or goes away.

    When the driver goes away (killed), the process exits at once (``os._exit``): its runs in flight cannot be
    recorded any more, and waiting for their model calls kept it alive (holding the server's slots, then running the
    replies' tool calls in the sandboxes) for as long as the request timeout.

    Args:
        conn: the worker's end of its duplex pipe to the driver (:mod:`harness.executors.channel`).
        recipes: model spec -> how to open its backend.
        max_runs: the most runs the driver may give it at once; run threads are reused (an HTTP backend keeps a
            client and its connection per thread, :class:`~harness.backends.clients.ThreadClients`).
        ship_sandboxes: the worker is on another machine than the driver: it cannot see this machine's files (each
            run's sandbox is sent to it at the run's end) nor reach its embedded servers (it starts its own).
        cpu: the CPU to run on (:func:`~harness.executors.worker_cpu`), taken before any thread starts so that every
            thread runs there; None: wherever the scheduler puts it.
    """
    if threading.current_thread() is threading.main_thread():  # Ctrl-C reaches the process group: the driver's to handle
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if cpu is not None:
        with contextlib.suppress(OSError):  # the CPU went offline meanwhile: run where the scheduler puts it
            os.sched_setaffinity(0, {cpu})
    link, stop, backends = WorkerLink(conn), StopEvent(), _Backends(recipes, remote=ship_sandboxes)
    pool = ThreadPoolExecutor(max_workers=max_runs, thread_name_prefix="run")
    orphaned = False
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                orphaned = True  # the driver is gone
                break
            if message[0] == "replies":
                for reply in message[1]:
                    link.deliver(*reply)
            elif message[0] == "run":
                pool.submit(_run_task, link, backends, message[1], stop, ship_sandboxes)
            elif message[0] == "stop":  # ("stop", reason): why the runs' end rows say they were interrupted
                stop.set_for(message[1] if len(message) > 1 else STOPPED_BY_USER)  # ("stop",): an older driver
            elif message[0] == "quit":
                break
    finally:
        stop.set()
        link.break_all()
        pool.shutdown(wait=False, cancel_futures=True)
        backends.close()
    if orphaned:  # nothing its runs do can be recorded now: exit, not wait for their model calls (the pool's threads)
        os._exit(0)


def _run_task(link: WorkerLink, backends: _Backends, task: RunTask, stop: threading.Event, ship: bool) -> None:
    """Run one task and tell the driver how it went (its rows went through the proxy as it ran)."""
    proxy = LedgerProxy(link, task.run_id)

    def retrying(attempt: Any) -> None:
        link.tell("retrying", task.run_id, attempt)

    options = replace(task.options, claim=proxy.take_claim, stop=stop, extra_config=task.extra_config, on_retry=retrying)
    outcome: tuple[Any, ...]
    if stop.is_set():  # handed over just before the driver said stop: never started, as with threads
        link.tell("done", task.run_id, ("skipped",))
        return
    try:
        summary = run_once(task.plan, backends.get(task.model).for_run(), proxy, options, run_id=task.run_id)
        if ship:
            link.call("sandbox", task.run_id, pack_sandbox(summary.sandbox, sandbox_bound(task.plan.scenario)))
        outcome = ("ran",)
    except IdentityTaken as taken:
        outcome = ("taken", taken.in_flight)
    except BaseException:  # noqa: BLE001 - a harness bug (or the driver gone): the driver stops the matrix, as with threads
        outcome = ("bug", traceback.format_exc())
    try:
        link.tell("done", task.run_id, outcome)
    except LedgerError:
        pass  # the driver is gone


def sandbox_bound(scenario: Scenario) -> int:
    """The most bytes a run's sandbox can hold: its fixtures plus the scenario's write limit."""
    return scenario.write_limit_bytes + sum(len(text.encode()) for text in scenario.fixtures.values())


def pack_sandbox(root: Path, limit: int) -> dict[str, bytes]:
    """A sandbox's regular files (sandbox-relative POSIX path -> bytes; symlinks and others skipped), to ship.

    Raises:
        LedgerError: they add up to more than ``limit`` bytes (the sandbox was changed outside the run).
    """
    files, total = {}, 0
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        total += len(data)
        if total > limit:
            raise LedgerError(f"the sandbox {root} holds more than {limit} bytes; it was changed outside its run.")
        files[path.relative_to(root).as_posix()] = data
    return files


def unpack_sandbox(root: Path, files: dict[str, bytes]) -> list[str]:
    """Write shipped sandbox files under ``root`` (made if missing); a path leaving it is skipped, never written.

    Returns:
        The names not written: leaving ``root``, not a str to bytes, or refused by this file system (a name too long
        under this machine's ``root``, a file where a folder is named); one bad name never stops the driver.
    """
    root.mkdir(parents=True, exist_ok=True)
    base, skipped = root.resolve(), []
    for name, data in files.items():
        try:
            if not isinstance(name, str) or not isinstance(data, bytes) or Path(name).is_absolute():
                raise ValueError(name)
            target = (base / name).resolve()
            if base not in target.parents:
                raise ValueError(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except (OSError, ValueError):
            skipped.append(str(name))
    return skipped
