"""Issue 15's report findings: why runs failed, --by everywhere, scenario kinds, many models, latency, examples.

Ledgers are built through the public Ledger API (tests/ledger_builders.py); nothing is mocked.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from ledger_builders import add_run

from harness.ledger import Ledger, RunEnd, TurnRecord
from harness.report import check_failure_table, failure_mode_table, load_frames, shortest_examples, write_report

MODELS = [f"ollama:model-{i:02d}-{'x' * (i % 5)}:{i}b" for i in range(20)]
SCENARIOS = [f"scenario_{j:02d}" for j in range(11)] + ["no_tool_needed"]
MODES = ["raw_json_in_content", "repeated_call", "hallucinated_tool", "empty_response", "malformed_arguments"]


def _png_size(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])
    return width, height


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> Path:
    """20 models × 12 scenarios (one a restraint scenario) × 2 temperatures, one run each, modes and checks varying."""
    path = tmp_path_factory.mktemp("wide") / "wide.sqlite"
    with Ledger(path) as ledger:
        for i, model in enumerate(MODELS):
            for j, scenario in enumerate(SCENARIOS):
                for t, temperature in enumerate((0.0, 0.7)):
                    restraint = scenario == "no_tool_needed"
                    passed = restraint or (i + j + t) % 3 == 0
                    modes = [] if passed else [MODES[(i + j) % len(MODES)]]
                    checks = [{"check": "file_exists", "passed": passed or (i + j) % 2 == 0, "detail": "report.txt"},
                              {"check": f"names_{j % 3}", "passed": passed, "detail": "names"}]  # fmt: skip
                    add_run(ledger, f"r-{i}-{j}-{t}", model=model, scenario=scenario, temperature=temperature,
                            outcome="pass" if passed else "task_failed", turns=[(modes, "reply " * (1 + j))],
                            checks=checks, requires_tool=not restraint, ttft=50.0 + i, decode_tps=20.0 + i)  # fmt: skip
    return path


def test_twenty_models_by_twelve_scenarios_stay_readable(wide, tmp_path):
    out = tmp_path / "r"
    write_report(wide, out, by=["model", "scenario"], formats=["md", "png"])
    md = (out / "report.md").read_text()
    # the failure-mode table turned: one row per model × scenario (240), one column per mode, not 480 columns
    section = md.split("## Failure modes")[1].split("###")[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 240 and all(line.count("|") <= 2 + 2 + len(MODES) + 1 for line in table)
    # tool-using and restraint scenarios apart: every model passes the restraint scenario, 12 of 12 = no 100% headline mix
    kinds = md.split("## Tool-using and restraint scenarios")[1].split("## Summary")[0]
    assert re.search(r"\| ollama:model-00-:0b +\| \d+/22 = .*\| 2/2 = 100.0%", kinds)
    for name in ("pass_rate.png", "failure_modes.png", "outcomes.png", "pass_k.png"):
        width, height = _png_size(out / name)
        assert 600 <= width <= 4000 and 300 <= height <= 6000, (name, width, height)
    # the pass-rate heat map has one row per model: 20 rows need room, not a squeezed 5-inch figure
    assert _png_size(out / "pass_rate.png")[1] >= 700
    # 240 model × scenario rows would be 25 px each in a capped figure: the failure map becomes one panel per mode
    assert _png_size(out / "failure_modes.png")[1] < 5000 and "one panel per mode" in md
    assert "pooled over scenario" in md  # outcomes and pass^k say they draw one row per model
    # a map of more than 100 cells is colour only, and says so; a small one (pass^k: 20 models × k = 1) keeps its counts
    captions = {line.split(" ")[0]: line for line in md.splitlines() if line.startswith("*")}
    assert "no cell text (240 cells, over 100): counts in the tables" in captions["*Pass"]
    assert f"no cell text ({len(MODES) * len(MODELS) * len(SCENARIOS)} cells, over 100)" in captions["*Share"]
    assert "no cell text" not in captions["*pass^k"]


def test_every_table_follows_by_and_the_per_temperature_failure_view(wide, tmp_path):
    out = tmp_path / "t"
    write_report(wide, out, by=["temperature"], formats=["md", "csv"])
    md = (out / "report.md").read_text()
    section = md.split("## Failure modes")[1].split("###")[0]
    header = next(line for line in section.splitlines() if line.startswith("| failure mode"))
    assert "T=0 " in header and "T=0.7" in header  # modes as rows, one column per temperature
    assert "### By temperature" in md and "## Latency" in md
    latency = md.split("## Latency")[1].split("##")[0]
    assert "Latency compares only runs made under the same load" in latency
    assert "time to first token, median (ms)" in latency and "decode, median (tokens/s)" in latency
    failures = failure_mode_table(load_frames(wide), ["temperature"])
    assert set(failures.columns) >= {"mode", "temperature", "share"} and set(failures["temperature"]) == {0.0, 0.7}
    csv = (out / "failure_modes.csv").read_text().splitlines()[0]
    assert csv.startswith("mode,temperature,")


def test_check_failures_are_counted_per_model_and_per_cell(wide):
    frames = load_frames(wide)
    per_model = check_failure_table(frames, ["model"])
    mine = per_model[per_model["model"] == MODELS[1]].set_index("check")
    runs = frames.runs[(frames.runs["model"] == MODELS[1]) & (frames.runs["scenario"] == "scenario_00")]
    by_hand = sum("file_exists" in names for names in runs["checks_failed"])  # the builder's rule, counted from the runs
    assert int(mine.loc["scenario_00: file_exists", "failed"]) == by_hand > 0
    assert int(mine.loc["scenario_00: file_exists", "checked"]) == len(runs) == 2
    per_cell = check_failure_table(frames, ["model", "scenario", "temperature"])
    assert per_cell["failed"].sum() == sum(len(names) for names in frames.runs["checks_failed"])
    assert set(per_cell["check"]) <= {"file_exists", "names_0", "names_1", "names_2"}  # the row names the scenario


def test_a_check_listed_twice_counts_a_run_once(tmp_path):
    path = tmp_path / "twice.sqlite"
    twice = [
        {"check": "file_contains", "passed": False, "detail": "a"},
        {"check": "file_contains", "passed": False, "detail": "b"},
    ]
    with Ledger(path) as ledger:
        add_run(ledger, "a", model="ollama:m", outcome="task_failed", checks=twice)
        add_run(ledger, "b", model="ollama:m", outcome="pass", repetition=1, checks=[{**twice[0], "passed": True}])
    [row] = check_failure_table(load_frames(path), ["model"]).to_dict("records")
    assert (row["check"], row["failed"], row["checked"]) == ("s: file_contains", 1, 2)


def test_shortest_example_shows_the_structured_call(tmp_path):
    path = tmp_path / "call.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "a", model="ollama:m", outcome=None, turns=[])
        ledger.record_turn(TurnRecord(
            run_id="a", turn=1, request_hash="h", raw_reply={}, content="", failure_modes=["hallucinated_tool"],
            tool_calls=[{"function": {"name": "delete_everything", "arguments": {"path": "/"}}}], recovered_calls=[],
            executed_calls=[], recovered_by=None, classifier_version="1", finish_reason="tool_calls", prompt_tokens=1,
            completion_tokens=1, latency_ms=1.0, started_at="2026-01-01T00:00:00.000+00:00", ended_at="2026-01-01T00:00:00.000+00:00",
        ))  # fmt: skip
        ledger.end_run(RunEnd(run_id="a", outcome="task_failed", turns=1, prompt_tokens=1, completion_tokens=1, breach=None,
                              error=None, checks=[], final_answer="", escape_attempts=[], files_written=[]))  # fmt: skip
    [row] = shortest_examples(load_frames(path)).to_dict("records")
    assert row["kind"] == "call" and row["excerpt"] == 'delete_everything({"path": "/"})'
    write_report(path, tmp_path / "r", formats=["md"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert '(empty text; its structured tool call): `delete_everything({"path": "/"})`' in md
    assert "(empty reply)" not in md


def test_runs_recorded_before_requires_tool_read_as_tool_using(tmp_path):
    path = tmp_path / "old.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "a", model="ollama:m")
    frames = load_frames(path)
    assert frames.runs["task_kind"].tolist() == ["tool"] and frames.runs["checks_failed"].tolist() == [()]


def test_export_runs_is_one_row_per_run_with_json_lists_and_no_nan(tmp_path, capsys):
    import json

    import pandas as pd

    from harness.cli import main

    path = tmp_path / "e.sqlite"
    with Ledger(path) as ledger:
        add_run(ledger, "p", model="ollama:m", turns=[([], "a"), (["repeated_call"], "b")], requires_tool=True)
        add_run(ledger, "f", model="ollama:m", outcome="task_failed", repetition=1, turns=[(["raw_json_in_content"], "{}")],
                checks=[{"check": "file_exists", "passed": True, "detail": ""}, {"check": "names_files", "passed": False, "detail": ""}])  # fmt: skip
        add_run(ledger, "u", model="ollama:m", outcome=None, repetition=2, turns=[([], "x")], requires_tool=False)
    out = tmp_path / "runs.csv"
    assert main(["export", "--runs", "--format", "csv", "--ledger", str(path), "--out", str(out)]) == 0
    table = pd.read_csv(out, keep_default_na=False)
    assert len(table) == 3 and table["outcome"].value_counts().to_dict() == {"pass": 1, "task_failed": 1, "unfinished": 1}
    assert not table.isna().any().any()
    modes = [json.loads(text) for text in table["failure_modes"]]
    assert modes == [["repeated_call"], ["raw_json_in_content"], []]
    failed = table.set_index("run_id")["checks_failed"].map(json.loads).to_dict()
    assert failed == {"p": [], "f": ["names_files"], "u": []}
    assert table.set_index("run_id")["turns"].to_dict() == {"p": 2, "f": 1, "u": 1}  # the unfinished run: turns so far
    assert main(["export", "--runs", "--ledger", str(path)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["requires_tool"] for r in lines] == [True, None, False]
    assert lines[1]["final_answer"] == "{}" and lines[1]["seed"] == 1 and lines[0]["failure_modes"] == ["repeated_call"]


def test_compare_on_two_pairs_prints_an_interval_that_holds_zero(tmp_path, capsys):
    from harness.cli import main

    path = tmp_path / "c.sqlite"
    with Ledger(path) as ledger:
        for rep in range(2):  # A passes both pairs, B neither; a 1/2-vs-1/2 mode whose pairs agree
            modes = ["repeated_call"] if rep == 0 else []
            add_run(ledger, f"a{rep}", model="ollama:a", repetition=rep, turns=[(modes, "ok")])
            add_run(ledger, f"b{rep}", model="ollama:b", repetition=rep, outcome="task_failed", turns=[(modes, "no")])
    assert main(["compare", "a", "b", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    rate = next(line for line in out.splitlines() if line.startswith("| pass rate"))
    low, high = (float(x) for x in re.search(r"\+100\.0 \[([-+]\d+\.\d), ([-+]\d+\.\d)\]", rate).groups())
    assert low < 0 < high and "0.2500" in rate  # consistent with McNemar's mid-p 0.25
    mode = next(line for line in out.splitlines() if line.startswith("| `repeated_call`"))
    low, high = (float(x) for x in re.search(r"\+0\.0 \[([-+]\d+\.\d), ([-+]\d+\.\d)\]", mode).groups())
    assert low < 0 < high  # never the zero-width [+0.0, +0.0]


def test_the_two_judgement_modes_carry_a_rough_note_and_ttft_its_cache_caveat(tmp_path):
    # newcomer: a report showing fabricated_tool_result said nothing of how far those counts can be trusted, and a
    # 17 ms vs 4,125 ms time to first token was llama.cpp's prompt cache, not the cell
    rough, plain = tmp_path / "rough.sqlite", tmp_path / "plain.sqlite"
    with Ledger(rough) as ledger:
        add_run(
            ledger, "a", model="ollama:m", outcome="task_failed", turns=[(["fabricated_tool_result"], "It is 21 °C.")], ttft=17.0
        )
    with Ledger(plain) as ledger:
        add_run(ledger, "b", model="ollama:m", outcome="task_failed", turns=[(["code_fence"], "```json {}```")])
    write_report(rough, tmp_path / "r1", formats=["md"])
    write_report(plain, tmp_path / "r2", formats=["md"])
    md1, md2 = (tmp_path / "r1" / "report.md").read_text(), (tmp_path / "r2" / "report.md").read_text()
    assert "Read the counts of `fabricated_tool_result` as rough" in md1 and "as rough" not in md2
    assert "prompt prefix cached by an earlier run" in md1 and "prompt prefix cached" not in md2


def test_a_dash_under_pass_k_is_explained_under_the_table(tmp_path):
    # newcomer: pass^2 read "–" for a whole row; only the plot caption said why
    short, full = tmp_path / "short.sqlite", tmp_path / "full.sqlite"
    with Ledger(short) as ledger:
        for rep in range(2):
            add_run(ledger, f"a{rep}", model="ollama:a", repetition=rep, scenario="s1", scenario_path="s1.toml")
        add_run(ledger, "b0", model="ollama:a", repetition=0, scenario="s2", scenario_path="s2.toml")
    with Ledger(full) as ledger:
        for rep in range(2):
            add_run(ledger, f"a{rep}", model="ollama:a", repetition=rep)
    write_report(short, tmp_path / "r1", by=["model"], formats=["md"])
    write_report(full, tmp_path / "r2", by=["model"], formats=["md"])
    md1, md2 = (tmp_path / "r1" / "report.md").read_text(), (tmp_path / "r2" / "report.md").read_text()
    sentence = "“–” under pass^k: at least one cell of that row has fewer than k scored runs"
    row = next(line for line in md1.splitlines() if line.startswith("| ollama:a"))
    assert "| –" in row and sentence in md1  # s2 has one run: the model's pass^2 is undefined
    table_end = md1.index("\n\n", md1.index("| ollama:a"))
    assert md1.index(sentence) > table_end  # under the table, not above it
    assert sentence not in md2 and "| –" not in next(line for line in md2.splitlines() if line.startswith("| ollama:a"))
