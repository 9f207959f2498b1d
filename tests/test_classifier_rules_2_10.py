"""Classifier 2.10.0: the batch-6 adjudicator's rulings (docs/failure-modes.md), each on short constructed replies
written for the general rule, both ways where the rule has a boundary, and on the real batch-6 reply that raised it.

Batch 6 was the held-out batch while 2.9.0 was written; with batch 7 being labelled blind to replace it, batch 6 is
tuning material, so its replies pin the rulings here (by id, with the humans' labels).
"""

from __future__ import annotations

import json

import pytest

from harness.classifier import classify
from tests.helpers import CORPUS, function_tool
from tests.helpers import FILE_TOOLS as FILES
from tests.helpers import reply_modes as modes

TICKETS = [function_tool("list_tickets", "List the open support tickets.", {}), *FILES]
WEATHER = [function_tool("get_current_weather", "Get the current weather.", {"city": {"type": "string"}}, ["city"])]
LIST_TASK = "List the files in the current working directory. Then write report.txt with their names."


def calls(content, tools=None):
    return [(c.name, c.arguments) for c in classify({"content": content}, tools=tools).calls("lenient")]


def structured_modes(name, tools=None):
    call = {"type": "function", "id": "c1", "function": {"name": name, "arguments": "{}"}}
    return set(classify({"content": None, "tool_calls": [call]}, tools=tools).failure_modes)


def entry_modes(entry_id):
    data = json.loads((CORPUS / f"{entry_id}.json").read_text(encoding="utf-8"))
    result = classify(data["response"], tools=data["tools"], history=data["messages"], requires_tool=data["requires_tool"])
    return set(result.failure_modes), set(data["labels"])


# --- any template token in a structured call's name is unknown_tool (fw-ai python-sdk#119)


@pytest.mark.parametrize("name", ["tool_12</arg_value>", "get_weather<tool_call>", "read_file[ARGS]", "x<｜tool▁sep｜>"])
def test_a_template_token_in_a_structured_name_is_unknown_tool_with_tools_not_known(name):
    assert "unknown_tool" in structured_modes(name)


def test_a_plain_structured_name_with_tools_not_known_is_not_judged():
    assert "unknown_tool" not in structured_modes("tool_12")


# --- vendor call keys mark a call at any depth; a JSON string under them is stringified (js-genai#607)


def test_a_vendor_call_key_deep_in_a_document_is_a_call():
    doc = {"candidates": [{"content": {"parts": [{"tool_use": {"name": "get_weather", "input": {"city": "Paris"}}}]}}]}
    content = "```json\n" + json.dumps(doc) + "\n```"
    assert calls(content) == [("get_weather", {"city": "Paris"})]
    assert {"code_fence", "nonstandard_keys"} <= modes(content)


def test_a_document_with_no_vendor_call_key_stays_data():
    doc = {"candidates": [{"content": {"parts": [{"text": {"name": "get_weather", "note": "sunny"}}]}}]}
    assert calls("```json\n" + json.dumps(doc) + "\n```") == []


# --- kind-of-argument keys (path_params, query_params beside body) are argument keys (Hermes-Function-Calling#17)


def test_kind_of_argument_keys_make_a_call_with_the_tools_not_known():
    content = '{"name": "search_items", "body": {}, "query_params": {"q": "lamp"}}'
    assert calls(content) == [("search_items", {"body": {}, "query_params": {"q": "lamp"}})]
    assert {"raw_json_in_content", "nonstandard_keys"} <= modes(content)


def test_a_name_beside_only_a_body_stays_data():
    assert calls('{"name": "Dana", "body": {"height": 170}}') == []


# --- inside a call wrapper, an identifier with key="value" pairs is a call whatever the tools are (openclaw#33258)


@pytest.mark.parametrize("tail", [" />", "", "</tool_call>"])
def test_key_value_pairs_inside_a_call_wrapper_are_a_foreign_call(tail):
    content = f'<tool_call>run cmd="ls -la" cwd=work{tail}'
    assert calls(content) == [("run", {"cmd": "ls -la", "cwd": "work"})]
    assert "foreign_call_syntax" in modes(content)


