"""What the history tells the behaviour checks, and the checks that need little else: repeated
calls, truncation and sandbox escapes (narration, fabrication and the rest: :mod:`harness.classifier.behaviour`).

Each ``*_step`` function judges one behaviour of a reply and returns ``(modes, evidence)``.
The rules and their rationale are in docs/failure-modes.md.
"""

from __future__ import annotations

import functools
import hashlib
import json
import posixpath
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.classifier.content import analyse_content
from harness.classifier.types import (
    MAX_CANDIDATES,
    MAX_HISTORY_MESSAGES,
    MAX_HISTORY_TEXT,
    MAX_REPAIR_CHARS,
    MAX_SCAN_CHARS,
    PLAIN_JSON,
    UNPARSED_ARGUMENTS,
    BoundedMemo,
    ToolCall,
    content_key,
    get,
    is_listed,
    jsonable,
    short,
    text_of,
    unparsed_key,
)
from harness.classifier.validate import MAX_STRUCTURED_CALLS, pairs_in, structured_calls
from harness.tool_protocol import is_tool_result

__all__ = [
    "FILE_TOKEN",
    "History",
    "escape_step",
    "path_values",
    "repeat_step",
    "scan_history",
    "string_values",
    "tools_text",
    "truncation_step",
]

_FILE_EXTS = (
    "txt|md|markdown|rst|py|pyc|json|jsonl|csv|tsv|log|yaml|yml|toml|ini|cfg|conf|js|mjs|ts|tsx|jsx|html|htm"
    "|css|sh|bash|c|h|cc|cpp|hpp|go|rs|java|kt|rb|php|pl|xml|sql|db|sqlite|pdf|png|jpe?g|gif|svg|zip|tar|gz"
    "|tgz|bz2|xz|dat|out|env|lock|ipynb|doc|docx|xls|xlsx|ppt|pptx|bin|exe|dll|so|wasm|bak|tmp|swift|scala|r"
)
_WORD_RUN = re.compile(r"(?<![\w./\\-])[\w-]++\.[\w.-]*+")  # maximal runs that hold a dot
_FILE_NAME = re.compile(rf"([\w-][\w.-]*\.(?:{_FILE_EXTS}))[.-]*", re.I)


class _FileTokens:
    """File-name-like tokens ``stem.ext`` (common extensions): a run of word characters, dots and
    hyphens that ends in one, trailing dots and hyphens aside (``hello.txt.`` at a sentence's end).

    Each run is read once (a single regex with a look-ahead after every ``.ext`` rescanned long
    runs such as ``a.pya.py...`` to their end, quadratic in the run's length).
    """

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        """The tokens in ``text``; ``group(1)`` is the file name."""
        for run in _WORD_RUN.finditer(text):
            m = _FILE_NAME.fullmatch(text, run.start(), run.end())
            if m is not None:
                yield m


FILE_TOKEN = _FileTokens()
_PATH_KEY = re.compile(
    r"(?:^|_)(?:path|paths|file|files|filename|filenames|filepath|dir|dirs|directory|folder|dest|destination"
    r"|src|source|target|cwd|root|location)(?:$|_)",
    re.I,
)


_MEMO_KEY_CHARS = 4096
"""The longest text the two path memos below keep (1,024 entries each): a longer one is judged afresh, so the
memos hold at most about 8M characters whatever a model sends."""


def _short_memo(function: Callable[[str], bool], text: str) -> bool:
    """``function(text)``, through its ``lru_cache`` only when ``text`` is at most :data:`_MEMO_KEY_CHARS` long."""
    return function(text) if len(text) <= _MEMO_KEY_CHARS else function.__wrapped__(text)  # type: ignore[attr-defined]


@functools.lru_cache(maxsize=1024)
def _path_key(key: str) -> bool:
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key)
    return bool(_PATH_KEY.search(snake))


_DRIVE = re.compile(r"[A-Za-z]:")


@functools.lru_cache(maxsize=1024)
def _escapes_sandbox(path: str) -> bool:
    p = path.strip()
    if not p:
        return False
    if p.startswith(("/", "\\", "~")) or _DRIVE.match(p) or p.lower().startswith("file:"):
        return True
    norm = posixpath.normpath(p.replace("\\", "/"))
    return norm == ".." or norm.startswith("../")


