"""The ledger: append-only enforced by SQLite, hash-chained, verifiable, migrated on open.

Also holds the red-team regression tests for damaged ledgers: `harness ledger verify` must fail on
an edited row or on whole tables dropped.
"""

from __future__ import annotations

import shutil
import sqlite3
import threading
from pathlib import Path

import pytest

from harness.errors import LedgerError
from harness.ledger import Attempt, Attestation, Labels, Ledger, RunEnd, RunStart, TurnRecord, record_fields
from tests.helpers import cli, finished_ledger
from tests.ledger_builders import SMALL, add_run
from tests.ledger_tamper import tamper


def run_start(run_id: str = "r1", **overrides) -> RunStart:
    values = dict(
        run_id=run_id, identity="id-" + run_id, scenario="s", scenario_path="s.toml", scenario_hash="h", model="replay:x",
        backend="replay", base_url=None, server_version=None, model_digest="sha256:abc", temperature=0.7, seed=1,
        max_tokens=64, num_ctx=2048, tool_mode="native", parser="lenient", repetition=0, turn_limit=8,
        token_limit=1000, harness_version="0.1.0", git_sha=None, git_dirty=None, sandbox="/tmp/x",
    )  # fmt: skip
    values.update(overrides)
    return RunStart(**values)


def turn(run_id: str = "r1", n: int = 1, **overrides) -> TurnRecord:
    values = dict(
        run_id=run_id, turn=n, request_hash="rh", raw_reply={"choices": [{"message": {"content": "hé"}}]}, content="hé",
        tool_calls=None, recovered_calls=[], executed_calls=[], failure_modes=["narration_without_call"],
        recovered_by=None, classifier_version="1", finish_reason="stop", prompt_tokens=12, completion_tokens=3,
        latency_ms=12.5, started_at="2026-11-30T00:00:00.000+00:00", ended_at="2026-11-30T00:00:01.000+00:00",
    )  # fmt: skip
    values.update(overrides)
    return TurnRecord(**values)


def run_end(run_id: str = "r1", outcome: str = "task_failed") -> RunEnd:
    return RunEnd(
        run_id=run_id, outcome=outcome, turns=2, prompt_tokens=24, completion_tokens=6, breach=None, error=None,
        checks=[{"check": "file_exists", "passed": False, "detail": "report.txt does not exist"}], final_answer="hé",
        escape_attempts=[], files_written=[],
    )  # fmt: skip


@pytest.fixture
def filled(ledger_path):
    with Ledger(ledger_path) as ledger:
        ledger.start_run(run_start())
        ledger.record_turn(turn(n=1))
        ledger.record_turn(turn(n=2, content="second"))
        ledger.end_run(run_end())
    return ledger_path


ALL_MIGRATIONS = [
    "m001_initial",
    "m002_attestations",
    "m003_attempts",
    "m004_turn_reasoning",
    "m005_blobs",
    "m006_turn_server_rejection",
    "m007_wire_settings",
    "m008_streaming",
    "m009_templates",
    "m010_report_index",
    "m011_merge_provenance",
    "m012_mode_index",
    "m013_drop_turns_run",
]
#: what a ledger written by the first three migrations (tests/data/ledger_m003.sqlite) still lacks
AFTER_M003 = ALL_MIGRATIONS[3:]
OLD_LEDGER = Path(__file__).resolve().parent / "data" / "ledger_m003.sqlite"
"""A ledger written by the harness before m004 (one run, two turns), kept as a real old file."""


def test_blank_ledger_gets_the_whole_schema(ledger_path):
    with Ledger(ledger_path) as ledger:
        assert ledger.applied_migrations() == ALL_MIGRATIONS
        assert ledger.migrate() == []  # second open: nothing pending
        assert ledger.verify().ok
    db = sqlite3.connect(ledger_path)
    cols = {r[1] for r in db.execute("PRAGMA table_info(turns)")}
    assert set(record_fields(TurnRecord)) <= cols
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_rows_round_trip(filled):
    with Ledger(filled, readonly=True) as ledger:
        [run] = ledger.runs()
        assert (run.run_id, run.outcome, run.start.temperature, run.end.turns) == ("r1", "task_failed", 0.7, 2)
        turns = ledger.turns("r1")
        assert [t.record.turn for t in turns] == [1, 2]
        assert turns[0].record.raw_reply == {"choices": [{"message": {"content": "hé"}}]}
        assert turns[0].record.started_at.endswith("+00:00")
        rows = list(ledger.export_rows())
        assert rows[1]["failure_modes"] == ["narration_without_call"] and rows[1]["outcome"] == "task_failed"


