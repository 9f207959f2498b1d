"""Classifier 2.9.0: the batch-5 adjudicator's rulings (docs/failure-modes.md) and the rule classes fixed after
batch 5 was opened, each on short constructed replies written for it, both ways where the rule has a boundary;
plus the whitespace-padded brace that took 30+ seconds in 2.8.0."""

from __future__ import annotations

import pytest

from harness.classifier import classify
from tests.helpers import FILE_TOOLS as FILES
from tests.helpers import function_tool
from tests.helpers import reply_modes as modes

WEATHER = [function_tool("get_current_weather", "Get the current weather.", {"location": {"type": "string"}}, ["location"])]
CITY = [function_tool("get_weather", "Get the current weather for a city.", {"city": {"type": "string"}}, ["city"])]
TICKETS = [function_tool("list_tickets", "List the open support tickets.", {}), *FILES]


def calls(content, tools=None):
    return [(c.name, c.arguments) for c in classify({"content": content}, tools=tools).calls("lenient")]


# --- multiple_calls counts the calls found only in the reasoning


def test_several_calls_in_reasoning_are_multiple_calls():
    reasoning = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>\n' * 1 + (
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "b.txt"}}\n</tool_call>'
    )
    found = modes("", FILES, reasoning_content=reasoning)
    assert {"call_in_reasoning", "multiple_calls"} <= found


def test_one_call_in_reasoning_is_not_multiple_calls():
    reasoning = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'
    found = modes("", FILES, reasoning_content=reasoning)
    assert "call_in_reasoning" in found and "multiple_calls" not in found


# --- prefixed name and argument keys


@pytest.mark.parametrize("args_key", ["tool_arguments", "function_args", "toolInput", "tool_input"])
def test_prefixed_argument_key_is_a_call_with_nonstandard_keys(args_key):
    content = f'Action:\n{{"tool_name": "get_weather", "{args_key}": {{"city": "Paris"}}}}'
    assert calls(content) == [("get_weather", {"city": "Paris"})]
    assert {"raw_json_in_content", "nonstandard_keys"} <= modes(content)


def test_unprefixed_unknown_key_stays_data():
    assert calls('{"tool_name": "get_weather", "settings": [1, 2], "owner": "me"}') == []


# --- a call wrapper naming the tool in an attribute; a flat name object inside a call wrapper


def test_tool_call_tag_naming_the_tool_around_json_arguments():
    content = '<tool_call id="c_1" name="get_weather">\n{"city": "Paris"}\n</tool_call>'
    assert calls(content, CITY) == [("get_weather", {"city": "Paris"})]
    found = modes(content, CITY)
    assert "tool_call_tags_in_content" in found
    assert not found & {"wrong_wrapper_tag", "foreign_call_syntax", "skipped_required_tool"}


def test_flat_name_object_in_tool_call_wrapper_counts_with_tools_unknown():
    content = '<tool_call>\n{"name": "click", "point": [4, 2]}\n</tool_call>'
    assert calls(content) == [("click", {"point": [4, 2]})]
    assert {"tool_call_tags_in_content", "nonstandard_keys"} <= modes(content)


def test_flat_name_object_outside_a_call_wrapper_is_data_with_tools_unknown():
    assert calls('{"name": "click", "point": [4, 2]}') == []
    assert calls('<json>\n{"name": "Dana", "age": 4}\n</json>') == []


# --- the tag form with the tools not known


@pytest.mark.parametrize("content", ["<list_memories></list_memories>", "<read_file><path>a.txt</path></read_file>"])
def test_element_named_like_a_tool_that_is_the_whole_reply_is_a_call(content):
    assert calls(content)
    assert "foreign_call_syntax" in modes(content)


@pytest.mark.parametrize(
    "content",
    [
        "<div></div>",  # an HTML element, not a tool's name
        "Use <list_memories></list_memories> to see them.",  # not the whole reply
        "<list_memories>all of them, please</list_memories>",  # holds text, not parameter elements
    ],
)
def test_element_that_is_no_whole_tool_element_is_no_call(content):
    assert calls(content) == []


def test_element_with_tools_known_needs_an_offered_name():
    assert calls("<list_memories></list_memories>", FILES) == []
    assert calls("<list_files></list_files>", FILES) == [("list_files", {})]


# --- colon-named arguments and the tools. namespace


def test_colon_named_arguments_are_keyword_arguments():
    content = 'get_current_weather(location:"Paris")'
    assert calls(content, WEATHER) == [("get_current_weather", {"location": "Paris"})]
    found = modes(content, WEATHER)
    assert "foreign_call_syntax" in found and not found & {"invalid_json", "repaired_json"}


def test_colon_named_arguments_are_validated():
    found = modes('get_weather(location:"Paris")', CITY)
    assert "schema_violation" in found and not found & {"invalid_json", "repaired_json"}


def test_tools_namespace_with_python_spellings_is_no_repair():
    found = modes("tools.write_file(path='r.txt', content=None)", FILES)
    assert "foreign_call_syntax" in found and "repaired_json" not in found


# --- rule 3: values about nothing the tools handle


