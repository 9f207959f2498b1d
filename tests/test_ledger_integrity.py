"""Tamper evidence end to end (issue 11): a real ledger, tampered with sqlite3 in each way a forger would, fails
`harness ledger verify`; cuts and re-chained edits, which no file can show from inside itself, fail against an
outside anchor (`harness ledger head`); the untampered copy passes both. Also: read-only folders and opening errors.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.ledger import Attempt, Ledger
from harness.rescore import rescore
from harness.review import attest
from harness.scenarios import load_scenario
from tests.helpers import IDEAL, REPO, RUN_FLAGS, SCENARIO_FILE, assert_one_sentence_error, cli, run_replay, write_cassette
from tests.ledger_builders import SMALL, add_run
from tests.ledger_tamper import CHAINED, delete_last_run, last_run_id, rechain, tamper


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """A ledger of two real replayed runs with rows in every chained table, and its head taken before one more run."""
    root = tmp_path_factory.mktemp("built")
    scenario = load_scenario(SCENARIO_FILE)
    run_replay(root, scenario, IDEAL)
    path = root / "ledger.sqlite"
    with Ledger(path) as ledger:
        run_id = ledger.runs()[0].run_id
        rescore(ledger, force=True)
        ledger.record_attempt(Attempt(run_id=run_id, turn=1, attempt=1, error_type="BackendTimeout", error="slow",
                                      status_code=None, retry_in_ms=10.0))  # fmt: skip
        anchor = ledger.head().anchor
    attest(path, run_id, reviewer="ann")
    run_replay(root, scenario, IDEAL)  # rows after the anchor: the anchor must still hold
    with Ledger(path, readonly=True) as ledger:
        counts = ledger.row_counts()
    assert all(counts[t] for t in CHAINED), counts
    return path, anchor


@pytest.fixture
def copy(built, tmp_path) -> Path:
    path = tmp_path / "copy.sqlite"
    shutil.copyfile(built[0], path)
    return path


def _verify(capsys, path, *extra):
    rc, out, err = cli(capsys, "ledger", "verify", "--ledger", path, *extra)
    assert "Traceback" not in err
    return rc, out + err


def test_the_untampered_ledger_verifies_with_and_without_its_anchor(copy, built, capsys, tmp_path):
    assert _verify(capsys, copy)[0] == 0
    rc, text = _verify(capsys, copy, "--anchor", built[1])
    assert rc == 0 and "extends the anchor" in text
    rc, out, _ = cli(capsys, "ledger", "head", "--ledger", copy, "--json")
    saved = tmp_path / "head.json"
    saved.write_text(out, encoding="utf-8")
    assert json.loads(out)["anchor"].startswith("hl1:") and _verify(capsys, copy, "--anchor", saved)[0] == 0
    (tmp_path / "notebook.txt").write_text(f"2026-01-01 ledger head: {built[1]}\n", encoding="utf-8")
    assert _verify(capsys, copy, "--anchor", tmp_path / "notebook.txt")[0] == 0


# Each finding: `harness ledger verify` passed after these (issue 11, "The ledger").
TAMPERED_WITHOUT_ANCHOR = {
    **{f"last_row_of_{t}": (f"DELETE FROM {t} WHERE seq = (SELECT MAX(seq) FROM {t})",) for t in CHAINED},
    "no_op_trigger_same_name": ("DROP TRIGGER turns_no_update",
                                "CREATE TRIGGER turns_no_update BEFORE UPDATE ON turns BEGIN SELECT 1; END"),
    "same_trigger_on_another_event": (
        "DROP TRIGGER turns_no_delete",
        "CREATE TRIGGER turns_no_delete BEFORE INSERT ON turns WHEN 0 BEGIN"
        " SELECT RAISE(ABORT, 'the ledger is append-only: DELETE on turns refused'); END",
    ),
    "an_added_trigger": ("CREATE TRIGGER sneaky AFTER INSERT ON turns BEGIN SELECT 1; END",),
    "migration_renamed": ("UPDATE _migrations SET name = 'm003_other' WHERE name = 'm003_attempts'",),
    "migration_removed": ("DELETE FROM _migrations WHERE name = 'm004_turn_reasoning'",),
    "migration_in_the_middle_removed": ("DELETE FROM _migrations WHERE name = 'm002_attestations'",),
    "migration_added": ("INSERT INTO _migrations VALUES ('m009_later', '2030-01-01T00:00:00.000+00:00')",),
    "migration_time_garbled": ("UPDATE _migrations SET applied_at = 'yesterday' WHERE name = 'm001_initial'",),
    "migrations_dropped": ("DROP TABLE _migrations",),
    "migrations_emptied": ("DROP TABLE _migrations", "CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)"),
}  # fmt: skip


@pytest.mark.parametrize("kind", sorted(TAMPERED_WITHOUT_ANCHOR))
def test_tampering_fails_verify_without_an_anchor(copy, capsys, kind):
    db = sqlite3.connect(copy)
    statements = TAMPERED_WITHOUT_ANCHOR[kind]
    if kind.startswith(("no_op", "same_trigger", "an_added")):
        for sql in statements:  # the forger's own triggers, not put back
            db.execute(sql)
        db.commit()
        db.close()
    else:
        db.close()
        tamper(copy, *statements)
    rc, text = _verify(capsys, copy)
    assert rc == 1, text


def test_deleting_the_whole_last_run_fails_verify(copy, capsys, built):
    delete_last_run(copy, fix_counters=False)
    rc, text = _verify(capsys, copy)
    assert rc == 1 and "rows were removed from the end" in text


# reviewer finding: with the last _migrations row deleted, verify named a symptom ("the index turns_run is missing":
# it then compared the schema with m013 undone) instead of the edit
@pytest.mark.parametrize(("cut", "said"), [
    (1, "m013_drop_turns_run is missing from it, but its changes are there"),
    (2, "m012_mode_index and m013_drop_turns_run are missing from it, but their changes are there"),
    (13, "m001_initial to m013_drop_turns_run (13 migrations) are missing from it, but their changes are there"),
])  # fmt: skip
def test_migration_rows_cut_from_the_end_are_named_as_the_edit(copy, capsys, cut, said):
    assert len(_registered()) == 13  # a new migration: extend the names above
    tamper(copy, f"DELETE FROM _migrations WHERE rowid > (SELECT MAX(rowid) FROM _migrations) - {cut}")
    rc, text = _verify(capsys, copy)
    assert rc == 1 and text.strip().endswith(f"verification FAILED: the _migrations table was edited ({said})."), text


# found by kill_resume.py's "_migrations last row deleted": a writable open re-applied m013 (DROP INDEX IF EXISTS) and
# recorded it, and the edit no longer showed in verify
@pytest.mark.parametrize("cut", [1, 2])
def test_harness_run_refuses_a_ledger_whose_last_migration_rows_were_deleted_and_leaves_it_as_it_was(copy, tmp_path, cut):
    tamper(copy, f"DELETE FROM _migrations WHERE rowid > (SELECT MAX(rowid) FROM _migrations) - {cut}")
    before = copy.read_bytes()
    with Ledger(copy, readonly=True) as ledger:
        edit = ledger.verify().problem
    assert edit is not None and edit.startswith("the _migrations table was edited (")
    cassette = write_cassette(tmp_path / "ideal.jsonl", IDEAL)
    proc = subprocess.run([sys.executable, "-m", "harness", "run", str(SCENARIO_FILE), "--model", f"replay:{cassette}",
                           *RUN_FLAGS, "--ledger", str(copy)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"harness: the ledger {copy} is not brought up to date: {edit}; restore it from a copy "
        f"(`harness ledger verify --ledger {copy}` names the same edit)."
    ), proc.stderr
    assert copy.read_bytes() == before and not Path(f"{copy}-wal").exists()
    with Ledger(copy, readonly=True) as ledger:
        assert ledger.verify().problem == edit


def test_a_ledger_made_by_an_older_migration_set_still_migrates_on_a_writable_open(copy):
    tamper(copy, "CREATE INDEX turns_run ON turns(run_id)", "DELETE FROM _migrations WHERE name = 'm013_drop_turns_run'")
    with Ledger(copy) as ledger:
        assert ledger.applied_migrations()[-1] == "m013_drop_turns_run" and ledger.verify().ok


def test_a_ledger_from_before_a_migration_still_verifies_and_an_unexplained_schema_names_its_object(copy, capsys):
    # m013 not applied and its index still there: a real older ledger, not an edit
    tamper(copy, "CREATE INDEX turns_run ON turns(run_id)", "DELETE FROM _migrations WHERE name = 'm013_drop_turns_run'")
    assert _verify(capsys, copy)[0] == 0
    tamper(copy, "DROP INDEX turns_report")  # matches no migration count: the object is named, as before
    rc, text = _verify(capsys, copy)
    assert rc == 1 and text.strip().endswith("verification FAILED: the index turns_report is missing."), text


def _registered() -> list[str]:
    from harness.ledger.migrations import MIGRATIONS

    return [name for name, _ in MIGRATIONS]


# Cut and re-chained ledgers look whole from inside: the anchor catches them.
def _cut_every_table(path):
    tamper(path, *(f"DELETE FROM {t} WHERE seq = (SELECT MAX(seq) FROM {t})" for t in CHAINED), fix_counters=True)


def _cut_before_the_anchor(path):
    run_id = last_run_id(path)
    tamper(path, *(f"DELETE FROM {t} WHERE run_id = '{run_id}'" for t in CHAINED),
           "DELETE FROM turns WHERE seq = (SELECT MAX(seq) FROM turns)", fix_counters=True)  # fmt: skip


def _rechained_turn(path):
    tamper(path, "UPDATE turns SET content = 'forged' WHERE seq = 1")
    rechain(path, "turns")


def _rechained_run(path):
    tamper(path, "UPDATE runs SET model = 'openai:gpt-9@http://x' WHERE seq = 1")
    rechain(path, "runs")


def _migration_time_moved(path):
    tamper(path, "UPDATE _migrations SET applied_at = '2000-01-01T00:00:00.000+00:00' WHERE name = 'm001_initial'")


@pytest.mark.parametrize("forge", [_cut_every_table, _cut_before_the_anchor, _rechained_turn, _rechained_run,
                                   _migration_time_moved])  # fmt: skip
def test_cuts_and_rechained_edits_fail_verify_against_the_anchor(copy, built, capsys, forge):
    forge(copy)
    rc, text = _verify(capsys, copy, "--anchor", built[1])
    assert rc == 1 and "verification FAILED" in text, text


def test_a_bad_anchor_is_one_sentence(copy, capsys):
    rc, _, err = cli(capsys, "ledger", "verify", "--ledger", copy, "--anchor", "not-a-head")
    assert_one_sentence_error(rc, err)
    assert rc == 2


def test_run_and_report_end_with_the_head(tmp_path, capsys):
    cassette = write_cassette(tmp_path / "ideal.jsonl", IDEAL)
    ledger = tmp_path / "l.sqlite"
    rc, out, _ = cli(
        capsys, "run", SCENARIO_FILE, "--model", f"replay:{cassette}", *RUN_FLAGS, "--repeats", "1", "--ledger", ledger
    )
    assert rc == 0
    head = out.strip().splitlines()[-1].split(": ", 1)[1]
    with Ledger(ledger, readonly=True) as opened:
        assert head == opened.head().anchor and head.startswith("hl1:") and "runs=1," in head
    rc, out, _ = cli(capsys, "report", "--ledger", ledger, "--out", tmp_path / "r", "--format", "md")
    assert rc == 0 and out.strip().splitlines()[-1].endswith(head)
    assert _verify(capsys, ledger, "--anchor", head)[0] == 0


# -- opening modes ---------------------------------------------------------------------------------------------
_READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'


def _in_read_only(folder: Path, *argv) -> subprocess.CompletedProcess:
    """Run `python -m harness ARGV` with ``folder`` mounted read-only (a private mount namespace: root obeys it)."""
    cmd = ["unshare", "-m", "sh", "-c", _READ_ONLY, str(folder), sys.executable, "-m", "harness", *map(str, argv)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.fixture
def read_only_folder(tmp_path) -> Path:
    folder = tmp_path / "archive"
    folder.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c", _READ_ONLY, str(folder), "touch", str(folder / "x")],
                           capture_output=True, text=True)  # fmt: skip
    if probe.returncode == 0 or "Read-only file system" not in probe.stderr:
        pytest.skip(f"cannot mount a read-only folder here (needs unshare -m and mount): {probe.stderr.strip()[:200]}")
    return folder


def test_a_ledger_in_a_read_only_folder_verifies_exports_and_reports(built, read_only_folder, tmp_path):
    shutil.copyfile(built[0], read_only_folder / "ledger.sqlite")
    path = read_only_folder / "ledger.sqlite"
    verify = _in_read_only(read_only_folder, "ledger", "verify", "--ledger", path, "--anchor", built[1])
    assert verify.returncode == 0 and "OK" in verify.stdout, verify.stderr
    export = _in_read_only(read_only_folder, "export", "--ledger", path)
    assert export.returncode == 0 and len(export.stdout.splitlines()) == 6, export.stderr  # two runs of three turns
    report = _in_read_only(read_only_folder, "report", "--ledger", path, "--out", tmp_path / "r", "--format", "md")
    assert report.returncode == 0 and (tmp_path / "r" / "report.md").is_file(), report.stderr
    assert sorted(p.name for p in read_only_folder.iterdir()) == ["ledger.sqlite"]


def test_rows_still_in_the_wal_are_read_or_the_user_is_told(tmp_path, read_only_folder):
    writer = Ledger(tmp_path / "live.sqlite")  # kept open while copied: its rows are still in the -wal file
    try:
        add_run(writer, "in-wal", model=SMALL)
        for suffix in ("", "-wal", "-shm"):
            shutil.copyfile(f"{tmp_path / 'live.sqlite'}{suffix}", f"{read_only_folder / 'l.sqlite'}{suffix}")
    finally:
        writer.close()
    export = _in_read_only(read_only_folder, "export", "--ledger", read_only_folder / "l.sqlite")
    assert export.returncode == 0 and '"in-wal"' in export.stdout, export.stderr
    (read_only_folder / "l.sqlite-shm").unlink()
    export = _in_read_only(read_only_folder, "export", "--ledger", read_only_folder / "l.sqlite")
    assert_one_sentence_error(export.returncode, export.stderr)
    assert "-wal" in export.stderr and "writable folder" in export.stderr


def test_writing_into_a_read_only_folder_says_the_folder_is_not_writable(built, read_only_folder, tmp_path):
    old = REPO / "tests" / "data" / "ledger_m003.sqlite"
    shutil.copyfile(old, read_only_folder / "old.sqlite")
    verify = _in_read_only(read_only_folder, "ledger", "verify", "--ledger", read_only_folder / "old.sqlite")
    assert verify.returncode == 0 and "harness ledger migrate" in verify.stderr, verify.stderr
    for argv in (["ledger", "migrate", "--ledger", read_only_folder / "old.sqlite"],
                 ["rescore", "--ledger", read_only_folder / "old.sqlite"],
                 ["run", SCENARIO_FILE, "--model", "replay:/nonexistent", "--ledger", read_only_folder / "new.sqlite"]):  # fmt: skip
        proc = _in_read_only(read_only_folder, *argv)
        assert_one_sentence_error(proc.returncode, proc.stderr)
        assert f"the folder {read_only_folder} is not writable" in proc.stderr, (argv, proc.stderr)


@pytest.mark.parametrize("argv", [["ledger", "migrate"], ["rescore"], ["ledger", "verify"], ["export"]])
def test_a_ledger_on_dev_null_is_one_sentence(capsys, argv):
    rc, _, err = cli(capsys, *argv, "--ledger", "/dev/null")
    assert_one_sentence_error(rc, err)
    assert "not a regular file" in err


def test_a_half_applied_migration_is_one_sentence(tmp_path, capsys):
    path = tmp_path / "half.sqlite"
    shutil.copyfile(REPO / "tests" / "data" / "ledger_m003.sqlite", path)
    tamper(path, "CREATE TABLE _added_columns (table_name TEXT)")  # m004's first step done, its record not written
    for argv in (["ledger", "migrate"], ["rescore"], ["ledger", "verify"]):
        rc, _, err = cli(capsys, *argv, "--ledger", path)
        assert_one_sentence_error(rc, err)


def test_a_reshaped_migrations_table_is_one_sentence(copy, capsys):
    tamper(copy, "DROP TABLE _migrations", "CREATE TABLE _migrations (x)", "INSERT INTO _migrations VALUES (1)")
    rc, _, err = cli(capsys, "ledger", "verify", "--ledger", copy)
    assert_one_sentence_error(rc, err)
    for argv in (["export"], ["ledger", "head"], ["ledger", "migrate"]):  # reads that do not need it may go on
        rc, _, err = cli(capsys, *argv, "--ledger", copy)
        assert "Traceback" not in err and (rc == 0 or err.count("\n") == 1), err


def _swap_run_indexes(path: Path) -> None:
    """Swap the root pages of two indexes of ``runs`` under an unchanged schema text (``writable_schema``)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=DELETE")
        pages = dict(db.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'index' AND tbl_name = 'runs'"))
        first, second = sorted(pages)[:2]
        db.execute("PRAGMA writable_schema=ON")
        db.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = ?", (pages[second], first))
        db.execute("UPDATE sqlite_master SET rootpage = ? WHERE name = ?", (pages[first], second))
        db.execute("PRAGMA writable_schema=OFF")
    finally:
        db.close()


def test_an_index_swapped_under_an_unchanged_schema_fails_verify(copy, built, capsys):
    # red-team finding: verify (and --anchor) passed, then --dry-run saw no finished run and `run` redid them all
    _swap_run_indexes(copy)
    for extra in ((), ("--anchor", built[1])):
        rc, text = _verify(capsys, copy, *extra)
        assert rc == 1 and "integrity check fails" in text


def test_a_text_cell_swapped_for_the_same_bytes_fails_verify(copy, capsys):
    # red-team finding: the BLOB x'6869' hashed like the text "b'hi'" (canonical_json(default=str)), so verify passed
    db = sqlite3.connect(copy)
    seq, content = db.execute("SELECT seq, content FROM turns WHERE content IS NOT NULL ORDER BY seq LIMIT 1").fetchone()
    db.close()
    tamper(copy, f"UPDATE turns SET content = CAST(content AS BLOB) WHERE seq = {seq}")
    rc, text = _verify(capsys, copy)
    assert rc == 1 and f"turns row seq={seq} holds a binary value" in text, (content, text)


def test_reading_a_binary_cell_is_one_sentence_not_a_traceback(copy, capsys):
    db = sqlite3.connect(copy)
    seq, run_id = db.execute("SELECT seq, run_id FROM turns WHERE content IS NOT NULL ORDER BY seq LIMIT 1").fetchone()
    db.close()
    tamper(copy, f"UPDATE turns SET content = CAST(content AS BLOB) WHERE seq = {seq}")
    rc, _, err = cli(capsys, "review", run_id, "--ledger", copy)
    assert_one_sentence_error(rc, err)
    assert "binary content" in err


def test_a_ledger_whose_creation_was_cut_short_says_how_to_finish_it(tmp_path, capsys):
    # red-team finding: killed between creating _migrations and m001, every read said "restore it from a copy"
    path = tmp_path / "ledger.sqlite"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    db.commit()
    db.close()
    for command in (("ledger", "verify"), ("ledger", "head"), ("export",)):
        rc, _, err = cli(capsys, *command, "--ledger", path)
        assert_one_sentence_error(rc, err)
        assert "creation was cut short" in err and "harness ledger migrate" in err
    assert cli(capsys, "ledger", "migrate", "--ledger", path)[0] == 0
    assert _verify(capsys, path)[0] == 0