@pytest.mark.parametrize("table", ["runs", "turns", "run_ends", "labels", "attestations", "attempts", "_migrations"])
def test_update_and_delete_are_rejected(filled, table):
    db = sqlite3.connect(filled)
    with Ledger(filled) as ledger:
        ledger.record_labels(
            Labels(
                run_id="r1", turn=1, classifier_version="2", failure_modes=[], recovered_calls=[], recovered_by=None, details={}
            )
        )
        ledger.record_attestation(Attestation(run_id="r1", reviewer="ann", notes=None, frame_sha256="f" * 64))
        ledger.record_attempt(
            Attempt(
                run_id="r1", turn=1, attempt=1, error_type="BackendTimeout", error="slow", status_code=None, retry_in_ms=500.0
            )
        )
    column = "name" if table == "_migrations" else "run_id"
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute(f"UPDATE {table} SET {column} = 'x'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        db.execute(f"DELETE FROM {table}")
    db.close()
    with Ledger(filled) as ledger:
        assert ledger.verify().ok


def _tamper(path, sql):
    tamper(path, sql)  # the triggers are put back text for text, as a careful forger would


def test_verify_names_an_edited_row(filled):
    _tamper(filled, "UPDATE turns SET content = 'forged' WHERE turn = 1")
    with Ledger(filled) as ledger:
        result = ledger.verify()
    assert not result.ok
    assert result.problem == "turns row seq=1 (run r1, turn 1): row_hash does not match its content (the row was edited)"


def test_verify_names_the_row_after_a_deleted_one(filled):
    _tamper(filled, "DELETE FROM turns WHERE turn = 1")
    with Ledger(filled) as ledger:
        result = ledger.verify()
    assert not result.ok and result.problem.startswith("turns row seq=2 (run r1, turn 2): prev_hash does not match")


def test_verify_notices_dropped_triggers(filled):
    db = sqlite3.connect(filled)
    db.execute("DROP TRIGGER runs_no_delete")
    db.commit()
    db.close()
    with Ledger(filled, readonly=True) as ledger:
        assert ledger.verify().problem == "the append-only trigger runs_no_delete is missing"


def test_a_run_ends_once(filled):
    with Ledger(filled) as ledger, pytest.raises(LedgerError, match="UNIQUE"):
        ledger.end_run(run_end())


def test_newest_labels_win(filled):
    with Ledger(filled) as ledger:
        ledger.record_labels(Labels(run_id="r1", turn=2, classifier_version="9", failure_modes=["empty_response"],
                                    recovered_calls=[], recovered_by=None, details={}))  # fmt: skip
        turns = ledger.turns("r1")
        assert [t.labels for t in turns] == [["narration_without_call"], ["empty_response"]]
        assert [r["failure_modes"] for r in ledger.export_rows()] == [["narration_without_call"], ["empty_response"]]
        assert ledger.verify().ok


def test_not_a_database(tmp_path):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(LedgerError, match="is not a readable SQLite ledger"):
        Ledger(bad)
    assert bad.read_bytes() == b"this is not sqlite at all" * 100  # nothing overwritten


def test_foreign_sqlite_file_is_refused(tmp_path):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(LedgerError, match="not a harness ledger"):
        Ledger(other)


def test_missing_ledger_readonly(tmp_path):
    with pytest.raises(LedgerError, match="no ledger at"):
        Ledger(tmp_path / "none.sqlite", readonly=True)


def test_concurrent_writers_keep_the_chain(ledger_path):
    ledger = Ledger(ledger_path)
    for i in range(16):
        ledger.start_run(run_start(f"r{i}"))

    def write(i: int) -> None:
        other = Ledger(ledger_path)  # a connection per thread, like separate processes
        for n in range(1, 21):
            other.record_turn(turn(f"r{i}", n))
        other.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ledger.row_counts()["turns"] == 320
    result = ledger.verify()
    assert result.ok and result.rows == 336
    ledger.close()


def test_attestations_are_chained_and_verified(filled):
    with Ledger(filled) as ledger:
        ledger.record_attestation(Attestation(run_id="r1", reviewer="ann", notes="looks right", frame_sha256="a" * 64))
        ledger.record_attestation(Attestation(run_id="r1", reviewer="bob", notes=None, frame_sha256="b" * 64))
        assert [(a.reviewer, a.notes) for a in ledger.attestations("r1")] == [("ann", "looks right"), ("bob", None)]
    db = sqlite3.connect(filled)
    rows = db.execute("SELECT prev_hash, row_hash FROM attestations ORDER BY seq").fetchall()
    db.close()
    assert rows[1][0] == rows[0][1]
    with Ledger(filled) as ledger:
        assert ledger.verify().ok and ledger.verify().rows == 6
    tamper(filled, "UPDATE attestations SET reviewer = 'eve' WHERE seq = 1")
    with Ledger(filled, readonly=True) as ledger:
        assert (
            ledger.verify().problem == "attestations row seq=1 (run r1): row_hash does not match its content (the row was edited)"
        )


def test_a_m001_ledger_verifies_read_only_and_migrates_on_write(filled, monkeypatch):
    from harness.ledger import migrations

    filled.unlink()
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:1])
    with Ledger(filled) as ledger:  # written by a harness that knew only m001
        ledger.start_run(run_start())
        ledger.record_turn(turn(n=1))
        ledger.end_run(run_end())
    monkeypatch.undo()
    with Ledger(filled, readonly=True) as ledger:
        assert ledger.verify().ok  # the old schema is still a valid ledger
    with Ledger(filled) as ledger:
        assert sorted(ledger.applied_migrations()) == ALL_MIGRATIONS
        ledger.record_attestation(Attestation(run_id="r1", reviewer="ann", notes=None, frame_sha256="a" * 64))
        assert ledger.verify().ok


