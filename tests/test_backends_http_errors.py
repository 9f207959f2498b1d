"""What a server did, said plainly: redirects and bodies nested deeper than Python's JSON parser goes.

Red-team findings (issue 11): a 10 MB body of ``[`` was reported as "RecursionError ... this is
a harness bug", and an HTTP 307 as "a body that is not JSON". Both are the server's doing and
end the run as ``infra_error`` with a sentence that says what the server did.
"""

from __future__ import annotations

import gzip
import json
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest

from harness.backends import open_backend
from harness.backends.base import GenerateOptions
from harness.errors import BackendResponseError, BackendTimeout
from tests.helpers import run_server, serve

MESSAGES = [{"role": "user", "content": "hi"}]


class _QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1, no request log; :meth:`read_request` drains the POST body."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def read_request(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))


@contextmanager
def redirecting_server(status: int, location: str | None):
    """A 127.0.0.1 server answering every POST with ``status`` and, when given, a ``Location`` header."""

    class Handler(_QuietHandler):
        def do_POST(self):  # noqa: N802
            self.read_request()
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Type", "text/html")
            body = b"<html>moved</html>"
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST  # noqa: N815

    with serve(Handler) as url:
        yield url


@pytest.mark.parametrize("status", [301, 307, 308])
def test_a_redirect_is_reported_as_a_redirect_with_its_target(status):
    with redirecting_server(status, "https://elsewhere.example/v1/chat/completions") as url:
        with open_backend(f"openai:m@{url}", timeout_s=10) as backend, pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, GenerateOptions())
    message = str(info.value)
    assert f"HTTP {status}" in message and "redirect to https://elsewhere.example/v1/chat/completions" in message
    assert "not JSON" not in message
    assert info.value.status_code == status and info.value.retryable is False  # asking again gets the same redirect


def test_a_redirect_without_a_location_says_so():
    with redirecting_server(307, None) as url:
        with open_backend(f"openai:m@{url}", timeout_s=10) as backend, pytest.raises(BackendResponseError) as info:
            backend.generate(MESSAGES, None, GenerateOptions())
    assert "HTTP 307 (a redirect without a Location)" in str(info.value)


def test_a_body_nested_too_deeply_is_the_servers_failure_not_a_harness_bug(tmp_path, scenario):
    deep = (200, "application/json", b"[" * 10_000_000)
    summary, facts = run_server(tmp_path, scenario, [deep])
    assert summary.outcome == "infra_error"
    assert "nested too deeply" in summary.error and "10000000 bytes" in summary.error
    assert "harness bug" not in summary.error and "RecursionError" not in summary.error
    assert facts["verify"].ok and facts["run_ends"] == 1


def test_an_error_status_with_a_deeply_nested_body_keeps_its_status(tmp_path, scenario):
    deep = (500, "application/json", b"[" * 1_000_000)
    summary, _ = run_server(tmp_path, scenario, [deep])
    assert summary.outcome == "infra_error"
    assert "answered HTTP 500" in summary.error and "harness bug" not in summary.error


@contextmanager
def trickling_server(gzip_body: bytes | None = None):
    """POSTs answer 200 and then one byte every 0.2 s forever (or, with ``gzip_body``, that body gzip-encoded at once)."""

    class Handler(_QuietHandler):
        def do_POST(self):  # noqa: N802
            self.read_request()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if gzip_body is not None:
                data = gzip.compress(gzip_body)
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass  # the client gave up

    with serve(Handler) as url:
        yield url


def test_a_server_trickling_bytes_cannot_hold_a_reply_past_the_timeout():
    # red-team finding: httpx's timeout is per read, so one byte every 0.5 s kept a run with --timeout 3 going forever
    with trickling_server() as url:
        with open_backend(f"openai:m@{url}", timeout_s=1.5) as backend, pytest.raises(BackendTimeout) as info:
            backend.generate(MESSAGES, None, GenerateOptions())
    assert "did not answer completely within 1.5 s; raise --request-timeout" in str(info.value)


def test_a_compressed_body_is_read_once_decoded():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}}  # fmt: skip
    with trickling_server(json.dumps(body).encode()) as url:
        with open_backend(f"openai:m@{url}", timeout_s=10) as backend:
            reply = backend.generate(MESSAGES, None, GenerateOptions())
    assert reply.content == "hi"
