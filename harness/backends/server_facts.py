"""What shaped a model's output, as its server reports it, and how long one request may take.

Provenance (issue 12, section 3) is read once per model, before its runs, and recorded with each run as metadata
(never part of a run's identity). Its shape, :data:`ModelFacts`::

    {"source": "llama.cpp /props" | "ollama /api/show",
     "chat_template": str | None,        # the template text the server applies (None: it has none)
     "template_tools": bool | None,      # whether that template declares tool support (None: not reported)
     "sampling_defaults": {name: value} | None,  # the server's own defaults, for what a request does not set
     "quantization": str | None,         # e.g. "Q4_K_M"
     "parameters": str | None,           # parameter count as the server words it, e.g. "751.63M" or "134515008"
     "template_fallback": bool,          # the template is the server's stand-in for a model without one
     "slots": int | None}                # llama.cpp only: the server's parallel slots (None: not reported)

Sources, as the servers send them:

* llama.cpp's server ``GET /props`` (observed from the bundled ``xllamacpp`` 2026.10.11549, see
  ``tests/test_provenance_embedded.py``; not read from llama.cpp's source): ``chat_template`` (the template in use:
  the GGUF's ``tokenizer.chat_template`` or the ``--chat-template`` override), ``chat_template_caps.supports_tools``,
  ``default_generation_settings.params`` (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repeat_penalty``, ...),
  ``model_ftype`` (``Q4_1``), ``total_slots`` (the server's parallel slots, ``--parallel``: 1 and 2 observed for an
  embedded server started with 1 and 2); ``GET /v1/models`` ``data[0].meta.n_params``.
* Ollama's ``POST /api/show`` (``server/routes.go``, ``GetModelInfo``; ``api/types.go``, ``ShowResponse``):
  ``template``, ``capabilities`` (``tools``: ``types/model/capability.go``), ``parameters`` (one ``%-30s %#v`` line
  per option: ``temperature                    0.7``, ``stop                           "<|im_start|>"``),
  ``details.quantization_level`` and ``details.parameter_size``. A model without a template of its own gets
  Ollama's stand-in ``{{ .Prompt }}`` (``DefaultTemplate`` in ``template/template.go``, set in ``server/images.go``),
  which passes the prompt through bare: recorded with ``template_fallback: true``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ModelFacts", "default_request_timeout_s", "llamacpp_facts", "ollama_facts", "parse_ollama_parameters"]

ModelFacts = dict[str, Any]
"""A model's provenance as its server reports it (shape in the module docstring); ``{}`` when it reports nothing."""

REQUEST_TIMEOUT_BASE_S = 60.0
"""Seconds every request may take before its tokens are counted (``--request-timeout`` default, part one)."""
REQUEST_TIMEOUT_PER_TOKEN_S = 0.2
"""Seconds added per token of ``max_tokens`` (``--request-timeout`` default, part two)."""
EMBEDDED_PER_TOKEN_S = 1.0
"""The embedded model's part two: it decodes on this machine's CPU, where one reply of SmolLM2-135M was measured at
2.4 tokens/s on a busy 2-core machine (108.6 s for 256 tokens) against about 20 on an idle one; a local server
cannot trickle on purpose, so the deadline only has to end a stalled decode."""

#: Ollama's template for a model that has none (``template/template.go``, ``DefaultTemplate``)
OLLAMA_DEFAULT_TEMPLATE = "{{ .Prompt }}"
#: llama.cpp's sampling defaults worth showing (the rest of ``params`` are switches and bookkeeping)
_LLAMACPP_SAMPLING = ("temperature", "top_k", "top_p", "min_p", "typical_p", "repeat_penalty", "repeat_last_n",
                      "presence_penalty", "frequency_penalty", "mirostat", "seed", "n_predict")  # fmt: skip


def default_request_timeout_s(max_tokens: int, per_token_s: float = REQUEST_TIMEOUT_PER_TOKEN_S) -> float:
    """The total deadline of one model request when ``--request-timeout`` is not given: 60 s plus 0.2 s per token
    (1 s per token for the embedded model: :data:`EMBEDDED_PER_TOKEN_S`).

    Args:
        max_tokens: the request's completion-token cap (tokens, >= 0).
        per_token_s: seconds per token of ``max_tokens``.

    Returns:
        Seconds, e.g. 162.4 for ``max_tokens=512``.
    """
    return REQUEST_TIMEOUT_BASE_S + per_token_s * max(0, max_tokens)