def path_values(call: ToolCall) -> list[tuple[str, str]]:
    out = []
    for key, value in [*call.arguments.items(), *call.shown.items()]:  # a broken object's pairs read as shown
        if not _short_memo(_path_key, str(key)):
            continue
        if isinstance(value, str):
            out.append((key, value))
        elif isinstance(value, list):
            out.extend((key, v) for v in value[:100] if isinstance(v, str))
    return out


def string_values(value: Any, skip_paths: bool, depth: int = 0) -> list[str]:
    if depth > 8:
        return []
    if isinstance(value, str):
        return [value[:MAX_REPAIR_CHARS]]
    if isinstance(value, Mapping):
        out = []
        for k, v in list(value.items())[:200]:
            if skip_paths and depth == 0 and _short_memo(_path_key, str(k)):
                continue
            out.extend(string_values(v, skip_paths, depth + 1))
        return out
    if isinstance(value, list):
        out = []
        for v in value[:200]:
            out.extend(string_values(v, skip_paths, depth + 1))
        return out
    return []


_TOOLS_TEXT_ENTRIES = 64
_TOOLS_KEY_BYTES = 1 << 20
_MAX_TOOLS_TEXT_HELD = 8_000_000
_TOOLS_TEXT: BoundedMemo[bytes, str] = BoundedMemo(_TOOLS_TEXT_ENTRIES, _MAX_TOOLS_TEXT_HELD)
"""The tools-text memo: at most 64 texts, each keyed by at most 1 MiB of marshal bytes, and at most 8M key bytes plus
text characters in all (``_TOOLS_TEXT.size_held``: what it holds now)."""


def tools_text(tools: Any) -> str:
    """The offered tool definitions as JSON text (names a model may legitimately repeat).

    Memoised by content (the loop hands equal lists on every turn and every run): the key is :func:`content_key`
    (``marshal.dumps(tools, 4)``), which accepts only the exact built-in types (a ``str`` or ``dict`` subclass, a
    custom Mapping: no key, the text is computed each time); two values with one key are equal in every byte and
    type, and a list edited in place has another key. At most :data:`_TOOLS_TEXT_ENTRIES` entries, keys of at most
    :data:`_TOOLS_KEY_BYTES` bytes (longer ones are not kept), :data:`_MAX_TOOLS_TEXT_HELD` bytes and characters in all.
    """
    key = content_key(tools)
    if key is not None:
        hit = _TOOLS_TEXT.get(key)
        if hit is not None:
            return hit
    try:
        text = json.dumps(jsonable(tools), ensure_ascii=False)[:MAX_HISTORY_TEXT]
    except (TypeError, ValueError):
        text = ""
    if key is not None and len(key) <= _TOOLS_KEY_BYTES:
        _TOOLS_TEXT.keep(key, text, len(key) + len(text))
    return text


# --------------------------------------------------------------------------- history


@dataclass
class History:
    """What the run's history tells the heuristics.

    Attributes:
        known_parts: texts the model has seen or written (messages, earlier call arguments),
            within ``MAX_HISTORY_TEXT`` characters in all.
        earlier: canonical forms of every earlier call (structured, or recovered from content).
        tool_answered: some tool result is in the history.
        prompt_parts: the system and user messages that are not tool results.
        tool_results: the tool results' texts, oldest first.
        user_code: a user message holds code (a fence or code lines): claims about "the bug" may be about it.
    """

    known_parts: list[str] = field(default_factory=list)
    earlier: set[str] = field(default_factory=set)
    tool_answered: bool = False
    prompt_parts: list[str] = field(default_factory=list)
    tool_results: list[str] = field(default_factory=list)
    user_code: bool = False
    _known: str | None = field(default=None, repr=False, compare=False)

    def known(self, tools: Any) -> str:
        """``known_parts`` and the offered tools' text (:func:`tools_text`), joined and lower-cased: what the model
        has seen or written (computed once per classification; ``tools`` is the classification's own)."""
        if self._known is None:
            self._known = "\n".join([*self.known_parts, tools_text(tools)]).lower()
        return self._known


_USER_CODE = re.compile(r"```|^[ \t]*(?:def |class |function |import |#include)", re.M)
_JSON_ESCAPE = re.compile(r"\\u[0-9a-fA-F]{4}")


def _unescaped(text: str) -> str:
    """A message's text with JSON ``\\uXXXX`` escapes also written out, so ``caf\\u00e9.txt`` in a
    tool's JSON output explains ``café.txt`` in the reply (the original text is kept too)."""
    if not _JSON_ESCAPE.search(text[:MAX_REPAIR_CHARS]):
        return text
    decoded = _JSON_ESCAPE.sub(lambda m: chr(int(m.group()[2:], 16)), text[:MAX_REPAIR_CHARS])
    return f"{text}\n{decoded}"


