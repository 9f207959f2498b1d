"""Responders for :class:`tests.backend_fakes.FakeServer` that speak as the real servers do, each following the
source file it cites (README, "Wire formats": the versions read).

Ollama (``ollama/ollama`` at ``fb30760``, v0.33.0-rc2):

* :func:`ollama_chat`: ``POST /api/chat`` with ``stream: false`` as ``ChatHandler`` in ``server/routes.go``
  answers it: an ``api.ChatResponse`` (``api/types.go``) whose ``Metrics`` fields are ``omitempty`` (a
  ``prompt_eval_count`` or ``eval_count`` of zero is absent), whose tool calls carry an ``id`` (``call_`` and 8
  lower-case letters or digits: ``toolCallId`` in ``server/routes.go``) and ``function.index``, and whose
  ``message.thinking`` holds the reasoning; an empty ``messages`` list only loads the model and is answered with
  ``done_reason: "load"``; ``think: true`` for a model without the ``thinking`` capability is HTTP 400
  ``"<model>" does not support thinking``; a model that is not there is HTTP 404 in either of the two wordings
  of ``server/routes.go`` (``model 'M' not found`` from ``getModel``, ``model "M" not found, try pulling it
  first`` from ``handleScheduleError``).
* :data:`OLLAMA_BUSY`: the scheduler's full queue (``ErrMaxQueue`` in ``server/sched.go``), HTTP 503 without
  ``Retry-After`` (``handleScheduleError``).
* :func:`ollama_show`, :func:`ollama_tags`: ``ShowResponse`` (no ``digest``; ``capabilities``; ``template``;
  ``parameters`` as ``GetModelInfo`` in ``server/routes.go`` writes them) and
  ``ListModelResponse`` (``digest``: hex SHA-256 of the manifest file, ``manifest/manifest.go``).
* :data:`OLLAMA_CONTEXT_OVERFLOW`: ``truncate: false`` and a prompt over ``num_ctx``: HTTP 400 ``the input length
  exceeds the context length`` (``runner/ollamarunner/runner.go``, ``errorInputTooLong``, v0.13 to v0.32).

llama.cpp's server (``ggml-org/llama.cpp`` ``tools/server/``, ``server-common.cpp`` at ``006639c3``):

* :func:`llamacpp_chat`: a ``/v1/chat/completions`` reply with ``usage`` and ``timings`` (``result_timings``,
  ``server-task.h``); tool calls carry ``type``, ``function`` and an ``id`` (``gen_tool_call_id``, 32 letters and
  digits, ``server-common.cpp``).
* :func:`llamacpp_props`, :func:`llamacpp_models`: ``GET /props`` and ``GET /v1/models`` as the bundled server
  (``xllamacpp`` 2026.10.11549) answers them, observed in ``tests/test_provenance_embedded.py``.
* :data:`LLAMACPP_NO_JINJA`, :data:`LLAMACPP_CONTEXT_OVERFLOW`: ``format_error_response`` (``server-common.cpp``):
  ``tools param requires --jinja flag`` is a ``std::runtime_error``, so HTTP 500 ``server_error``; the context
  overflow is HTTP 400 ``exceed_context_size_error`` with ``n_prompt_tokens`` and ``n_ctx``
  (``server_task_result_error::to_json``, ``server-task.cpp``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.backend_fakes import Responder, json_reply

__all__ = [
    "LLAMACPP_CONTEXT_OVERFLOW", "LLAMACPP_NO_JINJA", "LLAMACPP_TOOL_TEMPLATE", "OLLAMA_BUSY", "OLLAMA_CONTEXT_OVERFLOW",
    "llamacpp_chat", "llamacpp_models", "llamacpp_props", "ollama_chat", "ollama_show", "ollama_tags",
]  # fmt: skip

CREATED_AT = "2026-08-21T18:48:22.123456Z"

OLLAMA_BUSY = json_reply(503, {"error": "server busy, please try again.  maximum pending requests exceeded"})
OLLAMA_CONTEXT_OVERFLOW = json_reply(400, {"error": "the input length exceeds the context length"})
LLAMACPP_NO_JINJA = json_reply(
    500, {"error": {"code": 500, "message": "tools param requires --jinja flag", "type": "server_error"}}
)
LLAMACPP_CONTEXT_OVERFLOW = json_reply(
    400,
    {
        "error": {
            "code": 400,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 4711,
            "n_ctx": 4096,
        }
    },
)


def _ollama_calls(calls: Sequence[tuple[str, dict[str, Any]]], turn: int) -> list[dict[str, Any]]:
    """``api.ToolCall`` values: ``id`` then ``function`` with ``index``, ``name`` and ``arguments`` (an object)."""
    return [
        {"id": f"call_{turn:04d}{i:04d}", "function": {"index": i, "name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(calls)
    ]


def ollama_chat(
    replies: Sequence[dict[str, Any]], *, model: str = "qwen3:0.6b", can_think: bool = True, not_found: str | None = None
) -> Responder:
    """``POST /api/chat`` (``stream: false``) answered as Ollama answers it; ``replies`` are served in order.

    Args:
        replies: each ``{"content", "thinking"?, "calls"?: [(name, arguments)], "done_reason"?, "prompt_eval_count"?,
            "eval_count"?}``; counts default to 0, which Ollama leaves out.
        model: the one model this server has.
        can_think: whether the model has the ``thinking`` capability.
        not_found: for any other model, ``"getModel"`` or ``"schedule"``: which of the two 404 wordings to send.
    """
    script = list(replies)

    def respond(handler: BaseHTTPRequestHandler, body: Any) -> None:
        name = body.get("model")
        if name != model:
            wording = (
                f"model '{name}' not found" if not_found != "schedule" else f'model "{name}" not found, try pulling it first'
            )
            return json_reply(404, {"error": wording})(handler, body)
        if body.get("think") is True and not can_think:
            return json_reply(400, {"error": f"{json.dumps(name)} does not support thinking"})(handler, body)
        out: dict[str, Any] = {"model": name, "created_at": CREATED_AT}
        if not body.get("messages"):
            out |= {"message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "load"}
            return json_reply(200, out)(handler, body)
        reply = script.pop(0)
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content", "")}
        if reply.get("thinking"):
            message["thinking"] = reply["thinking"]
        if reply.get("calls"):
            message["tool_calls"] = _ollama_calls(reply["calls"], len(body["messages"]))
        out |= {"message": message, "done": True, "done_reason": reply.get("done_reason", "stop"), "total_duration": 1234567}
        for key in ("prompt_eval_count", "eval_count"):
            if reply.get(key):  # Metrics: `json:"...,omitempty"`
                out[key] = reply[key]
        return json_reply(200, out)(handler, body)

    return respond


def ollama_show(
    capabilities: Sequence[str], *, template: str = "{{ .Prompt }}", parameters: dict[str, Any] | None = None
) -> Responder:
    """``POST /api/show``: a ``ShowResponse`` with ``capabilities`` and no ``digest`` field (there is none).

    Args:
        capabilities: ``types/model/capability.go`` names.
        template: the model's template (Ollama's stand-in for a model without one: ``{{ .Prompt }}``,
            ``template/template.go``).
        parameters: the model's options, written as ``GetModelInfo`` (``server/routes.go``) writes them: one
            ``fmt.Sprintf("%-*s %#v", 30, k, v)`` line each (a list: one line per item), joined by newlines.
    """
    lines = []
    for name, value in (parameters or {}).items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"{name:<30} {json.dumps(item)}")  # %#v: Go syntax; strings quoted, numbers bare
    return json_reply(200, {
        "modelfile": "FROM /models/blobs/sha256-aa\n", "template": template, "parameters": "\n".join(lines),
        "details": {"format": "gguf", "family": "qwen3", "parameter_size": "751.63M", "quantization_level": "Q4_K_M"},
        "model_info": {"general.architecture": "qwen3"}, "capabilities": list(capabilities),
        "modified_at": "2026-08-01T10:00:00Z",
    })  # fmt: skip


LLAMACPP_TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}{{ tool | tojson }}{%- endfor %}<|im_end|>\n"
    "{%- endif %}{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
"""A chat template that renders tools (shortened from Qwen2.5's), for :func:`llamacpp_props`."""


def llamacpp_props(template: str | None, *, supports_tools: bool, ftype: str = "Q4_K_M", slots: Any = 1) -> Responder:
    """``GET /props`` of llama.cpp's server, shaped as the bundled server (``xllamacpp`` 2026.10.11549) answers it:
    ``default_generation_settings`` (``params`` with the sampling defaults, ``n_ctx``), ``model_ftype``,
    ``chat_template``, ``chat_template_caps`` (``supports_tools``, ...) and ``build_info``; the real body, minus the
    fields the harness does not read, is printed by ``tests/test_provenance_embedded.py``'s server; ``total_slots`` is
    ``slots`` (the real server's ``--parallel``)."""
    body: dict[str, Any] = {
        "default_generation_settings": {"params": {
            "seed": 4294967295, "temperature": 0.800000011920929, "top_k": 40, "top_p": 0.949999988079071,
            "min_p": 0.05000000074505806, "typical_p": 1.0, "repeat_last_n": 64, "repeat_penalty": 1.0,
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat": 0, "n_predict": -1, "max_tokens": -1,
            "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]},
            "n_ctx": 4096},
        "total_slots": slots, "model_alias": "/models/qwen2.5-0.5b-instruct-q4_k_m.gguf", "model_ftype": ftype,
        "model_path": "/models/qwen2.5-0.5b-instruct-q4_k_m.gguf",
        "chat_template_caps": {"supports_parallel_tool_calls": supports_tools, "supports_system_role": True,
                               "supports_tool_calls": supports_tools, "supports_tools": supports_tools},
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "build_info": "b6123-006639c3", "is_sleeping": False,
    }  # fmt: skip
    if template is not None:
        body["chat_template"] = template
    return json_reply(200, body)


def llamacpp_models(n_params: int) -> Responder:
    """``GET /v1/models`` of llama.cpp's server: ``data[0].meta`` with ``n_params`` and ``ftype`` (as the bundled server)."""
    return json_reply(200, {"object": "list", "data": [{
        "id": "qwen2.5-0.5b-instruct", "object": "model", "owned_by": "llamacpp", "created": 1787000000,
        "meta": {"vocab_type": 2, "n_vocab": 151936, "n_ctx": 4096, "n_ctx_train": 32768, "n_embd": 896,
                 "n_params": n_params, "size": 491400032, "ftype": "Q4_K_M"}}]})  # fmt: skip


def ollama_tags(entries: dict[str, str]) -> Responder:
    """``GET /api/tags``: one ``ListModelResponse`` per ``name -> manifest digest (hex)``."""
    models = [
        {"name": name, "model": name, "modified_at": "2026-08-01T10:00:00Z", "size": 522653767, "digest": digest,
         "details": {"format": "gguf", "family": "qwen3"}}
        for name, digest in entries.items()
    ]  # fmt: skip
    return json_reply(200, {"models": models})


def llamacpp_chat(
    content: str | None,
    calls: Sequence[tuple[str, str]] = (),
    *,
    finish_reason: str = "stop",
    usage: tuple[int, int] = (12, 3),
    reasoning: str | None = None,
) -> Responder:
    """A llama.cpp ``/v1/chat/completions`` reply (non-streamed), with ``usage`` and ``timings``.

    Args:
        content: the message content.
        calls: ``(name, arguments JSON text)`` each, sent as ``tool_calls`` with an ``id``.
        finish_reason: as sent.
        usage: ``(prompt_tokens, completion_tokens)``.
        reasoning: ``reasoning_content``, when the server split reasoning off.
    """
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": name, "arguments": arguments}, "id": f"{i:02d}" + "Qx7pLk2Rv9" * 3}
            for i, (name, arguments) in enumerate(calls)
        ]
    prompt, completion = usage
    body = {
        "choices": [{"finish_reason": finish_reason, "index": 0, "message": message}],
        "created": 1787000000, "model": "qwen2.5-0.5b-instruct", "system_fingerprint": "b6123-006639c3",
        "object": "chat.completion", "usage": {"completion_tokens": completion, "prompt_tokens": prompt,
                                               "total_tokens": prompt + completion},
        "id": "chatcmpl-Qx7pLk2Rv9Qx7pLk2Rv9Qx7pLk2Rv9ab",
        "timings": {"cache_n": 0, "prompt_n": prompt, "prompt_ms": 48.5, "prompt_per_token_ms": 48.5 / prompt,
                    "prompt_per_second": prompt * 1000 / 48.5, "predicted_n": completion, "predicted_ms": 61.25,
                    "predicted_per_token_ms": 61.25 / completion, "predicted_per_second": completion * 1000 / 61.25},
    }  # fmt: skip
    return json_reply(200, body)
