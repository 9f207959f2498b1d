"""A scripted OpenAI-compatible model server on 127.0.0.1, for tests and benchmarks.

It answers ``POST /v1/chat/completions`` like an ideal agent model: the reply is chosen by how
many tool results the request already holds (``script[n]`` for ``n`` results, the last entry
once the script runs out), so every run gets the same correct sequence whatever the
concurrency. It can wait a fixed delay per request, serve only ``slots`` requests at once
(like a single-slot llama.cpp or Ollama server), and inject faults by request number.

Example::

    with FakeAgentServer(delay_s=0.2, slots=4) as server:
        spec = f"openai:ideal@{server.base_url}"

This is a real HTTP server on a real socket, not a mock: the client code under test runs
unchanged against it.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.backends.openai_compat import WARM_UP_MESSAGES

__all__ = ["FAULTS", "LIST_AND_REPORT_SCRIPT", "FakeAgentServer"]

#: fault names a ``faults`` callable may return for a request number
FAULTS = ("drop", "500", "429", "slow", "garbage")

LIST_AND_REPORT_SCRIPT: tuple[dict[str, Any], ...] = (
    {"tool_calls": [{"name": "list_files", "arguments": {"path": "."}}]},
    {
        "tool_calls": [
            {
                "name": "write_file",
                "arguments": {"path": "report.txt", "content": "There are 3 files:\nconfig.json\nhello.txt\nmemo.md\n"},
            }
        ]
    },
    {"content": "I wrote report.txt: 3 files."},
)


class _QuietServer(ThreadingHTTPServer):
    """A threading HTTP server that says nothing when a client goes away mid-request (a killed harness)."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeAgentServer:
    """An ideal, scripted OpenAI-compatible server; a context manager.

    Args:
        script: replies by number of tool results in the request; each ``{"content": str}``
            and/or ``{"tool_calls": [{"name", "arguments"}]}``.
        delay_s: seconds to wait before answering each request (while holding a slot).
        slots: requests served at once; others wait for a slot.
        faults: ``fn(request_number from 1) -> fault name or None``; see :data:`FAULTS`
            (``slow`` sleeps ``slow_s`` before answering, ``429`` sends ``Retry-After: 1``).
        slow_s: how long a ``slow`` fault stalls, seconds.

    Attributes:
        requests: number of chat requests received, the warm-up aside.
        warmups: number of warm-up requests received (``WARM_UP_MESSAGES`` with ``max_tokens`` 1: the runner sends one
            per model before its runs); answered without faults or delay, and not numbered for ``faults``.
        max_in_flight: the most chat requests (warm-ups aside) it has held at once, waiting for a slot or answering.
    """

    def __init__(
        self,
        script: Sequence[dict[str, Any]] = LIST_AND_REPORT_SCRIPT,
        *,
        delay_s: float = 0.0,
        slots: int = 1,
        faults: Callable[[int], str | None] | None = None,
        slow_s: float = 5.0,
    ):
        self.script = list(script)
        self.delay_s = delay_s
        self.faults = faults or (lambda n: None)
        self.slow_s = slow_s
        self.requests = 0
        self.warmups = 0
        self.max_in_flight = 0
        self._in_flight = 0
        self._slots = threading.Semaphore(slots)
        self._count_lock = threading.Lock()
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                server._send(self, 404, b'{"error": "not found"}')

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if body.get("messages") == list(WARM_UP_MESSAGES) and body.get("max_tokens") == 1:
                    with server._count_lock:
                        server.warmups += 1
                    return server._answer(self, body, None, warm_up=True)
                with server._count_lock:
                    server.requests += 1
                    number = server.requests
                    server._in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server._in_flight)
                try:
                    with server._slots:
                        server._answer(self, body, server.faults(number))
                finally:
                    with server._count_lock:
                        server._in_flight -= 1

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: the base URL for an ``openai:`` model spec."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def _send(self, handler: BaseHTTPRequestHandler, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(data)
        except OSError:
            pass  # the client gave up (timeout test)

    def _answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], fault: str | None, *, warm_up: bool = False) -> None:
        if fault == "drop":
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "500":
            return self._send(handler, 500, b'{"error": "internal error"}')
        if fault == "429":
            return self._send(handler, 429, b'{"error": "busy"}', {"Retry-After": "1"})
        if fault == "garbage":
            return self._send(handler, 200, b"<html>not json</html>")
        if fault == "slow":
            self._closing.wait(self.slow_s)
        elif self.delay_s and not warm_up:
            self._closing.wait(self.delay_s)
        messages = body.get("messages") or []
        results = sum(1 for m in messages if m.get("role") == "tool" or "<tool_response>" in str(m.get("content")))
        step = self.script[min(results, len(self.script) - 1)]
        calls = [
            {"id": f"call_{results}_{i}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
            for i, c in enumerate(step.get("tool_calls") or [])
        ]  # fmt: skip
        message = {"role": "assistant", "content": step.get("content")}
        if calls:
            message["tool_calls"] = calls
        reply = {
            "id": f"chatcmpl-{results}",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {"prompt_tokens": 20 + 10 * len(messages), "completion_tokens": 12},
        }
        self._send(handler, 200, json.dumps(reply).encode())

    def __enter__(self) -> FakeAgentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving (stalled requests are released) and close the socket."""
        self._closing.set()
        self._httpd.shutdown()
        self._httpd.server_close()
