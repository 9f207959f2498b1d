"""Embedded backend: llama.cpp's server, started in this process with ``xllamacpp``.

Design: the embedded server is the same llama.cpp HTTP server one would run by hand, bound
to 127.0.0.1 on a free port; requests go to it over real HTTP through an
:class:`OpenAICompatBackend`. So the embedded path exercises exactly the client code used
against external servers, and its replies carry the same ``raw`` bodies.

* The model is a path to a ``.gguf`` file, a known name from :mod:`harness.backends.models` or an
  ``hf:OWNER/REPO/FILE.gguf[@REVISION]`` reference (both fetched into the cache on first use). A known model
  that names a ``chat_template`` gets that template, shipped
  under ``harness/backends/templates/``, instead of the GGUF's own (:func:`shipped_template`).
* Before loading, the model must fit in the memory available (:meth:`EmbeddedBackend.check_memory`): checked by a
  matrix that has runs for it to do (:func:`harness.endpoints.check_memory_together`) and again just before the server
  starts.
* The server starts lazily on the first :meth:`EmbeddedBackend.generate` (or an explicit
  :meth:`EmbeddedBackend.start`), under a lock so parallel workers start it once.
* ``n_ctx = num_ctx * parallel``: llama.cpp splits the context between its slots, so each of
  the ``parallel`` concurrent requests gets ``num_ctx`` tokens.
* :meth:`EmbeddedBackend.close` drops the last reference to the ``xllamacpp.Server``, which
  stops it and frees the port.
"""

from __future__ import annotations

import functools
import gc
import importlib.metadata
import importlib.resources
import threading
import time
from pathlib import Path
from typing import Any

from harness.backends import memory, models
from harness.backends.base import DEFAULT_NUM_CTX, Backend, BackendIdentity, GenerateOptions, Reply
from harness.backends.hub import HUB_PREFIX
from harness.backends.openai_compat import DEFAULT_TIMEOUT_S, OpenAICompatBackend, openai_request_settings
from harness.backends.server_facts import EMBEDDED_PER_TOKEN_S
from harness.errors import BackendUnavailable, ModelCacheError, UsageError

__all__ = ["EmbeddedBackend", "resolve_model", "shipped_template"]


def shipped_template(name_or_path: str) -> str | None:
    """The chat template a known model names (:attr:`ModelInfo.chat_template <harness.backends.models.ModelInfo>`),
    read from the harness's package data (``harness/backends/templates/``).

    Returns:
        The template text, byte for byte as shipped; ``None`` for a path or a model that names no template.

    Raises:
        ModelCacheError: the shipped file is missing or unreadable (a broken installation).
    """
    info = models.KNOWN_MODELS.get(name_or_path)
    if info is None or info.chat_template is None:
        return None
    resource = importlib.resources.files("harness.backends").joinpath("templates", info.chat_template)
    try:
        return resource.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelCacheError(
            f"The chat template {info.chat_template} of model '{name_or_path}' is missing from the harness "
            f"installation ({exc}); reinstall the harness."
        ) from exc


def resolve_model(name_or_path: str, *, fetch: bool = True) -> tuple[Path, str | None]:
    """Find the GGUF file for an ``embedded:`` spec.

    Args:
        name_or_path: a path to an existing ``.gguf`` file, a known model name (``smollm2-135m``,
            ``qwen2.5-coder-7b-instruct``) or ``hf:OWNER/REPO/FILE.gguf[@REVISION]`` (a split model named by
            its first part).
        fetch: download a known model or hub file that is not cached yet.

    Returns:
        ``(path, sha256)``: the file (a split model's first part), and its verified digest (hex) for known
        models and hub files (:attr:`~harness.backends.models.ModelInfo.sha256`), or ``None`` for a plain path
        (hashed later, on demand).

    Raises:
        UsageError: neither an existing ``.gguf`` file, a known model name nor a valid ``hf:`` reference.
        ModelCacheError: a known model or hub file could not be fetched or verified.
    """
    if name_or_path in models.KNOWN_MODELS or name_or_path.startswith(HUB_PREFIX):
        return models.resolve(name_or_path, fetch=fetch)
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() == ".gguf" and path.is_file():
        return path, None
    known = ", ".join(sorted(models.KNOWN_MODELS))
    raise UsageError(
        f"embedded:{name_or_path} is neither an existing .gguf file nor a known model ({known}) "
        f"nor a Hugging Face file reference {HUB_PREFIX}OWNER/REPO/FILE.gguf[@REVISION]."
    )


