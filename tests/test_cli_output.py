"""Standard output that cannot be written, closed, or encoded: one sentence or nothing, never a traceback, and every run
the matrix stopped ends. Red-team reproductions (session 27), real processes and a real HTTP server on 127.0.0.1.

This machine sets PYTHONUNBUFFERED; users do not: the children here run without it, as users run them."""

from __future__ import annotations

import io
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from harness.cli import main
from harness.review import review_frame
from harness.run_options import STOPPED_BY_READER
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import CASSETTES, REPO, RUN_FLAGS, SCENARIO_FILE

ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(REPO)}
CASSETTE = CASSETTES / "list_and_report" / "ideal.jsonl"


def _unfinished(ledger) -> list[str]:
    with sqlite3.connect(ledger) as db:
        return [r[0] for r in db.execute("SELECT run_id FROM runs WHERE run_id NOT IN (SELECT run_id FROM run_ends)")]


def _started(ledger) -> int:
    try:
        with sqlite3.connect(ledger) as db:
            return db.execute("SELECT count(*) FROM runs").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_ctrl_c_while_the_output_cannot_be_written_still_ends_every_run_of_the_workers(tmp_path):
    """A first Ctrl-C waits for the runs in flight; the next run line then failed on /dev/full and the processes
    executor left 2 of its 3 runs without an end row."""
    ledger = tmp_path / "l.sqlite"
    with FakeAgentServer(delay_s=3.0, slots=8) as server, open("/dev/full", "w") as full:
        argv = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}",
                *RUN_FLAGS, "--repeats", "6", "--jobs", "3", "--executor", "processes", "--ledger", str(ledger)]  # fmt: skip
        proc = subprocess.Popen(argv, cwd=tmp_path, env=ENV, stdout=full, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while _started(ledger) < 3:
            assert time.monotonic() < deadline and proc.poll() is None, "the runs did not start"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and _unfinished(ledger) == [], err


@pytest.mark.parametrize("argv", [["ledger", "head"], ["--help"], ["run", str(SCENARIO_FILE), "--model", f"replay:{CASSETTE}",
                                  *RUN_FLAGS, "--repeats", "3"]], ids=["ledger-head", "help", "run"])  # fmt: skip
def test_a_closed_stdout_writes_nothing_and_is_no_traceback(tmp_path, argv):
    """`harness ... >&-` (sys.stdout is None) was an AttributeError once stdout was wrapped."""
    assert main(["run", str(SCENARIO_FILE), "--model", f"replay:{CASSETTE}", *RUN_FLAGS,
                 "--ledger", str(tmp_path / "results" / "ledger.sqlite")]) == 0  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "harness", *argv], cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-500:]


