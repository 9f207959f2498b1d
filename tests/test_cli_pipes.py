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


# stop 31's note: `harness run ... | true` with its server down exited 0 and never said why the runs were skipped
def test_a_run_whose_reader_left_still_says_why_its_runs_were_skipped_and_exits_1(tmp_path):
    from tests.backend_fakes import closed_port

    read, write = os.pipe()
    os.close(read)  # `| true`: it never reads
    url = f"http://127.0.0.1:{closed_port()}/v1"
    argv = [sys.executable, "-m", "harness", "run", "--model", f"openai:x@{url}", "--ledger", str(tmp_path / "l.sqlite")]
    with os.fdopen(write, "w") as stdout:
        proc = subprocess.run(argv, cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[1].startswith(f"harness: skipped 4 runs of openai:x@{url}: The server at {url} is not reachable"), lines
    assert lines[-1] == "harness: skipped 4 runs of 1 model, for the reason said above.", lines
    assert not (tmp_path / "l.sqlite").exists()


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


def test_run_lines_reach_a_redirected_stdout_as_each_run_ends_while_the_bar_is_on_a_terminal(tmp_path):
    """Review: with the progress bar on a terminal (stderr) and stdout redirected (`| tee log`), the run lines went
    through tqdm without a flush and all arrived at the end."""
    import pty
    import threading
    import time

    from tests.fake_agent_server import FakeAgentServer
    from tests.helpers import REPO, SCENARIO_FILE

    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(REPO)}
    terminal, bar_side = pty.openpty()
    with FakeAgentServer(delay_s=1.0, slots=1) as server:
        argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}",
                "--tool-mode", "native", "--temperature", "0", "--repeats", "2", "--ledger", str(tmp_path / "l.sqlite")]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=bar_side, text=True, env=env)
        os.close(bar_side)
        threading.Thread(target=_drain, args=(terminal,), daemon=True).start()  # the bar never fills the terminal
        try:
            first = proc.stdout.readline()  # type: ignore[union-attr]
            still_running = proc.poll() is None
            seen_at = time.monotonic()
            proc.communicate(timeout=120)
            ended_at = time.monotonic()
        finally:
            if proc.poll() is None:
                proc.kill()
            os.close(terminal)
    assert first.startswith("[1/2] list_and_report openai:ideal@") and still_running, first
    assert ended_at - seen_at > 1.0  # the second run (three 1 s replies) was still to come when the first line arrived


def _drain(fd: int) -> None:
    """Read a terminal's output until it closes."""
    try:
        while os.read(fd, 4096):
            pass
    except OSError:
        pass
