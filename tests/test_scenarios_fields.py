"""Scenario fields that loaded but could not work: one sentence naming the file and the field, exit 1.

Red-team findings: a tool named twice was offered twice; a ``file_json_field`` value of ``nan``
or ``inf`` and an empty check text (or regex, or ``tool_call_count`` with ``min = 0`` and no
``max``) made checks that decide nothing; a name of ``..`` or 5,000 characters; an
``api_key_env`` no environment can hold; base seeds that `harness run` refuses passed
`scenarios check`; `scenarios list` stopped at the first bad file (and called a missing folder
empty); a bad ``[matrix] models`` entry was not named.
"""

from __future__ import annotations

import pytest

from tests.helpers import SCENARIO_FILE, assert_one_sentence_error, cli, scenario_toml

TOOLS = 'tools = ["list_files", "read_file", "write_file"]'


def refused(capsys, path, *expected):
    """`harness scenarios check PATH` fails with one sentence naming the file and holding each of ``expected``."""
    rc, out, err = cli(capsys, "scenarios", "check", path)
    assert_one_sentence_error(rc, err)
    assert out == "" and err.startswith(f"harness: {path}: ") and err.rstrip().endswith("."), err
    for part in expected:
        assert part in err, err
    return err


def accepted(capsys, path):
    rc, out, err = cli(capsys, "scenarios", "check", path)
    assert (rc, err) == (0, ""), err
    assert out.startswith(f"{path}: OK ("), out


# -- 1. a tool named twice -------------------------------------------------------------------------------
def test_a_tool_named_twice_is_refused(tmp_path, capsys):
    path = scenario_toml(tmp_path, head_replace=[(TOOLS, 'tools = ["read_file", "read_file", "write_file"]')])
    refused(capsys, path, "field 'tools' names 'read_file' twice; offer each tool once")


# -- 2. non-finite check values --------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
def test_a_non_finite_json_field_value_is_refused(tmp_path, capsys, value):
    check = f'[[checks]]\ntype = "file_json_field"\npath = "out.json"\nfield = "a.b"\nvalue = {value}\n'
    path = scenario_toml(tmp_path, checks=check)
    refused(capsys, path, "field 'checks[0]': check 'file_json_field' parameter 'value' must be a finite number, got ")


def test_a_finite_json_field_value_is_still_accepted(tmp_path, capsys):
    check = '[[checks]]\ntype = "file_json_field"\npath = "out.json"\nfield = "a"\nvalue = 1.5\n'
    accepted(capsys, scenario_toml(tmp_path, checks=check))


# -- 3. checks that decide nothing -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "check, expected",
    [
        ('type = "final_answer_contains"\ntext = ""', "parameter 'text' is empty: every answer contains the empty text, so the check always passes"),
        ('type = "final_answer_not_contains"\ntext = ""', "parameter 'text' is empty: every answer contains the empty text, so the check never passes"),
        ('type = "file_contains"\npath = "a.txt"\ntext = ""', "parameter 'text' is empty: every file contains the empty text"),
        ('type = "file_contains"\npath = "a.txt"\nregex = ""', "parameter 'regex' is empty: it matches every file"),
        ('type = "tool_call_count"\nmin = 0', "check 'tool_call_count' with 'min' = 0 and no 'max' always passes"),
    ],
    ids=["answer-contains", "answer-not-contains", "file-contains-text", "file-contains-regex", "call-count-min-0"],
)  # fmt: skip
def test_a_check_that_decides_nothing_is_refused(tmp_path, capsys, check, expected):
    path = scenario_toml(tmp_path, checks=f"[[checks]]\n{check}\n")
    refused(capsys, path, "field 'checks[0]': ", expected)


@pytest.mark.parametrize(
    "check",
    ['type = "final_answer_contains"\ntext = " "', 'type = "tool_call_count"\nmin = 0\nmax = 0', 'type = "file_contains"\npath = "a.txt"\nregex = "^$"'],
    ids=["space", "no-calls", "empty-file-regex"],
)  # fmt: skip
def test_checks_that_can_fail_are_still_accepted(tmp_path, capsys, check):
    accepted(capsys, scenario_toml(tmp_path, checks=f"[[checks]]\n{check}\n"))


# -- 4. the name -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [".", "..", ".hidden", "-x", "a" * 101], ids=["dot", "dotdot", "hidden", "dash", "101"])
def test_a_name_outside_the_rule_is_refused(tmp_path, capsys, name):
    path = scenario_toml(tmp_path, head_replace=[('name = "list_and_report"', f'name = "{name}"')])
    refused(capsys, path, "field 'name' must be 1 to 100 letters, digits, '_', '.' or '-', not starting with '.' or '-', got ")


def test_a_5000_character_name_is_refused_by_its_length(tmp_path, capsys):
    path = scenario_toml(tmp_path, head_replace=[('name = "list_and_report"', f'name = "{"a" * 5000}"')])
    err = refused(capsys, path, "field 'name' must be 1 to 100 ", "got 5000 characters.")
    assert len(err) < 300


@pytest.mark.parametrize("name", ["a" * 100, "v1.2-x_y", "_draft", "7up"])
def test_a_name_inside_the_rule_is_accepted(tmp_path, capsys, name):
    accepted(capsys, scenario_toml(tmp_path, head_replace=[('name = "list_and_report"', f'name = "{name}"')]))


