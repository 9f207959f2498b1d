"""The one protocol every backend implements, and the value types it exchanges.

A backend knows HTTP (or a cassette file) and nothing about the agent loop: it turns one
``messages`` list plus tool schemas into one :class:`Reply`. Retries, timing of whole runs,
classification and ledger writes live in :mod:`harness.loop`.

Messages use the OpenAI chat shape throughout the harness::

    {"role": "system" | "user" | "assistant" | "tool", "content": str | None,
     "tool_calls": [{"id": str, "type": "function",
                     "function": {"name": str, "arguments": str}}],   # assistant only
     "tool_call_id": str, "name": str}                                 # tool only

Backends that speak another wire format (Ollama's ``/api/chat``) translate at their edge. What a
backend sends beyond the messages and the sampling options (Ollama's ``truncate``, the
OpenAI-compatible ``parallel_tool_calls``, the thinking switch) is :meth:`Backend.request_settings`,
recorded with every run.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field, fields
from typing import Any

from harness.vocab import DEFAULT_THINK, Think

__all__ = ["Backend", "BackendIdentity", "GenerateOptions", "Reply", "rejection_record"]

DEFAULT_MAX_TOKENS = 512
DEFAULT_NUM_CTX = 4096


@dataclass(frozen=True)
class GenerateOptions:
    """Sampling and context options sent explicitly on every request.

    Attributes:
        temperature: sampling temperature, >= 0.
        seed: sampling seed (integer), sent to servers that accept one.
        max_tokens: cap on completion tokens per reply.
        num_ctx: context length in tokens (Ollama ``options.num_ctx``; embedded ``n_ctx``).
        think: ``default`` (the request says nothing about thinking), ``on`` or ``off``
            (:data:`harness.vocab.THINK_SETTINGS`; each backend's field: :meth:`Backend.request_settings`).
        stream: ask for a streamed reply (server-sent events, Ollama's NDJSON) and assemble it
            (:mod:`harness.backends.streaming`); the replay backend ignores it.
    """

    temperature: float = 0.0
    seed: int = 0
    max_tokens: int = DEFAULT_MAX_TOKENS
    num_ctx: int = DEFAULT_NUM_CTX
    think: Think = DEFAULT_THINK
    stream: bool = False

    def as_dict(self) -> dict[str, Any]:
        """Return the options as a plain JSON-ready dict; ``think`` only when it is not ``default``, ``stream`` only when on.

        The dict is part of every run's identity, so a setting added later enters it only when set:
        runs recorded before it existed keep their identity.
        """
        out = {name: getattr(self, name) for name in _OPTION_FIELDS}  # scalars: asdict's deep copy would copy nothing
        if self.think == DEFAULT_THINK:
            del out["think"]
        if not self.stream:
            del out["stream"]
        return out


_OPTION_FIELDS = tuple(f.name for f in fields(GenerateOptions))
""":class:`GenerateOptions`' field names in order (``dataclasses.fields`` walks the class on every call)."""


@dataclass(frozen=True)
class BackendIdentity:
    """What served a reply, as far as the server tells.

    Attributes:
        backend: backend kind: ``ollama``, ``openai``, ``embedded`` or ``replay``.
        model: the model name sent to the server (or the cassette path for replay).
        base_url: the server's base URL, or ``None`` when there is no server.
        server_version: server version string, or ``None`` when not exposed.
        model_digest: SHA-256 of the model file itself (the embedded model's GGUF, a replay cassette),
            or ``None`` when the server exposes none (Ollama and OpenAI-compatible servers do not).
        manifest_digest: Ollama's digest of the model's manifest (``sha256:<hex>`` of the manifest file,
            from ``GET /api/tags``; ``manifest/manifest.go``): it changes when any layer changes (weights,
            template, parameters, system prompt), so it names the model as served, but it is not a hash
            of the weights. ``None`` for other backends.
        slots: the parallel slots the harness started the server with (the embedded backend's ``--embedded-slots``),
            which change llama.cpp's batched arithmetic and so the replies; ``None`` for a server the harness does not
            start (what such a server reports is recorded with each run, not part of its identity:
            ``server_slots``, :mod:`harness.startup`).
    """

    backend: str
    model: str
    base_url: str | None = None
    server_version: str | None = None
    model_digest: str | None = None
    manifest_digest: str | None = None
    slots: int | None = None

    @property
    def identity_digest(self) -> str | None:
        """The digest that enters a run's identity: the model file's, else Ollama's manifest digest."""
        return self.model_digest or self.manifest_digest

    @property
    def identity_slots(self) -> int | None:
        """The slot count that enters a run's identity: :attr:`slots` when it is not 1, else ``None`` (one slot, or a
        server the harness does not start), so runs recorded before slots were counted keep their identity."""
        return self.slots if self.slots is not None and self.slots != 1 else None


@dataclass
class Reply:
    """One assistant reply, as the server gave it.

    Attributes:
        content: the message text, or ``None`` (OpenAI content parts are joined; other
            non-string values are kept as their JSON text).
        tool_calls: the structured tool calls exactly as the server returned them
            (list of dicts), or ``None`` when the server returned none.
        finish_reason: ``stop``, ``length``, ``tool_calls``, ... as reported (non-strings as
            JSON text), or ``None``.
        prompt_tokens: prompt token count reported by the server, or ``None`` (also when the
            server's value is not an integer in ``[0, MAX_TOKEN_COUNT]``).
        completion_tokens: completion token count reported by the server, or ``None`` (same rule).
        latency_ms: wall-clock time of the request in milliseconds (None when unknown).
        raw: the server's raw JSON body (dict), stored verbatim in the ledger.
        identity: what served the reply.
        reasoning: the reasoning text the server returned beside the content
            (``reasoning_content`` or ``reasoning`` in OpenAI-compatible bodies, Ollama's
            ``thinking``), or ``None``; non-strings are kept as their JSON text.
        rejection: set when the server's own tool-call parser refused the model's reply (a model
            failure, not the server's: see :func:`rejection_record`): ``{"server", "status", "error"}``
            (``llama.cpp``, ``ollama`` or ``vllm``; the HTTP status; the server's error message).
            ``raw`` is then the error body and ``content`` the model's text when the body quotes it.
        timings: the server's own timing of the reply, when it reports one (llama.cpp's ``timings``:
            ``prompt_n``, ``prompt_ms``, ``prompt_per_second``, ``predicted_n``, ``predicted_ms``,
            ``predicted_per_second``, ... as numbers; ``tools/server/server-task.h``), else ``None``.
        stream_chunks: a streamed reply's raw chunks, ``[{"t": ms since the request, "data": text}]``, from which
            the reply was assembled (:func:`harness.backends.streaming.assemble`); ``None`` when not streamed.
        stream_problems: what could not be assembled from the chunks (the classifier's ``stream_problems``).
        ttft_ms: time to first token, ms: measured on a stream; from the server's own timings otherwise
            (llama.cpp's ``timings.prompt_ms``, Ollama's durations); ``None`` when unknown.
        decode_tps: decode rate, completion tokens per second, measured or from the server's timings; ``None``
            when unknown.
    """

    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float | None
    raw: Any
    identity: BackendIdentity
    reasoning: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    rejection: dict[str, Any] | None = None
    timings: dict[str, float] | None = None
    stream_chunks: list[dict[str, Any]] | None = None
    stream_problems: list[str] = field(default_factory=list)
    ttft_ms: float | None = None
    decode_tps: float | None = None

    def __post_init__(self) -> None:
        # Servers send anything; the harness's fields are typed (the raw body keeps the original).
        self.content = _text_or_none(self.content)
        self.reasoning = _text_or_none(self.reasoning)
        if self.finish_reason is not None and not isinstance(self.finish_reason, str):
            self.finish_reason = json.dumps(self.finish_reason)
        self.prompt_tokens = _count_or_none(self.prompt_tokens)
        self.completion_tokens = _count_or_none(self.completion_tokens)

    def response_dict(self) -> dict[str, Any]:
        """The reply in the cassette / ``harness classify`` shape.

        Returns:
            ``{"content", "tool_calls", "finish_reason", "usage": {"prompt_tokens",
            "completion_tokens"}}``, plus ``"reasoning_content"`` when the server returned reasoning and
            ``"server_rejection"`` (:attr:`rejection`) when the server refused the reply.
        """
        out: dict[str, Any] = {
            "content": self.content,
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens},
        }
        if self.reasoning is not None:
            out["reasoning_content"] = self.reasoning
        if self.rejection is not None:
            out["server_rejection"] = self.rejection
        return out


MAX_TOKEN_COUNT = 2**40
"""Token counts outside ``[0, MAX_TOKEN_COUNT]`` are not believable and are recorded as unknown."""


def rejection_record(server: str, status: int, error: str) -> dict[str, Any]:
    """The :attr:`Reply.rejection` record of a reply the server's tool-call parser refused.

    Args:
        server: which parser refused it: ``llama.cpp``, ``ollama`` or ``vllm``.
        status: the HTTP status of the refusal.
        error: the server's error message, verbatim.
    """
    return {"server": server, "status": status, "error": error}


def _count_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        return None
    return value


def _text_or_none(value: Any) -> str | None:
    """Message content as text: strings as they are, OpenAI content parts joined, anything else as JSON."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        return "".join(str(p.get("text", "")) for p in value if p.get("type", "text") == "text")
    return json.dumps(value, ensure_ascii=False, default=str)


class Backend(abc.ABC):
    """A model server (or a cassette) that answers chat requests.

    Subclasses implement :meth:`generate`; the rest have working defaults. Use as a context
    manager or call :meth:`close`.

    Example::

        with open_backend("replay:tests/cassettes/pass.jsonl") as backend:
            backend.start_run()
            reply = backend.generate(messages, tools, GenerateOptions(temperature=0.2))
    """

    #: the model spec string this backend was opened from, e.g. ``ollama:qwen2.5:7b``
    spec: str = ""

    @abc.abstractmethod
    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
        """Send one chat request and return the assistant reply.

        Args:
            messages: the conversation so far, OpenAI chat shape (see module docstring).
            tools: OpenAI-style tool definitions (``{"type": "function", "function": {...}}``)
                for the API's ``tools`` field, or ``None`` to send none.
            options: sampling and context options, always sent explicitly.

        Returns:
            The reply, with latency in ms and the raw body.

        Raises:
            BackendUnavailable, BackendTimeout, BackendResponseError, ModelNotFound,
            CassetteExhausted: the server (not the model) failed.
        """

    def identity(self) -> BackendIdentity:
        """Return what this backend talks to (queried lazily; may contact the server).

        Raises:
            BackendError: the server cannot be reached.
        """
        return BackendIdentity(backend=type(self).__name__, model=self.spec)

    def request_settings(self, options: GenerateOptions, *, tools: bool) -> dict[str, Any]:
        """What the request sends beyond the messages and the sampling options, recorded with each run.

        Args:
            options: the run's options (``think`` decides the thinking field).
            tools: whether the request carries tools.

        Returns:
            The fields and their values as sent, e.g. ``{"truncate": False, "think": True}``; ``{}`` by default.
        """
        return {}

    def can_think(self) -> bool | None:
        """Whether the model can think (reason before answering), as the server reports it.

        Returns:
            ``True`` or ``False`` when the server says (Ollama's ``/api/show`` ``capabilities``), ``None`` when unknown.

        Raises:
            BackendError: the server cannot be reached.
        """
        return None

    def provenance(self) -> dict[str, Any]:
        """What shaped the model's output, as the server reports it (:data:`harness.backends.server_facts.ModelFacts`).

        Returns:
            The chat template, its tool support, the server's sampling defaults, quantisation and parameter count;
            ``{}`` when the server reports none of it (a replay cassette, a hosted API).

        Raises:
            BackendError: the server cannot be reached.
        """
        return {}

    def warm_up(self) -> float | None:
        """Send one request that makes the server load the model, so start-up stays out of the turns' latency.

        Returns:
            Its wall-clock time in ms, or ``None`` when the backend has nothing to warm (a replay cassette).

        Raises:
            BackendError: the server failed the request.
        """
        return None

    def start_run(self) -> None:  # noqa: B027 - an optional hook, a no-op unless overridden
        """Called before each run; the replay backend rewinds its cassette here, a replica set's handle picks its
        replica (:mod:`harness.replicas`)."""

    def end_run(self) -> None:  # noqa: B027 - an optional hook, a no-op unless overridden
        """Called once the run has ended (its end row written or not), also when :meth:`start_run` failed."""

    def run_facts(self) -> dict[str, Any]:
        """Facts about this run's handle recorded in the run's ``config`` (after :meth:`start_run`), e.g. the
        replica serving it; ``{}`` by default."""
        return {}

    def for_run(self) -> Backend:
        """Return a handle for one run that may proceed concurrently with other runs.

        Stateless HTTP backends share one (thread-safe) client and return ``self``; backends
        with per-run state (replay's cassette cursor) return a fresh handle sharing the rest.
        Closing the handle must not close the shared backend.
        """
        return self

    def close(self) -> None:  # noqa: B027 - an optional hook, a no-op unless overridden
        """Release connections and stop any server this backend started."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
