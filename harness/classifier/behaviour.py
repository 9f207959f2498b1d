"""Behaviour checks that read the reply's text: chat-template markup and the scenario's tool
requirement (fabricated tool results are :mod:`harness.classifier.fabrication`'s, narration
instead of a call :mod:`harness.classifier.narration`'s).

Each ``*_step`` returns ``(modes, evidence)``; the rules are docs/failure-modes.md's.
"""

from __future__ import annotations

import re
from typing import Any

from harness.classifier.content import ContentResult
from harness.classifier.heuristics import History
from harness.classifier.types import short

__all__ = ["markup_step", "requirement_step"]


# --------------------------------------------------------------------------- markup and requirement

_TEMPLATE_MARKUP = re.compile(
    r"<\|im_start\|>|<\|im_end\|>|<\|eot_id\|>|<\|eom_id\|>|<\|start_header_id\|>|<\|end_header_id\|>|<\|end\|>|<\|endoftext\|>"
    r"|<\|(?:assistant|user|system)\|>|<start_of_turn>|<end_of_turn>|\[/?INST\]|</s>|<\|begin_of_text\|>"
    r"|<\|start\|>|<\|channel\|>|<\|message\|>|<\|return\|>",
)
_HARMONY_CALL = re.compile(r"to=functions\.|<\|call\|>|<\|constrain\|>")
_HARMONY_TOKEN = re.compile(r"<\|start\|>|<\|channel\|>|<\|message\|>|<\|return\|>|<\|end\|>")
_STRIPPED_HARMONY = re.compile(r"\A\s*analysis\S.*?assistantfinal", re.S)


def markup_step(content: ContentResult) -> tuple[set[str], dict[str, Any]]:
    """``chat_markup_leak``: chat-template tokens in the content (a harmony call header's own tokens excepted)."""
    text = content.visible
    if _HARMONY_CALL.search(text):
        text = _HARMONY_TOKEN.sub(" ", text)  # the call's wrapper as a whole is wrong_wrapper_tag
    whole = text.strip()
    if "<s>" in text and not (whole.startswith("<s>") and whole.endswith("</s>")):
        text = text.replace("</s>", " ")  # <s>$20</s> is HTML strikethrough; <s>...</s> around the whole reply is BOS/EOS
    m = _TEMPLATE_MARKUP.search(text) or _STRIPPED_HARMONY.search(text)
    if m is None:
        return set(), {}
    return {"chat_markup_leak"}, {"chat_markup_leak": short(m.group(), 60)}


_ASKS = re.compile(
    r"\?|\bplease\s+(?:tell|give|provide|specify|share|let me know)\b|\b(?:which|what)\s+\w+\s+(?:do|would|should)\b", re.I
)
_FILLER = re.compile(r"(?<![.!?]\s)(?<!^)\b(?!I\b)[A-Z][a-z]|\d|[\"'`]|\w\.\w", re.M)
"""What could fill an argument in a request: a name (a capital not opening a sentence), a number, a quote, a file name."""


def _asks_for_argument(content: ContentResult, past: History, tools: Any) -> str | None:
    """The required argument a short reply asks for, when the request before it holds nothing that could fill it
    ("Please tell me the city name." after "Can you tell me the time?" with ``get_current_time(city)``): asking is then
    the correct turn, not a skipped tool."""
    text = content.visible.strip()
    if not isinstance(tools, list) or not past.prompt_parts or len(text) > 300 or not _ASKS.search(text):
        return None
    if _FILLER.search(past.prompt_parts[-1][:2000].strip()):
        return None
    for tool in tools[:64]:
        spec = tool.get("function", tool) if isinstance(tool, dict) else None
        params = spec.get("parameters") if isinstance(spec, dict) else None
        required = params.get("required") if isinstance(params, dict) else None
        for name in required if isinstance(required, list) else []:
            if isinstance(name, str) and re.search(rf"\b{re.escape(name.replace('_', ' '))}\b", text, re.I):
                return name
    return None


def requirement_step(
    requires_tool: bool | None, attempts: int, past: History, tools: Any, content: ContentResult
) -> tuple[set[str], dict[str, Any]]:
    """``skipped_required_tool`` and ``unneeded_call`` from the scenario's ``requires_tool`` (None: not judged).

    The flag describes the run's task, not the turn; with ``tools: []`` nothing can be required, so it is false.
    """
    if tools == [] and requires_tool is True:
        requires_tool = False
    if requires_tool is True and not attempts and not past.tool_answered and not _asks_for_argument(content, past, tools):
        return {"skipped_required_tool"}, {"skipped_required_tool": "no call, and no tool has answered in the run"}
    if requires_tool is False and attempts:
        return {"unneeded_call"}, {"unneeded_call": f"{attempts} call attempt(s) where no tool is needed"}
    return set(), {}
