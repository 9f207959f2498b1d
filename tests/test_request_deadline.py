"""A model request's deadline holds at every socket read, not only between body reads (red team).

* A server trickling its response HEADERS (one byte every 0.2 s; the whole head would take 60 s) held a request for
  as long as it liked: httpx's read timeout is per read, and the deadline was only checked while the body was read.
* A server sending a body byte just inside each read timeout (every 1.9 s against a 2 s deadline) overran the deadline
  by up to one read timeout (3.8 s for 2 s), while the error said "did not answer completely within 2 s".

Both on the direct path (no proxy in the environment: the thread's own transport) and through a real forwarding proxy
named by ``HTTP_PROXY`` (the client path), streamed and not, for both HTTP backends; the thread's next request then
works (a new connection). Every server here is a real socket server on 127.0.0.1, stopped (threads joined) at the end.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest

from harness.backends import OllamaBackend, OpenAICompatBackend
from harness.backends.base import GenerateOptions
from harness.errors import BackendTimeout
from tests.backend_fakes import SocketThreads, accept_connections, read_http_request, relay_sockets
from tests.stream_fakes import ollama_lines, openai_chunk

USER = [{"role": "user", "content": "hi"}]
_Answer = Callable[[socket.socket, threading.Event], None]


@contextmanager
def server(answers: list[_Answer]) -> Iterator[str]:
    """A socket server on 127.0.0.1 answering its N-th connection's request with ``answers[N]`` (the last repeats),
    one request per connection; yields its URL."""
    threads, listener, count = SocketThreads(), socket.create_server(("127.0.0.1", 0)), iter(range(1_000_000))

    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                read_http_request(conn)
                answers[min(next(count), len(answers) - 1)](conn, threads.stop)
            except OSError:
                pass  # the client gave up

    threads.start(accept_connections, listener, threads, handle)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        threads.end(listener)


@contextmanager
def forwarding_proxy() -> Iterator[tuple[str, list[str]]]:
    """A forwarding HTTP proxy on 127.0.0.1: reads a request in absolute form, connects to the host it names and relays
    bytes both ways until either side closes; yields its URL and the list of the URLs it was asked for."""
    threads, listener, seen = SocketThreads(), socket.create_server(("127.0.0.1", 0)), []

    def handle(conn: socket.socket) -> None:
        with conn:
            request = read_http_request(conn)
            seen.append(request.split(b" ", 2)[1].decode())
            target = seen[-1].split("/")[2]  # http://HOST:PORT/path
            host, _, port = target.rpartition(":")
            with socket.create_connection((host, int(port))) as upstream:
                upstream.sendall(request)
                relay_sockets(conn, upstream, threads.stop)

    threads.start(accept_connections, listener, threads, handle)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        threads.end(listener)


def _trickled_head(conn: socket.socket, stop: threading.Event) -> None:
    """A status line, then a header one byte every 0.2 s: the whole head would take 60 s."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Pad: ")
    for _ in range(300):
        if stop.wait(0.2):
            return
        conn.sendall(b"a")


