"""Hostile servers against streaming and refusal recognition (a red-team pass): every server is real, on 127.0.0.1.

* A server trickling bytes that never end a line (or SSE ``data:`` lines that never end an event) cannot hold a
  call past its timeout: the deadline and the size are checked at every read, not at every complete chunk.
* A stream cut before its final chunk over a close-delimited body (no framing error to see) is the server's
  failure, ``BackendUnavailable``, never a model turn.
* A proxy's text page quoting a parser's refusal wording is not the parser's JSON refusal: infrastructure.
* A context overflow reported inside a stream is a ``ContextOverflow``, not a retried error.
* Two ids on one tool-call index are named as an assembly problem.
* ``harness rescore`` of a ledger whose stored chunks were replaced by deeply nested JSON: one sentence.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.backends import OllamaBackend, OpenAICompatBackend, open_backend
from harness.backends.base import GenerateOptions
from harness.backends.streaming import assemble
from harness.errors import (
    BackendResponseError,
    BackendTimeout,
    BackendUnavailable,
    ContextOverflow,
    LedgerError,
    ServerConfigError,
)
from harness.ledger import Ledger
from harness.ledger.packing import pack_chunks, unpack_chunks
from harness.loop import RunOptions, RunPlan, run_once
from tests.backend_fakes import read_http_request
from tests.helpers import assert_one_sentence_error, cli
from tests.ledger_tamper import tamper
from tests.stream_fakes import Turn, openai_chunk, scripted, sse_chunks

USER = [{"role": "user", "content": "hi"}]


@contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A socket server on 127.0.0.1 that reads each request and hands the connection to ``answer``; yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        with conn:
            read_http_request(conn)
            try:
                answer(conn)
            except OSError:
                pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def _trickle(piece: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for _ in range(60):  # 12 s of bytes, each read well inside any per-read timeout
            conn.sendall(piece)
            time.sleep(0.2)

    return answer


@pytest.mark.parametrize(
    ("piece", "ollama"),
    [(b'data: {"x', False), (b"data: {}\n", False), (b'{"message', True)],
    ids=["sse-no-line-end", "sse-no-event-end", "ndjson-no-line-end"],
)
def test_a_trickled_stream_that_never_ends_a_chunk_cannot_outlast_the_timeout(piece, ollama):
    with raw_server(_trickle(piece)) as url:
        backend = OllamaBackend("m", url, timeout_s=1) if ollama else OpenAICompatBackend("m", f"{url}/v1", timeout_s=1)
        started = time.monotonic()
        with backend, pytest.raises(BackendTimeout):
            backend.generate(USER, None, GenerateOptions(stream=True))
    assert time.monotonic() - started < 4


def test_a_stream_cut_before_its_final_chunk_is_the_servers_failure_not_a_model_turn():
    def answer(conn: socket.socket) -> None:  # close-delimited body: closing is the only framing, so no framing error
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        conn.sendall(f"data: {json.dumps(openai_chunk({'content': 'The capital'}))}\n\n".encode())

    with raw_server(answer) as url, OpenAICompatBackend("m", f"{url}/v1", timeout_s=5) as backend:
        with pytest.raises(BackendUnavailable, match="ended the stream before its final chunk"):
            backend.generate(USER, None, GenerateOptions(stream=True))


def _answer(content_type: bytes, body: bytes) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (content_type, len(body), body))  # fmt: skip

    return answer


# red team: a stream whose chunk is not JSON, or that held only [DONE], was recorded as the model's turn (task_failed with
# stream_assembly_error or empty_response) where the same fault unstreamed (a body that is not JSON, no choices) is the
# server's: infra_error. Both are now the server's failure, retried, no turn recorded (red team 2: so are JSON objects
# that are no chat chunk; a cut in the middle of a chunk is a stream ended early)
@pytest.mark.parametrize(
    ("events", "why"),
    [(b"data: {not json}\n\ndata: [DONE]\n\n", "chunk 1 is not JSON: '{not json}'"),
     (b"data: [1, 2]\n\ndata: [DONE]\n\n", "chunk 1 is not a JSON object"),
     (b"data: [DONE]\n\n", "no chat chunk"),
     (b'data: {}\n\ndata: {"foo": 1}\n\ndata: [DONE]\n\n', "no chat chunk")],
    ids=["not-json", "not-an-object", "only-done", "objects-that-are-no-chat-chunk"],
)  # fmt: skip
def test_a_stream_that_is_not_a_chat_reply_is_the_servers_failure(events, why):
    with raw_server(_answer(b"text/event-stream", events)) as url, OpenAICompatBackend("m", f"{url}/v1", timeout_s=5) as backend:
        with pytest.raises(BackendResponseError) as info:
            backend.generate(USER, None, GenerateOptions(stream=True))
    assert str(info.value) == f"The server at {url}/v1 sent a stream that is not a chat reply ({why}); check the server's log."
    assert info.value.retryable


def test_a_connection_cut_inside_a_chunk_is_a_stream_ended_early_not_a_garbled_one():
    good = json.dumps(openai_chunk({"content": "The capital"}))
    events = f"data: {good}\n\ndata: {good[:30]}".encode()  # the close is the only framing: no length, no chunk end
    with raw_server(_answer(b"text/event-stream", events)) as url, OpenAICompatBackend("m", f"{url}/v1", timeout_s=5) as backend:
        with pytest.raises(BackendUnavailable, match="ended the stream before its final chunk"):
            backend.generate(USER, None, GenerateOptions(stream=True))


# red team 2: an error object inside the stream is the server's word on the reply whatever else the stream held: a
# refusal of the model's call followed by a garbled chunk is still the model's server_rejected_call, not infra_error
def test_a_refusal_inside_a_stream_is_read_before_a_garbled_chunk_after_it():
    refusal = json.dumps({"error": {"message": "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101]"}})
    events = f"data: {refusal}\n\ndata: garbage!!\n\n".encode()
    with raw_server(_answer(b"text/event-stream", events)) as url, OpenAICompatBackend("m", f"{url}/v1", timeout_s=5) as backend:
        reply = backend.generate(USER, None, GenerateOptions(stream=True))
    assert reply.rejection is not None and reply.rejection["server"] == "llama.cpp"
    assert reply.rejection["error"].startswith("Failed to parse tool call arguments as JSON")


# red team: a server that ignores `stream: true` and answers one whole JSON body was said to have "ended the stream
# before its final chunk; check that it is still running" (red team 2: and an empty or error body is no whole reply)
def test_a_server_that_does_not_stream_is_told_to_run_with_stream_off():
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop"}]})
    with raw_server(_answer(b"application/json", body.encode())) as url, OpenAICompatBackend("m", f"{url}/v1") as backend:
        with pytest.raises(ServerConfigError) as info:
            backend.generate(USER, None, GenerateOptions(stream=True))
    assert str(info.value) == (f"The server at {url}/v1/chat/completions answered a streamed request with one whole JSON "
                               "reply, not an event stream: it does not stream; run with --stream off.")  # fmt: skip
    assert not info.value.retryable


@pytest.mark.parametrize(
    ("content_type", "body", "said"),
    [(b"application/json", b"", "with JSON that is not a reply (no body), not an event stream; check the server's log."),
     (b"application/json; charset=utf-8", b'{"error": {"message": "model overloaded"}}',
      "with JSON that is not a reply (model overloaded), not an event stream; check the server's log."),
     (b"text/plain", b'{"choices": []}',
      "with text/plain and no event, not an event stream; check the URL and the server's log.")],
    ids=["empty-json", "json-error", "text-plain"],
)  # fmt: skip
def test_a_body_that_is_no_event_stream_and_no_reply_is_the_servers_failure_in_its_words(content_type, body, said):
    with raw_server(_answer(content_type, body)) as url, OpenAICompatBackend("m", f"{url}/v1", timeout_s=5) as backend:
        with pytest.raises(BackendResponseError) as info:
            backend.generate(USER, None, GenerateOptions(stream=True))
    assert str(info.value) == f"The server at {url}/v1/chat/completions answered a streamed request {said}"
    assert info.value.retryable


@pytest.mark.parametrize(
    ("text", "ollama"),
    [("Failed to parse tool call arguments as JSON: upstream reset", False),
     ("error parsing tool call: upstream connect error or disconnect/reset before headers", True)],
    ids=["llama.cpp-wording", "ollama-wording"],
)  # fmt: skip
def test_a_proxy_text_page_in_a_refusals_wording_is_infrastructure_not_a_refusal(text, ollama):
    body = text.encode()

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))  # fmt: skip

    with raw_server(answer) as url:
        backend = OllamaBackend("m", url, timeout_s=5) if ollama else OpenAICompatBackend("m", f"{url}/v1", timeout_s=5)
        with backend, pytest.raises(BackendResponseError, match="answered HTTP 500"):
            backend.generate(USER, None, GenerateOptions())


def test_a_context_overflow_reported_inside_the_stream_is_a_context_overflow():
    error = "the request exceeds the available context size, try increasing it"
    server, _ = scripted([Turn([openai_chunk({"content": "x"}), {"error": {"code": 400, "message": error}}])], sse=True)
    with server, OpenAICompatBackend("m", f"{server.url}/v1", timeout_s=10) as backend:
        with pytest.raises(ContextOverflow):
            backend.generate(USER, None, GenerateOptions(stream=True))


def test_two_ids_on_one_tool_call_index_are_an_assembly_problem():
    def delta(call_id: str, name: str) -> dict:
        return {"tool_calls": [{"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}]}

    stream = [x if isinstance(x, str) else json.dumps(x) for x in sse_chunks([delta("a", "f"), delta("b", "g")])]
    got = assemble([{"t": float(i), "data": d} for i, d in enumerate(stream)], sse=True)
    assert "chunk 3 gives tool-call index 0 a second id ('b')" in got.problems


def test_rescore_of_stored_chunks_replaced_by_deeply_nested_json_is_one_sentence(tmp_path, scenario, capsys):
    server, _ = scripted([Turn(sse_chunks([{"content": "Done."}]))], sse=True)
    ledger_file = tmp_path / "ledger.sqlite"
    with server:
        plan = RunPlan(scenario, f"openai:m@{server.url}/v1", 0.0, stream=True)
        with open_backend(plan.model, timeout_s=10) as backend, Ledger(ledger_file) as ledger:
            run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs"))
    deep = "zlib+b64:" + base64.b64encode(zlib.compress(b"[" * 200_000 + b"]" * 200_000)).decode()
    tamper(Path(ledger_file), f"UPDATE turns SET stream_chunks = '{deep}'")
    rc, _, err = cli(capsys, "rescore", "--ledger", ledger_file, "--force")
    assert_one_sentence_error(rc, err)
    assert "stream chunks that cannot be read" in err


@pytest.mark.parametrize("end", ["\r", "\r\n", "\n"], ids=["cr", "crlf", "lf"])
def test_every_line_end_server_sent_events_allow_is_read_even_split_between_reads(end):
    events = [json.dumps(openai_chunk({"content": "Par"})), json.dumps(openai_chunk({"content": "is"}, finish="stop")), "[DONE]"]
    body = "".join(f"data: {e}{end}{end}" for e in events).encode()

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        for start in range(0, len(body), 7):  # a \r\n falls between two reads
            conn.sendall(body[start : start + 7])
            time.sleep(0.001)

    with raw_server(answer) as url, OpenAICompatBackend("m", f"{url}/v1", timeout_s=5) as backend:
        reply = backend.generate(USER, None, GenerateOptions(stream=True))
    assert reply.content == "Paris" and reply.stream_problems == [] and len(reply.stream_chunks) == 3


def test_stored_chunks_that_inflate_past_the_limit_are_refused_before_they_are_read_whole():
    chunks = [{"t": 1.0, "data": "0" * 1_000_000}]
    packed = pack_chunks(chunks)
    assert len(packed) < 5_000 and unpack_chunks(packed, {}, "turns") == chunks
    with pytest.raises(LedgerError, match="stream chunks that cannot be read"):
        unpack_chunks(packed, {"run_id": "r", "turn": 1}, "turns", limit=100_000)
    with pytest.raises(LedgerError):  # cut short
        unpack_chunks(packed[:-40], {}, "turns")
