"""Classify one assistant reply: which tool calls can be recovered, which failure modes it shows.

Pure module: no I/O, no clock, no imports from the loop, ledger or backends. :func:`classify`
runs on every turn of the agent loop and behind ``harness classify``; it never raises.

Two passes
----------
1. **Structured**: the server's own ``tool_calls`` (OpenAI ``{"id", "type", "function":
   {"name", "arguments": "<json string>"}}``, Ollama ``{"function": {"name", "arguments":
   {...}}}``, cassettes with either) are normalized into :class:`ToolCall` (``source =
   "structured"``). A JSON *string* of arguments is the OpenAI norm, not a failure; a string
   that decodes to another JSON string (double encoding) is ``stringified_arguments``.
2. **Lenient recovery** from ``content``, in the fixed order of :data:`RECOVERY_STEPS`:

   ``strip_reasoning``  drop ``<think>``/``<thinking>``/``<reasoning>``/``<thought>`` blocks,
                        unclosed ones (to the end) and an orphan closing tag (everything before
                        it, the chat template having opened the block). Produces no call.
   ``tagged``           wrapper regions: ``<tool_call>``, ``<tool_calls>``, ``<tools>``,
                        ``<function>``, ``<function-call>``, ``<json>``, ``<call>``, markers
                        ``[TOOL_CALLS]``, ``<|python_tag|>``, ``<|tool_call|>``; unclosed
                        (to the next opener or the end), mismatched and orphan closing tags.
   ``fenced``           Markdown fences (backticks or tildes, with or without a language,
                        unclosed to the end).
   ``json_document``    the remaining text is one JSON object or array.
   ``json_lines``       a call object alone on its line.
   ``brace_scan``       balanced ``{...}`` anywhere in prose (string-aware, iterative).
   ``python_literal``   ``ast.literal_eval`` of a single-quoted / ``True``-``None`` dict.
   ``pythonic``         ``name(arg=...)`` parsed with ``ast``: offered tool names anywhere
                        (in prose only with arguments and not after "called"/"used"...);
                        another plain name only when the keyword-only call is the whole
                        payload (so code samples and prose like ``print(x)`` stay prose).
   ``xml_parameters``   ``<function=name><parameter=k>v</parameter></function>`` and
                        ``<invoke name="..."><parameter name="k">v</parameter></invoke>``.
   ``repair``           our own narrow JSON repair: close unclosed strings/brackets, drop
                        trailing commas, quote bare keys, single quotes to double quotes,
                        ``True/False/None``; a truncated tail is cut back to the last comma.

   Payloads found inside a tag or a fence keep the wrapper's step as ``source``; in bare text
   the step that parsed the object is the source. ``recovered_by`` is the earliest step (in
   :data:`RECOVERY_STEPS` order) that produced a call.

   Why our own repair and not the ``json-repair`` package: labels must be reproducible under
   :data:`CLASSIFIER_VERSION` (a dependency's heuristics change between its releases); that
   package "repairs" almost anything -- pseudo-code such as ``"a" + "\\n".join(x)`` or prose
   -- into an object, which would erase the line between ``repaired_json`` and
   ``invalid_json``; and it took ~23 s on a 1 MB unclosed string and raised RecursionError on
   deep nesting. The defects we repair are exactly those the ``repaired_json`` mode names.

Call object shapes accepted: ``{"name", "arguments"}`` (standard); nonstandard:
``{"name", "parameters"|"args"|"params"|"input"}``, ``{"tool"|"tool_name"|"function"|
"function_name", "params"|"parameters"|"arguments"|...}``, ``{"action", "action_input"}``,
``{"function": {"name", "arguments"}}`` (also with ``"type": "function"``), ``{"tool_calls":
[...]}``, the short form ``{"<offered tool>": {...args}}``, and ReAct text ``Action: name`` /
``Action Input: {...}`` (the action/action_input shape written as lines). A ``{"name": ...}`` object with
no argument key counts only when the name is an offered tool (``{"name": "Alice"}`` is data).

Caps (all work is bounded; nothing recurses on input structure)
-----------------------------------------------------------------
* :data:`MAX_SCAN_CHARS` of content are analysed; the rest is ignored
  (``details["content_truncated_for_analysis"]``).
* :data:`MAX_CANDIDATES` brace candidates and :data:`MAX_REGIONS` tag regions per text.
* :data:`MAX_DEPTH` bracket nesting: deeper candidates are not parsed (``json``/``ast``
  recurse) and count as ``invalid_json`` when call-like.
* :data:`MAX_REPAIR_CHARS` per candidate for the Python-level repair, literal_eval and
  pseudo-code scan; :data:`MAX_PYTHONIC_CHARS` per pythonic call.
* :data:`MAX_HISTORY_MESSAGES` most recent history messages, :data:`MAX_HISTORY_TEXT`
  characters of history text for the fabrication check.

Heuristics and their rationale
------------------------------
* ``mixed_prose``: after removing reasoning, wrapper regions, fences and call spans, some
  word of two or more letters (any script) remains.
* ``raw_json_in_content`` fires for call objects (parsed or call-like but broken) in bare
  text only; inside a tag or fence the tag/fence mode describes the envelope.
* Wrappers other than ``<tool_call>`` and the markers count only when their region holds a
  call or a call-like object, so HTML-ish prose does not fire.
* ``invalid_json`` needs a *call-like* object: a name key (``name``, ``tool``, ``function``,
  ``action``) plus an argument key or an offered tool name; JSON data in prose is ignored.
* ``pseudo_code_in_arguments`` is looked for only in objects strict JSON rejected, on a
  skeleton with string literals blanked: ``+`` next to a string or identifier, ``ident(``
  calls (``os.path.join(``, ``"\\n".join(``), backticks, ``f"..."``, bare identifiers as
  values. Code *inside* a JSON string is file content, not pseudo-code.
* ``multiple_calls`` counts structured calls plus content call objects (broken ones too)
  that do not merely repeat a structured call.
* ``unknown_tool`` is judged only when tools are offered; the nearest name comes from
  :func:`difflib.get_close_matches` (case-insensitive match first).
* ``schema_violation``: the validator of the schema's ``$schema`` (default Draft 2020-12),
  plus arguments absent from ``properties`` (and ``patternProperties``) even when the schema
  does not set ``additionalProperties: false``.
* ``repeated_call``: canonical ``name + sorted-key arguments`` equal to a call in history
  (structured ``tool_calls``, or calls recovered from an assistant message without them).
* ``fabricated_tool_result``: (a) tool-result markup written by the model (``<tool_response>``,
  ``<tool_result>``, ``<tool_output>``, ``<function_results>``, ``<|im_start|>tool``, a line
  starting ``Observation:`` or ``Tool output:``); (b) only once some tool has answered in
  history: file-name-like tokens ``stem.ext`` (common extensions) in call argument values
  (path arguments excluded) or reply text that appear nowhere in the prompt, tool results,
  tool definitions or earlier calls, and are not the basename of a path argument of this
  reply. Catches ``hello.txt`` copied as ``echo.txt``.
* ``narration_without_call``: no call of any kind and either an announcing cue ("I will",
  "I'll", "Let me", "Now I'll", "Next, I", "I'm going to", "I need to" followed by an
  action verb) or a shell block (shell-language fence, ``$ cmd`` line, a fence starting with
  a common command). Past-tense reports ("I created report.txt") have no cue.
* ``sandbox_escape_attempt``: string values of path-like argument keys (``path``, ``file``,
  ``dir``, ``dest``, ``src``, ``target``, ``cwd``...) that are absolute, start with ``~``, a
  drive letter or a backslash, or whose normalized form climbs above ``.``. Lexical only.
* ``empty_response``: no visible text (reasoning stripped) and no call; the completion-token
  count goes to ``details`` because some servers drop a reply they failed to parse.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import json
import math
import posixpath
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema

__all__ = [
    "CLASSIFIER_VERSION",
    "Classification",
    "FAILURE_MODES",
    "MAX_CANDIDATES",
    "MAX_DEPTH",
    "MAX_HISTORY_MESSAGES",
    "MAX_HISTORY_TEXT",
    "MAX_PYTHONIC_CHARS",
    "MAX_REGIONS",
    "MAX_REPAIR_CHARS",
    "MAX_SCAN_CHARS",
    "PARSER_POLICIES",
    "RECOVERY_STEPS",
    "ToolCall",
    "classify",
    "classify_document",
]

#: Bump whenever any label for some input can change; stored with every label set.
CLASSIFIER_VERSION = "1.0.4"

#: Canonical failure modes, in canonical order: name -> one-line definition.
FAILURE_MODES: dict[str, str] = {
    # envelope
    "raw_json_in_content": "a call object written as bare JSON text in the content",
    "code_fence": "a call inside a Markdown code fence, with or without a language",
    "mixed_prose": "natural-language text around a call written in the content",
    "tool_call_tags_in_content": "<tool_call> markup left in the content",
    "wrong_wrapper_tag": "another wrapper or marker (<tools>, <function>, <json>, [TOOL_CALLS], "
    "<|python_tag|>...), or unclosed / mismatched tags",
    "foreign_call_syntax": "a call that is not a JSON object: pythonic name(arg=...) or XML-style parameters",
    "multiple_calls": "more than one call in one reply",
    # payload
    "invalid_json": "a call-like object that no repair makes parseable",
    "pseudo_code_in_arguments": "argument values written as code: + concatenation, function calls, "
    "template literals, f-strings, bare identifiers",
    "repaired_json": "a call parseable only after repair (missing closing braces, trailing commas, "
    "single-quoted Python dicts)",
    "stringified_arguments": "arguments given as a JSON string instead of an object (or double-encoded)",
    "nonstandard_keys": "a call object with other keys than name/arguments (parameters, tool/params, "
    "action/action_input, short form)",
    # validation
    "unknown_tool": "a call to a tool that was not offered (nearest offered name in details)",
    "schema_violation": "arguments break the tool's JSON Schema: missing required, wrong type, unexpected argument",
    # behaviour
    "repeated_call": "the same name and canonical arguments as an earlier call in the run",
    "fabricated_tool_result": "the reply asserts tool output no tool returned (tool-response markup, "
    "or names that appear in no tool result or prompt)",
    "narration_without_call": "no call while the text announces or shows an action instead of taking it",
    "empty_response": "no content and no call",
    "truncated_by_length": "the server stopped the reply at the token limit (finish_reason length)",
    "reasoning_leak": "<think>-style reasoning blocks left in the content",
    "sandbox_escape_attempt": "a path argument outside the sandbox (absolute, ~, or climbing above . via ..)",
}

#: The fixed, documented order of lenient recovery steps (see the module docstring).
RECOVERY_STEPS: tuple[str, ...] = (
    "strip_reasoning",
    "tagged",
    "fenced",
    "json_document",
    "json_lines",
    "brace_scan",
    "python_literal",
    "pythonic",
    "xml_parameters",
    "repair",
)

#: Parser policies accepted by :meth:`Classification.calls`.
PARSER_POLICIES: tuple[str, ...] = ("strict", "lenient")

MAX_SCAN_CHARS = 262_144
MAX_CANDIDATES = 32
MAX_REGIONS = 32
MAX_DEPTH = 64
MAX_REPAIR_CHARS = 65_536
MAX_PYTHONIC_CHARS = 4_096
MAX_HISTORY_MESSAGES = 256
MAX_HISTORY_TEXT = 2_000_000

_MAX_DETAIL_CHARS = 300
_MAX_VALIDATION_ERRORS = 10


# --------------------------------------------------------------------------- public types


@dataclass
class ToolCall:
    """One tool call, structured or recovered from content.

    Attributes:
        name: the tool name as written ("" when the server gave none).
        arguments: parsed arguments, JSON-ready; ``{}`` when unparseable.
        source: ``"structured"`` or the recovery step that found it (a :data:`RECOVERY_STEPS`
            member other than ``strip_reasoning``).
        id: the server's call id for structured calls, else ``None``.
        valid: the name is offered (when tools are offered) and the arguments parsed and
            pass the tool's JSON Schema.
        errors: validation messages, each at most a few hundred characters.
    """

    name: str
    arguments: dict
    source: str
    id: str | None = None
    valid: bool = True
    errors: list[str] = field(default_factory=list)

    def canonical(self) -> str:
        """Return canonical JSON of name and arguments (sorted keys) for repeat detection."""
        return _canonical(self.name, self.arguments)

    def to_dict(self) -> dict[str, Any]:
        """Return the call as a JSON-ready dict with every attribute."""
        return {
            "name": self.name,
            "arguments": self.arguments,
            "source": self.source,
            "id": self.id,
            "valid": self.valid,
            "errors": list(self.errors),
        }


@dataclass
class Classification:
    """The labels and calls of one reply.

    Attributes:
        failure_modes: canonical names from :data:`FAILURE_MODES`, canonical order, no duplicates.
        structured_calls: pass 1, the server's own ``tool_calls``.
        recovered_calls: pass 2, calls recovered from content (always computed).
        recovered_by: the first :data:`RECOVERY_STEPS` step that produced a call, or ``None``.
        details: JSON-serializable evidence keyed by failure mode, e.g.
            ``{"unknown_tool": {"lst_files": "list_files"}, "schema_violation": [{"tool",
            "message"}], "fabricated_tool_result": [...], "empty_response":
            {"completion_tokens": 40}}``.
        classifier_version: :data:`CLASSIFIER_VERSION` at classification time.

    Example::

        c = classify({"content": '{"name": "list_files", "arguments": {"path": "."}}'}, tools=tools)
        c.failure_modes            # ["raw_json_in_content"]
        c.calls("lenient")[0].name # "list_files"
    """

    failure_modes: list[str]
    structured_calls: list[ToolCall]
    recovered_calls: list[ToolCall]
    recovered_by: str | None
    details: dict
    classifier_version: str = CLASSIFIER_VERSION

    def calls(self, parser: str) -> list[ToolCall]:
        """Return the calls a parser policy acts on.

        Args:
            parser: ``"strict"`` (structured calls only) or ``"lenient"`` (structured calls if
                any, else recovered calls).

        Returns:
            The list of calls (may be empty).

        Raises:
            ValueError: ``parser`` is not in :data:`PARSER_POLICIES`.
        """
        if parser == "strict":
            return list(self.structured_calls)
        if parser == "lenient":
            return list(self.structured_calls or self.recovered_calls)
        raise ValueError(f"unknown parser policy {parser!r}; expected one of {', '.join(PARSER_POLICIES)}")

    def to_dict(self) -> dict[str, Any]:
        """Return the classification as a JSON-ready dict (calls as :meth:`ToolCall.to_dict`)."""
        return {
            "failure_modes": list(self.failure_modes),
            "structured_calls": [c.to_dict() for c in self.structured_calls],
            "recovered_calls": [c.to_dict() for c in self.recovered_calls],
            "recovered_by": self.recovered_by,
            "details": self.details,
            "classifier_version": self.classifier_version,
        }


# --------------------------------------------------------------------------- small helpers


def _short(value: Any, limit: int = _MAX_DETAIL_CHARS) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Return a JSON-ready copy of ``value`` (depth-capped, so cycles and deep data are safe)."""
    if depth > MAX_DEPTH:
        return "..."
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in list(value.items())[:1000]:
            out[k if isinstance(k, str) else _short(k)] = _jsonable(v, depth + 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)[:10_000]
        if isinstance(value, (set, frozenset)):
            items.sort(key=repr)
        return [_jsonable(v, depth + 1) for v in items]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return _short(value)


