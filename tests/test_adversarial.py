"""Red-team tests: hostile scenario files, adversarial model replies, misbehaving servers,
damaged ledgers and bad command lines.

The rules these tests hold the harness to (README, "Errors you can cause"):

* bad user input gets one clear sentence and a non-zero exit, never a traceback, and loses
  nothing already recorded;
* bad model output is data: recorded, never a crash; every run ends with one of the outcomes
  and the ledger verifies;
* nothing the model sends touches anything outside its run's sandbox.

The first part holds the FINDINGS (tests that fail on the code as reviewed, one ``# FINDING n``
comment each); the second part guards attacks that were handled correctly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import sqlite3
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.backends import open_backend, parse_model_spec
from harness.classifier import classify
from harness.cli import main
from harness.errors import ScenarioError, UsageError
from harness.ledger import Ledger
from harness.loop import RetryPolicy, RunOptions, RunPlan, run_once
from harness.matrix import MatrixOverrides
from harness.runner import expand_matrix, run_matrix
from harness.scenarios import load_scenario
from harness.vocab import OUTCOMES
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import IDEAL, REPO, SCENARIO_FILE, call_line, text_line, write_cassette

FAST_RETRY = RetryPolicy(max_attempts=2, base_delay_s=0.01, max_delay_s=0.05)


# -- helpers -----------------------------------------------------------------------------------------
@pytest.fixture
def scenario():
    return load_scenario(SCENARIO_FILE)


def _ledger_counts(ledger: Ledger) -> dict[str, int]:
    return {t: n for t, n in ledger.row_counts().items() if t in ("runs", "turns", "run_ends")}


def _run_plan(tmp_path, plan, backend):
    """Run one plan; return (summary, ledger facts). Any exception escapes (that is the finding)."""
    with Ledger(tmp_path / "ledger.sqlite") as ledger:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs", retry=FAST_RETRY))
        facts = {"verify": ledger.verify(), **_ledger_counts(ledger), "turn_rows": ledger.turns(summary.run_id)}
    return summary, facts


def run_replay(tmp_path, scenario, lines, *, raw=False, tool_mode="native", parser="lenient", **changes):
    """Replay cassette lines (dicts, or raw text lines with raw=True) through one run."""
    cassette = tmp_path / "cassette.jsonl"
    if raw:
        cassette.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    else:
        write_cassette(cassette, lines)
    plan = RunPlan(dataclasses.replace(scenario, **changes), f"replay:{cassette}", 0.0, tool_mode=tool_mode, parser=parser)
    with open_backend(plan.model) as backend:
        return _run_plan(tmp_path, plan, backend)


def assert_recorded(summary, facts):
    """The rules for a run fed bad model output: an outcome, an end row, a ledger that verifies."""
    assert summary.outcome in OUTCOMES
    assert facts["run_ends"] == facts["runs"] == 1
    assert facts["verify"].ok, facts["verify"].problem


def chat_body(message, *, finish="stop", usage=None):
    return {"choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage if usage is not None else {"prompt_tokens": 5, "completion_tokens": 5}}  # fmt: skip


@contextmanager
def odd_server(bodies):
    """A 127.0.0.1 OpenAI-ish server answering POSTs with ``bodies`` in order (the last repeats).

    Each body is a dict (sent as JSON, HTTP 200) or a ``(status, content_type, bytes)`` tuple.
    """
    count = [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, status, ctype, data):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            self._send(404, "application/json", b"{}")

        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = bodies[min(count[0], len(bodies) - 1)]
            count[0] += 1
            if isinstance(body, dict):
                body = (200, "application/json", json.dumps(body).encode())
            self._send(*body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def run_server(tmp_path, scenario, bodies, **changes):
    with odd_server(bodies) as url:
        plan = RunPlan(dataclasses.replace(scenario, **changes), f"openai:m@{url}", 0.0, tool_mode="native")
        with open_backend(plan.model, timeout_s=5) as backend:
            return _run_plan(tmp_path, plan, backend)


def cli(capsys, *argv):
    """Run the CLI in-process; an exception escaping main() is a traceback for the user."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_sentence_error(rc, err):
    assert rc != 0
    assert "Traceback" not in err
    assert err.startswith("harness: ") and err.count("\n") == 1, err


