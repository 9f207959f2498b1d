"""How tools and their results travel in the ``messages`` array, in both tool modes.

This module is the one place that knows the two conventions:

* ``native``: tools go in the API's ``tools`` field; the assistant message carries
  ``tool_calls`` (OpenAI shape, arguments as a JSON string) and each result is a
  ``{"role": "tool", "tool_call_id", "name", "content"}`` message.
* ``prompt``: for models whose chat template renders no tools, the tools are rendered into the
  system prompt (Hermes/Qwen style, :func:`render_tools_prompt`); calls are written as
  ``<tool_call>{json}</tool_call>`` text and results come back as user messages wrapped in
  ``<tool_response>`` tags.

The loop builds its messages with :func:`assistant_message` and :func:`result_message`;
``harness rescore`` rebuilds a recorded run's messages with :func:`rebuild_history` and checks
them against :func:`request_hash`; the classifier asks :func:`is_tool_result` which history
messages carry a tool's answer. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from harness.canonical import canonical_json, canonical_members, sha256_of

__all__ = [
    "TOOL_RESPONSE_OPEN",
    "CallLike",
    "RequestHasher",
    "assistant_message",
    "is_tool_result",
    "rebuild_history",
    "refusal_text",
    "render_tools_prompt",
    "request_hash",
    "result_message",
]

TOOL_RESPONSE_OPEN = "<tool_response"
"""How a prompt-mode tool result starts (the user message ``<tool_response>\\n...\\n</tool_response>``)."""
_TOOL_ROLES = ("tool", "function", "ipython")


class CallLike(Protocol):
    """What a message needs of a tool call: its name, parsed arguments and where it came from."""

    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> dict[str, Any]: ...
    @property
    def source(self) -> str: ...


def render_tools_prompt(tool_schemas: Sequence[Mapping[str, Any]]) -> str:
    """Render tool schemas and the calling convention into system-prompt text (Hermes/Qwen style).

    Used in ``prompt`` tool mode for models whose chat template renders no tools.

    Args:
        tool_schemas: OpenAI-style tool definitions, ``{"type": "function", "function": {...}}``.

    Returns:
        The text appended to the system prompt.
    """
    lines = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in tool_schemas)
    return (
        "# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
        "Function results come back inside <tool_response></tool_response> tags. "
        "When the task is done, answer without a tool call."
    )


def assistant_message(content: str | None, calls: Sequence[CallLike], ids: Sequence[str], tool_mode: str) -> dict[str, Any]:
    """The assistant message the loop appends for one reply and the calls it acts on.

    Args:
        content: the reply text (None reads as "").
        calls: the calls the parser policy executes, in order.
        ids: one call id per call (the server's, or ``call_<turn>_<i>``).
        tool_mode: ``native`` or ``prompt``.

    Returns:
        In prompt mode ``{"role": "assistant", "content": text}`` where structured calls are
        appended to the text as ``<tool_call>`` blocks (the template knows no ``tool_calls``
        field); in native mode the OpenAI shape with ``tool_calls`` (arguments as JSON text,
        sorted keys), or without it when there is no call.
    """
    text = content or ""
    if tool_mode == "prompt":
        for call in calls:
            if call.source == "structured":
                payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False, sort_keys=True)
                text += ("\n" if text else "") + f"<tool_call>\n{payload}\n</tool_call>"
        return {"role": "assistant", "content": text}
    if not calls:
        return {"role": "assistant", "content": text}
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)},
            }
            for call, call_id in zip(calls, ids, strict=True)
        ],
    }


def result_message(output: str, *, name: str, call_id: str, tool_mode: str) -> dict[str, Any]:
    """The message answering one executed call.

    Args:
        output: the tool's output text (errors as ``ERROR: ...``).
        name: the tool called.
        call_id: the id the assistant message gave the call.
        tool_mode: ``native`` or ``prompt``.

    Returns:
        ``{"role": "user", "content": "<tool_response>\\n...\\n</tool_response>"}`` in prompt mode,
        ``{"role": "tool", "tool_call_id", "name", "content"}`` in native mode.
    """
    if tool_mode == "prompt":
        return {"role": "user", "content": f"{TOOL_RESPONSE_OPEN}>\n{output}\n</tool_response>"}
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": output}


def is_tool_result(role: Any, text: str) -> bool:
    """Whether a history message carries a tool's answer, in either tool mode.

    Args:
        role: the message's ``role`` (any value; non-strings are never tool results).
        text: the message's text content.

    Returns:
        True for ``tool``/``function``/``ipython`` messages and for user messages holding a
        ``<tool_response`` block (prompt mode).
    """
    return role in _TOOL_ROLES or (role == "user" and TOOL_RESPONSE_OPEN in text)


def request_hash(messages: Sequence[Mapping[str, Any]]) -> str:
    """SHA-256 (hex) of the canonical JSON of a request's messages, as stored in ``turns.request_hash``."""
    return sha256_of(messages)


class RequestHasher:
    """:func:`request_hash` of a message list that only grows, encoding each message once (not the whole list per turn).

    The canonical JSON of a list is ``[`` + :func:`~harness.canonical.canonical_members` of its items' canonical JSON
    + ``]``, and SHA-256 takes its input in pieces: the running hash holds ``[m1,m2,...`` and each :meth:`digest`
    finishes a copy with ``]``. So the value is :func:`request_hash`'s, byte for byte (a test holds them equal).

    The caller owns the list: messages are only appended, never edited or removed, after :meth:`digest` has seen them
    (the loop's ``_Run.messages``; backends read the list and never change it).
    """

    def __init__(self) -> None:
        self._sha = hashlib.sha256(b"[")
        self._seen = 0

    def digest(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The :func:`request_hash` of ``messages`` (64 hex digits): the messages it saw before, plus any new.

        Raises:
            ValueError: ``messages`` is shorter than the list it saw before (it may only grow).
        """
        sha, seen = self._sha, self._seen
        if len(messages) < seen:
            raise ValueError(f"the message list shrank from {seen} to {len(messages)} messages: it may only grow")
        if len(messages) > seen:
            sha.update(canonical_members([canonical_json(m) for m in messages[seen:]], first=not seen).encode("utf-8"))
            self._seen = len(messages)
        done = sha.copy()
        done.update(b"]")
        return done.hexdigest()


@dataclass(frozen=True)
class _Executed:
    name: str
    arguments: dict[str, Any]
    source: str


def rebuild_history(
    system_prompt: str, task: str, tool_mode: str, turns: Iterable[tuple[str | None, Sequence[Mapping[str, Any]]]]
) -> list[list[dict[str, Any]]]:
    """Rebuild the request messages of every turn of a recorded run, as the loop sent them.

    Args:
        system_prompt: the system message the run sent (``runs.config["system_prompt"]``).
        task: the user message (``runs.config["task"]``).
        tool_mode: the run's tool mode.
        turns: per turn in order, ``(content, executed_calls)`` where each executed call is
            ``{"id", "name", "arguments", "source", "output", ...}`` as stored in the ledger.

    Returns:
        ``messages[i]`` is the list sent for turn ``i + 1``; its :func:`request_hash` equals the
        turn's stored ``request_hash`` when the ledger is intact.

    Raises:
        KeyError, TypeError: an executed call lacks a field the loop always stores.
    """
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt}, {"role": "user", "content": task}]
    out = []
    for content, executed in turns:
        out.append(list(messages))
        calls = [_Executed(c["name"], c["arguments"], c.get("source", "structured")) for c in executed]
        messages.append(assistant_message(content, calls, [c["id"] for c in executed], tool_mode))
        for c in executed:
            messages.append(result_message(c["output"], name=c["name"], call_id=c["id"], tool_mode=tool_mode))
    return out


def refusal_text(rejection: Any) -> str | None:
    """The classifier's ``server_rejection`` input from a reply's (or a stored turn's) ``rejection`` record, or None."""
    if rejection is None:
        return None
    error = rejection.get("error") if isinstance(rejection, dict) else None
    return error if isinstance(error, str) and error else "the server refused the reply"