def test_human_output_on_an_ascii_console_is_escaped_and_an_export_stays_utf8(tmp_path):
    """The review frame's own characters (·, …) stopped `harness review` on an ASCII console; an export must not be
    escaped (JSONL would change silently): it is written as UTF-8 bytes whatever the console says."""
    ledger = tmp_path / "l.sqlite"
    cassette = tmp_path / "caf\u00e9.jsonl"
    cassette.write_bytes(CASSETTE.read_bytes())
    assert main(["run", str(SCENARIO_FILE), "--model", f"replay:{cassette}", *RUN_FLAGS, "--ledger", str(ledger)]) == 0
    with sqlite3.connect(ledger) as db:
        run_id = db.execute("SELECT run_id FROM runs").fetchone()[0]
    ascii_env = {**ENV, "PYTHONIOENCODING": "ascii"}
    review = subprocess.run([sys.executable, "-m", "harness", "review", run_id, "--ledger", str(ledger)], cwd=tmp_path,
                            env=ascii_env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert review.returncode == 0 and "Traceback" not in review.stderr and "caf\\xe9" in review.stdout, review.stderr
    export = subprocess.run([sys.executable, "-m", "harness", "export", "--ledger", str(ledger)], cwd=tmp_path,
                            env=ascii_env, capture_output=True, timeout=60)  # fmt: skip
    assert export.returncode == 0 and "café.jsonl".encode() in export.stdout, export.stderr
    assert all(line.startswith(b"{") for line in export.stdout.splitlines())


def test_main_in_two_threads_leaves_the_callers_stdout_in_place(tmp_path, monkeypatch):
    ledger = tmp_path / "l.sqlite"
    assert (
        main(["run", str(SCENARIO_FILE), "--model", f"replay:{CASSETTE}", *RUN_FLAGS, "--repeats", "5", "--ledger", str(ledger)])
        == 0
    )
    mine = io.StringIO()
    monkeypatch.setattr(sys, "stdout", mine)
    threads = [threading.Thread(target=lambda: [main(["export", "--ledger", str(ledger)]) for _ in range(5)]) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sys.stdout is mine, type(sys.stdout)


def test_runs_a_failed_output_stopped_are_free_to_run_again_in_the_same_process(tmp_path, monkeypatch):
    """The processes executor ended its runs in flight but kept their locks: the next matrix in the same process took
    them for runs of another process and skipped them."""
    ledger = tmp_path / "l.sqlite"
    with FakeAgentServer(delay_s=0.5, slots=8) as server:
        argv = ["run", str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}", *RUN_FLAGS, "--repeats", "6",
                "--jobs", "3", "--executor", "processes", "--ledger", str(ledger)]  # fmt: skip
        with open("/dev/full", "w") as full:
            monkeypatch.setattr(sys, "stdout", full)
            assert main(argv) == 1
        out = io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        assert main(argv) == 0
    assert "running in another process" not in out.getvalue(), out.getvalue()
    assert _unfinished(ledger) == []


def _harness(argv, tmp_path, **streams) -> subprocess.CompletedProcess[str]:
    """``python -m harness ARGV`` in ``tmp_path`` as users run it (no PYTHONUNBUFFERED), text output."""
    return subprocess.run([sys.executable, "-m", "harness", *argv], cwd=tmp_path, env=ENV, text=True, timeout=120, **streams)


@pytest.mark.parametrize("stderr", ["full", "closed"])
def test_stderr_that_cannot_be_written_keeps_the_commands_exit_code_and_output(tmp_path, stderr):
    """`2>/dev/full` exited 120 with "Exception ignored" (a failing command) and stopped `harness run` before its first
    run; `2>&-` put the error sentence on stdout, among the output a script reads, and `harness run` failed."""
    ledger = tmp_path / "l.sqlite"
    run = ["run", str(SCENARIO_FILE), "--model", f"replay:{CASSETTE}", *RUN_FLAGS, "--repeats", "3", "--ledger", str(ledger)]
    with open("/dev/full", "w") as full:
        where = {"stderr": full} if stderr == "full" else {"stderr": subprocess.DEVNULL, "preexec_fn": lambda: os.close(2)}
        failing = _harness(["report", "--ledger", str(tmp_path / "missing.sqlite")], tmp_path, stdout=subprocess.PIPE, **where)
        ran = _harness(run, tmp_path, stdout=subprocess.PIPE, **where)
    assert (failing.returncode, failing.stdout) == (1, "")  # the failure's own code; its sentence is lost, not moved
    assert ran.returncode == 0 and "3 runs in" in ran.stdout, ran.stdout
    with sqlite3.connect(ledger) as db:
        assert db.execute("SELECT outcome, count(*) FROM run_ends GROUP BY outcome").fetchall() == [("pass", 3)]


def test_export_out_dev_stdout_into_a_reader_that_left_is_quiet_exit_0(tmp_path):
    """`harness export --out /dev/stdout | head -1` said "cannot write --out /dev/stdout: Broken pipe" and exited 2."""
    ledger = tmp_path / "l.sqlite"
    assert main(["run", str(SCENARIO_FILE), "--model", f"replay:{CASSETTE}", *RUN_FLAGS, "--ledger", str(ledger)]) == 0
    read, write = os.pipe()
    os.close(read)  # `| head -1` that has left
    with os.fdopen(write, "w") as stdout:
        proc = _harness(
            ["export", "--out", "/dev/stdout", "--ledger", str(ledger)], tmp_path, stdout=stdout, stderr=subprocess.PIPE
        )
    assert (proc.returncode, proc.stderr) == (0, "")


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_run_into_a_reader_that_left_stops_the_matrix_says_so_and_ends_every_run(tmp_path, executor):
    """`harness run ... | head -3` stopped the matrix silently with exit 0: nothing said the matrix was cut short. The
    run in flight ends `interrupted` (the server answers one request at a time, 0.8 s each: it is mid-run)."""
    ledger = tmp_path / "l.sqlite"
    read, write = os.pipe()
    os.close(read)  # the reader left before the first run line
    with FakeAgentServer(delay_s=0.8, slots=1) as server, os.fdopen(write, "w") as stdout:
        argv = ["run", str(SCENARIO_FILE), "--model", f"openai:m@{server.base_url}", *RUN_FLAGS, "--repeats", "4",
                "--jobs", "2", "--executor", executor, "--ledger", str(ledger)]  # fmt: skip
        proc = _harness(argv, tmp_path, stdout=stdout, stderr=subprocess.PIPE)
    with sqlite3.connect(ledger) as db:
        ends = sorted(db.execute("SELECT outcome, error FROM run_ends"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert _unfinished(ledger) == [] and ends == [("interrupted", STOPPED_BY_READER), ("pass", None)], ends
    with sqlite3.connect(ledger) as db:
        [(stopped,)] = db.execute("SELECT run_id FROM run_ends WHERE outcome = 'interrupted'")
    assert review_frame(ledger, stopped)["open_questions"][0] == (
        "The matrix stopped when its output's reader left (not the model): it says nothing about the model."
    )
    said = [line for line in proc.stderr.splitlines() if "stopped reading" in line]
    assert said == [f"harness: the output's reader stopped reading, so the matrix stopped: 2 runs recorded in {ledger} "
                    "(1 interrupted); 3 runs left to do, which the same command runs."], proc.stderr  # fmt: skip
