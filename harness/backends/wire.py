"""Reading a reply's body off the wire within its deadline and size: whole bodies and streams.

:func:`bounded_reads` checks the size and the deadline at every read, so a server that trickles bytes or sends an
endless body outlasts neither (each read itself waits at most until the deadline: :mod:`harness.backends.deadline`);
:func:`read_whole` reads a whole body; :func:`read_stream` reads a stream into the raw chunks :mod:`harness.backends.streaming`
assembles (:class:`Streamed`), and says what a body that is no event stream is.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

import httpx

from harness.backends.server_words import error_detail
from harness.backends.streaming import chunk_lines
from harness.errors import BackendError, BackendResponseError, ServerConfigError

__all__ = ["Streamed", "bounded_reads", "read_stream", "read_whole"]

_Piece = TypeVar("_Piece", str, bytes)
_BODY_FRAMING = frozenset({b"content-encoding", b"content-length", b"transfer-encoding"})
_LINE_END = re.compile(r"\r\n|\r|\n")


class Streamed(httpx.Response):
    """A streamed success response, already read: its raw chunks (:func:`chunk_lines`) instead of a body."""

    def __init__(self, status_code: int, *, request: httpx.Request, chunks: list[dict[str, Any]]) -> None:
        super().__init__(status_code, content=b"", request=request)
        self.chunks = chunks


def read_stream(response: httpx.Response, deadline: float, started: float, *, sse: bool, limit: int) -> Streamed:
    """Read a streamed ``response`` to its end as raw chunks.

    Args:
        response: an open streamed success response.
        deadline: ``time.monotonic()`` by which the whole stream must have arrived.
        started: ``time.perf_counter()`` when the request was sent (chunk times count from it).
        sse: server-sent events rather than NDJSON.
        limit: the most characters of body text accepted.

    Raises:
        httpx.ReadTimeout: the stream did not end by ``deadline`` (the caller translates it).
        BackendResponseError: more than ``limit`` characters; or (``sse``) a body that is no event stream and no reply.
        ServerConfigError: (``sse``) one whole JSON reply instead of events: the server does not stream.
    """
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if sse and media == "application/json":  # no event can follow: read it whole, to say what it is
        raise _not_a_stream(response, b"".join(bounded_reads(response, response.iter_bytes(), deadline, limit)))
    chunks = list(chunk_lines(_timed_lines(response, deadline, limit), started, sse=sse))
    if sse and not chunks and media not in ("", "text/event-stream"):
        raise BackendResponseError(f"The server at {response.request.url} answered a streamed request with {media} "
                                   "and no event, not an event stream; check the URL and the server's log.", status_code=None)  # fmt: skip
    return Streamed(response.status_code, request=response.request, chunks=chunks)


def read_whole(response: httpx.Response, deadline: float, limit: int) -> httpx.Response:
    """The streamed ``response`` read to its end by ``deadline`` and at most ``limit`` bytes, as a plain response.

    Raises:
        httpx.ReadTimeout: the body did not end by ``deadline``.
        BackendResponseError: more than ``limit`` bytes.
    """
    chunks = list(bounded_reads(response, response.iter_bytes(), deadline, limit))
    decoded = [(k, v) for k, v in response.headers.raw if k.lower() not in _BODY_FRAMING]  # the chunks are decoded already
    return httpx.Response(response.status_code, headers=decoded, content=b"".join(chunks), request=response.request)


def _not_a_stream(response: httpx.Response, body: bytes) -> BackendError:
    """What a JSON body answering a streamed request is: a whole reply (the server does not stream: a setting), else
    a failure of the server, in its words (an error object's message, or the body's start)."""
    where = f"The server at {response.request.url} answered a streamed request with"
    try:
        whole = isinstance(json.loads(body)["choices"], list)
    except (ValueError, RecursionError, TypeError, KeyError, IndexError):
        whole = False
    if whole:
        return ServerConfigError(f"{where} one whole JSON reply, not an event stream: it does not stream; run with --stream off.")
    detail = error_detail(httpx.Response(response.status_code, content=body)) if body.strip() else "no body"  # decoded
    return BackendResponseError(f"{where} JSON that is not a reply ({detail}), not an event stream; check the server's log.",
                                status_code=None)  # fmt: skip


def bounded_reads(response: httpx.Response, pieces: Iterable[_Piece], deadline: float, limit: int) -> Iterator[_Piece]:
    """``pieces`` of ``response``'s body (its ``iter_bytes()`` or ``iter_text()``), checking the total size and the
    deadline at every read, so a server that trickles bytes or sends an endless body outlasts neither.

    Raises:
        BackendResponseError: more than ``limit`` bytes or characters.
        httpx.ReadTimeout: ``time.monotonic()`` passed ``deadline`` before the body ended.
    """
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > limit:
            raise BackendResponseError(
                f"The server at {response.request.url} sent more than {limit // 2**20} MiB for one reply; "
                "check the URL and the server's log.",
                status_code=response.status_code,
            )
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("the whole reply did not arrive in time", request=response.request)
        yield piece


def _timed_lines(response: httpx.Response, deadline: float, limit: int) -> Iterator[str]:
    """The body's lines (split at ``\r\n``, ``\n`` or ``\r``, as server-sent events allow), checking the deadline
    and the size at every read (:func:`bounded_reads`)."""
    pending: list[str] = []  # the pieces of the unfinished line (kept apart: joining each read would be quadratic)
    for text in bounded_reads(response, response.iter_text(), deadline, limit):
        if "\n" not in text and "\r" not in text:
            pending.append(text)
            continue
        buffer = "".join(pending) + text
        lines = _LINE_END.split(buffer)
        pending = [lines.pop()]
        if buffer.endswith("\r"):  # perhaps the first half of a \r\n split between two reads
            pending = [lines.pop() + "\r"]
        yield from lines
    if last := "".join(pending).removesuffix("\r"):
        yield last
