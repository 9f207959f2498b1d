"""Shards that merge (issue 16, section 3): `harness run --shard I/N` partitions a plan, and `harness ledger merge` joins
the shards' ledgers into one whose report is the unsharded matrix's report (timing aside), whose chains verify, which
records where each row came from, and against which an anchor taken on a shard still checks.

Real parts only: replay matrices through `harness run`, real SQLite files, tampering with plain sqlite3.
"""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import threading
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import UsageError
from harness.ledger import Labels, Ledger
from harness.matrix import MatrixOverrides
from harness.runner import expand_matrix
from harness.scenarios import load_scenario
from harness.shards import Shard, parse_shard
from harness.vocab import plural
from tests.helpers import CASSETTES, REPO, SCENARIO_FILE, assert_one_sentence_error, cli, report_csv_rows, scenario_toml
from tests.ledger_builders import SMALL, add_run
from tests.ledger_tamper import rechain, tamper

MODELS = [f"replay:{CASSETTES / 'list_and_report' / kind}.jsonl" for kind in ("ideal", "broken")]
MATRIX = [arg for m in MODELS for arg in ("--model", m)] + [
    "--temperature", "0", "--temperature", "0.5", "--parser", "strict", "--parser", "lenient", "--repeats", "3",
]  # fmt: skip
PLANNED = 2 * 2 * 2 * 3


def _run(ledger: Path, *extra: str, scenario: Path = SCENARIO_FILE) -> None:
    assert main(["run", str(scenario), *MATRIX, "--ledger", str(ledger), *extra]) == 0