# -- red-team: damaged ledgers fail verify ----------------------------------------------------------------
# red-team finding: a ledger with whole tables dropped verified OK
@pytest.mark.parametrize("tables", [("run_ends",), ("labels", "attempts"), ("turns", "run_ends")])
def test_ledger_verify_fails_when_whole_tables_were_dropped(tmp_path, scenario, capsys, tables):
    # A readonly Ledger keeps only the tables that exist ("older read-only ledgers"), so deleting
    # every outcome by dropping run_ends leaves a ledger that `harness ledger verify` calls OK.
    ledger = finished_ledger(tmp_path, scenario)
    db = sqlite3.connect(ledger)
    for table in tables:
        db.execute(f"DROP TABLE {table}")
    db.commit()
    db.close()
    rc, out, err = cli(capsys, "ledger", "verify", "--ledger", ledger)
    assert rc == 1, out


def test_guard_tampered_row_fails_verify(tmp_path, scenario, capsys):
    ledger = finished_ledger(tmp_path, scenario)
    tamper(ledger, "UPDATE turns SET content = 'hacked' WHERE seq = 1")
    rc, _, err = cli(capsys, "ledger", "verify", "--ledger", ledger)
    assert rc == 1 and "turns row seq=1" in err


def test_rows_written_before_a_column_was_added_still_verify(tmp_path, capsys):
    from harness.cli import main

    path = tmp_path / "old.sqlite"
    shutil.copyfile(OLD_LEDGER, path)
    with Ledger(path, readonly=True) as ledger:
        assert ledger.pending_migrations() == AFTER_M003
        assert ledger.verify().ok
        assert [t.record.reasoning for t in ledger.turns("old1")] == [None, None]
    assert main(["ledger", "verify", "--ledger", str(path)]) == 0
    assert "`harness ledger migrate --ledger" in capsys.readouterr().err  # read-only opens say what to run
    with Ledger(path) as ledger:  # a writable open migrates: turns gains the reasoning column
        assert ledger.applied_migrations() == ALL_MIGRATIONS
        ledger.record_turn(turn("old1", 3, content="third", reasoning="I should answer now."))
        assert ledger.verify().ok  # old rows hash without the new column, new rows with it
        assert [t.record.reasoning for t in ledger.turns("old1")] == [None, None, "I should answer now."]
    tamper(path, "UPDATE turns SET reasoning = 'forged' WHERE turn = 1")  # a value where the old row had none
    with Ledger(path, readonly=True) as ledger:
        assert (
            ledger.verify().problem
            == "turns row seq=1 (run old1, turn 1): row_hash does not match its content (the row was edited)"
        )


