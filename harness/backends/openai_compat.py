"""Backend for any server speaking the OpenAI ``/chat/completions`` API.

Design:

* One ``httpx.Client`` per backend and run thread (:class:`~harness.backends.clients.ThreadClients`), so each run
  thread reuses its own connection and runs in flight share no connection pool; the timeout is set once. Without a
  proxy in the environment a chat request goes to the client's transport directly (:meth:`ThreadClients.direct`).
* Every ``httpx`` error is translated at this boundary into the :mod:`harness.errors` tree, keeping the original as
  ``__cause__``: connection problems become :class:`~harness.errors.BackendUnavailable` (but a certificate that does not
  verify: :class:`~harness.errors.ServerConfigError`; wording in :func:`~harness.backends.server_words.connect_error`), timeouts
  :class:`~harness.errors.BackendTimeout`, HTTP error statuses and bodies that are not the expected JSON
  :class:`~harness.errors.BackendResponseError`, and a 404 that names a missing model :class:`~harness.errors.ModelNotFound`.
* Replies are reported exactly as the server gave them: ``tool_calls`` is not repaired or
  normalised, and ``raw`` holds the whole parsed body.
* A server whose own tool-call parser refuses the model's reply answers with an error status,
  but the failure is the model's: :meth:`OpenAICompatBackend._rejection` recognises those bodies
  (llama.cpp's ``Failed to parse tool call arguments as JSON``, vLLM's pydantic ``Invalid JSON``
  on a forced call) and :meth:`~OpenAICompatBackend.generate` returns them as a :class:`Reply`
  with ``rejection`` set, never as an error, so they are neither retried nor counted as
  ``infra_error`` (docs/failure-modes.md#server_rejected_call).
* Every request that offers tools says ``parallel_tool_calls: true``: llama.cpp's server otherwise lets
  the chat template allow one call per reply (``tools/server/server-common.cpp``, ``oaicompat_chat_params_parse``),
  while Ollama allows several, so multi-call behaviour would not be comparable. ``think`` ``on``/``off`` is sent
  as ``chat_template_kwargs: {"enable_thinking": true|false}`` (read by llama.cpp in the same function, and by vLLM).
  Both are recorded with each run (:meth:`OpenAICompatBackend.request_settings`).
* Errors that no retry can fix are recognised by their wording (:mod:`harness.backends.server_words`):
  a server started without the setting the request needs (llama.cpp's HTTP 500 ``tools param requires --jinja
  flag``, ``Unsupported param: ...``) is a :class:`~harness.errors.ServerConfigError` naming the setting; a
  conversation longer than the context (llama.cpp's ``exceed_context_size_error``, vLLM's ``This model's maximum
  context length is ...``) a :class:`~harness.errors.ContextOverflow`.
* llama.cpp's ``timings`` object (prompt and decode speed) is read into :attr:`Reply.timings`.
* :class:`~harness.backends.ollama.OllamaBackend` subclasses this class and overrides only
  the wire format (URL, request payload, reply parsing) and its error wording.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from harness.backends import server_words as _words
from harness.backends.base import Backend, BackendIdentity, GenerateOptions, Reply, rejection_record
from harness.backends.clients import ThreadClients
from harness.backends.deadline import bind, hold
from harness.backends.server_facts import (
    REQUEST_TIMEOUT_BASE_S,
    REQUEST_TIMEOUT_PER_TOKEN_S,
    default_request_timeout_s,
    llamacpp_facts,
)
from harness.backends.server_words import SNIPPET_CHARS as _SNIPPET_CHARS
from harness.backends.server_words import error_detail as _error_detail
from harness.backends.server_words import is_model_not_found as _is_model_not_found
from harness.backends.server_words import json_error_detail as _json_error_detail
from harness.backends.server_words import openai_request_settings, parse_retry_after, permanent_error, server_timings
from harness.backends.server_words import parent_url as _parent_url
from harness.backends.server_words import snippet as _snippet
from harness.backends.streaming import reply_speed, stream_reply
from harness.backends.wire import Streamed, read_stream, read_whole
from harness.errors import (
    BackendError,
    BackendResponseError,
    BackendTimeout,
    BackendUnavailable,
    ModelNotFound,
)

__all__ = ["DEFAULT_TIMEOUT_S", "WARM_UP_MESSAGES", "OpenAICompatBackend", "openai_request_settings", "parse_retry_after"]

DEFAULT_TIMEOUT_S: float | None = None
"""No fixed deadline: each request gets :func:`~harness.backends.server_facts.default_request_timeout_s` of its
``max_tokens`` (60 s plus 0.2 s per token), unless ``--request-timeout`` gives one."""
WARM_UP_MESSAGES = ({"role": "user", "content": "Hi"},)
"""The conversation of the warm-up request (:meth:`OpenAICompatBackend.warm_up`), sent with ``max_tokens`` 1."""
MAX_BODY_BYTES = 256 * 1024 * 1024
"""The most a reply body may hold; a server sending more is refused (a reply is kilobytes)."""
#: seconds to wait for best-effort metadata requests (``/props``, ``/api/version``)
_METADATA_TIMEOUT_S = 5.0


class OpenAICompatBackend(Backend):
    """A server with an OpenAI-compatible chat API (llama.cpp server, vLLM, LM Studio, ...).

    Example::

        with OpenAICompatBackend("qwen2.5-coder", "http://127.0.0.1:8080/v1") as backend:
            reply = backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions())

    Args:
        model: model name sent in the request's ``model`` field.
        base_url: API root including the version path, e.g. ``http://127.0.0.1:8080/v1``.
        api_key: sent as ``Authorization: Bearer <key>`` when given.
        timeout_s: total deadline of one request, seconds (the whole body must arrive within it); ``None``: 60 s plus
            0.2 s per token of the request's ``max_tokens`` (:func:`~harness.backends.server_facts.default_request_timeout_s`).
        client: an ``httpx.Client`` to use instead of a private one; it is not closed by
            :meth:`close`. Its connections' socket waits in this backend's requests end by their deadline (:func:`bind`).
    """

    #: backend kind recorded in :class:`BackendIdentity`
    kind = "openai"
    key_env: str | None = None  # the variable the API key was read from (no key: looked in), set by open_backend

    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        client: httpx.Client | None = None,
        per_token_s: float = REQUEST_TIMEOUT_PER_TOKEN_S,
    ) -> None:
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.per_token_s = per_token_s
        self.spec = f"{self.kind}:{model}@{self.base_url}"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client
        if client is not None:
            bind(client)  # its every socket wait in a request here ends by the request's deadline; unbounded otherwise
        self._clients = ThreadClients(httpx.Timeout(timeout_s or REQUEST_TIMEOUT_BASE_S))
        self._server_version: str | None = None
        self._identity: BackendIdentity | None = None
        self._urls: dict[str, httpx.URL] = {}

    # -- the Backend protocol -------------------------------------------------------------

    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
        """Send one chat request and return the assistant reply (streamed and assembled when ``options.stream``).

        Args:
            messages: the conversation, OpenAI chat shape.
            tools: OpenAI tool definitions; omitted from the request when ``None`` or empty.
            options: ``temperature``, ``seed`` and ``max_tokens`` are always sent.

        Returns:
            The reply; ``latency_ms`` is the wall-clock time of the HTTP request in ms,
            ``raw`` the whole parsed JSON body (for a stream: its last chunk, with the raw chunks in
            ``stream_chunks``); ``ttft_ms`` / ``decode_tps`` measured on a stream, else from the
            server's ``timings`` when it sends them.

        Raises:
            BackendUnavailable: the server (or the proxy in between) cannot be reached or dropped the connection.
            BackendTimeout: no complete answer within the request's deadline (``timeout_s``, else 60 s + 0.2 s per token).
            ModelNotFound: HTTP 404 whose body says the model does not exist.
            BackendResponseError: any other HTTP status >= 400 (but a refusal of the model's tool
                call, returned as a reply with ``rejection`` set), or a body that is not the
                expected JSON.
        """
        payload = self._build_payload(messages, tools, options)
        start = time.perf_counter()
        deadline_s = (
            self.timeout_s if self.timeout_s is not None else default_request_timeout_s(options.max_tokens, self.per_token_s)
        )
        response = self._request(
            "POST", self._chat_url(), json_body=payload, timeout_s=deadline_s, stream_from=start if options.stream else None
        )
        latency_ms = (time.perf_counter() - start) * 1000.0
        rejected = self._rejected_reply(response, latency_ms)
        if rejected is not None:
            return rejected
        self._raise_for_status(response)
        if isinstance(response, Streamed):
            return stream_reply(
                response.chunks, latency_ms, self._sse, (self._rejection, self._permanent_error), self._reply_identity()
            )
        body = self._json_body(response)
        reply = self._parse_reply(body, latency_ms)
        reply.ttft_ms, reply.decode_tps = reply_speed(body)
        return reply

    def identity(self) -> BackendIdentity:
        """Return the model name, base URL and, when the server tells, its version.

        The version comes from a reply's ``system_fingerprint`` or, failing that, from
        ``build_info`` of llama.cpp's ``GET /props``. Best effort: unknown fields are ``None``.
        ``model_digest`` is always ``None`` (the API does not expose it).

        Raises:
            BackendUnavailable: nothing listens at the base URL (connection refused), so the
                runner can skip this model with one message instead of failing every run.
        """
        if self._identity is None:
            if self._server_version is None:
                self._server_version = self._fetch_build_info()
            self._identity = BackendIdentity(
                backend=self.kind, model=self.model, base_url=self.base_url, server_version=self._server_version
            )
        return self._identity

    def provenance(self) -> dict[str, Any]:
        """llama.cpp's ``GET /props`` and ``GET /v1/models`` as :func:`~harness.backends.server_facts.llamacpp_facts`
        reads them; ``{}`` from a server without ``/props`` (vLLM, hosted APIs).

        Raises:
            BackendUnavailable: nothing listens at the base URL.
        """
        props = self._get_props()
        return llamacpp_facts(props, self._get_metadata(f"{self.base_url}/models")) if props else {}

    def warm_up(self) -> float | None:
        """One chat request (``Hi``, ``max_tokens`` 1, temperature 0, no tools): the server loads the model now.

        Returns:
            Its wall-clock time, ms.

        Raises:
            BackendError: as :meth:`generate`.
        """
        start = time.perf_counter()
        self.generate(list(WARM_UP_MESSAGES), None, GenerateOptions(max_tokens=1))
        return (time.perf_counter() - start) * 1000.0

    def close(self) -> None:
        """Close the HTTP clients this backend made (a client passed in is left open)."""
        self._clients.close()

    # -- wire format (overridden by OllamaBackend) ----------------------------------------

    def _chat_url(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _build_payload(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": options.temperature,
            "seed": options.seed,
            "max_tokens": options.max_tokens,
            "stream": options.stream,
        }
        if tools:
            payload["tools"] = tools
        payload.update(self.request_settings(options, tools=bool(tools)))
        return payload

    def request_settings(self, options: GenerateOptions, *, tools: bool) -> dict[str, Any]:
        """:func:`openai_request_settings`."""
        return openai_request_settings(options, tools=tools)

    def _parse_reply(self, body: dict[str, Any], latency_ms: float) -> Reply:
        choices = body.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise BackendResponseError(
                f"The server at {self.base_url} answered without a 'choices' list "
                f"({_snippet(body)}); check that the URL points at an OpenAI-compatible API.",
                status_code=None,
            )
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, dict):
            raise BackendResponseError(
                f"The server at {self.base_url} answered with a choice that has no 'message' "
                f"({_snippet(choice)}); check that the URL points at an OpenAI-compatible API.",
                status_code=None,
            )
        fingerprint = body.get("system_fingerprint")
        if isinstance(fingerprint, str) and fingerprint and self._server_version is None:
            self._server_version = fingerprint
        usage: dict[str, Any] = body["usage"] if isinstance(body.get("usage"), dict) else {}
        return Reply(
            content=message.get("content"),
            tool_calls=message.get("tool_calls"),
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=usage.get("prompt_tokens"),  # Reply keeps only believable counts
            completion_tokens=usage.get("completion_tokens"),
            latency_ms=latency_ms,
            raw=body,
            identity=self._reply_identity(),
            reasoning=message.get("reasoning_content") or message.get("reasoning"),
            timings=server_timings(body.get("timings")),
        )

    #: the stream's wire format: server-sent events (Ollama: NDJSON)
    _sse = True

    def _rejection(self, status: int, detail: str) -> tuple[str, str | None] | None:
        """Which server's tool-call parser refused the model's reply, and the model's text the error quotes.

        llama.cpp's server answers HTTP 500 ``Failed to parse tool call arguments as JSON: <nlohmann parse
        error>`` (``common/chat.cpp``); vLLM answers HTTP 400 with pydantic's ``validation error for
        list[function-wrap[...]] Invalid JSON: ...`` when it parses a forced call's text. Neither body quotes the
        whole reply (llama.cpp's ``last read`` and pydantic's ``input_value`` are clipped fragments), so the
        text is ``None``. A vLLM 400 that is a bare ``json`` message (``Expecting ',' delimiter``) is vLLM
        re-reading a client's history, never a reply: it is not recognised here.

        Args:
            status: the HTTP status.
            detail: the error message (:func:`_error_detail`).

        Returns:
            ``(server, text)`` for a recognised refusal, else ``None``.
        """
        if status == 500 and detail.startswith("Failed to parse tool call arguments as JSON"):
            return "llama.cpp", None
        if status in (400, 500) and "validation error for list[function-wrap[" in detail and "Invalid JSON" in detail:
            return "vllm", None
        return None

    def _rejected_reply(self, response: httpx.Response, latency_ms: float) -> Reply | None:
        """The reply a refusal of the model's tool call stands for (see :meth:`_rejection`), or ``None``."""
        detail = _json_error_detail(response) if response.status_code >= 400 else None
        if detail is None:  # every parser's refusal is a JSON error body: a proxy's text page is not one
            return None
        found = self._rejection(response.status_code, detail)
        if found is None:
            return None
        server, text = found
        try:
            body = response.json()
        except (ValueError, RecursionError):
            body = None
        return Reply(
            content=text,
            tool_calls=None,
            finish_reason=None,  # none of the refusals says whether max_tokens was hit
            prompt_tokens=None,
            completion_tokens=None,
            latency_ms=latency_ms,
            raw=body if isinstance(body, dict) else {"error": response.text},
            identity=self._reply_identity(),
            rejection=rejection_record(server, response.status_code, detail),
        )

    def _permanent_error(self, status: int, detail: str) -> BackendError | None:
        """The error for a refusal no retry can fix (:func:`harness.backends.server_words.permanent_error`), else ``None``.

        Args:
            status: the HTTP status (>= 400).
            detail: the error message (:func:`_error_detail`).
        """
        return permanent_error(self.base_url, detail)

    def _unreachable_message(self) -> str:
        return _words.unreachable_sentence(self.base_url)

    def _model_not_found_message(self, detail: str) -> str:
        return (
            f"The server at {self.base_url} has no model '{self.model}' ({detail}); "
            f"check the model name in the spec against GET {self.base_url}/models."
        )

    # -- shared helpers -------------------------------------------------------------------

    def _reply_identity(self) -> BackendIdentity:
        """The identity to stamp on a reply, without contacting the server."""
        if self._identity is not None:
            return self._identity
        return BackendIdentity(backend=self.kind, model=self.model, base_url=self.base_url, server_version=self._server_version)

    def _request(
        self, method: str, url: str, *, json_body: Any = None, timeout_s: float | None = None, stream_from: float | None = None
    ) -> httpx.Response:
        """Send one request and read its whole body within ``timeout_s`` in total, every socket wait included (a server
        trickling bytes, headers too, cannot hold a run past it), translating every ``httpx`` error into a :class:`BackendError`.

        With ``stream_from`` (the ``time.perf_counter()`` the request was sent at), a success status is read as a
        stream: the result is a :class:`~harness.backends.wire.Streamed` holding the raw chunks with their arrival times.

        Raises:
            BackendTimeout: no complete body within the timeout.
            BackendResponseError: a body over :data:`MAX_BODY_BYTES`, or one that cannot be read.
            BackendUnavailable: the server cannot be reached or broke the connection.
        """
        seconds = timeout_s if timeout_s is not None else (self.timeout_s or REQUEST_TIMEOUT_BASE_S)
        deadline = time.monotonic() + seconds
        content, headers = None, self._headers
        if json_body is not None:
            # ASCII JSON: text UTF-8 cannot hold (a lone surrogate echoed from a model or a file) is sent as \u escapes
            content = json.dumps(json_body, ensure_ascii=True, allow_nan=False).encode("ascii")
            headers = {**self._headers, "Content-Type": "application/json"}
        if stream_from is not None:  # llama.cpp closed kept-alive connections after streams unannounced: one per stream
            headers = {**headers, "Connection": "close"}
        try:
            hold(deadline)  # every socket wait of the request, its headers' too, ends by then (harness.backends.deadline)
            client = self._client or self._clients.get()  # one per run thread (harness.backends.clients)
            parsed = self._urls.get(url)
            if parsed is None:  # parsed once: httpx parses a str URL again on every request
                parsed = self._urls[url] = httpx.URL(url)
            direct = None if self._client is not None or parsed.userinfo else self._clients.direct()  # a URL's user: auth
            request = client.build_request(method, parsed, content=content, headers=headers, timeout=httpx.Timeout(seconds))
            response = client.send(request, stream=True) if direct is None else direct.handle_request(request)
            response.request = request
            try:
                if stream_from is not None and response.status_code < 300:
                    return read_stream(response, deadline, stream_from, sse=self._sse, limit=MAX_BODY_BYTES)
                return read_whole(response, deadline, MAX_BODY_BYTES)
            finally:
                response.close()
        except httpx.TimeoutException as exc:
            raise BackendTimeout(
                f"The server at {self.base_url} did not answer completely within {seconds:g} s; "
                f"raise --request-timeout or use a smaller model or prompt."
            ) from exc
        except httpx.ConnectError as exc:  # a certificate not verified, a proxy or the server not there
            proxy = None if self._client is not None else self._clients.proxy_for(httpx.URL(url))
            raise _words.connect_error(self.base_url, exc, proxy, self._unreachable_message()) from exc
        except httpx.TransportError as exc:
            raise BackendUnavailable(
                f"The server at {self.base_url} broke the connection before answering completely "
                f"({type(exc).__name__}: {exc}); check that it is still running and try again."
            ) from exc
        except httpx.RequestError as exc:  # DecodingError, TooManyRedirects
            raise BackendResponseError(
                f"The server at {self.base_url} sent a response that could not be read "
                f"({type(exc).__name__}: {exc}); check the URL and the server's log.",
                status_code=None,
            ) from exc
        finally:
            hold(None)

    def _raise_for_status(self, response: httpx.Response) -> None:
        status = response.status_code
        if 300 <= status < 400:  # httpx does not follow redirects: say where the server points
            location = response.headers.get("Location")
            where = f"a redirect to {location[:_SNIPPET_CHARS]}" if location else "a redirect without a Location"
            raise BackendResponseError(
                f"The server at {self.base_url} answered HTTP {status} ({where}); the harness does not follow "
                "redirects, so give the URL it points to in the model spec.",
                status_code=status,
            )
        if status < 400:
            return
        key = self._headers.get("Authorization", "").removeprefix("Bearer ") or None
        detail = _error_detail(response, key)  # a server quoting the key: never printed nor recorded
        if status in (401, 403):  # not retried (BackendResponseError.retryable): no retry fixes a key
            raise BackendResponseError(_words.refused_key(self.base_url, status, detail, key, self.key_env), status_code=status)
        if status == 404 and _is_model_not_found(detail):
            raise ModelNotFound(self._model_not_found_message(detail))
        permanent = self._permanent_error(status, detail)
        if permanent is not None:
            raise permanent
        if status == 429:
            hint = "the server is rate limiting; wait and retry"
        elif status >= 500:
            hint = "the server failed; check its log"
        else:
            hint = "check the model name and options"
        raise BackendResponseError(
            f"The server at {self.base_url} answered HTTP {status} ({detail}); {hint}.",
            status_code=status,
            retry_after_s=parse_retry_after(response.headers.get("Retry-After")),
        )

    def _json_body(self, response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except RecursionError as exc:  # deeper than Python's JSON parser goes, e.g. megabytes of '['
            raise BackendResponseError(
                f"The server at {self.base_url} answered with {len(response.content)} bytes of JSON nested too deeply "
                f"to read ({response.text[:_SNIPPET_CHARS]!r}); check the server and its log.",
                status_code=None,
            ) from exc
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise BackendResponseError(
                f"The server at {self.base_url} answered with a body that is not JSON "
                f"({response.text[:_SNIPPET_CHARS]!r}); check that the URL points at the right API.",
                status_code=None,
            ) from exc
        if not isinstance(body, dict):
            raise BackendResponseError(
                f"The server at {self.base_url} answered with JSON that is not an object "
                f"({_snippet(body)}); check that the URL points at the right API.",
                status_code=None,
            )
        return body

    def _fetch_build_info(self) -> str | None:
        """``build_info`` from llama.cpp's ``GET /props`` next to the API root, or ``None``."""
        value = self._get_props().get("build_info")
        return value if isinstance(value, str) and value else None

    def _get_props(self) -> dict[str, Any]:
        """llama.cpp's ``GET /props`` next to the API root (``{}`` when there is none)."""
        return self._get_metadata(f"{_parent_url(self.base_url)}/props")

    def _get_metadata(self, url: str) -> dict[str, Any]:
        """A best-effort ``GET`` of a JSON object within 5 s in total (a trickling server cannot hold it longer) and
        :data:`MAX_BODY_BYTES`; ``{}`` on an error status, a timeout, a broken connection or another body.

        Raises:
            BackendUnavailable: nothing listens at the URL (connection refused), or the proxy it goes through.
            ServerConfigError: the server's TLS certificate does not verify.
        """
        try:
            response = self._request("GET", url, timeout_s=min(self.timeout_s or _METADATA_TIMEOUT_S, _METADATA_TIMEOUT_S))
            data = response.json() if response.status_code == 200 else None
        except (BackendError, ValueError, RecursionError) as exc:
            if isinstance(exc.__cause__, httpx.ConnectError):  # refused, a dead proxy, or a certificate not verified
                raise
            return {}
        return data if isinstance(data, dict) else {}
