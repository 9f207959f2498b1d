"""Behaviour heuristics: repeated calls, fabricated tool results, narration, empty replies,
truncation and sandbox escapes.

Each ``*_step`` function judges one behaviour of a reply from its calls, its analysed content
and the run's history, and returns ``(modes, evidence)``. The rules and their rationale are in
docs/failure-modes.md.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.classifier.content import ContentResult, history_content_calls
from harness.classifier.types import (
    MAX_CANDIDATES,
    MAX_HISTORY_MESSAGES,
    MAX_HISTORY_TEXT,
    MAX_REPAIR_CHARS,
    ToolCall,
    get,
    jsonable,
    short,
    text_of,
)
from harness.classifier.validate import structured_calls
from harness.tool_protocol import is_tool_result

__all__ = [
    "History",
    "escape_step",
    "fabrication_step",
    "no_call_step",
    "repeat_step",
    "scan_history",
    "truncation_step",
]

_NARRATION = re.compile(
    r"(?:\bI(?:'ll|’ll| will| shall| am going to|'m going to|’m going to| need to| should)|\blet me|\blet's|\blet’s"
    r"|\bnow,? I(?:'ll|’ll| will)?|\bnext,? I(?:'ll|’ll| will)?|\bfirst,? I(?:'ll|’ll| will)?)"
    r"\s+(?:now\s+|first\s+|then\s+|next\s+|quickly\s+|go ahead and\s+|proceed to\s+|start by\s+|begin by\s+)?"
    r"(?:create|write|make|list|read|run|execute|call|use|check|open|save|generate|look|search|update|edit"
    r"|delete|remove|add|start|fetch|get|build|test|install|copy|move|rename|inspect|examine|view|scan|find"
    r"|append|modify|produce|compile|put|print|show|invoke|draft|prepare|record|store|do\b)",
    re.I,
)
_FABRICATED_MARKUP = re.compile(
    r"<\s*(?:tool_response|tool_result|tool_output|function_results?|function_response|observation)\b[^>]*>"
    r"|<\|im_start\|>\s*tool|<\|start_header_id\|>\s*ipython|^\s*(?:Observation|Tool (?:output|result|response))\s*:",
    re.I | re.M,
)
_FILE_EXTS = (
    "txt|md|markdown|rst|py|pyc|json|jsonl|csv|tsv|log|yaml|yml|toml|ini|cfg|conf|js|mjs|ts|tsx|jsx|html|htm"
    "|css|sh|bash|c|h|cc|cpp|hpp|go|rs|java|kt|rb|php|pl|xml|sql|db|sqlite|pdf|png|jpe?g|gif|svg|zip|tar|gz"
    "|tgz|bz2|xz|dat|out|env|lock|ipynb|doc|docx|xls|xlsx|ppt|pptx|bin|exe|dll|so|wasm|bak|tmp|swift|scala|r"
)
_FILE_TOKEN = re.compile(rf"(?<![\w./\\-])([\w-][\w.-]*\.(?:{_FILE_EXTS}))(?![\w.]*\w)", re.I)
_PATH_KEY = re.compile(
    r"(?:^|_)(?:path|paths|file|files|filename|filenames|filepath|dir|dirs|directory|folder|dest|destination"
    r"|src|source|target|cwd|root|location)(?:$|_)",
    re.I,
)


def _path_key(key: str) -> bool:
    snake = re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", key)
    return bool(_PATH_KEY.search(snake))


def _escapes_sandbox(path: str) -> bool:
    p = path.strip()
    if not p:
        return False
    if p.startswith(("/", "\\", "~")) or re.match(r"[A-Za-z]:", p) or p.lower().startswith("file:"):
        return True
    norm = posixpath.normpath(p.replace("\\", "/"))
    return norm == ".." or norm.startswith("../")


def _path_values(call: ToolCall) -> list[tuple[str, str]]:
    out = []
    for key, value in call.arguments.items():
        if not _path_key(str(key)):
            continue
        if isinstance(value, str):
            out.append((key, value))
        elif isinstance(value, list):
            out.extend((key, v) for v in value[:100] if isinstance(v, str))
    return out


def _string_values(value: Any, skip_paths: bool, depth: int = 0) -> list[str]:
    if depth > 8:
        return []
    if isinstance(value, str):
        return [value[:MAX_REPAIR_CHARS]]
    if isinstance(value, Mapping):
        out = []
        for k, v in list(value.items())[:200]:
            if skip_paths and depth == 0 and _path_key(str(k)):
                continue
            out.extend(_string_values(v, skip_paths, depth + 1))
        return out
    if isinstance(value, list):
        out = []
        for v in value[:200]:
            out.extend(_string_values(v, skip_paths, depth + 1))
        return out
    return []


def _coerce_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_TOOLS_TEXT: dict[int, tuple[Any, str]] = {}


def _tools_text(tools: Any) -> str:
    """The offered tool definitions as JSON text (names a model may legitimately repeat).

    Memoised by object identity (the loop passes the same list on every turn of a run); the
    cached object is kept alongside, so a recycled id can never return another list's text.
    """
    hit = _TOOLS_TEXT.get(id(tools))
    if hit is not None and hit[0] is tools:
        return hit[1]
    try:
        text = json.dumps(jsonable(tools), ensure_ascii=False)[:MAX_HISTORY_TEXT]
    except (TypeError, ValueError):
        text = ""
    if len(_TOOLS_TEXT) >= 64:
        _TOOLS_TEXT.clear()
    _TOOLS_TEXT[id(tools)] = (tools, text)
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
    """

    known_parts: list[str] = field(default_factory=list)
    earlier: set[str] = field(default_factory=set)
    tool_answered: bool = False


