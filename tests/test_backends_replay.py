"""ReplayBackend and the cassette recorder.

Also holds the red-team regression tests for malformed cassettes: a usage error, never a traceback.
"""

from __future__ import annotations

import hashlib
import io
import json

import pytest

from harness.backends import (
    BackendIdentity,
    CassetteRecorder,
    GenerateOptions,
    ReplayBackend,
    Reply,
    open_backend,
    write_cassette_line,
)
from harness.errors import CassetteExhausted, UsageError
from tests.helpers import SCENARIO_FILE, assert_one_sentence_error, cli

LINES = [
    {
        "content": None,
        "tool_calls": [{"function": {"name": "ls", "arguments": {"path": "."}}}],
        "finish_reason": "tool_calls",
        "usage": {"prompt_tokens": 30, "completion_tokens": 5},
        "note": "extra keys ok",
    },
    {"content": "done", "tool_calls": None, "finish_reason": "stop"},
]
OPTS = GenerateOptions()


@pytest.fixture
def cassette(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in LINES) + "\n\n")
    return path


def test_replays_in_order_then_exhausts(cassette):
    with ReplayBackend(cassette) as backend:
        backend.start_run()
        first = backend.generate([{"role": "user", "content": "ignored"}], None, OPTS)
        second = backend.generate([], None, OPTS)
        with pytest.raises(CassetteExhausted) as info:
            backend.generate([], None, OPTS)
    assert first.tool_calls == LINES[0]["tool_calls"]
    assert (first.content, first.finish_reason, first.prompt_tokens, first.completion_tokens) == (None, "tool_calls", 30, 5)
    assert first.raw == LINES[0]
    assert 0 <= first.latency_ms < 50
    assert (second.content, second.tool_calls, second.prompt_tokens, second.completion_tokens) == ("done", None, None, None)
    assert str(info.value) == f"cassette exhausted: {cassette} has 2 replies"
    assert info.value.retryable is False


def test_start_run_rewinds(cassette):
    backend = ReplayBackend(cassette)
    backend.start_run()
    backend.generate([], None, OPTS)
    backend.start_run()
    assert backend.generate([], None, OPTS).finish_reason == "tool_calls"


def test_identity_is_path_and_file_hash(cassette):
    digest = hashlib.sha256(cassette.read_bytes()).hexdigest()
    assert ReplayBackend(cassette).identity() == BackendIdentity(
        backend="replay", model=str(cassette), model_digest=f"sha256:{digest}"
    )


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match=r"Cannot read cassette .*nope\.jsonl"):
        ReplayBackend(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("[1, 2]", "line 3 is not a JSON object"),
        ("{not json", "line 3 is not a JSON object"),
        ('"text"', "line 3 is not a JSON object"),
        ('{"content": 5}', "line 3: 'content' must be a string or null"),
        ('{"tool_calls": {"a": 1}}', "line 3: 'tool_calls' must be a list of objects or null"),
        ('{"usage": {"prompt_tokens": "9"}}', "line 3: 'usage.prompt_tokens' must be an integer"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(LINES[1]) + "\n\n" + bad_line + "\n")
    with pytest.raises(UsageError) as info:
        ReplayBackend(path)
    assert str(info.value).startswith(f"Cassette {path} {message}")


def _reply(**fields) -> Reply:
    base = dict(
        content=None,
        tool_calls=None,
        finish_reason="stop",
        prompt_tokens=None,
        completion_tokens=None,
        latency_ms=12.5,
        raw={"server": "body"},
        identity=BackendIdentity(backend="openai", model="m"),
    )
    base.update(fields)
    return Reply(**base)


def test_write_cassette_line_shape():
    fh = io.StringIO()
    write_cassette_line(fh, _reply(content="héllo", prompt_tokens=3, completion_tokens=1))
    assert fh.getvalue().endswith("\n") and fh.getvalue().count("\n") == 1
    assert json.loads(fh.getvalue()) == {
        "content": "héllo",
        "tool_calls": None,
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }


def test_recorder_round_trip(tmp_path):
    originals = [
        _reply(
            tool_calls=[{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"p": 1}'}}],
            finish_reason="tool_calls",
            prompt_tokens=100,
            completion_tokens=12,
        ),
        _reply(tool_calls=[{"function": {"name": "ls", "arguments": {"p": 1}}}], finish_reason="stop"),
        _reply(content="final answer\nwith newline", finish_reason="length", prompt_tokens=5, completion_tokens=0),
        _reply(content="", reasoning="<think>no call</think> reasoning only"),
    ]
    path = tmp_path / "rec" / "cassette.jsonl"
    with CassetteRecorder(path) as recorder:
        for reply in originals:
            recorder.record(reply)
        assert recorder.count == 4
    backend = ReplayBackend(path)
    backend.start_run()
    replayed = [backend.generate([], None, OPTS) for _ in originals]
    assert [r.response_dict() for r in replayed] == [r.response_dict() for r in originals]
    assert replayed[3].reasoning == "<think>no call</think> reasoning only"  # reasoning is recorded and replayed
    # recording the replayed replies again gives the same file, byte for byte
    again = tmp_path / "again.jsonl"
    with CassetteRecorder(again) as recorder:
        for reply in replayed:
            recorder.record(reply)
    assert again.read_bytes() == path.read_bytes()


# -- red-team: malformed cassettes are usage errors -------------------------------------------------------
# red-team finding: a cassette line nested too deep was a traceback
def test_cassette_line_nested_too_deep_is_a_usage_error(tmp_path, capsys):
    # load_cassette catches ValueError only; json.loads raises RecursionError -> traceback.
    depth = 5000
    cassette = tmp_path / "deep.jsonl"
    cassette.write_text('{"content": ' + "[" * depth + "]" * depth + "}\n", encoding="utf-8")
    with pytest.raises(UsageError):
        open_backend(f"replay:{cassette}")
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{cassette}")
    assert_one_sentence_error(rc, err)


@pytest.mark.parametrize(
    "line",
    ["null", "[]", "1", '{"content": 5}', '{"tool_calls": "x"}', '{"usage": {"prompt_tokens": "5"}}', "{not json"],
)
def test_guard_malformed_cassette_lines_are_usage_errors(tmp_path, capsys, line):
    cassette = tmp_path / "bad.jsonl"
    cassette.write_text(line + "\n", encoding="utf-8")
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{cassette}")
    assert rc == 2 and "line 1" in err


# red-team finding: a reply holding a lone surrogate could not be written to a UTF-8 cassette
def test_a_reply_utf8_cannot_hold_is_recorded_and_replayed_exactly(tmp_path):
    path = tmp_path / "c.jsonl"
    with CassetteRecorder(path) as recorder:
        recorder.record(_reply(content="bad \udcff byte, héllo"))
    path.read_bytes().decode("utf-8")  # the file is valid UTF-8
    backend = ReplayBackend(path)
    assert backend.generate([], None, GenerateOptions(temperature=0.0)).content == "bad \udcff byte, héllo"
