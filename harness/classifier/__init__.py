"""Classify one assistant reply: which tool calls can be recovered, which failure modes it shows.

Pure package: no I/O, no clock, no imports from the loop, ledger or backends. :func:`classify`
runs on every turn of the agent loop and behind ``harness classify``; it never raises. The only
state kept between calls is bounded memos of pure functions, keyed by immutable content (strings,
tuples of strings, bytes) or holding the object they were computed from, so no call can see another's
input in its result: validators by their schema's ``marshal`` bytes and the offered tools' text by the tools list's
(``types.content_key``: exact built-in types only, so a list edited in place is read afresh; ``validate``,
``heuristics.tools_text``), whether a path leaves the sandbox by its text (``heuristics``), calls recovered from earlier
assistant messages by the text's digest and the schemas' (``heuristics``), each history message's reading by its role, text and
call strings (``heuristics``: the loop hands the whole history again on every turn), and what the tool
results' text holds by that text (``contradiction``); ``tests/test_classifier_memo.py`` holds
results equal with the memos empty and warm. The
failure modes, the two passes, the recovery steps, the accepted call shapes, the caps and the
heuristics' rules are documented in docs/failure-modes.md.

Modules, each depending only on those before it: ``types`` (constants, result types, shared
helpers), ``jsonscan`` (JSON scanning and repair), ``schemakw`` (budgeted JSON Schema keywords),
``validate`` (offered tools, structured calls, schema validation), ``shapes`` (call shapes and
candidates in text), ``content`` (reasoning, tags, fences, recovered calls), ``heuristics``
(history, repeats, escapes), ``readings`` (how a reply presents what it writes),
``contradiction``, ``fabrication``, ``narration`` and ``behaviour`` (the behaviour checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.classifier.behaviour import markup_step, requirement_step
from harness.classifier.content import ContentResult, analyse_content, envelope_step, multiple_calls_step, response_content
from harness.classifier.evidence import evidence_for
from harness.classifier.fabrication import fabrication_step
from harness.classifier.heuristics import escape_step, repeat_step, scan_history, truncation_step
from harness.classifier.narration import no_call_step
from harness.classifier.readings import units
from harness.classifier.types import (
    CLASSIFIER_VERSION,
    FAILURE_MODES,
    GUIDE,
    MAX_CANDIDATES,
    MAX_DEPTH,
    MAX_HISTORY_MESSAGES,
    MAX_HISTORY_TEXT,
    MAX_PYTHONIC_CHARS,
    MAX_REGIONS,
    MAX_REPAIR_CHARS,
    MAX_SCAN_CHARS,
    PARSER_POLICIES,
    RECOVERY_STEPS,
    Classification,
    ToolCall,
    get,
    is_listed,
    jsonable,
    short,
)
from harness.classifier.validate import offered_tools, structured_calls, structured_cap_step, validation_step

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
    "RECOVERY_STEPS",
    "ToolCall",
    "classify",
    "classify_document",
]


def classify(
    response: Mapping,
    *,
    tools: Sequence[Mapping] | None = None,
    history: Sequence[Mapping] = (),
    requires_tool: bool | None = None,
    server_rejection: str | None = None,
    stream_problems: Sequence[str] | None = None,
) -> Classification:
    """Classify one assistant reply.

    Args:
        response: ``{"content": str | None, "tool_calls": list | None, "finish_reason": str |
            None, "usage": {"prompt_tokens", "completion_tokens"}, "reasoning_content": str |
            None}``; extra or missing keys and values of any type are tolerated (content may
            also be a list of text parts; ``reasoning`` and ``thinking`` are read as
            ``reasoning_content``).
        tools: OpenAI-style ``[{"type": "function", "function": {"name", "description",
            "parameters": <JSON Schema>}}]`` (bare ``{"name", "parameters"}`` also accepted).
            ``None`` means "not known": names are then not judged. An empty list means no tool
            was offered, so every call is ``unknown_tool``.
        history: OpenAI-shape messages before this reply (system, user, assistant with
            ``tool_calls``, tool).
        requires_tool: the scenario's flag: True judges ``skipped_required_tool``, False
            judges ``unneeded_call``, None judges neither.
        server_rejection: the error message with which the server's own tool-call parser refused
            the reply (then ``response`` holds only the model's text the error quoted, if any), or
            None: labels ``server_rejected_call``, and the refused call counts as a call attempt.
        stream_problems: for a streamed reply, what could not be assembled from its chunks (one sentence each,
            :func:`harness.backends.streaming.assemble`); non-empty labels ``stream_assembly_error``. ``response``
            is then the assembled reply. None or empty: not streamed, or assembled cleanly.

    Returns:
        The :class:`Classification`; ``details["evidence"]`` gives, for every label, the rule
        that fired and the span that triggered it. Never raises: should an internal bug
        surface, the result carries ``details["internal_error"]`` and no failure mode.
    """
    try:
        rejected = server_rejection if isinstance(server_rejection, str) and server_rejection else None
        problems = _problems(stream_problems)
        required = requires_tool if isinstance(requires_tool, bool) else None
        return _classify(response, tools, history, required, rejected, problems)
    except Exception as exc:  # noqa: BLE001 - the loop must never die on a label
        return Classification([], [], [], None, {"internal_error": short(f"{type(exc).__name__}: {exc}")})


_REASONING_MODES = frozenset({"foreign_call_syntax", "wrong_wrapper_tag", "invalid_json", "pseudo_code_in_arguments",
                              "repaired_json", "stringified_arguments", "nonstandard_keys"})  # fmt: skip
"""What a call written only in the reasoning is labelled with besides ``call_in_reasoning``: its notation (a
vendor's call markers included) and payload (the other envelope modes describe the content)."""


def _problems(value: Any) -> list[str]:
    """The ``stream_problems`` input as a list of short strings (anything else counts as none)."""
    if not is_listed(value):
        return []
    return [short(p) for p in value if isinstance(p, str) and p]


def _classify(
    response: Any, tools: Any, history: Any, requires_tool: bool | None, rejected: str | None, problems: list[str]
) -> Classification:
    """Run both passes, then the steps in order; modes are merged, evidence in step order."""
    offered = offered_tools(tools)
    known = is_listed(tools)
    content, clipped = response_content(response)
    raw_calls = get(response, "tool_calls")
    structured, structured_modes = structured_calls(raw_calls)
    result = analyse_content(content, offered, tools_known=known)
    reasoning = _reasoning_calls(response, result, structured, offered, known)
    recovered = result.calls + (reasoning.calls if reasoning else [])
    calls = structured + recovered
    attempts = len(structured) + result.attempts + (reasoning.attempts if reasoning else 0) + (rejected is not None)
    keys = [c.canonical() for c in calls]  # drawn once: validation changes no call's name or arguments
    steps = [
        envelope_step(structured_modes, result, clipped),
        multiple_calls_step(structured, result, keys[: len(structured)]),
        structured_cap_step(raw_calls),
        _reasoning_step(reasoning),
        multiple_calls_step([], reasoning) if reasoning else (set(), {}),  # it counts calls, wherever written
        validation_step(calls, tools, offered),
    ]
    past = scan_history(history, offered)
    seq = units(result.visible) if result.visible else []  # read once for the fabrication and narration steps
    steps += [
        repeat_step(calls, past, keys),
        fabrication_step(result, calls, past, tools, seq),
        no_call_step(result, attempts, response, tools, requires_tool, seq),
        requirement_step(requires_tool, attempts, past, tools, result),
        truncation_step(response),
        markup_step(result),
        escape_step(calls, result.details.get("invalid_json", [])),
        ({"server_rejected_call"}, {"server_rejected_call": short(rejected)}) if rejected else (set(), {}),
        ({"stream_assembly_error"}, {"stream_assembly_error": problems}) if problems else (set(), {}),
    ]
    modes: set[str] = set()
    details: dict[str, Any] = {}
    for step_modes, evidence in steps:
        if step_modes:
            modes |= step_modes
        if evidence:
            details.update(evidence)
    ordered = [m for m in FAILURE_MODES if m in modes] if modes else []
    details["evidence"] = evidence_for(ordered, details, result, calls)
    return Classification(ordered, structured, recovered, _recovered_by(recovered), jsonable(details))


def _reasoning_calls(
    response: Any, content: ContentResult, structured: list[ToolCall], offered: Mapping[str, Any], known: bool
) -> ContentResult | None:
    """Calls written only in the reasoning (the reasoning field, or ``<think>`` blocks in the content), if no call is outside it."""
    if structured or content.attempts:
        return None
    field = next((v for k in _REASONING_FIELDS if isinstance(v := get(response, k), str)), "")
    text = "\n".join(t for t in (field, content.reasoning) if t)[:MAX_SCAN_CHARS]
    if not text.strip():
        return None
    found = analyse_content(text, offered, tools_known=known)
    if not found.attempts:
        return None
    for call in found.calls:
        call.source = "reasoning"
    return found


_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


def _reasoning_step(reasoning: ContentResult | None) -> tuple[set[str], dict[str, Any]]:
    """``call_in_reasoning`` plus the notation and payload modes of the calls found there."""
    if reasoning is None:
        return set(), {}
    modes = {"call_in_reasoning"} | (reasoning.modes & _REASONING_MODES)
    return modes, {"call_in_reasoning": [c.to_dict()["name"] for c in reasoning.calls] or ["(broken call)"]}


def _recovered_by(recovered: list[ToolCall]) -> str | None:
    """The earliest :data:`RECOVERY_STEPS` step that produced one of the recovered calls."""
    sources = {c.source for c in recovered}
    for step in RECOVERY_STEPS:
        if step in sources:
            return step
    return None


def classify_document(doc: Any) -> dict[str, Any]:
    """Classify a standalone document, as ``harness classify`` does.

    Args:
        doc: ``{"tools": [...], "messages": [...], "response": {...}, "requires_tool": bool,
            "server_rejection": str, "stream_problems": [str]}``; unknown keys are ignored, missing or mistyped ones
            count as empty (``requires_tool`` absent: not judged; ``server_rejection`` absent: not refused;
            ``stream_problems`` absent: not streamed).

    Returns:
        ``{"failure_modes": [...], "calls": [{"name", "arguments"}], "recovered_by": str |
        None, "classifier_version": str, "details": {...}}`` where ``calls`` are those the
        lenient policy would act on. Never raises.
    """
    tools = get(doc, "tools")
    messages = get(doc, "messages")
    response = get(doc, "response")
    requires_tool = get(doc, "requires_tool")
    rejection = get(doc, "server_rejection")
    result = classify(
        response if isinstance(response, Mapping) else {},
        tools=tools if isinstance(tools, list) else None,
        history=messages if isinstance(messages, list) else (),
        requires_tool=requires_tool if isinstance(requires_tool, bool) else None,
        server_rejection=rejection if isinstance(rejection, str) else None,
        stream_problems=get(doc, "stream_problems"),
    )
    return {
        "failure_modes": result.failure_modes,
        "calls": [{"name": c.name, "arguments": c.arguments} for c in result.calls("lenient")],
        "recovered_by": result.recovered_by,
        "classifier_version": result.classifier_version,
        "details": result.details,
    }
