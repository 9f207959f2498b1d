"""What the bundled llama.cpp does with a tool call cut by ``max_tokens``: it degrades it, it does not refuse it.

SmolLM2's own template renders no tools, so the server gets a Hermes/Qwen tool template
(tests/data/qwen_tool_template.jinja) and a few-shot history in which the assistant called ``list_files``; at
temperature 0 the model writes ``<tool_call>{"name": "list_files", "arguments": {"path": "folder9"}}`` and a
``max_tokens`` of 22 cuts it inside the arguments. Observed with xllamacpp 2026.10.11549: HTTP 200,
``finish_reason: length``, a structured call whose ``arguments`` are the cut text ``{"path": "folder``. The same
server refuses a *history* holding those arguments with HTTP 500 ``Failed to parse tool call arguments as JSON``
(the harness's bug if it ever sent one), and accepts the history the harness really builds from the reply.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.backends import EmbeddedBackend, GenerateOptions
from harness.classifier import classify
from harness.tool_protocol import assistant_message, result_message

TEMPLATE = (Path(__file__).resolve().parent / "data" / "qwen_tool_template.jinja").read_text(encoding="utf-8")
TOOLS = [{"type": "function", "function": {"name": "list_files", "description": "List files",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]  # fmt: skip
CUT = GenerateOptions(temperature=0.0, seed=0, max_tokens=22)


def _shot(i: int) -> list[dict]:
    call = {
        "id": f"c{i}",
        "type": "function",
        "function": {"name": "list_files", "arguments": json.dumps({"path": f"folder{i}"})},
    }
    return [{"role": "user", "content": f"List the files in folder{i}."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "a.txt"},
            {"role": "assistant", "content": "a.txt"}]  # fmt: skip


MESSAGES = [{"role": "system", "content": "Call tools."}, *(m for i in range(3) for m in _shot(i))]
MESSAGES.append({"role": "user", "content": "List the files in folder9."})


@pytest.mark.slow
def test_the_bundled_llama_cpp_degrades_a_cut_call_and_refuses_it_only_as_history():
    with EmbeddedBackend("smollm2-135m", num_ctx=1024, timeout_s=120, chat_template=TEMPLATE) as backend:
        reply = backend.generate(MESSAGES, TOOLS, CUT)
        # degraded, not refused: HTTP 200, the call cut inside its arguments
        assert reply.rejection is None and reply.finish_reason == "length" and reply.completion_tokens == 22
        [call] = reply.tool_calls
        cut = call["function"]["arguments"]
        assert call["function"]["name"] == "list_files" and cut == '{"path": "folder'
        verdict = classify(reply.response_dict(), tools=TOOLS, history=MESSAGES, requires_tool=True)
        assert verdict.failure_modes == ["repaired_json", "truncated_by_length"]
        [acted] = verdict.calls("strict")
        assert acted.arguments == {"path": "folder"}

        # the reply's own arguments sent back as history: the server refuses the request, as a client's fault would be
        answer = {"role": "tool", "tool_call_id": call["id"], "name": "list_files", "content": "a.txt"}
        verbatim = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call]}, answer]
        refused = backend.generate(verbatim, TOOLS, GenerateOptions(max_tokens=4))
        assert refused.rejection is not None and refused.rejection["status"] == 500
        assert refused.rejection["error"].startswith("Failed to parse tool call arguments as JSON: ")
        assert "missing closing quote" in refused.rejection["error"]

        # the history the loop really sends: the parsed arguments re-serialised; the server takes it
        sent = assistant_message(reply.content, [acted], [call["id"]], "native")
        assert sent["tool_calls"][0]["function"]["arguments"] == '{"path": "folder"}'
        harness = [*MESSAGES, sent, result_message("a.txt", name="list_files", call_id=call["id"], tool_mode="native")]
        after = backend.generate(harness, TOOLS, GenerateOptions(max_tokens=4))
        assert after.rejection is None and after.finish_reason in ("stop", "length", "tool_calls")
