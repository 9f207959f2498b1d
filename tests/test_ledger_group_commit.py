"""Deferred turn rows (``Ledger.record_turn(..., defer=True)``): the loop's group commit of quick turns.

A deferred row is committed with the ledger's next commit (another row, a turn without ``defer``, a read, ``flush``,
``close``), in one transaction and in order; a commit that fails keeps it for the next (but a row SQLite refuses for
what the ledger holds, which is dropped and named); a writer killed with SIGKILL loses only rows still deferred. The
loop defers the turns of model calls quicker than ``GROUP_COMMIT_S`` and commits the others at once: checked against a
real HTTP server that reads the ledger from another connection at each request. Red team findings: a Ctrl-C just after
a commit, report reads, a duplicate deferred turn, a read-only or closed ledger, a turn that comes after the end row
another thread appended for its run.
"""

from __future__ import annotations

import inspect
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.backends import open_backend
from harness.errors import LedgerError
from harness.ledger import Ledger
from harness.ledger.store import Ledger as _Store
from harness.loop import GROUP_COMMIT_S, RunOptions, RunPlan, run_once
from harness.runner import end_from_totals
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO
from tests.test_ledger import run_end, run_start, turn


def _committed(path: Path, table: str = "turns") -> int:
    """Rows of ``table`` another connection sees (what a crash would leave)."""
    db = sqlite3.connect(path)
    try:
        return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    finally:
        db.close()


def _commits(ledger: Ledger) -> list[str]:
    """The ledger connection's COMMIT statements from now on (SQLite's own trace of what it runs)."""
    seen: list[str] = []
    ledger._db.set_trace_callback(lambda sql: seen.append(sql) if sql.startswith("COMMIT") else None)
    return seen


