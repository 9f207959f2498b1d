"""What happens once per model before its runs: one warm-up request, and the model's provenance read from its server.

Model start-up (the embedded server loading its GGUF, Ollama loading the model on first contact) would otherwise land
in the first turn's latency. :func:`start_model` sends one warm-up request (:meth:`Backend.warm_up
<harness.backends.base.Backend.warm_up>`) and reads what shaped the model's output (:meth:`Backend.provenance
<harness.backends.base.Backend.provenance>`); both are recorded with every run of the model in its ``config``
(``warmup_ms``, ``provenance``, ``server_slots``), never as a turn and never in a run's identity (the embedded
server's slot count enters it through the backend's identity: :attr:`~harness.backends.base.BackendIdentity.slots`).
"""

from __future__ import annotations

from typing import Any

from harness.backends.base import Backend
from harness.errors import BackendError
from harness.ledger import Ledger

__all__ = ["start_model"]


def start_model(backend: Backend, ledger: Ledger) -> dict[str, Any]:
    """Warm the model up and read its provenance; store its chat template once in the ledger.

    Args:
        backend: an open backend (an embedded server is started here).
        ledger: where the template text goes (``templates``, keyed by SHA-256).

    Returns:
        Entries for each run's ``config``: ``warmup_ms`` (ms, or None when the backend has nothing to warm or the
        request failed: the runs meet the failure themselves) and ``provenance`` (the facts of
        :mod:`harness.backends.server_facts` with ``chat_template`` replaced by ``template_sha256``; ``{}`` when the
        server reports none), ``server_slots`` (the parallel slots the server reports: llama.cpp's ``/props``
        ``total_slots``; None when unknown, as for Ollama, vLLM and replay), plus ``warmup_error`` (one sentence)
        when the warm-up failed.

    Raises:
        LedgerError: the template cannot be stored.
    """
    out: dict[str, Any] = {}
    try:
        out["warmup_ms"] = backend.warm_up()
    except BackendError as exc:
        out["warmup_ms"], out["warmup_error"] = None, str(exc)
    try:
        facts = dict(backend.provenance())
    except BackendError:
        facts = {}
    template = facts.pop("chat_template", None)
    out["server_slots"] = facts.pop("slots", None)
    if facts:
        facts["template_sha256"] = ledger.record_template(template) if isinstance(template, str) else None
    out["provenance"] = facts
    return out
