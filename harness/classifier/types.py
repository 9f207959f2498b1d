"""The classifier's vocabulary: version, failure modes, recovery steps, caps, result types.

Also the tiny helpers every other module of :mod:`harness.classifier` shares (detail
shortening, JSON-ready copies, defensive reads of response fields). No I/O; imports nothing
from the rest of the package.
"""

from __future__ import annotations

import itertools
import json
import marshal
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

__all__ = [
    "CLASSIFIER_VERSION",
    "Classification",
    "FAILURE_MODES",
    "GUIDE",
    "MAX_CANDIDATES",
    "MAX_DEPTH",
    "MAX_HISTORY_MESSAGES",
    "MAX_HISTORY_TEXT",
    "MAX_PYTHONIC_CHARS",
    "MAX_REGIONS",
    "MAX_REPAIR_CHARS",
    "MAX_SCAN_CHARS",
    "PARSER_POLICIES",
    "PLAIN_JSON",
    "RECOVERY_STEPS",
    "Cand",
    "RawCall",
    "ToolCall",
    "UNPARSED_ARGUMENTS",
    "BoundedMemo",
    "content_key",
    "get",
    "is_listed",
    "jsonable",
    "short",
    "text_of",
    "unparsed_key",
]

#: Bump whenever any label for some input can change; stored with every label set.
CLASSIFIER_VERSION = "2.11.0"

#: Canonical failure modes, in canonical order: name -> one-line definition (Markdown; the same text as the
#: table in docs/failure-modes.md, whose section ``#<name>`` holds the full rule).
FAILURE_MODES: dict[str, str] = {
    # envelope
    "raw_json_in_content": "A call object written as bare JSON text in the content, outside any tag or fence.",
    "code_fence": "A call inside a Markdown code fence (backticks or tildes), with or without a language.",
    "mixed_prose": "Natural-language text around a call written in the content.",
    "tool_call_tags_in_content": "`<tool_call>` markup left in the content.",
    "wrong_wrapper_tag": "Another wrapper or marker around a call (`<tools>`, `<function>`, `<json>`, `<function_calls>`, `[TOOL_CALLS]`, `<|python_tag|>`, `<|tool_call|>`, channel syntax such as `<|channel|>commentary to=functions.x`), or unclosed / mismatched tags.",
    "foreign_call_syntax": 'A call that is not a JSON object: pythonic `name(arg=...)`, XML-style parameters (`<function=name><parameter=k>v</parameter>`, `<invoke name="...">`), or a vendor\'s own syntax.',
    "multiple_calls": "More than one call in one reply.",
    # payload
    "invalid_json": "A call-like object that no repair makes parseable.",
    "pseudo_code_in_arguments": "Argument values written as code: `+` concatenation, function calls, template literals, f-strings, bare identifiers.",
    "repaired_json": "A call parseable only after repair: missing closing braces or quotes, trailing commas, bare keys, single-quoted Python dicts, `True`/`False`/`None`.",
    "stringified_arguments": "Arguments given as a JSON string instead of an object (or double-encoded).",
    "nonstandard_keys": "A call object with other keys than `name`/`arguments`.",
    # validation
    "unknown_tool": "A call to a tool that was not offered.",
    "schema_violation": "Arguments break the tool's JSON Schema: a missing required argument, a wrong type, an unexpected argument, a value outside `enum` or `pattern`.",
    # behaviour
    "repeated_call": "The same call (name and canonical arguments) as an earlier call in the run.",
    "fabricated_tool_result": "The reply presents as fact what only a tool could have told it, when no tool told it that: invented tool output, or values that contradict what a tool returned.",
    "narration_without_call": "No call, while the text announces or shows an action instead of taking it.",
    "empty_response": "No content and no call.",
    "truncated_by_length": "The server stopped the reply at the token limit.",
    "reasoning_leak": "`<think>`-style reasoning blocks left in the content.",
    "sandbox_escape_attempt": "A path argument outside the sandbox: absolute, `~`, a drive letter, or climbing above `.` with `..`.",
    # added in classifier 2.0: judged only when their inputs are given
    "skipped_required_tool": "The run ends without the tool it needed: a reply with no call, when no tool has answered in the run and the scenario declares that a tool is needed (`requires_tool`).",
    "unneeded_call": "A call when the scenario declares that no tool is needed: the restraint failure.",
    "call_in_reasoning": "A call written only in the reasoning: in the `reasoning_content`/`thinking` field the server returned beside the content, or inside a `<think>` block, with no call outside it.",
    "chat_markup_leak": "Chat-template markup echoed as text: `<|im_start|>`, `<|im_end|>`, `<|eot_id|>`, `<|start_header_id|>`, `<|end|>`, `<start_of_turn>`, `<end_of_turn>`, `[INST]`, `<|endoftext|>`, `</s>`: what a base model or a wrong chat template produces.",
    # judged only when the server's refusal is given (``server_rejection``)
    "server_rejected_call": "The server's own tool-call parser refused the reply (an HTTP error naming the call it could not parse), so no assistant message came back.",
    # judged only when the reply was streamed and its assembly problems are given (``stream_problems``)
    "stream_assembly_error": "A streamed reply whose chunks cannot be assembled into one coherent reply: tool-call arguments that assemble to text that is not JSON (not cut by the token limit), deltas for a call index never opened, content after the final chunk.",
}