@dataclass(frozen=True)
class _Read:
    """What one history message tells :class:`History`, before the text budget is applied.

    Attributes:
        text: the message's text.
        tool_result: it carries a tool's answer; ``prompt``: it is a system, user or developer message that does not.
        user_code: a user message holding code.
        keys: the repeat keys of an assistant message's structured calls whose arguments parsed.
        unparsed: how many of its structured calls have arguments no repair parsed (each gets a fresh key per
            classification, as :meth:`ToolCall.canonical` draws one).
        parts: those calls' arguments as JSON text (all of them, in order).
        content_calls: an assistant message with text and no structured call (its calls are recovered from the text).
        known: the text with JSON escapes also written out (:func:`_unescaped`), or ``""`` without text.
    """

    text: str
    tool_result: bool
    prompt: bool
    user_code: bool
    keys: tuple[str, ...]
    unparsed: int
    parts: tuple[str, ...]
    content_calls: bool
    known: str


def _read(message: Any) -> _Read:
    """What one OpenAI-shape message tells the history (anything that is not a Mapping tells nothing)."""
    role = get(message, "role")
    text = text_of(get(message, "content"))
    tool_result = is_tool_result(role, text)  # native tool messages, or prompt mode's <tool_response> user messages
    prompt = not tool_result and role in ("system", "user", "developer")
    user_code = prompt and role == "user" and _USER_CODE.search(text[:MAX_REPAIR_CHARS]) is not None
    hcalls = structured_calls(get(message, "tool_calls"))[0] if role == "assistant" else []
    keys = tuple(c.canonical() for c in hcalls if UNPARSED_ARGUMENTS not in c.errors)
    parts = tuple(PLAIN_JSON.encode(c.arguments) for c in hcalls)
    content_calls = role == "assistant" and not hcalls and bool(text)
    known = _unescaped(text) if text else ""
    return _Read(text, tool_result, prompt, user_code, keys, len(hcalls) - len(keys), parts, content_calls, known)


_MAX_READS = 4096
_MAX_READ_CHARS = 8_000_000
_READS: BoundedMemo[tuple[Any, ...], _Read] = BoundedMemo(_MAX_READS, _MAX_READ_CHARS)
"""Memo of :func:`_read` by :func:`_message_key` (the loop hands the whole history again on every turn). Bounded: cleared
when it holds :data:`_MAX_READS` messages or :data:`_MAX_READ_CHARS` characters of them. Its keys are tuples of strings,
so a message changed after it was read is read afresh; a hit holds what :func:`_read` gives (a test holds them equal)."""


def _message_key(message: Any) -> tuple[Any, ...] | None:
    """The strings that decide a plain message's :func:`_read`: role, content, and for an assistant message each
    structured call's name and argument string; None for any other shape (read without the memo)."""
    if type(message) is not dict:
        return None
    role, content = message.get("role"), message.get("content")
    if (role is not None and type(role) is not str) or (content is not None and type(content) is not str):
        return None
    if role != "assistant":
        return (role, content)
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return (role, content, None)
    if type(tool_calls) is not list or len(tool_calls) > MAX_STRUCTURED_CALLS:
        return None
    calls = []
    for item in tool_calls:
        fn = item.get("function") if type(item) is dict else None
        if type(fn) is not dict or type(fn.get("name")) is not str or type(fn.get("arguments")) is not str:
            return None
        calls.append((fn["name"], fn["arguments"]))
    return (role, content, tuple(calls))


def _remembered(message: Any) -> _Read:
    """:func:`_read` of ``message``, from the memo when its key was read before."""
    key = _message_key(message)
    if key is None:
        return _read(message)
    read = _READS.get(key)
    if read is None:
        read = _read(message)
        _READS.keep(key, read, len(read.text) + sum(map(len, read.parts)))
    return read