def scenario_toml(tmp_path, *, head_replace=(), fixtures=None, checks=None, matrix="", name="s.toml") -> Path:
    """The reference scenario with some parts swapped out, written to tmp_path/name."""
    text = SCENARIO_FILE.read_text(encoding="utf-8")
    head, rest = text.split("[fixtures]", 1)
    for old, new in head_replace:
        head = head.replace(old, new)
    fixtures_part = "[fixtures]" + rest.split("[[checks]]", 1)[0] if fixtures is None else "[fixtures]\n" + fixtures + "\n"
    checks_part = "[[checks]]" + rest.split("[[checks]]", 1)[1].split("[matrix]", 1)[0] if checks is None else checks + "\n"
    path = tmp_path / name
    path.write_text(head + fixtures_part + checks_part + matrix, encoding="utf-8")
    return path


def finished_ledger(tmp_path, scenario) -> Path:
    """A ledger holding one finished, passing run."""
    summary, facts = run_replay(tmp_path, scenario, IDEAL)
    assert summary.outcome == "pass" and facts["verify"].ok
    return tmp_path / "ledger.sqlite"


# =====================================================================================================
# FINDINGS: these fail on the code as reviewed
# =====================================================================================================


# FINDING 1
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


# FINDING 2
def test_token_count_beyond_sqlite_integer_range_from_a_cassette(tmp_path, scenario):
    # OverflowError: Python int too large to convert to SQLite INTEGER (not a sqlite3.Error, so
    # not even turned into a LedgerError); the run is left without an end row.
    summary, facts = run_replay(tmp_path, scenario, [text_line("done", tokens=(10**20, 1))])
    assert_recorded(summary, facts)


# FINDING 2
def test_token_count_beyond_sqlite_integer_range_from_a_server(tmp_path, scenario):
    body = chat_body({"role": "assistant", "content": "done"}, usage={"prompt_tokens": 10**19, "completion_tokens": 1})
    summary, facts = run_server(tmp_path, scenario, [body])
    assert_recorded(summary, facts)


# FINDING 3
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


# FINDING 3
def test_negative_token_counts_from_a_server_are_not_recorded_as_spent(tmp_path, scenario):
    body = chat_body({"role": "assistant", "content": "done"}, usage={"prompt_tokens": -5, "completion_tokens": 1})
    summary, facts = run_server(tmp_path, scenario, [body])
    assert summary.tokens >= 0
    assert facts["turn_rows"][0].record.prompt_tokens in (None, 0) or facts["turn_rows"][0].record.prompt_tokens > 0


# FINDING 4
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


# FINDING 5
@pytest.mark.parametrize(
    "content, check",
    [
        ([{"type": "text", "text": "done"}], {"type": "final_answer_contains", "text": "done"}),
        (7, {"type": "final_answer_not_contains", "text": "x"}),
    ],
    ids=["content-parts-list", "content-int"],
)
def test_non_string_final_answer_does_not_crash_the_checks(tmp_path, scenario, content, check):
    # evaluate_checks -> (ctx.final_answer or "").lower(): AttributeError escapes run_once after
    # the turns were recorded; the run never gets its end row.
    body = chat_body({"role": "assistant", "content": content})
    summary, facts = run_server(tmp_path, scenario, [body], checks=(check,))
    assert_recorded(summary, facts)


# FINDING 6
def test_deeply_nested_structured_arguments_are_recorded(tmp_path, scenario):
    # 600 levels parse fine with json.loads, but ledger._json_columns calls dataclasses.asdict,
    # which recurses per level: RecursionError from record_turn, the run never ends.
    depth = 600
    nested = '{"a":' * depth + "1" + "}" * depth
    line = ('{"content": null, "tool_calls": [{"function": {"name": "list_files", "arguments": {"path": ".", "x": '
            + nested + '}}}], "finish_reason": "tool_calls"}')  # fmt: skip
    summary, facts = run_replay(tmp_path, scenario, [line, json.dumps(text_line("done"))], raw=True)
    assert_recorded(summary, facts)


