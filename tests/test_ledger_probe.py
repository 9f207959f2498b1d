"""The check for another file's journal (``opening._orphan_journal``) refuses no legitimate open and damages nothing.

Real processes and real SQLite files: a ledger read through a symlink while a process writes it by its real path, and a
ledger opened a second time by the process already writing it while other processes write it too.
"""

from __future__ import annotations

import os
import subprocess
import sys

from harness.ledger import Ledger
from tests.helpers import REPO
from tests.ledger_builders import SMALL, add_run

_ENV = {**os.environ, "PYTHONPATH": str(REPO)}
_WRITER = """
import sys
from harness.ledger import Ledger
from tests.ledger_builders import SMALL, add_run
ledger = Ledger(sys.argv[1])
add_run(ledger, sys.argv[2], model=SMALL)
print("added", flush=True)
sys.stdin.readline()
ledger.close()
"""


def _writer(path, run_id) -> subprocess.Popen:
    """A process that opens ``path`` to write, appends one run, says so, and closes when its stdin gets a line."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), run_id], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_ENV, cwd=REPO)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "added\n"
    return proc


def test_a_ledger_read_through_a_symlink_while_written_by_its_real_path_is_read(tmp_path):
    """SQLite keeps the journal under the real path: asked under the link's name it looked like the file held without
    its -shm (verify was refused with 'another process still writes the ledger ... under another name')."""
    real, link = tmp_path / "real.sqlite", tmp_path / "link.sqlite"
    link.symlink_to(real)
    with Ledger(real) as ledger:
        add_run(ledger, "a", model=SMALL)
    writer = _writer(real, "b")
    try:
        verify = subprocess.run([sys.executable, "-m", "harness", "ledger", "verify", "--ledger", str(link)],
                                capture_output=True, text=True, env=_ENV, timeout=60)  # fmt: skip
    finally:
        writer.communicate("\n", timeout=60)
    assert verify.returncode == 0 and "OK, 6 rows verified" in verify.stdout, verify.stdout + verify.stderr


def test_a_second_open_in_the_writing_process_keeps_its_locks_and_no_run_is_lost(tmp_path):
    """The probe opened and closed the file in a process holding it, which drops all its POSIX locks (SQLite's): the
    next writer process took itself for the last one and deleted the -wal and -shm in use, and a run appended here
    afterwards was lost once a third process wrote too (verify still passed)."""
    path = tmp_path / "ledger.sqlite"
    ledger = Ledger(path)
    add_run(ledger, "here-1", model=SMALL)
    Ledger(path, readonly=True).close()  # e.g. a report read by a program holding the ledger
    _writer(path, "other-1").communicate("\n", timeout=60)
    assert path.with_name("ledger.sqlite-wal").exists(), "the -wal in use was deleted"
    add_run(ledger, "here-2", model=SMALL)
    third = _writer(path, "other-2")
    ledger.close()
    third.communicate("\n", timeout=60)
    with Ledger(path, readonly=True) as ledger:
        assert ledger.verify().ok
        assert sorted(run.run_id for run in ledger.runs()) == ["here-1", "here-2", "other-1", "other-2"]


_OPENING = """
import fcntl, sys
with open(sys.argv[1], "rb") as f:  # the ledger file's SHARED range, as SQLite takes it first when it opens a ledger
    fcntl.lockf(f, fcntl.LOCK_SH, 510, 0x40000002)
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_a_process_holding_the_file_without_any_journal_is_one_opening_it_and_not_refused(tmp_path):
    """A process caught opening the ledger holds the file's SHARED range and no -shm yet; under four processes opening
    and closing one ledger in loops, 5 opens in 64,737 were refused as 'under another name'. A process that opened the
    file under another name holds a -shm there: only that one is refused (tests/test_ledger_new_at_old_name.py)."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "a", model=SMALL)
    holder = subprocess.Popen([sys.executable, "-c", _OPENING, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with Ledger(path, readonly=True) as ledger:
            assert [run.run_id for run in ledger.runs()] == ["a"]
    finally:
        holder.communicate("\n", timeout=30)
