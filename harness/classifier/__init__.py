"""Classify one assistant reply: which tool calls can be recovered, which failure modes it shows.

Pure package: no I/O, no clock, no imports from the loop, ledger or backends. :func:`classify`
runs on every turn of the agent loop and behind ``harness classify``; it never raises. The
failure modes, the two passes, the recovery steps, the accepted call shapes, the caps and the
heuristics' rules are documented in docs/failure-modes.md.

Modules, each depending only on those before it: ``types`` (constants, result types, shared
helpers), ``jsonscan`` (JSON scanning and repair), ``validate`` (offered tools, structured
calls, schema validation), ``shapes`` (call shapes and candidates in text), ``content``
(reasoning, tags, fences, recovered calls), ``heuristics`` (behaviour checks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from harness.classifier.content import analyse_content, envelope_step, multiple_calls_step, response_content
from harness.classifier.heuristics import (
    escape_step,
    fabrication_step,
    no_call_step,
    repeat_step,
    scan_history,
    truncation_step,
)
from harness.classifier.types import (
    CLASSIFIER_VERSION,
    FAILURE_MODES,
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
    jsonable,
    short,
)
from harness.classifier.validate import offered_tools, structured_calls, validation_step

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


def classify(response: Mapping, *, tools: Sequence[Mapping] | None = None, history: Sequence[Mapping] = ()) -> Classification:
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
        return Classification([], [], [], None, {"internal_error": short(f"{type(exc).__name__}: {exc}")})


def _classify(response: Any, tools: Any, history: Any) -> Classification:
    """Run both passes, then the steps in order; modes are merged, evidence in step order."""
    offered = offered_tools(tools)
    content, clipped = response_content(response)
    structured, structured_modes = structured_calls(get(response, "tool_calls"))
    result = analyse_content(content, offered)
    calls = structured + result.calls
    steps = [
        envelope_step(structured_modes, result, clipped),
        multiple_calls_step(structured, result),
        validation_step(calls, tools, offered),
    ]
    past = scan_history(history, offered)
    steps += [
        repeat_step(calls, past),
        fabrication_step(result, calls, past, tools),
        no_call_step(structured, result, response),
        truncation_step(response),
        escape_step(calls),
    ]
    modes: set[str] = set()
    details: dict[str, Any] = {}
    for step_modes, evidence in steps:
        modes |= step_modes
        details.update(evidence)
    ordered = [m for m in FAILURE_MODES if m in modes]
    return Classification(ordered, structured, result.calls, _recovered_by(result.calls), jsonable(details))


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
        doc: ``{"tools": [...], "messages": [...], "response": {...}}``; unknown keys are
            ignored, missing or mistyped ones count as empty.

    Returns:
        ``{"failure_modes": [...], "calls": [{"name", "arguments"}], "recovered_by": str |
        None, "classifier_version": str, "details": {...}}`` where ``calls`` are those the
        lenient policy would act on. Never raises.
    """
    tools = get(doc, "tools")
    messages = get(doc, "messages")
    response = get(doc, "response")
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
