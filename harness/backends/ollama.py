"""Backend for Ollama's native ``POST /api/chat``.

Why native and not Ollama's OpenAI-compatible endpoint: only the native API takes
``options.num_ctx``, and Ollama's default context silently truncates long agent
conversations. Every request therefore sends ``temperature``, ``seed``, ``num_ctx`` and
``num_predict`` explicitly.

Design: :class:`OllamaBackend` subclasses :class:`OpenAICompatBackend` and overrides only the
wire format and the error wording; connection handling and error translation are shared.
Messages arrive in the OpenAI shape and are translated at this edge (:func:`to_ollama_messages`):
assistant tool-call ``arguments`` become JSON objects, each call keeps its ``id`` (Ollama assigns
``call_...`` ids and templates match results to calls by them), and tool results carry
``tool_call_id`` and ``tool_name`` (``api/types.go``, ``Message``). Replies keep ``message.tool_calls``
exactly as Ollama returned them (``id``, ``function.index``, ``function.name``, ``function.arguments``)
and ``message.thinking`` as the reasoning.

Every request sends ``truncate: false``: Ollama otherwise drops the oldest messages when the prompt
exceeds ``num_ctx`` (``server/routes.go``, ``chatPrompt`` in ``server/prompt.go``), so the model would
silently see another conversation; the refusal it sends instead is a
:class:`~harness.errors.ContextOverflow`. ``think`` is sent only when the run sets it (``on``/``off``):
left out, Ollama turns thinking on for every model whose capabilities include ``thinking``, and answers
HTTP 400 ``"<model>" does not support thinking`` to ``think: true`` for one that cannot
(:class:`~harness.errors.ServerConfigError`; :meth:`OllamaBackend.can_think` lets the runner say so
before a matrix starts). When Ollama's own tool-call
parser refuses the model's output (HTTP 500 ``error parsing tool call: raw='...', err=...``), the
refusal is returned as a reply with ``rejection`` set and the quoted raw text as its content
(:meth:`OllamaBackend._rejection`).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx

from harness.backends.base import BackendIdentity, GenerateOptions, Reply
from harness.backends.openai_compat import DEFAULT_TIMEOUT_S, OpenAICompatBackend, _snippet
from harness.backends.server_facts import REQUEST_TIMEOUT_BASE_S, ollama_facts
from harness.backends.server_words import is_context_overflow
from harness.errors import BackendError, BackendResponseError, ContextOverflow, ServerConfigError

__all__ = ["DEFAULT_OLLAMA_URL", "OllamaBackend", "to_ollama_messages"]

#: where Ollama listens when ``OLLAMA_HOST`` is not set
DEFAULT_OLLAMA_URL = "http://localhost:11434"
_PARSE_ERROR = "error parsing tool call"
_RAW_QUOTED = re.compile(r"error parsing tool call: raw='(.*)', err=", re.DOTALL)


class OllamaBackend(OpenAICompatBackend):
    """A model served by Ollama, spoken to over its native ``/api/chat``.

    Example::

        with OllamaBackend("qwen2.5-coder:1.5b") as backend:
            reply = backend.generate(messages, tools, GenerateOptions(num_ctx=8192))

    Args:
        model: Ollama model name, e.g. ``qwen2.5-coder:1.5b``.
        base_url: Ollama's root URL (no ``/api``), default ``http://localhost:11434``.
        api_key: sent as a Bearer token when given (for Ollama behind an auth proxy).
        timeout_s: total deadline of one request, seconds; ``None``: 60 s plus 0.2 s per token of ``max_tokens``.
        client: an ``httpx.Client`` to use instead of a private one.
        url_from_spec: the URL was written in the model spec (``ollama:MODEL@URL``), not taken from ``OLLAMA_HOST``
            or the default: the unreachable sentence then points at the spec, not at ``OLLAMA_HOST``.
    """

    kind = "ollama"

    def __init__(
        self,
        model: str,
        base_url: str = DEFAULT_OLLAMA_URL,
        *,
        api_key: str | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        client: httpx.Client | None = None,
        url_from_spec: bool = False,
    ) -> None:
        super().__init__(model, base_url, api_key=api_key, timeout_s=timeout_s, client=client)
        self.url_from_spec = url_from_spec

    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
        """Send one ``/api/chat`` request and return the reply (NDJSON chunks assembled when ``options.stream``).

        Args:
            messages: the conversation, OpenAI chat shape (translated here).
            tools: OpenAI tool definitions; omitted when ``None`` or empty.
            options: sent as ``options: {temperature, seed, num_ctx, num_predict}``, with ``truncate: false``
                and, unless ``options.think`` is ``default``, ``think: true|false``.

        Returns:
            The reply: ``message.content``, ``message.tool_calls`` as returned, ``message.thinking`` as
            ``reasoning``, ``done_reason`` as ``finish_reason``, ``prompt_eval_count`` / ``eval_count`` as
            prompt / completion tokens (``None`` when absent: Ollama leaves out a count of zero), latency
            in ms, the whole body as ``raw``.

        Raises:
            BackendUnavailable: Ollama is not running at the URL, or dropped the connection.
            BackendTimeout: no complete answer within the request's deadline (``timeout_s``, else 60 s + 0.2 s per token).
            ModelNotFound: the model is not pulled (HTTP 404 ``model 'M' not found`` or
                ``model "M" not found, try pulling it first``, both in ``server/routes.go``).
            ContextOverflow: the conversation is longer than ``num_ctx``.
            ServerConfigError: the model cannot think but ``think`` is ``on``, or cannot take tools.
            BackendResponseError: another HTTP error (a busy server's 503 ``server busy, please try again.
                maximum pending requests exceeded`` comes without ``Retry-After`` and is retried with backoff),
                or a body that is not the expected JSON.
        """
        return super().generate(messages, tools, options)

    def identity(self) -> BackendIdentity:
        """Return Ollama's version and the model's manifest digest (``sha256:<hex>``).

        Queries ``GET /api/version`` and ``GET /api/tags``: ``/api/show`` has no digest, and the
        ``digest`` of ``/api/tags`` is the SHA-256 of the model's manifest file (``manifest/manifest.go``),
        not of the weights, so it is recorded as ``manifest_digest``. Missing fields are ``None``;
        the result is cached.

        Raises:
            BackendUnavailable: Ollama is not running at the URL.
            BackendTimeout: Ollama did not answer the metadata request in time.
        """
        if self._identity is None:
            version = self._get_json("GET", "/api/version").get("version")
            self._identity = BackendIdentity(
                backend=self.kind,
                model=self.model,
                base_url=self.base_url,
                server_version=version if isinstance(version, str) else None,
                manifest_digest=self._manifest_digest(),
            )
        return self._identity

    def can_think(self) -> bool | None:
        """Whether ``capabilities`` in ``POST /api/show`` lists ``thinking`` (``types/model/capability.go``).

        Returns:
            ``True``/``False``, or ``None`` when Ollama gives no capabilities list (older versions, an error).

        Raises:
            BackendUnavailable: Ollama is not running at the URL.
            BackendTimeout: Ollama did not answer in time.
        """
        capabilities = self._get_json("POST", "/api/show", {"model": self.model}).get("capabilities")
        if not isinstance(capabilities, list):
            return None
        return "thinking" in capabilities

    def provenance(self) -> dict[str, Any]:
        """``POST /api/show`` as :func:`~harness.backends.server_facts.ollama_facts` reads it (template, ``tools``
        capability, ``parameters``, quantisation, parameter size); ``{}`` when Ollama answers with an error.

        Raises:
            BackendUnavailable: Ollama is not running at the URL.
            BackendTimeout: Ollama did not answer in time.
        """
        return ollama_facts(self._get_json("POST", "/api/show", {"model": self.model}))

    def warm_up(self) -> float | None:
        """``POST /api/chat`` with an empty ``messages`` list: Ollama loads the model and answers ``done_reason: "load"``
        (``server/routes.go``, ``ChatHandler``), generating nothing.

        Returns:
            Its wall-clock time, ms.

        Raises:
            BackendError: Ollama failed the request (e.g. HTTP 404: the model is not pulled).
        """
        start = time.perf_counter()
        response = self._request("POST", self._chat_url(), json_body={"model": self.model, "messages": [], "stream": False})
        self._raise_for_status(response)
        return (time.perf_counter() - start) * 1000.0

    def request_settings(self, options: GenerateOptions, *, tools: bool) -> dict[str, Any]:
        """``truncate: false`` always, and ``think: true|false`` when ``options.think`` is ``on``/``off``."""
        settings: dict[str, Any] = {"truncate": False}
        if options.think != "default":
            settings["think"] = options.think == "on"
        return settings

    # -- wire format ----------------------------------------------------------------------

    def _chat_url(self) -> str:
        return f"{self.base_url}/api/chat"

    def _build_payload(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": to_ollama_messages(messages),
            "stream": options.stream,
            "options": {
                "temperature": options.temperature,
                "seed": options.seed,
                "num_ctx": options.num_ctx,
                "num_predict": options.max_tokens,
            },
        }
        if tools:
            payload["tools"] = tools
        payload.update(self.request_settings(options, tools=bool(tools)))
        return payload

    _sse = False  # NDJSON: one JSON object per line, the last (done: true) with the counts and durations

    def _parse_reply(self, body: dict[str, Any], latency_ms: float) -> Reply:
        message = body.get("message")
        if not isinstance(message, dict):
            raise BackendResponseError(
                f"Ollama at {self.base_url} answered without a 'message' object ({_snippet(body)}); "
                f"check that the URL points at Ollama itself, not its /v1 API.",
                status_code=None,
            )
        return Reply(
            content=message.get("content"),
            tool_calls=message.get("tool_calls"),
            finish_reason=body.get("done_reason"),
            prompt_tokens=body.get("prompt_eval_count"),  # Reply keeps only believable counts
            completion_tokens=body.get("eval_count"),
            latency_ms=latency_ms,
            raw=body,
            identity=self._reply_identity(),
            reasoning=message.get("thinking"),
        )

    def _rejection(self, status: int, detail: str) -> tuple[str, str | None] | None:
        """Ollama's tool-call parser refused the model's output: HTTP 500 ``error parsing tool call: raw='<text>',
        err=<Go JSON error>`` (older versions give only ``error parsing tool call: <Go JSON error>``).

        Returns:
            ``("ollama", text)`` with the quoted raw model text (``None`` when the body quotes none), else ``None``.
        """
        if status != 500 or not detail.startswith(_PARSE_ERROR):
            return None
        quoted = _RAW_QUOTED.match(detail)
        return "ollama", quoted.group(1) if quoted else None

    def _permanent_error(self, status: int, detail: str) -> BackendError | None:
        """Ollama's refusals no retry can fix (``server/routes.go``, ``ChatHandler``), else ``None``.

        HTTP 400 ``"<model>" does not support thinking`` (``think: true`` for a model that cannot think) and
        ``... does not support tools`` are :class:`ServerConfigError`; a conversation longer than ``num_ctx``
        (``truncate: false``) is a :class:`ContextOverflow`.
        """
        if "does not support thinking" in detail:
            return ServerConfigError(
                f"Ollama says {detail}; run it with --think off or --think default (or `think` in the scenario's [matrix])."
            )
        if "does not support tools" in detail:
            return ServerConfigError(f"Ollama says {detail}; run it with --tool-mode prompt.")
        if is_context_overflow(detail):
            return ContextOverflow(
                f"The conversation no longer fits the context Ollama gave '{self.model}' ({detail}); raise the scenario's num_ctx."
            )
        return None

    def _unreachable_message(self) -> str:
        where = "correct the URL in the model spec" if self.url_from_spec else "set OLLAMA_HOST"
        return f"Ollama is not running at {self.base_url}; start it with `ollama serve` or {where}."

    def _model_not_found_message(self, detail: str) -> str:
        return f"Ollama has no model '{self.model}'; run `ollama pull {self.model}` first."

    # -- metadata -------------------------------------------------------------------------

    def _get_json(self, method: str, path: str, json_body: Any = None) -> dict[str, Any]:
        """A metadata request; ``{}`` when Ollama answers with an error status or odd body."""
        response = self._request(
            method, f"{self.base_url}{path}", json_body=json_body, timeout_s=self.timeout_s or REQUEST_TIMEOUT_BASE_S
        )
        if response.status_code >= 400:
            return {}
        try:
            data = response.json()
        except (ValueError, RecursionError):
            return {}
        return data if isinstance(data, dict) else {}

    def _manifest_digest(self) -> str | None:
        """The ``digest`` of this model's entry in ``GET /api/tags`` (``name`` or ``model`` matches; a name without a
        tag matches ``:latest``), as ``sha256:<hex>``; ``None`` when it is not listed."""
        wanted = {self.model, self.model if ":" in self.model else f"{self.model}:latest"}
        models = self._get_json("GET", "/api/tags").get("models")
        for entry in models if isinstance(models, list) else []:
            if isinstance(entry, dict) and (entry.get("name") in wanted or entry.get("model") in wanted):
                digest = entry.get("digest")
                if isinstance(digest, str) and digest:
                    return digest if digest.startswith("sha256:") else f"sha256:{digest}"
                return None
        return None


def to_ollama_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Translate OpenAI-shape chat messages into Ollama's ``/api/chat`` shape.

    * ``content: None`` becomes ``""``.
    * Assistant ``tool_calls[].function.arguments`` become objects: a JSON string is parsed;
      a string that is not a JSON object becomes ``{}`` (the model's broken call is kept in
      the ledger from its original reply, not here). Each call keeps its ``id`` when it has one.
    * Tool messages keep ``content`` and ``tool_call_id`` and get ``tool_name``: the message's
      ``name``, else the name of the assistant tool call whose ``id`` equals its ``tool_call_id``.

    Args:
        messages: OpenAI chat messages (not modified).

    Returns:
        New message dicts in Ollama's shape, same order and length.
    """
    call_names: dict[str, str] = {}
    out: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        item: dict[str, Any] = {"role": role, "content": message.get("content") or ""}
        if role == "assistant" and message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                if call.get("id") and function.get("name"):
                    call_names[call["id"]] = function["name"]
                sent: dict[str, Any] = {"id": call["id"]} if isinstance(call.get("id"), str) and call["id"] else {}
                sent["function"] = {"name": function.get("name"), "arguments": _arguments_object(function.get("arguments"))}
                calls.append(sent)
            item["tool_calls"] = calls
        elif role == "tool":
            call_id = message.get("tool_call_id")
            name = message.get("name") or call_names.get(call_id or "")
            if isinstance(call_id, str) and call_id:
                item["tool_call_id"] = call_id
            if name:
                item["tool_name"] = name
        out.append(item)
    return out


def _arguments_object(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            return {}
        return parsed if isinstance(parsed, dict) else {}
    return {}
