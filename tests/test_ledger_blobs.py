"""Each large payload is stored once (migration m005_blobs, ``harness/ledger/blobs.py``).

The issue-11 finding: one reply writing 20 files of 1 MiB made a 61 MB ledger, each write's content
held three times in its turn row (raw reply, structured calls, executed calls). Blobs must stay
invisible above the ledger package, tamper-evident, and older ledgers must read, verify and migrate.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from harness.cli import main
from harness.ledger import Ledger, RunEnd, migrations
from harness.rescore import rescore
from tests.helpers import run_replay, text_line
from tests.ledger_tamper import tamper
from tests.test_ledger import ALL_MIGRATIONS, run_end, run_start, turn

MIB = 1024 * 1024
M004_LEDGER = Path(__file__).resolve().parent / "data" / "ledger_m004.sqlite"
"""Written by the harness at m004 (before blobs): one run whose first reply writes three 5,000-character
files (old0.txt ... old2.txt, ``"line i "`` repeated) and whose second reply's content starts with U+E000."""


def _body(i: int, size: int = MIB) -> str:
    return random.Random(i).randbytes(size // 2).hex()  # distinct per file, so nothing dedups by accident


def _writes(count: int, *, as_json_text: bool) -> dict:
    calls = []
    for i in range(count):
        arguments = {"path": f"big{i:02d}.txt", "content": _body(i)}
        calls.append({"id": f"c{i}", "type": "function",
                      "function": {"name": "write_file", "arguments": json.dumps(arguments) if as_json_text else arguments}})  # fmt: skip
    return {
        "content": None,
        "tool_calls": calls,
        "finish_reason": "tool_calls",
        "usage": {"prompt_tokens": 9, "completion_tokens": 9},
    }


def _file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))  # the file and any -wal / -shm


@pytest.mark.parametrize("as_json_text", [False, True], ids=["arguments-object", "arguments-json-text"])
def test_twenty_mebibyte_writes_make_a_ledger_about_that_size(tmp_path, scenario, as_json_text):
    reply = _writes(20, as_json_text=as_json_text)
    summary, facts = run_replay(tmp_path, scenario, [reply, text_line("done")], write_limit_bytes=32 * MIB)
    written = sum(p.stat().st_size for p in summary.sandbox.iterdir() if p.name.startswith("big"))
    assert written == 20 * MIB and facts["verify"].ok, facts["verify"].problem
    path = tmp_path / "ledger.sqlite"
    assert _file_bytes(path) < 1.5 * written, f"ledger {_file_bytes(path)} bytes for {written} bytes written"  # was 3x
    record = facts["turn_rows"][0].record
    assert record.tool_calls == reply["tool_calls"]
    assert [c["arguments"]["content"] for c in record.executed_calls] == [_body(i) for i in range(20)]
    assert record.raw_reply["tool_calls"] == reply["tool_calls"]
    with Ledger(path) as ledger:
        assert rescore(ledger, force=True).history_mismatch == 0  # the message history rebuilt from blobs hashes as sent
        assert ledger.verify().ok


def test_read_back_is_exactly_what_a_ledger_without_blobs_returns(tmp_path, monkeypatch):
    """The same rows written to an m004 ledger (no blobs) and to a current one read back identically."""
    arguments = json.dumps({"path": "a.txt", "content": _body(1, 10_000), "n": 1.0, "alpha": [1, 2]})  # keys not sorted
    escaped = "\ue000blob:" + "0" * 64  # a short string that looks like a reference
    big_turn = turn(
        raw_reply={"choices": [{"message": {"content": _body(2, 9000), "tool_calls": [{"function": {"arguments": arguments}}]}}]},
        content=_body(2, 9000), tool_calls=[{"function": {"name": "write_file", "arguments": arguments}}],
        executed_calls=[{"arguments": json.loads(arguments), "output": escaped, "lone": "\ud800" + "y" * 5000}],
        details={"note": escaped}, reasoning="\ue000 thinking " * 400,
    )  # fmt: skip
    end = RunEnd(**{**run_end().__dict__, "final_answer": _body(2, 9000), "checks": [{"check": "c", "detail": "z" * 5000}]})
    start, reads = run_start(), {}
    for name in ("m004", "m005"):
        path = tmp_path / f"{name}.sqlite"
        with monkeypatch.context() as patch:
            if name == "m004":
                patch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:4])
            with Ledger(path) as ledger:
                ledger.start_run(start)
                ledger.record_turn(big_turn)
                ledger.record_turn(turn(n=2, content=escaped))
                ledger.end_run(end)
        with Ledger(path, readonly=True) as ledger:
            assert ledger.verify().ok, ledger.verify().problem
            seqs = [t.seq for t in ledger.turns()]
            reads[name] = (ledger.turns(), ledger.runs(), ledger.turns_frame().to_dict(), ledger.reply_texts(seqs),
                           ledger.cached_turn("id-r1", "rh"), list(ledger.export_rows()))  # fmt: skip
    assert reads["m005"] == reads["m004"]
    assert reads["m005"][0][0].record == big_turn and reads["m005"][1][0].end == end
    db = sqlite3.connect(tmp_path / "m005.sqlite")
    stored = db.execute("SELECT SUM(length(data)) FROM blobs").fetchone()[0]
    payloads = {arguments, _body(2, 9000), escaped, "\ud800" + "y" * 5000, "\ue000 thinking " * 400, "z" * 5000}
    assert stored == sum(len(p.encode("utf-8", "surrogatepass")) for p in payloads)  # each once; parsed arguments not again
    assert db.execute("SELECT blob_refs FROM turns WHERE turn = 2").fetchone()[0] is not None  # the look-alike is a blob
    db.close()


