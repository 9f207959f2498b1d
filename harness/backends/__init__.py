"""Backends: one protocol (:class:`Backend`), one implementation per server kind.

Open a backend from a model spec string with :func:`open_backend`::

    ollama:MODEL[@URL[,URL...]]   Ollama's native API; URL defaults to $OLLAMA_HOST or
                                  http://localhost:11434 (MODEL may contain ':')
    openai:MODEL@BASE_URL[,URL...]
                                  any OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1
    embedded:NAME_OR_GGUF_PATH    llama.cpp started in-process (known name or .gguf file)
    embedded:hf:OWNER/REPO/FILE.gguf[@REVISION]
                                  a GGUF file fetched from the Hugging Face hub into the model cache
    replay:CASSETTE.jsonl         replies read from a cassette file

A comma-separated list of URLs names replicas: servers of the same weights that
:mod:`harness.replicas` spreads a matrix's runs over. :func:`replica_specs` splits such a spec
into one single-URL spec per replica; :func:`open_backend` opens single-URL specs only.
"""

from __future__ import annotations

import functools
import os
from urllib.parse import urlsplit

import httpx

from harness.backends.base import Backend, BackendIdentity, GenerateOptions, Reply
from harness.backends.embedded import EmbeddedBackend
from harness.backends.hub import HUB_PREFIX, parse_hub_spec
from harness.backends.ollama import DEFAULT_OLLAMA_URL, OllamaBackend
from harness.backends.openai_compat import DEFAULT_TIMEOUT_S, OpenAICompatBackend
from harness.backends.replay import CassetteRecorder, ReplayBackend, write_cassette_line
from harness.errors import UsageError

__all__ = [
    "Backend",
    "BackendIdentity",
    "CassetteRecorder",
    "EmbeddedBackend",
    "GenerateOptions",
    "OllamaBackend",
    "OpenAICompatBackend",
    "ReplayBackend",
    "Reply",
    "SPEC_FORMS",
    "open_backend",
    "parse_model_spec",
    "replica_specs",
    "write_cassette_line",
]

#: the accepted model spec forms, quoted in usage errors
SPEC_FORMS = (
    "ollama:MODEL[@URL[,URL...]], openai:MODEL@BASE_URL[,URL...], embedded:NAME_OR_GGUF_PATH, embedded:hf:OWNER/REPO/FILE.gguf[@REVISION] "
    "or replay:CASSETTE.jsonl"
)

_KINDS = ("ollama", "openai", "embedded", "replay")
_OLLAMA_PORT = 11434


def parse_model_spec(spec: str) -> tuple[str, str, str | None]:
    """Split a model spec into its kind, model and URL.

    Only the first ``:`` separates the kind (Ollama names contain ``:``); for ``ollama`` and
    ``openai`` the URL follows the first ``@``. A URL without a scheme gets ``http://``. An
    ``embedded:hf:...`` reference is checked here (nothing is fetched). A list of replicas' URLs
    (``@URL,URL,...``) is checked whole (:func:`replica_specs`); the first one is returned.

    Args:
        spec: e.g. ``ollama:qwen2.5-coder:1.5b@http://h:1``.

    Returns:
        ``(kind, model, url_or_None)``; ``model`` is the name, ``.gguf`` path or cassette path; ``url`` the
        (first replica's) URL.

    Raises:
        UsageError: unknown kind, empty model, a missing or malformed URL, a URL listed twice, or a malformed
            ``hf:`` reference.
    """
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in _KINDS or not rest:
        raise _bad_spec(spec)
    if kind == "embedded" and rest.startswith(HUB_PREFIX):
        parse_hub_spec(rest[len(HUB_PREFIX) :])
    if kind in ("embedded", "replay"):
        return kind, rest, None
    model, at, url = rest.partition("@")
    if not model or (at and not url) or (kind == "openai" and not at):
        raise _bad_spec(spec)
    if not at:
        return kind, model, None
    default_port = _OLLAMA_PORT if kind == "ollama" else None
    urls = [_normalize_url(u.strip(), spec=spec, default_port=default_port) if u.strip() else "" for u in url.split(",")]
    if "" in urls:
        raise _bad_spec(spec)
    twice = next((u for i, u in enumerate(urls) if u in urls[:i]), None)
    if twice is not None:
        raise UsageError(f"Model spec {spec!r} lists the replica {twice} twice; name each server once.")
    return kind, model, urls[0]


def replica_specs(spec: str) -> list[str]:
    """The single-URL spec of each replica a spec names, in the order written.

    ``openai:m@http://gpu1:8000/v1, http://gpu2:8000/v1`` names two replicas:
    ``["openai:m@http://gpu1:8000/v1", "openai:m@http://gpu2:8000/v1"]`` (each URL as written, spaces around
    it dropped). Any other spec is its only replica: ``[spec]``. The first replica's spec names the model in
    a run's identity and in the ledger (:attr:`harness.loop.RunPlan.named_model`), so a spec listing replicas
    plans the same identities as its first URL alone.

    Raises:
        UsageError: the spec is not valid (:func:`parse_model_spec`).
    """
    kind, _, _ = parse_model_spec(spec)
    if kind not in ("ollama", "openai") or "," not in spec:
        return [spec]
    head, _, urls = spec.partition(":")[2].partition("@")
    return [f"{kind}:{head}@{url.strip()}" for url in urls.split(",")]


