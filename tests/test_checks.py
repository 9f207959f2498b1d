"""Every done-check type, passing and failing, plus the validation of check tables.

Also holds the red-team regression tests for checks: a verdict in bounded time (regex budget,
huge or hostile files), a verdict that matches the documented meaning (csv, json field), and no
crash on a NUL path or a non-string final answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.checks import CHECK_TYPES, CheckContext, evaluate_checks, validate_check
from harness.errors import ScenarioError
from harness.scenarios import load_scenario
from tests.helpers import REPO, assert_recorded, chat_body, run_replay, run_server, scenario_toml, text_line

FIXTURES = ("config.json", "hello.txt", "memo.md")


def verdict(tmp_path, check, *, files=None, written=(), final_answer=None, calls=0):
    """Evaluate one check on a sandbox holding the fixtures plus ``files``; return (passed, detail)."""
    box = tmp_path / "box"
    box.mkdir(parents=True, exist_ok=True)
    for name in FIXTURES:
        (box / name).write_text("x", encoding="utf-8")
    for name, text in (files or {}).items():
        (box / name).write_text(text, encoding="utf-8")
    assert validate_check(check) is None
    [result] = evaluate_checks([check], CheckContext(box, FIXTURES, tuple(written), final_answer, calls))
    assert result.check == check["type"]
    return result.passed, result.detail


REPORT = {"report.txt": "There are 3 files:\nconfig.json\nhello.txt\nmemo.md\n"}
FABRICATED = {"report.txt": "There are 3 files:\nconfig.json\necho.txt\nmemo.md\n"}


# -- file_exists / file_contains -------------------------------------------------------------------------
def test_file_exists(tmp_path):
    assert verdict(tmp_path, {"type": "file_exists", "path": "report.txt"}, files=REPORT) == (True, "report.txt exists")
    assert verdict(tmp_path / "b", {"type": "file_exists", "path": "report.txt"}) == (False, "report.txt does not exist")


def test_file_exists_refuses_paths_outside_the_sandbox(tmp_path):
    (tmp_path / "outside.txt").write_text("x")
    assert verdict(tmp_path, {"type": "file_exists", "path": "../outside.txt"}) == (False, "../outside.txt does not exist")


def test_file_contains_text_is_case_insensitive(tmp_path):
    check = {"type": "file_contains", "path": "report.txt", "text": "HELLO.TXT"}
    assert verdict(tmp_path, check, files=REPORT) == (True, "contains 'HELLO.TXT'")
    assert verdict(tmp_path / "b", check, files=FABRICATED) == (False, "does not contain 'HELLO.TXT'")


def test_file_contains_regex(tmp_path):
    check = {"type": "file_contains", "path": "review.md", "regex": r"(?i)\bline\s*13\b"}
    assert verdict(tmp_path, check, files={"review.md": "Bug at Line 13."})[0] is True
    passed, detail = verdict(tmp_path / "b", check, files={"review.md": "Bug at line 130."})
    assert not passed and detail == r"does not match /(?i)\bline\s*13\b/"


# -- file names ------------------------------------------------------------------------------------------
def test_file_names_all_fixtures(tmp_path):
    check = {"type": "file_names_all_fixtures", "path": "report.txt"}
    assert verdict(tmp_path, check, files=REPORT) == (True, "names every fixture file")
    assert verdict(tmp_path / "b", check, files=FABRICATED) == (False, "does not name ['hello.txt']")


def test_file_names_only_existing_catches_a_fabricated_name(tmp_path):
    check = {"type": "file_names_only_existing", "path": "report.txt"}
    assert verdict(tmp_path, check, files=REPORT) == (True, "names only existing files")
    # the reference failure: echo.txt instead of hello.txt
    assert verdict(tmp_path / "b", check, files=FABRICATED) == (False, "names files that do not exist: ['echo.txt']")


def test_file_names_only_existing_ignores_prose_and_numbers(tmp_path):
    check = {"type": "file_names_only_existing", "path": "report.txt"}
    text = {"report.txt": "Found 3.0 files, e.g. memo.md and config.json (v1.5).\n"}
    assert verdict(tmp_path, check, files=text) == (True, "names only existing files")


# -- file_states_count -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["There are 3 files.", "three files", "Count: 3", "THREE"])
def test_file_states_count_accepts_digits_and_words(tmp_path, text):
    check = {"type": "file_states_count", "path": "report.txt", "count": 3}
    assert verdict(tmp_path, check, files={"report.txt": text}) == (True, "states the count 3")


@pytest.mark.parametrize("text", ["There are 13 files.", "2 files", "version 3.1", "threefold", "30 items"])
def test_file_states_count_rejects_other_numbers(tmp_path, text):
    check = {"type": "file_states_count", "path": "report.txt", "count": 3}
    assert verdict(tmp_path, check, files={"report.txt": text}) == (False, "does not state the count 3")


# -- JSON and CSV ----------------------------------------------------------------------------------------
FIELDS = {"fields.json": json.dumps({"date": "2024-05-21", "cost": "EUR 4,250.00", "meta": {"pages": 2}})}


def test_file_json_field_equal_values_and_dotted_paths(tmp_path):
    assert verdict(
        tmp_path, {"type": "file_json_field", "path": "fields.json", "field": "date", "value": "2024-05-21"}, files=FIELDS
    ) == (True, 'date = "2024-05-21"')
    assert verdict(
        tmp_path, {"type": "file_json_field", "path": "fields.json", "field": "meta.pages", "value": 2}, files=FIELDS
    ) == (True, "meta.pages = 2")


def test_file_json_field_failures(tmp_path):
    check = {"type": "file_json_field", "path": "fields.json", "field": "cost", "value": "EUR 4,250.00"}
    assert verdict(tmp_path, check, files={"fields.json": '{"cost": 4250}'}) == (False, 'cost = 4250, expected "EUR 4,250.00"')
    assert verdict(tmp_path / "b", check, files={"fields.json": '{"price": "EUR 4,250.00"}'}) == (
        False,
        "field 'cost' is missing",
    )
    assert verdict(tmp_path / "c", check, files={"fields.json": "cost: EUR 4,250.00"}) == (False, "fields.json is not valid JSON")
    assert verdict(tmp_path / "d", check) == (False, "fields.json does not exist")


TRIAGE = {"triage.csv": "ticket, category\nT-101, Billing\nT-102,bug\n"}


def test_file_csv_value(tmp_path):
    check = {
        "type": "file_csv_value",
        "path": "triage.csv",
        "key_column": "ticket",
        "key": "T-101",
        "column": "category",
        "value": "billing",
    }
    assert verdict(tmp_path, check, files=TRIAGE) == (True, "T-101: category = 'Billing'")
    wrong = {**check, "key": "T-102"}
    assert verdict(tmp_path / "b", wrong, files=TRIAGE) == (False, "T-102: category = 'bug', expected 'billing'")
    missing = {**check, "key": "T-109"}
    assert verdict(tmp_path / "c", missing, files=TRIAGE) == (False, "no row with ticket = 'T-109'")


def test_file_csv_values_in(tmp_path):
    check = {"type": "file_csv_values_in", "path": "triage.csv", "column": "category", "allowed": ["billing", "bug"], "rows": 2}
    assert verdict(tmp_path, check, files=TRIAGE) == (True, "2 data row(s), every category in ['billing', 'bug']")
    outside = {"triage.csv": "ticket,category\nT-101,refund\nT-102,bug\n"}
    assert verdict(tmp_path / "b", check, files=outside) == (False, "category values not in ['billing', 'bug']: ['refund']")
    too_many = {"triage.csv": "ticket,category\nT-101,billing\nT-102,bug\nT-103,bug\n"}
    assert verdict(tmp_path / "c", check, files=too_many) == (False, "3 data row(s), expected 2")
    no_column = {"triage.csv": "ticket,label\nT-101,billing\n"}
    assert verdict(tmp_path / "d", check, files=no_column) == (False, "no column 'category' in the header ['ticket', 'label']")


# -- final answer, writes, calls -------------------------------------------------------------------------
def test_final_answer_contains(tmp_path):
    check = {"type": "final_answer_contains", "text": "paris"}
    assert verdict(tmp_path, check, final_answer="The capital is Paris.") == (True, "final answer contains 'paris'")
    assert verdict(tmp_path, check, final_answer="The capital is Lyon.") == (False, "final answer does not contain 'paris'")
    assert verdict(tmp_path, check, final_answer=None) == (False, "final answer does not contain 'paris'")


def test_final_answer_not_contains(tmp_path):
    check = {"type": "final_answer_not_contains", "text": "<tool_call>"}
    assert verdict(tmp_path, check, final_answer="Done.") == (True, "final answer does not contain '<tool_call>'")
    assert verdict(tmp_path, check, final_answer='<tool_call>{"name": "x"}') == (False, "final answer contains '<tool_call>'")


def test_only_files_written(tmp_path):
    check = {"type": "only_files_written", "allowed": ["report.txt"]}
    assert verdict(tmp_path, check, written=["report.txt"]) == (True, "only allowed files were written")
    assert verdict(tmp_path, check, written=[]) == (True, "only allowed files were written")
    assert verdict(tmp_path, check, written=["report.txt", "hello.txt"]) == (False, "unexpected files written: ['hello.txt']")


def test_no_tool_called(tmp_path):
    assert verdict(tmp_path, {"type": "no_tool_called"}, calls=0) == (True, "0 tool call(s) made")
    assert verdict(tmp_path, {"type": "no_tool_called"}, calls=1) == (False, "1 tool call(s) made")


def test_tool_call_count(tmp_path):
    at_least = {"type": "tool_call_count", "min": 1}
    assert verdict(tmp_path, at_least, calls=4) == (True, "4 tool call(s) made")
    assert verdict(tmp_path, at_least, calls=0) == (False, "0 tool call(s) made, expected at least 1")
    between = {"type": "tool_call_count", "min": 1, "max": 2}
    assert verdict(tmp_path, between, calls=2) == (True, "2 tool call(s) made")
    assert verdict(tmp_path, between, calls=3) == (False, "3 tool call(s) made, expected between 1 and 2")


def test_every_check_type_is_tested_here():
    source = Path(__file__).read_text(encoding="utf-8")
    untested = [kind for kind in CHECK_TYPES if f'"type": "{kind}"' not in source]
    assert untested == []


def test_evaluation_keeps_order_and_never_raises_on_model_output(tmp_path):
    box = tmp_path / "box"
    box.mkdir()
    (box / "fields.json").write_bytes(b"\xff\xfe not utf-8")
    (box / "triage.csv").write_text('ticket,category\n"T-101,billing\n')  # unterminated quote
    checks = [
        {"type": "file_json_field", "path": "fields.json", "field": "a", "value": 1},
        {
            "type": "file_csv_value",
            "path": "triage.csv",
            "key_column": "ticket",
            "key": "T-101",
            "column": "category",
            "value": "billing",
        },
        {"type": "no_tool_called"},
    ]
    results = evaluate_checks(checks, CheckContext(box, (), (), None, 0))
    assert [(r.check, r.passed) for r in results] == [
        ("file_json_field", False),
        ("file_csv_value", False),
        ("no_tool_called", True),
    ]


# -- validation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("check", "problem"),
    [
        ("file_exists", "each [[checks]] entry must be a table"),
        ({"type": "file_exist", "path": "a"}, "check type 'file_exist' is unknown"),
        ({"type": "file_exists"}, "check 'file_exists' needs the parameter 'path'"),
        ({"type": "file_exists", "path": "a", "mode": "x"}, "check 'file_exists' has an unknown parameter 'mode'"),
        (
            {"type": "file_states_count", "path": "a", "count": "3"},
            "check 'file_states_count' parameter 'count' must be of type int, got str",
        ),
        (
            {"type": "file_states_count", "path": "a", "count": True},
            "check 'file_states_count' parameter 'count' must be of type int, got bool",
        ),
        ({"type": "file_contains", "path": "a"}, "check 'file_contains' needs exactly one of 'text' or 'regex'"),
        (
            {"type": "file_contains", "path": "a", "text": "x", "regex": "x"},
            "check 'file_contains' needs exactly one of 'text' or 'regex'",
        ),
        ({"type": "file_contains", "path": "a", "regex": "(unclosed"}, "check 'file_contains' regex does not compile"),
        (
            {"type": "only_files_written", "allowed": [1]},
            "check 'only_files_written' parameter 'allowed' must be a non-empty list of non-empty strings",
        ),
        (
            {"type": "file_csv_values_in", "path": "a", "column": "c", "allowed": []},
            "check 'file_csv_values_in' parameter 'allowed' must be a non-empty list",
        ),
        (
            {"type": "file_csv_values_in", "path": "a", "column": "c", "allowed": ["x"], "rows": -1},
            "check 'file_csv_values_in' parameter 'rows' must be 0 or more",
        ),
        ({"type": "tool_call_count", "min": 2, "max": 1}, "check 'tool_call_count' parameter 'max' must be at least 'min'"),
    ],
)
def test_validate_check_names_the_problem(check, problem):
    message = validate_check(check)
    assert message is not None and message.startswith(problem)


# -- red-team: bounded, documented verdicts on hostile input ---------------------------------------------
def _check(tmp_path: Path, content: str | bytes, check: dict, name: str = "out.txt"):
    target = tmp_path / "sb" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    [result] = evaluate_checks([check], CheckContext(tmp_path / "sb", (), (name,), None, 0))
    return result


# red-team finding: a non-string final answer crashed the checks
@pytest.mark.parametrize(
    "content, check",
    [
        ([{"type": "text", "text": "done"}], {"type": "final_answer_contains", "text": "done"}),
        (7, {"type": "final_answer_not_contains", "text": "x"}),
    ],
    ids=["content-parts-list", "content-int"],
)
def test_non_string_final_answer_does_not_crash_the_checks(tmp_path, scenario, content, check):
    # evaluate_checks -> (ctx.final_answer or "").lower(): AttributeError escapes run_once after
    # the turns were recorded; the run never gets its end row.
    body = chat_body({"role": "assistant", "content": content})
    summary, facts = run_server(tmp_path, scenario, [body], checks=(check,))
    assert_recorded(summary, facts)


# red-team finding: a check path with a NUL byte crashed the end of the run
def test_check_path_with_nul_byte_is_refused_or_evaluated(tmp_path, scenario):
    # validate_check accepts path = "a\u0000b"; at the end of the run _read() calls
    # Path.resolve(), which raises ValueError (not caught by evaluate_checks): run_once raises
    # after every turn was recorded and the run gets no end row.
    path = scenario_toml(tmp_path, checks='[[checks]]\ntype = "file_exists"\npath = "a\\u0000b"')
    try:
        loaded = load_scenario(path)
    except ScenarioError:
        return
    summary, facts = run_replay(tmp_path, loaded, [text_line("done")])
    assert_recorded(summary, facts)


# red-team finding: a catastrophic regex hung the end of a run
def test_a_catastrophic_check_regex_cannot_hang_the_end_of_a_run(tmp_path):
    """`file_contains` runs the scenario's regex with `re.search` on up to 1 MiB of model-written
    text, with no time budget. `^(a+)+$` against 40 'a's and a '!' never finishes (28 'a's already
    take ~15 s), so the run never gets its end row and, in a matrix, its worker never frees; Python's
    `re` holds the GIL, so Ctrl-C cannot stop it either. Expected: a bounded evaluation that fails
    the check with 'could not evaluate: timed out' (or the regex refused when the scenario loads)."""
    sandbox = tmp_path / "sb"
    sandbox.mkdir()
    (sandbox / "r.txt").write_text("a" * 40 + "!", encoding="utf-8")
    code = (
        "import sys; from pathlib import Path\n"
        "from harness.checks import CheckContext, evaluate_checks\n"
        "check = {'type': 'file_contains', 'path': 'r.txt', 'regex': '^(a+)+$'}\n"
        f"print(evaluate_checks([check], CheckContext(Path({str(sandbox)!r}), (), (), None, 0)))\n"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=8)
    except subprocess.TimeoutExpired:
        pytest.fail("evaluating one file_contains check took more than 8 s (catastrophic backtracking, no time budget)")
    assert done.returncode == 0 and "passed=False" in done.stdout


# red-team finding: file_json_field confused booleans with numbers
@pytest.mark.parametrize("written, expected", [('{"count": true}', 1), ('{"count": 1}', True), ('{"flag": 0}', False)])
def test_file_json_field_does_not_confuse_booleans_with_numbers(tmp_path, written, expected):
    """`file_json_field` compares with Python `==`, where True == 1 and False == 0: a model that
    writes `true` passes a check for the number 1 (and `0` passes a check for false)."""
    field = "count" if "count" in written else "flag"
    result = _check(tmp_path, written, {"type": "file_json_field", "path": "out.txt", "field": field, "value": expected})
    assert not result.passed, result.detail


# red-team finding: csv checks failed on a UTF-8 BOM
def test_csv_checks_read_a_file_with_a_utf8_byte_order_mark(tmp_path):
    """A CSV saved with a UTF-8 BOM (Excel, PowerShell, many Windows tools; a model can emit it
    too) is decoded with 'utf-8', so the first header is '\\ufeffticket' and every check on that
    column fails with the misleading 'no row with ticket = ...' / 'no column ticket'."""
    body = b"ticket,category\nT-101,billing\nT-102,bug\n"
    check = {
        "type": "file_csv_value",
        "path": "t.csv",
        "key_column": "ticket",
        "key": "T-101",
        "column": "category",
        "value": "billing",
    }
    result = _check(tmp_path, b"\xef\xbb\xbf" + body, check, name="t.csv")
    assert result.passed, result.detail


# red-team finding: file_csv_values_in looked for the column in the first data row
def test_file_csv_values_in_checks_the_column_against_the_header(tmp_path):
    """The column's presence is checked on the first data row, not the header: a file with only a
    header that lacks the column passes ('0 data row(s), every category in [...]')."""
    check = {"type": "file_csv_values_in", "path": "t.csv", "column": "category", "allowed": ["bug"]}
    result = _check(tmp_path, "ticket,label\n", check, name="t.csv")
    assert not result.passed, result.detail


# red-team finding: file_csv_values_in looked for the column in the first data row
def test_file_csv_values_in_names_the_short_row_not_a_missing_column(tmp_path):
    """A short first data row is reported as "no column 'category'" although the header has it."""
    check = {"type": "file_csv_values_in", "path": "t.csv", "column": "category", "allowed": ["bug"]}
    result = _check(tmp_path, "ticket,category\nT-1\nT-2,bug\n", check, name="t.csv")
    assert not result.passed
    assert "no column" not in result.detail, result.detail


@pytest.mark.parametrize("content, check, passed", [
    ('ticket,category\nT-101,"bill\ning"\n', {"column": "category", "allowed": ["billing"]}, False),
    ("ticket , category \nT-1, bug \n", {"column": "category", "allowed": ["bug"], "rows": 1}, True),
    ("ticket,category\n" + "T,bug\n" * 60_000, {"column": "category", "allowed": ["bug"]}, True),
])  # fmt: skip
def test_guard_csv_checks_on_quoted_newlines_spaces_and_big_files(tmp_path, content, check, passed):
    result = _check(tmp_path, content, {"type": "file_csv_values_in", "path": "t.csv", **check}, name="t.csv")
    assert result.passed is passed, result.detail


def test_guard_checks_on_hostile_json_and_huge_files(tmp_path):
    deep = _check(tmp_path, "[" * 200_000, {"type": "file_json_field", "path": "out.txt", "field": "a", "value": 1})
    assert not deep.passed and "could not evaluate" in deep.detail
    started = time.perf_counter()
    names = _check(tmp_path, ("a." * 400_000) + "\n" + "x-" * 100_000, {"type": "file_names_only_existing", "path": "out.txt"})
    assert time.perf_counter() - started < 5 and names.detail