# -- 5. api_key_env --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "env",
    ["A=B\\u0000", "1KEY", "MY KEY", "MY-KEY", " ", ""],
    ids=["equals-nul", "digit", "space", "dash", "blank", "empty"],  # empty: red team 2 (it fell back to OPENAI_API_KEY)
)
def test_an_api_key_env_that_no_environment_can_hold_is_refused(tmp_path, capsys, env):
    path = scenario_toml(tmp_path, head_replace=[("turn_limit = 8", f'turn_limit = 8\napi_key_env = "{env}"')])
    err = refused(
        capsys,
        path,
        "field 'api_key_env' must be an environment variable name (letters, digits and '_', not starting with a digit), got ",
    )
    assert "\x00" not in err  # fmt: skip


@pytest.mark.parametrize("env", ["MY_KEY", "_k1"])
def test_a_valid_api_key_env_is_accepted(tmp_path, capsys, env):
    accepted(capsys, scenario_toml(tmp_path, head_replace=[("turn_limit = 8", f'turn_limit = 8\napi_key_env = "{env}"')]))


# -- 6. seeds: `scenarios check` agrees with `harness run` -----------------------------------------------
@pytest.mark.parametrize("matrix", ["seeds = [1, 1]", "seeds = [0, 1]\nrepeats = 2"], ids=["same", "overlapping"])
def test_seeds_that_run_refuses_are_refused_by_scenarios_check(tmp_path, capsys, matrix):
    path = scenario_toml(tmp_path, matrix=f"[matrix]\n{matrix}\n")
    refused(capsys, path, "field 'matrix.seeds': the base seeds ", " both send seed 1 ")
    rc, _, err = cli(capsys, "run", path, "--dry-run", "--ledger", tmp_path / "l.sqlite")
    assert_one_sentence_error(rc, err)


def test_seeds_spaced_by_the_repeats_are_accepted(tmp_path, capsys):
    accepted(capsys, scenario_toml(tmp_path, matrix="[matrix]\nseeds = [0, 2]\nrepeats = 2\n"))


# -- 7. scenarios list -----------------------------------------------------------------------------------
def test_scenarios_list_lists_every_good_file_and_names_every_bad_one(tmp_path, capsys):
    good = tmp_path / "b_good.toml"
    good.write_bytes(SCENARIO_FILE.read_bytes())
    first = scenario_toml(tmp_path, head_replace=[("turn_limit = 8", "turn_limit = 0")], name="a_bad.toml")
    last = scenario_toml(tmp_path, head_replace=[('name = "list_and_report"', 'name = ".."')], name="c_bad.toml")
    rc, out, err = cli(capsys, "scenarios", "list", tmp_path)
    assert rc == 1
    assert "list_and_report" in out and str(good) in out and "a_bad" not in out and "c_bad" not in out
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"harness: {first}: field 'turn_limit'"), err
    assert lines[1].startswith(f"harness: {last}: field 'name'") and "Traceback" not in err


def test_scenarios_list_of_a_missing_folder_says_it_does_not_exist(tmp_path, capsys):
    missing = tmp_path / "nonexistent"
    rc, out, err = cli(capsys, "scenarios", "list", missing)
    assert_one_sentence_error(rc, err)
    assert out == "" and err == f"harness: {missing}: no such folder; give a folder that holds scenario files (*.toml).\n"


def test_scenarios_list_of_a_file_says_it_is_not_a_folder(tmp_path, capsys):
    rc, out, err = cli(capsys, "scenarios", "list", SCENARIO_FILE)
    assert_one_sentence_error(rc, err)
    assert out == "" and err.startswith(f"harness: {SCENARIO_FILE}: not a folder; ")


def test_scenarios_list_of_an_empty_folder_still_says_so(tmp_path, capsys):
    rc, _, err = cli(capsys, "scenarios", "list", tmp_path)
    assert_one_sentence_error(rc, err)
    assert err == f"harness: {tmp_path}: no scenario files (*.toml) found.\n"


# -- 8. the bad [matrix] models entry is named -----------------------------------------------------------
def test_the_first_bad_model_entry_is_named(tmp_path, capsys):
    path = scenario_toml(tmp_path, matrix='[matrix]\nmodels = ["bogus:x", ""]\n')
    refused(capsys, path, "field 'matrix.models[0]': Model spec 'bogus:x' is not valid")


def test_an_empty_model_entry_is_named_by_its_index(tmp_path, capsys):
    path = scenario_toml(tmp_path, matrix='[matrix]\nmodels = ["embedded:smollm2-135m", ""]\n')
    refused(capsys, path, "field 'matrix.models[1]' must be a model spec string, got \"\".")


@pytest.mark.parametrize(
    "matrix, expected",
    [
        ('models = ["embedded:smollm2-135m", "\\u001b[31m"]', "field 'matrix.models[1]': Model spec '\\x1b[31m' is not valid"),
        ('temperatures = [0.0, "\\u001b[31m"]', "field 'matrix.temperatures[1]' must be a finite number >= 0, got \"\\u001b[31m\"."),
    ],
    ids=["model", "temperature"],
)  # fmt: skip
def test_a_bad_entry_is_named_escaped(tmp_path, capsys, matrix, expected):
    err = refused(capsys, scenario_toml(tmp_path, matrix=f"[matrix]\n{matrix}\n"), expected)
    assert "\x1b" not in err
