"""The check for another file's journal (``opening._orphan_journal``) refuses no legitimate open and damages nothing.

Real processes and real SQLite files: a ledger read through a symlink while a process writes it by its real path, and a
ledger opened a second time by the process already writing it while other processes write it too.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness.errors import LedgerError
from harness.ledger import Ledger
from harness.ledger.opening import _orphan_journal
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, RUN_FLAGS, SCENARIO_FILE, cli
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


_READ_MARK = """
import fcntl, sys
ledger, shm, other = (open(name, "a+b") for name in sys.argv[1:4])
fcntl.lockf(ledger, fcntl.LOCK_SH, 510, 0x40000002)  # reading the ledger
fcntl.lockf(shm, fcntl.LOCK_SH, 1, 123)  # only a read mark of its -shm, as a reader in a read-only folder holds
fcntl.lockf(other, fcntl.LOCK_SH, 1, 128)  # and another ledger's -shm, open in the same process
print("locked", flush=True)
sys.stdin.readline()
"""


def test_a_reader_holding_only_a_read_mark_of_the_shm_is_not_taken_for_a_writer_elsewhere(tmp_path):
    """Reviewer: the probe looked at the -shm's byte 128 only; a reader in a read-only folder holds a read mark (byte
    123) instead, so with another ledger open in that process its reads were taken for a ledger opened by another name."""
    path = tmp_path / "ledger.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "a", model=SMALL)
    names = [str(path), f"{path}-shm", str(tmp_path / "other.sqlite-shm")]
    holder = subprocess.Popen([sys.executable, "-c", _READ_MARK, *names], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        assert _orphan_journal(path) is None
    finally:
        holder.communicate("\n", timeout=30)


def test_this_process_reopening_the_old_name_of_a_ledger_it_still_writes_is_refused(tmp_path):
    """Reviewer: the probe left this process's own locks out, so a ledger moved while this process wrote it and then
    opened again by its old name here took the open ledger's journal (the moved file ended with 2 rows of 101)."""
    path, moved = tmp_path / "ledger.sqlite", tmp_path / "kept.sqlite"
    ledger = Ledger(path)
    add_run(ledger, "a", model=SMALL)
    os.rename(path, moved)
    with pytest.raises(LedgerError, match=f"^this process still has a ledger open that it opened under the name {path} "):
        Ledger(path)
    ledger.close()
    assert not path.exists()
    with Ledger(moved, readonly=True) as kept:
        assert kept.verify().ok and [run.run_id for run in kept.runs()] == ["a"]


# finding: this process's own open ledger was named like another's ("this process still writes a ledger it opened under
# the name ...; let that process end"): advice this process cannot follow by waiting
def test_a_ledger_this_process_still_has_open_under_another_name_is_refused_in_words_for_this_process(tmp_path, capsys):
    """A program holding a ledger moved since (here the test itself) runs the CLI in-process on either name."""
    path, moved = tmp_path / "ledger.sqlite", tmp_path / "kept.sqlite"
    ledger = Ledger(path)
    add_run(ledger, "a", model=SMALL)
    os.rename(path, moved)
    try:
        with FakeAgentServer() as server:
            rc, _, err = cli(capsys, "run", SCENARIO_FILE, "--model", f"openai:ideal@{server.base_url}", *RUN_FLAGS,
                             "--repeats", "1", "--ledger", path)  # fmt: skip
        assert rc == 1 and err == (
            f"harness: this process still has a ledger open that it opened under the name {path} (its -wal and -shm "
            "files are there: that ledger was moved, deleted or replaced since), so no ledger is opened there now; "
            "close that ledger first, or pass another --ledger path.\n"
        ), err
        rc, _, err = cli(capsys, "ledger", "verify", "--ledger", moved)
        assert rc == 1 and err == (
            f"harness: this process already has the ledger {moved} open under another name (it was moved or renamed "
            "since it was opened, and its -wal and -shm files stay under the old name), so it is not opened a second "
            "time (one file with two journals loses rows); close the ledger open under the old name first, then open "
            "it again.\n"
        ), err
    finally:
        ledger.close()
    assert not path.exists()
    with Ledger(moved, readonly=True) as kept:
        assert kept.verify().ok and [run.run_id for run in kept.runs()] == ["a"]


def test_a_ledger_moved_in_at_the_name_of_another_still_written_is_refused_though_both_files_are_held(tmp_path):
    """Reviewer: A's ledger moved away and D's (still written by D) moved to its name: the -shm there (A's) and the file
    (D's) were each held, by two processes, and the probe, asking only whether each was held, let it open."""
    path, kept, other = tmp_path / "ledger.sqlite", tmp_path / "kept.sqlite", tmp_path / "d" / "other.sqlite"
    first = _writer(path, "a")
    os.rename(path, kept)
    second = _writer(other, "d")
    os.rename(other, path)
    try:
        with pytest.raises(LedgerError, match=f"^process {first.pid} still writes a ledger it opened under the name"):
            Ledger(path, readonly=True)
    finally:
        first.communicate("\n", timeout=60)
        second.communicate("\n", timeout=60)
    for name, run_id in ((kept, "a"), (path, "d")):
        with Ledger(name, readonly=True) as ledger:
            assert ledger.verify().ok and [run.run_id for run in ledger.runs()] == [run_id]