def scan_history(history: Any, offered: Mapping[str, Any], *, memo: bool = True) -> History:
    """Read the ``MAX_HISTORY_MESSAGES`` most recent OpenAI-shape messages (anything else counts as empty).

    ``memo`` False reads every message afresh instead of from the bounded memo of messages read before (same result).
    """
    past = History()
    messages = list(history)[-MAX_HISTORY_MESSAGES:] if is_listed(history) else []
    budget = MAX_HISTORY_TEXT
    known_parts, earlier = past.known_parts, past.earlier
    schemas_key: bytes | None = None
    for message in messages:
        if type(message) is not dict and not isinstance(message, Mapping):
            continue
        read = _remembered(message) if memo else _read(message)
        text = read.text
        if read.tool_result:
            past.tool_answered = True
            past.tool_results.append(text[:MAX_REPAIR_CHARS])
        elif read.prompt:
            past.prompt_parts.append(text[:MAX_REPAIR_CHARS])
            past.user_code = past.user_code or read.user_code
        if read.parts:
            earlier.update(read.keys)
            if read.unparsed:
                earlier.update(unparsed_key() for _ in range(read.unparsed))
            for part in read.parts:
                known_parts.append(part[:budget])
                budget -= len(part)
        elif read.content_calls:
            if schemas_key is None:
                schemas_key = schemas_digest(offered)
            earlier.update(history_content_calls(text, offered, schemas_key))
        if text and budget > 0:
            known_parts.append(read.known[:budget])
            budget -= len(read.known)
    return past


_CONTENT_CACHE: BoundedMemo[tuple[bytes, bytes], list[str]] = BoundedMemo(512)
_NO_KEY = b""


def schemas_digest(offered: Mapping[str, Any]) -> bytes:
    """A 16-byte digest of the offered schemas' :func:`content_key`, or ``b""`` when they have none (then no memo)."""
    key = content_key(dict(offered))
    return _NO_KEY if key is None else hashlib.blake2b(key, digest_size=16).digest()


def history_content_calls(text: str, offered: Mapping[str, Any], schemas: bytes | None = None) -> list[str]:
    """Canonical calls recovered from an earlier assistant message, memoised by the digest of ``text`` and
    ``schemas`` (:func:`schemas_digest` of ``offered``, made here when not given): the schemas, not only their names,
    since a parameter's declared type decides how a value written as text is read (``5`` as 5 or as "5")."""
    schemas = schemas_digest(offered) if schemas is None else schemas
    key = (hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest(), schemas)
    cached = _CONTENT_CACHE.get(key) if schemas else None
    if cached is None:
        result = analyse_content(text[:MAX_SCAN_CHARS], offered, tools_known=bool(offered))
        cached = [c.canonical() for c in result.calls]
        if schemas:
            _CONTENT_CACHE.keep(key, cached)
    return cached


# --------------------------------------------------------------------------- steps


def repeat_step(calls: list[ToolCall], past: History, keys: Sequence[str] | None = None) -> tuple[set[str], dict[str, Any]]:
    """``repeated_call``: a call whose canonical name and arguments equal an earlier call's (``keys``: the calls'
    :meth:`~ToolCall.canonical` keys when already drawn, in order)."""
    repeats = [key for key in (keys if keys is not None else [c.canonical() for c in calls]) if key in past.earlier]
    if not repeats:
        return set(), {}
    return {"repeated_call"}, {"repeated_call": sorted(set(repeats))}


def truncation_step(response: Any) -> tuple[set[str], dict[str, Any]]:
    """``truncated_by_length``: the server's ``finish_reason`` is ``length`` (or ``max_tokens``)."""
    finish = get(response, "finish_reason")
    if isinstance(finish, str) and finish.strip().lower() in ("length", "max_tokens"):
        return {"truncated_by_length"}, {}
    return set(), {}


def escape_step(calls: list[ToolCall], broken: Sequence[str] = ()) -> tuple[set[str], dict[str, Any]]:
    """``sandbox_escape_attempt``: path-like arguments that leave the sandbox (lexically); a call object that no repair
    parses (``broken``, its text) is read by the complete pairs it shows, as a broken argument string is."""
    escapes = []
    for call in calls:
        for key, value in path_values(call):
            if _short_memo(_escapes_sandbox, value):
                escapes.append({"tool": call.name, "argument": str(key), "path": short(value)})
    for text in broken[:MAX_CANDIDATES]:
        pairs = pairs_in(text)
        for key, value in pairs.items():
            if _short_memo(_path_key, key) and _short_memo(_escapes_sandbox, value):
                escapes.append({"tool": pairs.get("name", "?"), "argument": key, "path": short(value)})
    if not escapes:
        return set(), {}
    return {"sandbox_escape_attempt"}, {"sandbox_escape_attempt": escapes}
