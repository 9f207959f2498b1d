"""The shipped scenario library: every file loads, an ideal model passes, a broken one fails for its reason.

Each scenario has two replay cassettes in ``tests/cassettes/<scenario>/``: ``ideal.jsonl``
(correct structured calls; must pass) and ``broken.jsonl`` (a plausibly broken model; must
end with the intended outcome and exactly the intended failing checks). They run in the
scenario's own default tool mode and parser, as ``harness run`` would.
"""

from __future__ import annotations

import json

import pytest

from harness.backends import open_backend
from harness.backends.replay import load_cassette
from harness.cli import main
from harness.ledger import Ledger
from harness.loop import RunOptions, RunPlan, run_once
from harness.scenarios import load_scenario
from tests.helpers import CASSETTES, REPO

SCENARIOS = sorted(p.stem for p in (REPO / "scenarios").glob("*.toml"))
LIBRARY = [
    "code_review", "extract_fields", "list_and_report", "long_context", "no_tool_needed",
    "read_and_summarize", "support_triage", "weather_probe",
]  # fmt: skip

#: scenario -> (outcome of broken.jsonl, {failing check: detail}) — the intended reason, exactly
BROKEN = {
    "list_and_report": (
        "task_failed",
        {
            "file_names_all_fixtures": "does not name ['hello.txt']",
            "file_names_only_existing": "names files that do not exist: ['echo.txt']",
        },
    ),
    "long_context": (
        "turn_limit",
        {
            "file_exists": "report.txt does not exist",
            "file_names_all_fixtures": "report.txt does not exist",
            "file_names_only_existing": "report.txt does not exist",
            "file_states_count": "report.txt does not exist",
        },
    ),
    "weather_probe": (
        "task_failed",
        {
            "tool_call_count": "0 tool call(s) made, expected at least 1",
            "final_answer_contains": "final answer does not contain '17'; final answer does not contain 'light drizzle'",
        },
    ),
    "read_and_summarize": ("task_failed", {"file_contains": "does not contain 'Marisol'"}),
    "code_review": (
        "task_failed",
        {
            "file_contains": r"does not contain 'average'; does not match /(?i)(\bline\s*:?\s*13\b|\bL13\b|stats\.py:13\b)/",
        },
    ),
    "support_triage": (
        "task_failed",
        {
            "file_csv_values_in": "category values not in ['billing', 'bug', 'account', 'feature_request']: ['refund']",
            "file_csv_value": "T-101: category = 'refund', expected 'billing'",
        },
    ),
    "extract_fields": (
        "task_failed",
        {
            "file_json_field": 'date = "21 May 2024", expected "2024-05-21"; cost = 4250, expected "EUR 4,250.00"',
        },
    ),
    "no_tool_needed": ("task_failed", {"no_tool_called": "1 tool call(s) made"}),
}


def replay(tmp_path, name, kind, *, turns=None):
    """Run scenario ``name`` on its ``kind`` cassette; return (summary, run row, cassette lines).

    With ``turns`` (a list), the run's turn rows are appended to it.
    """
    scenario = load_scenario(REPO / "scenarios" / f"{name}.toml")
    cassette = CASSETTES / name / f"{kind}.jsonl"
    plan = RunPlan(
        scenario, f"replay:{cassette}", 0.0, tool_mode=scenario.matrix.tool_modes[0], parser=scenario.matrix.parsers[0]
    )
    with Ledger(tmp_path / "ledger.sqlite") as ledger, open_backend(plan.model) as backend:
        summary = run_once(plan, backend, ledger, RunOptions(runs_dir=tmp_path / "runs"))
        [row] = [r for r in ledger.runs() if r.run_id == summary.run_id]
        if turns is not None:
            turns.extend(ledger.turns(summary.run_id))
        assert ledger.verify().ok
    return summary, row, load_cassette(cassette)


def test_the_library_is_complete():
    assert SCENARIOS == LIBRARY
    assert sorted(BROKEN) == LIBRARY
    assert sorted(p.name for p in CASSETTES.iterdir() if p.is_dir()) == LIBRARY


@pytest.mark.parametrize("name", LIBRARY)
def test_ideal_cassette_passes(tmp_path, name):
    summary, row, lines = replay(tmp_path, name, "ideal")
    assert summary.outcome == "pass", summary.checks
    assert summary.turns == len(lines)  # every reply used, the loop ended by itself
    assert [c["passed"] for c in summary.checks] == [True] * len(summary.plan.scenario.checks)
    assert (row.outcome, row.end.checks) == ("pass", summary.checks)


