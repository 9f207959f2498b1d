"""A real HTTP server on 127.0.0.1 for backend tests: scripted routes, recorded requests.

Each route maps ``(METHOD, path)`` to a responder ``fn(handler, body) -> None`` that writes the
response itself, so tests can send any status, header or broken body over a real socket.
"""

from __future__ import annotations

import json
import selectors
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "FakeServer", "Recorded", "SocketThreads", "accept_connections", "closed_port", "drop_mid_body", "json_reply", "raw_reply", "read_http_request", "relay_sockets", "slow_json_reply",
]  # fmt: skip

Responder = Callable[[BaseHTTPRequestHandler, Any], None]


@dataclass
class Recorded:
    """One request the fake server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    peer: int = 0
    """The client's port: requests with one peer came over one connection."""


class FakeServer:
    """ThreadingHTTPServer on an ephemeral port, serving scripted routes; a context manager.

    With ``tls`` (a server-side context holding the certificate) it speaks HTTPS and :attr:`url` is ``https://``.
    """

    def __init__(self, routes: dict[tuple[str, str], Responder] | None = None, *, tls: ssl.SSLContext | None = None) -> None:
        self.routes: dict[tuple[str, str], Responder] = dict(routes or {})
        self.requests: list[Recorded] = []
        self.release = threading.Event()  # set on stop, so slow responders return early
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else b""
                body = json.loads(data) if data else None
                fake.requests.append(Recorded(self.command, self.path, dict(self.headers), body, self.client_address[1]))
                responder = fake.routes.get((self.command, self.path))
                if responder is None:
                    json_reply(404, {"error": "404 page not found"})(self, body)
                else:
                    responder(self, body)

            do_GET = do_POST = _serve

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._scheme = "http" if tls is None else "https"
        if tls is not None:  # the handshake runs at accept; a client refusing the certificate only fails its own accept
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{self._scheme}://{host}:{port}"

    def posts(self, path: str) -> list[Any]:
        """JSON bodies of the POST requests received on ``path``."""
        return [r.body for r in self.requests if r.method == "POST" and r.path == path]

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def raw_reply(
    status: int, data: bytes, *, content_type: str = "application/json", headers: dict[str, str] | None = None
) -> Responder:
    def respond(handler: BaseHTTPRequestHandler, body: Any) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(data)

    return respond


def json_reply(status: int, obj: Any, *, headers: dict[str, str] | None = None) -> Responder:
    return raw_reply(status, json.dumps(obj).encode(), headers=headers)


def drop_mid_body(partial: bytes = b'{"choices": [') -> Responder:
    """Promise a long body, send a few bytes, then close the connection."""

    def respond(handler: BaseHTTPRequestHandler, body: Any) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        handler.wfile.write(partial)
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(socket.SHUT_RDWR)

    return respond


def slow_json_reply(seconds: float, obj: Any, release: threading.Event) -> Responder:
    def respond(handler: BaseHTTPRequestHandler, body: Any) -> None:
        release.wait(seconds)
        try:
            json_reply(200, obj)(handler, body)
        except OSError:
            pass  # the client gave up

    return respond


def trickle(data: bytes, every_s: float, release: threading.Event) -> Responder:
    """Answer HTTP 200 with a ``Content-Length`` of ``data`` and send it one byte every ``every_s`` seconds: each read
    gets a byte in time, so only a deadline on the whole body ends the request."""

    def respond(handler: BaseHTTPRequestHandler, body: Any) -> None:
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            for i in range(len(data)):
                handler.wfile.write(data[i : i + 1])
                handler.wfile.flush()
                if release.wait(every_s):
                    return
        except OSError:
            pass  # the client gave up

    return respond


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_http_request(conn: socket.socket) -> bytes:
    """One HTTP/1.1 request read off a raw socket: its head, the blank line and a body of its ``Content-Length``."""
    data = b""
    while b"\r\n\r\n" not in data and (piece := conn.recv(65536)):
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (piece := conn.recv(65536)):
        body += piece
    return head + b"\r\n\r\n" + body


def relay_sockets(a: socket.socket, b: socket.socket, stop: threading.Event) -> None:
    """Copy bytes both ways between ``a`` and ``b`` (a proxy's tunnel) until either closes or ``stop`` is set."""
    with selectors.DefaultSelector() as selector:
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        while not stop.is_set():
            for key, _ in selector.select(0.1):
                try:
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    key.data.sendall(data)
                except OSError:
                    return


class SocketThreads:
    """A stop event and the threads a fake started, all joined at the end."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def end(self, *listeners: socket.socket) -> None:
        self.stop.set()
        for listener in listeners:
            listener.close()
        for thread in self.threads:
            thread.join(5)
        assert not any(t.is_alive() for t in self.threads), "a fake's thread outlived the test"


def accept_connections(listener: socket.socket, threads: SocketThreads, handle: Callable[[socket.socket], None]) -> None:
    """Accept connections on ``listener`` until ``threads.stop`` is set, each handled by ``handle`` on a thread of its own."""
    listener.settimeout(0.1)
    while not threads.stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        conn.settimeout(None)
        threads.start(handle, conn)
