"""`harness export`, `harness ledger verify` and `harness rescore` on the command line.

Red-team regression tests: a damaged or foreign ledger, or an unusable --out, is one sentence on
stderr and a non-zero exit, never a traceback, and loses nothing already recorded.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys

import pytest

from harness.cli import main
from harness.ledger import Ledger
from tests.helpers import REPO, assert_one_sentence_error, cli, finished_ledger, ledger_counts
from tests.ledger_builders import add_run


# red-team finding: export --out onto the ledger truncated it
def test_export_out_onto_the_ledger_itself_loses_nothing(tmp_path, scenario, capsys):
    # `harness export --out` opens the output with "w" while the ledger is open: the ledger is
    # truncated to 0 bytes (every run lost) and the export then dies with
    # sqlite3.DatabaseError: database disk image is malformed.
    ledger = finished_ledger(tmp_path, scenario)
    with Ledger(ledger, readonly=True) as before:
        counts = ledger_counts(before)
    try:
        rc = main(["export", "--ledger", str(ledger), "--out", str(ledger)])
    except Exception as exc:  # noqa: BLE001 - the traceback is part of the finding, the loss is the point
        rc = exc
    with Ledger(ledger, readonly=True) as after:
        assert ledger_counts(after) == counts
        assert after.verify().ok
    assert isinstance(rc, int) and rc != 0


# red-team finding: export --out to an unwritable place was a traceback
@pytest.mark.parametrize("target", ["dir", "missing-parent"])
def test_export_out_to_an_unwritable_place_is_a_clean_error(tmp_path, scenario, capsys, target):
    # IsADirectoryError / FileNotFoundError tracebacks from args.out.open("w")
    ledger = finished_ledger(tmp_path, scenario)
    out = tmp_path if target == "dir" else tmp_path / "no" / "such" / "x.jsonl"
    rc, _, err = cli(capsys, "export", "--ledger", ledger, "--out", out)
    assert_one_sentence_error(rc, err)


# red-team finding: a migrations-only SQLite file passed as a ledger
def test_export_of_an_sqlite_file_with_only_a_migrations_table_is_a_clean_error(tmp_path, capsys):
    # passes the "is it a ledger" test, then sqlite3.OperationalError: no such table: turns
    path = tmp_path / "fake.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    db.commit()
    db.close()
    rc, _, err = cli(capsys, "export", "--ledger", path)
    assert_one_sentence_error(rc, err)
    rc, _, err = cli(capsys, "ledger", "verify", "--ledger", path)
    assert rc != 0  # "OK, 0 rows verified" for a file with none of the ledger's tables is misleading


def test_guard_damaged_ledgers_are_one_sentence(tmp_path, scenario, capsys):
    ledger = finished_ledger(tmp_path, scenario)
    truncated = tmp_path / "truncated.sqlite"
    data = ledger.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    other = tmp_path / "other.sqlite"
    db = sqlite3.connect(other)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    for path in (truncated, other, tmp_path, tmp_path / "missing.sqlite"):
        for argv in (["ledger", "verify"], ["export"]):
            rc, _, err = cli(capsys, *argv, "--ledger", path)
            assert_one_sentence_error(rc, err)
    assert ledger.read_bytes()[:16] == b"SQLite format 3\x00"


def test_guard_export_of_an_empty_ledger_and_rescore_of_an_unfinished_run(tmp_path, scenario, capsys):
    ledger = tmp_path / "fresh.sqlite"
    assert cli(capsys, "ledger", "migrate", "--ledger", ledger)[0] == 0
    rc, out, _ = cli(capsys, "export", "--ledger", ledger, "--format", "csv")
    assert rc == 0 and out.startswith("run_id,")
    # an unfinished run: one turn, no end row (as after kill -9)
    finished = finished_ledger(tmp_path / "f", scenario)
    db = sqlite3.connect(finished)
    db.execute("DROP TRIGGER run_ends_no_delete")
    db.execute("DELETE FROM run_ends")  # the tail of a chain: still a valid (shorter) chain
    db.execute("CREATE TRIGGER run_ends_no_delete BEFORE DELETE ON run_ends BEGIN SELECT RAISE(ABORT, 'x'); END")
    db.commit()
    db.close()
    rc, out, _ = cli(capsys, "rescore", "--ledger", finished, "--force")
    assert rc == 0 and "3 turns re-classified" in out


def test_ledger_migrate_says_whether_it_created_upgraded_or_found_it_current(tmp_path, capsys):
    new = tmp_path / "new.sqlite"
    assert main(["ledger", "migrate", "--ledger", str(new)]) == 0
    assert capsys.readouterr().out.startswith(f"{new}: created, schema m001_initial")
    assert main(["ledger", "migrate", "--ledger", str(new)]) == 0
    assert capsys.readouterr().out.startswith(f"{new}: schema already up to date")
    old = tmp_path / "old.sqlite"
    old.write_bytes((REPO / "tests" / "data" / "ledger_m003.sqlite").read_bytes())
    assert main(["ledger", "migrate", "--ledger", str(old)]) == 0
    assert capsys.readouterr().out.startswith(
        f"{old}: upgraded, applied m004_turn_reasoning, m005_blobs, m006_turn_server_rejection, m007_wire_settings,"
        " m008_streaming, m009_templates, m010_report_index, m011_merge_provenance, m012_mode_index, m013_drop_turns_run;"
    )


def _edited_ledger(tmp_path, **columns):
    """A one-run ledger whose turns row was edited behind the dropped triggers' back."""
    from tests.ledger_builders import SMALL, add_run

    path = tmp_path / "edited.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "r1", model=SMALL, turns=[(["raw_json_in_content"], "x")])
    db = sqlite3.connect(path)
    for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        db.execute(f"DROP TRIGGER {name}")
    for column, value in columns.items():
        db.execute(f"UPDATE turns SET {column} = ?", (value,))
    db.commit()
    db.close()
    return path


