"""`harness run | head` and `--out` into a reader that left, combined with errors, Ctrl-C and --no-resume (red team, stop 28).

Real parts: ``python -m harness`` children (without PYTHONUNBUFFERED, as users run it), a real HTTP server on 127.0.0.1
(tests/fake_agent_server.py), real pipes and FIFOs, real ledger files.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, RUN_FLAGS, SCENARIO_FILE, wait_for

ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(REPO)}
CASSETTE = REPO / "tests" / "cassettes" / "list_and_report" / "ideal.jsonl"


def _run_argv(url: str, ledger: Path, executor: str, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"openai:m@{url}", *RUN_FLAGS,
            "--repeats", "4", "--jobs", "2", "--executor", executor, "--ledger", str(ledger), *extra]  # fmt: skip
    return argv + (["--workers", "1"] if executor == "processes" else [])


def _unfinished(ledger: Path) -> list[str]:
    with sqlite3.connect(ledger) as db:
        return [r[0] for r in db.execute("SELECT run_id FROM runs WHERE run_id NOT IN (SELECT run_id FROM run_ends)")]


def _slow_b_and_moved_after_a(ledger: Path, moved: Path | None) -> Callable[[int], str | None]:
    """The fake server's faults: run B's first call (the 2nd) is slow; with ``moved``, the ledger is moved there during
    run A's last call (the 4th), when A's and B's start rows are in and C's is not."""

    def faults(number: int) -> str | None:
        if number == 4 and moved is not None:
            os.rename(ledger, moved)
        return "slow" if number == 2 else None

    return faults


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_an_error_after_the_reader_left_exits_1_with_its_sentence_not_120(tmp_path, executor):
    """The ledger is moved during run A's last call; A's line is read by a reader that then leaves; run C's start is
    refused (LedgerSwapped), run B (slow) ends interrupted and its line meets the gone reader. Exit was 120 with
    "Exception ignored in: <_io.TextIOWrapper name='<stdout>'> BrokenPipeError" after the error sentence."""
    ledger, moved = tmp_path / "l.sqlite", tmp_path / "moved.sqlite"

    faults = _slow_b_and_moved_after_a(ledger, moved)
    with FakeAgentServer(faults=faults, slow_s=8, slots=4) as server:
        read, write = os.pipe()
        proc = subprocess.Popen(_run_argv(server.base_url, ledger, executor), stdout=write, stderr=subprocess.PIPE,
                                text=True, env=ENV, cwd=tmp_path)  # fmt: skip
        os.close(write)
        with os.fdopen(read) as reader:
            assert reader.readline().startswith("[1/4]")  # `| head -1`: one line, then gone
        _, err = proc.communicate(timeout=120)
    assert "was moved to" in err and "Exception ignored" not in err and proc.returncode == 1, (proc.returncode, err)
    assert _unfinished(moved) == []


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_ctrl_c_on_run_piped_into_head_exits_130_and_says_so(tmp_path, executor):
    """A terminal's Ctrl-C reaches `harness run` and `head` together: the first Ctrl-C waits for the runs in flight,
    their lines meet the gone reader, then the head line raised BrokenPipeError in place of the KeyboardInterrupt:
    exit 0, and neither "interrupted" nor the reader-gone sentence was said."""
    ledger = tmp_path / "l.sqlite"
    with FakeAgentServer(faults=lambda n: "slow" if n <= 2 else None, slow_s=4, slots=4) as server:
        read, write = os.pipe()
        os.close(read)  # head died with the same Ctrl-C
        proc = subprocess.Popen(_run_argv(server.base_url, ledger, executor), stdout=write, stderr=subprocess.PIPE,
                                text=True, env=ENV, cwd=tmp_path)  # fmt: skip
        os.close(write)
        wait_for(lambda: server.requests >= 2, proc, "both runs in their slow first call")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in err.splitlines()[-1], (proc.returncode, err)
    assert _unfinished(ledger) == []


def test_export_out_a_fifo_whose_reader_died_midway_is_a_failure_not_a_quiet_success(tmp_path):
    """`--out FIFO` whose consumer crashed after 10 bytes exited 0 silently with the export truncated (before f30e3f1:
    "cannot write --out ...: Broken pipe.", exit 2). Only standard output's reader leaving (`| head`) is quiet."""
    ledger = tmp_path / "l.sqlite"
    run = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"replay:{CASSETTE}", *RUN_FLAGS,
           "--repeats", "60", "--ledger", str(ledger)]  # fmt: skip
    subprocess.run(run, env=ENV, cwd=tmp_path, check=True, capture_output=True, timeout=300)  # > 64 KiB of JSONL
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def consumer() -> None:
        with open(fifo, "rb") as f:
            f.read(10)  # then it crashes

    reader = threading.Thread(target=consumer)
    reader.start()
    proc = subprocess.run([sys.executable, "-m", "harness", "export", "--ledger", str(ledger), "--out", str(fifo)],
                          env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    reader.join()
    assert proc.returncode != 0 and "Broken pipe" in proc.stderr, (proc.returncode, proc.stderr)


def test_the_reader_gone_sentence_of_a_no_resume_run_counts_what_the_same_command_runs(tmp_path):
    """With --no-resume the same command runs every planned run again (4): the sentence said "the other 3"."""
    ledger = tmp_path / "l.sqlite"
    with FakeAgentServer(faults=lambda n: "slow" if n == 2 else None, slow_s=3, slots=4) as server:
        read, write = os.pipe()
        os.close(read)
        proc = subprocess.Popen(_run_argv(server.base_url, ledger, "threads", "--no-resume"), stdout=write,
                                stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)  # fmt: skip
        os.close(write)
        _, err = proc.communicate(timeout=120)
    [said] = [line for line in err.splitlines() if "stopped reading" in line]
    assert said.endswith("(1 interrupted); the same command runs all 4 again (--no-resume)."), said


# red team 2: with one model's server down and another model run, `| true` exited 0 and said "nothing is left to run"
def test_a_reader_gone_run_with_a_model_skipped_counts_its_runs_as_left_and_exits_1(tmp_path):
    from tests.backend_fakes import closed_port

    down = f"openai:m@http://127.0.0.1:{closed_port()}/v1"
    argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", down, "--model", f"replay:{CASSETTE}",
            "--tool-mode", "native", "--temperature", "0", "--ledger", str(tmp_path / "l.sqlite")]  # fmt: skip
    read, write = os.pipe()
    os.close(read)  # `| true`: it never reads
    proc = subprocess.Popen(argv, stdout=write, stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)
    os.close(write)
    _, err = proc.communicate(timeout=120)
    [said] = [line for line in err.splitlines() if "stopped reading" in line]
    assert proc.returncode == 1, err
    assert said.endswith("; 3 runs left to do (2 skipped: their server was down), which the same command runs."), said


