"""The closed vocabularies the harness shares: outcomes, tool modes and parser policies.

Each is a ``Literal`` type plus a tuple of its values in canonical order, so the type checker
catches a misspelt value and code that needs the list (CLI choices, scenario validation,
reports) reads it from here. Whether a run says something about the model is decided in one
place, :func:`is_scored`.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Literal, get_args

__all__ = [
    "counted",
    "plural",
    "printable",
    "size_text",
    "DEFAULT_THINK",
    "EXCLUDED_OUTCOMES",
    "OUTCOMES",
    "PARSER_POLICIES",
    "SCORED_OUTCOMES",
    "THINK_SETTINGS",
    "TOOL_MODES",
    "Outcome",
    "ParserPolicy",
    "Think",
    "ToolMode",
    "is_scored",
]

Outcome = Literal["pass", "task_failed", "turn_limit", "token_limit", "infra_error", "interrupted", "context_overflow"]
"""How a run ended: ``pass`` (the loop ended by itself and every done check holds), ``task_failed``,
``turn_limit``, ``token_limit`` (the circuit breaker stopped it), ``infra_error`` (the server failed:
never a model failure), ``interrupted`` (Ctrl-C) or ``context_overflow`` (the conversation outgrew the
context the scenario asked for and the server, told not to truncate, refused it: a fact about the
scenario's ``num_ctx``, not a model failure)."""
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

SCORED_OUTCOMES: tuple[Outcome, ...] = ("pass", "task_failed", "turn_limit", "token_limit")
"""Outcomes that say something about the model: the denominators of every rate."""
EXCLUDED_OUTCOMES: tuple[str, ...] = ("infra_error", "interrupted", "context_overflow", "unfinished")
"""Outcomes left out of every denominator (``unfinished``: the run has no end row yet)."""

ToolMode = Literal["native", "prompt"]
"""How tools reach the model: ``native`` (the API's ``tools`` field) or ``prompt`` (rendered into the system prompt)."""
TOOL_MODES: tuple[ToolMode, ...] = get_args(ToolMode)

ParserPolicy = Literal["strict", "lenient"]
"""Which calls the loop executes: ``strict`` (structured calls only) or ``lenient`` (also calls recovered from text)."""
PARSER_POLICIES: tuple[ParserPolicy, ...] = get_args(ParserPolicy)

Think = Literal["default", "on", "off"]
"""Whether the model is asked to think: ``default`` (the request says nothing: Ollama then turns thinking on for
models that can think), ``on`` or ``off`` (said explicitly: Ollama's ``think``, llama.cpp's and vLLM's
``chat_template_kwargs.enable_thinking``)."""
THINK_SETTINGS: tuple[Think, ...] = get_args(Think)
DEFAULT_THINK: Think = "default"


def is_scored(outcome: str | None) -> bool:
    """Whether a run with this outcome counts in rates (``None``: the run has not ended, so no).

    Args:
        outcome: a run's outcome, or None when it has no end row.

    Returns:
        True for :data:`SCORED_OUTCOMES`; False for ``infra_error``, ``interrupted``, ``context_overflow``,
        unfinished runs and anything else.
    """
    return outcome in SCORED_OUTCOMES


def plural(count: int, word: str) -> str:
    """``"1 run"``, ``"3 runs"``: a count with its noun (console lines and the report alike)."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def counted(names: Sequence[str]) -> str:
    """Names in first-seen order, each once, with ``×N`` when it occurs N > 1 times: ``"file_json_field ×5,
    names_files"`` (a scenario's checks of one type; the run line and the viewer's run list alike)."""
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(name + (f" ×{n}" if n > 1 else "") for name, n in counts.items())


def size_text(size: int) -> str:
    """A file size in decimal units as ``harness models list`` shows it: ``"98.4 MB"``, ``"4.68 GB"`` (``size`` in bytes)."""
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.1f} MB"


_UNSAFE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})  # controls, format (bidi) and line separators, lone surrogates


def printable(text: str, limit: int | None = None) -> str:
    """``text`` safe for one console line: control, format and separator characters and lone surrogates escaped
    (``\\x1b``, ``\\r``, ``\\n``, ``\\u202e``), so a server's words cannot move the cursor, recolour or split a
    line; cut to ``limit`` characters when given."""
    if limit is not None and len(text) > limit:
        text = f"{text[:limit]}… ({len(text) - limit} more characters in the ledger)"
    return "".join(ascii(ch)[1:-1] if unicodedata.category(ch) in _UNSAFE else ch for ch in text)