# red-team finding: a ledger edited to hold text that is not JSON, or JSON of the wrong shape,
# made export, report and review a traceback
@pytest.mark.parametrize(
    "columns", [{"failure_modes": "{bad"}, {"executed_calls": '"str"'}, {"recovered_calls": '{"a": 1}'}, {"details": "[1, 2]"}]
)
@pytest.mark.parametrize("command", [["export"], ["report", "--format", "md"], ["review", "r1"], ["rescore"]])
def test_an_edited_json_column_is_one_sentence_never_a_traceback(tmp_path, capsys, columns, command):
    path = _edited_ledger(tmp_path, **columns)
    extra = ["--out", str(tmp_path / "rep")] if command[0] == "report" else []
    rc, out, err = cli(capsys, *command, "--ledger", path, *extra)
    if "failure_modes" not in columns and command[0] in ("export", "report"):
        assert (rc, err) == (0, "")  # export and report do not read calls or details
        return
    assert_one_sentence_error(rc, err)
    assert "harness ledger verify" in err


# red team (stop 29): a path from the user's command line reached the terminal raw in these lines
def test_ledger_and_scenario_commands_escape_paths(tmp_path, capsys):
    ledger = tmp_path / "l\x1b[2J.sqlite"
    outputs = [cli(capsys, "ledger", "migrate", "--ledger", ledger), cli(capsys, "ledger", "verify", "--ledger", ledger)]
    scenario = tmp_path / "s\x1b[31m.toml"
    scenario.write_text((REPO / "scenarios" / "list_and_report.toml").read_text(encoding="utf-8"), encoding="utf-8")
    broken = tmp_path / "b\x1b[31m.toml"
    broken.write_text("name = 1\n", encoding="utf-8")
    outputs += [cli(capsys, "scenarios", "check", scenario), cli(capsys, "scenarios", "check", broken)]
    assert [rc for rc, _, _ in outputs] == [0, 0, 0, 1]
    for _, out, err in outputs:
        assert "\x1b" not in out + err and "\\x1b" in out + err, (out, err)


