"""Streaming against the real embedded llama.cpp server (xllamacpp 2026.10.11549): it streams server-sent events with
``tool_calls`` deltas by index, and a streamed reply assembles to what the same request gives unstreamed.

The server gets the Hermes/Qwen tool template and the few-shot history of tests/test_rejections_embedded.py, so at
temperature 0 SmolLM2 calls ``list_files`` with ``{"path": "folder9"}`` (32 tokens), or is cut at 22 tokens inside
the arguments. Observed: the first call delta carries ``index``, ``id``, ``type`` and the name, later deltas
pieces of the arguments; ``[DONE]`` ends the stream; the cut call is degraded exactly as unstreamed.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from harness.backends import EmbeddedBackend, GenerateOptions
from harness.classifier import classify
from harness.ledger import Ledger
from harness.loop import RunOptions, RunPlan, run_once
from harness.rescore import rescore
from tests.test_rejections_embedded import MESSAGES, TEMPLATE, TOOLS

pytestmark = pytest.mark.slow


def _labels(reply) -> list[str]:
    return classify(reply.response_dict(), tools=TOOLS, history=MESSAGES, requires_tool=True,
                    stream_problems=reply.stream_problems).failure_modes  # fmt: skip


def test_a_streamed_call_assembles_to_the_unstreamed_one_and_connections_survive_many_streams():
    with EmbeddedBackend("smollm2-135m", num_ctx=1024, timeout_s=120, chat_template=TEMPLATE) as backend:
        for max_tokens, labels in ((40, []), (22, ["repaired_json", "truncated_by_length"])):
            options = GenerateOptions(temperature=0.0, seed=0, max_tokens=max_tokens)
            plain = backend.generate(MESSAGES, TOOLS, options)
            streamed = backend.generate(MESSAGES, TOOLS, dataclasses.replace(options, stream=True))
            assert [c["function"] for c in streamed.tool_calls] == [c["function"] for c in plain.tool_calls]
            assert streamed.finish_reason == plain.finish_reason and streamed.completion_tokens == plain.completion_tokens
            assert _labels(streamed) == _labels(plain) == labels and streamed.stream_problems == []
            assert plain.stream_chunks is None and plain.ttft_ms > 0 and plain.decode_tps > 0  # llama.cpp's timings
            assert streamed.stream_chunks[-1]["data"] == "[DONE]" and streamed.ttft_ms > 0 and streamed.decode_tps > 0
            deltas = [json.loads(c["data"])["choices"][0]["delta"] for c in streamed.stream_chunks[:-1]
                      if json.loads(c["data"])["choices"]]  # fmt: skip
            pieces = [p for d in deltas for p in d.get("tool_calls", [])]
            assert pieces[0]["index"] == 0 and pieces[0]["function"]["name"] == "list_files" and pieces[0]["id"]
            assert len(pieces) > 3 and all(p["index"] == 0 for p in pieces)
        # cpp-httplib closes a kept-alive connection after a few streams without saying so: each stream has its own
        for _ in range(6):
            assert backend.generate(MESSAGES, TOOLS, GenerateOptions(max_tokens=4, stream=True)).stream_problems == []


def test_a_streamed_embedded_run_stores_its_chunks_and_rescore_gives_the_same_labels(tmp_path, scenario):
    short = dataclasses.replace(scenario, max_tokens=24, turn_limit=2)
    plan = RunPlan(short, "embedded:smollm2-135m", 0.0, tool_mode="prompt", stream=True)
    ledger_file = tmp_path / "ledger.sqlite"
    with EmbeddedBackend("smollm2-135m", num_ctx=2048, timeout_s=120) as backend, Ledger(ledger_file) as ledger:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        [run] = ledger.runs()
        turns = ledger.turns(summary.run_id)
    assert run.start.stream is True and summary.outcome != "infra_error" and len(turns) >= 1
    for turn in turns:
        record = turn.record
        assert record.stream_chunks and record.stream_chunks[-1]["data"] == "[DONE]"
        assert record.ttft_ms > 0 and record.completion_tokens > 0
    with Ledger(ledger_file) as ledger:
        result = rescore(ledger, force=True)
        again = ledger.turns(summary.run_id)
        assert ledger.verify().ok
    assert result.changed == 0 and result.turns == len(turns)
    assert [t.labels for t in again] == [t.record.failure_modes for t in turns]