# FINDING 7
def test_cassette_line_nested_too_deep_is_a_usage_error(tmp_path, capsys):
    # load_cassette catches ValueError only; json.loads raises RecursionError -> traceback.
    depth = 5000
    cassette = tmp_path / "deep.jsonl"
    cassette.write_text('{"content": ' + "[" * depth + "]" * depth + "}\n", encoding="utf-8")
    with pytest.raises(UsageError):
        open_backend(f"replay:{cassette}")
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{cassette}")
    assert_one_sentence_error(rc, err)


# FINDING 8
@pytest.mark.parametrize(
    "fixtures",
    ['"." = "x"', '"a" = "x"\n"a/b" = "y"', '"' + "a" * 300 + '" = "x"'],
    ids=["dot", "file-then-child", "name-too-long"],
)
def test_fixture_paths_that_cannot_be_seeded_are_refused_cleanly(tmp_path, capsys, fixtures):
    # `harness scenarios check` says OK; `harness run` then dies in Sandbox.seed with
    # IsADirectoryError / FileExistsError / OSError(ENAMETOOLONG) tracebacks.
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    path = scenario_toml(tmp_path, fixtures=fixtures)
    rc, _, err = cli(capsys, "run", path, "--model", f"replay:{tmp_path / 'done.jsonl'}", "--repeats", 1, "--temperature", 0)
    if rc != 0:
        assert_one_sentence_error(rc, err)
    check_rc, _, check_err = cli(capsys, "scenarios", "check", path)
    assert (check_rc == 0) == (rc == 0), "scenarios check and run disagree about this scenario"


# FINDING 9
def test_check_path_with_nul_byte_is_refused_or_evaluated(tmp_path, scenario):
    # validate_check accepts path = "a\u0000b"; at the end of the run _read() calls
    # Path.resolve(), which raises ValueError (not caught by evaluate_checks): run_once raises
    # after every turn was recorded and the run gets no end row.
    path = scenario_toml(tmp_path, checks='[[checks]]\ntype = "file_exists"\npath = "a\\u0000b"')
    try:
        loaded = load_scenario(path)
    except ScenarioError:
        return
    summary, facts = run_replay(tmp_path, loaded, [text_line("done")])
    assert_recorded(summary, facts)


# FINDING 10
@pytest.mark.parametrize("where", ["cli", "scenario"])
def test_seed_beyond_sqlite_integer_range_is_a_clean_error(tmp_path, capsys, where):
    # seed + repetition = 2**63 -> OverflowError traceback from the ledger insert.
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    model = f"replay:{tmp_path / 'done.jsonl'}"
    if where == "cli":
        argv = ["run", SCENARIO_FILE, "--model", model, "--seed", 2**63 - 1, "--repeats", 2]
    else:
        argv = ["run", scenario_toml(tmp_path, matrix="[matrix]\nseeds = [9223372036854775807]\nrepeats = 2\n"), "--model", model]
    rc, _, err = cli(capsys, *argv)
    assert_one_sentence_error(rc, err)


# FINDING 11
def test_nan_temperature_on_the_command_line_is_a_usage_error(tmp_path, capsys):
    # `--temperature nan` passes the `t < 0` check and ends as a LedgerError
    # "NOT NULL constraint failed: runs.temperature" that blames the ledger, exit 1.
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", "--temperature", "nan")
    assert rc == 2 and "--temperature" in err


# FINDING 11
@pytest.mark.parametrize("value", ["inf", "+inf"])
def test_infinite_temperature_in_a_scenario_is_refused(tmp_path, value):
    # accepted, then sent to servers as the non-JSON token Infinity
    path = scenario_toml(tmp_path, matrix=f"[matrix]\ntemperatures = [{value}]\n")
    with pytest.raises(ScenarioError):
        load_scenario(path)