def scan_history(history: Any, offered: Mapping[str, Any]) -> History:
    """Read the ``MAX_HISTORY_MESSAGES`` most recent OpenAI-shape messages (anything else counts as empty)."""
    past = History()
    messages = (
        list(history)[-MAX_HISTORY_MESSAGES:] if isinstance(history, Sequence) and not isinstance(history, (str, bytes)) else []
    )
    budget = MAX_HISTORY_TEXT
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = get(message, "role")
        text = text_of(get(message, "content"))
        if is_tool_result(role, text):
            past.tool_answered = True  # native tool messages, or prompt mode's <tool_response> user messages
        if role == "assistant":
            hcalls, _ = structured_calls(get(message, "tool_calls"))
            if hcalls:
                past.earlier.update(c.canonical() for c in hcalls)
                for c in hcalls:
                    part = json.dumps(c.arguments, ensure_ascii=False, default=str)
                    past.known_parts.append(part[:budget])
                    budget -= len(part)
            elif text:
                past.earlier.update(history_content_calls(text, offered))
        if text and budget > 0:
            past.known_parts.append(text[:budget])
            budget -= len(text)
    return past


# --------------------------------------------------------------------------- steps


def repeat_step(calls: list[ToolCall], past: History) -> tuple[set[str], dict[str, Any]]:
    """``repeated_call``: a call whose canonical name and arguments equal an earlier call's."""
    repeats = [c.canonical() for c in calls if c.canonical() in past.earlier]
    if not repeats:
        return set(), {}
    return {"repeated_call"}, {"repeated_call": sorted(set(repeats))}


def fabrication_step(content: ContentResult, calls: list[ToolCall], past: History, tools: Any) -> tuple[set[str], dict[str, Any]]:
    """``fabricated_tool_result``: tool-result markup, or (once a tool answered) file names nobody gave.

    Evidence is the list of the markup and the unexplained ``stem.ext`` tokens.
    """
    fabricated: list[str] = []
    markup = _FABRICATED_MARKUP.search(content.visible)
    if markup:
        fabricated.append(short(markup.group().strip()))
    if past.tool_answered:
        known = "\n".join([*past.known_parts, _tools_text(tools)]).lower()
        own_paths = set()
        for call in calls:
            for _key, value in _path_values(call):
                own_paths.add(posixpath.basename(value.replace("\\", "/")).lower())
        texts = [content.prose]
        for call in calls:
            texts.extend(_string_values(call.arguments, skip_paths=True))
        seen = set()
        for text in texts:
            for m in _FILE_TOKEN.finditer(text[:MAX_REPAIR_CHARS]):
                token = m.group(1).lower()
                if token in seen or token in own_paths or token in known:
                    continue
                seen.add(token)
                fabricated.append(m.group(1))
                if len(fabricated) >= MAX_CANDIDATES:
                    break
    if not fabricated:
        return set(), {}
    return {"fabricated_tool_result"}, {"fabricated_tool_result": fabricated}


def no_call_step(structured: list[ToolCall], content: ContentResult, response: Any) -> tuple[set[str], dict[str, Any]]:
    """``empty_response`` (no visible text) or ``narration_without_call`` (an announcing cue or a
    shell block), when the reply attempts no call at all."""
    modes: set[str] = set()
    evidence: dict[str, Any] = {}
    no_attempt = not structured and content.attempts == 0
    visible = content.visible.strip()
    if no_attempt and not visible:
        modes.add("empty_response")
        usage = get(response, "usage")
        evidence["empty_response"] = {"completion_tokens": _coerce_int(get(usage, "completion_tokens"))}
    if no_attempt and visible:
        cue = _NARRATION.search(content.prose)
        if cue or content.shell_block:
            modes.add("narration_without_call")
            evidence["narration_without_call"] = {"cue": short(cue.group()) if cue else "shell block"}
    return modes, evidence


def truncation_step(response: Any) -> tuple[set[str], dict[str, Any]]:
    """``truncated_by_length``: the server's ``finish_reason`` is ``length`` (or ``max_tokens``)."""
    finish = get(response, "finish_reason")
    if isinstance(finish, str) and finish.strip().lower() in ("length", "max_tokens"):
        return {"truncated_by_length"}, {}
    return set(), {}


def escape_step(calls: list[ToolCall]) -> tuple[set[str], dict[str, Any]]:
    """``sandbox_escape_attempt``: path-like arguments that leave the sandbox (lexically)."""
    escapes = []
    for call in calls:
        for key, value in _path_values(call):
            if _escapes_sandbox(value):
                escapes.append({"tool": call.name, "argument": str(key), "path": short(value)})
    if not escapes:
        return set(), {}
    return {"sandbox_escape_attempt"}, {"sandbox_escape_attempt": escapes}