QUIT_AS_THE_MATRIX_STOPS = """
import os, signal, sys
from harness.cli import main
from harness.console import Progress
from harness.run_options import STOPPED_BY_USER, StopEvent

set_for, stopping = StopEvent.set_for, Progress.stopping
def stop_for(self, reason):  # the user presses Ctrl-C as the matrix begins to wait for its run in flight...
    set_for(self, reason)
    if reason != STOPPED_BY_USER:
        os.kill(os.getpid(), signal.SIGINT)
def told(self, in_flight):  # ... and again once told it is stopping
    stopping(self, in_flight)
    os.kill(os.getpid(), signal.SIGINT)

StopEvent.set_for, Progress.stopping = stop_for, told
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("cause", ["reader", "error"])
@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_quit_while_the_matrix_stops_records_why_it_was_stopping(tmp_path, executor, cause):
    """The output's reader left at run A's line (``reader``), or run C's start was refused because the ledger was moved
    during A's last call (``error``), so the matrix waits for run B's slow call; two Ctrl-Cs then quit. B's end row
    said "interrupted by the user (second Ctrl-C)" (with processes also after the error), though the user had not
    stopped the matrix, only cut its wait short."""
    from harness.run_options import STOPPED_BY_ERROR, STOPPED_BY_READER

    ledger, moved = tmp_path / "l.sqlite", tmp_path / "moved.sqlite"

    faults = _slow_b_and_moved_after_a(ledger, moved if cause == "error" else None)
    with FakeAgentServer(faults=faults, slow_s=60, slots=4) as server:
        read, write = os.pipe()
        if cause == "reader":
            os.close(read)
        argv = _run_argv(server.base_url, ledger, executor)
        proc = subprocess.Popen([argv[0], "-c", QUIT_AS_THE_MATRIX_STOPS, *argv[3:]], stdout=write, stderr=subprocess.PIPE,
                                text=True, env=ENV, cwd=tmp_path)  # fmt: skip
        os.close(write)
        _, err = proc.communicate(timeout=50)  # well before the slow call returns: nothing waited for it
        if cause == "error":
            os.close(read)
    assert proc.returncode == 130 and "quit; 1 run in flight recorded as interrupted" in err, (proc.returncode, err)
    if cause == "error":  # moved back, the ledger holds every row too (the quit copied them into the moved file)
        assert f"the ledger {ledger} was moved to {moved} while the matrix ran" in err, err  # the error is still said
        os.rename(moved, ledger)
    with sqlite3.connect(ledger) as db:
        ends = sorted(db.execute("SELECT outcome, error FROM run_ends"))
    assert ends == [("interrupted", STOPPED_BY_READER if cause == "reader" else STOPPED_BY_ERROR), ("pass", None)]


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_quit_after_the_ledger_was_moved_leaves_the_rows_where_the_error_says(tmp_path, executor):
    """The ledger is moved during run A's last call (run C's start is refused) and the user quits while the matrix waits
    for run B's slow call. The error says "the runs recorded so far are in moved.sqlite ... or pass --ledger
    moved.sqlite", but the quit left them in the ``-wal`` file under the old name: moved.sqlite was empty, "not a
    harness ledger" (red team; the processes executor says the error on a quit since f2d5777)."""
    from harness.ledger import Ledger
    from harness.run_options import STOPPED_BY_ERROR

    ledger, moved = tmp_path / "l.sqlite", tmp_path / "moved.sqlite"

    faults = _slow_b_and_moved_after_a(ledger, moved)
    with FakeAgentServer(faults=faults, slow_s=60, slots=4) as server:
        argv = _run_argv(server.base_url, ledger, executor)
        proc = subprocess.Popen([argv[0], "-c", QUIT_AS_THE_MATRIX_STOPS, *argv[3:]], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=ENV, cwd=tmp_path)  # fmt: skip
        _, err = proc.communicate(timeout=50)  # well before the slow call returns: nothing waited for it
    assert proc.returncode == 130 and f"or pass --ledger {moved}, and run again" in err, (proc.returncode, err)
    with Ledger(moved, readonly=True) as db:  # as the error says
        ends = sorted((run.outcome, run.end.error) for run in db.runs() if run.end is not None)
    assert ends == [("interrupted", STOPPED_BY_ERROR), ("pass", None)]