# FINDING 11
def test_infinite_temperature_on_the_command_line_is_a_usage_error(tmp_path, capsys):
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", "--temperature", "inf")
    assert rc == 2 and "--temperature" in err


# FINDING 12
@pytest.mark.parametrize("spec", ["openai:m@http://[::1", "ollama:m@http://[zz]:1"])
def test_model_spec_with_a_malformed_url_is_a_usage_error(tmp_path, capsys, spec):
    # urllib's urlsplit raises ValueError("Invalid IPv6 URL") out of _normalize_url -> traceback
    with pytest.raises(UsageError):
        parse_model_spec(spec)
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", spec)
    assert_one_sentence_error(rc, err)


# FINDING 13
def test_record_dir_that_is_a_file_is_a_clean_error(tmp_path, capsys):
    # CassetteRecorder's mkdir raises FileExistsError in a worker thread -> traceback
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("keep me", encoding="utf-8")
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{tmp_path / 'done.jsonl'}", "--record", not_a_dir)
    assert_one_sentence_error(rc, err)
    assert not_a_dir.read_text(encoding="utf-8") == "keep me"


# FINDING 14
def test_export_out_onto_the_ledger_itself_loses_nothing(tmp_path, scenario, capsys):
    # `harness export --out` opens the output with "w" while the ledger is open: the ledger is
    # truncated to 0 bytes (every run lost) and the export then dies with
    # sqlite3.DatabaseError: database disk image is malformed.
    ledger = finished_ledger(tmp_path, scenario)
    with Ledger(ledger, readonly=True) as before:
        counts = _ledger_counts(before)
    try:
        rc = main(["export", "--ledger", str(ledger), "--out", str(ledger)])
    except Exception as exc:  # noqa: BLE001 - the traceback is part of the finding, the loss is the point
        rc = exc
    with Ledger(ledger, readonly=True) as after:
        assert _ledger_counts(after) == counts
        assert after.verify().ok
    assert isinstance(rc, int) and rc != 0


# FINDING 15
@pytest.mark.parametrize("target", ["dir", "missing-parent"])
def test_export_out_to_an_unwritable_place_is_a_clean_error(tmp_path, scenario, capsys, target):
    # IsADirectoryError / FileNotFoundError tracebacks from args.out.open("w")
    ledger = finished_ledger(tmp_path, scenario)
    out = tmp_path if target == "dir" else tmp_path / "no" / "such" / "x.jsonl"
    rc, _, err = cli(capsys, "export", "--ledger", ledger, "--out", out)
    assert_one_sentence_error(rc, err)


# FINDING 16
@pytest.mark.parametrize("tables", [("run_ends",), ("labels", "attempts"), ("turns", "run_ends")])
def test_ledger_verify_fails_when_whole_tables_were_dropped(tmp_path, scenario, capsys, tables):
    # A readonly Ledger keeps only the tables that exist ("older read-only ledgers"), so deleting
    # every outcome by dropping run_ends leaves a ledger that `harness ledger verify` calls OK.
    ledger = finished_ledger(tmp_path, scenario)
    db = sqlite3.connect(ledger)
    for table in tables:
        db.execute(f"DROP TABLE {table}")
    db.commit()
    db.close()
    rc, out, err = cli(capsys, "ledger", "verify", "--ledger", ledger)
    assert rc == 1, out


# FINDING 17
def test_export_of_an_sqlite_file_with_only_a_migrations_table_is_a_clean_error(tmp_path, capsys):
    # passes the "is it a ledger" test, then sqlite3.OperationalError: no such table: turns
    path = tmp_path / "fake.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    db.commit()
    db.close()
    rc, _, err = cli(capsys, "export", "--ledger", path)
    assert_one_sentence_error(rc, err)
    rc, _, err = cli(capsys, "ledger", "verify", "--ledger", path)
    assert rc != 0  # "OK, 0 rows verified" for a file with none of the ledger's tables is misleading


