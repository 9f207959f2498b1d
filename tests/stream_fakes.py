"""Scripted streaming servers on 127.0.0.1: OpenAI-compatible server-sent events and Ollama's NDJSON.

Each POST is answered from a script of turns, in order (the last repeats): a turn is the list of chunks
to stream when the request says ``stream: true``, and the complete body to send when it does not, so a
test can reproduce a server whose non-streamed reply is right while its stream is broken (the shape of
every bug report cited in tests/test_streaming.py).

The wire follows the servers: llama.cpp's events as the bundled server sends them (observed in
tests/test_streaming_embedded.py: ``data: {json}\\n\\n`` events, a role chunk, the deltas, a chunk with
``finish_reason`` and an empty delta, a usage chunk with ``choices: []`` when ``stream_options.include_usage``,
then ``data: [DONE]``); Ollama's stream as one ``api.ChatResponse`` JSON object per line (``api/types.go``, read
for the README's "Wire formats"), the last with ``done: true``, ``done_reason`` and the counts and durations of
``api.Metrics``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.backend_fakes import FakeServer, Responder

__all__ = ["Turn", "ollama_lines", "openai_chunk", "scripted", "sse_chunks"]


@dataclass
class Turn:
    """One scripted reply: ``chunks`` (dicts sent as JSON, strings sent as they are) when streamed, ``body`` when not."""

    chunks: Sequence[Any]
    body: dict[str, Any] = field(default_factory=dict)
    pause_s: float = 0.0
    """Seconds to wait before each chunk (a decoding server's pace)."""


def openai_chunk(delta: dict[str, Any], *, finish: str | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk`` as llama.cpp sends it."""
    return {"choices": [{"finish_reason": finish, "index": 0, "delta": delta}], "created": 1, "id": "chatcmpl-x",
            "model": "m", "system_fingerprint": "b6000-fake", "object": "chat.completion.chunk"}  # fmt: skip


def sse_chunks(pieces: Sequence[dict[str, Any]], *, finish: str = "stop", usage: tuple[int, int] = (20, 7)) -> list[Any]:
    """A well-formed llama.cpp stream: a role chunk, one chunk per delta in ``pieces``, the finish chunk, usage, ``[DONE]``."""
    return [
        openai_chunk({"role": "assistant", "content": None}),
        *(openai_chunk(p) for p in pieces),
        openai_chunk({}, finish=finish),
        {**openai_chunk({}), "choices": [], "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]}},
        "[DONE]",
    ]


def ollama_lines(messages: Sequence[dict[str, Any]], *, reason: str = "stop", counts: tuple[int, int] = (20, 7)) -> list[Any]:
    """A well-formed Ollama stream: one line per message piece, then the ``done: true`` line with its metrics."""
    lines: list[Any] = [{"model": "m", "created_at": "2026-01-01T00:00:00Z", "message": {"role": "assistant", **m}, "done": False}
                        for m in messages]  # fmt: skip
    lines.append({"model": "m", "created_at": "2026-01-01T00:00:01Z", "message": {"role": "assistant", "content": ""},
                  "done": True, "done_reason": reason, "total_duration": 900_000_000, "load_duration": 1_000_000,
                  "prompt_eval_count": counts[0], "prompt_eval_duration": 50_000_000, "eval_count": counts[1],
                  "eval_duration": 700_000_000})  # fmt: skip
    return lines


def _stream(handler: BaseHTTPRequestHandler, turn: Turn, *, sse: bool, release: Any) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream" if sse else "application/x-ndjson")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    for chunk in turn.chunks:
        if turn.pause_s:
            release.wait(turn.pause_s)
        text = chunk if isinstance(chunk, str) else json.dumps(chunk)
        handler.wfile.write((f"data: {text}\n\n" if sse else f"{text}\n").encode())
        handler.wfile.flush()


def scripted(turns: Sequence[Turn], *, sse: bool) -> tuple[FakeServer, str]:
    """A server answering ``/v1/chat/completions`` (``sse``) or ``/api/chat`` from ``turns``.

    Returns:
        The server (use it as a context manager) and the chat path.
    """
    path = "/v1/chat/completions" if sse else "/api/chat"
    count = [0]
    server = FakeServer()

    def respond(handler: BaseHTTPRequestHandler, body: Any) -> None:
        turn = turns[min(count[0], len(turns) - 1)]
        count[0] += 1
        if isinstance(body, dict) and body.get("stream") is True:
            _stream(handler, turn, sse=sse, release=server.release)
            return
        data = json.dumps(turn.body).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    responder: Responder = respond
    server.routes[("POST", path)] = responder
    return server, path
