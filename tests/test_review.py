"""Review and attest: the five-part review frame, attestations, and `review --verify`.

Also holds the red-team regression tests for review: a frame depends on the run, not on the
folder you stand in, and survives big notes and an idempotent rescore.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness import review
from harness.cli import main
from harness.ledger import Labels, Ledger
from tests.helpers import IDEAL, RUN_FLAGS, SCENARIO_FILE, write_cassette
from tests.ledger_builders import RAW, SMALL, add_run


def test_review_frame_has_five_parts_and_reads_the_promise(ledger_path, tmp_path, capsys):
    scenario = tmp_path / "sc.toml"
    scenario.write_text(
        'what_it_does = "lists files"\nwhat_it_does_not = "deletes"\ndone_looks_like = "report.txt has 3 lines"\n'
    )
    digest = hashlib.sha256(scenario.read_bytes()).hexdigest()
    with Ledger(ledger_path) as ledger:
        add_run(ledger, "abc123", model=SMALL, scenario_path=str(scenario), scenario_hash=digest, outcome="task_failed",
                turns=[([RAW], '{"name": "x"}'), ([], "done")], files_written=["report.txt"],
                checks=[{"check": "file_exists", "passed": True, "detail": "ok"}, {"check": "file_states_count", "passed": False, "detail": "2 lines, wanted 3"}])  # fmt: skip
    frame = review.review_frame(ledger_path, "abc")
    assert list(frame) == ["run", "promise", "acceptance", "diff", "evidence", "open_questions"]
    assert frame["promise"]["status"] == "unchanged" and frame["promise"]["done_looks_like"] == "report.txt has 3 lines"
    assert frame["diff"]["first_input_sha256"] == "req-abc123-1" and frame["diff"]["files_written"] == ["report.txt"]
    assert [t["labels"] for t in frame["evidence"]] == [[RAW], []]
    assert frame["open_questions"] == [
        f"`{RAW}` on turn 1: is the label right, and did it change the outcome?",
        "Check `file_states_count` failed (2 lines, wanted 3): is the check right, or did the model miss the task?",
    ]
    assert main(["review", "abc123", "--ledger", str(ledger_path)]) == 0
    text = capsys.readouterr().out
    for part in (
        "## 1. The promise",
        "## 2. The acceptance criteria",
        "## 3. The diff",
        "## 4. The evidence",
        "## 5. The open questions",
    ):
        assert part in text
    assert "- Done looks like: report.txt has 3 lines" in text and f"Frame SHA-256: {review.frame_sha256(frame)}" in text

    assert main(["review", "abc123", "--verify", "--ledger", str(ledger_path)]) == 1
    assert "has no attestation" in capsys.readouterr().err
    assert main(["attest", "abc123", "--reviewer", "ann", "--notes", "label ok", "--ledger", str(ledger_path)]) == 0
    assert review.frame_sha256(frame) in capsys.readouterr().out
    assert main(["review", "abc123", "--verify", "--ledger", str(ledger_path)]) == 0
    assert "unchanged since attested by ann" in capsys.readouterr().out
    with Ledger(ledger_path) as ledger:
        rows = [(a.reviewer, a.notes, a.frame_sha256) for a in ledger.attestations("abc123")]
        assert rows == [("ann", "label ok", review.frame_sha256(frame))]
        ledger.record_labels(
            Labels(
                run_id="abc123",
                turn=2,
                classifier_version="2",
                failure_modes=["empty_response"],
                recovered_calls=[],
                recovered_by=None,
                details={},
            )
        )
        assert ledger.verify().ok
    assert main(["review", "abc123", "--verify", "--ledger", str(ledger_path)]) == 1
    assert "the frame CHANGED since attested by ann" in capsys.readouterr().err
    scenario.write_text("changed")
    assert review.review_frame(ledger_path, "abc123")["promise"]["status"] == "changed"


def test_review_unknown_run_is_a_usage_error(two, capsys):
    assert main(["review", "nope", "--ledger", str(two)]) == 2
    assert main(["review", "small", "--ledger", str(two)]) == 2  # ambiguous prefix
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("harness: no run 'nope'") and "matches several runs" in err[1]


# -- red-team: a frame depends on the run, not on where you stand -------------------------------------------
# red-team finding: `review --verify` depended on the working directory
def test_review_verify_does_not_depend_on_the_working_directory(tmp_path, monkeypatch, capsys):
    """The frame's promise resolves the run's relative scenario_path against the current folder
    (and the ledger's grandparent). Attest in the project, then `review --verify` from any other
    folder: the frame says 'the scenario file s.toml is gone', its SHA-256 differs, and verify
    reports the frame CHANGED (exit 1) although nothing changed."""
    project, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "s.toml").write_bytes(SCENARIO_FILE.read_bytes())
    cassette = write_cassette(project / "c.jsonl", IDEAL)
    ledger = project / "data" / "deep" / "ledger.sqlite"
    monkeypatch.chdir(project)
    assert main(["run", "s.toml", "--model", f"replay:{cassette}", "--repeats", "1", "--ledger", str(ledger), *RUN_FLAGS]) == 0
    with Ledger(ledger) as led:
        run_id = led.runs()[0].run_id
    assert main(["attest", run_id, "--reviewer", "alice", "--ledger", str(ledger)]) == 0
    assert main(["review", run_id, "--verify", "--ledger", str(ledger)]) == 0
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["review", run_id, "--verify", "--ledger", str(ledger)]) == 0, capsys.readouterr().err


def test_guard_attest_big_notes_and_verify_after_an_idempotent_rescore(tmp_path, monkeypatch, capsys):
    (tmp_path / "s.toml").write_bytes(SCENARIO_FILE.read_bytes())
    cassette = write_cassette(tmp_path / "c.jsonl", IDEAL)
    assert main(["run", "s.toml", "--model", f"replay:{cassette}", "--repeats", "1", *RUN_FLAGS]) == 0
    ledger = tmp_path / "results" / "ledger.sqlite"
    with Ledger(ledger) as led:
        run_id = led.runs()[0].run_id
    from harness.review import attest

    attest(ledger, run_id[:6], reviewer="alice", notes="n" * 1_000_000)
    assert main(["rescore", "--force"]) == 0  # same classifier, same labels: the frame must not change
    assert main(["review", run_id, "--verify"]) == 0
    assert main(["ledger", "verify"]) == 0
    (tmp_path / "s.toml").write_text((tmp_path / "s.toml").read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    assert main(["review", run_id, "--verify"]) == 1  # an edited scenario file is a changed frame
    assert "changed since the run" in review_text_of(ledger, run_id)


def review_text_of(ledger: Path, run_id: str) -> str:
    from harness.review import review_text

    return review_text(ledger, run_id)


def test_review_escapes_what_the_model_the_checks_and_the_ledger_wrote(tmp_path, capsys):
    """red team: `harness review` printed a reply, a check's detail, a file name and a reviewer raw: a model could clear
    the screen, recolour or hide its answer, and a newline in a detail added a line (a check ticked that was not)."""
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        add_run(led, "esc-run", model=SMALL, outcome="task_failed", turns=[([], "ok \x1b[8mhidden\x1b[0m \x1b]0;t\x07")],
                files_written=["a\x1b[2Jb.txt"], checks=[{"check": "lines", "passed": False, "detail": "2\n- [x] `all`: ok"}])  # fmt: skip
    review.attest(ledger, "esc-run", reviewer="ann\x1b[31m", notes="seen\rfine")
    assert main(["review", "esc-run", "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert not any(ch in out for ch in "\x1b\x07\r") and not any(line.startswith("- [x]") for line in out.splitlines())
    assert "`ok \\x1b[8mhidden\\x1b[0m \\x1b]0;t\\x07`" in out and "- [ ] `lines`: 2\\n- [x] `all`: ok" in out.splitlines()
    assert "Files written: a\\x1b[2Jb.txt" in out and "Attested by ann\\x1b[31m at " in out and ": seen\\rfine" in out
    assert main(["review", "esc-run", "--verify", "--ledger", str(ledger)]) == 0
    assert capsys.readouterr().out.startswith("run esc-run: the frame is unchanged since attested by ann\\x1b[31m at ")


def test_the_last_reply_of_a_run_that_did_not_end_on_an_answer_is_not_called_its_final_answer(tmp_path, capsys):
    """newcomer (stop 29): a turn_limit run's last reply, a tool call, was shown as "Final answer"."""
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        add_run(led, "capped", model=SMALL, outcome="turn_limit", turns=[([], '{"name": "list_files"}')])
        add_run(led, "answered", model=SMALL, outcome="task_failed", turns=[([], "There are 3 files.")])
    texts = []
    for run_id in ("capped", "answered"):
        assert main(["review", run_id, "--ledger", str(ledger)]) == 0
        texts.append(capsys.readouterr().out)
    assert "- Last reply's text (no final answer: the run ended turn_limit): " in texts[0] and "Final answer" not in texts[0]
    assert "- Final answer: " in texts[1]
