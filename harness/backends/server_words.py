"""What the servers' own words mean: refusals no retry can fix, the server's own timing of a reply, and when to retry;
and the sentences for a request that never reached the server (a certificate not verified, a proxy not reachable) or
whose credentials it refused.

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
import ipaddress
import json
import math
import ssl
import urllib.parse
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx

from harness.backends.base import GenerateOptions
from harness.errors import BackendError, BackendUnavailable, ContextOverflow, ServerConfigError

__all__ = [
    "connect_error", "environment_proxy", "error_detail", "is_context_overflow", "is_model_not_found", "json_error_detail",
    "openai_request_settings", "parent_url", "parse_retry_after", "permanent_error", "refused_key", "server_timings",
    "snippet", "unreachable_sentence", "without_secret",
]  # fmt: skip

_E = TypeVar("_E", bound=BaseException)
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


def error_detail(response: httpx.Response, secret: str | None = None) -> str:
    """The error text of an error body: OpenAI ``error.message``, Ollama ``error``, or raw text (its first
    :data:`SNIPPET_CHARS` characters), with ``secret`` (the API key sent) blanked out (:func:`without_secret`)."""
    detail = json_error_detail(response)
    if detail is not None:
        return without_secret(detail, secret)
    text = without_secret(response.text.strip(), secret)  # before the cut: a cut key would no longer match (red team)
    return text[:SNIPPET_CHARS] if text else response.reason_phrase or "no body"


def without_secret(text: str, secret: str | None) -> str:
    """``text`` with ``secret`` (an API key) written as ``<the key>``, also where the server wrote it JSON-escaped
    (``\\/``, ``\\uXXXX``) or percent-encoded (red team: a FastAPI body escaping ``/`` printed the whole key)."""
    if not secret:
        return text
    escaped = json.dumps(secret)[1:-1]
    for form in dict.fromkeys((secret, escaped, escaped.replace("/", "\\/"), urllib.parse.quote(secret, safe=""))):
        text = text.replace(form, "<the key>")
    return text


def is_model_not_found(detail: str) -> bool:
    text = detail.lower()
    return "model" in text and ("not found" in text or "does not exist" in text or "model_not_found" in text)


def parent_url(base_url: str) -> str:
    """``http://h:1/v1`` -> ``http://h:1``; a URL without a path is returned unchanged."""
    url = httpx.URL(base_url)
    path = url.path.rstrip("/")
    parent = path.rsplit("/", 1)[0] if path else ""
    return str(url.copy_with(path=parent or "/")).rstrip("/")


def snippet(obj: Any) -> str:
    """``repr(obj)``, cut to :data:`SNIPPET_CHARS` characters (and ``...``)."""
    text = repr(obj)
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "..."


def unreachable_sentence(base_url: str) -> str:
    """The sentence for an OpenAI-compatible server that nothing answers at (connection refused, no such host)."""
    hint = "" if base_url.rstrip("/").endswith("/v1") else " (it usually ends in /v1)"  # newcomer: said of /v1 too
    return f"The server at {base_url} is not reachable; start it, or check the URL in the model spec{hint}."


def connect_error(base_url: str, exc: BaseException, proxy: tuple[str, str] | None, unreachable: str) -> BackendError:
    """The error for a request that could not connect (``httpx.ConnectError``), in the order the causes are told apart.

    * The TLS handshake failed because ssl could not verify the server's certificate (a
      :class:`ssl.SSLCertVerificationError` in ``exc``'s chain, e.g. ``self-signed certificate``): a
      :class:`ServerConfigError` (no retry verifies it) naming ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``, which the
      backends' TLS context reads (:class:`~harness.backends.clients.ThreadClients`); for a certificate out of its
      dates or made for another host name, what fixes that instead.
    * The request went through a proxy from the environment (``proxy``, :func:`environment_proxy`): a proxy that
      cannot be reached is what refused, so a :class:`BackendUnavailable` naming the proxy and its variable.
    * Else ``unreachable``, the backend's own sentence for a server that is not running, as a :class:`BackendUnavailable`.

    Args:
        base_url: the server's URL, quoted in the message.
        exc: the ``httpx.ConnectError``.
        proxy: ``(variable, proxy URL without user name or password)`` the request was sent through, or ``None``.
        unreachable: the sentence for a server that is not running.
    """
    failure = _certificate_failure(exc)
    if failure is not None:
        code, reason = failure
        fix = _CERTIFICATE_FIXES.get(code) or (
            "set SSL_CERT_FILE to a PEM file holding the certificate of the CA that signed it (or SSL_CERT_DIR to a "
            "folder of them, with SSL_CERT_FILE unset)"
        )
        return ServerConfigError(f"The TLS certificate of the server at {base_url} could not be verified ({reason}); {fix}.")
    handshake = _in_chain(exc, ssl.SSLError)
    if handshake is not None:  # red team: a plain HTTP server at an https:// URL, behind a live proxy or not
        why = getattr(handshake, "reason", None) or handshake
        return ServerConfigError(
            f"The TLS handshake with the server at {base_url} failed ({why}); check that it serves HTTPS there, "
            "or give its http:// URL in the model spec."
        )
    if proxy is not None:
        variable, url = proxy
        host = httpx.URL(base_url).host
        return BackendUnavailable(
            f"The proxy at {url} named by {variable}, through which requests to the server at {base_url} go, is not "
            f"reachable; start it, or correct or unset {variable} (or add {host} to NO_PROXY to reach the server directly)."
        )
    return BackendUnavailable(unreachable)


