"""The ``processes`` executor's channel under stress: the driver killed, its workers' fate; turns sent as notices.

Real spawned worker processes, real HTTP servers on 127.0.0.1, real SQLite ledgers; each case takes a few seconds.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from harness.ledger import Ledger
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, SCENARIO_FILE, child_pids, left_after, processes_matrix, wait_for, worker_pids


def _harness(*args: str, stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.DEVNULL, stderr=stderr, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


def test_the_workers_exit_at_once_when_the_driver_is_killed(tmp_path):
    """Found by red25: after a SIGKILL of the driver, each worker lived on until its runs' model calls came back (as long
    as the request timeout), holding the server's slots and then running the replies' tool calls in the sandboxes,
    though nothing it did could be recorded any more."""
    with FakeAgentServer(delay_s=30, slots=4) as server:
        proc = _harness("run", str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}", "--tool-mode", "native",
                        "--repeats", "4", "--temperature", "0", "--jobs", "4", "--ledger", str(tmp_path / "l.sqlite"),
                        "--executor", "processes", "--workers", "2", stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while server.requests < 4:  # both workers have runs waiting on a reply
            assert time.monotonic() < deadline and proc.poll() is None, "the matrix did not start"
            time.sleep(0.02)
        workers = child_pids(proc.pid)
        proc.kill()
        proc.wait()
        left = left_after(workers, 5)
    assert len(workers) >= 2 and not left


@pytest.mark.parametrize("ctrl_c_first", [False, True], ids=["running", "stopping"])
def test_a_ledger_failure_in_the_driver_stops_the_workers_at_once(tmp_path, ctrl_c_first):
    """Found by red25: when the driver could not write the ledger, it asked the workers to quit and waited up to 10 s
    for each, one after the other, while their runs waited on model calls whose rows it would never read; the error
    came that much later (also while it waited for the runs in flight after a first Ctrl-C). Here one run's reply
    comes after 1 s, the other's after 30 s."""
    ledger_path = tmp_path / "l.sqlite"
    with FakeAgentServer([{"content": "Done."}], delay_s=1, faults=lambda n: "slow" if n > 1 else None, slow_s=30) as server:
        proc = processes_matrix(server.base_url, ledger_path, repeats=2, jobs=2, stdout=subprocess.DEVNULL)
        wait_for(
            lambda: server.requests >= 2, proc, "the matrix did not start"
        )  # the first reply comes in 1 s, the second in 30 s
        workers = child_pids(proc.pid)
        if ctrl_c_first:
            proc.send_signal(signal.SIGINT)
        db = sqlite3.connect(ledger_path)
        db.execute("ALTER TABLE turns RENAME TO turns_moved")  # the first run's turn cannot be written
        db.close()
        moved = time.monotonic()
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - moved
        left = left_after(workers, 2)
    last = err.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in err and last.startswith("harness: could not") and "turns" in last, err
    assert took < 8 and not left, took


def test_a_killed_worker_s_runs_end_with_its_exit_code_and_every_turn_that_reached_the_driver(tmp_path):
    """Found by red25: the end row said "died (exit code None)": the driver read the exit code as soon as the worker's
    sentinel fired, before the process could be reaped."""
    ledger_path = tmp_path / "l.sqlite"
    with FakeAgentServer(delay_s=0.5, slots=16) as server:
        proc = processes_matrix(server.base_url, ledger_path, repeats=16, jobs=16, stdout=subprocess.DEVNULL)
        wait_for(lambda: server.requests >= 24, proc, "the matrix did not start")  # every run waits on its second reply
        os.kill(worker_pids(proc.pid)[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    with Ledger(ledger_path, readonly=True) as ledger:
        runs = ledger.runs()
        turns: dict[str, list[int]] = {}
        for turn in ledger.turns():
            turns.setdefault(turn.record.run_id, []).append(turn.record.turn)
        assert ledger.verify().ok
    dead = [run for run in runs if run.outcome == "infra_error"]
    assert proc.returncode == 1 and dead, err
    assert all(run.end is not None and turns.get(run.run_id, []) == list(range(1, run.end.turns + 1)) for run in runs)
    assert all("died (exit code -9)" in (run.end.error or "") for run in dead), [run.end.error for run in dead]


CLOSED: list[str] = []  # model specs whose backend the driver closed (a worker's closes stay in the worker)


def _closing_factory(spec: str, **kwargs):  # noqa: ANN202 - module level, so a worker can unpickle it
    from harness.backends import open_backend

    backend = open_backend(spec, **kwargs)
    close = backend.close

    def closed() -> None:
        CLOSED.append(spec)
        close()

    backend.close = closed  # type: ignore[method-assign]
    return backend


def test_a_ledger_failure_in_the_driver_still_closes_its_backends(tmp_path):
    """Found by review: the failure path marked the matrix as quitting at once (a second Ctrl-C's flag), so run_matrix
    skipped closing the driver's backends."""
    from harness.errors import LedgerError
    from harness.loop import RunOptions
    from harness.matrix import MatrixOverrides
    from harness.runner import expand_matrix, run_matrix
    from harness.scenarios import load_scenario

    ledger_path = tmp_path / "l.sqlite"
    CLOSED.clear()
    with FakeAgentServer([{"content": "Done."}], delay_s=1) as server:
        model = f"openai:ideal@{server.base_url}"
        plans = expand_matrix([load_scenario(SCENARIO_FILE)], MatrixOverrides([model], [0.0], 2, None, ["native"], None))

        def move_turns() -> None:
            while server.requests < 2:
                time.sleep(0.01)
            db = sqlite3.connect(ledger_path)
            db.execute("ALTER TABLE turns RENAME TO turns_moved")
            db.close()

        mover = threading.Thread(target=move_turns, daemon=True)
        mover.start()
        options = RunOptions(runs_dir=tmp_path / "runs", jobs=2, executor="processes", workers=2)
        with Ledger(ledger_path) as ledger, pytest.raises(LedgerError, match="turns"):
            run_matrix(plans, ledger, options, backend_factory=_closing_factory)
    assert CLOSED == [model]


def test_a_matrix_stopped_by_output_it_cannot_write_ends_its_workers_runs_as_threads_do(tmp_path):
    """Review: with stdout on a full disk, the first run line stopped the matrix; threads ended their runs in flight as
    interrupted, the processes executor left two runs without an end row. One slot at the server: its replies come one
    at a time, so when the first run ends the others still wait for one (newcomer: with 4 slots the three runs could
    end together, none left in flight to interrupt)."""
    ledger_path = tmp_path / "l.sqlite"
    with FakeAgentServer(delay_s=0.3, slots=1) as server, open("/dev/full", "w") as full:
        proc = processes_matrix(server.base_url, ledger_path, repeats=5, jobs=3, stdout=full)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.strip().splitlines()[-1].startswith("harness: the output could not be written"), err
    with Ledger(ledger_path, readonly=True) as ledger:
        runs = ledger.runs()
        assert ledger.verify().ok and len(runs) >= 2
    assert all(run.outcome is not None for run in runs), [(run.run_id, run.outcome) for run in runs]
    assert {run.outcome for run in runs} <= {"pass", "interrupted"} and "interrupted" in {run.outcome for run in runs}
