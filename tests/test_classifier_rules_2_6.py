"""The rule classes fixed after batch 2 was opened (docs/failure-modes.md, "Heuristics and their rationale").

Each rule is tested on constructed replies written for it (not the corpus reply that showed the gap), both ways
where the rule has a boundary; the tune-part corpus replies that showed each gap are checked at the end, by id.
The held-out batch is never read here.
"""

from __future__ import annotations

import json

import pytest

from harness.classifier import classify
from tests.helpers import CORPUS, function_tool
from tests.helpers import FILE_TOOLS as FILES
from tests.helpers import reply_modes as modes

F, N = "fabricated_tool_result", "narration_without_call"


WEATHER = [function_tool("get_current_weather", "Get the current weather for a city.", {"city": {"type": "string"}}, ["city"])]
TICKETS = [function_tool("list_tickets", "List the open support tickets.")]
LIST = "List the files in the working directory and write their names to report.txt."
REVIEW = "utils.py has one bug. Read it, then write review.md naming the buggy function and its line."
WX = "What is the weather in Paris right now?"
TK = "List the open support tickets and write triage.csv with id and category."


def calls(content, tools=None):
    return [(c.name, c.arguments) for c in classify({"content": content}, tools=tools).recovered_calls]


# --------------------------------------------------------------------------- call shapes


def test_inputs_is_an_argument_key_like_input():
    text = '{"name": "multiply", "inputs": {"x": 3, "y": 4}}\n\n  \n'
    assert calls(text) == [("multiply", {"x": 3, "y": 4})]
    assert modes(text, requires_tool=None) == {"raw_json_in_content", "nonstandard_keys"}
    assert calls('{"name": "Quarterly plan", "inputs": [1, 2], "owner": "Ann"}') == []  # a document, not a call


def test_a_call_object_under_an_action_key_is_a_call_its_other_fields_the_arguments():
    text = '```json\n{"thought": "Search first", "action": {"name": "web_search", "query": "llama", "why": "facts"}}\n```'
    assert calls(text) == [("web_search", {"query": "llama", "why": "facts"})]
    assert modes(text, requires_tool=None) == {"code_fence", "nonstandard_keys"}
    args = '{"tool_call": {"name": "read_file", "arguments": {"path": "a.txt"}}}'
    assert calls(args) == [("read_file", {"path": "a.txt"})]
    assert calls('{"thought": "x", "action": {"type": "click", "target": "ok"}}') == []  # no name: no call


def test_an_output_label_after_an_action_wrapper_call_presents_its_result():
    text = '```json\n{"thought": "t", "action": {"name": "shell", "command": "df -h"}}\n```\n\nOutput:\n```\n/dev/sda1 40G\n```'
    assert F in modes(text, requires_tool=None)


def test_a_name_glued_to_json_arguments_after_the_mistral_marker_is_a_call():
    text = '[TOOL_CALLS]save_note{"file_path": "/tmp/n.txt", "text": "hi"}'
    assert calls(text) == [("save_note", {"file_path": "/tmp/n.txt", "text": "hi"})]
    assert modes(text) == {"wrong_wrapper_tag", "sandbox_escape_attempt"}  # a call: not skipped_required_tool
    code = "```\nfunction {name} {\n  let x = 1;\n}\n```"
    assert calls(code) == []  # code in a fence: `function {name}` is no name glued to arguments


def test_an_empty_call_after_let_or_await_is_a_statement_calling_the_tool():
    text = "```js\nconst a = await get_current_weather();\n```\n\n```js\nlet b = get_current_weather(city);\n```"
    found = modes(text, WEATHER, WX)
    assert {"multiple_calls", "schema_violation", "code_fence", "foreign_call_syntax"} <= found
    assert "get_current_weather" not in {n for n, _ in calls("I used get_current_weather() before.", WEATHER)}


def test_arguments_no_repair_parses_are_not_judged_against_the_schema():
    repl = [function_tool("python_repl", "Run Python.", {"query": {"type": "string"}}, ["query"])]
    call = {"type": "function", "function": {"name": "python_repl", "arguments": "len(rows) + 1"}}
    result = classify({"content": None, "tool_calls": [call]}, tools=repl)
    assert set(result.failure_modes) == {"invalid_json"}
    missing = {"type": "function", "function": {"name": "python_repl", "arguments": "{}"}}
    assert "schema_violation" in classify({"content": None, "tool_calls": [missing]}, tools=repl).failure_modes