#: characters kept of one short fact (quantisation, parameter count, a sampling value): a server could send megabytes
FACT_CHARS = 200
#: options kept of Ollama's ``parameters`` (and values kept of one repeated option, ``stop``)
MAX_FACTS = 64


def _template(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _text(value: Any) -> str | None:
    return value[:FACT_CHARS] if isinstance(value, str) and value else None


def _fact(value: Any) -> Any:
    """A sampling value as recorded: numbers, booleans and null as sent; anything else as text of at most
    :data:`FACT_CHARS` characters (a list of stop strings as JSON)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text[:FACT_CHARS]


def llamacpp_facts(props: dict[str, Any], models: dict[str, Any] | None = None) -> ModelFacts:
    """The facts in llama.cpp's ``GET /props`` body (and ``GET /v1/models`` for the parameter count).

    Args:
        props: the ``/props`` JSON object (``{}`` when the server has none: then nothing is reported).
        models: the ``/v1/models`` JSON object, or ``None``.

    Returns:
        :data:`ModelFacts`; ``{}`` when ``props`` says nothing llama.cpp says (another OpenAI-compatible server).
    """
    if not any(key in props for key in ("chat_template", "default_generation_settings", "chat_template_caps")):
        return {}
    caps = props.get("chat_template_caps")
    tools = caps.get("supports_tools") if isinstance(caps, dict) else None
    settings = props.get("default_generation_settings")
    params = settings.get("params") if isinstance(settings, dict) else None
    sampling = {k: _fact(params[k]) for k in _LLAMACPP_SAMPLING if k in params} if isinstance(params, dict) else None
    parameters = None
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict) and isinstance(data[0].get("meta"), dict):
        count = data[0]["meta"].get("n_params")
        parameters = str(count) if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None
    return {
        "source": "llama.cpp /props",
        "chat_template": _template(props.get("chat_template")),
        "template_tools": tools if isinstance(tools, bool) else None,
        "sampling_defaults": sampling or None,
        "quantization": _text(props.get("model_ftype")),
        "parameters": parameters,
        "template_fallback": False,
        "slots": _count(props.get("total_slots")),
    }


def _count(value: Any) -> int | None:
    """A positive integer as sent, else None (a server could send anything)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31 else None


def parse_ollama_parameters(text: Any) -> dict[str, Any] | None:
    """Ollama's ``parameters`` text as a dict: one ``name value`` line per option (``%-30s %#v`` in
    ``server/routes.go``); a name given on several lines (``stop``) gets a list; values are JSON where they parse.

    Returns:
        ``{name: value}``, or ``None`` when the text holds no option (the model sets none).
    """
    if not isinstance(text, str):
        return None
    out: dict[str, Any] = {}
    for line in text.splitlines():
        name, _, raw = line.strip().partition(" ")
        if not name:
            continue
        try:
            value: Any = json.loads(raw.strip())
        except ValueError:
            value = raw.strip()
        name, value = name[:FACT_CHARS], _fact(value)
        if name in out:
            out[name] = [*out[name], value] if isinstance(out[name], list) else [out[name], value]
        elif len(out) < MAX_FACTS:
            out[name] = value
    return {k: v[:MAX_FACTS] if isinstance(v, list) else v for k, v in out.items()} or None


def ollama_facts(show: dict[str, Any]) -> ModelFacts:
    """The facts in Ollama's ``POST /api/show`` body.

    Args:
        show: the ``ShowResponse`` JSON object (``{}`` when Ollama refused: then nothing is reported).

    Returns:
        :data:`ModelFacts`; ``template_tools`` is whether ``capabilities`` lists ``tools`` (``None`` without a list).
    """
    if not show:
        return {}
    capabilities = show.get("capabilities")
    found = show.get("details")
    details: dict[str, Any] = found if isinstance(found, dict) else {}
    template = _template(show.get("template"))
    return {
        "source": "ollama /api/show",
        "chat_template": template,
        "template_tools": "tools" in capabilities if isinstance(capabilities, list) else None,
        "sampling_defaults": parse_ollama_parameters(show.get("parameters")),
        "quantization": _text(details.get("quantization_level")),
        "parameters": _text(details.get("parameter_size")),
        "template_fallback": template is None or template.strip() == OLLAMA_DEFAULT_TEMPLATE,
    }
