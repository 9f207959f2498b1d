"""The evidence of each label: the rule that fired and the span of the reply that triggered it.

``details["evidence"][mode] == {"rule": "...", "span": "..."}`` for every label of a reply, so a
reader (``harness classify``, ``harness review``, the ledger) can check a label against
docs/failure-modes.md without re-running anything.
"""

from __future__ import annotations

from typing import Any

from harness.classifier.content import ContentResult
from harness.classifier.types import PLAIN_JSON, ToolCall, short

__all__ = ["RULES", "evidence_for"]

RULES: dict[str, str] = {
    "raw_json_in_content": "a call object written as bare JSON in the content",
    "code_fence": "a call inside a Markdown code fence",
    "mixed_prose": "prose beside a call written in the content",
    "tool_call_tags_in_content": "<tool_call> markup in the content",
    "wrong_wrapper_tag": "another wrapper, marker or channel header around a call, or a malformed call tag",
    "foreign_call_syntax": "a call in a notation that is not a JSON object",
    "multiple_calls": "more than one call attempt in the reply",
    "invalid_json": "a call-like object that no narrow repair parses",
    "pseudo_code_in_arguments": "argument values written as code",
    "repaired_json": "a call that parses only after the narrow repairs",
    "stringified_arguments": "arguments given as a JSON string",
    "nonstandard_keys": "a call object with keys other than name/arguments",
    "unknown_tool": "a call name that is not among the offered tools",
    "schema_violation": "arguments that break the tool's JSON Schema",
    "repeated_call": "the same name and arguments as an earlier call in the run",
    "fabricated_tool_result": "tool output or tool-only facts that no tool returned",
    "narration_without_call": "no call while the reply announces or shows the action",
    "empty_response": "no visible text and no call",
    "truncated_by_length": "finish_reason length",
    "reasoning_leak": "<think>-style blocks in the content",
    "sandbox_escape_attempt": "a path argument outside the sandbox",
    "skipped_required_tool": "no call and no tool answer while the scenario requires a tool",
    "unneeded_call": "a call while the scenario requires none",
    "call_in_reasoning": "a call written only in the reasoning",
    "chat_markup_leak": "chat-template markup in the content",
    "server_rejected_call": "the server's tool-call parser refused the reply",
    "stream_assembly_error": "the streamed chunks do not assemble into one coherent reply",
}
"""One line per mode: what its rule checks (the guide's section has the full rule)."""

_FROM_CALLS = frozenset({"raw_json_in_content", "code_fence", "foreign_call_syntax", "multiple_calls", "repaired_json",
                         "stringified_arguments", "nonstandard_keys"})  # fmt: skip


def evidence_for(modes: list[str], details: dict[str, Any], content: ContentResult, calls: list[ToolCall]) -> dict[str, Any]:
    """``{mode: {"rule", "span"}}`` for each label, the span at most a few hundred characters.

    Args:
        modes: the reply's labels.
        details: the steps' details, keyed by mode where a step recorded one.
        content: the content analysis (its excerpts, prose and the span of each content mode).
        calls: every call of the reply.
    """
    out: dict[str, Any] = {}
    if not modes:
        return out

    def first_call() -> str:
        return content.excerpts[0] if content.excerpts else (_call_text(calls[0]) if calls else "")

    structured = next((c for c in calls if c.source == "structured"), None)
    for mode in modes:
        if mode in content.spans:  # the content's own text of the first attempt that shows the mode
            span = content.spans[mode]
        elif mode in _FROM_CALLS and structured is not None:  # shown by a structured call
            span = _call_text(structured)
        elif mode == "reasoning_leak":
            span = content.reasoning.strip()
        elif mode == "truncated_by_length":
            span = "finish_reason: length"
        elif mode == "unknown_tool" and isinstance(details.get(mode), dict):
            span = ", ".join(name or "(no name)" for name in details[mode])
        elif mode in details and mode not in ("wrappers",):
            span = details[mode] if isinstance(details[mode], str) else PLAIN_JSON.encode(details[mode])
        elif mode == "mixed_prose":
            span = content.prose.strip()
        elif mode in ("tool_call_tags_in_content", "wrong_wrapper_tag"):
            span = ", ".join(details.get("wrappers", [])) or first_call()
        elif mode in _FROM_CALLS:
            span = first_call()
        else:
            span = ""
        out[mode] = {"rule": RULES.get(mode, ""), "span": short(span)}
    return out


def _call_text(call: ToolCall) -> str:
    return PLAIN_JSON.encode({"name": call.name, "arguments": call.arguments})