def test_a_model_written_observation_with_a_phrase_is_prose_around_the_call():
    call = 'Action: search\nAction Input: {"q": "tides"}\n'
    assert "mixed_prose" in modes(call + "Observation: The tide tables show two high tides today.", requires_tool=None)
    assert "mixed_prose" not in modes(call + "Observation: 42", requires_tool=None)
    assert "mixed_prose" not in modes(call + "Observation: tides.csv", requires_tool=None)


def test_a_tool_definition_with_its_description_beside_the_function_is_no_call():
    echo = (
        '<tool_response>\n{"type": "function", "function": {"name": "save_json", "parameters": {"type": "thing", '
        '"callback": {"type": "string"}}}, "arguments": {"type": "x"}, "description": "Saves JSON."}\n'
    )
    assert modes(echo, FILES, LIST) == {F, "skipped_required_tool"}


# --------------------------------------------------------------------------- narration_without_call


def test_a_frame_naming_the_output_of_something_presents_an_output_not_a_means():
    text = "The script will produce report.txt.\n\nSo, the output of the script is:\n\n```\nFiles: 3\n```"
    assert N not in modes(text, FILES, LIST)


def test_correct_as_an_adjective_is_no_remedy_but_to_correct_is():
    shown = 'The correct output is:\n\n```\n"name" - the argument of list_files\n```'
    assert N not in modes(shown, FILES, LIST)
    fix = "To correct it, use this code:\n\n```python\nwith open('report.txt', 'w') as f:\n    f.write(names)\n```"
    assert N in modes(fix, FILES, LIST)


def test_code_after_an_opening_result_tag_is_the_fake_results_body():
    text = "<tool_response>\n\n```python\ndef load():\n    with open('data.txt') as f:\n        return f.read()\n```\n"
    assert modes(text, FILES, LIST) == {F, "skipped_required_tool"}


def test_what_code_prints_or_says_in_comments_is_not_what_it_is_about():
    debug = (
        "Here's how you can modify the code to add a debug message:\n\n```python\ndef mean(xs):\n"
        "    print('Line 3: see the log file')  # the file is written later\n    return sum(xs) / len(xs)\n```"
    )
    assert N not in modes(debug, FILES, REVIEW)
    listing = "Here's how you can do it:\n\n```python\nfor name in list_dir_files('.'):\n    print(name)\n```"
    assert N in modes(listing, FILES, LIST)


def test_a_shell_command_handed_over_in_an_inline_code_span():
    assert N in modes("To see what is there, run this command: `ls -la ./docs` and copy the names.", FILES, LIST)
    assert N in modes("You can run `cat notes.txt` to read it.", FILES, LIST)
    assert N not in modes("The `ls` command prints names; `ls -l` adds sizes.", FILES, LIST)
    assert N not in modes("You can use the `cat` command in a terminal.", FILES, LIST)


def test_using_a_package_or_library_announces_the_action():
    assert N in modes("I'm using the requests library to get the forecast for you.", WEATHER, WX)
    assert N not in modes("The requests library is popular.", WEATHER, WX)


# --------------------------------------------------------------------------- fabricated_tool_result


def test_a_decimal_point_does_not_end_a_climate_sentence():
    assert F not in modes("The hottest July on record in Paris reached 37.6 degrees Celsius.", WEATHER, WX)
    assert F in modes("Right now it is 17.5 degrees Celsius in Paris.", WEATHER, WX)


def test_a_fence_framed_as_an_illustration_states_nothing():
    hedged = "Your review could say something like:\n\n```\nThe bug is that the total is never reset.\n```"
    assert F not in modes(hedged, FILES, REVIEW)
    plain = "Here is what I found:\n\n```\nThe bug is that the total is never reset.\n```"
    assert F in modes(plain, FILES, REVIEW)


def test_an_output_label_must_present_what_follows_it():
    finished = (
        '```\nweather = get_current_weather("Paris")\n```\n\nThis will return a JSON payload with the data.\n\n'
        "Note: the payload uses the metric system by default."
    )
    assert F not in modes(finished, WEATHER, WX)
    label = '```\nweather = get_current_weather("Paris")\n```\n\nThis will return:\n\n```\n{"temp": 21}\n```'
    assert F in modes(label, WEATHER, WX)