# FINDING 18
def test_absurd_repeats_fail_fast_instead_of_exhausting_memory(tmp_path):
    # expand_matrix materialises every RunPlan up front: --repeats 10**12 (or repeats = 2**63-1
    # in a scenario) runs until MemoryError, printed as a traceback. Bounded here to 400 MB / 60 s.
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (400 << 20, 400 << 20))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"replay:{tmp_path / 'done.jsonl'}",
            "--repeats", str(10**12), "--dry-run"]  # fmt: skip
    try:
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, preexec_fn=limit_memory)
    except subprocess.TimeoutExpired:
        pytest.fail("harness run --repeats 10**12 --dry-run did not finish within 60 s")
    assert proc.returncode != 0
    assert proc.stderr.startswith("harness: "), proc.stderr[-400:]
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr[-400:]


# FINDING 19
@pytest.mark.parametrize(
    "doc",
    [{}, {"content": '{"name": "list_files", "arguments": {}}', "tool_calls": None}, {"response": "text"}],
    ids=["empty-object", "bare-cassette-line", "response-not-object"],
)
def test_classify_a_document_without_a_response_object_is_a_usage_error(tmp_path, capsys, doc):
    # exits 0 and reports "empty_response" for a reply it never saw: a bare cassette line holding
    # a raw JSON call is labelled empty_response instead of raw_json_in_content.
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    rc, _, err = cli(capsys, "classify", path)
    assert rc == 2 and "response" in err


# FINDING 20
def test_scenarios_check_refuses_an_invalid_model_spec_in_the_matrix(tmp_path, capsys):
    # `scenarios check` prints OK; `harness run` on the same file then fails on matrix.models
    path = scenario_toml(tmp_path, matrix='[matrix]\nmodels = ["foo:bar"]\n')
    rc, _, err = cli(capsys, "scenarios", "check", path)
    assert rc == 1 and "matrix.models" in err


# FINDING 21
@pytest.mark.parametrize("arguments", [[1, 2], None, 7])
def test_non_object_arguments_to_an_offered_tool_are_labelled(scenario, arguments):
    # the tool answers "ERROR: arguments must be a JSON object" but the turn carries no label
    reply = {"content": None, "tool_calls": [{"function": {"name": "list_files", "arguments": arguments}}],
             "finish_reason": "tool_calls"}  # fmt: skip
    verdict = classify(reply, tools=scenario.tool_schemas(), history=[])
    assert verdict.failure_modes, "a call whose arguments are not an object must carry a failure mode"


# =====================================================================================================
# Handled correctly: regression guards
# =====================================================================================================


def test_guard_path_escapes_are_refused_and_nothing_is_written_outside(tmp_path, scenario):
    outside = tmp_path / "outside.txt"
    lines = [
        call_line("write_file", {"path": "../../outside.txt", "content": "x"}),
        call_line("write_file", {"path": str(outside), "content": "x"}),
        call_line("read_file", {"path": "~/.bashrc"}),
        call_line("list_files", {"path": "/"}),
        call_line("read_file", {"path": "/dev/zero"}),
        call_line("write_file", {"path": "a\x00b", "content": "x"}),
        call_line("write_file", {"path": "big.txt", "content": "x" * (1024 * 1024 + 1)}),
        text_line("done"),
    ]
    summary, facts = run_replay(tmp_path, scenario, lines)
    assert_recorded(summary, facts)
    assert not outside.exists()
    assert "sandbox_escape_attempt" in summary.failure_modes
    assert not (summary.sandbox / "big.txt").exists()
    outputs = [c["output"] for t in facts["turn_rows"][:-1] for c in t.record.executed_calls]
    assert all(o.startswith("ERROR: ") for o in outputs)


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
    assert summary.failure_modes == ["empty_response"]


@pytest.mark.parametrize(
    "line",
    ["null", "[]", "1", '{"content": 5}', '{"tool_calls": "x"}', '{"usage": {"prompt_tokens": "5"}}', "{not json"],
)
def test_guard_malformed_cassette_lines_are_usage_errors(tmp_path, capsys, line):
    cassette = tmp_path / "bad.jsonl"
    cassette.write_text(line + "\n", encoding="utf-8")
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{cassette}")
    assert rc == 2 and "line 1" in err


