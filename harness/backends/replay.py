"""Replay backend: answers from a cassette file instead of a model server.

A cassette is JSONL, one reply per line, in the shape of :meth:`Reply.response_dict`::

    {"content": str | null,
     "tool_calls": [{"function": {"name": str, "arguments": object | str}}] | null,
     "finish_reason": str,
     "usage": {"prompt_tokens": int, "completion_tokens": int},
     "reasoning_content": str,                     # optional: reasoning returned beside the content
     "server_rejection": {"server", "status", "error"}}  # optional: the server's parser refused the reply

Extra keys are allowed and ignored; a missing ``usage`` gives ``None`` token counts. Blank
lines are skipped. The whole file is loaded and validated when the backend is opened, so a
broken cassette fails before any run starts. Every run (:meth:`ReplayBackend.start_run`)
restarts at the first reply; the messages sent are ignored.

:class:`CassetteRecorder` writes replies from any backend in exactly this shape, so a
recorded cassette replays the same replies.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import IO, Any

from harness.backends.base import Backend, BackendIdentity, GenerateOptions, Reply
from harness.errors import CassetteExhausted, UsageError

__all__ = ["CassetteRecorder", "ReplayBackend", "load_cassette", "write_cassette_line"]


class ReplayBackend(Backend):
    """Replays the replies of a JSONL cassette in order.

    Example::

        with ReplayBackend("tests/cassettes/pass.jsonl") as backend:
            backend.start_run()
            first = backend.generate(messages, tools, GenerateOptions())

    Args:
        path: the cassette file.

    Raises:
        UsageError: the file is missing or unreadable, or a line is not a valid reply object.
    """

    kind = "replay"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.spec = f"replay:{path}"
        self.replies, self._digest = _load(self.path)
        self._identity = BackendIdentity(backend=self.kind, model=str(self.path), model_digest=f"sha256:{self._digest}")
        self._next = 0
        self._lock = threading.Lock()

    def start_run(self) -> None:
        """Rewind to the first reply."""
        with self._lock:
            self._next = 0

    def for_run(self) -> ReplayBackend:
        """A handle with its own cursor (at line 1) over the same loaded replies, for concurrent runs."""
        handle = copy.copy(self)
        handle._next = 0
        handle._lock = threading.Lock()
        return handle

    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
        """Return the next reply of the cassette (the arguments are ignored).

        Returns:
            The reply; ``raw`` is the line's JSON object, ``latency_ms`` the (tiny) time taken.

        Raises:
            CassetteExhausted: every reply of the cassette was already returned in this run.
        """
        start = time.perf_counter()
        with self._lock:
            index = self._next
            if index >= len(self.replies):
                raise CassetteExhausted(f"cassette exhausted: {self.path} has {len(self.replies)} replies")
            self._next += 1
        line = self.replies[index]
        usage = line.get("usage") or {}
        return Reply(
            content=line.get("content"),
            tool_calls=line.get("tool_calls"),
            finish_reason=line.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            latency_ms=(time.perf_counter() - start) * 1000.0,
            raw=line,
            identity=self.identity(),
            reasoning=line.get("reasoning_content"),
            rejection=line.get("server_rejection"),
        )

    def identity(self) -> BackendIdentity:
        """``replay`` backend, the cassette path as model, its SHA-256 as ``model_digest`` (made once: it is frozen)."""
        return self._identity


MAX_CASSETTE_BYTES = 1024**3
"""A cassette file larger than this (1 GiB) is refused before it is read."""
MAX_LINE_BYTES = 64 * 1024**2
"""A cassette line longer than this (64 MiB, newline included) is refused; no recorded reply comes near it."""


def load_cassette(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read and validate a cassette.

    Args:
        path: the JSONL cassette: a regular file of at most :data:`MAX_CASSETTE_BYTES`.

    Returns:
        One dict per non-blank line, in file order.

    Raises:
        UsageError: the file cannot be read, is not a regular file (a FIFO, a device such as
            ``/dev/zero``, a folder) or is too large, or a line (named by number) is longer than
            :data:`MAX_LINE_BYTES`, not UTF-8, or not a JSON object with the reply fields of the
            expected types.
    """
    return _load(Path(path))[0]