def _canonical(name: str, arguments: Any) -> str:
    return json.dumps({"name": name, "arguments": arguments}, sort_keys=True, ensure_ascii=False, default=str)


def _text_of(content: Any) -> str:
    """Content as text: a str, or the text parts of an OpenAI content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content[:1000]:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


def _get(mapping: Any, key: str) -> Any:
    if isinstance(mapping, Mapping):
        try:
            return mapping.get(key)
        except Exception:  # noqa: BLE001 - a hostile Mapping must not break classification
            return None
    return None


def _string_end(text: str, start: int, quote: str, allow_newline: bool = True) -> int:
    """Index of the quote closing the string opened at ``start``, or -1 (backslash-aware, linear)."""
    j = start + 1
    while True:
        k = text.find(quote, j)
        if k < 0:
            return -1
        if not allow_newline:
            nl = text.find("\n", j, k)
            if nl >= 0:
                return -1
        b = k - 1
        n = 0
        while b >= j and text[b] == "\\":
            n += 1
            b -= 1
        if n % 2 == 0:
            return k
        j = k + 1


# --------------------------------------------------------------------------- JSON parsing


_FAIL = object()
_SCAN_TOKEN = re.compile(r"[{}\[\]\"']")


def _scan_balanced(text: str, start: int, limit: int) -> tuple[int, bool, int]:
    """Scan a bracketed value starting at ``text[start]`` (``{`` or ``[`` or ``(``-free).

    Returns:
        ``(end, closed, max_depth)``: ``end`` is one past the closing bracket (or ``limit``
        when unclosed).
    """
    depth = 0
    max_depth = 0
    i = start
    while i < limit:
        m = _SCAN_TOKEN.search(text, i, limit)
        if m is None:
            return limit, False, max_depth
        ch = m.group()
        pos = m.start()
        if ch == '"' or ch == "'":
            end = _string_end(text, pos, ch, allow_newline=(ch == '"'))
            if end < 0 or end >= limit:
                if ch == '"':
                    return limit, False, max_depth
                i = pos + 1  # a lone apostrophe is just a character
                continue
            i = end + 1
            continue
        if ch in "{[":
            depth += 1
            max_depth = max(max_depth, depth)
        else:
            depth -= 1
            if depth <= 0:
                return pos + 1, True, max_depth
        i = pos + 1
    return limit, False, max_depth


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError, MemoryError):
        return _FAIL


def _literal(text: str) -> Any:
    if len(text) > MAX_REPAIR_CHARS:
        return _FAIL
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _FAIL
    if not isinstance(value, (dict, list)):
        return _FAIL
    return _jsonable(value)


_REPAIR_TOKEN = re.compile(r"\"|'|[{}\[\],:]|[A-Za-z_$][\w$]*|\s+|[^\"'{}\[\],:A-Za-z_$\s]+")
_PY_CONST = {"True": "true", "False": "false", "None": "null"}


def _sq_to_json(inner: str) -> str:
    inner = inner.replace("\\'", "'")
    inner = re.sub(r'(?<!\\)"', '\\"', inner)
    return '"' + inner.replace("\n", "\\n") + '"'


def _repair(text: str) -> Any:
    """Narrow JSON repair (see module docstring); returns the parsed value or ``_FAIL``."""
    if len(text) > MAX_REPAIR_CHARS:
        return _FAIL
    out: list[str] = []
    stack: list[str] = []
    commas: list[tuple[int, int]] = []  # (len(out) before the comma, stack depth)
    i = 0
    n = len(text)
    truncated = False
    while i < n:
        m = _REPAIR_TOKEN.match(text, i)
        if m is None:  # pragma: no cover - the token regex matches every character
            return _FAIL
        tok = m.group()
        if tok == '"' or tok == "'":
            end = _string_end(text, i, tok)
            if end < 0:
                body = text[i + 1 :]
                if body.endswith("\\"):
                    body = body[:-1]
                out.append(_sq_to_json(body) if tok == "'" else '"' + body.replace("\n", "\\n") + '"')
                truncated = True
                break
            body = text[i + 1 : end]
            out.append(_sq_to_json(body) if tok == "'" else '"' + body.replace("\n", "\\n") + '"')
            i = end + 1
            continue
        if tok in "{[":
            stack.append("}" if tok == "{" else "]")
            out.append(tok)
        elif tok in "}]":
            # drop a trailing comma before a closer
            while out and out[-1].isspace():
                out.pop()
            if out and out[-1] == ",":
                out.pop()
            if stack:
                out.append(stack.pop())
            if not stack:
                i = m.end()
                break
        elif tok == ",":
            commas.append((len(out), len(stack)))
            out.append(tok)
        elif tok in _PY_CONST:
            out.append(_PY_CONST[tok])
        elif tok[0].isalpha() or tok[0] in "_$":
            rest = text[m.end() : m.end() + 64].lstrip()
            if rest.startswith(":") and tok not in ("true", "false", "null"):
                out.append('"' + tok + '"')  # bare key
            else:
                out.append(tok)
        else:
            out.append(tok)
        i = m.end()
    else:
        truncated = bool(stack)

    def close(parts: list[str], open_stack: list[str]) -> Any:
        body = "".join(parts).rstrip()
        while body.endswith(","):
            body = body[:-1].rstrip()
        if body.endswith(":"):
            body += " null"
        return _loads(body + "".join(reversed(open_stack)))

    value = close(out, stack)
    if value is _FAIL and truncated and commas:
        cut, depth = commas[-1]
        # the stack at the comma was the first `depth` openers of the current stack
        value = close(out[:cut], stack[:depth])
    return value


_CODE_PLACEHOLDER = "\x00"
_PSEUDO_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("concatenation", re.compile(r"\x00\s*\+|\+\s*\x00|[\w\])]\s*\+\s*[\w(\[]")),
    ("function_call", re.compile(r"[A-Za-z_]\w*\s*\(")),
    ("template_literal", re.compile(r"`")),
    ("f_string", re.compile(r"(?<![\w])[fF][rR]?\x00")),
    (
        "bare_identifier",
        re.compile(r"[:\[,]\s*(?!(?:true|false|null|True|False|None)\b)[A-Za-z_][\w.]*(?=\s*[,}\]\[]|\s*$)"),
    ),
)


def _skeleton(text: str) -> str:
    """The text with string literals blanked to a placeholder (bounded, linear)."""
    text = text[:MAX_REPAIR_CHARS]
    out = []
    i = 0
    n = len(text)
    while i < n:
        q1 = text.find('"', i)
        q2 = text.find("'", i)
        cands = [q for q in (q1, q2) if q >= 0]
        if not cands:
            out.append(text[i:])
            break
        q = min(cands)
        out.append(text[i:q])
        end = _string_end(text, q, text[q], allow_newline=(text[q] == '"'))
        if end < 0:
            if text[q] == "'":
                out.append("'")
                i = q + 1
                continue
            out.append(_CODE_PLACEHOLDER)
            break
        out.append(_CODE_PLACEHOLDER)
        i = end + 1
    return "".join(out)


def _pseudo_code(text: str) -> list[str]:
    skel = _skeleton(text)
    return [name for name, pattern in _PSEUDO_PATTERNS if pattern.search(skel)]


# --------------------------------------------------------------------------- call shapes

_ARG_KEYS = ("arguments", "parameters", "args", "params", "input", "tool_input", "action_input")
_NAME_KEYS = ("tool", "tool_name", "toolName", "function_name", "function", "action", "name")
_CALL_KEY_RE = re.compile(r"""["']?\b(?:name|tool|tool_name|toolName|function|function_name|action)\b["']?\s*:""")
_ARGS_KEY_RE = re.compile(
    r"""["']?\b(?:arguments|parameters|params|args|input|tool_input|action_input)\b["']?\s*:"""
)


@dataclass
class _RawCall:
    name: str
    raw_args: Any
    nonstandard: bool


def _is_tool_definition(obj: Mapping[str, Any]) -> bool:
    """An OpenAI tool definition: ``{"type": "function", "function": {"name", "description"?, "parameters": <JSON Schema>}}``
    or the bare ``{"name", "description", "parameters": <schema>}``, whose parameters declare a schema."""
    spec = obj.get("function") if isinstance(obj.get("function"), Mapping) else obj
    params = spec.get("parameters")
    return (
        isinstance(params, Mapping)
        and params.get("type") == "object"
        and isinstance(params.get("properties"), Mapping)
        and ("description" in spec or obj.get("type") == "function")
    )


def _call_from_obj(obj: Any, tool_names: frozenset[str], depth: int = 0) -> list[_RawCall]:
    """Call objects found in a parsed JSON value (a call, a list of calls, a tool_calls wrapper)."""
    if depth > 3:
        return []
    if isinstance(obj, list):
        found: list[_RawCall] = []
        for item in obj[:MAX_CANDIDATES]:
            if isinstance(item, Mapping):
                found.extend(_call_from_obj(item, tool_names, depth + 1))
        return found
    if not isinstance(obj, Mapping):
        return []
    if _is_tool_definition(obj):
        return []  # an echo of the offered tool schemas (the prompt's <tools> block), not a call
    wrapped = obj.get("tool_calls")
    if isinstance(wrapped, list):
        return [_RawCall(c.name, c.raw_args, True) for c in _call_from_obj(wrapped, tool_names, depth + 1)]
    fn = obj.get("function")
    if isinstance(fn, Mapping) and isinstance(fn.get("name"), str) and fn.get("name"):
        raw = fn.get("arguments", fn.get("parameters"))
        return [_RawCall(fn["name"], raw, True)]
    for key in _NAME_KEYS:
        name = obj.get(key)
        if not isinstance(name, str) or not name.strip():
            continue
        for akey in _ARG_KEYS:
            if akey in obj:
                standard = key == "name" and akey == "arguments"
                return [_RawCall(name, obj[akey], not standard)]
        if name in tool_names:
            return [_RawCall(name, None, key != "name")]
        return []
    if len(obj) == 1:
        ((key, value),) = obj.items()
        if isinstance(key, str) and key in tool_names and (value is None or isinstance(value, Mapping)):
            return [_RawCall(key, value, True)]
    return []


def _call_like(text: str, tool_names: frozenset[str]) -> bool:
    """Whether unparseable text looks like an attempted call object."""
    head = text[:MAX_REPAIR_CHARS]
    if _CALL_KEY_RE.search(head) and (
        _ARGS_KEY_RE.search(head) or any(f'"{t}"' in head or f"'{t}'" in head for t in tool_names)
    ):
        return True
    m = re.match(r"""\s*[{\[]\s*\{?\s*["']([\w.-]+)["']\s*:""", head)
    return bool(m and m.group(1) in tool_names)


# --------------------------------------------------------------------------- content payloads


@dataclass
class _Cand:
    """One call attempt found in a piece of content."""

    start: int
    end: int
    method: str  # json_document | json_lines | brace_scan | python_literal | repair | pythonic | xml_parameters | invalid
    calls: list[_RawCall]
    repaired: bool = False
    pseudo: list[str] = field(default_factory=list)
    excerpt: str = ""
    foreign: bool = False
    errors: list[str] = field(default_factory=list)


def _line_bounds(text: str, start: int, end: int) -> bool:
    ls = text.rfind("\n", 0, start) + 1
    le = text.find("\n", end)
    le = len(text) if le < 0 else le
    return not text[ls:start].strip() and not text[end:le].strip()


_REACT = re.compile(r"Action\s*:\s*([A-Za-z_][\w.-]*)\s*\n\s*Action\s+Input\s*:\s*$", re.I)


def _json_candidates(text: str, tool_names: frozenset[str]) -> list[_Cand]:
    """Whole document, one-per-line and brace-scan candidates (with literal/repair fallbacks)."""
    cands: list[_Cand] = []
    stripped = text.strip()
    if stripped and stripped[0] in "{[" and stripped[-1] in "}]":
        value = _loads(stripped)
        if value is not _FAIL:
            calls = _call_from_obj(value, tool_names)
            if calls:
                lead = text.find(stripped[0])
                return [_Cand(lead, lead + len(stripped), "json_document", calls)]
    pos = 0
    attempts = 0
    n = len(text)
    while attempts < MAX_CANDIDATES * 2 and len(cands) < MAX_CANDIDATES:
        start = text.find("{", pos)
        if start < 0:
            break
        attempts += 1
        end, closed, depth = _scan_balanced(text, start, n)
        span = text[start:end]
        if depth > MAX_DEPTH:
            if _call_like(span[:4096], tool_names):
                cands.append(_Cand(start, end, "invalid", [], excerpt=_short(span)))
            pos = end
            continue
        # a call inside a JSON array written inline: widen to the array when it is one
        value = _loads(span) if closed else _FAIL
        method = "json_lines" if _line_bounds(text, start, end) else "brace_scan"
        repaired = False
        if value is _FAIL:
            value = _literal(span) if closed else _FAIL
            if value is not _FAIL:
                method, repaired = "python_literal", True
        if value is _FAIL:
            value = _repair(span)
            if value is not _FAIL:
                method, repaired = "repair", True
        if value is not _FAIL:
            calls = _call_from_obj(value, tool_names)
            react = _REACT.search(text, max(0, start - 200), start) if not calls else None
            if react and isinstance(value, Mapping):
                calls = [_RawCall(react.group(1), value, True)]
                start = react.start()
            if calls:
                pseudo = _pseudo_code(span) if repaired else []
                cands.append(_Cand(start, end, method, calls, repaired=repaired, pseudo=pseudo, excerpt=_short(span)))
                pos = end
                continue
            if closed:
                pos = start + 1  # valid JSON data: a call may sit inside it
                continue
        elif _call_like(span, tool_names):
            cands.append(_Cand(start, end, "invalid", [], pseudo=_pseudo_code(span), excerpt=_short(span)))
            pos = end
            continue
        pos = start + 1 if closed else end
    return cands


_PY_CALL = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\s*\(")
_PAST_TENSE = re.compile(r"\b(?:called|used|ran|invoked|executed|tried|via|with|using)\s*(?:the\s+)?`?$", re.I)


def _paren_end(text: str, open_pos: int, limit: int) -> int:
    depth = 0
    i = open_pos
    while i < limit:
        ch = text[i]
        if ch in "\"'":
            end = _string_end(text, i, ch, allow_newline=False)
            if end < 0 or end >= limit:
                return -1
            i = end + 1
            continue
        if ch in "([{":
            depth += 1
            if depth > MAX_DEPTH:
                return -1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _pythonic_candidates(
    text: str, taken: list[tuple[int, int]], tool_names: frozenset[str], schemas: Mapping[str, Any], wrapped: bool
) -> list[_Cand]:
    cands: list[_Cand] = []
    matches = 0
    for m in _PY_CALL.finditer(text):
        matches += 1
        if matches > 4 * MAX_CANDIDATES or len(cands) >= MAX_CANDIDATES:
            break
        start = m.start()
        if any(a <= start < b for a, b in taken):
            continue
        name = m.group(1)
        offered = name in tool_names
        if not offered and "." in name:
            continue
        open_pos = m.end() - 1
        end = _paren_end(text, open_pos, min(len(text), start + MAX_PYTHONIC_CHARS))
        if end < 0:
            continue
        isolated = _line_bounds(text, start, end if text[end : end + 1] != ";" else end + 1)
        if not offered and text[start:end].strip() != text.strip().rstrip(";"):
            continue  # an unknown name counts only when the call is the whole payload
        src = text[start:end]
        try:
            node = ast.parse(src, mode="eval").body
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        if not isinstance(node, ast.Call):
            continue
        if not offered and (node.args or not node.keywords):
            continue  # unknown names: keyword-only calls on their own line
        if offered and not isolated and not wrapped:
            line_start = text.rfind("\n", 0, start) + 1
            if not (node.args or node.keywords) or _PAST_TENSE.search(text[line_start:start]):
                continue  # "I used list_files() earlier" is prose, not a call
        args: dict[str, Any] = {}
        errors: list[str] = []
        pseudo = False
        props = _schema_properties(schemas.get(name))
        for index, arg in enumerate(node.args):
            key = props[index] if index < len(props) else f"arg{index}"
            value, ok = _literal_node(arg)
            if ok:
                args[key] = value
            else:
                pseudo = True
                errors.append(f"argument {key!r} is code, not a literal")
        for kw in node.keywords:
            if kw.arg is None:
                pseudo = True
                errors.append("**kwargs expansion is code, not a literal")
                continue
            value, ok = _literal_node(kw.value)
            if ok:
                args[kw.arg] = value
            else:
                pseudo = True
                errors.append(f"argument {kw.arg!r} is code, not a literal")
        cand = _Cand(
            start,
            end,
            "pythonic",
            [_RawCall(name, args, False)],
            pseudo=["function_call"] if pseudo else [],
            excerpt=_short(src),
            foreign=True,
            errors=errors,
        )
        cands.append(cand)
        taken.append((start, end))
    return cands


def _literal_node(node: ast.AST) -> tuple[Any, bool]:
    try:
        return _jsonable(ast.literal_eval(node)), True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, False


_XML_OPEN = re.compile(r"<function=([^>\s]+)\s*>|<invoke\s+name\s*=\s*[\"']([^\"'>]+)[\"']\s*>", re.I)
_XML_CLOSE = re.compile(r"</\s*(?:function|invoke)\s*>", re.I)
_XML_PARAM = re.compile(
    r"<parameter(?:=([^>\s]+)|\s+name\s*=\s*[\"']([^\"'>]+)[\"'])\s*>", re.I
)
_XML_PARAM_END = re.compile(r"</\s*parameter\s*>|<parameter[=\s]", re.I)


def _xml_spans(text: str) -> list[tuple[int, int, int, int, str]]:
    """``(start, end, body_start, body_end, name)`` of XML-style calls."""
    spans = []
    pos = 0
    while len(spans) < MAX_CANDIDATES:
        m = _XML_OPEN.search(text, pos)
        if m is None:
            break
        close = _XML_CLOSE.search(text, m.end())
        nxt = _XML_OPEN.search(text, m.end())
        if close and (not nxt or close.start() < nxt.start()):
            spans.append((m.start(), close.end(), m.end(), close.start(), m.group(1) or m.group(2)))
            pos = close.end()
        else:
            end = nxt.start() if nxt else len(text)
            spans.append((m.start(), end, m.end(), end, m.group(1) or m.group(2)))
            pos = end
    return spans


def _xml_candidates(text: str, schemas: Mapping[str, Any]) -> list[_Cand]:
    cands = []
    for start, end, body_start, body_end, name in _xml_spans(text):
        args: dict[str, Any] = {}
        types = _schema_types(schemas.get(name))
        pos = body_start
        for _ in range(MAX_CANDIDATES * 2):
            pm = _XML_PARAM.search(text, pos, body_end)
            if pm is None:
                break
            key = pm.group(1) or pm.group(2)
            em = _XML_PARAM_END.search(text, pm.end(), body_end)
            value_end = em.start() if em else body_end
            value = text[pm.end() : value_end]
            if value.startswith("\n"):
                value = value[1:]
            if value.endswith("\n"):
                value = value[:-1]
            if types.get(key) not in (None, "string"):
                parsed = _loads(value.strip())
                args[key] = value if parsed is _FAIL else parsed
            else:
                args[key] = value
            pos = em.end() if em and em.group().startswith("</") else value_end
        cands.append(_Cand(start, end, "xml_parameters", [_RawCall(name, args, False)], foreign=True,
                           excerpt=_short(text[start:end])))
    return cands


def _payload_candidates(
    text: str, tool_names: frozenset[str], schemas: Mapping[str, Any], *, wrapped: bool
) -> list[_Cand]:
    """Every call attempt in ``text``: XML-style, JSON (+ fallbacks), pythonic; by position."""
    cands = _xml_candidates(text, schemas)
    taken = [(c.start, c.end) for c in cands]
    masked = text
    if taken:
        chars = list(text)
        for a, b in taken:
            chars[a:b] = " " * (b - a)
        masked = "".join(chars)
    for cand in _json_candidates(masked, tool_names):
        cands.append(cand)
        taken.append((cand.start, cand.end))
    cands.extend(_pythonic_candidates(masked, taken, tool_names, schemas, wrapped))
    cands.sort(key=lambda c: c.start)
    return cands


def _remove_spans(text: str, spans: list[tuple[int, int]]) -> str:
    out = []
    pos = 0
    for a, b in sorted(spans):
        if a >= pos:
            out.append(text[pos:a])
            out.append("\n")
            pos = b
        else:
            pos = max(pos, b)
    out.append(text[pos:])
    return "".join(out)


# --------------------------------------------------------------------------- envelope regions

_REASON_OPEN = re.compile(r"<\s*(think|thinking|reasoning|thought)\s*>", re.I)
_REASON_CLOSE = re.compile(r"<\s*/\s*(think|thinking|reasoning|thought)\s*>", re.I)


def _strip_reasoning(text: str) -> tuple[str, int]:
    """Drop reasoning blocks; returns ``(visible_text, number_of_blocks)``."""
    out = []
    pos = 0
    blocks = 0
    for _ in range(MAX_REGIONS):
        mo = _REASON_OPEN.search(text, pos)
        mc = _REASON_CLOSE.search(text, pos)
        if mc and (not mo or mc.start() < mo.start()):
            blocks += 1  # orphan close: the template opened the block
            out = []
            pos = mc.end()
            continue
        if mo is None:
            break
        out.append(text[pos : mo.start()])
        blocks += 1
        mc = _REASON_CLOSE.search(text, mo.end())
        pos = mc.end() if mc else len(text)
    out.append(text[pos:])
    return "".join(out), blocks


_WRAPPER = r"tool_calls?|toolcalls?|tool-calls?|tools?|functions?|function[_-]?calls?|functioncalls?|json|call"
_TAG_OPEN = re.compile(rf"<\s*({_WRAPPER})\s*>|(\[TOOL_CALLS\]|<\|python_tag\|>|<\|tool_calls?\|>)", re.I)
_TAG_CLOSE = re.compile(rf"<\s*/\s*({_WRAPPER})\s*>", re.I)


@dataclass
class _Region:
    start: int
    end: int
    inner_start: int
    inner_end: int
    name: str  # lower-case tag name or the marker text
    marker: bool
    well_formed: bool


def _tag_regions(text: str, xml: list[tuple[int, int, int, int, str]]) -> list[_Region]:
    def inside_xml(pos: int) -> bool:
        return any(a <= pos < b for a, b, *_ in xml)

    def search(pattern: re.Pattern[str], pos: int) -> re.Match[str] | None:
        for _ in range(MAX_REGIONS * 4):
            m = pattern.search(text, pos)
            if m is None or not inside_xml(m.start()):
                return m
            pos = m.end()
        return None

    regions: list[_Region] = []
    pos = prev_end = 0
    while len(regions) < MAX_REGIONS:
        mo = search(_TAG_OPEN, pos)
        mc = search(_TAG_CLOSE, pos)
        if mc and (not mo or mc.start() < mo.start()):
            regions.append(_Region(prev_end, mc.end(), prev_end, mc.start(), mc.group(1).lower(), False, False))
            pos = prev_end = mc.end()
            continue
        if mo is None:
            break
        if mo.group(2):  # marker: runs to the next opener or the end
            nxt = search(_TAG_OPEN, mo.end())
            end = nxt.start() if nxt else len(text)
            close = search(_TAG_CLOSE, mo.end())
            inner_end = close.start() if close and close.start() < end else end
            regions.append(_Region(mo.start(), end, mo.end(), inner_end, mo.group(2), True, True))
            pos = prev_end = end
            continue
        name = mo.group(1).lower()
        close = search(_TAG_CLOSE, mo.end())
        nxt = search(_TAG_OPEN, mo.end())
        if close and (not nxt or close.start() < nxt.start()):
            ok = close.group(1).lower() == name
            regions.append(_Region(mo.start(), close.end(), mo.end(), close.start(), name, False, ok))
            pos = prev_end = close.end()
        else:
            end = nxt.start() if nxt else len(text)
            regions.append(_Region(mo.start(), end, mo.end(), end, name, False, False))
            pos = prev_end = end
    return regions


_FENCE = re.compile(r"(`{3,}|~{3,})([A-Za-z0-9_+#.-]*)(.*?)(?:\1|\Z)", re.S)
_SHELL_LANGS = frozenset({"bash", "sh", "shell", "console", "zsh", "terminal", "cmd", "powershell", "ps1", "fish"})
_SHELL_LINE = re.compile(
    r"^\s*(?:\$ \S|(?:ls|cat|echo|mkdir|touch|cd|python3?|pip3?|rm|cp|mv|grep|find|curl|wget|git|npm|sed|awk|"
    r"head|tail|chmod|printf|tee)\b(?!\s*[=(]))",
    re.M,
)


# --------------------------------------------------------------------------- schema helpers

_VALIDATORS: dict[str, Any] = {}


def _schema_properties(schema: Any) -> list[str]:
    if isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping):
        return [k for k in schema["properties"] if isinstance(k, str)]
    return []


def _schema_types(schema: Any) -> dict[str, Any]:
    if not (isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping)):
        return {}
    return {k: v.get("type") for k, v in schema["properties"].items() if isinstance(v, Mapping)}


def _validator(schema: Any) -> Any:
    """A cached jsonschema validator, or ``None`` when the schema itself is invalid."""
    if not isinstance(schema, (Mapping, bool)):
        return None
    try:
        key = json.dumps(schema, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError):
        return None
    if key in _VALIDATORS:
        return _VALIDATORS[key]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
            validator = cls(schema)
    except Exception:  # noqa: BLE001 - any broken schema just disables validation for that tool
        validator = None
    if len(_VALIDATORS) > 256:
        _VALIDATORS.clear()
    _VALIDATORS[key] = validator
    return validator


def _schema_errors(schema: Any, arguments: dict) -> list[str]:
    errors: list[str] = []
    validator = _validator(schema)
    if validator is not None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for err in validator.iter_errors(arguments):
                    where = "/".join(str(p) for p in err.absolute_path)
                    errors.append(_short(f"{where + ': ' if where else ''}{err.message}"))
                    if len(errors) >= _MAX_VALIDATION_ERRORS:
                        break
        except Exception as exc:  # noqa: BLE001 - e.g. a pathological pattern in the schema
            errors.append(_short(f"schema could not be applied: {exc}"))
    if isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping):
        if schema.get("additionalProperties") is not False:
            props = schema["properties"]
            patterns = schema.get("patternProperties")
            patterns = [p for p in patterns if isinstance(p, str)] if isinstance(patterns, Mapping) else []
            for key in arguments:
                if key in props:
                    continue
                if any(_safe_search(p, key) for p in patterns):
                    continue
                errors.append(_short(f"unexpected argument {key!r}"))
    return errors


def _safe_search(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except (re.error, RecursionError):
        return False


# --------------------------------------------------------------------------- tools, structured calls


def _offered_tools(tools: Any) -> dict[str, Any]:
    """``{name: parameters schema}`` from OpenAI-style (or bare) tool definitions."""
    offered: dict[str, Any] = {}
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        return offered
    for tool in list(tools)[:1000]:
        fn = _get(tool, "function")
        spec = fn if isinstance(fn, Mapping) else tool
        name = _get(spec, "name")
        if isinstance(name, str) and name:
            params = _get(spec, "parameters")
            offered[name] = params if params is not None else _get(spec, "input_schema")
    return offered


def _args_from_raw(raw: Any, *, structured: bool) -> tuple[dict, list[str], set[str]]:
    """Normalize raw arguments; returns ``(arguments, errors, modes)``."""
    modes: set[str] = set()
    if raw is None:
        return {}, [], modes
    if isinstance(raw, Mapping):
        return _jsonable(raw), [], modes
    if isinstance(raw, str):
        if not raw.strip():
            return {}, [], modes
        if not structured:
            modes.add("stringified_arguments")
        value = _loads(raw)
        if isinstance(value, str):  # double-encoded
            modes.add("stringified_arguments")
            value = _loads(value)
        if value is _FAIL:
            value = _literal(raw)
            if value is _FAIL:
                value = _repair(raw)
            if isinstance(value, Mapping):
                modes.add("repaired_json")
            else:
                modes.add("invalid_json")
                modes.discard("stringified_arguments")
                modes.update(f"pseudo:{p}" for p in _pseudo_code(raw))
                return {}, ["arguments are not valid JSON"], modes
        if isinstance(value, Mapping):
            return _jsonable(value), [], modes
        return {}, [f"arguments are a JSON {type(value).__name__}, not an object"], modes
    return {}, [f"arguments are a {type(raw).__name__}, not an object"], modes


def _structured_calls(tool_calls: Any) -> tuple[list[ToolCall], set[str]]:
    calls: list[ToolCall] = []
    modes: set[str] = set()
    if not isinstance(tool_calls, Sequence) or isinstance(tool_calls, (str, bytes)):
        return calls, modes
    for item in list(tool_calls)[:MAX_CANDIDATES * 4]:
        if not isinstance(item, Mapping):
            continue
        fn = _get(item, "function")
        spec = fn if isinstance(fn, Mapping) else item
        name = _get(spec, "name")
        raw = _get(spec, "arguments")
        if raw is None:
            raw = _get(spec, "parameters")
        explicit_null = raw is None and isinstance(spec, Mapping) and ("arguments" in spec or "parameters" in spec)
        args, errors, arg_modes = _args_from_raw(raw, structured=True)
        if explicit_null:
            errors = ["arguments are null, not an object"]
        modes |= arg_modes
        call_id = _get(item, "id")
        calls.append(
            ToolCall(
                name=name if isinstance(name, str) else "",
                arguments=args,
                source="structured",
                id=call_id if isinstance(call_id, str) else None,
                valid=not errors,
                errors=errors,
            )
        )
    return calls, modes


# --------------------------------------------------------------------------- content analysis


@dataclass
class _ContentResult:
    calls: list[ToolCall]
    modes: set[str]
    attempts: int  # call attempts, broken ones included
    canonicals: list[str]  # canonical form of each attempt (broken ones get a unique key)
    visible: str  # content with reasoning stripped
    prose: str  # visible text with wrappers, fences and call spans removed
    shell_block: bool
    details: dict


def _analyse_content(text: str, offered: Mapping[str, Any]) -> _ContentResult:
    tool_names = frozenset(offered)
    modes: set[str] = set()
    details: dict[str, Any] = {}
    visible, blocks = _strip_reasoning(text)
    if blocks:
        modes.add("reasoning_leak")
        details["reasoning_leak"] = {"blocks": blocks, "chars_removed": len(text) - len(visible)}

    found: list[tuple[str, _Cand]] = []  # (step, candidate)
    wrappers: list[str] = []
    xml = _xml_spans(visible)
    regions = _tag_regions(visible, xml)
    for region in regions:
        inner = visible[region.inner_start : region.inner_end]
        cands = _payload_candidates(inner, tool_names, offered, wrapped=True)
        found.extend(("tagged", c) for c in cands)
        if region.name in ("tool_call",) and not region.marker:
            modes.add("tool_call_tags_in_content")
            wrappers.append(region.name)
            if not region.well_formed:
                modes.add("wrong_wrapper_tag")
        elif region.marker or cands:
            modes.add("wrong_wrapper_tag")
            wrappers.append(region.name)
    if wrappers:
        details["wrappers"] = wrappers
    rest = _remove_spans(visible, [(r.start, r.end) for r in regions])

    shell_block = False
    fences = []
    fenced_calls = False
    for fm in _FENCE.finditer(rest):
        if len(fences) >= MAX_REGIONS:
            break
        fences.append((fm.start(), fm.end()))
        body = fm.group(3)
        cands = _payload_candidates(body, tool_names, offered, wrapped=True)
        found.extend(("fenced", c) for c in cands)
        if cands:
            fenced_calls = True
        elif fm.group(2).lower() in _SHELL_LANGS or _SHELL_LINE.search(body.lstrip("\n")[:200].split("\n", 1)[0]):
            shell_block = True
    if fenced_calls:
        modes.add("code_fence")
    bare = _remove_spans(rest, fences)

    bare_cands = _payload_candidates(bare, tool_names, offered, wrapped=False)
    found.extend((c.method if c.method != "invalid" else "invalid", c) for c in bare_cands)
    if any(not c.foreign for c in bare_cands):
        modes.add("raw_json_in_content")
    prose = _remove_spans(bare, [(c.start, c.end) for c in bare_cands])
    if not shell_block and _SHELL_LINE.search(prose) and re.search(r"^\s*\$ \S", prose, re.M):
        shell_block = True

    calls: list[ToolCall] = []
    canonicals: list[str] = []
    invalid: list[str] = []
    pseudo: set[str] = set()
    for index, (step, cand) in enumerate(found):
        if cand.foreign:
            modes.add("foreign_call_syntax")
        if cand.repaired:
            modes.add("repaired_json")
        if cand.pseudo:
            modes.add("pseudo_code_in_arguments")
            pseudo.update(cand.pseudo)
        if not cand.calls:
            modes.add("invalid_json")
            invalid.append(cand.excerpt)
            canonicals.append(f"\x00invalid{index}")
            continue
        for raw in cand.calls:
            if raw.nonstandard:
                modes.add("nonstandard_keys")
            args, errors, arg_modes = _args_from_raw(raw.raw_args, structured=False)
            for mode in arg_modes:
                if mode.startswith("pseudo:"):
                    modes.add("pseudo_code_in_arguments")
                    pseudo.add(mode[7:])
                else:
                    modes.add(mode)
            errors = list(cand.errors) + errors
            call = ToolCall(name=raw.name, arguments=args, source=step, valid=not errors, errors=errors)
            calls.append(call)
            canonicals.append(call.canonical())
    if invalid:
        details["invalid_json"] = invalid[:MAX_CANDIDATES]
    if pseudo:
        details["pseudo_code_in_arguments"] = sorted(pseudo)
    capped = len(bare_cands) >= MAX_CANDIDATES  # uncounted calls would read as prose
    if capped:
        details["candidates_capped"] = MAX_CANDIDATES
    if found and not capped and re.search(r"[^\W\d_]{2,}", prose):
        modes.add("mixed_prose")
    return _ContentResult(calls, modes, len(canonicals), canonicals, visible, prose, shell_block, details)


_CONTENT_CACHE: dict[tuple[bytes, frozenset[str]], list[str]] = {}


def _history_content_calls(text: str, offered: Mapping[str, Any]) -> list[str]:
    """Canonical calls recovered from an earlier assistant message (memoized by content digest)."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    key = (digest, frozenset(offered))
    cached = _CONTENT_CACHE.get(key)
    if cached is None:
        result = _analyse_content(text[:MAX_SCAN_CHARS], offered)
        cached = [c.canonical() for c in result.calls]
        if len(_CONTENT_CACHE) > 512:
            _CONTENT_CACHE.clear()
        _CONTENT_CACHE[key] = cached
    return cached


# --------------------------------------------------------------------------- behaviour heuristics

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


# --------------------------------------------------------------------------- classify


def _coerce_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def classify(
    response: Mapping, *, tools: Sequence[Mapping] | None = None, history: Sequence[Mapping] = ()
) -> Classification:
    """Classify one assistant reply.

    Args:
        response: ``{"content": str | None, "tool_calls": list | None, "finish_reason": str |
            None, "usage": {"prompt_tokens", "completion_tokens"}}``; extra or missing keys
            and values of any type are tolerated (content may also be a list of text parts).
        tools: OpenAI-style ``[{"type": "function", "function": {"name", "description",
            "parameters": <JSON Schema>}}]`` (bare ``{"name", "parameters"}`` also accepted).
            ``None`` means "not known": names are then not judged. An empty list means no tool
            was offered, so every call is ``unknown_tool``.
        history: OpenAI-shape messages before this reply (system, user, assistant with
            ``tool_calls``, tool).

    Returns:
        The :class:`Classification`. Never raises: should an internal bug surface, the
        result carries ``details["internal_error"]`` and no failure mode.
    """
    try:
        return _classify(response, tools, history)
    except Exception as exc:  # noqa: BLE001 - the loop must never die on a label
        return Classification([], [], [], None, {"internal_error": _short(f"{type(exc).__name__}: {exc}")})


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
        text = json.dumps(_jsonable(tools), ensure_ascii=False)[:MAX_HISTORY_TEXT]
    except (TypeError, ValueError):
        text = ""
    if len(_TOOLS_TEXT) >= 64:
        _TOOLS_TEXT.clear()
    _TOOLS_TEXT[id(tools)] = (tools, text)
    return text


def _classify(response: Any, tools: Any, history: Any) -> Classification:
    offered = _offered_tools(tools)
    tool_names = frozenset(offered)
    details: dict[str, Any] = {}
    modes: set[str] = set()

    content = _text_of(_get(response, "content"))
    if len(content) > MAX_SCAN_CHARS:
        details["content_truncated_for_analysis"] = len(content)
        content = content[:MAX_SCAN_CHARS]
    structured, smodes = _structured_calls(_get(response, "tool_calls"))
    modes |= {m for m in smodes if not m.startswith("pseudo:")}
    if any(m.startswith("pseudo:") for m in smodes):
        modes.add("pseudo_code_in_arguments")
    result = _analyse_content(content, offered)
    modes |= result.modes
    details.update(result.details)
    recovered = result.calls

    # multiple calls: structured plus content attempts that do not repeat a structured call
    structured_keys = {c.canonical() for c in structured}
    extra = [k for k in result.canonicals if k not in structured_keys]
    if len(structured) + len(extra) > 1:
        modes.add("multiple_calls")

    all_calls = structured + recovered
    # validation
    unknown: dict[str, str | None] = {}
    violations: list[dict[str, str]] = []
    for call in all_calls:
        if tools is None or not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
            continue  # the offered tools are not known: names cannot be judged
        if call.name not in tool_names:
            lower = {t.lower(): t for t in tool_names}
            nearest = lower.get(call.name.lower())
            if nearest is None:
                close = difflib.get_close_matches(call.name[:200], sorted(tool_names), n=1, cutoff=0.6)
                nearest = close[0] if close else None
            unknown[call.name] = nearest
            call.valid = False
            call.errors.append(
                f"unknown tool {call.name!r}" + (f"; nearest offered: {nearest!r}" if nearest else "")
            )
            continue
        errors = _schema_errors(offered[call.name], call.arguments)
        errors += [e for e in call.errors if e.endswith("not an object")]  # [1, 2], 7, null: the shape itself is wrong
        if errors:
            call.valid = False
            call.errors.extend(errors)
            violations.extend({"tool": call.name, "message": e} for e in errors)
    if unknown:
        modes.add("unknown_tool")
        details["unknown_tool"] = unknown
    if violations:
        modes.add("schema_violation")
        details["schema_violation"] = violations[: _MAX_VALIDATION_ERRORS * 4]

    # history: known text, tool results, earlier calls
    known_parts: list[str] = []
    earlier: set[str] = set()
    tool_answered = False
    messages = list(history)[-MAX_HISTORY_MESSAGES:] if isinstance(history, Sequence) and not isinstance(
        history, (str, bytes)
    ) else []
    budget = MAX_HISTORY_TEXT
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        role = _get(message, "role")
        text = _text_of(_get(message, "content"))
        if role in ("tool", "function", "ipython") or (role == "user" and "<tool_response" in text):
            tool_answered = True  # prompt tool mode returns results as <tool_response> user messages
        if role == "assistant":
            hcalls, _ = _structured_calls(_get(message, "tool_calls"))
            if hcalls:
                earlier.update(c.canonical() for c in hcalls)
                for c in hcalls:
                    part = json.dumps(c.arguments, ensure_ascii=False, default=str)
                    known_parts.append(part[:budget])
                    budget -= len(part)
            elif text:
                earlier.update(_history_content_calls(text, offered))
        if text and budget > 0:
            known_parts.append(text[:budget])
            budget -= len(text)
    repeats = [c.canonical() for c in all_calls if c.canonical() in earlier]
    if repeats:
        modes.add("repeated_call")
        details["repeated_call"] = sorted(set(repeats))

    # fabricated tool result
    fabricated: list[str] = []
    markup = _FABRICATED_MARKUP.search(result.visible)
    if markup:
        fabricated.append(_short(markup.group().strip()))
    if tool_answered:
        known_parts.append(_tools_text(tools))
        known = "\n".join(known_parts).lower()
        own_paths = set()
        for call in all_calls:
            for _key, value in _path_values(call):
                own_paths.add(posixpath.basename(value.replace("\\", "/")).lower())
        texts = [result.prose]
        for call in all_calls:
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
    if fabricated:
        modes.add("fabricated_tool_result")
        details["fabricated_tool_result"] = fabricated

    # no call at all
    no_attempt = not structured and result.attempts == 0
    visible = result.visible.strip()
    if no_attempt and not visible:
        modes.add("empty_response")
        usage = _get(response, "usage")
        details["empty_response"] = {"completion_tokens": _coerce_int(_get(usage, "completion_tokens"))}
    if no_attempt and visible:
        cue = _NARRATION.search(result.prose)
        if cue or result.shell_block:
            modes.add("narration_without_call")
            details["narration_without_call"] = {"cue": _short(cue.group()) if cue else "shell block"}

    finish = _get(response, "finish_reason")
    if isinstance(finish, str) and finish.strip().lower() in ("length", "max_tokens"):
        modes.add("truncated_by_length")

    escapes = []
    for call in all_calls:
        for key, value in _path_values(call):
            if _escapes_sandbox(value):
                escapes.append({"tool": call.name, "argument": str(key), "path": _short(value)})
    if escapes:
        modes.add("sandbox_escape_attempt")
        details["sandbox_escape_attempt"] = escapes

    recovered_by = None
    sources = {c.source for c in recovered}
    for step in RECOVERY_STEPS:
        if step in sources:
            recovered_by = step
            break
    ordered = [m for m in FAILURE_MODES if m in modes]
    return Classification(ordered, structured, recovered, recovered_by, _jsonable(details))


def classify_document(doc: Any) -> dict[str, Any]:
    """Classify a standalone document, as ``harness classify`` does.

    Args:
        doc: ``{"tools": [...], "messages": [...], "response": {...}}``; unknown keys are
            ignored, missing or mistyped ones count as empty.

    Returns:
        ``{"failure_modes": [...], "calls": [{"name", "arguments"}], "recovered_by": str |
        None, "classifier_version": str, "details": {...}}`` where ``calls`` are those the
        lenient policy would act on. Never raises.
    """
    tools = _get(doc, "tools")
    messages = _get(doc, "messages")
    response = _get(doc, "response")
    result = classify(
        response if isinstance(response, Mapping) else {},
        tools=tools if isinstance(tools, list) else None,
        history=messages if isinstance(messages, list) else (),
    )
    return {
        "failure_modes": result.failure_modes,
        "calls": [{"name": c.name, "arguments": c.arguments} for c in result.calls("lenient")],
        "recovered_by": result.recovered_by,
        "classifier_version": result.classifier_version,
        "details": result.details,
    }
