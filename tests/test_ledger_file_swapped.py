"""The ledger file moved, replaced or deleted while ``harness run`` writes it: the matrix stops with one sentence.

A real ``python -m harness run`` subprocess against a real HTTP server slow enough that the file can be moved under the
matrix; the moved file is then checked with a real ``harness ledger verify``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.ledger import Ledger
from harness.ledger.checkpoint import COMMITS_PER_CHECKPOINT
from harness.run_options import STOPPED_BY_ERROR
from tests.fake_agent_server import FakeAgentServer
from tests.helpers import REPO, SCENARIO_FILE
from tests.ledger_builders import SMALL, add_run
from tests.test_ledger import run_start, turn


def _harness(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip


def _run_and_swap(ledger_path: Path, executor: str, swap) -> tuple[int, str]:
    """Start an 8-run matrix, call ``swap()`` once its first runs are half done; ``(exit code, stderr)``."""
    with FakeAgentServer(delay_s=0.3, slots=4) as server:
        proc = _harness("run", str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}", "--tool-mode", "native",
                        "--repeats", "8", "--temperature", "0", "--jobs", "2", "--ledger", str(ledger_path),
                        "--executor", executor, *(["--workers", "2"] if executor == "processes" else []))  # fmt: skip
        deadline = time.monotonic() + 60
        while server.requests < 3:  # two runs are past their first turn: the matrix is under way
            assert time.monotonic() < deadline and proc.poll() is None, "the matrix did not start"
            time.sleep(0.02)
        swap()
        _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_ledger_moved_mid_matrix_stops_it_and_the_moved_file_holds_every_ended_run_whole(tmp_path, executor):
    ledger_path, moved = tmp_path / "ledger.sqlite", tmp_path / "kept" / "x.sqlite"
    moved.parent.mkdir()
    rc, err = _run_and_swap(ledger_path, executor, lambda: os.rename(ledger_path, moved))
    assert rc == 1 and "Traceback" not in err, err
    said = err.strip().splitlines()[-1]
    assert said == (
        f"harness: the ledger {ledger_path} was moved to {moved} while the matrix ran, so the matrix stops (the runs "
        f"recorded so far are in {moved}); move that file back to {ledger_path}, or pass --ledger {moved}, and run "
        "again to resume."
    ), err
    assert not ledger_path.exists()  # nothing made anew under the old name (not even by the checkpoint thread)
    verify = subprocess.run([sys.executable, "-m", "harness", "ledger", "verify", "--ledger", str(moved)],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with Ledger(moved, readonly=True) as ledger:
        runs = ledger.runs()
        turns = {run.run_id: len(ledger.turns(run.run_id)) for run in runs}
    assert 2 <= len(runs) < 8  # the matrix stopped before the end
    assert all(run.outcome is not None for run in runs)  # the runs in flight ended into the moved file
    assert all(turns[run.run_id] == run.end.turns for run in runs if run.end is not None)  # type: ignore[union-attr]
    stopped = [run.end.error for run in runs if run.outcome == "interrupted"]  # type: ignore[union-attr]
    assert set(stopped) <= {STOPPED_BY_ERROR}  # the error stopped them, not the user (none in flight: CI, stop 28)


def test_a_ledger_deleted_mid_matrix_stops_it_saying_the_runs_are_lost(tmp_path):
    ledger_path = tmp_path / "ledger.sqlite"
    rc, err = _run_and_swap(ledger_path, "threads", lambda: os.unlink(ledger_path))
    assert rc == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"harness: the ledger {ledger_path} was deleted while the matrix ran, so the matrix stops (the runs recorded in "
        "it are lost once this process exits, the file being deleted); restore the ledger from a copy if you have one, "
        "then run again."
    ), err
    assert not ledger_path.exists()


def test_a_ledger_replaced_mid_matrix_names_where_the_recorded_runs_are(tmp_path):
    ledger_path, old = tmp_path / "ledger.sqlite", tmp_path / "old.sqlite"

    other = tmp_path / "other" / "ledger.sqlite"
    with Ledger(other):
        pass  # another ledger, made elsewhere (SQLite would take the running one's -wal file for its own here)

    def replace() -> None:
        os.rename(ledger_path, old)
        os.rename(other, ledger_path)

    rc, err = _run_and_swap(ledger_path, "threads", replace)
    assert rc == 1 and "Traceback" not in err, err
    assert f"was replaced by another file (the one it held is now {old})" in err and f"--ledger {old}" in err, err
    with Ledger(ledger_path, readonly=True) as ledger:
        assert ledger.runs() == []  # nothing of the matrix went into the new file


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_lock_file_deleted_under_a_matrix_stops_it_at_its_next_lock_while_a_second_matrix_runs_on(tmp_path, executor):
    """Deleting ``<ledger>.locks/runs.lock`` let a second process lock a new file and run the identities the first held."""
    ledger_path = tmp_path / "ledger.sqlite"
    lock_file = tmp_path / "ledger.sqlite.locks" / "runs.lock"
    with FakeAgentServer(delay_s=0.3, slots=4) as server:
        args = ["run", str(SCENARIO_FILE), "--model", f"openai:ideal@{server.base_url}", "--tool-mode", "native",
                "--repeats", "6", "--temperature", "0", "--jobs", "2", "--ledger", str(ledger_path)]  # fmt: skip
        first = _harness(*args, "--executor", executor, *(["--workers", "2"] if executor == "processes" else []))
        deadline = time.monotonic() + 60
        while server.requests < 3:  # its first two runs hold their locks
            assert time.monotonic() < deadline and first.poll() is None, "the matrix did not start"
            time.sleep(0.02)
        lock_file.unlink()
        second = _harness(*args)  # makes a new lock file and may lock the identities the first one is running
        _, err = first.communicate(timeout=120)
        _, second_err = second.communicate(timeout=120)
    assert first.returncode == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"harness: the lock file {lock_file} was deleted or replaced while this matrix held run locks in it, so another "
        f"process could run the same identity as this one; the matrix stops: let every harness run on {ledger_path} "
        f"end, then run again (and leave {lock_file.parent} alone while one runs)."
    ), err
    assert second.returncode == 0, second_err
    with Ledger(ledger_path, readonly=True) as ledger:
        assert ledger.verify().ok and all(run.outcome is not None for run in ledger.runs())
        assert len(ledger.finished_identities()) == 6  # the second matrix completed the set


def test_a_ledger_hard_linked_then_unlinked_mid_matrix_does_not_name_a_deleted_path(tmp_path):
    """``ln ledger kept; rm ledger`` under a matrix: the kernel shows the open file as ``ledger (deleted)``; the sentence
    named that path (``pass --ledger .../ledger.sqlite (deleted)``) as where the runs were."""
    ledger_path, kept = tmp_path / "ledger.sqlite", tmp_path / "kept.sqlite"

    def relink() -> None:
        os.link(ledger_path, kept)
        os.unlink(ledger_path)

    rc, err = _run_and_swap(ledger_path, "threads", relink)
    assert rc == 1 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        f"harness: the ledger {ledger_path} was removed while the matrix ran, so the matrix stops (the runs recorded so "
        "far are in the file it named, which lives on under another name (a hard link)); pass --ledger with that name, "
        "or move that file back to this one, and run again to resume."
    ), err
    with Ledger(kept, readonly=True) as ledger:
        assert ledger.verify().ok and ledger.runs() and all(run.outcome is not None for run in ledger.runs())


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_the_ledgers_folder_renamed_mid_matrix_says_where_the_ledger_went_and_makes_nothing_under_the_old_name(
    tmp_path, executor
):
    """``mv runs-folder elsewhere`` under a matrix: its next lock made the old folder anew (with a lock folder in it) and
    the sentence blamed a deleted lock file."""
    folder, renamed = tmp_path / "d", tmp_path / "d2"
    folder.mkdir()
    rc, err = _run_and_swap(folder / "ledger.sqlite", executor, lambda: os.rename(folder, renamed))
    assert rc == 1 and "Traceback" not in err, err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith(
            f"harness: the ledger {folder / 'ledger.sqlite'} was moved to {renamed / 'ledger.sqlite'} while the matrix ran"
        )
    ), err
    assert not folder.exists()
    with Ledger(renamed / "ledger.sqlite", readonly=True) as ledger:
        assert ledger.verify().ok and ledger.runs() and all(run.outcome is not None for run in ledger.runs())


def test_a_ledger_replaced_before_the_checkpoint_thread_starts_gets_none_of_the_old_files_pages(tmp_path):
    """The thread starts at the hundredth append and opened the name: after a replacement, the new file, which SQLite
    gives the writer's ``-wal`` (kept under the name), so the writer's pages were checkpointed into it (its own tables
    gone) while the moved file kept none of them."""
    ledger_path, old, other = tmp_path / "ledger.sqlite", tmp_path / "old.sqlite", tmp_path / "other" / "ledger.sqlite"
    with Ledger(other) as ledger:
        add_run(ledger, "theirs", model=SMALL)
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start("mine"))  # a run in flight when the file is replaced: its turns go on
        os.rename(ledger_path, old)
        os.rename(other, ledger_path)
        for n in range(1, COMMITS_PER_CHECKPOINT + 20):
            ledger.record_turn(turn("mine", n))
    with Ledger(ledger_path, readonly=True) as theirs, Ledger(old, readonly=True) as mine:
        assert theirs.verify().ok and [run.run_id for run in theirs.runs()] == ["theirs"]
        assert mine.verify().ok and len(mine.turns("mine")) == COMMITS_PER_CHECKPOINT + 19