def test_deferred_turns_are_committed_with_the_end_row_in_one_transaction(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
        commits = _commits(ledger)
        for n in (1, 2, 3):
            ledger.record_turn(turn("r1", n), defer=True)
        assert _committed(ledger_path) == 0 and commits == []
        ledger.end_run(run_end("r1"))
        assert commits == ["COMMIT"]
        assert _committed(ledger_path) == 3 and _committed(ledger_path, "run_ends") == 1
        assert [t.record.turn for t in ledger.turns("r1")] == [1, 2, 3]
        assert ledger.verify().ok  # chained in order, each after the one before


def test_a_turn_without_defer_commits_the_deferred_ones_before_it(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
        ledger.record_turn(turn("r1", 1), defer=True)
        ledger.record_turn(turn("r1", 2))
        assert _committed(ledger_path) == 2
        assert ledger.verify().ok


@pytest.mark.parametrize("read", ["turns", "head", "verify", "flush", "close"])
def test_a_read_flush_or_close_commits_deferred_turns(ledger_path, read):
    ledger = Ledger(ledger_path)
    ledger.start_run(run_start("r1"))
    ledger.record_turn(turn("r1", 1), defer=True)
    assert _committed(ledger_path) == 0
    if read == "turns":
        assert [t.record.turn for t in ledger.turns("r1")] == [1]  # the writer's own reads see every row
    else:
        getattr(ledger, read)()
    assert _committed(ledger_path) == 1
    ledger.close()
    assert _committed(ledger_path) == 1


def test_a_group_does_not_take_rows_deferred_before_it(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
        ledger.record_turn(turn("r1", 1), defer=True)
        with pytest.raises(RuntimeError), ledger.group():
            ledger.record_turn(turn("r1", 2), defer=True)  # inside a group: the group's row
            raise RuntimeError("the group rolls back")
        assert [t.record.turn for t in ledger.turns("r1")] == [1]


def test_a_commit_that_fails_keeps_the_deferred_rows_for_the_next(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
        ledger.end_run(run_end("r1"))
        ledger.start_run(run_start("r2"))
        ledger.record_turn(turn("r2", 1), defer=True)
        with pytest.raises(LedgerError, match="run_ends"):
            ledger.end_run(run_end("r1"))  # r1 ended already: refused, and r2's turn was rolled back with it
        assert _committed(ledger_path) == 0
        ledger.record_turn(turn("r2", 2), defer=True)
        ledger.end_run(run_end("r2"))
        assert [t.record.turn for t in ledger.turns("r2")] == [1, 2]
        assert ledger.verify().ok


_WRITER = """
import sys, time
from harness.ledger import Ledger
from harness.ledger.store import Ledger as _Store
from harness.runner import end_from_totals
from tests.test_ledger import run_start, turn
ledger = Ledger(sys.argv[1])
ledger.start_run(run_start("r1"))
ledger.record_turn(turn("r1", 1))
ledger.record_turn(turn("r1", 2), defer=True)
ledger.record_turn(turn("r1", 3), defer=True)
print("deferred", flush=True)
time.sleep(60)
"""


def test_a_writer_killed_loses_only_its_deferred_turns(ledger_path):
    ledger_path.parent.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(ledger_path)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout is not None and child.stdout.readline() == "deferred\n"
    os.kill(child.pid, signal.SIGKILL)
    child.communicate(timeout=60)
    with Ledger(ledger_path) as ledger:
        assert ledger.verify().ok
        assert [t.record.turn for t in ledger.turns("r1")] == [1]  # the committed turn; the two deferred ones are gone


@pytest.mark.parametrize(("delay_s", "seen_at_requests"), [(0.0, [0, 0, 0]), (GROUP_COMMIT_S + 0.03, [0, 1, 2])])
def test_the_loop_defers_quick_turns_and_commits_slow_ones_at_once(scenario, ledger_path, tmp_path, delay_s,
                                                                   seen_at_requests, monkeypatch):  # fmt: skip
    if delay_s == 0.0:  # on a busy machine an unhurried reply outlasted 50 ms 1 time in 4 (newcomer): quick is < 5 s here
        monkeypatch.setattr("harness.loop.GROUP_COMMIT_S", 5.0)
    seen: list[int] = []
    with FakeAgentServer(delay_s=delay_s, faults=lambda n: seen.append(_committed(ledger_path)) or None) as server:
        with open_backend(f"openai:ideal@{server.base_url}") as backend, Ledger(ledger_path) as ledger:
            summary = run_once(RunPlan(scenario, f"openai:ideal@{server.base_url}", 0.0), backend, ledger,
                               RunOptions(runs_dir=tmp_path / "runs"))  # fmt: skip
            assert _committed(ledger_path) == 3  # the end row committed every turn before it
    assert summary.outcome == "pass" and summary.turns == 3
    assert seen == seen_at_requests  # turns another connection saw when each request arrived


_COMMIT_LINE = next(
    inspect.getsourcelines(_Store._transaction)[1] + i
    for i, line in enumerate(inspect.getsourcelines(_Store._transaction)[0])
    if 'execute("COMMIT")' in line
)


def _interrupt_after_commit(frame: Any, event: str, arg: Any) -> None:
    """A profile hook standing for a Ctrl-C whose handler runs just after SQLite's COMMIT returned (a signal is handled
    between two bytecodes: there too)."""
    if event == "c_return" and frame.f_code is _Store._transaction.__wrapped__.__code__ and frame.f_lineno == _COMMIT_LINE:
        sys.setprofile(None)
        raise KeyboardInterrupt


def test_a_ctrl_c_just_after_a_commit_does_not_put_the_committed_turns_back(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
        ledger.record_turn(turn("r1", 1), defer=True)
        sys.setprofile(_interrupt_after_commit)
        try:
            with pytest.raises(KeyboardInterrupt):
                ledger.end_run(run_end("r1"))  # committed, turn 1 with it; the interrupt comes after
        finally:
            sys.setprofile(None)
        # seen on 1e1fba5: turn 1 is deferred again, so every later commit and read fails with
        # "UNIQUE constraint failed: turns.run_id, turns.turn", close() included
        ledger.start_run(run_start("r2"))
        assert [t.record.turn for t in ledger.turns("r1")] == [1]
        assert ledger.verify().ok


def test_every_read_of_a_writable_ledger_sees_the_deferred_turns(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
        ledger.record_turn(turn("r1", 1), defer=True)
        assert len(ledger.turns_frame()) == 1  # seen on 1e1fba5: 0 (ReportReads bypass _query, so nothing is flushed)


def test_a_deferred_turn_sqlite_refuses_is_dropped_and_named_and_the_ledger_goes_on(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
        ledger.record_turn(turn("r1", 1))
        ledger.record_turn(turn("r1", 1), defer=True)  # the same turn again: refused when it is written
        ledger.record_turn(turn("r1", 2), defer=True)
        with pytest.raises(LedgerError, match=r"the turn 1 of run r1, deferred, was refused \(UNIQUE constraint.*dropped"):
            ledger.start_run(run_start("r2"))
        ledger.start_run(run_start("r2"))  # the next commit goes through, with the turn deferred after the bad one
        ledger.end_run(run_end("r1"))
        assert [t.record.turn for t in ledger.turns("r1")] == [1, 2]
        assert [r.run_id for r in ledger.runs()] == ["r1", "r2"]
        assert ledger.verify().ok


def test_a_read_only_or_closed_ledger_refuses_a_deferred_turn_at_once(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
    with Ledger(ledger_path, readonly=True) as reader, pytest.raises(LedgerError, match="readonly"):
        reader.record_turn(turn("r1", 1), defer=True)
    closed = Ledger(ledger_path)
    closed.close()
    with pytest.raises(LedgerError):
        closed.record_turn(turn("r1", 1), defer=True)
    assert _committed(ledger_path) == 0


def test_a_run_ended_for_it_counts_its_deferred_turns_and_refuses_later_ones(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("r1"))
        ledger.record_turn(turn("r1", 1, prompt_tokens=5, completion_tokens=2), defer=True)
        end = end_from_totals(ledger, "r1", "interrupted", "quit by the user")
        assert (end.turns, end.prompt_tokens, end.completion_tokens) == (1, 5, 2)
        with pytest.raises(LedgerError, match="ended for it before its turn 2 came"):
            ledger.record_turn(turn("r1", 2), defer=True)  # the reply its worker waited for, after the quit
        assert [t.record.turn for t in ledger.turns("r1")] == [1]
        with pytest.raises(LedgerError, match="never started"):
            end_from_totals(ledger, "r9", "interrupted", "quit by the user")
        assert ledger.verify().ok