def _anchor(path: Path) -> str:
    with Ledger(path, readonly=True) as ledger:
        return ledger.head().anchor


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The matrix run unsharded, the same matrix in 3 shards (shard 1 first run with 1 repetition, its head kept, then
    completed), and the shards merged."""
    root = tmp_path_factory.mktemp("shards")
    paths = {"whole": root / "whole.sqlite", "merged": root / "merged.sqlite"}
    _run(paths["whole"])
    for i in range(3):
        paths[f"shard{i}"] = root / f"shard-{i}.sqlite"
        if i == 1:
            _run(paths["shard1"], "--shard", "1/3", "--repeats", "1")
            (root / "shard-1.partial-head").write_text(_anchor(paths["shard1"]), encoding="utf-8")
        _run(paths[f"shard{i}"], "--shard", f"{i}/3")
    assert main(["ledger", "merge", str(paths["merged"]), *(str(paths[f"shard{i}"]) for i in range(3))]) == 0
    paths["partial_head"] = root / "shard-1.partial-head"
    return paths


def test_shards_partition_the_planned_runs():
    plans = expand_matrix([load_scenario(SCENARIO_FILE)], MatrixOverrides(MODELS, [0.0, 0.5], 3, parsers=["strict", "lenient"]))
    identities = [p.identity() for p in plans]
    assert len(set(identities)) == len(plans) == PLANNED
    for count in (1, 2, 3, 5, 50):
        shares = [Shard(i, count).select(plans) for i in range(count)]
        owned = [p.identity() for share in shares for p in share]
        assert sorted(owned) == sorted(identities), count  # every run in exactly one shard
    assert all(Shard(0, 2).select(plans) == Shard(0, 2).select(plans) for _ in range(3))


def test_dry_run_shows_each_shards_share_and_the_shares_add_up(tmp_path, capsys):
    total = 0
    for i in range(3):
        rc, out, _ = cli(
            capsys, "run", SCENARIO_FILE, *MATRIX, "--ledger", tmp_path / "l.sqlite", "--dry-run", "--shard", f"{i}/3"
        )
        assert rc == 0
        first, *listed, how, last = out.strip().splitlines()
        share = int(first.split(": ")[1].split(" of ")[0])
        assert first == f"Shard {i}/3: {share} of {PLANNED} planned runs (plan identity hash mod 3 = {i})."
        assert [line.split("]")[0] for line in listed] == [f"[{n}/{share}" for n in range(1, share + 1)]
        assert how.startswith("Execution: ") and last == f"{plural(share, 'run')} planned, 0 already done, {share} to run."
        total += share
    assert total == PLANNED and not (tmp_path / "l.sqlite").exists()


@pytest.mark.parametrize("value", ["3/3", "-1/3", "1/0", "0/0", "a/b", "1", "1/3/4", "0/100001", "", "\u0661/\u0662"])
def test_a_bad_shard_is_one_sentence_and_exit_2(tmp_path, capsys, value):
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, *MATRIX, "--ledger", tmp_path / "l.sqlite", f"--shard={value}")
    assert rc == 2
    assert_one_sentence_error(rc, err)
    assert "--shard" in err and not (tmp_path / "l.sqlite").exists()


def test_a_shard_count_far_too_large_is_named_as_too_large():
    """Red team: --shard 0/100000000000000000000000 said "is not I/N" instead of naming the limit."""
    with pytest.raises(UsageError, match=r"the shard count must be from 1 to 100,000\.$"):
        parse_shard("0/100000000000000000000000")
    with pytest.raises(UsageError, match="is not I/N"):
        parse_shard("0/" + "9" * 31)  # past any count: not read as a number at all


def test_parse_shard_reads_what_kubernetes_and_slurm_give():
    assert parse_shard("0/4") == Shard(0, 4) and parse_shard(" 3 / 4 ") == Shard(3, 4) and str(parse_shard("2/7")) == "2/7"


def test_the_merged_report_is_the_unsharded_report_except_timing(built, tmp_path, capsys):
    for name in ("whole", "merged"):
        assert main(["report", "--ledger", str(built[name]), "--out", str(tmp_path / name), "--format", "csv"]) == 0
    for table in ("summary.csv", "failure_modes.csv", "checks.csv", "runs.csv"):
        whole, merged = report_csv_rows(tmp_path / "whole" / table), report_csv_rows(tmp_path / "merged" / table)
        assert whole and merged == whole, table
    shards = [Ledger(built[f"shard{i}"], readonly=True) for i in range(3)]
    try:
        counts = [len(s.runs()) for s in shards]
        assert sum(counts) == PLANNED and all(counts)
    finally:
        for s in shards:
            s.close()


def test_the_merged_ledger_verifies_and_records_where_each_row_came_from(built, capsys):
    rc, out, _ = cli(capsys, "ledger", "verify", "--ledger", built["merged"])
    assert rc == 0 and "OK" in out
    db = sqlite3.connect(built["merged"])
    try:
        sources = db.execute("SELECT source, file, head, runs_kept FROM merge_sources ORDER BY seq").fetchall()
        assert [(s, f) for s, f, _, _ in sources] == [(1, "shard-0.sqlite"), (2, "shard-1.sqlite"), (3, "shard-2.sqlite")]
        assert [_anchor(built[f"shard{i}"]) in head for i, (_, _, head, _) in enumerate(sources)] == [True] * 3
        assert sum(kept for *_, kept in sources) == PLANNED
        for table in ("runs", "turns", "run_ends"):
            rows = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
            origins = db.execute(
                "SELECT COUNT(*) FROM merge_rows WHERE table_name = ? AND merged_seq IS NOT NULL", (table,)
            ).fetchone()[0]
            assert rows == origins > 0, table
        # each carried run's id is the one in the shard its origin names
        for i in range(3):
            shard = sqlite3.connect(built[f"shard{i}"])
            mine = {r[0] for r in shard.execute("SELECT run_id FROM runs")}
            shard.close()
            carried = {r[0] for r in db.execute(
                "SELECT r.run_id FROM runs r JOIN merge_rows m ON m.merged_seq = r.seq AND m.table_name = 'runs' WHERE m.source = ?",
                (i + 1,))}  # fmt: skip
            assert carried == mine
    finally:
        db.close()


def test_an_anchor_taken_on_a_shard_verifies_against_the_merged_ledger(built, capsys, tmp_path):
    for anchor in (_anchor(built["shard1"]), built["partial_head"]):
        rc, out, err = cli(capsys, "ledger", "verify", "--ledger", built["merged"], "--anchor", anchor)
        assert rc == 0, err
        assert "its merged input shard-1.sqlite extends the anchor" in out
    rc, _, err = cli(capsys, "ledger", "verify", "--ledger", built["merged"], "--anchor", _anchor(built["whole"]))
    assert rc == 1 and "anchor" in err
    # rows appended to the merged ledger later (a rescore) keep it verifying, and the shard's anchor still holds
    copy = tmp_path / "merged.sqlite"
    shutil.copyfile(built["merged"], copy)
    assert main(["rescore", "--ledger", str(copy), "--force"]) == 0
    rc, out, _ = cli(capsys, "ledger", "verify", "--ledger", copy, "--anchor", _anchor(built["shard0"]))
    assert rc == 0 and "shard-0.sqlite extends" in out


def test_a_carried_row_edited_after_the_merge_fails_even_with_its_chain_recomputed(built, capsys, tmp_path):
    copy = tmp_path / "merged.sqlite"
    shutil.copyfile(built["merged"], copy)
    tamper(copy, "UPDATE turns SET content = 'forged' WHERE seq = 2")
    rechain(copy, "turns")  # the merged file's own chain is whole again
    rc, _, err = cli(capsys, "ledger", "verify", "--ledger", copy)
    assert rc == 1 and "turns row seq=2 no longer has the content its input had" in err


def _merge_refused(capsys, out: Path, *inputs: Path) -> str:
    capsys.readouterr()  # what ran before
    rc, _, err = cli(capsys, "ledger", "merge", out, *inputs)
    assert_one_sentence_error(rc, err)
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.merging-*"))
    return err


def test_merge_refuses_an_existing_out(built, capsys, tmp_path):
    out = tmp_path / "out.sqlite"
    out.write_bytes(b"keep me")
    rc, _, err = cli(capsys, "ledger", "merge", out, built["shard0"])
    assert_one_sentence_error(rc, err)
    assert "already exists" in err and out.read_bytes() == b"keep me"
    assert "named twice" in _merge_refused(capsys, tmp_path / "o.sqlite", built["shard0"], built["shard0"])
    assert "is a file" in _merge_refused(capsys, out / "o.sqlite", built["shard0"])  # OUT's folder is a file
    assert "no ledger at" in _merge_refused(capsys, tmp_path / "o.sqlite", built["shard0"], tmp_path / "missing.sqlite")


def test_merge_refuses_one_file_under_two_hard_links_and_a_dangling_symlink_out(built, capsys, tmp_path):
    """Found by red22: a hard link passed as a second input was merged as another shard; a dangling symlink at OUT was
    said to have "appeared while merging"."""
    link = tmp_path / "same-shard.sqlite"
    os.link(built["shard0"], link)
    err = _merge_refused(capsys, tmp_path / "o.sqlite", built["shard0"], link)
    assert f"{link} is named twice (also as {built['shard0']})" in err
    dangling = tmp_path / "dangling.sqlite"
    dangling.symlink_to(tmp_path / "nowhere.sqlite")
    rc, _, err = cli(capsys, "ledger", "merge", dangling, built["shard0"])
    assert_one_sentence_error(rc, err)
    assert "is a symbolic link" in err and dangling.is_symlink() and not (tmp_path / "nowhere.sqlite").exists()


def test_an_input_still_being_written_merges_as_one_snapshot(tmp_path, capsys):
    """Found by red22: an input that a run appended to during the merge was verified and its head read in one
    snapshot and its rows copied in another, so the merge failed its own check and blamed an edited merge_rows."""
    live, other = tmp_path / "live.sqlite", tmp_path / "other.sqlite"
    with Ledger(other) as ledger:
        add_run(ledger, "o-0", model=SMALL, identity="o0")
    with Ledger(live) as ledger:
        for i in range(300):
            add_run(ledger, f"r-{i}", model=SMALL, identity=f"i{i}", turns=[([], "x" * 50)] * 3)
    stop = threading.Event()

    def append() -> None:
        with Ledger(live) as ledger:
            for i in itertools.count(300):
                if stop.is_set():
                    return
                add_run(ledger, f"r-{i}", model=SMALL, identity=f"i{i}")

    writer = threading.Thread(target=append)
    writer.start()
    try:
        results = [cli(capsys, "ledger", "merge", tmp_path / f"out-{n}.sqlite", live, other) for n in range(4)]
    finally:
        stop.set()
        writer.join()
    assert [(rc, err) for rc, _, err in results] == [(0, "")] * 4
    for n in range(4):
        with Ledger(tmp_path / f"out-{n}.sqlite", readonly=True) as merged:
            assert merged.verify().ok and merged.row_counts()["runs"] > 300


def test_merge_refuses_a_tampered_input(built, capsys, tmp_path):
    copy = tmp_path / "shard-1.sqlite"
    shutil.copyfile(built["shard1"], copy)
    tamper(copy, "UPDATE turns SET content = 'forged' WHERE seq = 1")
    err = _merge_refused(capsys, tmp_path / "out.sqlite", built["shard0"], copy)
    assert f"{copy} fails verification (turns row seq=1" in err


def test_merge_refuses_a_shard_a_newer_harness_wrote_as_the_other_commands_do(built, capsys, tmp_path):
    """Red team: a shard listing a migration this harness does not know "fails verification (... (... upgrade
    harness)); restore it or re-run its shard": the shard is sound, this harness is too old, and the brackets nested."""
    newer = tmp_path / "shard-1.sqlite"
    shutil.copyfile(built["shard1"], newer)
    db = sqlite3.connect(newer)  # as the run/rescore/migrate refusals build one (tests/test_cli_data.py)
    db.execute("INSERT INTO _migrations VALUES ('m999_future', '2099-01-01T00:00:00.000+00:00')")
    db.commit()
    db.close()
    before = newer.read_bytes()
    out = tmp_path / "out.sqlite"
    err = _merge_refused(capsys, out, built["shard0"], newer)  # the later shard refused: no OUT, no half-written file
    assert err == (f"harness: the ledger {newer} lists the migration 'm999_future', which this harness does not know: a "
                   "newer harness wrote it (or the table was edited); upgrade harness to merge it.\n")  # fmt: skip
    assert newer.read_bytes() == before