def test_a_ticket_block_needs_an_id_or_a_text():
    assert F not in modes("Listing:\n\n```\nticket,category,status,title,priority\n```", TICKETS, TK)
    assert F in modes("Listing of the tickets:\n\n```\n101,billing\n102,bug\n```", TICKETS, TK)
    assert F in modes("Listing of the tickets:\n\n```\ncannot reset my password\n```", TICKETS, TK)


def test_a_frame_ending_with_what_the_code_outputs_presents_output():
    text = (
        "In this code, the loop walks the folder and prints one line per file. When you run it, it will output:\n\n"
        "x\nx\nx\n\n```\n```"
    )
    assert F in modes(text, FILES, LIST)
    means = "In this code, the loop walks the folder. Here is the code that lists them:\n\nx\nx\nx\n"
    assert F not in modes(means, FILES, LIST)


def test_a_function_not_named_in_the_prompt_said_to_hold_the_bug():
    assert F in modes('The function "normalize_rows" has the bug on the last line.', FILES, REVIEW)
    known = REVIEW + "\n\n```python\ndef normalize_rows(rows):\n    return rows\n```"
    assert F not in modes('The function "normalize_rows" has the bug.', FILES, known)
    assert F not in modes('I will read the file to find which function has the bug, "maybe" soon.', FILES, REVIEW)


def test_a_files_location_given_as_a_path_the_prompt_does_not_hold():
    assert F in modes('The report.txt file is stored in the folder "/home/ana/reports/report.txt".', FILES, LIST)
    given = LIST + " The report goes to /srv/out/report.txt."
    assert F not in modes('The report.txt file is stored at "/srv/out/report.txt".', FILES, given)


# --------------------------------------------------------------------------- the tune-part replies that showed each gap

TUNE = [
    "b2-agents-quarkuslc4j662-llama3-inputs-json-trailing-blanks",  # inputs
    "b2-agents-kubectlai422-llama32-react-shim-invented-output",  # action wrapper, then Output:
    "b2-server-vllm30651-devstral-toolcalls-create-file",  # [TOOL_CALLS]name{...}
    "b2-embedded-weather_probe-t1-s21-prompt-turn1",  # `let x = await tool()`: two calls
    "b2-family-qwen919-qwen-python-repl-nonjson-args",  # unparsed arguments: invalid_json only
    "agents-crewai1649-llama32-delegate-observation",  # an observation's phrase is prose
    "b2-embedded-extract_fields-t1-s21-prompt-turn1",  # a tool definition echoed in a fake result
    "b2-embedded-list_and_report-t07-s21-native-turn1",  # "the output of your code is:"
    "b2-embedded-weather_probe-t1-s21-prompt-turn5",  # "the correct output is:"
    "b2-embedded-code_review-t07-s21-prompt-turn1",  # code after <tool_response>
    "b2-embedded-code_review-t1-s21-native-turn1",  # domain words only in a print literal
    "b2-embedded-long_context-t1-s21-native-turn1",  # "use the following command: `ls -l`"
    "b2-embedded-long_context-t07-s21-native-turn1",  # "I'm using the package"; a file's location
    "b2-embedded-weather_probe-t07-s21-native-turn1",  # "July 23.7 degrees" is one sentence
    "b2-embedded-code_review-t07-s20-native-turn1",  # "you could write something like:"
    "b2-embedded-list_and_report-t07-s20-native-turn1",  # "it will output something like:"
    "b2-embedded-weather_probe-t1-s21-prompt-turn3",  # "This will return a JSON payload ..." presents nothing
    "b2-embedded-support_triage-t07-s20-native-turn1",  # a header of field names is no ticket
    "b2-embedded-list_and_report-t1-s21-prompt-turn1",  # "In this code ... it will output:"
    "b2-embedded-code_review-t07-s21-native-turn1",  # a function said to hold the bug
]


@pytest.mark.parametrize("entry_id", TUNE)
def test_tune_replies(entry_id):
    assert not entry_id.startswith("b3-"), "the held-out batch is never read here"
    data = json.loads((CORPUS / f"{entry_id}.json").read_text(encoding="utf-8"))
    assert data["held_out"] is False
    result = classify(data["response"], tools=data["tools"], history=data["messages"], requires_tool=data["requires_tool"])
    assert set(result.failure_modes) == set(data["labels"])