@pytest.mark.parametrize(
    "body",
    [
        {"choices": []},
        {"choices": [{"message": None}]},
        {"error": {"message": "model overloaded"}},
        (200, "application/json", b"[1, 2]"),
        (200, "application/json", b"\xff\xfe{"),
        (200, "text/html", b"<html>not json</html>"),
    ],
    ids=["choices-empty", "message-null", "200-with-error", "json-array", "bad-utf8", "html"],
)
def test_guard_odd_server_bodies_are_infra_errors(tmp_path, scenario, body):
    summary, facts = run_server(tmp_path, scenario, [body])
    assert_recorded(summary, facts)
    assert summary.outcome == "infra_error" and summary.error


def test_guard_tool_calls_of_the_wrong_shape_from_a_server_are_data(tmp_path, scenario):
    done = chat_body({"role": "assistant", "content": "done"})
    for i, calls in enumerate(["list_files()", {"function": {"name": "list_files"}}, ["x", 1, None]]):
        summary, facts = run_server(
            tmp_path / str(i), scenario, [chat_body({"role": "assistant", "content": None, "tool_calls": calls}), done]
        )
        assert_recorded(summary, facts)


def test_guard_server_faults_mid_matrix_end_as_outcomes(tmp_path, scenario):
    faults = {2: "drop", 3: "500", 5: "garbage", 7: "429"}
    with FakeAgentServer(faults=faults.get, slots=4) as server:
        plans = expand_matrix([scenario], MatrixOverrides(models=[f"openai:m@{server.base_url}"], repeats=4,
                                                          temperatures=[0.0], tool_modes=["native"]))  # fmt: skip
        with Ledger(tmp_path / "ledger.sqlite") as ledger:
            result = run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs", jobs=4, retry=RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)))  # fmt: skip
            assert len(result.summaries) == 4 and all(s.outcome in OUTCOMES for s in result.summaries)
            assert _ledger_counts(ledger)["run_ends"] == 4
            assert ledger.verify().ok


def test_guard_damaged_ledgers_are_one_sentence(tmp_path, scenario, capsys):
    ledger = finished_ledger(tmp_path, scenario)
    truncated = tmp_path / "truncated.sqlite"
    data = ledger.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    for path in (truncated, other, tmp_path, tmp_path / "missing.sqlite"):
        for argv in (["ledger", "verify"], ["export"]):
            rc, _, err = cli(capsys, *argv, "--ledger", path)
            assert_one_sentence_error(rc, err)
    assert ledger.read_bytes()[:16] == b"SQLite format 3\x00"


def test_guard_tampered_row_fails_verify(tmp_path, scenario, capsys):
    ledger = finished_ledger(tmp_path, scenario)
    db = sqlite3.connect(ledger)
    db.execute("DROP TRIGGER turns_no_update")
    db.execute("UPDATE turns SET content = 'hacked' WHERE seq = 1")
    db.execute("CREATE TRIGGER turns_no_update BEFORE UPDATE ON turns BEGIN SELECT RAISE(ABORT, 'x'); END")
    db.commit()
    db.close()
    rc, _, err = cli(capsys, "ledger", "verify", "--ledger", ledger)
    assert rc == 1 and "turns row seq=1" in err


