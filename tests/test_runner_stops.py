"""How a threads matrix stops and what its runs' end rows then say: stopped by an error (here its output cannot be
written) or by Ctrl-C, and a Ctrl-C while it waits for its runs in flight after an error.

Real parts: ``harness run`` in a child process, a scripted model server on 127.0.0.1 whose second model call is slow,
real ledger files.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO

from harness.ledger import Ledger, RunRow
from harness.review import review_frame
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, RUN_FLAGS, SCENARIO_FILE, wait_for

STOPPED_BY_ERROR = "the matrix stopped before this run ended (an error, not the model)"
"""The end row's error of a run an error stopped (the processes executor's words, now the threads executor's too)."""


def _second_call_slow(number: int) -> str | None:
    return "slow" if number == 2 else None  # one run waits on it; the other run's three calls are answered at once


def _harness(server: FakeAgentServer, ledger_path: Path, stdout: int | IO[str], *extra: str, script: str | None = None):
    """``harness run`` (or ``script``, given the same arguments) of two runs at once on ``server``, in a child process
    (``extra``: more flags)."""
    argv = ["run", str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}", *RUN_FLAGS, "--repeats", "2",
            "--jobs", "2", "--ledger", str(ledger_path), *extra]  # fmt: skip
    command = ["-c", script] if script is not None else ["-m", "harness"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, *command, *argv], stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    """The child's stderr once it exits within ``timeout`` s (a hang guard); a child still running is killed."""
    try:
        return proc.communicate(timeout=timeout)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def _runs(ledger_path: Path) -> list[RunRow]:
    with Ledger(ledger_path, readonly=True) as ledger:
        assert ledger.verify().ok
        return ledger.runs()


# red-team finding: a run stopped by an error of the matrix was recorded as "interrupted by the user"
def test_runs_stopped_by_an_error_say_so_and_runs_stopped_by_ctrl_c_say_the_user_did(tmp_path):
    errored, interrupted = tmp_path / "error.sqlite", tmp_path / "ctrl-c.sqlite"
    # stdout on a full disk: the first run's line cannot be written while the other run waits on its slow call
    with FakeAgentServer(faults=_second_call_slow, slow_s=2, slots=2) as server, open("/dev/full", "w") as full:
        err = _finish(_harness(server, errored, full), timeout=120)
    assert "the output could not be written" in err and "Traceback" not in err, err
    runs = _runs(errored)
    assert sorted((run.outcome, run.end.error) for run in runs if run.end) == [("interrupted", STOPPED_BY_ERROR), ("pass", None)]
    [stopped] = [run for run in runs if run.outcome == "interrupted"]
    frame = review_frame(errored, stopped.run_id)
    questions = frame["open_questions"]
    assert questions[0] == "An error stopped the matrix before the run ended (not the model): it says nothing about the model."
    # newcomer (stop 28): its failed checks were asked about as if the model had missed the task (which checks fail
    # depends on how far the run got when it was stopped: under load it may have written its report already)
    not_judged = any(q.endswith("failed on what the run left unfinished: they are not judged and say nothing about the model.")
                     for q in questions)  # fmt: skip
    assert not_judged == any(not c["passed"] for c in frame["acceptance"]), questions
    assert not any("did the model miss the task" in q for q in questions), questions
    with FakeAgentServer(faults=_second_call_slow, slow_s=2, slots=2) as server:
        proc = _harness(server, interrupted, subprocess.PIPE)
        wait_for(lambda: server.requests >= 2, proc, "the slow call")
        proc.send_signal(signal.SIGINT)
        err = _finish(proc, timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    said = re.findall(r"stopping; (\d) runs? in flight (ends|end) as interrupted when (its|their) model call returns\. "
                      r"Press Ctrl-C again to quit at once \((it is|they are) recorded", err)  # fmt: skip
    assert said in ([("1", "ends", "its", "it is")], [("2", "end", "their", "they are")]), err  # not "1 run(s)"
    runs = _runs(interrupted)
    assert {run.end.error for run in runs if run.outcome == "interrupted"} == {"interrupted by the user"}, err
    stopped = next(run for run in runs if run.outcome == "interrupted")  # the slow call's run at least
    assert review_frame(interrupted, stopped.run_id)["open_questions"][0] == (
        "The run was interrupted by the user: it says nothing about the model."
    )


CTRL_C_AS_THE_MATRIX_STOPS = """
import dataclasses, os, signal, sys, threading
import harness.runner
from harness.cli import main

class CtrlCAsTheMatrixStops(threading.Event):  # the user presses Ctrl-C as the matrix begins to wait for its runs
    def set(self):
        super().set()
        os.kill(os.getpid(), signal.SIGINT)

real = harness.runner.run_matrix
def run_matrix(plans, ledger, options, **kwargs):
    return real(plans, ledger, dataclasses.replace(options, stop=CtrlCAsTheMatrixStops()), **kwargs)

harness.runner.run_matrix = run_matrix
sys.exit(main(sys.argv[1:]))
"""


# red-team finding: after an error, the threads matrix waited silently for the model calls in flight, and a Ctrl-C
# meanwhile left those runs without an end row (the process then still waited for the calls at its exit)
def test_a_ctrl_c_while_an_error_waits_for_the_runs_in_flight_ends_them_and_quits_at_once(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer(faults=_second_call_slow, slow_s=60, slots=2) as server, open("/dev/full", "w") as full:
        proc = _harness(server, ledger_path, full, script=CTRL_C_AS_THE_MATRIX_STOPS)
        err = _finish(proc, timeout=40)  # well before the slow call returns: nothing waited for it
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "the output could not be written" in err and "quit; 1 run in flight recorded as interrupted" in err, err
    runs = _runs(ledger_path)
    assert sorted((run.outcome, run.end.error) for run in runs if run.end) == [("interrupted", STOPPED_BY_ERROR), ("pass", None)]
    assert len(runs) == 2  # every run that started has its end row


CTRL_C_AS_RUNS_ARE_HANDED_OVER = """
import os, signal, sys
from harness.cli import main
from harness.executors.processes import ProcessMatrixRun

real = ProcessMatrixRun._dispatch
def _dispatch(self):  # the user presses Ctrl-C as the runs are handed to the worker, before it has begun any
    real(self)
    if self.flights and not getattr(self, "pressed", False):
        self.pressed = True
        os.kill(os.getpid(), signal.SIGINT)  # held until the dispatch is done (harness.executors.processes._held)

ProcessMatrixRun._dispatch = _dispatch
sys.exit(main(sys.argv[1:]))
"""


# "stopping; 2 run(s) in flight end as interrupted when their model call returns" counted the runs handed to a worker
# still starting up: none had begun, so none was in a model call and nothing was waited for (they stop before their first
# call: skipped, or begun and ended as interrupted at once)
def test_the_first_ctrl_c_counts_only_the_runs_that_began_in_a_worker(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    with FakeAgentServer(slots=2) as server:
        proc = _harness(server, ledger_path, subprocess.PIPE, "--executor", "processes", "--workers", "1",
                        script=CTRL_C_AS_RUNS_ARE_HANDED_OVER)  # fmt: skip
        err = _finish(proc, timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "in flight" not in err, err  # no "Press Ctrl-C again to quit at once" either: there is nothing to wait for
    assert server.requests == 0  # no run made a model call
    assert {(run.outcome, run.end.turns) for run in _runs(ledger_path)} <= {("interrupted", 0)}
