"""The deadline of the model request in flight on a thread, held at every socket read, write and connect.

httpx's timeouts bound one operation each: a read timeout bounds one read, so a server sending a byte just inside
each read timeout held a request as long as it liked while its headers arrived (red team: h11 accepts 16 KiB of
them, hours at a byte a second), and overran the deadline by up to one read timeout while its body did (the body
reads check the deadline only between reads, :func:`harness.backends.wire.bounded_reads`).

:class:`DeadlineBackend` wraps the network backend of an httpcore connection pool: every read, write, TLS handshake
and connect of its streams waits at most until the deadline its thread's request set (:func:`hold`), and one begun
after it raises httpcore's timeout, which httpx raises as ``ReadTimeout`` (``WriteTimeout``, ``ConnectTimeout``):
a request ends within milliseconds of its deadline wherever it stalls, on a connection that httpcore then drops
(the thread's next request makes a new one). With no deadline held (``hold(None)``) the streams take httpx's
timeouts unchanged, so a client the wrapper is bound to serves other requests as before.

Why not a watchdog thread shutting the socket down at the deadline: the socket is named only on the response
(``network_stream``, after the headers arrived), so the header phase of a reused connection has no public handle;
and it takes a thread and a heap of deadlines touched twice a request. The wrapper costs a clock read a socket
operation, and a deadline is exact rather than a watchdog's tick late.

:func:`bind` installs the wrapper. httpx exposes no way to give a transport a network backend, so it sets the
attribute httpcore's pools read when they open a connection (``HTTPTransport._pool._network_backend``; httpcore 1.0's
direct, HTTP-proxy and SOCKS-proxy pools alike); a transport without one (another library's) keeps only the body
reads' check, and tests/test_request_deadline.py fails if a new httpx or httpcore moves the attribute. Not bounded:
the host name's lookup (``getaddrinfo``, the system resolver's own timeouts), which comes before any socket.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from ssl import SSLContext
from typing import Any

import httpcore
import httpx

__all__ = ["DeadlineBackend", "bind", "hold"]


class _Held(threading.local):
    until: float | None = None  # class default: a thread that never held a deadline reads None without a miss


_held = _Held()


def hold(until: float | None) -> None:
    """Bound every socket operation of this thread's requests on a bound transport by ``until`` (a
    ``time.monotonic()``), or, with ``None``, by httpx's own timeouts only."""
    _held.until = until


def _bounded(timeout: float | None, late: type[httpcore.TimeoutException]) -> float | None:
    """``timeout``, or the time left until the held deadline when that is shorter; ``late`` raised once it passed."""
    until = _held.until
    if until is None:
        return timeout
    left = until - time.monotonic()
    if left <= 0:
        raise late("the request's deadline passed")
    return left if timeout is None or left < timeout else timeout


class _Stream(httpcore.NetworkStream):
    """A network stream whose every wait ends by the held deadline."""

    __slots__ = ("_stream",)

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _bounded(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _bounded(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context: SSLContext, server_hostname: str | None = None, timeout: float | None = None) -> _Stream:
        return _Stream(self._stream.start_tls(ssl_context, server_hostname, _bounded(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's network ``backend``, its streams bounded by the held deadline (:func:`hold`)."""

    def __init__(self, backend: httpcore.NetworkBackend) -> None:
        self._backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        bounded = _bounded(timeout, httpcore.ConnectTimeout)
        return _Stream(self._backend.connect_tcp(host, port, bounded, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _Stream(self._backend.connect_unix_socket(path, _bounded(timeout, httpcore.ConnectTimeout), socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def bind(target: httpx.Client | httpx.BaseTransport) -> None:
    """Bound the connections ``target`` opens from now on by the held deadline: a transport's, or a client's (its
    transport and every proxy the environment mounted). Idempotent; a transport with no httpcore pool is left as it is."""
    if isinstance(target, httpx.Client):
        transports = [getattr(target, "_transport", None), *getattr(target, "_mounts", {}).values()]
    else:
        transports = [target]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if isinstance(backend, httpcore.NetworkBackend) and not isinstance(backend, DeadlineBackend):
            pool._network_backend = DeadlineBackend(backend)  # type: ignore[union-attr]
