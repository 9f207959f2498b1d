"""Streamed replies: reading the chunks off the wire, and assembling them into one reply.

Two wire formats are read (:func:`harness.backends.wire.read_stream`, :func:`chunk_lines`):

* OpenAI-compatible servers (llama.cpp's ``llama-server``, vLLM, LM Studio) send server-sent events: ``data: {json}``
  lines separated by blank lines, ending with ``data: [DONE]``. Each chunk's ``choices[0].delta`` carries a piece of
  ``content`` / ``reasoning_content`` and pieces of ``tool_calls``, each piece naming the call it belongs to by
  ``index``: the first piece of a call opens it (``id``, ``function.name``), later pieces append to its arguments.
* Ollama's ``/api/chat`` sends NDJSON: one JSON object per line, ``message.content`` /
  ``message.thinking`` pieces and whole ``message.tool_calls``, the last line with ``done: true``
  (``done_reason``, ``prompt_eval_count``, ``eval_count``, durations in ns).

A stream is kept as the list of its raw chunks, each ``{"t": ms since the request was sent, "data": text}`` (the
event's ``data`` text, or the NDJSON line), so the reply can be re-derived from what the server sent (:func:`assemble`,
a pure function of the chunks). Assembly never raises on what the server sent: what cannot be assembled into one
coherent reply is listed in :attr:`Assembly.problems` (the classifier's ``stream_problems`` input, labelled
``stream_assembly_error``, docs/failure-modes.md#stream_assembly_error):

* a tool call's arguments that, assembled from their deltas, are not JSON while the stream did not
  stop at the token limit: llama.cpp, Ollama and vLLM parse a non-streamed call's arguments on the
  server and return them as JSON (or refuse the reply), so only the assembly leaves them broken;
* deltas for a tool-call ``index`` that no delta opened (no ``id`` and no ``function.name`` first);
* a delta giving an open tool-call ``index`` a different ``id`` (two calls interleaved on one index);
* content or calls after the final chunk (after ``[DONE]``, a ``finish_reason``, or Ollama's ``done: true``);
* a chunk that is not a JSON object, or a stream that ends without its final chunk (stored chunks only: live, they are
  the server's failure, :func:`stream_reply` raises ``BackendResponseError`` or ``BackendUnavailable``).

An ``error`` object sent inside the stream (llama.cpp and Ollama report errors met after the first byte this way) is
:attr:`Assembly.error`, for the backend to recognise as a refusal or an error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from harness.backends.base import BackendIdentity, Reply, rejection_record
from harness.errors import BackendError, BackendResponseError, BackendUnavailable

__all__ = [
    "Assembly",
    "assemble",
    "chunk_lines",
    "rederive",
    "reply_speed",
    "response_of",
    "stream_reply",
]

_MAX_PROBLEM_CHARS = 160


@dataclass
class Assembly:
    """One reply assembled from its stream.

    Attributes:
        content: the joined content pieces, or ``None`` when no piece had text.
        reasoning: the joined reasoning pieces (``reasoning_content``/``reasoning``, Ollama's ``thinking``), or ``None``.
        tool_calls: the calls in ``index`` order (OpenAI shape, ``arguments`` as the joined text; Ollama's calls as
            sent), or ``None``.
        finish_reason: the final chunk's ``finish_reason`` (Ollama's ``done_reason``), or ``None``.
        prompt_tokens / completion_tokens: from the final ``usage`` (Ollama: ``prompt_eval_count``/``eval_count``).
        ttft_ms: ms from the request to the first chunk with content, reasoning or a call, or ``None``.
        decode_tps: tokens per second between the first and the last such chunk (the server's completion count when
            it gives one, else one token per chunk), or ``None`` with fewer than two such chunks.
        problems: one short sentence per assembly problem (empty when the stream is coherent).
        error: the message of an ``error`` object sent inside the stream, or ``None``.
        final: the last chunk's JSON object (Ollama's has the timings), for ``raw``.
        whole: a final chunk (``finish_reason``, ``[DONE]``, Ollama's ``done: true``) or an ``error`` object arrived.
        garbled: the problem of the first chunk that is not a JSON object, or ``None``; replied: some chunk was a chat
            chunk (``choices``; Ollama's ``message`` or ``done``).
    """

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_ms: float | None = None
    decode_tps: float | None = None
    problems: list[str] = field(default_factory=list)
    error: str | None = None
    final: dict[str, Any] = field(default_factory=dict)
    whole: bool = False
    garbled: str | None = None
    replied: bool = False

    def reply(
        self, chunks: list[dict[str, Any]], latency_ms: float, identity: BackendIdentity, rejection: dict[str, Any] | None
    ) -> Reply:
        """The :class:`Reply` this assembly stands for (``raw`` is the last chunk; a refused reply has no calls)."""
        return Reply(
            content=self.content, tool_calls=None if rejection else self.tool_calls, finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens, latency_ms=latency_ms,
            raw=self.final, identity=identity, reasoning=self.reasoning, rejection=rejection,
            stream_chunks=chunks, stream_problems=list(self.problems), ttft_ms=self.ttft_ms, decode_tps=self.decode_tps,
        )  # fmt: skip


def stream_reply(
    chunks: list[dict[str, Any]],
    latency_ms: float,
    sse: bool,
    recognisers: tuple[Callable[[int, str], tuple[str, str | None] | None], Callable[[int, str], BackendError | None]],
    identity: BackendIdentity,
) -> Reply:
    """The reply a stream's raw chunks assemble to (:func:`assemble`).

    Args:
        chunks: the raw chunks.
        latency_ms: the request's wall-clock time, ms.
        sse: server-sent events rather than NDJSON.
        recognisers: the backend's recognisers of a refusal of the model's call (``_rejection(status, message)``) and
            of an error no retry can fix (``_permanent_error(status, message)``), applied to an ``error`` object sent
            inside the stream.
        identity: what served the reply.

    Raises:
        ContextOverflow, ServerConfigError: the stream carried an error object that no retry can fix.
        BackendResponseError: the stream carried another error object that is not a refusal of the model's call; or,
            with no error object, a chunk that is not a JSON object, or no chat chunk (the server's failure, as an
            unstreamed body that is not JSON is).
        BackendUnavailable: the stream ended before its final chunk (the server or the connection failed mid-reply).
    """
    got = assemble(chunks, sse=sse)
    rejection = None
    if got.error is None:  # an error object is the server's own word on the reply: it is read whatever else came
        if not got.whole:  # the connection closed mid-reply (a close-delimited body shows no framing error): the server's
            raise BackendUnavailable(
                f"The server at {identity.base_url} ended the stream before its final chunk (no finish_reason, [DONE] or "
                "done: true); check that it is still running and try again."
            )
        if got.garbled is not None or not got.replied:  # the server's failure, as an unstreamed body that is not JSON
            raise BackendResponseError(f"The server at {identity.base_url} sent a stream that is not a chat reply "
                                       f"({got.garbled or 'no chat chunk'}); check the server's log.", status_code=None)  # fmt: skip
    else:
        refusal, permanent = recognisers
        found = refusal(500, got.error)
        fatal = permanent(500, got.error) if found is None else None
        if fatal is not None:
            raise fatal
        if found is None:
            raise BackendResponseError(
                f"The server at {identity.base_url} reported an error inside the stream ({got.error[:200]}); "
                "check the server's log.",
                status_code=None,
            )
        rejection = rejection_record(found[0], 200, got.error)
        got.content = found[1] if found[1] is not None else got.content  # the model's text, where the error quotes it
    return got.reply(chunks, latency_ms, identity, rejection)


def chunk_lines(lines: Iterator[str], started: float, *, sse: bool) -> Iterator[dict[str, Any]]:
    """The raw chunks of a stream, as they arrive.

    Args:
        lines: the body's lines.
        started: ``time.perf_counter()`` when the request was sent.
        sse: server-sent events (OpenAI-compatible) rather than NDJSON (Ollama).

    Yields:
        ``{"t": ms since started, "data": text}``: the ``data`` of each event (SSE comments, ``event:`` and ``id:``
        lines are skipped; a multi-line event is joined with newlines), or each non-blank NDJSON line.
    """
    pending: list[str] = []
    for line in lines:
        if not sse:
            if line.strip():
                yield {"t": round((time.perf_counter() - started) * 1000.0, 3), "data": line}
            continue
        if line.startswith("data:"):
            pending.append(line[5:].removeprefix(" "))
        elif not line.strip() and pending:
            yield {"t": round((time.perf_counter() - started) * 1000.0, 3), "data": "\n".join(pending)}
            pending = []
    if pending:
        yield {"t": round((time.perf_counter() - started) * 1000.0, 3), "data": "\n".join(pending)}


def assemble(chunks: list[dict[str, Any]], *, sse: bool) -> Assembly:
    """Assemble a stream's raw chunks into one reply (pure; never raises on what the server sent).

    Args:
        chunks: ``[{"t": ms, "data": text}]`` as :func:`chunk_lines` yields them (or as stored in the ledger).
        sse: OpenAI-compatible server-sent events rather than Ollama's NDJSON.

    Returns:
        The :class:`Assembly`, with :attr:`Assembly.problems` listing what could not be assembled.
    """
    state = _State()
    for number, chunk in enumerate(chunks if isinstance(chunks, list) else [], start=1):
        data = chunk.get("data") if isinstance(chunk, dict) else None
        t = chunk.get("t") if isinstance(chunk, dict) else None
        if not isinstance(data, str):
            state.problem(f"chunk {number} has no text")
            continue
        if sse and data.strip() == "[DONE]":
            state.done = state.ended = True
            continue
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            state.garble(f"chunk {number} is not JSON: {data[:60]!r}")
            continue
        if not isinstance(obj, dict):
            state.garble(f"chunk {number} is not a JSON object")
            continue
        state.result.replied |= ("choices" in obj) if sse else ("message" in obj or "done" in obj)  # a chat chunk
        if obj.get("error") is not None:
            error = obj["error"]
            message = error.get("message") if isinstance(error, dict) else error
            state.result.error = message if isinstance(message, str) else json.dumps(error)
            continue
        had_token = (_sse_chunk if sse else _ndjson_chunk)(state, obj, number)
        if had_token and isinstance(t, (int, float)) and not isinstance(t, bool):
            state.token_times.append(float(t))
    return state.finish(sse=sse)


def rederive(chunks: list[dict[str, Any]], backend: str) -> Assembly:
    """Re-assemble stored chunks of a reply served by a backend of kind ``backend`` (``ollama`` streams NDJSON,
    ``openai`` and ``embedded`` server-sent events); see :func:`assemble`."""
    return assemble(chunks, sse=backend != "ollama")


def stored_stream(
    chunks: list[dict[str, Any]] | None, ttft_ms: float | None, decode_tps: float | None, backend: str
) -> dict[str, Any]:
    """The streaming fields of a :class:`Reply` rebuilt from a stored turn (``--cache``): its chunks and timings, and
    the problems re-derived from the chunks (:func:`rederive`; none when it was not streamed)."""
    problems = rederive(chunks, backend).problems if chunks is not None else []
    return {"stream_chunks": chunks, "stream_problems": problems, "ttft_ms": ttft_ms, "decode_tps": decode_tps}


def response_of(got: Assembly) -> dict[str, Any]:
    """An assembly as the classifier's ``response`` input (the :meth:`Reply.response_dict` shape, without refusal)."""
    return {
        "content": got.content, "tool_calls": got.tool_calls, "finish_reason": got.finish_reason,
        "usage": {"prompt_tokens": got.prompt_tokens, "completion_tokens": got.completion_tokens},
        "reasoning_content": got.reasoning,
    }  # fmt: skip


class _State:
    """What has been assembled so far."""

    def __init__(self) -> None:
        self.result = Assembly()
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.ollama_calls: list[Any] = []
        self.token_times: list[float] = []
        self.ended = False  # a finish_reason / done: true was seen
        self.done = False  # [DONE] was seen

    def problem(self, text: str) -> None:
        if len(self.result.problems) < 20:
            self.result.problems.append(text[:_MAX_PROBLEM_CHARS])

    def garble(self, text: str) -> None:
        self.result.garbled = self.result.garbled or text
        self.problem(text)

    def after_end(self, number: int, what: str) -> None:
        self.problem(f"chunk {number} carries {what} after the final chunk")

    def finish(self, *, sse: bool) -> Assembly:
        out = self.result
        out.content = "".join(self.content) if self.content else None
        out.reasoning = "".join(self.reasoning) if self.reasoning else None
        if sse and self.calls:
            out.tool_calls = [self.calls[i] for i in sorted(self.calls)]
            self._check_arguments(out)
        elif self.ollama_calls:
            out.tool_calls = list(self.ollama_calls)
        out.whole = self.ended or out.error is not None
        if not out.whole:
            self.problem("the stream ended without its final chunk")
        if self.token_times:
            out.ttft_ms = self.token_times[0]
            span_s = (self.token_times[-1] - self.token_times[0]) / 1000.0
            tokens = out.completion_tokens if out.completion_tokens else len(self.token_times)
            out.decode_tps = round((tokens - 1) / span_s, 3) if span_s > 0 and tokens > 1 else None
        return out

    def _check_arguments(self, out: Assembly) -> None:
        if out.finish_reason == "length":
            return  # cut at the token limit: truncated_by_length, not an assembly problem
        for index in sorted(self.calls):
            arguments = self.calls[index]["function"]["arguments"]
            try:
                json.loads(arguments)
            except (ValueError, RecursionError):
                self.problem(f"the arguments of call index {index} assemble to text that is not JSON: {arguments[-60:]!r}")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _sse_chunk(state: _State, obj: dict[str, Any], number: int) -> bool:
    """Fold one OpenAI-style chunk in; returns whether it carried a token (content, reasoning or a call piece)."""
    usage = obj.get("usage")
    if isinstance(usage, dict):
        state.result.prompt_tokens = usage.get("prompt_tokens")
        state.result.completion_tokens = usage.get("completion_tokens")
    state.result.final = obj
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        return False  # the usage-only chunk of stream_options.include_usage
    choice = _dict(choices[0])
    delta = _dict(choice.get("delta"))
    content = _text(delta.get("content"))
    reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
    calls = _list(delta.get("tool_calls"))
    carried = bool(content or reasoning or calls)
    if carried and (state.ended or state.done):
        state.after_end(number, "content" if content or reasoning else "a tool call")
    if content:
        state.content.append(content)
    if reasoning:
        state.reasoning.append(reasoning)
    for piece in calls:
        _call_piece(state, piece, number)
    reason = choice.get("finish_reason")
    if reason is not None:
        state.result.finish_reason = reason if isinstance(reason, str) else json.dumps(reason)
        state.ended = True
    return carried


def _call_piece(state: _State, piece: Any, number: int) -> None:
    """One ``tool_calls`` delta: open the call of its ``index`` or append to it."""
    if not isinstance(piece, dict):
        state.problem(f"chunk {number} has a tool-call delta that is not an object")
        return
    function = _dict(piece.get("function"))
    index = piece.get("index")
    if isinstance(index, bool) or not isinstance(index, int):
        index = len(state.calls) if (piece.get("id") or function.get("name")) else max(state.calls, default=0)
    name, arguments = _text(function.get("name")), function.get("arguments")
    call = state.calls.get(index)
    if call is not None and piece.get("id") and call["id"] and piece.get("id") != call["id"]:
        state.problem(f"chunk {number} gives tool-call index {index} a second id ({str(piece.get('id'))[:40]!r})")
    if call is None:
        if not (piece.get("id") or name):
            state.problem(f"chunk {number} has a delta for tool-call index {index}, which no delta opened")
            return
        call = {"id": piece.get("id"), "type": "function", "function": {"name": name or "", "arguments": ""}}
        state.calls[index] = call
    elif name and name != call["function"]["name"]:
        call["function"]["name"] += name
    if isinstance(arguments, str):
        call["function"]["arguments"] += arguments
    elif isinstance(arguments, dict):
        call["function"]["arguments"] += json.dumps(arguments, ensure_ascii=False)


def _ndjson_chunk(state: _State, obj: dict[str, Any], number: int) -> bool:
    """Fold one Ollama line in; returns whether it carried a token."""
    message = _dict(obj.get("message"))
    content, reasoning = _text(message.get("content")), _text(message.get("thinking"))
    calls = _list(message.get("tool_calls"))
    carried = bool(content or reasoning or calls)
    if carried and state.ended:
        state.after_end(number, "content" if content or reasoning else "a tool call")
    if content:
        state.content.append(content)
    if reasoning:
        state.reasoning.append(reasoning)
    state.ollama_calls.extend(calls)
    if obj.get("done") is True:
        state.ended = True
        state.result.final = obj
        reason = obj.get("done_reason")
        state.result.finish_reason = reason if isinstance(reason, str) else None
        state.result.prompt_tokens = obj.get("prompt_eval_count")
        state.result.completion_tokens = obj.get("eval_count")
    return carried


def reply_speed(body: Any) -> tuple[float | None, float | None]:
    """Time to first token and decode rate of a non-streamed reply, from the server's own timings.

    llama.cpp's server sends ``timings: {"prompt_ms", "predicted_per_second", ...}`` (``tools/server``); Ollama
    sends ``load_duration``, ``prompt_eval_duration`` and ``eval_duration`` in ns with ``eval_count``
    (``api/types.go``). The first token comes when the prompt is processed (and, for Ollama, the model loaded).

    Args:
        body: the reply's JSON body (any type).

    Returns:
        ``(ttft_ms, decode_tokens_per_s)``, each ``None`` when the server does not report it.
    """
    if not isinstance(body, dict):
        return None, None
    timings = body.get("timings")
    if isinstance(timings, dict):
        return _number(timings.get("prompt_ms")), _number(timings.get("predicted_per_second"))
    prompt_ns, load_ns = _number(body.get("prompt_eval_duration")), _number(body.get("load_duration")) or 0.0
    eval_ns, count = _number(body.get("eval_duration")), _number(body.get("eval_count"))
    ttft = round((prompt_ns + load_ns) / 1e6, 3) if prompt_ns is not None else None
    rate = round(count / (eval_ns / 1e9), 3) if eval_ns and count else None
    return ttft, rate


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    return float(value)