# red-team finding: an honest ledger failed to verify when a number's type differed from its
# column's (latency 0 stored as 0.0, a temperature of -0.0, a token count sent as 5.0)
@pytest.mark.parametrize(("temperature", "latency"), [(0, 0), (-0.0, -0.0), (1, 5), (0.7, 12.0)])
def test_numbers_of_another_type_than_their_column_still_verify(tmp_path, temperature, latency):
    with Ledger(tmp_path / "l.sqlite") as ledger:
        add_run(ledger, "r1", model=SMALL, temperature=temperature, latency=latency)
        assert ledger.verify().ok, ledger.verify().problem
        assert ledger.turns()[0].record.latency_ms == float(latency)


# red-team finding: SQLite refusing a migration was a traceback
def test_a_migration_sqlite_refuses_is_one_sentence_and_applies_nothing(tmp_path, capsys):
    import sqlite3

    path = tmp_path / "old.sqlite"
    path.write_bytes((Path(__file__).parent / "data" / "ledger_m003.sqlite").read_bytes())
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE turns ADD COLUMN reasoning TEXT")  # what m004 adds: the edit makes m004 fail
    db.commit()
    db.close()
    rc, _out, err = cli(capsys, "ledger", "migrate", "--ledger", path)
    assert rc != 0 and err.startswith("harness: cannot bring the ledger at") and err.count("\n") == 1
    with Ledger(path, readonly=True) as ledger:
        assert ledger.pending_migrations() == AFTER_M003


# red-team finding: an edited column history made `ledger verify` a traceback
def test_an_edited_column_history_fails_verification_in_one_sentence(tmp_path, capsys):

    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "r1", model=SMALL)
    tamper(path, "UPDATE _added_columns SET last_seq_without = 'abc'")
    rc, _out, err = cli(capsys, "ledger", "verify", "--ledger", path)
    assert rc == 1 and "_added_columns was edited" in err and err.count("\n") == 1


def test_the_report_reads_scan_the_covering_index_of_m010(filled):
    from harness.ledger.report_reads import RUN_TURN_TOTALS, TURN_LATENCIES

    db = sqlite3.connect(filled)
    before = db.execute("SELECT seq, row_hash FROM turns ORDER BY seq").fetchall()
    for sql in (RUN_TURN_TOTALS, TURN_LATENCIES):
        plan = " ".join(row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql))
        assert "COVERING INDEX turns_report" in plan and "TEMP B-TREE" not in plan, plan
    db.close()
    with Ledger(filled, readonly=True) as ledger:
        assert ledger.verify().ok  # the index changed no row: the chain still verifies
    db = sqlite3.connect(filled)
    assert db.execute("SELECT seq, row_hash FROM turns ORDER BY seq").fetchall() == before
    db.close()


