"""Streaming (issue 12, section 2): assembling streamed chunks, the bugs that appear only when streaming, and the
run identity that gains ``stream`` only when it is on (section 5).

The scripted servers (tests/stream_fakes.py) reproduce streaming bugs reported in public threads, each answering
the same request correctly when it is not streamed, as the reports describe:

* vLLM, arguments that lose their closing brace when streamed: https://github.com/vllm-project/vllm/issues/15274
  (fix attempt https://github.com/vllm-project/vllm/pull/15930, whose example assembles to ``{"question": "..."``);
  the opening brace lost: https://github.com/vllm-project/vllm/issues/35266; the first words of the arguments
  lost: https://github.com/vllm-project/vllm/issues/21046.
* argument deltas under an index that no delta opened (Nebius, Cerebras): https://github.com/dirac-run/dirac/pull/215;
  a second call's head under index 0 and its tail under index 1: https://github.com/agno-agi/agno/pull/8880.
* ``finish_reason`` set on every chunk, so content follows the final chunk:
  https://github.com/suhaibbinyounis/github-copilot-api-vscode/issues/100.
* llama.cpp's first tool-call delta carries the name, the id and the opening ``{`` together (clients that drop it
  lose the brace; the harness must not): https://github.com/ggml-org/llama.cpp/issues/22722; before
  https://github.com/ggml-org/llama.cpp/pull/13800 the name was repeated in every delta.
* Ollama before 0.4.6 streamed a call as content pieces: https://github.com/ollama/ollama-python/issues/279 and
  https://github.com/ollama/ollama/issues/7825 (a model failure the classifier labels, not an assembly problem).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from harness.backends import OllamaBackend, OpenAICompatBackend, open_backend
from harness.backends.base import GenerateOptions
from harness.backends.streaming import assemble, reply_speed
from harness.canonical import sha256_of
from harness.classifier import classify
from harness.errors import BackendResponseError
from harness.ledger import Ledger
from harness.loop import IDENTITY_VERSION, RunOptions, RunPlan, run_once
from harness.matrix import MatrixOverrides
from harness.rescore import rescore
from harness.runner import expand_matrix, run_matrix
from harness.scenarios import load_scenario
from tests.helpers import CASSETTES, REPO, RUN_FLAGS, call_line, cli, write_cassette
from tests.stream_fakes import Turn, ollama_lines, openai_chunk, scripted, sse_chunks

USER = [{"role": "user", "content": "List the files."}]
OLD_LEDGER = REPO / "tests" / "data" / "ledger_m006_replay.sqlite"
"""16 finished runs (replay cassettes, list_and_report, native and prompt modes) recorded by the harness before
streaming existed (commit 58fbfa5), with the command in the resume test below."""


def _chunks(items: list[Any], step_ms: float = 10.0) -> list[dict[str, Any]]:
    """Raw chunks as the backend stores them, ``step_ms`` apart."""
    return [{"t": step_ms * (i + 1), "data": item if isinstance(item, str) else json.dumps(item)} for i, item in enumerate(items)]


def _call_delta(index: int | None, *, name: str | None = None, call_id: str | None = None, args: str | None = None) -> dict:
    function = {k: v for k, v in (("name", name), ("arguments", args)) if v is not None}
    piece = {"function": function, **({"id": call_id, "type": "function"} if call_id else {})}
    return {"tool_calls": [{**({"index": index} if index is not None else {}), **piece}]}


# -- assembly: pure ----------------------------------------------------------------------------------------
def test_two_interleaved_calls_assemble_by_index_and_the_first_delta_may_carry_the_opening_brace():
    pieces = [
        _call_delta(0, name="list_files", call_id="call_a", args="{"),  # llama.cpp issue 22722's first delta
        _call_delta(1, name="read_file", call_id="call_b", args=""),
        _call_delta(0, args='"path": "."}'),
        _call_delta(1, args='{"path": "memo'),
        _call_delta(1, args='.md"}'),
    ]
    got = assemble(_chunks(sse_chunks(pieces, finish="tool_calls", usage=(30, 12))), sse=True)
    assert got.problems == [] and got.error is None
    assert got.tool_calls == [
        {"id": "call_a", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "."}'}},
        {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "memo.md"}'}},
    ]
    assert (got.finish_reason, got.prompt_tokens, got.completion_tokens, got.content) == ("tool_calls", 30, 12, None)
    assert got.ttft_ms == 20.0  # chunk 2 (after the role chunk) is the first with a call piece
    assert got.decode_tps == pytest.approx(11 / 0.040)  # 12 tokens, the 5 pieces 40 ms apart


def test_a_name_repeated_in_every_delta_is_one_name():
    """llama.cpp before PR 13800 repeated the name in every delta (issue 13774)."""
    pieces = [_call_delta(0, name="list_files", call_id="c", args='{"path"'), _call_delta(0, name="list_files", args=': "."}')]
    got = assemble(_chunks(sse_chunks(pieces, finish="tool_calls")), sse=True)
    assert got.tool_calls[0]["function"] == {"name": "list_files", "arguments": '{"path": "."}'} and got.problems == []


def test_arguments_that_lose_their_closing_brace_are_an_assembly_error():
    """vLLM issue 15274: the streamed arguments end without ``}``; the non-streamed reply is whole."""
    pieces = [
        _call_delta(0, name="list_files", call_id="c", args=""),
        _call_delta(0, args='{"path": '),
        _call_delta(0, args='"."'),
    ]
    got = assemble(_chunks(sse_chunks(pieces, finish="tool_calls")), sse=True)
    assert got.tool_calls[0]["function"]["arguments"] == '{"path": "."'
    assert got.problems == ['the arguments of call index 0 assemble to text that is not JSON: \'{"path": "."\'']
    verdict = classify({"content": None, "tool_calls": got.tool_calls, "finish_reason": "tool_calls"},
                       stream_problems=got.problems)  # fmt: skip
    assert "stream_assembly_error" in verdict.failure_modes and "repaired_json" in verdict.failure_modes
    assert verdict.details["evidence"]["stream_assembly_error"]["rule"] == (
        "the streamed chunks do not assemble into one coherent reply"
    )


def test_arguments_cut_by_the_token_limit_are_truncation_not_assembly():
    pieces = [_call_delta(0, name="list_files", call_id="c", args='{"path": "fol')]
    got = assemble(_chunks(sse_chunks(pieces, finish="length")), sse=True)
    assert got.problems == [] and got.finish_reason == "length"


def test_deltas_for_an_index_no_delta_opened_are_an_assembly_error():
    """dirac PR 215: argument deltas arrive under an incremented index, without id or name."""
    pieces = [_call_delta(0, name="list_files", call_id="c", args='{"pa'), _call_delta(1, args='th": "."}')]
    got = assemble(_chunks(sse_chunks(pieces, finish="tool_calls")), sse=True)
    assert got.problems == [
        "chunk 3 has a delta for tool-call index 1, which no delta opened",
        "the arguments of call index 0 assemble to text that is not JSON: '{\"pa'",
    ]
    assert [c["function"]["name"] for c in got.tool_calls] == ["list_files"]


def test_content_after_the_final_chunk_is_an_assembly_error():
    """github-copilot-api-vscode issue 100: the finish reason set on every chunk."""
    chunks = [openai_chunk({"content": "Hel"}, finish="stop"), openai_chunk({"content": "lo"}, finish="stop"), "[DONE]",
              openai_chunk({"content": "!"})]  # fmt: skip
    got = assemble(_chunks(chunks), sse=True)
    assert got.content == "Hello!"
    assert got.problems == ["chunk 2 carries content after the final chunk", "chunk 4 carries content after the final chunk"]


def test_chunks_that_are_not_json_and_a_stream_without_its_end_are_labelled_never_raised():
    got = assemble([{"t": 1, "data": "{not json"}, {"t": 2, "data": "[1, 2]"}, {"t": 3}, "junk"], sse=True)  # type: ignore[list-item]
    assert got.problems == ["chunk 1 is not JSON: '{not json'", "chunk 2 is not a JSON object", "chunk 3 has no text",
                            "chunk 4 has no text", "the stream ended without its final chunk"]  # fmt: skip
    assert assemble("not a list", sse=False).problems == ["the stream ended without its final chunk"]  # type: ignore[arg-type]


def test_ollama_lines_assemble_and_a_line_after_done_is_an_assembly_error():
    lines = ollama_lines([{"thinking": "Let me "}, {"thinking": "list."},
                          {"content": "", "tool_calls": [{"function": {"name": "list_files", "arguments": {"path": "."}}}]}],
                         reason="stop", counts=(40, 9))  # fmt: skip
    got = assemble(_chunks(lines), sse=False)
    assert (got.reasoning, got.content, got.finish_reason, got.prompt_tokens, got.completion_tokens) == (
        "Let me list.",
        None,
        "stop",
        40,
        9,
    )
    assert got.tool_calls == [{"function": {"name": "list_files", "arguments": {"path": "."}}}] and got.problems == []
    late = assemble(_chunks([*lines, {"message": {"role": "assistant", "content": "more"}, "done": False}]), sse=False)
    assert late.problems == ["chunk 5 carries content after the final chunk"] and late.content == "more"


def test_a_call_streamed_as_content_pieces_is_a_model_label_not_an_assembly_error():
    """Ollama before 0.4.6 (ollama-python issue 279): the call arrives as content pieces."""
    pieces = [{"content": '{"name": "list_files", '}, {"content": '"parameters": {"path": "."}}'}]
    got = assemble(_chunks(ollama_lines(pieces)), sse=False)
    assert got.problems == [] and got.tool_calls is None
    tools = [{"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}}]
    modes = classify({"content": got.content, "finish_reason": got.finish_reason}, tools=tools).failure_modes
    assert "raw_json_in_content" in modes and "stream_assembly_error" not in modes


def test_server_timings_of_a_non_streamed_reply():
    llama = {"timings": {"prompt_n": 32, "prompt_ms": 633.884, "predicted_n": 12, "predicted_per_second": 6.616}}
    assert reply_speed(llama) == (633.884, 6.616)
    ollama = {"load_duration": 1_000_000, "prompt_eval_duration": 49_000_000, "eval_count": 7, "eval_duration": 700_000_000}
    assert reply_speed(ollama) == (50.0, 10.0)
    assert reply_speed({"choices": []}) == (None, None) and reply_speed([]) == (None, None)
    assert reply_speed({"timings": {"prompt_ms": "fast", "predicted_per_second": -1}}) == (None, None)


# -- the backends over real HTTP -----------------------------------------------------------------------------
BROKEN_BRACE = Turn(
    chunks=sse_chunks([_call_delta(0, name="list_files", call_id="c1", args=""), _call_delta(0, args='{"path": '),
                       _call_delta(0, args='"."')], finish="tool_calls"),  # fmt: skip
    body={"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "."}'}}]}}],
          "usage": {"prompt_tokens": 20, "completion_tokens": 7}},
)  # fmt: skip
DONE_TEXT = Turn(
    chunks=sse_chunks([{"content": "I listed "}, {"content": "the files."}]),
    body={"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "I listed the files."}}],
          "usage": {"prompt_tokens": 20, "completion_tokens": 7}, "timings": {"prompt_ms": 12.5, "predicted_per_second": 40.0}},
)  # fmt: skip


def test_the_openai_backend_streams_asks_for_usage_and_keeps_every_chunk():
    server, path = scripted([dataclasses.replace(DONE_TEXT, pause_s=0.05)], sse=True)
    with server, OpenAICompatBackend("m", f"{server.url}/v1", timeout_s=10) as backend:
        reply = backend.generate(USER, None, GenerateOptions(max_tokens=16, stream=True))
        plain = backend.generate(USER, None, GenerateOptions(max_tokens=16))
    sent = server.posts(path)
    assert sent[0]["stream"] is True and sent[0]["stream_options"] == {"include_usage": True}
    assert sent[1]["stream"] is False and "stream_options" not in sent[1]
    assert (reply.content, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens) == (
        "I listed the files.",
        "stop",
        20,
        7,
    )
    assert [json.loads(c["data"]) if c["data"] != "[DONE]" else c["data"] for c in reply.stream_chunks] == DONE_TEXT.chunks
    assert reply.stream_problems == [] and reply.raw["usage"] == {"prompt_tokens": 20, "completion_tokens": 7}
    times = [c["t"] for c in reply.stream_chunks]
    assert times == sorted(times) and reply.ttft_ms == times[1] >= 100  # two 50 ms pauses before the first piece
    assert reply.decode_tps == pytest.approx(6 / ((times[2] - times[1]) / 1000), rel=1e-3)
    assert (plain.content, plain.stream_chunks, plain.ttft_ms, plain.decode_tps) == ("I listed the files.", None, 12.5, 40.0)


def test_the_ollama_backend_streams_ndjson():
    lines = ollama_lines([{"content": "Hello"}, {"content": " there"}], counts=(11, 2))
    body = {"message": {"role": "assistant", "content": "Hello there"}, "done": True, "done_reason": "stop",
            "prompt_eval_count": 11, "eval_count": 2, "prompt_eval_duration": 20_000_000, "eval_duration": 100_000_000}  # fmt: skip
    server, path = scripted([Turn(lines, body)], sse=False)
    with server, OllamaBackend("m", server.url, timeout_s=10) as backend:
        reply = backend.generate(USER, None, GenerateOptions(stream=True))
        plain = backend.generate(USER, None, GenerateOptions())
    assert [p["stream"] for p in server.posts(path)] == [True, False]
    assert (reply.content, reply.finish_reason, reply.prompt_tokens, reply.completion_tokens) == ("Hello there", "stop", 11, 2)
    assert len(reply.stream_chunks) == 3 and reply.raw["done"] is True and reply.stream_problems == []
    assert (plain.ttft_ms, plain.decode_tps) == (20.0, 20.0)


def test_an_error_inside_the_stream_is_a_refusal_when_the_server_parser_refused_else_an_error():
    refusal = "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse error"
    refused = Turn([openai_chunk({"role": "assistant", "content": None}), {"error": {"code": 500, "message": refusal}}])
    other = Turn([openai_chunk({"content": "x"}), {"error": {"code": 500, "message": "slot unavailable"}}])
    server, _ = scripted([refused, other], sse=True)
    with server, OpenAICompatBackend("m", f"{server.url}/v1", timeout_s=10) as backend:
        reply = backend.generate(USER, None, GenerateOptions(stream=True))
        assert reply.rejection == {"server": "llama.cpp", "status": 200, "error": refusal}
        assert reply.tool_calls is None and len(reply.stream_chunks) == 2
        with pytest.raises(BackendResponseError, match=r"reported an error inside the stream \(slot unavailable\)"):
            backend.generate(USER, None, GenerateOptions(stream=True))


def test_ollama_refusing_a_call_inside_the_stream_is_a_refusal_with_the_quoted_text():
    """Ollama reports an error met after the first byte as an ``error`` line (the wording of ollama#12064 and
    continue#10221, cited in the guide under server_rejected_call)."""
    error = "error parsing tool call: raw='ls -R\n', err=invalid character 'l' looking for beginning of value"
    server, _ = scripted([Turn([{"model": "m", "message": {"role": "assistant", "content": ""}, "done": False},
                                {"error": error}])], sse=False)  # fmt: skip
    with server, OllamaBackend("m", server.url, timeout_s=10) as backend:
        reply = backend.generate(USER, None, GenerateOptions(stream=True))
    assert reply.rejection == {"server": "ollama", "status": 200, "error": error}
    assert reply.content == "ls -R\n" and reply.tool_calls is None and reply.stream_problems == []


# -- runs: labels, stored chunks, re-derivation ------------------------------------------------------------
def _native(scenario):
    return dataclasses.replace(scenario, max_tokens=64)


def _run(tmp_path: Path, plan: RunPlan, ledger_file: Path):
    with open_backend(plan.model, timeout_s=10) as backend, Ledger(ledger_file) as ledger:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        return summary, ledger.runs()[-1], ledger.turns(summary.run_id)


@pytest.mark.parametrize("sse", [True, False], ids=["openai", "ollama"])
def test_a_streamed_run_labels_the_broken_assembly_stores_the_chunks_and_rescore_rederives_the_same_labels(
    tmp_path, scenario, sse
):
    if sse:
        turns = [BROKEN_BRACE, DONE_TEXT]
    else:  # Ollama streams whole calls: the incoherence it can show is a line after the done line
        call = {"content": "", "tool_calls": [{"function": {"name": "list_files", "arguments": {"path": "."}}}]}
        late = [*ollama_lines([call]), {"message": {"role": "assistant", "content": " (late)"}, "done": False}]
        turns = [Turn(late, {"message": {"role": "assistant", **call}, "done": True, "done_reason": "stop"}),
                 Turn(ollama_lines([{"content": "I listed the files."}]), {"message": {"role": "assistant", "content": "ok"},
                      "done": True, "done_reason": "stop"})]  # fmt: skip
    server, _ = scripted(turns, sse=sse)
    ledger_file = tmp_path / "ledger.sqlite"
    with server:
        model = f"openai:m@{server.url}/v1" if sse else f"ollama:m@{server.url}"
        summary, run, rows = _run(tmp_path, RunPlan(_native(scenario), model, 0.0, stream=True), ledger_file)
    assert run.start.stream is True and summary.turns == 2 == len(rows)
    sent = run.start.config["request_settings"]  # what each request sent beyond messages and sampling
    assert sent.get("stream_options") == ({"include_usage": True} if sse else None)
    first, second = rows
    assert "stream_assembly_error" in first.record.failure_modes
    assert "stream_assembly_error" not in second.record.failure_modes
    assert first.record.details["evidence"]["stream_assembly_error"]["span"]
    assert first.record.stream_chunks is not None and first.record.ttft_ms is not None
    assert assemble(first.record.stream_chunks, sse=sse).tool_calls == first.record.tool_calls
    db = sqlite3.connect(ledger_file)
    [(packed,)] = db.execute("SELECT stream_chunks FROM turns WHERE turn = 1").fetchall()
    db.close()
    assert packed.startswith("zlib+b64:") and len(packed) < len(json.dumps(first.record.stream_chunks))
    with Ledger(ledger_file) as ledger:
        result = rescore(ledger, force=True)
        again = ledger.turns(summary.run_id)
        assert ledger.verify().ok
    assert (result.turns, result.changed, result.history_mismatch) == (2, 0, 0)
    assert [t.labels for t in again] == [t.record.failure_modes for t in rows]


def test_the_same_server_unstreamed_gives_the_whole_reply_and_no_assembly_label(tmp_path, scenario):
    server, _ = scripted([BROKEN_BRACE, DONE_TEXT], sse=True)
    with server:
        _, run, rows = _run(tmp_path, RunPlan(_native(scenario), f"openai:m@{server.url}/v1", 0.0), tmp_path / "l.sqlite")
    assert run.start.stream is False
    assert rows[0].record.failure_modes == [] and rows[0].record.stream_chunks is None
    assert rows[1].record.ttft_ms == 12.5 and rows[1].record.decode_tps == 40.0  # the server's timings


def test_replay_serves_its_recorded_reply_whole_under_either_setting(tmp_path, scenario):
    cassette = write_cassette(tmp_path / "c.jsonl", [call_line("list_files", {"path": "."})])
    plans = [RunPlan(scenario, f"replay:{cassette}", 0.0, stream=s) for s in (False, True)]
    with open_backend(plans[0].model) as backend:
        replies = [backend.generate(USER, None, p.options()) for p in plans if not backend.start_run()]
    assert replies[0].response_dict() == replies[1].response_dict()
    assert replies[1].stream_chunks is None and replies[1].stream_problems == []


# -- identity and resume (section 5) ---------------------------------------------------------------------------
def test_stream_enters_the_identity_only_when_on(scenario):
    plan = RunPlan(scenario, "embedded:smollm2-135m", 0.7, seed=3, tool_mode="prompt", parser="strict", repetition=1)
    before = {  # the identity payload as the harness computed it before streaming existed (commit 58fbfa5)
        "v": IDENTITY_VERSION, "scenario": scenario.content_hash, "tools": scenario.tool_schemas(),
        "system": scenario.system_message("prompt"), "model": plan.model, "digest": "sha256:ab",
        "options": {"temperature": 0.7, "seed": 4, "max_tokens": scenario.max_tokens, "num_ctx": scenario.num_ctx},
        "tool_mode": "prompt", "parser": "strict", "repetition": 1,
    }  # fmt: skip
    assert plan.identity("sha256:ab") == sha256_of(before)
    streamed = {**before, "options": {**before["options"], "stream": True}}
    assert dataclasses.replace(plan, stream=True).identity("sha256:ab") == sha256_of(streamed)


def test_a_ledger_recorded_before_streaming_resumes_without_redoing_its_finished_runs(tmp_path, monkeypatch):
    """The fixture was written by ``harness run scenarios/list_and_report.toml --model replay:tests/cassettes/
    list_and_report/ideal.jsonl --model replay:tests/cassettes/list_and_report/broken.jsonl --tool-mode native
    --tool-mode prompt`` at commit 58fbfa5, run from the repository root."""
    ledger_file = tmp_path / "old.sqlite"
    ledger_file.write_bytes(OLD_LEDGER.read_bytes())
    monkeypatch.chdir(REPO)  # the model specs are relative to the repository, as when the fixture was recorded
    scenario = load_scenario(Path("scenarios/list_and_report.toml"))
    models = [f"replay:tests/cassettes/list_and_report/{name}.jsonl" for name in ("ideal", "broken")]
    overrides = MatrixOverrides(models=models, tool_modes=["native", "prompt"], streams=[False, True])
    plans = expand_matrix([scenario], overrides)
    assert len(plans) == 32
    with Ledger(ledger_file) as ledger:
        result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        runs = ledger.runs()
        assert ledger.verify().ok
    assert result.already_done == 16 and len(result.summaries) == 16
    assert all(s.plan.stream for s in result.summaries)
    assert [r.start.stream for r in runs] == [False] * 16 + [True] * 16


# -- the matrix axis, the CLI and the report ---------------------------------------------------------------
def test_stream_is_an_axis_of_the_cli_and_of_a_scenario_matrix(tmp_path, capsys):
    cassette = CASSETTES / "list_and_report" / "ideal.jsonl"
    ledger = tmp_path / "l.sqlite"
    rc, out, _ = cli(capsys, "run", REPO / "scenarios" / "list_and_report.toml", "--model", f"replay:{cassette}", *RUN_FLAGS,
                     "--repeats", "1", "--stream", "on", "--stream", "off", "--stream", "on", "--ledger", ledger)  # fmt: skip
    assert rc == 0 and "native/lenient stream rep=0 -> pass" in out and "native/lenient rep=0 -> pass" in out
    assert "| stream " in out and "2 runs in" in out
    rc, _, err = cli(capsys, "report", "--ledger", ledger, "--out", tmp_path / "r", "--by", "stream", "--format", "csv")
    assert rc == 0, err
    summary = (tmp_path / "r" / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("stream,runs,") and summary[1].startswith("off,1,") and summary[2].startswith("on,1,")
    rc, out, _ = cli(capsys, "export", "--ledger", ledger, "--format", "csv")
    rows = out.splitlines()
    assert rc == 0 and rows[0].endswith(",outcome,stream,ttft_ms,decode_tps") and len(rows) == 7
    assert sorted(r.split(",")[-3] for r in rows[1:]) == ["off"] * 3 + ["on"] * 3  # as the reports write it; no timings


@pytest.mark.parametrize(("value", "ok"), [("[false, true]", True), ("[true]", True), ('["on"]', False), ("[]", False)])
def test_a_scenario_matrix_takes_streams_as_booleans(tmp_path, capsys, value, ok):
    text = (REPO / "scenarios" / "list_and_report.toml").read_text().replace("[matrix]", f"[matrix]\nstreams = {value}")
    path = tmp_path / "s.toml"
    path.write_text(text)
    if ok:
        assert load_scenario(path).matrix.streams == tuple(json.loads(value))
        return
    rc, _, err = cli(capsys, "run", path, "--dry-run", "--ledger", tmp_path / "l.sqlite")
    assert rc != 0 and "Traceback" not in err  # the whole axis, or its first bad entry, is named
    assert "field 'matrix.streams' must be a non-empty list, each true or false" in err or (
        "field 'matrix.streams[0]' must be true or false, got " in err
    )


def test_a_cached_streamed_turn_keeps_its_chunks_and_its_assembly_label(tmp_path, scenario):
    server, path = scripted([BROKEN_BRACE, DONE_TEXT], sse=True)
    ledger_file = tmp_path / "ledger.sqlite"
    with server:
        plan = RunPlan(_native(scenario), f"openai:m@{server.url}/v1", 0.0, stream=True)
        with open_backend(plan.model, timeout_s=10) as backend, Ledger(ledger_file) as ledger:
            first = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs"))
            again = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs", use_cache=True))
            rows = [ledger.turns(s.run_id) for s in (first, again)]
    assert len(server.posts(path)) == 2  # the second run was served from the ledger
    assert [t.record.details.get("cache_hit") for t in rows[1]] == [True, True]
    assert [t.record.failure_modes for t in rows[1]] == [t.record.failure_modes for t in rows[0]]
    assert "stream_assembly_error" in rows[1][0].record.failure_modes
    assert [t.record.stream_chunks for t in rows[1]] == [t.record.stream_chunks for t in rows[0]]


def test_a_refusal_inside_a_stream_ends_the_run_and_rescore_gives_the_same_labels(tmp_path, scenario):
    error = "error parsing tool call: raw='ls -R\\n', err=invalid character 'l' looking for beginning of value"
    server, _ = scripted([Turn([{"model": "m", "message": {"role": "assistant", "content": ""}, "done": False},
                                {"error": error}])], sse=False)  # fmt: skip
    ledger_file = tmp_path / "ledger.sqlite"
    with server:
        summary, _, rows = _run(tmp_path, RunPlan(_native(scenario), f"ollama:m@{server.url}", 0.0, stream=True), ledger_file)
    [turn] = rows
    assert summary.turns == 1 and turn.record.server_rejection["server"] == "ollama" and turn.record.content == "ls -R\\n"
    assert "server_rejected_call" in turn.record.failure_modes and turn.record.stream_chunks[-1]["data"].startswith('{"error"')
    with Ledger(ledger_file) as ledger:
        result = rescore(ledger, force=True)
        [again] = ledger.turns(summary.run_id)
    assert result.changed == 0 and again.labels == turn.record.failure_modes