#: The labelling guide, relative to the repository root: the full rule of mode ``m`` is its section ``#m``.
GUIDE = "docs/failure-modes.md"

#: The fixed, documented order of lenient recovery steps (see docs/failure-modes.md).
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
    "react",
    "repair",
    "reasoning",
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

UNPARSED_ARGUMENTS = "arguments are not valid JSON"
"""The error of a call whose argument string no repair parsed (its arguments are then ``{}``)."""
_SORTED_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False, default=str)
"""``json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)`` without a new encoder on every call."""
PLAIN_JSON = json.JSONEncoder(ensure_ascii=False, default=str)
"""``PLAIN_JSON.encode(value)`` is ``json.dumps(value, ensure_ascii=False, default=str)`` without a new encoder per call."""
_UNPARSED_KEYS = itertools.count()
"""Numbers for the repeat keys of unparsed arguments: a key only ever compared, never stored or shown."""


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
    shown: dict[str, str] = field(default_factory=dict, repr=False)
    """The complete ``"key": "string"`` pairs that arguments no repair parsed still show (read only by the lexical
    path check; not part of the call's output)."""

    def canonical(self) -> str:
        """Return canonical JSON of name and arguments (sorted keys) for repeat detection.

        Arguments that no repair parsed (:data:`UNPARSED_ARGUMENTS` among the errors) have no canonical form: the
        key is then a fresh one on every call, equal to no other key (an object id could be reused by a later call
        while a memoized history still holds it)."""
        if UNPARSED_ARGUMENTS in self.errors:
            return unparsed_key()
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
                any, a name the server's parser visibly mangled replaced by the offered name in
                ``details["mended_names"]``; else recovered calls).

        Returns:
            The list of calls (may be empty).

        Raises:
            ValueError: ``parser`` is not in :data:`PARSER_POLICIES`.
        """
        if parser == "strict":
            return list(self.structured_calls)
        if parser == "lenient":
            mended = self.details.get("mended_names") if isinstance(self.details, dict) else None
            if self.structured_calls and isinstance(mended, dict):
                return [replace(c, name=mended[c.name], valid=True, errors=[]) if c.name in mended else c
                        for c in self.structured_calls]  # fmt: skip
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


@dataclass
class RawCall:
    """A call as written: its name, its arguments before normalization, and whether its keys are nonstandard."""

    name: str
    raw_args: Any
    nonstandard: bool


@dataclass
class Cand:
    """One call attempt found in a piece of content: ``text[start:end]``, how it parsed, its calls.

    ``calls`` is empty for a broken call-like object (``method == "invalid"``); ``foreign``
    marks calls in a non-JSON notation (pythonic, XML-style, the model's own); ``pseudo``
    names code patterns found in the arguments.
    """

    start: int
    end: int
    method: str  # json_document | json_lines | brace_scan | python_literal | repair | pythonic | xml_parameters | invalid
    calls: list[RawCall]
    repaired: bool = False
    pseudo: list[str] = field(default_factory=list)
    excerpt: str = ""
    foreign: bool = False
    errors: list[str] = field(default_factory=list)
    wrapper: bool = False
    """The call's own markup is a vendor wrapper or channel header (``wrong_wrapper_tag``)."""
    react: bool = False
    """A ReAct ``Action:``/``Action Input:`` call: its JSON input is arguments, not a call object."""
    nonstandard: bool = False
    """A broken call-like object (no ``calls``) whose keys are not ``name``/``arguments`` (``nonstandard_keys``)."""


# --------------------------------------------------------------------------- small helpers


def short(value: Any, limit: int = _MAX_DETAIL_CHARS) -> str:
    """``value`` (its ``repr`` unless a str) cut to ``limit`` characters, ending in ``...`` when cut."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def jsonable(value: Any, depth: int = 0) -> Any:
    """Return a JSON-ready copy of ``value`` (depth-capped, so cycles and deep data are safe)."""
    if depth > MAX_DEPTH:
        return "..."
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return value
    if kind is dict and len(value) <= 1000:  # as the Mapping branch below, without its copies
        return {k if isinstance(k, str) else short(k): jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in list(value.items())[:1000]:
            out[k if isinstance(k, str) else short(k)] = jsonable(v, depth + 1)
        return out
    if isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)[:10_000]
        if isinstance(value, (set, frozenset)):
            items.sort(key=repr)
        return [jsonable(v, depth + 1) for v in items]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return short(value)


def unparsed_key() -> str:
    """A fresh repeat key for a call whose arguments no repair parsed: equal to no other key (see :meth:`ToolCall.canonical`)."""
    return f"\x00unparsed:{next(_UNPARSED_KEYS)}"


def _canonical(name: str, arguments: Any) -> str:
    return _SORTED_JSON.encode({"name": name, "arguments": arguments})


def text_of(content: Any) -> str:
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


def content_key(value: Any, version: int = 4) -> bytes | None:
    """``marshal.dumps(value, version)``, the content key of the classifier's memos; None for a value marshal does not
    write (a subclass of a built-in type, a custom object, nesting past its limit).

    It accepts only the exact built-in types, distinguishes ``True``, ``1`` and ``1.0``, a list from a tuple and an
    ``int`` key from a ``str`` one, and runs no code of the objects it reads; ``marshal.loads`` gives the value back
    from the bytes, so two values with one key are equal in every byte and type. Version 4 marks objects referenced
    more than once, so the same value can give other bytes (a miss, never a wrong hit; it writes about twice as fast
    as version 2); version 2 has no back-references, so one value has one key.
    """
    try:
        return marshal.dumps(value, version)
    except ValueError:
        return None


_K = TypeVar("_K")
_V = TypeVar("_V")


class BoundedMemo(dict[_K, _V]):
    """A memo (a dict: read it with ``get``) emptied whole when one more entry would pass its bounds.

    Args:
        entries: the most entries it holds.
        held: the most it holds in all, in the units of the ``size`` given to :meth:`keep` (characters, bytes;
            unbounded by default). :attr:`size_held` is what it holds now.
    """

    __slots__ = ("max_entries", "max_held", "size_held")

    def __init__(self, entries: int, held: float = math.inf) -> None:
        super().__init__()
        self.max_entries, self.max_held, self.size_held = entries, held, 0

    def keep(self, key: _K, value: _V, size: int = 0) -> None:
        """Remember ``value`` under ``key`` (``size``: its share of :attr:`max_held`), first emptying the memo when it
        holds :attr:`max_entries` entries or the value would take it past :attr:`max_held`."""
        if len(self) >= self.max_entries or self.size_held + size > self.max_held:
            self.clear()
        self[key] = value
        self.size_held += size

    def clear(self) -> None:
        """Forget every entry (what it holds is 0 again)."""
        super().clear()
        self.size_held = 0


def is_listed(value: Any) -> bool:
    """Whether a field reads as a list: a ``list``, or another Sequence that is not text (``str``, ``bytes``); a
    tuple of tool calls counts, a string of them does not."""
    return type(value) is list or (isinstance(value, Sequence) and not isinstance(value, (str, bytes)))


def get(mapping: Any, key: str) -> Any:
    """``mapping.get(key)`` when ``mapping`` is a Mapping whose ``get`` works, else ``None``."""
    if type(mapping) is dict:  # the usual case: a plain dict's get cannot fail for a str key
        return mapping.get(key)
    if isinstance(mapping, Mapping):
        try:
            return mapping.get(key)
        except Exception:  # noqa: BLE001 - a hostile Mapping must not break classification
            return None
    return None