def _after_result(reply, result):
    history = [
        {"role": "user", "content": "Triage the open tickets."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "list_tickets", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]  # fmt: skip
    return set(classify({"content": reply}, tools=TICKETS, history=history).failure_modes)


def test_date_about_nothing_the_tools_handle_is_general_knowledge():
    found = _after_result("The tool failed. Python 3.4 came out on 2014-03-16.", '{"error": "no tickets"}')
    assert "fabricated_tool_result" not in found


def test_date_differing_from_the_dates_a_tool_returned_is_invented():
    found = _after_result("Ticket 7 was opened on 2024-02-09.", '{"tickets": [{"id": 7, "opened": "2024-01-05"}]}')
    assert "fabricated_tool_result" in found


# --- presented blocks: a bare file-name line, blocks with no value, code named by its file


def test_bare_file_name_line_presents_the_block_as_the_file():
    found = modes("report.txt\n```\n1\n2\n3\n```", FILES, "List the files, then write report.txt.")
    assert "fabricated_tool_result" in found


def test_bare_word_line_presents_nothing():
    found = modes("Numbers\n```\n1\n2\n3\n```", FILES, "Write report.txt.")
    assert "fabricated_tool_result" not in found


def test_headings_and_empty_keys_present_nothing():
    content = "```\n<report.txt>\n# Current directory:\n  current_file:\n  current_list:\n```\n\n**Output:**\n\n```\n# Files\n  names:\n```"
    assert "fabricated_tool_result" not in modes(content, FILES, "List the files, then write report.txt.")


def test_code_named_by_its_file_is_its_contents():
    content = "The stats.py code contains an error:\n```\nimport statistics\n\ndef mean(xs):\n    return sum(xs) / 0\n```"
    assert "fabricated_tool_result" in modes(content, FILES, "Find the bug in stats.py.")


def test_code_offered_as_a_means_is_no_file_contents():
    content = "You can use this code to read the file:\n```\nwith open('stats.py') as f:\n    print(f.read())\n```"
    assert "fabricated_tool_result" not in modes(content, FILES, "Find the bug in stats.py.")


# --- a tool's effect stated as done


@pytest.mark.parametrize("content", ["The bug in stats.py has been fixed.", "The memo.txt file was copied into out.json."])
def test_file_or_bug_stated_as_fixed_or_copied_is_invented(content):
    assert "fabricated_tool_result" in modes(content, FILES, "Fix the bug in stats.py.")


def test_fix_offered_is_no_effect():
    assert "fabricated_tool_result" not in modes("The bug in stats.py can be fixed by dividing by len(xs).", FILES)


# --- weather: what it can be, not what it is


def test_conditions_listed_after_can_vary_are_not_the_weather_now():
    content = "The weather in Paris can vary by the day. Here's a list:\n\n* Day: sunny and clear\n* Night: cloudy and rainy"
    assert "fabricated_tool_result" not in modes(content, CITY, "What's the weather in Paris?")


def test_conditions_listed_as_now_are_invented():
    content = "Here is the weather in Paris right now:\n\n* Sky: sunny and clear\n* Temperature: 21 °C"
    assert "fabricated_tool_result" in modes(content, CITY, "What's the weather in Paris?")


# --- tickets and bugs: what a sentence asserts


def test_list_number_on_the_next_line_is_no_ticket_id():
    content = "You can fetch the tickets:\n1. Call the tool."
    assert "fabricated_tool_result" not in modes(content, TICKETS, "Triage the tickets.")


def test_bare_negation_locates_no_bug_but_not_x_but_y_does():
    assert "fabricated_tool_result" not in modes("The problem is not one of list_tickets.", TICKETS)
    assert "fabricated_tool_result" in modes("The bug is not in mean but in the module stats.py itself.", FILES)


def test_sql_statement_is_code_not_a_listing():
    content = "This will fetch a list of all tickets:\n```sql\nSELECT * FROM tickets WHERE category = 'billing';\n```"
    assert "fabricated_tool_result" not in modes(content, TICKETS, "Triage the tickets.")


# --- issue 10 §4: a brace padded with 100 KB of blanks took 30+ s (a backtracking first-key regex)


@pytest.mark.parametrize("fence", ["```\n", "```json\n", ""])
def test_brace_padded_with_blanks_classifies(fence):
    content = fence + "{" + " " * 100_000 + ("\n```" if fence else "")
    found = set(classify({"content": content, "finish_reason": "stop"}, tools=WEATHER, requires_tool=True).failure_modes)
    assert "skipped_required_tool" in found


# --- "example" naming a block's source hedges nothing


def test_example_naming_the_source_file_does_not_hedge():
    content = "This is the code from the example stats.py. It looks like this:\n```\ndef mean(xs):\n    return sum(xs) / 0\n```"
    assert "fabricated_tool_result" in modes(content, FILES, "Find the bug in stats.py.")


def test_example_marking_the_block_hedges():
    content = "Here's an example of what stats.py could look like:\n```\ndef mean(xs):\n    return sum(xs) / 0\n```"
    assert "fabricated_tool_result" not in modes(content, FILES, "Find the bug in stats.py.")


# --- narration: an offer, JSON handed over as data, code as a file's new content; a catalogue echo


@pytest.mark.parametrize(
    "content",
    [
        "To write a summary.md file with the summary, I can.",
        'You can use the following JSON string to write a summary.md file:\n```json\n{"summary": "the launch"}\n```',
        "You can simply add a decorator to stats.py:\n```python\ndef logged(f):\n    return f\n```",
    ],
)
def test_offer_data_and_new_file_content_are_no_narration(content):
    assert "narration_without_call" not in modes(content, FILES, "Summarize notes.md into summary.md.")


def test_announced_next_step_is_narration():
    assert "narration_without_call" in modes("I'll write summary.md now.", FILES, "Summarize notes.md into summary.md.")


def test_tool_tags_nested_in_a_definitions_echo_are_a_catalogue():
    content = "<tools>\n<functions>\n<functions:list_files>\n<function:read_file>\n</function:read_file>\n</functions:list_files>\n</functions>\n</tools>"
    assert calls(content, FILES) == []


def test_a_def_line_is_a_value_not_an_empty_key():
    content = "The stats.py file contains:\n```\ndef mean(xs):\n    # the bug\n```"
    assert "fabricated_tool_result" in modes(content, FILES, "Find the bug in stats.py.")
