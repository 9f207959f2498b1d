"""Scenario files: the spec fields, [tool_data], and one clear sentence for every broken file.

Also holds the red-team regression tests for hostile scenario files: fixtures that cannot be
seeded, non-finite numbers, bad matrix axes, and `scenarios check` agreeing with `harness run`.
"""

from __future__ import annotations

import pytest

from harness.cli import main
from harness.errors import ScenarioError
from harness.scenarios import load_scenario
from tests.helpers import SCENARIO_FILE, assert_one_sentence_error, cli, scenario_toml, text_line, write_cassette

BASE = """name = "probe"
what_it_does = "Look up the weather in Paris."
what_it_does_not = "Guessing the weather."
done_looks_like = "The final answer contains 17."
system_prompt = "You are an assistant."
task = "What is the weather in Paris?"
tools = ["get_current_weather", "read_file"]
turn_limit = 6

[fixtures]
"notes.txt" = "Paris"

[tool_data.get_current_weather]
"Paris" = { temperature_c = 17, condition = "light drizzle" }

[[checks]]
type = "final_answer_contains"
text = "17"
"""


def write(tmp_path, text, name="probe.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def without_line(text, prefix):
    lines = [line for line in text.splitlines(keepends=True) if not line.startswith(prefix)]
    assert len(lines) == len(text.splitlines()) - 1
    return "".join(lines)


def test_base_file_loads_with_its_spec_in_the_system_prompt(tmp_path):
    scenario = load_scenario(write(tmp_path, BASE))
    assert (scenario.what_it_does, scenario.what_it_does_not, scenario.done_looks_like) == (
        "Look up the weather in Paris.",
        "Guessing the weather.",
        "The final answer contains 17.",
    )
    system = scenario.system_message("native")
    assert system == "You are an assistant.\n\nScope: Look up the weather in Paris.\nOut of scope: Guessing the weather."
    assert "<tools>" in scenario.system_message("prompt") and "<tools>" not in system


@pytest.mark.parametrize("field", ["what_it_does", "what_it_does_not", "done_looks_like"])
def test_missing_spec_field_is_rejected_naming_file_and_field(tmp_path, field):
    path = write(tmp_path, without_line(BASE, f"{field} ="))
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    assert str(exc.value) == f"{path}: field '{field}' is missing; expected a non-empty string."


@pytest.mark.parametrize("field", ["what_it_does", "what_it_does_not", "done_looks_like"])
@pytest.mark.parametrize("empty", ['""', '"   "', '"""\n\n"""'])
def test_empty_spec_field_is_rejected_naming_file_and_field(tmp_path, field, empty):
    [line] = [line for line in BASE.splitlines() if line.startswith(f"{field} =")]
    path = write(tmp_path, BASE.replace(line, f"{field} = {empty}"))
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    assert str(exc.value).startswith(f"{path}: field '{field}' must be a non-empty string, got ")


# -- [tool_data] -----------------------------------------------------------------------------------------
def test_tool_data_is_bound_to_the_offered_tool(tmp_path):
    scenario = load_scenario(write(tmp_path, BASE))
    weather, read = scenario.tools
    assert weather.data == {"Paris": {"temperature_c": 17, "condition": "light drizzle"}}
    assert read.data is None and read.data_schema is None
    assert scenario.tool_data == {"get_current_weather": weather.data}
    assert [t["function"]["name"] for t in scenario.tool_schemas()] == ["get_current_weather", "read_file"]


# -- hostile files: one sentence naming file and field, exit 1, no traceback ------------------------------
HOSTILE = {
    "missing field": (lambda t: without_line(t, "task ="), "field 'task' is missing"),
    "wrong type": (lambda t: t.replace("turn_limit = 6", 'turn_limit = "six"'), "field 'turn_limit' must be an integer >= 1"),
    "unknown check type": (
        lambda t: t.replace('type = "final_answer_contains"', 'type = "answer_contains"'),
        "field 'checks[0]': check type 'answer_contains' is unknown",
    ),
    "bad regex": (
        lambda t: t.replace(
            'type = "final_answer_contains"\ntext = "17"', 'type = "file_contains"\npath = "a.txt"\nregex = "(17"'
        ),
        "field 'checks[0]': check 'file_contains' regex does not compile",
    ),
    "fixture path with ..": (
        lambda t: t.replace('"notes.txt" = "Paris"', '"../notes.txt" = "Paris"'),
        "field 'fixtures' has an unusable path: '.', '..' and empty components are not allowed: '../notes.txt'",
    ),
    "unknown tool": (lambda t: t.replace('"read_file"]', '"read_files"]'), "field 'tools' must be a list of tool names from"),
    "tool_data for a tool not offered": (
        lambda t: t + '\n[tool_data.list_tickets]\n"T-1" = "help"\n',
        "field 'tool_data.list_tickets' is data for a tool that is not offered",
    ),
    "tool_data for a tool without data": (
        lambda t: t + '\n[tool_data.read_file]\n"a" = "b"\n',
        "field 'tool_data.read_file' is not allowed; the tool read_file takes no fixture data",
    ),
    "tool_data breaks its schema": (
        lambda t: t.replace("temperature_c = 17", 'temperature_c = "warm"'),
        "field 'tool_data.get_current_weather.Paris.temperature_c' is invalid: 'warm' is not of type 'number'",
    ),
    "unknown field": (lambda t: t.replace("turn_limit = 6", "turn_limt = 6"), "unknown field 'turn_limt'"),
    "offered data tool, no table": (
        lambda t: t.replace(
            '[tool_data.get_current_weather]\n"Paris" = { temperature_c = 17, condition = "light drizzle" }\n', ""
        ),
        "field 'tool_data.get_current_weather' is missing; expected a table of fixture data",
    ),
    "tool_data not a table": (
        lambda t: t.replace("turn_limit = 6", "turn_limit = 6\ntool_data = 3").replace(
            '[tool_data.get_current_weather]\n"Paris" = { temperature_c = 17, condition = "light drizzle" }\n', ""
        ),
        "field 'tool_data' must be a table of [tool_data.<tool>] tables",
    ),
    "not TOML": (lambda t: t.replace("turn_limit = 6", "turn_limit = "), "not a valid TOML file"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_file_gets_one_sentence_naming_file_and_field(tmp_path, capsys, case):
    mutate, expected = HOSTILE[case]
    text = mutate(BASE)
    assert text != BASE
    path = write(tmp_path, text)
    assert main(["scenarios", "check", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"harness: {path}: ") and expected in err, err
    assert err.count("\n") == 1 and err.rstrip().endswith(".")
    assert "Traceback" not in err


def test_check_reports_every_bad_file_and_still_accepts_the_good_one(tmp_path, capsys):
    good = write(tmp_path, BASE, "good.toml")
    bad = write(tmp_path, without_line(BASE, "done_looks_like ="), "bad.toml")
    assert main(["scenarios", "check", str(bad), str(good)]) == 1
    out, err = capsys.readouterr()
    assert out == f"{good}: OK (probe, 1 checks)\n"
    assert err == f"harness: {bad}: field 'done_looks_like' is missing; expected a non-empty string.\n"


# -- red-team: hostile scenario files --------------------------------------------------------------------
# red-team finding: fixture paths that cannot be seeded passed `scenarios check`
@pytest.mark.parametrize(
    "fixtures",
    ['"." = "x"', '"a" = "x"\n"a/b" = "y"', '"' + "a" * 300 + '" = "x"'],
    ids=["dot", "file-then-child", "name-too-long"],
)
def test_fixture_paths_that_cannot_be_seeded_are_refused_cleanly(tmp_path, capsys, fixtures):
    # `harness scenarios check` says OK; `harness run` then dies in Sandbox.seed with
    # IsADirectoryError / FileExistsError / OSError(ENAMETOOLONG) tracebacks.
    write_cassette(tmp_path / "done.jsonl", [text_line("done")])
    path = scenario_toml(tmp_path, fixtures=fixtures)
    rc, _, err = cli(capsys, "run", path, "--model", f"replay:{tmp_path / 'done.jsonl'}", "--repeats", 1, "--temperature", 0)
    if rc != 0:
        assert_one_sentence_error(rc, err)
    check_rc, _, check_err = cli(capsys, "scenarios", "check", path)
    assert (check_rc == 0) == (rc == 0), "scenarios check and run disagree about this scenario"


# red-team finding: infinite temperatures were accepted
@pytest.mark.parametrize("value", ["inf", "+inf"])
def test_infinite_temperature_in_a_scenario_is_refused(tmp_path, value):
    # accepted, then sent to servers as the non-JSON token Infinity
    path = scenario_toml(tmp_path, matrix=f"[matrix]\ntemperatures = [{value}]\n")
    with pytest.raises(ScenarioError):
        load_scenario(path)


# red-team finding: `scenarios check` accepted an invalid model spec
def test_scenarios_check_refuses_an_invalid_model_spec_in_the_matrix(tmp_path, capsys):
    # `scenarios check` prints OK; `harness run` on the same file then fails on matrix.models
    path = scenario_toml(tmp_path, matrix='[matrix]\nmodels = ["foo:bar"]\n')
    rc, _, err = cli(capsys, "scenarios", "check", path)
    assert rc == 1 and "matrix.models" in err


# red-team finding: non-finite numbers and case-duplicate cities in tool_data
@pytest.mark.parametrize("table", [
    '"Paris" = { temperature_c = nan, condition = "drizzle" }',
    '"Paris" = { temperature_c = inf, condition = "drizzle" }',
    '"Paris" = { temperature_c = 17, condition = "drizzle" }\n"paris" = { temperature_c = 30, condition = "sun" }',
], ids=["nan", "inf", "case-duplicate-city"])  # fmt: skip
def test_weather_tool_data_refuses_non_finite_numbers_and_case_duplicate_cities(tmp_path, table):
    """TOML allows `nan` and `inf`; the data schema's "number" accepts them, and the tool then
    answers with `NaN`/`Infinity`, which is not JSON although the tool promises JSON. Cities that
    differ only in case ("Paris", "paris") are both accepted, but lookup is case-insensitive and
    the second can never be answered."""
    from harness.errors import ScenarioError

    path = tmp_path / "w.toml"
    path.write_text(
        'name = "w"\nwhat_it_does = "a"\nwhat_it_does_not = "b"\ndone_looks_like = "c"\nsystem_prompt = "s"\n'
        'task = "t"\ntools = ["get_current_weather"]\nchecks = [{type = "tool_call_count", min = 1}]\n'
        f"[tool_data.get_current_weather]\n{table}\n", encoding="utf-8")  # fmt: skip
    with pytest.raises(ScenarioError):
        load_scenario(path)


@pytest.mark.parametrize(
    "head_replace, fixtures, matrix",
    [
        ((('name = "list_and_report"', 'name = "a/b"'),), None, ""),
        ((('name = "list_and_report"', 'name = "list_and_report\\n"'),), None, ""),
        ((("turn_limit = 8", "turn_limit = 0"),), None, ""),
        ((("token_limit = 32000", "token_limit = -5"),), None, ""),
        ((), '"../x" = "x"', ""),
        ((), '"/etc/x" = "x"', ""),
        ((), '"a" = 1', ""),
        ((), None, "[matrix]\ntemperatures = [nan]\n"),
        ((), None, "[matrix]\nrepeats = 0\n"),
        ((), None, "[matrix]\nbogus = 1\n"),
    ],
    ids=[
        "name-slash",
        "name-final-newline",
        "turn-limit-0",
        "negative-tokens",
        "fixture-dotdot",
        "fixture-absolute",
        "fixture-int",
        "temperature-nan",
        "repeats-0",
        "unknown-matrix-key",
    ],  # fmt: skip
)
def test_guard_hostile_scenario_fields_are_scenario_errors(tmp_path, head_replace, fixtures, matrix):
    path = scenario_toml(tmp_path, head_replace=head_replace, fixtures=fixtures, matrix=matrix)
    with pytest.raises(ScenarioError, match=str(path).replace("\\", "\\\\")):
        load_scenario(path)


def test_guard_unreadable_scenario_files_are_scenario_errors(tmp_path):
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(SCENARIO_FILE.read_bytes().replace(b"List the files", b"List th\xe9 files"))
    for path in (tmp_path, latin1, tmp_path / "missing.toml"):
        with pytest.raises(ScenarioError):
            load_scenario(path)


# red-team finding: a scenario offering no tool could still declare that its task needs one
def test_requires_tool_with_no_tool_offered_is_rejected(tmp_path):
    tools = ('tools = ["list_files", "read_file", "write_file"]', "tools = []")
    path = scenario_toml(tmp_path, head_replace=[tools])
    with pytest.raises(ScenarioError, match=r"field 'requires_tool' must be false when tools = \[\]"):
        load_scenario(path)
    allowed = scenario_toml(tmp_path, head_replace=[tools, ("turn_limit", "requires_tool = false\nturn_limit")], name="ok.toml")
    assert load_scenario(allowed).requires_tool is False