def test_merge_refuses_shards_of_different_scenario_files(tmp_path, capsys):
    other = scenario_toml(tmp_path, head_replace=[("write a file named report.txt", "write a file called report.txt")])
    _run(tmp_path / "a.sqlite", "--shard", "0/2")
    _run(tmp_path / "b.sqlite", "--shard", "1/2", scenario=other)
    err = _merge_refused(capsys, tmp_path / "out.sqlite", tmp_path / "a.sqlite", tmp_path / "b.sqlite")
    assert "the scenario list_and_report has content hash" in err and "a.sqlite" in err and "b.sqlite" in err
    assert "same scenario files" in err


def test_merge_refuses_inputs_labelled_by_different_classifier_versions(built, tmp_path, capsys):
    copy = tmp_path / "shard-2.sqlite"
    shutil.copyfile(built["shard2"], copy)
    with Ledger(copy) as ledger:
        turn = ledger.turns()[0]
        current = turn.labels_version
        ledger.record_labels(Labels(run_id=turn.record.run_id, turn=turn.record.turn, classifier_version="0.0.1-old",
                                    failure_modes=[], recovered_calls=[], recovered_by=None, details={}))  # fmt: skip
    err = _merge_refused(capsys, tmp_path / "out.sqlite", built["shard0"], copy)
    assert f"come from classifier {current} but those of {copy} from 0.0.1-old, {current}" in err
    assert "harness rescore" in err
    assert main(["rescore", "--ledger", str(copy), "--force"]) == 0  # the remedy the sentence names
    assert main(["ledger", "merge", str(tmp_path / "out.sqlite"), str(built["shard0"]), str(copy)]) == 0