def _big_ledger(tmp_path) -> Path:
    path = tmp_path / "l.sqlite"
    with Ledger(path) as ledger:
        ledger.start_run(run_start())
        ledger.record_turn(turn(content=_body(7, 8192)))
        ledger.end_run(run_end())
    return path


@pytest.mark.parametrize(
    ("statement", "problem"),
    [
        ("UPDATE blobs SET data = CAST(upper(CAST(data AS TEXT)) AS BLOB)", "does not hash to its key (its bytes were edited)"),
        ("DELETE FROM blobs", "references the blob"),
        ("INSERT INTO blobs VALUES ('" + "a" * 64 + "', X'00')", "does not hash to its key"),
    ],
)
def test_a_tampered_blob_fails_verify(tmp_path, capsys, statement, problem):
    path = _big_ledger(tmp_path)
    tamper(path, statement)
    rc = main(["ledger", "verify", "--ledger", str(path)])
    err = capsys.readouterr().err
    assert rc == 1 and problem in err and err.count("\n") == 1, err


def test_an_unreferenced_blob_and_an_edited_reference_fail_verify(tmp_path):
    path = _big_ledger(tmp_path)
    data = b"an added payload"
    tamper(path, f"INSERT INTO blobs VALUES ('{hashlib.sha256(data).hexdigest()}', X'{data.hex()}')")
    with Ledger(path, readonly=True) as ledger:
        assert "is referenced by no row (it was added" in ledger.verify().problem
    path = _big_ledger(tmp_path / "b")
    tamper(path, "UPDATE turns SET blob_refs = '[]'")
    with Ledger(path, readonly=True) as ledger:
        assert "row_hash does not match its content" in ledger.verify().problem


def test_an_m004_ledger_reads_verifies_and_migrates(tmp_path, capsys):
    path = tmp_path / "old.sqlite"
    shutil.copyfile(M004_LEDGER, path)
    with Ledger(path, readonly=True) as ledger:
        assert (
            ledger.pending_migrations() == ALL_MIGRATIONS[4:]  # everything after m004
            and ledger.verify().ok
        )
        before = (ledger.turns(), ledger.runs(), ledger.turns_frame().to_dict())
        run_id = before[1][0].run_id
    calls = before[0][0].record.executed_calls
    assert [c["arguments"]["content"] for c in calls] == [(f"line {i} " * 1000)[:5000] for i in range(3)]
    assert before[0][1].record.content.startswith("\ue000blob:")  # an old row's look-alike is text, not a reference
    assert main(["ledger", "migrate", "--ledger", str(path)]) == 0
    assert capsys.readouterr().out.startswith(
        f"{path}: upgraded, applied m005_blobs, m006_turn_server_rejection, m007_wire_settings, m008_streaming, m009_templates, m010_report_index, m011_merge_provenance, m012_mode_index, m013_drop_turns_run;"
    )
    with Ledger(path) as ledger:
        assert ledger.applied_migrations() == ALL_MIGRATIONS and ledger.verify().ok
        assert (ledger.turns(), ledger.runs(), ledger.turns_frame().to_dict()) == before  # old rows stay as they are
        ledger.record_turn(turn(run_id, 3, content=_body(3, 6000)))
        assert ledger.verify().ok
        assert ledger.turns(run_id)[2].record.content == _body(3, 6000)
    assert main(["ledger", "verify", "--ledger", str(path)]) == 0
