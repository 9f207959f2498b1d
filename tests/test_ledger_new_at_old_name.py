"""A new ledger at the name of one moved away while a matrix still writes it: refused, so neither file is damaged.

SQLite keeps a ledger's ``-wal`` and ``-shm`` files under the name it was opened by. A ledger moved while ``harness run``
writes it leaves them there, in use; a second ``harness run --ledger`` at the old name would take them for its new
file's (the two processes then read and write each other's pages: both files came out damaged). Real processes, a real
HTTP server on 127.0.0.1 and real SQLite files; the moved file is checked with a real ``harness ledger verify``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from harness.ledger import Ledger
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, SCENARIO_FILE, wait_for
from tests.ledger_builders import SMALL, add_run

_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _held_after_three(gate: threading.Event) -> Callable[[int], None]:
    """The server's fault hook: chat requests after the third wait until ``gate`` is set, so the first process still
    writes its moved ledger while the second tries (found on a slower machine: the first had ended by then, 1 s early)."""
    return lambda number: None if number <= 3 else (gate.wait(120) and None)


def _refused_or_fail(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """The second process, which should be refused at once; one that calls the model waits at the gate, so it fails
    the test here in words (red team: it failed as a bare 60 s TimeoutExpired)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, env=_ENV, timeout=60)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the second process was not refused: it went on to call the model (stderr: {exc.stderr!r})")


@pytest.mark.parametrize("replaced", [False, True], ids=["new", "replaced"])
def test_a_ledger_at_the_old_name_of_a_moved_one_still_written_is_refused_and_both_files_stay_whole(tmp_path, replaced):
    """The second run makes a new ledger at the old name, or opens another ledger moved there (its tables and rows are
    then read through the first process's journal: it ended with 'database disk image is malformed')."""
    ledger_path, moved, other = tmp_path / "ledger.sqlite", tmp_path / "kept.sqlite", tmp_path / "o" / "ledger.sqlite"
    with Ledger(other) as ledger:
        add_run(ledger, "theirs", model=SMALL)
    gate = threading.Event()
    with FakeAgentServer(delay_s=0.3, slots=4, faults=_held_after_three(gate)) as server:
        args = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}",
                "--tool-mode", "native", "--temperature", "0", "--jobs", "2", "--ledger", str(ledger_path)]  # fmt: skip
        first = subprocess.Popen([*args, "--repeats", "6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=_ENV)  # fmt: skip
        try:
            wait_for(lambda: server.requests >= 3, first, "the matrix did not start")  # two runs are past their first turn
            os.rename(ledger_path, moved)
            if replaced:
                os.rename(other, ledger_path)
            second = _refused_or_fail([*args, "--repeats", "1"])
            # red team: reading the file at the old name (verify, report, view) went through the first's journal too
            read = subprocess.run([sys.executable, "-m", "harness", "ledger", "verify", "--ledger", str(ledger_path)],
                                  capture_output=True, text=True, env=_ENV, timeout=60) if replaced else None  # fmt: skip
            assert first.poll() is None, "the first process ended before the second was refused: the test proves nothing"
        finally:
            gate.set()
        first.communicate(timeout=120)
    if read is not None:
        assert read.returncode == 1 and "Traceback" not in read.stderr, read.stdout + read.stderr
        assert f"process {first.pid} still writes a ledger it opened under the name" in read.stderr, read.stderr
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
    verify = subprocess.run([sys.executable, "-m", "harness", "ledger", "verify", "--ledger", str(moved)],
                            capture_output=True, text=True, env=_ENV, timeout=60)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with Ledger(moved, readonly=True) as ledger:
        assert ledger.runs() and all(run.outcome is not None for run in ledger.runs())
    if replaced:
        with Ledger(ledger_path, readonly=True) as ledger:
            assert ledger.verify().ok and [run.run_id for run in ledger.runs()] == ["theirs"]
    else:
        assert not ledger_path.exists(), "a ledger was made at the old name"
    assert second.stderr.strip().splitlines()[-1] == (
        f"harness: process {first.pid} still writes a ledger it opened under the name {ledger_path} (its -wal and -shm files "
        "are there: that ledger was moved, deleted or replaced while it was written), so no ledger is opened there now; "
        "let that process end, or pass another --ledger path."
    ), second.stderr


def test_a_moved_ledger_opened_under_its_new_name_while_the_old_name_is_still_written_is_refused(tmp_path):
    """The first run's sentence says to pass --ledger with the new name: a second run doing so while the first (or any
    other process on the old name) still writes would give the one file two journals, each writer blind to the other's."""
    ledger_path, moved = tmp_path / "ledger.sqlite", tmp_path / "kept.sqlite"
    gate = threading.Event()
    with FakeAgentServer(delay_s=0.3, slots=4, faults=_held_after_three(gate)) as server:
        args = [sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}",
                "--tool-mode", "native", "--temperature", "0", "--jobs", "2"]  # fmt: skip
        first = subprocess.Popen([*args, "--repeats", "6", "--ledger", str(ledger_path)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=_ENV)  # fmt: skip
        try:
            wait_for(lambda: server.requests >= 3, first, "the matrix did not start")  # two runs are past their first turn
            os.rename(ledger_path, moved)
            second = _refused_or_fail([*args, "--repeats", "8", "--ledger", str(moved)])
            assert first.poll() is None, "the first process ended before the second was refused: the test proves nothing"
        finally:
            gate.set()
        first.communicate(timeout=120)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
    assert second.stderr.strip().splitlines()[-1] == (
        f"harness: process {first.pid} still writes the ledger {moved} under another name (it was moved or renamed while "
        "that process wrote it, and its -wal and -shm files stay under the old name), so it is not opened now (one "
        "file with two journals loses rows); let that process end, then run again."
    ), second.stderr
    verify = subprocess.run([sys.executable, "-m", "harness", "ledger", "verify", "--ledger", str(moved)],
                            capture_output=True, text=True, env=_ENV, timeout=60)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