def _stalled_body(media: bytes) -> _Answer:
    """The whole head at once, a body byte 1.5 s later, then one every 1.9 s: each read gets a byte within the 2 s
    read timeout, and the read begun at 1.5 s, before a 2 s deadline, ends at 3.4 s."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: 100\r\nConnection: close\r\n\r\n" % media)
        for pause in [1.5] + [1.9] * 30:
            if stop.wait(pause):
                return
            conn.sendall(b" ")

    return answer


def _reply(media: bytes, body: bytes) -> _Answer:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (media, len(body), body))  # fmt: skip

    return answer


_OPENAI = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
_SSE = b"".join(b"data: %s\n\n" % json.dumps(c).encode() for c in (openai_chunk({"content": "ok"}, finish="stop"),))
_OLLAMA_LINES = ollama_lines([{"content": "ok"}])
KINDS = {  # (backend, streamed) -> (media type, a good reply)
    ("openai", False): (b"application/json", json.dumps(_OPENAI).encode()),
    ("openai", True): (b"text/event-stream", _SSE + b"data: [DONE]\n\n"),
    ("ollama", False): (b"application/json", json.dumps(_OLLAMA_LINES[-1] | {"message": {"role": "assistant",
                                                                                           "content": "ok"}}).encode()),
    ("ollama", True): (b"application/x-ndjson", b"".join(json.dumps(x).encode() + b"\n" for x in _OLLAMA_LINES)),
}  # fmt: skip


def _backend(kind: str, url: str, timeout_s: float) -> OpenAICompatBackend:
    return (
        OllamaBackend("m", url, timeout_s=timeout_s)
        if kind == "ollama"
        else OpenAICompatBackend("m", f"{url}/v1", timeout_s=timeout_s)
    )


@contextmanager
def _route(proxied: bool, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """No proxy in the environment, or ``HTTP_PROXY`` naming a forwarding proxy; yields the URLs the proxy forwarded."""
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    if not proxied:
        yield []
        return
    with forwarding_proxy() as (proxy, seen):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        yield seen


CASES = [
    pytest.param(kind, streamed, proxied, id=f"{kind}-{'stream' if streamed else 'whole'}-{'proxy' if proxied else 'direct'}")
    for kind, streamed, proxied in [
        ("openai", False, False), ("openai", True, False), ("openai", False, True), ("openai", True, True),
        ("ollama", True, False), ("ollama", False, True),
    ]
]  # fmt: skip


def _timed_out_then_answered(answer: _Answer, case: tuple[str, bool, bool], deadline_s: float, monkeypatch) -> float:
    """Seconds the first request took to fail with BackendTimeout; the same thread's next request is then answered."""
    kind, streamed, proxied = case
    media, good = KINDS[(kind, streamed)]
    with server([answer, _reply(media, good)]) as url, _route(proxied, monkeypatch) as forwarded:
        with _backend(kind, url, deadline_s) as backend:
            started = time.monotonic()
            with pytest.raises(BackendTimeout, match=f"did not answer completely within {deadline_s:g} s") as info:
                backend.generate(USER, None, GenerateOptions(stream=streamed))
            elapsed = time.monotonic() - started
            assert isinstance(info.value.__cause__, httpx.TimeoutException)
            assert backend.generate(USER, None, GenerateOptions(stream=streamed)).content == "ok"
        assert len(forwarded) == (2 if proxied else 0)
    return elapsed


@pytest.mark.parametrize(("kind", "streamed", "proxied"), CASES)
def test_a_server_trickling_its_headers_cannot_hold_a_request_past_its_deadline(kind, streamed, proxied, monkeypatch):
    elapsed = _timed_out_then_answered(_trickled_head, (kind, streamed, proxied), 1.0, monkeypatch)
    assert 0.9 < elapsed < 3.0  # unbounded before: the whole head (60 s)


@pytest.mark.parametrize(("kind", "streamed", "proxied"), CASES)
def test_a_body_byte_just_inside_each_read_timeout_cannot_hold_a_request_past_its_deadline(kind, streamed, proxied, monkeypatch):
    media = KINDS[(kind, streamed)][0]
    elapsed = _timed_out_then_answered(_stalled_body(media), (kind, streamed, proxied), 2.0, monkeypatch)
    assert 1.9 < elapsed < 3.0  # 3.4 s before: the read begun before the deadline ran its full read timeout


def test_a_callers_own_client_holds_the_deadline_too():
    with server([_trickled_head, _reply(*KINDS[("openai", False)])]) as url, httpx.Client() as client:
        with OpenAICompatBackend("m", f"{url}/v1", timeout_s=1, client=client) as backend:
            started = time.monotonic()
            with pytest.raises(BackendTimeout):
                backend.generate(USER, None, GenerateOptions())
            assert time.monotonic() - started < 3.0
            assert backend.generate(USER, None, GenerateOptions()).content == "ok"
        time.sleep(1.0)  # past the last request's deadline: it no longer bounds the client's own requests
        assert client.get(f"{url}/v1/models").status_code == 200