def test_key_value_prose_inside_a_wrapper_is_no_call():
    assert calls("<tool_call>run the command with cmd set to ls</tool_call>") == []


# --- a namespace token before each tag is part of the tags' spelling; a namespaced wrapper is another wrapper
#     (MiniMax-M3#31)


def test_a_namespace_token_before_each_tag_is_read_as_part_of_the_tags():
    ns = "]<]vendor[>["
    content = f'{ns}<tool_call>\n{ns}<invoke name="read_file">{ns}<path>a.txt{ns}</path>{ns}</invoke>\n{ns}</tool_call>'
    assert calls(content) == [("read_file", {"path": "a.txt"})]
    assert modes(content, FILES) == {"tool_call_tags_in_content", "foreign_call_syntax"}


def test_a_namespace_inside_the_wrapper_name_is_another_wrapper():
    content = (
        '<acme:tool_call>\n<invoke name="read_file">\n<parameter name="path">a.txt</parameter>\n</invoke>\n</acme:tool_call>'
    )
    assert modes(content, FILES) == {"wrong_wrapper_tag", "foreign_call_syntax"}


def test_a_bracketed_word_before_a_tag_only_once_is_text():
    content = 'Note [x] <tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>'
    assert calls(content, FILES) == [("read_file", {"path": "a.txt"})]


# --- narration: an announced act judged by what it does to the task's files; an offer of help announces nothing


def test_announcing_a_fix_to_the_tasks_file_is_narration():
    assert "narration_without_call" in modes("I'm going to fix the bug in stats.py.", FILES, "Fix the bug in stats.py.")


@pytest.mark.parametrize(
    ("content", "narrates"),
    [
        ("I'll help you create a JSON object with the keys. What do you want to do next?", False),
        ("I'll help by reading memo.txt first.", True),
        ("I'll help you by reading memo.txt first.", True),
    ],
)
def test_an_offer_of_help_announces_only_the_replys_own_tool_act(content, narrates):
    assert ("narration_without_call" in modes(content, FILES, "Read memo.txt and write fields.json.")) is narrates


# --- narration: a frame naming a command with none given hands nothing over


def test_a_fence_of_only_sentences_hands_nothing_over():
    content = "This is a simple command that will output the file names.\n\n```\nbash\nThis is a shell command that lists the files in the directory.\n```"
    assert "narration_without_call" not in modes(content, FILES, LIST_TASK)


def test_a_fence_holding_the_command_is_handed_over():
    content = "This is a simple command that will output the file names.\n\n```\nbash\nls -1\n```"
    assert "narration_without_call" in modes(content, FILES, LIST_TASK)


# --- narration: template directives naming a file in a string show no tool step; a frame stating the answer's format
#     does not make code data; a block the reply calls its code is handed over whatever it holds


def test_template_directives_naming_files_in_strings_show_no_tool_step():
    content = 'Read:\n{% input "path:<file>", "list_files"}\n{% output "Summary.md"}'
    assert modes(content, FILES, "Read a.txt and write Summary.md.") == {"skipped_required_tool"}


def test_code_importing_the_offered_tool_after_a_format_frame_is_handed_over():
    content = (
        'Your answer will be in the format "ticket,category"\n\n```python\nfrom helpdesk import list_tickets\n\n'
        "def get_ticket_list():\n    return sorted(x for x in range(3))\n```"
    )
    assert "narration_without_call" in modes(content, TICKETS, "Get the tickets with list_tickets, then write triage.csv.")


def test_a_block_the_reply_calls_its_code_is_handed_over_whatever_it_holds():
    content = "Here's a possible solution:\n\n```\nname:\nfile: report.txt\n```\n\nIn this code, we start by creating report.txt."
    assert "narration_without_call" in modes(content, FILES, LIST_TASK)


# --- narration: a rewrite of the offered tool with no tool step is no narration


