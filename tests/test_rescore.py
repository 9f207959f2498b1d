"""Re-scoring: stored replies are re-classified from the ledger alone, labels appended, newest wins.

Also holds the red-team regression tests for rescore: incomplete records are not a traceback, and
thousands of turns are rescored (and a second rescore skips them all).
"""

from __future__ import annotations

import pytest

from harness.classifier import CLASSIFIER_VERSION
from harness.cli import main
from harness.ledger import Labels, Ledger, RunStart, TurnRecord
from harness.loop import RunOptions
from harness.matrix import MatrixOverrides
from harness.runner import expand_matrix, run_matrix
from harness.scenarios import load_scenario
from tests.helpers import REPO, call_line, text_line, write_cassette
from tests.ledger_builders import SMALL, add_run


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


# -- red-team: incomplete records and many turns ----------------------------------------------------------
def _run_start(run_id: str, config) -> RunStart:
    return RunStart(
        run_id=run_id, identity="i-" + run_id, scenario="s", scenario_path="s.toml", scenario_hash="h", model="m",
        backend="replay", base_url=None, server_version=None, model_digest=None, temperature=0.0, seed=0, max_tokens=64,
        num_ctx=2048, tool_mode="native", parser="lenient", repetition=0, turn_limit=8, token_limit=1000,
        harness_version="x", git_sha=None, git_dirty=None, sandbox="/tmp/x", config=config,
    )  # fmt: skip


def _turn(run_id: str, executed=None) -> TurnRecord:
    return TurnRecord(
        run_id=run_id, turn=1, request_hash="x", raw_reply=None, content='{"name": "list_files", "arguments": {}}',
        tool_calls=None, recovered_calls=[], executed_calls=executed or [], failure_modes=[], recovered_by=None,
        classifier_version="0", finish_reason="stop", prompt_tokens=1, completion_tokens=1, latency_ms=None,
        started_at="a", ended_at="b",
    )  # fmt: skip


# red-team finding: incomplete records crashed the whole rescore
@pytest.mark.parametrize("config, executed", [
    ({"system_prompt": "s"}, None),                                   # prompts stored without the task
    (["not", "an", "object"], None),                                  # config is not an object
    ({"system_prompt": "s", "task": "t"}, [{"name": "list_files"}]),  # an executed call without its fields
], ids=["config-without-task", "config-not-object", "executed-call-without-fields"])  # fmt: skip
def test_rescore_of_a_run_with_incomplete_records_is_not_a_traceback(tmp_path, capsys, config, executed):
    """rescore rebuilds histories with `config["task"]`, `config.get(...)` and `c["arguments"]`
    unguarded: a run recorded by another tool or an older harness crashes the whole rescore
    (KeyError / AttributeError traceback) and no other run is relabelled. README: a damaged ledger
    is one sentence, never a traceback."""
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        led.start_run(_run_start("bad", config))
        led.record_turn(_turn("bad", executed))
    code = main(["rescore", "--ledger", str(ledger)])  # must not raise
    assert code in (0, 1)


def test_guard_rescore_of_runs_recorded_without_prompts_and_of_thousands_of_turns(tmp_path):
    ledger = tmp_path / "l.sqlite"
    with Ledger(ledger) as led:
        for i in range(400):
            add_run(led, f"r{i}", model=SMALL, repetition=i, turns=[([], '{"name": "list_files", "arguments": {}}')] * 5)
    from harness.rescore import rescore

    with Ledger(ledger) as led:  # no timed assertion: speed is measured by benchmarks/, never asserted in tests
        result = rescore(led)
        again = rescore(led)
    assert result.turns == 2000 and result.history_mismatch == 2000  # no prompts stored: classified, flagged
    assert again.turns == 0 and again.skipped_current == 2000


def test_rescore_judges_a_skipped_tool_only_for_runs_that_recorded_requires_tool(tmp_path, capsys):
    cassette = write_cassette(tmp_path / "c.jsonl", [text_line("It is 21°C and sunny in Paris.")])
    plans = expand_matrix([load_scenario(REPO / "scenarios" / "weather_probe.toml")],
                          MatrixOverrides([f"replay:{cassette}"], [0.0], 1, None, ["native"], None))  # fmt: skip
    path = tmp_path / "new.sqlite"
    with Ledger(path) as ledger:
        run_matrix(plans, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        assert ledger.turns()[0].labels == ["fabricated_tool_result", "skipped_required_tool"]
    assert main(["rescore", "--ledger", str(path), "--force"]) == 0
    assert "(0 changed labels" in capsys.readouterr().out  # the flag comes back from the run's config
    old = tmp_path / "old.sqlite"
    old.write_bytes((REPO / "tests" / "data" / "ledger_m003.sqlite").read_bytes())
    assert main(["rescore", "--ledger", str(old), "--force"]) == 0
    with Ledger(old) as ledger:
        turns = ledger.turns()
        assert turns and all(t.record.tool_calls is None and t.labels == [] for t in turns)  # no call, yet not judged