def test_one_run_per_identity_scored_then_last_ended_then_greater_run_id(tmp_path, capsys):
    a, b, out = tmp_path / "a.sqlite", tmp_path / "b.sqlite", tmp_path / "out.sqlite"
    with Ledger(a) as ledger:
        add_run(ledger, "a-1", model=SMALL, identity="i1", day=1)  # ended earlier than b-1
        add_run(ledger, "a-2", model=SMALL, identity="i2", outcome="infra_error", day=9)  # newest, but not scored
        add_run(ledger, "a-3", model=SMALL, identity="i3", outcome="task_failed", day=1)
        add_run(ledger, "a-4", model=SMALL, identity="i4", day=3)  # same end as b-4: the greater run id wins
        add_run(ledger, "a-5", model=SMALL, identity="i5", day=1, turns=[([], "one"), ([], "two")])
    with Ledger(b) as ledger:
        add_run(ledger, "b-1", model=SMALL, identity="i1", day=2)
        add_run(ledger, "b-2", model=SMALL, identity="i2", day=1)
        add_run(ledger, "b-3", model=SMALL, identity="i3", outcome=None, day=5)  # never ended
        add_run(ledger, "b-4", model=SMALL, identity="i4", day=3)
        add_run(ledger, "b-6", model=SMALL, identity="i6", outcome="interrupted", day=1)  # alone: kept
    capsys.readouterr()
    rc, stdout, _ = cli(capsys, "ledger", "merge", out, a, b)
    assert rc == 0 and "5 runs, 2 kept" in stdout and "out.sqlite: 6 runs from 2 ledgers (4 runs left out" in stdout
    with Ledger(out, readonly=True) as merged:
        runs = {r.start.identity: r.run_id for r in merged.runs()}
        assert runs == {"i1": "b-1", "i2": "b-2", "i3": "a-3", "i4": "b-4", "i5": "a-5", "i6": "b-6"}
        turns = merged.turns()
        assert sorted((t.record.run_id, t.record.turn) for t in turns) == sorted(
            [(run_id, 1) for run_id in runs.values()] + [("a-5", 2)]
        )
        assert merged.verify().ok
    assert main(["ledger", "merge", str(tmp_path / "again.sqlite"), str(out), str(a)]) == 0  # a merged ledger merges again


