"""The agent loop, driven by replay cassettes: breaker boundaries, broken call shapes, infra errors.

Also holds the red-team regression tests for odd replies, token counts and content: whatever the
model sends is recorded, every run ends with an outcome and the ledger verifies.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.backends import open_backend
from harness.errors import TokenLimitExceeded, TurnLimitExceeded, UsageError
from harness.ledger import Ledger
from harness.loop import CircuitBreaker, RetryPolicy, RunOptions, RunPlan, run_once
from tests.helpers import (
    IDEAL,
    REPORT,
    assert_recorded,
    call_line,
    chat_body,
    run_replay,
    run_server,
    text_line,
    write_cassette,
)


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


# -- red-team: odd replies, token counts and content are recorded, never a crash ---------------------------
# red-team finding: lone surrogates
@pytest.mark.parametrize(
    "line",
    [
        text_line("\ud800 a lone surrogate"),  # valid JSON: "\ud800"
        call_line("write_file", {"path": "\ud800.txt", "content": "x"}),
        call_line("write_file", {"path": "s.txt", "content": "\udcff"}),
    ],
    ids=["content", "path", "write-content"],
)
def test_lone_surrogate_in_a_reply_is_recorded_not_a_crash(tmp_path, scenario, line):
    # A JSON "\ud800" escape decodes to a lone surrogate; the ledger's row hash does
    # (prev_hash + payload).encode("utf-8") and raises UnicodeEncodeError: the run has no end row.
    summary, facts = run_replay(tmp_path, scenario, [line, text_line("done")])
    assert_recorded(summary, facts)


# red-team finding: token counts beyond SQLite's INTEGER range
def test_token_count_beyond_sqlite_integer_range_from_a_cassette(tmp_path, scenario):
    # OverflowError: Python int too large to convert to SQLite INTEGER (not a sqlite3.Error, so
    # not even turned into a LedgerError); the run is left without an end row.
    summary, facts = run_replay(tmp_path, scenario, [text_line("done", tokens=(10**20, 1))])
    assert_recorded(summary, facts)


# red-team finding: token counts beyond SQLite's INTEGER range
def test_token_count_beyond_sqlite_integer_range_from_a_server(tmp_path, scenario):
    body = chat_body({"role": "assistant", "content": "done"}, usage={"prompt_tokens": 10**19, "completion_tokens": 1})
    summary, facts = run_server(tmp_path, scenario, [body])
    assert_recorded(summary, facts)


# red-team finding: negative token counts
def test_negative_token_counts_do_not_buy_extra_budget(tmp_path, scenario):
    # usage.prompt_tokens = -1_000_000 is accepted and summed: the run's total goes negative and
    # the token breaker (token_limit = 100) never trips although 4 x 200 tokens were spent after it.
    lines = [call_line("list_files", {"path": "."}, tokens=(-1_000_000, 0))]
    lines += [call_line("list_files", {"path": "."}, tokens=(200, 0)) for _ in range(4)] + [text_line("done")]
    try:
        summary, facts = run_replay(tmp_path, scenario, lines, token_limit=100)
    except UsageError:
        return  # refusing the cassette outright is fine too
    assert summary.tokens >= 0
    assert all((t.record.prompt_tokens or 0) >= 0 for t in facts["turn_rows"])
    assert summary.outcome == "token_limit"


# red-team finding: negative token counts
def test_negative_token_counts_from_a_server_are_not_recorded_as_spent(tmp_path, scenario):
    body = chat_body({"role": "assistant", "content": "done"}, usage={"prompt_tokens": -5, "completion_tokens": 1})
    summary, facts = run_server(tmp_path, scenario, [body])
    assert summary.tokens >= 0
    assert facts["turn_rows"][0].record.prompt_tokens in (None, 0) or facts["turn_rows"][0].record.prompt_tokens > 0


# red-team finding: non-string content or finish_reason
@pytest.mark.parametrize(
    "message, finish",
    [
        ({"role": "assistant", "content": 42}, "stop"),
        ({"role": "assistant", "content": True}, "stop"),
        ({"role": "assistant", "content": "x"}, 1),
        ({"role": "assistant", "content": "x"}, 1.5),
        ({"role": "assistant", "content": "x"}, False),
    ],
    ids=["content-int", "content-bool", "finish-int", "finish-float", "finish-bool"],
)
def test_non_string_content_or_finish_reason_keeps_the_ledger_verifiable(tmp_path, scenario, message, finish):
    # The row hash is computed over the Python value (42), SQLite's TEXT affinity stores "42",
    # and `harness ledger verify` then reports the row as edited.
    summary, facts = run_server(tmp_path, scenario, [chat_body(message, finish=finish)])
    assert_recorded(summary, facts)


# red-team finding: deeply nested structured arguments
def test_deeply_nested_structured_arguments_are_recorded(tmp_path, scenario):
    # 600 levels parse fine with json.loads, but ledger._json_columns calls dataclasses.asdict,
    # which recurses per level: RecursionError from record_turn, the run never ends.
    depth = 600
    nested = '{"a":' * depth + "1" + "}" * depth
    line = ('{"content": null, "tool_calls": [{"function": {"name": "list_files", "arguments": {"path": ".", "x": '
            + nested + '}}}], "finish_reason": "tool_calls"}')  # fmt: skip
    summary, facts = run_replay(tmp_path, scenario, [line, json.dumps(text_line("done"))], raw=True)
    assert_recorded(summary, facts)


@pytest.mark.parametrize(
    "tool_calls",
    [
        [{"function": {"name": 5, "arguments": {}}}],
        [{"function": {"name": ["a"], "arguments": {}}}],
        [{"function": None}],
        [{"function": "list_files"}],
        [{"function": {"name": "list_files", "arguments": "{{{"}}],
        [{"id": "same", "function": {"name": "list_files", "arguments": {}}}] * 2,
        [{"id": {"x": 1}, "function": {"name": "list_files", "arguments": {}}}],
        [{"function": {"name": "write_file", "arguments": {"path": f"f{i}.txt", "content": "x"}}} for i in range(300)],
    ],
    ids=["name-int", "name-list", "function-null", "function-string", "junk-arguments", "ids-collide", "id-object", "300-calls"],
)
@pytest.mark.parametrize("tool_mode", ["native", "prompt"])
def test_guard_malformed_structured_calls_are_data(tmp_path, scenario, tool_calls, tool_mode):
    line = {"content": "calling", "tool_calls": tool_calls, "finish_reason": "tool_calls", "usage": None}
    summary, facts = run_replay(tmp_path, scenario, [line, text_line("done")], tool_mode=tool_mode)
    assert_recorded(summary, facts)


def test_guard_one_megabyte_reply_and_null_everything(tmp_path, scenario):
    summary, facts = run_replay(tmp_path, scenario, [{"content": "x" * (1 << 20)}])
    assert_recorded(summary, facts)
    summary, facts = run_replay(
        tmp_path / "b", scenario, [{"content": None, "tool_calls": None, "finish_reason": None, "usage": None}]
    )
    assert_recorded(summary, facts)
    assert summary.failure_modes == ["empty_response", "skipped_required_tool"]  # an empty reply also ends the loop untooled