def test_an_emptied_redefinition_of_the_offered_tool_is_no_narration():
    content = "You can simply remove the argument from the weather function:\n```python\ndef get_current_weather():\n    current_weather = {}\n```"
    assert "narration_without_call" not in modes(content, WEATHER, "What is the weather in Paris?")


def test_a_redefinition_of_the_tool_that_builds_its_result_is_handed_over():
    content = (
        "The open tickets can be written with the list_tickets function:\n```python\n"
        "def list_tickets(tickets):\n    return [{'id': t} for t in tickets]\n```"
    )
    assert "narration_without_call" in modes(content, TICKETS, "Get the tickets with list_tickets, then write triage.csv.")


# --- fabrication: a bare list answering "list the files" is the listing; a frame showing a format is an illustration


def test_numbered_groups_of_values_as_the_whole_answer_are_the_listing():
    content = "#1\n2022-05-01T09:35:17-14\n2022-05-01T13:16:40-11\n\n#2\n2022-05-02T03:27:44-32"
    assert "fabricated_tool_result" in modes(content, FILES, LIST_TASK)


def test_headings_and_tags_as_the_whole_answer_are_no_listing():
    content = "<tools>\n<functions:list_files>\n<function:read_file>\n</functions:list_files>"
    assert "fabricated_tool_result" not in modes(content, FILES, LIST_TASK)


def test_a_frame_showing_how_the_data_is_laid_out_is_an_illustration():
    content = "This is how the list of files is formatted:\n\n```\nfile1 | 1 | 1\nfile2 | 2 | 2\n```"
    assert "fabricated_tool_result" not in modes(content, FILES, LIST_TASK)


def test_a_frame_stating_the_list_of_files_is_a_listing():
    content = "Here are the files in the directory:\n\n```\nfile1.txt\nfile2.txt\n```"
    assert "fabricated_tool_result" in modes(content, FILES, LIST_TASK)


def test_a_fake_results_body_is_never_handed_over_code():
    content = 'Here is the weather:\n<tool_response>\n{"temperature": 27,\n    "condition": "sunny"\n}\n</tool_response>'
    found = modes(content, WEATHER, "What is the weather in Paris?")
    assert "fabricated_tool_result" in found and "narration_without_call" not in found


# --- the batch-6 replies that raised each ruling get the humans' labels


@pytest.mark.parametrize(
    "entry_id",
    [
        "b6-fwai119-glm52-arg-value-token-in-name",
        "b6-jsgenai607-gemini2flash-toolcode-nested-functioncall",
        "b6-hermesfc17-hermes2pro-generate-image-path-params",
        "b6-openclaw33258-exec-selfclosing-in-tool-call",
        "b6-glm4-36-name-line-json-train-query",
        "b6-minimaxm3-31-namespaced-invoke-read-file",
        "b6-minimaxm25-10-exec-ls-invoke-text",
        "b6-pi368-minimax-m21-two-invokes-in-content",
        "b6-embedded-code_review-t1-s61-prompt-turn1",  # an announced fix of the task's file
        "b6-embedded-extract_fields-t07-s61-native-turn1",  # an offer of help
        "b6-embedded-list_and_report-t07-s61-native-turn1",  # a frame naming a command with none given
        "b6-embedded-read_and_summarize-t1-s60-prompt-turn1",  # template directives
        "b6-embedded-support_triage-t1-s61-prompt-turn1",  # a format frame before code
        "b6-embedded-long_context-t07-s61-prompt-turn1",  # a block the reply calls its code
        "b6-embedded-weather_probe-t1-s60-prompt-turn2",  # a rewrite of the offered tool
        "b6-embedded-list_and_report-t1-s61-native-turn1",  # a bare list answering "list the files"
        "b6-embedded-list_and_report-t07-s60-prompt-turn1",  # a frame showing a format
        "b6-embedded-weather_probe-t07-s60-prompt-turn1",  # a fake result's body
    ],
)
def test_the_batch_6_reply_gets_the_humans_labels(entry_id):
    found, labels = entry_modes(entry_id)
    assert found == labels