def test_an_old_ledger_merges_once_migrated_and_its_anchor_checks_against_the_merge(tmp_path, capsys):
    """Its rows were hashed before later columns existed: the merge's check recomputes them with its column history."""
    old = tmp_path / "old.sqlite"
    shutil.copyfile(REPO / "tests" / "data" / "ledger_m003.sqlite", old)
    assert "older schema" in _merge_refused(capsys, tmp_path / "out.sqlite", old)
    assert main(["ledger", "migrate", "--ledger", str(old)]) == 0
    anchor = _anchor(old)
    assert main(["ledger", "merge", str(tmp_path / "out.sqlite"), str(old)]) == 0
    capsys.readouterr()
    rc, out, _ = cli(capsys, "ledger", "verify", "--ledger", tmp_path / "out.sqlite", "--anchor", anchor)
    assert rc == 0 and "its merged input old.sqlite extends the anchor" in out


def test_a_shard_run_says_to_merge_next_and_names_its_ledger_for_review(tmp_path, capsys):
    ledger = tmp_path / "shard-0.sqlite"
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, *MATRIX, "--ledger", ledger, "--shard", "0/2")
    assert rc == 0, err
    [next_line] = [line for line in out.splitlines() if line.startswith("Next:")]
    assert "`harness ledger merge merged.sqlite SHARD_LEDGER...`" in next_line
    assert f"`harness review RUN_ID --ledger {ledger}`" in next_line and "harness view" not in next_line
    rc, out, err = cli(capsys, "run", SCENARIO_FILE, *MATRIX, "--ledger", tmp_path / "whole.sqlite")
    [next_line] = [line for line in out.splitlines() if line.startswith("Next:")]
    assert "ledger merge" not in next_line and f"`harness review RUN_ID --ledger {tmp_path / 'whole.sqlite'}`" in next_line
