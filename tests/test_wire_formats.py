"""Issue 12, section 6: the wire as the servers really speak it, one test (or more) per item.

Every server here is a real HTTP server on 127.0.0.1 (:class:`tests.backend_fakes.FakeServer`) answering as
the fakes of :mod:`tests.server_fakes` do, each following the Ollama or llama.cpp source file it cites.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from harness.backends import GenerateOptions, OllamaBackend, OpenAICompatBackend, open_backend
from harness.errors import BackendResponseError, ContextOverflow, ModelNotFound, ServerConfigError
from harness.ledger import Ledger
from harness.loop import RetryPolicy, RunOptions, RunPlan, run_once
from harness.report import load_frames
from harness.report.tables import summary_table
from tests.backend_fakes import FakeServer, json_reply
from tests.helpers import REPORT, assert_one_sentence_error, cli
from tests.server_fakes import (
    LLAMACPP_CONTEXT_OVERFLOW,
    LLAMACPP_NO_JINJA,
    OLLAMA_BUSY,
    OLLAMA_CONTEXT_OVERFLOW,
    llamacpp_chat,
    ollama_chat,
    ollama_show,
    ollama_tags,
)

MODEL = "qwen3:0.6b"
CHAT, OPENAI_CHAT = "/api/chat", "/v1/chat/completions"
FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.02)
IDEAL_OLLAMA = [
    {"calls": [("list_files", {"path": "."})], "thinking": "The user wants a listing; list first.",
     "prompt_eval_count": 120, "eval_count": 18},
    {"calls": [("write_file", {"path": "report.txt", "content": REPORT})], "prompt_eval_count": 180, "eval_count": 40},
    {"content": "I wrote report.txt: 3 files."},  # counts of zero: Ollama leaves them out
]  # fmt: skip
BEFORE_THINK = Path(__file__).resolve().parent / "data" / "before_think"


def ollama_routes(replies, **chat_options):
    return {
        ("GET", "/api/version"): json_reply(200, {"version": "0.33.0-rc2"}),
        ("GET", "/api/tags"): ollama_tags({MODEL: "a80c4f17acd5" + "0" * 52}),
        ("POST", "/api/show"): ollama_show(["completion", "tools", "thinking"]),
        ("POST", CHAT): ollama_chat(replies, model=MODEL, **chat_options),
    }


def run(tmp_path, plan):
    """One run of ``plan``; returns (summary, run row, turn rows, attempts)."""
    with open_backend(plan.model, timeout_s=5) as backend, Ledger(tmp_path / "ledger.sqlite") as ledger:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=FAST))
        (row,) = ledger.runs()
        assert ledger.verify().ok
        return summary, row, ledger.turns(summary.run_id), ledger.attempts(summary.run_id)


# -- thinking: the setting, message.thinking, and a model that cannot think ------------------------------------
def test_an_ollama_run_keeps_call_ids_thinking_manifest_digest_and_sends_truncate_false(tmp_path, scenario):
    with FakeServer(ollama_routes(IDEAL_OLLAMA)) as server:
        summary, row, turns, attempts = run(tmp_path, RunPlan(scenario, f"ollama:{MODEL}@{server.url}", 0.0))
    bodies = server.posts(CHAT)
    assert (summary.outcome, len(bodies), attempts) == ("pass", 3, [])
    assert [("think" in b, b["truncate"]) for b in bodies] == [(False, False)] * 3  # default: think left out
    assistant, tool = bodies[1]["messages"][2:4]
    assert assistant["tool_calls"] == [{"id": "call_00020000", "function": {"name": "list_files", "arguments": {"path": "."}}}]
    assert {k: tool[k] for k in ("role", "tool_call_id", "tool_name")} == {
        "role": "tool", "tool_call_id": "call_00020000", "tool_name": "list_files"}  # fmt: skip
    assert bodies[2]["messages"][5]["tool_call_id"] == "call_00040000"
    assert [t.record.reasoning for t in turns] == ["The user wants a listing; list first.", None, None]
    assert [(t.record.prompt_tokens, t.record.completion_tokens) for t in turns] == [(120, 18), (180, 40), (None, None)]
    assert [c["index"] for c in turns[0].record.tool_calls[0:1] for c in [c["function"]]] == [0]
    start = row.start
    assert (start.think, start.model_digest, start.manifest_digest) == ("default", None, "sha256:a80c4f17acd5" + "0" * 52)
    assert start.config["request_settings"] == {"truncate": False}


@pytest.mark.parametrize(("think", "sent"), [("on", True), ("off", False)])
def test_think_on_and_off_are_sent_and_recorded_on_the_run(tmp_path, scenario, think, sent):
    with FakeServer(ollama_routes(IDEAL_OLLAMA)) as server:
        summary, row, _turns, _ = run(tmp_path, RunPlan(scenario, f"ollama:{MODEL}@{server.url}", 0.0, think=think))
    assert summary.outcome == "pass"
    assert [b["think"] for b in server.posts(CHAT)] == [sent] * 3
    assert (row.start.think, row.start.config["request_settings"]) == (think, {"truncate": False, "think": sent})


def test_a_reasoning_model_that_spends_num_predict_thinking_keeps_its_thinking(tmp_path, scenario):
    thinking = "Let me think about which files exist. " * 20
    replies = [{"content": "", "thinking": thinking, "done_reason": "length", "prompt_eval_count": 90, "eval_count": 256}]
    with FakeServer(ollama_routes(replies)) as server:
        summary, _row, (turn,), _ = run(tmp_path, RunPlan(scenario, f"ollama:{MODEL}@{server.url}", 0.0))
    assert (turn.record.reasoning, turn.record.finish_reason, turn.record.completion_tokens) == (thinking, "length", 256)
    assert "truncated_by_length" in turn.labels and summary.outcome == "task_failed"


def test_think_on_for_a_model_that_cannot_think_is_one_sentence_before_the_matrix(tmp_path, capsys):
    routes = ollama_routes([]) | {("POST", "/api/show"): ollama_show(["completion", "tools"])}
    ledger = tmp_path / "ledger.sqlite"
    with FakeServer(routes) as server:
        rc, out, err = cli(capsys, "run", "--model", f"ollama:{MODEL}@{server.url}", "--think", "on", "--ledger", ledger)
        assert server.posts(CHAT) == []  # nothing was asked of the model
    assert_one_sentence_error(rc, err)
    assert err == (f"harness: ollama:{MODEL}@{server.url} cannot think (the server lists no 'thinking' capability for it), "
                   "but the matrix asks for think = on; use --think off or --think default for it, or drop it from the matrix.\n")  # fmt: skip
    assert not ledger.exists() or Ledger(ledger, readonly=True).runs() == []


def test_ollama_refusing_think_mid_run_is_a_config_error_never_retried(tmp_path, scenario):
    routes = ollama_routes([], can_think=False) | {("POST", "/api/show"): json_reply(200, {"details": {}})}  # no capabilities
    with FakeServer(routes) as server:
        with OllamaBackend(MODEL, server.url) as backend, pytest.raises(ServerConfigError) as info:
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions(think="on"))
        summary, _row, _turns, attempts = run(tmp_path, RunPlan(scenario, f"ollama:{MODEL}@{server.url}", 0.0, think="on"))
    assert str(info.value) == (f'Ollama says "{MODEL}" does not support thinking; run it with --think off or --think default '
                               "(or `think` in the scenario's [matrix]).")  # fmt: skip
    assert (summary.outcome, [a.status_code for a in attempts]) == ("infra_error", [None])


def test_openai_compatible_think_and_reasoning_content(tmp_path):
    reply = llamacpp_chat("Hello!", reasoning="A greeting.")
    with FakeServer({("POST", OPENAI_CHAT): reply}) as server:
        with OpenAICompatBackend("m", f"{server.url}/v1") as backend:
            on = backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions(think="on"))
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions(think="off"))
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions())
    kwargs = [b.get("chat_template_kwargs") for b in server.posts(OPENAI_CHAT)]
    assert kwargs == [{"enable_thinking": True}, {"enable_thinking": False}, None]
    assert (on.content, on.reasoning) == ("Hello!", "A greeting.")


def test_think_is_a_matrix_key_and_a_flag(tmp_path, capsys):
    from harness.runner import expand_matrix
    from harness.scenarios import load_scenario
    from tests.helpers import scenario_toml

    path = scenario_toml(tmp_path, matrix='[matrix]\nmodels = ["replay:x.jsonl"]\nthink = ["off", "on"]\n')
    plans = expand_matrix([load_scenario(path)])
    assert [p.think for p in plans] == ["off", "on"]
    bad = scenario_toml(tmp_path, matrix='[matrix]\nthink = ["maybe"]\n', name="bad.toml")
    rc, _out, err = cli(capsys, "scenarios", "check", bad)
    assert rc != 0 and "field 'matrix.think[0]' must be one of default, on, off" in err


def test_a_ledger_recorded_before_think_resumes_without_redoing_its_runs(tmp_path, capsys, monkeypatch):
    for name in ("ledger.sqlite", "ideal.jsonl", "scenario.toml"):
        shutil.copyfile(BEFORE_THINK / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    args = ["run", "scenario.toml", "--model", "replay:ideal.jsonl", "--temperature", "0", "--tool-mode", "native",
            "--parser", "lenient", "--ledger", "ledger.sqlite"]  # fmt: skip
    rc, out, _err = cli(capsys, *args)
    assert rc == 0 and "0 runs in" in out and "2 already in the ledger, skipped" in out
    rc, out, _err = cli(capsys, *args, "--think", "default", "--think", "on")
    assert rc == 0 and "2 runs in" in out and "2 already in the ledger, skipped" in out  # only the `on` runs are new
    assert "native/lenient think=on rep=0 -> pass" in out and "native/lenient rep=0" not in out
    with Ledger(tmp_path / "ledger.sqlite", readonly=True) as ledger:
        assert [r.start.think for r in ledger.runs()] == [None, None, "on", "on"]


# -- truncate: false and context_overflow --------------------------------------------------------------------------
def test_an_over_long_context_is_its_own_outcome_never_retried_and_shown_in_reports(tmp_path, scenario):
    routes = ollama_routes(IDEAL_OLLAMA[:1])
    first = routes[("POST", CHAT)]
    calls = [0]

    def respond(handler, body):
        calls[0] += 1
        return (first if calls[0] == 1 else OLLAMA_CONTEXT_OVERFLOW)(handler, body)

    with FakeServer(routes | {("POST", CHAT): respond}) as server:
        summary, _row, turns, attempts = run(tmp_path, RunPlan(scenario, f"ollama:{MODEL}@{server.url}", 0.0))
    assert (summary.outcome, len(turns), calls[0]) == ("context_overflow", 1, 2)
    assert [(a.turn, a.error_type, a.retry_in_ms) for a in attempts] == [(2, "ContextOverflow", None)]
    assert summary.error == (f"The conversation no longer fits the context Ollama gave '{MODEL}' "
                             "(the input length exceeds the context length); raise the scenario's num_ctx.")  # fmt: skip
    frames = load_frames(tmp_path / "ledger.sqlite")
    (row,) = summary_table(frames).to_dict("records")
    assert (row["runs"], row["scored"], row["context_overflow"], row["infra_error"]) == (1, 0, 1, 0)


@pytest.mark.parametrize(
    "responder",
    [LLAMACPP_CONTEXT_OVERFLOW,
     json_reply(400, {"error": {"message": "This model's maximum context length is 4096 tokens. However, you requested 4711 "
                                "tokens (4455 in the messages, 256 in the completion). Please reduce the length of the messages "
                                "or completion.", "type": "BadRequestError", "param": None, "code": 400}})],
    ids=["llama.cpp", "vllm"],
)  # fmt: skip
def test_openai_compatible_context_overflow(responder):
    with FakeServer({("POST", OPENAI_CHAT): responder}) as server, OpenAICompatBackend("m", f"{server.url}/v1") as backend:
        with pytest.raises(ContextOverflow) as info:
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions())
    assert info.value.retryable is False
    assert str(info.value).startswith(f"The conversation no longer fits the context of the server at {server.url}/v1 (")


# -- parallel_tool_calls and llama.cpp's timings ------------------------------------------------------------------
def test_parallel_tool_calls_is_sent_and_recorded_and_timings_are_read(tmp_path, scenario):
    reply = llamacpp_chat(None, [("list_files", '{"path": "."}'), ("read_file", '{"path": "hello.txt"}')],
                          finish_reason="tool_calls", usage=(97, 31))  # fmt: skip
    final = llamacpp_chat("Done.", usage=(160, 4))
    calls = [0]

    def respond(handler, body):
        calls[0] += 1
        return (reply if calls[0] == 1 else final)(handler, body)

    with FakeServer({("POST", OPENAI_CHAT): respond}) as server:
        summary, row, turns, _ = run(tmp_path, RunPlan(scenario, f"openai:m@{server.url}/v1", 0.0))
    assert [b["parallel_tool_calls"] for b in server.posts(OPENAI_CHAT)] == [True, True]
    assert row.start.config["request_settings"] == {"parallel_tool_calls": True}
    assert [c["name"] for c in turns[0].record.executed_calls] == ["list_files", "read_file"]
    assert turns[0].record.timings == {
        "cache_n": 0.0, "prompt_n": 97.0, "prompt_ms": 48.5, "prompt_per_token_ms": 48.5 / 97, "prompt_per_second": 97000 / 48.5,
        "predicted_n": 31.0, "predicted_ms": 61.25, "predicted_per_token_ms": 61.25 / 31, "predicted_per_second": 31000 / 61.25,
    }  # fmt: skip
    assert summary.outcome == "task_failed"


def test_no_tools_no_parallel_tool_calls():
    with FakeServer({("POST", OPENAI_CHAT): llamacpp_chat("hi")}) as server:
        with OpenAICompatBackend("m", f"{server.url}/v1") as backend:
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions())
    assert "parallel_tool_calls" not in server.posts(OPENAI_CHAT)[0]


# -- permanent configuration errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "responder",
    [LLAMACPP_NO_JINJA,
     json_reply(500, {"error": {"code": 500, "message": "Unsupported param: tools", "type": "server_error"}})],
    ids=["jinja", "older-unsupported-param"],
)  # fmt: skip
def test_llamacpp_without_jinja_is_one_sentence_naming_the_flag_never_retried(tmp_path, scenario, responder):
    with FakeServer({("POST", OPENAI_CHAT): responder}) as server:
        summary, _row, turns, attempts = run(tmp_path, RunPlan(scenario, f"openai:m@{server.url}/v1", 0.0))
        assert len(server.posts(OPENAI_CHAT)) == 1
    assert (summary.outcome, turns, [a.error_type for a in attempts]) == ("infra_error", [], ["ServerConfigError"])
    assert "restart llama-server with --jinja" in summary.error and summary.error.count(". ") == 0


def test_another_unsupported_param_names_it():
    body = {"error": {"code": 500, "message": "Unsupported param: echo", "type": "server_error"}}
    with (
        FakeServer({("POST", OPENAI_CHAT): json_reply(500, body)}) as server,
        OpenAICompatBackend("m", f"{server.url}/v1") as backend,
    ):
        with pytest.raises(ServerConfigError) as info:
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions())
    assert str(info.value) == (f"The server at {server.url}/v1 does not accept the request parameter 'echo' (Unsupported param: echo); "
                               "use a server version that accepts it.")  # fmt: skip


# -- the fakes follow the real formats ----------------------------------------------------------------------------
def test_a_busy_ollama_is_503_without_retry_after_and_is_retried_with_backoff(tmp_path, scenario):
    routes = ollama_routes(IDEAL_OLLAMA)
    served = routes[("POST", CHAT)]
    calls = [0]

    def respond(handler, body):
        calls[0] += 1
        return (OLLAMA_BUSY if calls[0] == 1 else served)(handler, body)

    with FakeServer(routes | {("POST", CHAT): respond}) as server:
        with OllamaBackend(MODEL, server.url) as backend, pytest.raises(BackendResponseError) as info:
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions())
        assert "Retry-After" not in str(info.value)
        calls[0] = 0
        summary, _row, _turns, attempts = run(tmp_path, RunPlan(scenario, f"ollama:{MODEL}@{server.url}", 0.0))
    assert (info.value.status_code, info.value.retry_after_s, info.value.retryable) == (503, None, True)
    assert "server busy, please try again.  maximum pending requests exceeded" in str(info.value)
    assert summary.outcome == "pass"
    assert [(a.turn, a.status_code) for a in attempts] == [(1, 503)] and 0 < attempts[0].retry_in_ms <= 20


def test_an_empty_messages_list_only_loads_the_model():
    with FakeServer(ollama_routes([])) as server, OllamaBackend(MODEL, server.url) as backend:
        reply = backend.generate([], None, GenerateOptions())
    assert (reply.content, reply.tool_calls, reply.finish_reason) == ("", None, "load")
    assert (reply.prompt_tokens, reply.completion_tokens) == (None, None)  # absent: Ollama omits zero counts


@pytest.mark.parametrize(
    ("wording", "error"),
    [("getModel", "model 'llama3:8b' not found"), ("schedule", 'model "llama3:8b" not found, try pulling it first')],
)
def test_both_of_ollamas_model_not_found_wordings(wording, error):
    with FakeServer(ollama_routes([], not_found=wording)) as server, OllamaBackend("llama3:8b", server.url) as backend:
        with pytest.raises(ModelNotFound) as info:
            backend.generate([{"role": "user", "content": "hi"}], None, GenerateOptions())
    assert str(info.value) == "Ollama has no model 'llama3:8b'; run `ollama pull llama3:8b` first."
    assert server.requests[-1].path == CHAT
    assert error  # the wording the fake sent (server/routes.go)


def test_the_ollama_fake_answers_what_ollama_answers(tmp_path):
    """The fake itself: ids, indexes and omitted counts as in api/types.go and server/routes.go."""
    import httpx

    with FakeServer(ollama_routes([{"calls": [("a", {}), ("b", {"x": 1})]}])) as server:
        body = httpx.post(f"{server.url}{CHAT}", json={"model": MODEL, "messages": [{"role": "user", "content": "go"}]}).json()
    assert body["message"]["tool_calls"] == [
        {"id": "call_00010000", "function": {"index": 0, "name": "a", "arguments": {}}},
        {"id": "call_00010001", "function": {"index": 1, "name": "b", "arguments": {"x": 1}}},
    ]
    assert "prompt_eval_count" not in body and "eval_count" not in body and body["done_reason"] == "stop"


def test_a_plan_without_think_has_the_identity_it_had_before(scenario):
    plan = RunPlan(scenario, "replay:x.jsonl", 0.0)
    assert plan.options().as_dict() == {"temperature": 0.0, "seed": 0, "max_tokens": 256, "num_ctx": 4096}
    assert plan.identity("sha256:1") == dataclasses.replace(plan, think="default").identity("sha256:1")
    assert plan.identity("sha256:1") != dataclasses.replace(plan, think="off").identity("sha256:1")