# red team: the same, in the lines of rescore, export --out, report --out, view --export, view and compare
def test_report_export_view_rescore_and_compare_escape_paths_and_models(tmp_path, capsys):
    ledger = tmp_path / "l\x1b[2J.sqlite"
    with Ledger(ledger) as opened:
        add_run(opened, "a", model="openai:x\x1b[31m@http://h:1/v1", turns=[(["empty_reply"], "")], outcome="task_failed")
        add_run(opened, "b", model="openai:y@http://h:1/v1")
    outputs = [
        cli(capsys, "rescore", "--ledger", ledger),
        cli(capsys, "export", "--ledger", ledger, "--out", tmp_path / "e\x1b[31m.csv"),
        cli(capsys, "report", "--ledger", ledger, "--out", tmp_path / "r\x1b[31m", "--format", "md"),
        cli(capsys, "view", "--ledger", ledger, "--export", tmp_path / "v\x1b[31m"),
        cli(capsys, "compare", "openai:x\x1b[31m@http://h:1/v1", "openai:y@http://h:1/v1", "--ledger", ledger),
    ]
    assert [rc for rc, _, _ in outputs] == [0, 0, 0, 0, 0]
    for _, out, err in outputs:
        assert "\x1b" not in out + err and "\\x1b" in out + err, (out, err)
    served = subprocess.Popen([sys.executable, "-m", "harness", "view", "--ledger", str(ledger)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = served.stdout.readline() if served.stdout else ""
    finally:
        served.send_signal(signal.SIGINT)
        served.communicate(timeout=60)
    assert line.startswith("Serving ") and "l\\x1b[2J.sqlite" in line and "\x1b" not in line, line


# red team: a ledger a newer harness wrote (a migration this one does not know) was refused only by `ledger verify`;
# run, rescore and migrate wrote into it
@pytest.mark.parametrize(
    "command",
    [
        ["rescore"],
        ["ledger", "migrate"],
        ["run", "--model", "replay:/dev/null"],
        ["attest", "r1", "--reviewer", "me"],
        ["run", "--model", "replay:/dev/null", "--dry-run"],
    ],  # red team 2: the dry run said "1 to run"
)
def test_a_ledger_from_a_newer_harness_is_never_written(tmp_path, capsys, command):
    from tests.ledger_builders import SMALL

    path = tmp_path / "newer.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "r1", model=SMALL, turns=[(["raw_json_in_content"], "x")])
    db = sqlite3.connect(path)
    db.execute("INSERT INTO _migrations VALUES ('m999_future', '2099-01-01T00:00:00.000+00:00')")
    db.commit()
    db.close()
    before = path.read_bytes()
    rc, out, err = cli(capsys, *command, "--ledger", path)
    assert_one_sentence_error(rc, err)
    assert err == (f"harness: the ledger {path} lists the migration 'm999_future', which this harness does not know: a "
                   "newer harness wrote it (or the table was edited); upgrade harness to write to it.\n")  # fmt: skip
    assert path.read_bytes() == before
    rc, out, err = cli(capsys, "export", "--runs", "--ledger", path)  # reading it still works
    assert (rc, err, out.count("\n")) == (0, "", 1)


# red team: rescore made an empty file into a ledger, and said a missing one with exit 2 where the others say 1
def test_rescore_refuses_an_empty_or_missing_ledger_as_the_readers_do(tmp_path, capsys):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    rc, out, err = cli(capsys, "rescore", "--ledger", empty)
    assert (rc, err) == (1, f"harness: {empty} is empty, not a harness ledger; run `harness run` first.\n")
    assert empty.read_bytes() == b""
    missing = tmp_path / "missing.sqlite"
    rc, out, err = cli(capsys, "rescore", "--ledger", missing)
    assert (rc, err) == (1, f"harness: no ledger at {missing}; run `harness run` first or pass --ledger PATH.\n")
    assert not missing.exists()