def open_backend(
    spec: str,
    *,
    api_key_env: str | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    parallel: int = 1,
    num_ctx: int = 4096,
    plan_only: bool = False,
) -> Backend:
    """Open the backend a model spec names (no request is sent yet).

    Args:
        spec: a model spec (see the module docstring).
        api_key_env: name of the environment variable holding the API key (``openai`` and
            ``ollama``); without it ``openai`` uses ``$OPENAI_API_KEY`` when set.
        timeout_s: total deadline of one model request, seconds (``--request-timeout``); ``None``: 60 s plus
            0.2 s per token of the request's ``max_tokens``.
        parallel: concurrent requests the embedded server must serve (its slot count).
        num_ctx: context tokens per slot for the embedded server (Ollama takes
            ``GenerateOptions.num_ctx`` per request instead).
        plan_only: the backend only plans (``--dry-run``): a known embedded model with a pinned digest is not
            downloaded (:class:`EmbeddedBackend`).

    Returns:
        The backend, with ``spec`` set to the given string; use it as a context manager.

    Raises:
        UsageError: malformed spec, a spec listing several replicas (open each of :func:`replica_specs`),
            a missing ``api_key_env`` variable, a bad ``.gguf`` path or cassette.
        ModelCacheError: an embedded model could not be fetched.
    """
    kind, model, url = parse_model_spec(spec)
    if len(replica_specs(spec)) > 1:
        raise UsageError(f"Model spec {spec!r} names several replicas; `harness run` spreads runs over them, "
                         "other commands take one URL.")  # fmt: skip
    backend: Backend
    if kind == "ollama":
        base = url or _normalize_url(os.environ.get("OLLAMA_HOST") or DEFAULT_OLLAMA_URL, spec=None, default_port=_OLLAMA_PORT)
        key, key_env = _api_key(api_key_env, fallback=None)
        backend = OllamaBackend(model, base, api_key=key, timeout_s=timeout_s, url_from_spec=url is not None)
        backend.key_env = key_env
    elif kind == "openai":
        assert url is not None
        key, key_env = _api_key(api_key_env, fallback="OPENAI_API_KEY")
        backend = OpenAICompatBackend(model, url, api_key=key, timeout_s=timeout_s)
        backend.key_env = key_env
    elif kind == "embedded":
        backend = EmbeddedBackend(model, parallel=parallel, num_ctx=num_ctx, timeout_s=timeout_s, plan_only=plan_only)
    else:
        backend = ReplayBackend(model)
    backend.spec = spec
    return backend


def _bad_spec(spec: str) -> UsageError:
    return UsageError(f"Model spec {spec!r} is not valid; use {SPEC_FORMS}.")


@functools.lru_cache(maxsize=1024)  # a pure function, asked for every plan's spec: its checks cost 15 us a call
def _normalize_url(url: str, *, spec: str | None, default_port: int | None) -> str:
    """Add ``http://`` to a bare ``host[:port]``, and ``default_port`` when it has no port.

    Args:
        url: from a spec (``spec`` given) or from ``$OLLAMA_HOST`` (``spec`` is ``None``).
        spec: the spec quoted in the error message.
        default_port: port added to a bare host without scheme and port (Ollama's 11434).

    Raises:
        UsageError: not an http(s) URL with a host and a numeric port, one ``httpx`` refuses (a control character), or
            one whose host name cannot be looked up (an empty label or one over 63 characters), or one with a query
            or fragment (the API's paths are appended to it), or one holding a user name or password (the spec is
            recorded everywhere).
    """
    had_scheme = "://" in url
    full = url if had_scheme else f"http://{url}"
    try:
        parts = urlsplit(full)
        port = parts.port
        hostname = parts.hostname
        # what httpx refuses too (a control character), and a host name the socket module cannot encode (an empty
        # label, a label over 63 characters): one sentence now, not a traceback (UnicodeError) at the first request
        httpx.URL(full).raw_host.decode("ascii").encode("idna")
    except (ValueError, httpx.InvalidURL):  # unbalanced IPv6 brackets, a non-numeric or out-of-range port
        parts, port, hostname = urlsplit("http://x"), -1, None
    if parts.scheme not in ("http", "https") or not hostname or port == -1:
        if spec is None:
            raise UsageError(f"OLLAMA_HOST={url!r} is not a valid host or URL; set it like localhost:11434.")
        raise _bad_spec(spec)
    if parts.username is not None or parts.password is not None:  # the spec is in the ledger, reports and console lines
        raise UsageError(  # the spec is not quoted: it holds the password
            f"The URL in {'OLLAMA_HOST' if spec is None else 'the model spec'} holds a user name or password, which would "
            "be written to the ledger, the reports and every line that names the model; give the URL without it, and an "
            "API key in the environment variable a scenario's api_key_env names (for openai: models, OPENAI_API_KEY by "
            "default)."
        )
    if "?" in full or "#" in full:  # the API's paths are appended to the URL: they would land in its query or fragment
        where = "OLLAMA_HOST" if spec is None else f"the model spec {spec!r}"
        raise UsageError(
            f"The URL in {where} has a query or fragment ('?' or '#'), after which the harness's API paths would go; "
            "give the server's API root alone, e.g. http://localhost:8000/v1."
        )
    full = full.rstrip("/")
    if not had_scheme and port is None and default_port is not None and not parts.path.strip("/"):
        full = f"{full}:{default_port}"
    return full


def _api_key(env_name: str | None, *, fallback: str | None) -> tuple[str | None, str | None]:
    """``(the key, the variable it was read from)``: the one ``env_name`` names (it must be set), else ``fallback``'s
    (the key ``None`` when it is not set), else ``(None, None)``."""
    if env_name:
        value = os.environ.get(env_name)
        if not value:
            raise UsageError(
                f"Environment variable {env_name} (named by the scenario's api_key_env) is not set; export it first."
            )
        return value, env_name
    return (os.environ.get(fallback) or None, fallback) if fallback else (None, None)
