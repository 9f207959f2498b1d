"""The agent loop, driven by replay cassettes: breaker boundaries, broken call shapes, infra errors."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.backends import open_backend
from harness.errors import TokenLimitExceeded, TurnLimitExceeded
from harness.ledger import Ledger
from harness.loop import CircuitBreaker, RetryPolicy, RunOptions, RunPlan, run_once
from harness.scenarios import load_scenario
from tests.helpers import IDEAL, REPO, REPORT, call_line, text_line, write_cassette


@pytest.fixture
def scenario():
    return load_scenario(REPO / "scenarios" / "list_and_report.toml")


def run(tmp_path, scenario, replies, *, parser="lenient", tool_mode="native", **scenario_changes):
    cassette = write_cassette(tmp_path / "cassette.jsonl", replies)
    scenario = dataclasses.replace(scenario, **scenario_changes)
    plan = RunPlan(scenario, f"replay:{cassette}", 0.0, tool_mode=tool_mode, parser=parser)
    with Ledger(tmp_path / "ledger.sqlite") as ledger, open_backend(plan.model) as backend:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        turns = ledger.turns(summary.run_id)
        [run_row] = [r for r in ledger.runs() if r.run_id == summary.run_id]
        assert ledger.verify().ok
    return summary, turns, run_row


# -- breaker boundaries ----------------------------------------------------------------------------------
def test_breaker_allows_the_limit_and_trips_one_past_it():
    breaker = CircuitBreaker(turn_limit=3, token_limit=100)
    breaker.before_call(turns_done=2, tokens_used=100)  # third call, exactly 100 tokens spent: allowed
    with pytest.raises(TurnLimitExceeded) as exc:
        breaker.before_call(turns_done=3, tokens_used=0)
    assert (exc.value.limit, exc.value.observed) == (3, 4)
    with pytest.raises(TokenLimitExceeded) as exc:
        breaker.before_call(turns_done=0, tokens_used=101)
    assert (exc.value.limit, exc.value.observed) == (100, 101)


def test_ideal_replies_pass_and_every_turn_is_recorded(tmp_path, scenario):
    summary, turns, run_row = run(tmp_path, scenario, IDEAL)
    assert summary.outcome == "pass" and summary.turns == 3 and summary.tokens == 180
    assert all(c["passed"] for c in summary.checks) and len(summary.checks) == 4
    assert (summary.sandbox / "report.txt").read_text() == REPORT
    assert [t.record.failure_modes for t in turns] == [[], [], []]
    executed = turns[0].record.executed_calls
    assert executed[0]["output"] == '["config.json", "hello.txt", "memo.md"]'
    assert turns[0].record.raw_reply["tool_calls"][0]["function"]["name"] == "list_files"
    assert (run_row.start.backend, run_row.start.tool_mode, run_row.start.parser, run_row.outcome) == (
        "replay",
        "native",
        "lenient",
        "pass",
    )
    assert run_row.start.model_digest.startswith("sha256:")


def test_pass_on_exactly_the_last_allowed_turn(tmp_path, scenario):
    summary, _, _ = run(tmp_path, scenario, IDEAL, turn_limit=3)
    assert summary.outcome == "pass" and summary.turns == 3


def test_repeated_call_until_turn_limit_checks_before_the_call(tmp_path, scenario):
    # exactly turn_limit replies: a breaker that checked after the call would hit "cassette exhausted"
    summary, turns, run_row = run(tmp_path, scenario, [call_line("list_files", {"path": "."})] * 3, turn_limit=3)
    assert summary.outcome == "turn_limit" and summary.turns == 3
    assert run_row.end.breach == {"kind": "turn_limit", "limit": 3, "observed": 4}
    assert "repeated_call" in turns[2].record.failure_modes
    assert "repeated_call" not in turns[0].record.failure_modes


def test_token_limit(tmp_path, scenario):
    replies = [call_line("list_files", {"path": "."}, tokens=(50, 10))] * 5
    summary, _, run_row = run(tmp_path, scenario, replies, token_limit=120)
    # 60 tokens per turn: after 2 turns 120 spent (= limit, allowed), after 3 turns 180 > 120 trips
    assert summary.outcome == "token_limit" and summary.turns == 3
    assert run_row.end.breach == {"kind": "token_limit", "limit": 120, "observed": 180}


# -- broken shapes, recovered by the lenient parser ------------------------------------------------------
WRITE = {"name": "write_file", "arguments": {"path": "report.txt", "content": REPORT}}
LIST = {"name": "list_files", "arguments": {"path": "."}}


@pytest.mark.parametrize(
    ("first", "label"),
    [
        (json.dumps(LIST), "raw_json_in_content"),
        ("```json\n" + json.dumps(LIST, indent=2) + "\n```", "code_fence"),
        ("Let me look at the folder first.\n" + json.dumps(LIST), "mixed_prose"),
    ],
)
def test_broken_shapes_are_labelled_and_recovered_under_lenient(tmp_path, scenario, first, label):
    replies = [text_line(first), text_line(json.dumps(WRITE)), text_line("Done: report.txt lists 3 files.")]
    summary, turns, _ = run(tmp_path, scenario, replies)
    assert label in turns[0].record.failure_modes
    assert turns[0].record.executed_calls[0]["name"] == "list_files"
    assert summary.outcome == "pass"


def test_strict_parser_ends_the_run_on_a_call_written_in_text(tmp_path, scenario):
    replies = [text_line(json.dumps(LIST)), text_line(json.dumps(WRITE))]
    summary, turns, run_row = run(tmp_path, scenario, replies, parser="strict")
    assert summary.outcome == "task_failed" and summary.turns == 1
    assert turns[0].record.failure_modes == ["raw_json_in_content"]  # same labels as lenient
    assert turns[0].record.executed_calls == []
    assert run_row.start.parser == "strict"


def test_prompt_mode_sends_no_tools_and_answers_as_tool_response(tmp_path, scenario):
    replies = [
        text_line("<tool_call>" + json.dumps(LIST) + "</tool_call>"),
        text_line("<tool_call>" + json.dumps(WRITE) + "</tool_call>"),
        text_line("Done."),
    ]
    summary, turns, run_row = run(tmp_path, scenario, replies, tool_mode="prompt")
    assert summary.outcome == "pass" and run_row.start.tool_mode == "prompt"
    assert "tool_call_tags_in_content" in turns[0].record.failure_modes


def test_unknown_tool_and_escape_get_error_answers(tmp_path, scenario):
    replies = [
        call_line("lst_files", {"path": "."}),
        call_line("write_file", {"path": "../escaped.txt", "content": "x"}),
        text_line("I could not do it."),
    ]
    summary, turns, run_row = run(tmp_path, scenario, replies)
    assert summary.outcome == "task_failed"
    first = turns[0].record.executed_calls[0]
    assert first["error"] and first["output"].startswith("ERROR: unknown tool 'lst_files'")
    second = turns[1].record.executed_calls[0]
    assert second["escape_attempt"] and second["output"].startswith("ERROR: path '../escaped.txt' is outside")
    assert run_row.end.escape_attempts == ["../escaped.txt"]
    assert not (tmp_path / "runs" / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()


# -- infrastructure failures -----------------------------------------------------------------------------
def test_cassette_exhausted_is_infra_error(tmp_path, scenario):
    summary, turns, run_row = run(tmp_path, scenario, IDEAL[:2])
    assert summary.outcome == "infra_error" and len(turns) == 2
    assert "cassette exhausted" in run_row.end.error


class _FailingServer(BaseHTTPRequestHandler):
    """OpenAI-compatible: answers the first request with a tool call, then HTTP 500."""

    count = 0

    def do_POST(self):  # noqa: N802
        type(self).count += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        if type(self).count == 1:
            body = json.dumps({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": "{\"path\": \".\"}"}}]},
                "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}).encode()  # fmt: skip
            self.send_response(200)
        else:
            body = b'{"error": "boom"}'
            self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_http_500_mid_run_is_infra_error(tmp_path, scenario):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FailingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        plan = RunPlan(scenario, f"openai:m@http://127.0.0.1:{server.server_port}/v1", 0.0)
        with Ledger(tmp_path / "ledger.sqlite") as ledger, open_backend(plan.model) as backend:
            summary = run_once(
                plan,
                backend,
                ledger,
                RunOptions(runs_dir=tmp_path / "runs", retry=RetryPolicy(max_attempts=3, base_delay_s=0.01)),
            )
            assert summary.outcome == "infra_error" and summary.turns == 1
            assert "500" in summary.error
            [row] = ledger.runs()
            assert row.outcome == "infra_error" and row.end.turns == 1
            attempts = ledger.attempts()
            assert [(a.turn, a.attempt, a.error_type, a.status_code) for a in attempts] == [
                (2, 1, "BackendResponseError", 500),
                (2, 2, "BackendResponseError", 500),
                (2, 3, "BackendResponseError", 500),
            ]
            assert 5 <= attempts[0].retry_in_ms <= 10 and 10 <= attempts[1].retry_in_ms <= 20 and attempts[2].retry_in_ms is None
    finally:
        server.shutdown()
        server.server_close()


def test_ledger_rows_cannot_be_changed_after_a_run(tmp_path, scenario):
    run(tmp_path, scenario, IDEAL)
    db = sqlite3.connect(tmp_path / "ledger.sqlite")
    with pytest.raises(sqlite3.IntegrityError):
        db.execute("UPDATE run_ends SET outcome = 'pass'")
    db.close()
