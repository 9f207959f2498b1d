"""Replay cassettes that are not regular files, or whose lines never end, are refused at once.

Red-team finding (issue 11): ``--model replay:/dev/zero`` (or a FIFO, or any endless file) hung
reading the whole "file" into memory. A cassette must be a regular file and each line is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.backends import open_backend, replay
from harness.errors import UsageError
from tests.helpers import REPO, SCENARIO_FILE, assert_one_sentence_error, cli, text_line, write_cassette


def test_replay_of_dev_zero_is_refused_without_reading_it(tmp_path):
    # before the fix this read /dev/zero forever (the subprocess timeout is a safety net, not a measurement)
    done = subprocess.run([sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", "replay:/dev/zero",
                           "--repeats", "1", "--temperature", "0", "--ledger", str(tmp_path / "l.sqlite")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "is not a regular file" in done.stderr and done.stderr.count("\n") == 1


def test_replay_of_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path, capsys):
    fifo = tmp_path / "c.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(UsageError, match="is not a regular file"):
        open_backend(f"replay:{fifo}")
    rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"replay:{fifo}", "--repeats", 1, "--temperature", 0)
    assert_one_sentence_error(rc, err)


def test_replay_of_a_folder_is_refused(tmp_path):
    with pytest.raises(UsageError, match="is not a regular file"):
        open_backend(f"replay:{tmp_path}")


def test_a_line_longer_than_the_bound_is_refused_by_number(tmp_path, monkeypatch):
    monkeypatch.setattr(replay, "MAX_LINE_BYTES", 1000)
    path = write_cassette(tmp_path / "c.jsonl", [text_line("short"), text_line("x" * 2000)])
    with pytest.raises(UsageError, match=r"line 2 is longer than 1000 bytes"):
        open_backend(f"replay:{path}")


def test_a_cassette_within_the_bounds_replays_and_its_digest_is_of_its_bytes(tmp_path):
    import hashlib

    path = write_cassette(tmp_path / "c.jsonl", [text_line("one"), text_line("two \u2028 three")])
    with open_backend(f"replay:{path}") as backend:
        assert len(backend.replies) == 2 and backend.replies[1]["content"] == "two \u2028 three"
        assert backend.identity().model_digest == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_cassette_with_a_byte_order_mark_replays_like_one_without(tmp_path):
    # red-team finding: "line 1 is not a JSON object" for a cassette saved by an editor with a BOM
    line = json.dumps({"content": "done", "tool_calls": None, "finish_reason": "stop"}) + "\n"
    plain, marked = tmp_path / "plain.jsonl", tmp_path / "marked.jsonl"
    plain.write_text(line, encoding="utf-8")
    marked.write_bytes("\ufeff".encode() + line.encode())
    assert replay.load_cassette(marked) == replay.load_cassette(plain)
