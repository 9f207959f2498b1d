"""Re-scoring: stored replies are re-classified from the ledger alone, labels appended, newest wins."""

from __future__ import annotations

from harness.classifier import CLASSIFIER_VERSION
from harness.cli import main
from harness.ledger import Labels, Ledger
from harness.loop import RunOptions
from harness.matrix import MatrixOverrides
from harness.runner import expand_matrix, run_matrix
from harness.scenarios import load_scenario
from tests.helpers import REPO, call_line, text_line, write_cassette


def _ledger_with_runs(tmp_path, tool_mode):
    replies = [
        text_line('<tool_call>{"name": "list_files", "arguments": {"path": "."}}</tool_call>'),
        call_line("write_file", {"path": "report.txt", "content": "3 files: config.json, hello.txt, echo.txt"}),
        call_line("write_file", {"path": "report.txt", "content": "3 files: config.json, hello.txt, echo.txt"}),
        text_line("I will now check the report."),
    ]
    cassette = write_cassette(tmp_path / "c.jsonl", replies)
    plans = expand_matrix([load_scenario(REPO / "scenarios" / "list_and_report.toml")],
                          MatrixOverrides([f"replay:{cassette}"], [0.0], 1, None, [tool_mode], None))  # fmt: skip
    path = tmp_path / f"{tool_mode}.sqlite"
    with Ledger(path) as ledger:
        run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs"))
    return path


def test_rescore_rebuilds_the_exact_history(tmp_path, capsys):
    for tool_mode in ("native", "prompt"):
        path = _ledger_with_runs(tmp_path, tool_mode)
        with Ledger(path) as ledger:
            before = [t.labels for t in ledger.turns()]
            assert "repeated_call" in before[2] and "fabricated_tool_result" in before[1]
        assert main(["rescore", "--ledger", str(path)]) == 0
        assert "0 turns re-classified" in capsys.readouterr().out  # already current
        assert main(["rescore", "--ledger", str(path), "--force"]) == 0
        out, err = capsys.readouterr()
        assert f"4 turns re-classified with classifier {CLASSIFIER_VERSION} (0 changed labels" in out
        assert err == ""  # every rebuilt history hashed to the stored request hash
        with Ledger(path) as ledger:
            assert [t.labels for t in ledger.turns()] == before
            assert ledger.row_counts()["labels"] == 4
            assert ledger.verify().ok


def test_labels_from_an_older_classifier_are_superseded(tmp_path):
    path = _ledger_with_runs(tmp_path, "native")
    with Ledger(path) as ledger:
        [run] = ledger.runs()
        truth = ledger.turns()[1].labels
        ledger.record_labels(Labels(run_id=run.run_id, turn=2, classifier_version="0.0.1", failure_modes=["empty_response"],
                                    recovered_calls=[], recovered_by=None, details={}))  # fmt: skip
        assert ledger.turns()[1].labels == ["empty_response"]
        from harness.rescore import rescore

        result = rescore(ledger)
        assert (result.turns, result.changed, result.skipped_current, result.history_mismatch) == (1, 1, 3, 0)
        assert ledger.turns()[1].labels == truth
        assert [r["failure_modes"] for r in ledger.export_rows()][1] == truth