_CERTIFICATE_FIXES = {
    9: "check the clocks of this machine and the server, or renew the certificate",  # X509_V_ERR_CERT_NOT_YET_VALID
    10: "renew the server's certificate (or check this machine's clock)",  # X509_V_ERR_CERT_HAS_EXPIRED
    62: "give the URL with a host name the certificate is for",  # X509_V_ERR_HOSTNAME_MISMATCH
    64: "give the URL with a host name the certificate is for",  # X509_V_ERR_IP_ADDRESS_MISMATCH
}
"""What fixes a certificate failure no trust store fixes, by OpenSSL's verify code (``x509_vfy.h``)."""


def _certificate_failure(exc: BaseException | None) -> tuple[int, str] | None:
    """OpenSSL's verify code and what ssl says of a certificate it could not verify (``self-signed certificate``),
    found in ``exc``'s chain."""
    found = _in_chain(exc, ssl.SSLCertVerificationError)
    if found is None:
        return None
    return found.verify_code, str(found.verify_message or found.reason or found).rstrip(".")


def _in_chain(exc: BaseException | None, kind: type[_E]) -> _E | None:
    """The first exception of ``kind`` in ``exc``'s chain of causes and contexts, or None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def environment_proxy(url: httpx.URL, proxies: Mapping[str, str], environ: Mapping[str, str]) -> tuple[str, str] | None:
    """The proxy ``httpx`` sends a request for ``url`` through, as its client reads the environment, or ``None``.

    Mirrors ``httpx``'s ``get_environment_proxies`` and the ``URLPattern`` order its client matches mounts in (0.28,
    0.29): ``http``/``https``/``all`` proxies, ``NO_PROXY`` hosts (``*``: none at all; an IP or ``localhost``
    exactly; a domain and its subdomains) that bypass them, the most specific pattern first.

    Args:
        url: the request's URL.
        proxies: ``urllib.request.getproxies()`` (what ``httpx`` reads).
        environ: ``os.environ``, for the variable's name (the lower-case one wins, as in ``urllib``).

    Returns:
        ``(variable, proxy URL without its user name or password)``, e.g. ``("HTTPS_PROXY", "http://proxy:3128")``;
        ``None`` when no proxy applies or ``NO_PROXY`` bypasses it.
    """
    mounts: dict[str, str | None] = {f"{key}://": proxies[key] for key in ("http", "https", "all") if proxies.get(key)}
    for host in (name.strip() for name in proxies.get("no", "").split(",")):
        if host == "*":
            return None
        if "://" in host:
            mounts[host] = None
        elif host:
            mounts[f"all://{_no_proxy_host(host)}"] = None
    for pattern, proxy in sorted(mounts.items(), key=lambda item: _priority(httpx.URL(item[0]))):
        if _matches(httpx.URL(pattern), url):
            if proxy is None:
                return None
            key = pattern.split("://")[0]
            variable = f"{key}_proxy" if environ.get(f"{key}_proxy") else f"{key.upper()}_PROXY"
            shown = httpx.URL(proxy if "://" in proxy else f"http://{proxy}").copy_with(userinfo=b"")
            return variable, str(shown).rstrip("/")
    return None


def _no_proxy_host(host: str) -> str:
    """A ``NO_PROXY`` entry's host pattern as ``httpx`` writes it: an IP or ``localhost`` exactly, else with subdomains."""
    for kind in (ipaddress.IPv4Address, ipaddress.IPv6Address):
        try:
            kind(host.split("/")[0])
        except ValueError:
            continue
        return f"[{host}]" if kind is ipaddress.IPv6Address else host
    return host if host.lower() == "localhost" else f"*{host}"


def _priority(pattern: httpx.URL) -> tuple[int, int, int]:
    """``httpx``'s ``URLPattern.priority``: a port first, then the longer host, then the longer scheme."""
    host = "" if pattern.host == "*" else pattern.host
    scheme = "" if pattern.scheme == "all" else pattern.scheme
    return (0 if pattern.port is not None else 1, -len(host), -len(scheme))


def _matches(pattern: httpx.URL, url: httpx.URL) -> bool:
    """``httpx``'s ``URLPattern.matches``."""
    if pattern.scheme != "all" and pattern.scheme != url.scheme:
        return False
    host = pattern.host
    if host and host != "*":
        if host.startswith("*."):
            if not (url.host.endswith(host[1:]) and len(url.host) > len(host) - 1):
                return False
        elif host.startswith("*"):
            if url.host != host[1:] and not url.host.endswith(f".{host[1:]}"):
                return False
        elif url.host != host:
            return False
    return pattern.port is None or pattern.port == url.port


def refused_key(base_url: str, status: int, detail: str, key: str | None, key_env: str | None) -> str:
    """The sentence for HTTP 401 or 403: the server refused the credentials (never retried: no retry fixes a key).

    Args:
        base_url: the server's URL, quoted in the message.
        status: 401 or 403.
        detail: the server's error message, the key blanked out of it (:func:`error_detail` with ``secret``).
        key: the API key sent as a Bearer token, or ``None`` when none was sent; never printed.
        key_env: the environment variable the key was read from (or, with no key, looked for), when known.
    """
    said = f"The server at {base_url} answered HTTP {status} ({detail})"
    if key and key_env:
        return f"{said}: it refused the API key read from the environment variable {key_env}; set {key_env} to a key it accepts."
    if key:
        return (
            f"{said}: it refused the API key it was sent; give a key it accepts (in the environment variable the "
            "scenario's api_key_env names, else OPENAI_API_KEY for openai: models)."
        )
    unset = f" ({key_env} is not set)" if key_env else ""
    return (
        f"{said}: it wants an API key, and none was sent{unset}; export the key and name its variable in the "
        f"scenario's api_key_env{f', or export it as {key_env}' if key_env else ''}."
    )