def test_guard_export_of_an_empty_ledger_and_rescore_of_an_unfinished_run(tmp_path, scenario, capsys):
    ledger = tmp_path / "fresh.sqlite"
    assert cli(capsys, "ledger", "migrate", "--ledger", ledger)[0] == 0
    rc, out, _ = cli(capsys, "export", "--ledger", ledger, "--format", "csv")
    assert rc == 0 and out.startswith("run_id,")
    # an unfinished run: one turn, no end row (as after kill -9)
    finished = finished_ledger(tmp_path / "f", scenario)
    db = sqlite3.connect(finished)
    db.execute("DROP TRIGGER run_ends_no_delete")
    db.execute("DELETE FROM run_ends")  # the tail of a chain: still a valid (shorter) chain
    db.execute("CREATE TRIGGER run_ends_no_delete BEFORE DELETE ON run_ends BEGIN SELECT RAISE(ABORT, 'x'); END")
    db.commit()
    db.close()
    rc, out, _ = cli(capsys, "rescore", "--ledger", finished, "--force")
    assert rc == 0 and "3 turns re-classified" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["run", SCENARIO_FILE, "--model", "foo:bar"],
        ["run", SCENARIO_FILE, "--model", "ollama:"],
        ["run", SCENARIO_FILE, "--model", "openai:m"],
        ["run", SCENARIO_FILE, "--model", "embedded:/nonexistent.gguf"],
        ["run", SCENARIO_FILE, "--model", "replay:/nonexistent"],
        ["run", SCENARIO_FILE, "--repeats", "0"],
        ["run", SCENARIO_FILE, "--jobs", "0"],
        ["run", SCENARIO_FILE, "--max-attempts", "0"],
        ["run", SCENARIO_FILE, "--temperature", "-1"],
        ["run", "/nonexistent.toml"],
        ["classify"],
        ["classify", "/nonexistent"],
        ["scenarios", "check", "/nonexistent"],
        ["models", "pull", "nosuch"],
    ],
)
def test_guard_bad_command_lines_are_one_sentence(capsys, argv):
    rc, _, err = cli(capsys, *argv)
    assert_one_sentence_error(rc, err)


@pytest.mark.parametrize("content", [b"\xff\xfe\x00binary", b"[1, 2]", b'"s"', b"[" * 100_000])
def test_guard_classify_junk_input(tmp_path, capsys, content):
    path = tmp_path / "junk"
    path.write_bytes(content)
    rc, _, err = cli(capsys, "classify", path)
    assert rc == 2 and "Traceback" not in err


@pytest.mark.parametrize(
    "head_replace, fixtures, matrix",
    [
        ((('name = "list_and_report"', 'name = "a/b"'),), None, ""),
        ((("turn_limit = 8", "turn_limit = 0"),), None, ""),
        ((("token_limit = 32000", "token_limit = -5"),), None, ""),
        ((), '"../x" = "x"', ""),
        ((), '"/etc/x" = "x"', ""),
        ((), '"a" = 1', ""),
        ((), None, "[matrix]\ntemperatures = [nan]\n"),
        ((), None, "[matrix]\nrepeats = 0\n"),
        ((), None, "[matrix]\nbogus = 1\n"),
    ],
    ids=[
        "name-slash",
        "turn-limit-0",
        "negative-tokens",
        "fixture-dotdot",
        "fixture-absolute",
        "fixture-int",
        "temperature-nan",
        "repeats-0",
        "unknown-matrix-key",
    ],  # fmt: skip
)
def test_guard_hostile_scenario_fields_are_scenario_errors(tmp_path, head_replace, fixtures, matrix):
    path = scenario_toml(tmp_path, head_replace=head_replace, fixtures=fixtures, matrix=matrix)
    with pytest.raises(ScenarioError, match=str(path).replace("\\", "\\\\")):
        load_scenario(path)


def test_guard_unreadable_scenario_files_are_scenario_errors(tmp_path):
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(SCENARIO_FILE.read_bytes().replace(b"List the files", b"List th\xe9 files"))
    for path in (tmp_path, latin1, tmp_path / "missing.toml"):
        with pytest.raises(ScenarioError):
            load_scenario(path)


@pytest.mark.parametrize(
    "content",
    [
        "{" * 200_000,
        '{"a":' * 40_000,
        "list_files(" * 20_000,
        "<tool_call>" * 20_000,
        "```json\n{}\n```\n" * 10_000,
        '{"name": "list_files", "arguments": {"path": "' + "\\" * 200_000 + '"}}',
    ],
    ids=["braces", "open-objects", "open-calls", "tags", "fences", "backslashes"],
)
def test_guard_classifier_is_fast_on_pathological_text(scenario, content):
    import time

    start = time.perf_counter()
    classify({"content": content, "tool_calls": None, "finish_reason": "stop"}, tools=scenario.tool_schemas(), history=[])
    assert time.perf_counter() - start < 5
