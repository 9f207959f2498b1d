"""What the servers' own words mean: refusals no retry can fix, the server's own timing of a reply, and when to retry.

Each wording is quoted from the server's source (cited beside it), so a backend can tell a server that
was started without a setting the request needs (:class:`~harness.errors.ServerConfigError`, one
sentence naming the setting) and a conversation that outgrew the context
(:class:`~harness.errors.ContextOverflow`, the run's outcome ``context_overflow``) from a transient
failure worth retrying. Pure functions; the backends decide when to call them.

Sources read (see the README, "Wire formats"): llama.cpp ``tools/server/server-common.cpp``
(``oaicompat_chat_params_parse``, ``format_error_response``), ``tools/server/server-task.h``
(``result_timings``); Ollama ``server/routes.go``, ``llm/llama_server.go``, ``runner/ollamarunner/runner.go``.
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime
from typing import Any

import httpx

from harness.backends.base import GenerateOptions
from harness.errors import BackendError, ContextOverflow, ServerConfigError

__all__ = [
    "error_detail", "is_context_overflow", "is_model_not_found", "json_error_detail", "openai_request_settings", "parent_url",
    "parse_retry_after", "permanent_error", "server_timings",
]  # fmt: skip

_CONTEXT_OVERFLOW_WORDINGS = (
    "exceeds the available context size",  # llama.cpp, exceed_context_size_error (HTTP 400); also Ollama 0.33, which passes it on
    "maximum context length is",  # vLLM: "This model's maximum context length is N tokens. However, ..." (HTTP 400)
    "the input length exceeds the context length",  # Ollama 0.13 to 0.32, truncate false: runner/ollamarunner/runner.go
    "the prompt is longer than the context length",  # Ollama 0.33: llm/llama_server.go
)
_TIMING_KEYS = (
    "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n", "predicted_ms",
    "predicted_per_token_ms", "predicted_per_second", "cache_n", "draft_n", "draft_n_accepted",
)  # fmt: skip


def is_context_overflow(detail: str) -> bool:
    """Whether an error message says the conversation is longer than the model's context (any server's wording)."""
    text = detail.lower()
    return any(wording in text for wording in _CONTEXT_OVERFLOW_WORDINGS)


def permanent_error(base_url: str, detail: str) -> BackendError | None:
    """The error for an OpenAI-compatible server's refusal that no retry can fix, or ``None``.

    * llama.cpp's server started without ``--jinja`` answers HTTP 500 ``tools param requires --jinja flag`` (or
      ``tool_choice param requires --jinja flag``) to a request with tools; older builds said ``Unsupported param:
      tools``: a :class:`ServerConfigError` naming ``--jinja``.
    * Any other ``Unsupported param: <name>`` (llama.cpp refuses ``best_of``, ``echo``, ``suffix``): a
      :class:`ServerConfigError` naming the parameter.
    * A conversation longer than the context (:func:`is_context_overflow`): a :class:`ContextOverflow`.

    Args:
        base_url: the server's URL, quoted in the message.
        detail: the server's error message.

    Returns:
        The error to raise (its message is one sentence for the user), or ``None`` for any other refusal.
    """
    if "requires --jinja flag" in detail or detail.startswith(("Unsupported param: tools", "Unsupported param: tool_choice")):
        return ServerConfigError(
            f"The server at {base_url} cannot take tools ({detail}); restart llama-server with --jinja "
            "(and a chat template that supports tools), or run with --tool-mode prompt."
        )
    if detail.startswith("Unsupported param: "):
        name = detail.removeprefix("Unsupported param: ").strip()
        return ServerConfigError(
            f"The server at {base_url} does not accept the request parameter '{name}' ({detail}); "
            "use a server version that accepts it."
        )
    if is_context_overflow(detail):
        return ContextOverflow(
            f"The conversation no longer fits the context of the server at {base_url} ({detail}); raise the "
            "scenario's num_ctx and the server's context size (llama-server --ctx-size, vLLM --max-model-len)."
        )
    return None


def server_timings(value: Any) -> dict[str, float] | None:
    """The numeric fields of llama.cpp's ``timings`` object (``result_timings::to_json``, ``tools/server/server-task.h``).

    Args:
        value: the body's ``timings`` value, anything.

    Returns:
        ``{key: number}`` for the known keys (``prompt_n``, ``prompt_ms``, ``prompt_per_second``, ``predicted_n``,
        ``predicted_ms``, ``predicted_per_second``, ``cache_n``, ...) that hold finite numbers; ``None`` when there
        is no such object or none of them holds a number.
    """
    if not isinstance(value, dict):
        return None
    out = {}
    for key in _TIMING_KEYS:
        number = value.get(key)
        if isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number):
            out[key] = float(number)
    return out or None


def parse_retry_after(value: str | None) -> float | None:
    """Parse a ``Retry-After`` header into seconds.

    Args:
        value: the header value: delay seconds (``"2"``) or an HTTP date, or ``None``.

    Returns:
        Seconds to wait (>= 0), or ``None`` when absent or unparseable.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, seconds) if seconds == seconds else None  # NaN -> None


SNIPPET_CHARS = 200
"""Characters of an unexpected body quoted in error messages."""


def openai_request_settings(options: GenerateOptions, *, tools: bool) -> dict[str, Any]:
    """What an OpenAI-compatible request sends beyond messages and sampling options.

    Args:
        options: the run's options.
        tools: whether the request offers tools.

    Returns:
        ``{"parallel_tool_calls": True}`` when tools are offered (OpenAI's API refuses the field without tools),
        plus ``{"chat_template_kwargs": {"enable_thinking": true|false}}`` when ``options.think`` is ``on``/``off``,
        plus ``{"stream_options": {"include_usage": True}}`` when streaming (the final chunk carries the counts).
    """
    settings: dict[str, Any] = {"parallel_tool_calls": True} if tools else {}
    if options.think != "default":
        settings["chat_template_kwargs"] = {"enable_thinking": options.think == "on"}
    if options.stream:
        settings["stream_options"] = {"include_usage": True}
    return settings


def json_error_detail(response: httpx.Response) -> str | None:
    """The error text of a JSON error body, or ``None``: OpenAI's ``error.message``, Ollama's ``error``, or the flat
    ``{"object": "error", "message": ...}`` of vLLM before its errors moved under ``error`` (and of SGLang), e.g.
    https://github.com/vllm-project/vllm/issues/21165."""
    try:
        body = response.json()
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict):
        return None
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(error, str):
        return error
    flat = body.get("message")
    return flat if body.get("object") == "error" and isinstance(flat, str) else None


def error_detail(response: httpx.Response) -> str:
    """The error text of an error body: OpenAI ``error.message``, Ollama ``error``, or raw text."""
    detail = json_error_detail(response)
    if detail is not None:
        return detail
    text = response.text.strip()
    return text[:SNIPPET_CHARS] if text else response.reason_phrase or "no body"


def is_model_not_found(detail: str) -> bool:
    text = detail.lower()
    return "model" in text and ("not found" in text or "does not exist" in text or "model_not_found" in text)


def parent_url(base_url: str) -> str:
    """``http://h:1/v1`` -> ``http://h:1``; a URL without a path is returned unchanged."""
    url = httpx.URL(base_url)
    path = url.path.rstrip("/")
    parent = path.rsplit("/", 1)[0] if path else ""
    return str(url.copy_with(path=parent or "/")).rstrip("/")
