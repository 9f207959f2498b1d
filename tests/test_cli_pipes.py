"""The CLI and broken pipes: `harness ... | head` leaving early is fine; any other broken pipe is a failure."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness import cli

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def piped_stdout(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """``sys.stdout`` writing into a real pipe, inside a test (pytest resets ``sys.stdout`` between a fixture's
    set-up and the test); yields the pipe's reading end, closed afterwards if still open."""
    read, write = os.pipe()
    with os.fdopen(write, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        yield read
        monkeypatch.undo()
    try:
        os.close(read)
    except OSError:
        pass


def test_reader_gone_only_for_a_pipe_whose_reader_closed(monkeypatch):
    with piped_stdout(monkeypatch) as read:
        assert cli.stdout_reader_gone() is False  # an open pipe
        os.close(read)
        assert cli.stdout_reader_gone() is True  # the reader left


def test_reader_gone_is_false_for_a_file_or_no_descriptor(monkeypatch, tmp_path):
    with open(tmp_path / "out.txt", "w") as file:
        monkeypatch.setattr(sys, "stdout", file)
        assert cli.stdout_reader_gone() is False  # a file
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert cli.stdout_reader_gone() is False  # no file descriptor


def test_a_reader_that_left_is_exit_0_without_a_traceback():
    read, write = os.pipe()
    os.close(read)  # `| head` that already left
    with os.fdopen(write, "w") as stdout:
        proc = subprocess.run([sys.executable, "-m", "harness", "scenarios", "list", "scenarios"], cwd=ROOT,
                              stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0 and proc.stderr == ""


def test_another_broken_pipe_is_one_sentence_and_exit_1(monkeypatch, capsys):
    """A broken pipe that is not stdout's (e.g. a dead child's) is not `| head` leaving: exit 1, one sentence."""
    read, write = os.pipe()
    os.close(read)
    with pytest.raises(BrokenPipeError) as caught:
        os.write(write, b"x")  # EPIPE: the real error a dead child's pipe gives
    os.close(write)
    with piped_stdout(monkeypatch):  # stdout is a pipe still read
        assert cli.broken_pipe_exit(caught.value) == 1
    err = capsys.readouterr().err
    assert err.startswith("harness: a pipe closed unexpectedly") and err.count("\n") == 1 and "Traceback" not in err
