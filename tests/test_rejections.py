"""A server's refusal of the model's tool call is a model turn (``server_rejected_call``), never an infrastructure error.

The refusal bodies below are the real ones quoted in public issue threads (each cited), served verbatim by an
HTTP server on 127.0.0.1. Genuine infrastructure failures stay ``infra_error``, and the history the harness
sends back never holds tool-call arguments that are not a JSON object (a server refuses such a request in the
same words; that would be the harness's bug, not the model's).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.backends import open_backend
from harness.backends.base import GenerateOptions
from harness.classifier import classify, classify_document
from harness.ledger import Ledger
from harness.loop import RetryPolicy, RunOptions, RunPlan, run_once
from harness.rescore import rescore
from tests.backend_fakes import FakeServer, closed_port, json_reply, raw_reply
from tests.helpers import chat_body

# llama.cpp's server: the message from https://github.com/vxcontrol/pentagi/issues/313 (qwen3.6-35b on
# llama-server); the envelope {"error": {"code", "message", "type": "server_error"}} as quoted in
# https://github.com/noonghunna/club-3090/issues/1195 and https://github.com/ggml-org/llama.cpp/pull/5961.
LLAMA_MESSAGE = (
    "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error at line 1, column 131: "
    "syntax error while parsing value - unexpected end of input; expected '[', '{', or a literal"
)
LLAMA_BODY = json.dumps({"error": {"code": 500, "message": LLAMA_MESSAGE, "type": "server_error"}})
# Ollama, verbatim from https://github.com/continuedev/continue/issues/10221 (gpt-oss:20b): the raw text is quoted.
OLLAMA_BODY = r"""{"error":"error parsing tool call: raw='ls -R\n', err=invalid character 'l' looking for beginning of value"}"""
# Ollama 0.11.6, from https://github.com/ollama/ollama/issues/12064 (gpt-oss:120b): the older wording, no raw text.
OLLAMA_OLD_BODY = json.dumps({"error": "error parsing tool call: invalid character ']' after object key:value pair"})
# vLLM parsing a forced call on a first request (no history), verbatim from
# https://github.com/kubernetes-sigs/inference-perf/issues/695 (Qwen3-30B-A3B-Thinking-2507).
VLLM_BODY = r"""{"error":{"message":"1 validation error for list[function-wrap[__log_extra_fields__()]]\n  Invalid JSON: EOF while parsing an object at line 1508 column 3 [type=json_invalid, input_value='[  \\t\\t\\t\\t\\t\\t\\n\\t\\t{\\n...t push --force\\\"\\n\\t\\t\\t', input_type=str]\n    For further information visit https://errors.pydantic.dev/2.12/v/json_invalid","type":"BadRequestError","param":null,"code":400}}"""
# vLLM before its errors moved under "error" (and SGLang): the flat envelope {"object": "error", "message", "type",
# "param", "code"} as quoted in https://github.com/vllm-project/vllm/issues/21165, around the message above (red team:
# it was an infra_error)
VLLM_FLAT_BODY = json.dumps({"object": "error", **json.loads(VLLM_BODY)["error"]})
# vLLM refusing a client's *history* whose arguments are not JSON, verbatim from
# https://github.com/vllm-project/vllm/issues/43995: the client's bug, not a refusal of a reply.
VLLM_HISTORY_BODY = r"""{"error":{"message":"Expecting ',' delimiter: line 1 column 54 (char 53)","type":"BadRequestError","param":null,"code":400}}"""

TOOLS = [{"type": "function", "function": {"name": "list_files", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]  # fmt: skip
MESSAGES = [{"role": "user", "content": "List the files."}]
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01)
OPENAI_PATH, OLLAMA_PATH = "/v1/chat/completions", "/api/chat"
LIST_CALL = chat_body(
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": "{\"path\": \".\"}"}}]},
    finish="tool_calls",
)  # fmt: skip


def in_turn(*responders):
    """A responder answering the n-th request with the n-th responder (the last repeats)."""
    count = [0]

    def respond(handler, body):
        responder = responders[min(count[0], len(responders) - 1)]
        count[0] += 1
        responder(handler, body)

    return respond


def refusal(status, body):
    return raw_reply(status, body.encode())


def run_on(tmp_path, scenario, server, kind, **options):
    spec = f"openai:m@{server.url}/v1" if kind == "openai" else f"ollama:m@{server.url}"
    plan = RunPlan(scenario, spec, 0.0, tool_mode="native")
    with Ledger(tmp_path / "ledger.sqlite") as ledger, open_backend(spec, timeout_s=10) as backend:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=FAST, **options))
        turns = ledger.turns(summary.run_id)
        attempts = ledger.attempts()
        assert ledger.verify().ok
    return summary, turns, attempts


@pytest.mark.parametrize(
    ("kind", "status", "body", "server", "content"),
    [
        ("openai", 500, LLAMA_BODY, "llama.cpp", None),
        ("openai", 400, VLLM_BODY, "vllm", None),
        ("openai", 400, VLLM_FLAT_BODY, "vllm", None),
        ("ollama", 500, OLLAMA_BODY, "ollama", "ls -R\n"),
        ("ollama", 500, OLLAMA_OLD_BODY, "ollama", None),
    ],
    ids=["llama.cpp", "vllm", "vllm-flat", "ollama", "ollama-0.11"],
)
def test_each_backend_returns_its_servers_refusal_as_a_reply(kind, status, body, server, content):
    path = OPENAI_PATH if kind == "openai" else OLLAMA_PATH
    with FakeServer({("POST", path): refusal(status, body)}) as fake:
        spec = f"openai:m@{fake.url}/v1" if kind == "openai" else f"ollama:m@{fake.url}"
        with open_backend(spec, timeout_s=10) as backend:
            reply = backend.generate(MESSAGES, TOOLS, GenerateOptions())
        assert len(fake.posts(path)) == 1
    parsed = json.loads(body)
    message = (
        parsed["message"]
        if "error" not in parsed
        else parsed["error"]["message"]
        if isinstance(parsed["error"], dict)
        else parsed["error"]
    )
    assert reply.rejection == {"server": server, "status": status, "error": message}
    assert (reply.content, reply.tool_calls, reply.finish_reason, reply.raw) == (content, None, None, parsed)
    assert reply.response_dict()["server_rejection"] == reply.rejection  # what a cassette records


def test_a_llama_cpp_refusal_is_a_model_turn_that_ends_the_run_unretried(tmp_path, scenario):
    with FakeServer({("POST", OPENAI_PATH): in_turn(json_reply(200, LIST_CALL), refusal(500, LLAMA_BODY))}) as fake:
        summary, turns, attempts = run_on(tmp_path, scenario, fake, "openai")
        assert len(fake.posts(OPENAI_PATH)) == 2  # asked once: the same prompt would give the same output
    assert (summary.outcome, summary.turns, summary.error) == ("task_failed", 2, None)  # the done checks decide
    assert summary.failure_modes == ["server_rejected_call"]
    assert attempts == []  # not an infrastructure failure: no failed attempt is recorded
    last = turns[1].record
    assert last.server_rejection == {"server": "llama.cpp", "status": 500, "error": LLAMA_MESSAGE}
    assert (last.raw_reply, last.content, last.tool_calls, last.executed_calls) == (json.loads(LLAMA_BODY), None, None, [])
    assert last.failure_modes == ["server_rejected_call"]
    assert last.details["evidence"]["server_rejected_call"]["span"].startswith("Failed to parse tool call arguments as JSON")
    with Ledger(tmp_path / "ledger.sqlite") as ledger:  # re-scoring reads the refusal back from the ledger
        result = rescore(ledger, force=True)
        assert (result.turns, result.changed) == (2, 0)
        assert ledger.turns(summary.run_id)[1].labels == ["server_rejected_call"]


def test_an_ollama_refusal_keeps_the_quoted_text_as_the_reply(tmp_path, scenario):
    with FakeServer({("POST", OLLAMA_PATH): refusal(500, OLLAMA_BODY)}) as fake:
        summary, turns, attempts = run_on(tmp_path, scenario, fake, "ollama")
        assert len(fake.posts(OLLAMA_PATH)) == 1
    assert (summary.outcome, summary.turns, attempts) == ("task_failed", 1, [])
    [turn] = turns
    assert turn.record.content == "ls -R\n" and turn.record.server_rejection["server"] == "ollama"
    # the refused call is a call attempt: no skipped_required_tool, no narration_without_call for its text
    assert turn.record.failure_modes == ["server_rejected_call"]


def test_a_recorded_refusal_replays_the_same(tmp_path, scenario):
    with FakeServer({("POST", OPENAI_PATH): in_turn(json_reply(200, LIST_CALL), refusal(400, VLLM_BODY))}) as fake:
        live, live_turns, _ = run_on(tmp_path / "live", scenario, fake, "openai", record_dir=tmp_path / "tapes")
    [cassette] = (tmp_path / "tapes").iterdir()
    plan = RunPlan(scenario, f"replay:{cassette}", 0.0, tool_mode="native")
    with Ledger(tmp_path / "replay.sqlite") as ledger, open_backend(plan.model) as backend:
        again = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        turns = ledger.turns(again.run_id)
    assert (again.outcome, again.turns, again.failure_modes) == (live.outcome, 2, ["server_rejected_call"])
    assert turns[1].record.server_rejection == live_turns[1].record.server_rejection
    assert turns[1].record.server_rejection["server"] == "vllm"


@pytest.mark.parametrize(
    ("status", "content_type", "body", "asked"),
    [
        (503, "application/json", b'{"error":"server busy"}', 3),
        (502, "text/html", b"<html><body>502 Bad Gateway</body></html>", 3),
        (500, "application/json", b'{"error":{"code":500,"message":"failed to decode image","type":"server_error"}}', 3),
        (500, "application/json", b'{"error":"an error was encountered while running the model: unexpected EOF"}', 3),
        (400, "application/json", VLLM_HISTORY_BODY.encode(), 1),  # a refused history is the client's bug: loud, not a label
    ],
    ids=["503", "502-proxy", "500-other", "500-plain-error", "400-vllm-history"],
)
def test_infrastructure_failures_stay_infra_error(tmp_path, scenario, status, content_type, body, asked):
    with FakeServer({("POST", OPENAI_PATH): raw_reply(status, body, content_type=content_type)}) as fake:
        summary, turns, attempts = run_on(tmp_path, scenario, fake, "openai")
        assert len(fake.posts(OPENAI_PATH)) == asked
    assert (summary.outcome, summary.turns, turns, summary.failure_modes) == ("infra_error", 0, [], [])
    assert [a.status_code for a in attempts] == [status] * asked


def test_connection_refused_stays_infra_error(tmp_path, scenario):
    plan = RunPlan(scenario, f"openai:m@http://127.0.0.1:{closed_port()}/v1", 0.0)
    with Ledger(tmp_path / "ledger.sqlite") as ledger, open_backend(plan.model, timeout_s=5) as backend:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=FAST))
    assert (summary.outcome, summary.turns) == ("infra_error", 0) and "not reachable" in summary.error


# Arguments a server really returned, and shapes a model writes: none of them may go back as they are.
BROKEN_ARGUMENTS = [
    '{"path": "folder',  # the bundled llama.cpp's call cut by max_tokens (tests/test_rejections_embedded.py)
    '{"',  # https://github.com/ggml-org/llama.cpp/issues/22948
    '{"path": NaN}',
    "{'path': '.'}",
    '{"path": ".",}',
    '"{\\"path\\": \\".\\"}"',
    "",
    "null",
    "[1]",
]


def _not_json_constant(name: str):
    raise ValueError(f"{name} is not JSON")


@pytest.mark.parametrize("arguments", BROKEN_ARGUMENTS)
@pytest.mark.parametrize("parser", ["strict", "lenient"])
def test_the_history_sent_back_never_holds_arguments_that_are_not_a_json_object(tmp_path, scenario, arguments, parser):
    cut = chat_body(
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": arguments}}]},
        finish="length",
    )  # fmt: skip
    done = chat_body({"role": "assistant", "content": "Done."})
    with FakeServer({("POST", OPENAI_PATH): in_turn(json_reply(200, cut), json_reply(200, done))}) as fake:
        plan = RunPlan(dataclasses.replace(scenario), f"openai:m@{fake.url}/v1", 0.0, tool_mode="native", parser=parser)
        with Ledger(tmp_path / "ledger.sqlite") as ledger, open_backend(plan.model, timeout_s=10) as backend:
            summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=FAST))
        requests = fake.posts(OPENAI_PATH)
    assert summary.outcome != "infra_error"
    sent = [c for request in requests for m in request["messages"] for c in m.get("tool_calls") or []]
    for call in sent:  # as strict as llama.cpp's nlohmann parser: no NaN, no Infinity
        assert isinstance(json.loads(call["function"]["arguments"], parse_constant=_not_json_constant), dict)
    if summary.turns == 2:  # the call was acted on: it went back re-serialised
        assert len(sent) == 1


def test_the_classifier_takes_the_refusal_as_an_input():
    refused = "Failed to parse tool call arguments as JSON: parse error"
    plain = classify({"content": None}, tools=TOOLS, requires_tool=True)
    assert plain.failure_modes == ["empty_response", "skipped_required_tool"]
    result = classify({"content": None}, tools=TOOLS, requires_tool=True, server_rejection=refused)
    assert result.failure_modes == ["server_rejected_call"]  # a refused call is a call attempt, not an empty reply
    assert result.details["evidence"]["server_rejected_call"]["span"] == refused
    # where no tool is needed, the refused call is still a call
    assert classify({"content": None}, tools=TOOLS, requires_tool=False, server_rejection=refused).failure_modes == [
        "unneeded_call",
        "server_rejected_call",
    ]
    # the quoted text is labelled as usual, beside the refusal
    quoted = classify({"content": '<tool_call>\n{"name": "list_'}, tools=TOOLS, server_rejection="error parsing tool call")
    assert "server_rejected_call" in quoted.failure_modes and "tool_call_tags_in_content" in quoted.failure_modes
    # the finish reason alone decides truncated_by_length; a refusal never implies it
    length = classify({"content": None, "finish_reason": "length"}, tools=TOOLS, server_rejection=refused)
    assert length.failure_modes == ["truncated_by_length", "server_rejected_call"]
    doc = {"tools": TOOLS, "messages": MESSAGES, "response": {"content": None}, "server_rejection": refused}
    assert classify_document(doc)["failure_modes"] == ["server_rejected_call"]
    assert classify_document({**doc, "server_rejection": 7})["failure_modes"] == ["empty_response"]