@pytest.mark.parametrize("name", LIBRARY)
def test_broken_cassette_fails_for_the_intended_reason(tmp_path, name):
    outcome, failing = BROKEN[name]
    summary, row, _ = replay(tmp_path, name, "broken")
    assert summary.outcome == outcome
    got: dict[str, list[str]] = {}
    for check in summary.checks:
        if not check["passed"]:
            got.setdefault(check["check"], []).append(check["detail"])
    assert {k: "; ".join(v) for k, v in got.items()} == failing
    assert (row.outcome, row.end.checks) == (outcome, summary.checks)


@pytest.mark.parametrize(
    ("name", "output"),
    [
        (
            "weather_probe",
            {"city": "Paris", "temperature_c": 17, "condition": "light drizzle", "humidity_pct": 82, "wind_kph": 14},
        ),
        (
            "support_triage",
            [
                {"id": f"T-10{i}", "text": text}
                for i, text in enumerate(
                    [
                        "I was charged twice for my March invoice. Please refund one of the two payments.",
                        "The export button does nothing when I click it; the CSV file never downloads.",
                        "Please change the email address on my account to the new one in my signature.",
                        "Could you add a dark mode to the dashboard? The white screen is hard on the eyes at night.",
                        "The app crashes every time I open the settings page on my Android phone.",
                    ],
                    start=1,
                )
            ],
        ),
    ],
)
def test_data_tools_answer_from_the_scenario_tool_data(tmp_path, name, output):
    turns: list = []
    replay(tmp_path, name, "ideal", turns=turns)
    [executed] = turns[0].record.executed_calls
    assert executed["error"] is False and json.loads(executed["output"]) == output


def test_long_context_broken_run_hits_the_turn_cap_not_the_token_cap(tmp_path):
    summary, row, _ = replay(tmp_path, "long_context", "broken")
    assert row.end.breach == {"kind": "turn_limit", "limit": 8, "observed": 9}
    assert summary.tokens == 8 * 4112


@pytest.mark.parametrize("name", LIBRARY)
def test_done_sentence_names_every_checked_value(name):
    scenario = load_scenario(REPO / "scenarios" / f"{name}.toml")
    done = scenario.done_looks_like
    for check in scenario.checks:
        for key in ("path", "text", "key", "count"):
            if key in check:
                assert str(check[key]) in done, (check, done)
        if check["type"] == "file_json_field":
            assert f"{check['field']} is {json.dumps(check['value'])}" in done
        if check["type"] == "file_csv_value":
            assert f"{check['key']} is {check['value']}" in done or f"{check['key']} {check['value']}" in done
        for value in check.get("allowed", []):
            assert value in done
        if check["type"] == "file_names_all_fixtures":
            assert all(fixture in done for fixture in scenario.fixtures)
        if check["type"] == "only_files_written":
            assert "no file other than" in done
        if check["type"] == "no_tool_called":
            assert done.startswith("No tool is called")
        if check["type"] == "tool_call_count":
            assert f"At least {check['min']} tool call" in done


@pytest.mark.parametrize("name", sorted(set(LIBRARY) - {"list_and_report"}))
def test_default_matrix_fits_the_embedded_model(name):
    scenario = load_scenario(REPO / "scenarios" / f"{name}.toml")
    m = scenario.matrix
    assert (m.models, m.temperatures, m.repeats, m.tool_modes, m.parsers) == (
        ("embedded:smollm2-135m",),
        (0.0,),
        1,
        ("prompt",),
        ("lenient",),
    )
    assert scenario.max_tokens <= 256 and 6 <= scenario.turn_limit <= 10


def test_long_context_preamble_is_several_thousand_tokens_and_fits_num_ctx():
    scenario = load_scenario(REPO / "scenarios" / "long_context.toml")
    system = scenario.system_message("prompt")
    # about 4 characters per token for English prose
    assert 12_000 <= len(system) <= 4 * (scenario.num_ctx - 8 * scenario.max_tokens)
    assert scenario.num_ctx == 8192
    reference = load_scenario(REPO / "scenarios" / "list_and_report.toml")
    assert (scenario.task, scenario.fixtures, scenario.checks) == (reference.task, reference.fixtures, reference.checks)


def test_scenarios_check_accepts_every_shipped_file(capsys):
    files = [str(REPO / "scenarios" / f"{name}.toml") for name in LIBRARY]
    assert main(["scenarios", "check", *files]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert [line.split(": OK")[0] for line in out.splitlines()] == files