def _plan(name_or_path: str) -> tuple[Path, str] | None:
    """:func:`harness.backends.hub_fetch.plan_model` (imported only to plan)."""
    from harness.backends import hub_fetch

    return hub_fetch.plan_model(name_or_path)


class EmbeddedBackend(Backend):
    """llama.cpp's server running inside this process, spoken to over HTTP on 127.0.0.1.

    Example::

        with EmbeddedBackend("smollm2-135m") as backend:
            reply = backend.generate([{"role": "user", "content": "hi"}], None,
                                     GenerateOptions(max_tokens=16))

    Args:
        name_or_path: a known model name (``smollm2-135m``, ``qwen2.5-coder-7b-instruct``), a path to a ``.gguf``
            file or ``hf:OWNER/REPO/FILE.gguf[@REVISION]``.
        parallel: number of concurrent requests (llama.cpp slots; ``--embedded-slots``). More than one batches
            requests together, which changes the arithmetic and so the replies for the same seed; it enters the run
            identity (:attr:`BackendIdentity.identity_slots <harness.backends.base.BackendIdentity.identity_slots>`).
        num_ctx: context length per slot, in tokens.
        timeout_s: total deadline of one request, seconds; ``None``: 60 s plus 1 s per token of ``max_tokens``
            (:data:`~harness.backends.server_facts.EMBEDDED_PER_TOKEN_S`).
        chat_template: a Jinja chat template to use instead of the one in the GGUF file (e.g. one
            that renders tools, for a model whose own template does not); ``None``: the one the known model names
            (:func:`shipped_template`), else the GGUF's.
        plan_only: for planning (``--dry-run``): a known model or hub file is not fetched (its identity needs only
            its digest: the pin, the cached copy's, or the hub's metadata, :func:`harness.backends.hub_fetch.plan_model`);
            it is fetched if the server is started after all.

    Raises:
        UsageError: the model is neither a ``.gguf`` file, a known name nor a valid ``hf:`` reference. Whether it
            fits in the memory available is checked before its server starts (:meth:`start`), and by a matrix before
            anything runs for the models it has runs to do (:func:`harness.endpoints.check_memory_together`).
        ModelCacheError: a known model, hub file or shipped template could not be fetched or verified.
    """

    kind = "embedded"

    def __init__(
        self,
        name_or_path: str,
        *,
        parallel: int = 1,
        num_ctx: int = DEFAULT_NUM_CTX,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        chat_template: str | None = None,
        plan_only: bool = False,
    ) -> None:
        if parallel < 1 or num_ctx < 1:
            raise UsageError(f"parallel ({parallel}) and num_ctx ({num_ctx}) must both be at least 1.")
        self.name = name_or_path
        self.parallel = parallel
        self.num_ctx = num_ctx
        self.timeout_s = timeout_s
        self.spec = f"embedded:{name_or_path}"
        pin = _plan(name_or_path) if plan_only else None
        self._planned = pin is not None
        self.model_file, self._sha256 = pin or resolve_model(name_or_path)
        self.chat_template = chat_template if chat_template is not None else shipped_template(name_or_path)
        self._server: Any = None
        self._client: OpenAICompatBackend | None = None
        self._lock = threading.Lock()

    def check_memory(self) -> None:
        """Refuse, before loading, a model that does not fit in the memory available with this server's context (all
        its slots): :func:`harness.backends.memory.check_fits`. A planned model not in the cache yet is checked when
        it is fetched and started.

        Raises:
            UsageError: it does not fit.
        """
        if self.model_file.is_file():
            memory.check_fits(self.model_file, self.num_ctx * self.parallel)  # one sentence now, not an out-of-memory kill

    @property
    def fetch_pending(self) -> bool:
        """Opened to plan (``plan_only``) a model that is not in the cache yet: a real run downloads it first."""
        return self._planned and not self.model_file.is_file()

    @property
    def fetch_facts(self) -> tuple[int | None, bool]:
        """What fetching this model involves, from the catalogue the package ships (no I/O, no request).

        Returns:
            ``(size, from_hub)``: the download's size in bytes as pinned in :data:`~harness.backends.models.KNOWN_MODELS`
            (all parts of a split model), or ``None`` when nothing pins it (an ``hf:`` reference); and whether it
            comes from the Hugging Face hub (else with pip, from the package index).
        """
        info = models.KNOWN_MODELS.get(self.name)
        return (info.size or None) if info is not None else None, models.hub_source(self.name) is not None

    @property
    def base_url(self) -> str | None:
        """The running server's OpenAI API root (``http://127.0.0.1:PORT/v1``), or ``None``."""
        return self._client.base_url if self._client is not None else None

    def start(self) -> str:
        """Start the server if it is not running.

        Returns:
            The OpenAI API root, e.g. ``http://127.0.0.1:45039/v1``.

        Raises:
            UsageError: the model no longer fits in the memory available (another model may have taken it).
            BackendUnavailable: llama.cpp could not load the model or start the server.
        """
        with self._lock:
            if self._client is None:
                if self._planned:  # opened to plan, started after all: fetch (and verify) the model now
                    self.model_file, self._sha256 = resolve_model(self.name)
                    self._planned = False
                self._server, address = self._start_server()
                self._client = OpenAICompatBackend(
                    self.name, f"{address.rstrip('/')}/v1", timeout_s=self.timeout_s, per_token_s=EMBEDDED_PER_TOKEN_S
                )
            return self._client.base_url

    def generate(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, options: GenerateOptions) -> Reply:
        """Start the server if needed, then send one chat request to it.

        ``options.num_ctx`` is not sent: the context per slot is fixed at start (``num_ctx``).

        Returns:
            The reply as :meth:`OpenAICompatBackend.generate` returns it, with this backend's
            identity.

        Raises:
            BackendUnavailable: the server could not start or stopped answering.
            BackendTimeout, BackendResponseError: as for :class:`OpenAICompatBackend`.
        """
        self.start()
        assert self._client is not None
        reply = self._client.generate(messages, tools, options)
        reply.identity = self.identity()
        return reply

    def request_settings(self, options: GenerateOptions, *, tools: bool) -> dict[str, Any]:
        """As for any OpenAI-compatible server (:func:`~harness.backends.openai_compat.openai_request_settings`)."""
        return openai_request_settings(options, tools=tools)

    def provenance(self) -> dict[str, Any]:
        """Start the server if needed and read its ``/props`` (:meth:`OpenAICompatBackend.provenance`): the template in
        use is the GGUF's ``tokenizer.chat_template`` (or ``chat_template`` given here), with its tool support, the
        server's sampling defaults, the GGUF's file type (``model_ftype``) and parameter count.

        Raises:
            BackendUnavailable: the server could not start.
        """
        self.start()
        assert self._client is not None
        return self._client.provenance()

    def warm_up(self) -> float | None:
        """Start the server (loading the model) and send it one request; its time, ms (the model load included)."""
        started = time.perf_counter()
        self.start()
        assert self._client is not None
        self._client.warm_up()
        return (time.perf_counter() - started) * 1000.0

    def identity(self) -> BackendIdentity:
        """``embedded``, the model name, ``sha256:<gguf sha256>``, ``xllamacpp <version>`` and the slot count.

        Hashes a plain ``.gguf`` path once (seconds for GB files); never starts the server.

        Raises:
            ModelCacheError: the GGUF file cannot be read.
        """
        if self._sha256 is None:
            try:
                self._sha256 = models.file_sha256(self.model_file)
            except OSError as exc:
                raise ModelCacheError(f"Cannot read {self.model_file} to hash it ({exc}); check the file.") from exc
        return BackendIdentity(
            backend=self.kind,
            model=self.name,
            base_url=self.base_url,
            server_version=f"xllamacpp {_xllamacpp_version()}",
            model_digest=f"sha256:{self._sha256}",
            slots=self.parallel,
        )

    def close(self) -> None:
        """Stop the server (if started) and close the HTTP client; safe to call twice."""
        with self._lock:
            client, self._client = self._client, None
            server, self._server = self._server, None
        if client is not None:
            client.close()
        if server is not None:
            del server  # the last reference: xllamacpp stops the server when it is freed
            gc.collect()

    def _start_server(self) -> tuple[Any, str]:
        import xllamacpp  # heavy native import: only when a server is really needed

        self.check_memory()
        params = xllamacpp.CommonParams()
        params.model.path = str(self.model_file)
        params.port = 0
        params.n_ctx = self.num_ctx * self.parallel
        params.n_parallel = self.parallel
        params.use_jinja = True
        if self.chat_template is not None:
            params.chat_template = self.chat_template
        params.verbosity = -1
        try:
            server = xllamacpp.Server(params)
            address = server.listening_address
        except Exception as exc:  # xllamacpp raises plain RuntimeError/ValueError
            raise BackendUnavailable(
                f"The embedded llama.cpp server could not start with {self.model_file} ({exc}); "
                f"check that the file is a valid GGUF model."
            ) from exc
        return server, address


@functools.cache
def _xllamacpp_version() -> str:
    try:
        return importlib.metadata.version("xllamacpp")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