def test_the_mode_reads_scan_the_partial_index_of_m011_and_change_no_row(filled, tmp_path):
    from harness.ledger.blobs import content_length_sql
    from harness.ledger.migrations import INDEXED_REPLY_CHARS
    from harness.ledger.report_reads import MODE_TEXT_COUNTS, MODE_TEXT_REFS, MODE_TEXT_SHORTEST

    old = tmp_path / "before_m012.sqlite"
    old.write_bytes(filled.read_bytes())
    db = sqlite3.connect(old)
    db.execute("DROP INDEX turns_modes")  # the ledger as it was before m012 (an index holds no chained row)
    db.execute("CREATE INDEX turns_run ON turns(run_id)")  # and before m013
    (trigger,) = db.execute("SELECT sql FROM sqlite_master WHERE name = '_migrations_no_delete'").fetchone()
    db.execute("DROP TRIGGER _migrations_no_delete")
    db.execute("DELETE FROM _migrations WHERE name IN ('m012_mode_index', 'm013_drop_turns_run')")
    db.execute(trigger)
    db.commit()
    before = db.execute("SELECT seq, row_hash FROM turns ORDER BY seq").fetchall()
    db.close()
    with Ledger(old, readonly=True) as ledger:
        assert ledger.pending_migrations() == ["m012_mode_index", "m013_drop_turns_run"]
        unindexed = ledger.mode_reads()
    with Ledger(old) as ledger:  # a writable open applies it
        assert ledger.pending_migrations() == [] and ledger.verify().ok  # the chains still verify
    db = sqlite3.connect(old)
    assert db.execute("SELECT seq, row_hash FROM turns ORDER BY seq").fetchall() == before
    counts = MODE_TEXT_COUNTS.format(own="")
    for sql in (counts, MODE_TEXT_SHORTEST.format(chars=INDEXED_REPLY_CHARS, own=""),
                MODE_TEXT_REFS.format(exact=content_length_sql(True), chars=INDEXED_REPLY_CHARS, own="")):  # fmt: skip
        assert "INDEX turns_modes" in " ".join(row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql))
    assert "COVERING INDEX turns_modes" in " ".join(row[3] for row in db.execute("EXPLAIN QUERY PLAN " + counts))
    db.close()
    with Ledger(old, readonly=True) as ledger:
        indexed = ledger.mode_reads()
    assert len(indexed[0]) == 1 and indexed[1]["mode"].tolist() == ["narration_without_call"]
    for got, want in zip(indexed, unindexed, strict=True):
        assert got.to_dict("records") == want.to_dict("records")


def _turn_reads_sql(path: Path) -> list[str]:
    """Every statement reading ``turns`` by run that the named reads run (the loop's, the viewer's, rescore's, export's)."""
    from harness.ledger import RunFilter

    seen: list[str] = []
    with Ledger(path, readonly=True) as ledger:
        ledger._db.set_trace_callback(seen.append)
        ledger.turns("r1")
        ledger.turn_totals("r1")
        ledger.run_turns("r1")
        ledger.run_list(RunFilter(failure_mode="narration_without_call"))
        ledger._db.set_trace_callback(None)
    return sorted({sql for sql in seen if "FROM turns" in sql and "run_id" in sql})


def test_m013_drops_turns_run_and_every_read_by_run_still_searches_an_index(filled, tmp_path):
    old = tmp_path / "before_m013.sqlite"
    old.write_bytes(filled.read_bytes())
    db = sqlite3.connect(old)
    db.execute("CREATE INDEX turns_run ON turns(run_id)")  # the ledger as it was before m013
    (trigger,) = db.execute("SELECT sql FROM sqlite_master WHERE name = '_migrations_no_delete'").fetchone()
    db.execute("DROP TRIGGER _migrations_no_delete")
    db.execute("DELETE FROM _migrations WHERE name = 'm013_drop_turns_run'")
    db.execute(trigger)
    db.commit()
    before = db.execute("SELECT * FROM turns ORDER BY seq").fetchall()
    db.close()
    with Ledger(old, readonly=True) as ledger:
        assert ledger.pending_migrations() == ["m013_drop_turns_run"] and ledger.verify().ok
        unindexed = [ledger.turns("r1"), ledger.run_turns("r1"), ledger.turn_totals("r1")]
    statements = _turn_reads_sql(old)
    with Ledger(old) as ledger:  # a writable open applies it
        assert ledger.pending_migrations() == [] and ledger.verify().ok  # the schema matches; the chains still verify
        assert [ledger.turns("r1"), ledger.run_turns("r1"), ledger.turn_totals("r1")] == unindexed
    db = sqlite3.connect(old)
    assert db.execute("SELECT * FROM turns ORDER BY seq").fetchall() == before
    assert not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'turns_run'").fetchone()
    assert len(statements) >= 4
    for sql in statements:
        plan = [row[3] for row in db.execute("EXPLAIN QUERY PLAN " + sql)]
        on_turns = [step for step in plan if step.startswith(("SEARCH t ", "SCAN t ", "SCAN t", "SEARCH turns", "SCAN turns"))]
        assert on_turns and all(step.startswith(("SEARCH t USING", "SEARCH turns USING")) and "INDEX" in step
                                for step in on_turns), (sql, plan)  # fmt: skip
    db.close()