def _load(path: Path) -> tuple[list[dict[str, Any]], str]:
    """The cassette's replies and the SHA-256 of its bytes, read once (see :func:`load_cassette`)."""
    digest = hashlib.sha256()
    replies = []
    with _open_regular(path) as fh:
        for number, data in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(data) > MAX_LINE_BYTES:
                raise UsageError(
                    f"Cassette {path} line {number} is longer than {MAX_LINE_BYTES} bytes; each line must be one reply."
                )
            digest.update(data)
            try:
                line = data.decode("utf-8-sig" if number == 1 else "utf-8")  # an editor's byte-order mark is not a reply
            except UnicodeDecodeError as exc:
                raise UsageError(f"Cannot read cassette {path} ({exc}); check the replay: path.") from exc
            if line.strip():
                replies.append(_reply_object(path, number, line))
    return replies, digest.hexdigest()


def _open_regular(path: Path) -> IO[bytes]:
    """Open ``path`` for reading if it is a regular file of a sane size (never blocks on a FIFO).

    Raises:
        UsageError: it cannot be opened, is not a regular file, or is larger than :data:`MAX_CASSETTE_BYTES`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"Cannot read cassette {path} ({exc.strerror or exc}); check the replay: path.") from exc
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file (a FIFO, a device or a folder never ends or holds no replies)"
    elif info.st_size > MAX_CASSETTE_BYTES:
        problem = f"is larger than {MAX_CASSETTE_BYTES} bytes"
    if problem:
        os.close(fd)
        raise UsageError(f"Cassette {path} {problem}; give a recorded .jsonl file.")
    return os.fdopen(fd, "rb")


def _reply_object(path: Path, number: int, line: str) -> dict[str, Any]:
    """Line ``number`` of the cassette as a validated reply object.

    Raises:
        UsageError: it is not a JSON object with the reply fields of the expected types.
    """
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's JSON parser allows
        obj = None
    if not isinstance(obj, dict):
        raise UsageError(f"Cassette {path} line {number} is not a JSON object; each line must be one reply.")
    problem = _shape_problem(obj)
    if problem:
        raise UsageError(f"Cassette {path} line {number}: {problem}.")
    return obj


def write_cassette_line(fh: IO[str], reply: Reply) -> None:
    """Append one reply to an open cassette file as one JSON line.

    Args:
        fh: a text file opened for writing.
        reply: the reply to record; written as :meth:`Reply.response_dict`. Text that UTF-8
            cannot hold (a lone surrogate a server sent) is written as JSON ``\\u`` escapes, so
            the line reads back as exactly the reply.
    """
    line = json.dumps(reply.response_dict(), ensure_ascii=False, separators=(",", ":"))
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(reply.response_dict(), ensure_ascii=True, separators=(",", ":"))
    fh.write(line + "\n")


class CassetteRecorder:
    """Writes replies to a cassette file, one line each, flushed after every reply.

    Example::

        with CassetteRecorder(run_dir / "cassette.jsonl") as recorder:
            recorder.record(backend.generate(messages, tools, options))

    Args:
        path: the cassette to create (overwritten if it exists); parent folders are created.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("w", encoding="utf-8")
        self.count = 0

    def record(self, reply: Reply) -> None:
        """Append ``reply`` to the cassette."""
        write_cassette_line(self._fh, reply)
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        """Close the file."""
        self._fh.close()

    def __enter__(self) -> CassetteRecorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _shape_problem(obj: dict[str, Any]) -> str | None:
    """Describe the first field of a cassette line with a wrong type, or ``None``."""
    if obj.get("content") is not None and not isinstance(obj["content"], str):
        return "'content' must be a string or null"
    calls = obj.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list) or not all(isinstance(call, dict) for call in calls):
            return "'tool_calls' must be a list of objects or null"
    if obj.get("finish_reason") is not None and not isinstance(obj["finish_reason"], str):
        return "'finish_reason' must be a string or null"
    if obj.get("reasoning_content") is not None and not isinstance(obj["reasoning_content"], str):
        return "'reasoning_content' must be a string or null"
    rejected = obj.get("server_rejection")
    if rejected is not None and not (isinstance(rejected, dict) and isinstance(rejected.get("error"), str)):
        return "'server_rejection' must be an object with an 'error' string, or null"
    usage = obj.get("usage")
    if usage is not None:
        if not isinstance(usage, dict):
            return "'usage' must be an object"
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                return f"'usage.{key}' must be an integer"
    return None
