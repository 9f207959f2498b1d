"""Classifier 2.4: the rule classes that batch 1's held-out quarter showed once it was opened.

Each shape here is one a real model produced (the corpus entry named in the comment quotes it
with its source); these tests pin the rule with small variations, so a change that loses the
rule fails even when the aggregate agreement hides it.
"""

from __future__ import annotations

import pytest

from harness.classifier import classify

FILE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} in the sandbox.",
            "parameters": {"type": "object", "properties": props, "required": list(props)},
        },
    }
    for name, props in (
        ("list_files", {"path": {"type": "string"}}),
        ("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}),
        ("search", {"arg": {"type": "string"}}),
        ("run", {"command": {"type": "string"}, "timeout": {"type": "integer"}}),
    )
]


def result(content, *, tools=FILE_TOOLS, reasoning=None, finish_reason="stop", history=None):
    response = {"content": content, "tool_calls": None, "finish_reason": finish_reason, "reasoning_content": reasoning}
    return classify(response, tools=tools, history=history or [{"role": "user", "content": "Do the task."}])


def test_a_flat_call_object_keeps_its_other_fields_as_arguments():
    # agents-agentllm28: { "action": "search", "arg": "arg" }
    r = result('{ "action": "search", "arg": "Alexander Graham Bell" }')
    assert r.failure_modes == ["raw_json_in_content", "nonstandard_keys"]
    assert [(c.name, c.arguments) for c in r.calls("lenient")] == [("search", {"arg": "Alexander Graham Bell"})]
    assert result('{"name": "list_files"}').calls("lenient")[0].arguments == {}  # no other field: no arguments


def test_a_name_beside_a_function_call_object_is_the_call():
    # llamacpp-llamabox16: {"name": x, "function_call": {"args": {...}}} inside <tool_call>
    r = result('<tool_call>\n{"name":"list_files","function_call":{"args":{"path":"docs"}}}}\n</tool_call>')
    assert r.failure_modes == ["tool_call_tags_in_content", "nonstandard_keys"]
    assert r.calls("lenient")[0].arguments == {"path": "docs"}  # the stray closing brace is text after it, not a repair


def test_a_react_action_written_as_a_call_expression_is_that_call():
    # agents-langchain9658: "Action: json_spec_list_keys(data)"
    r = result("Action: list_files(path)")
    assert set(r.failure_modes) == {"foreign_call_syntax", "nonstandard_keys", "pseudo_code_in_arguments"}
    assert result("Action: list_files(path='docs')").calls("lenient")[0].arguments == {"path": "docs"}


def test_glm_arg_key_pairs_are_a_call_with_typed_values():
    # families-agno5106: <tool_call>Run <arg_key>command</arg_key> <arg_value>git status</arg_value> </tool_call>
    content = "<tool_call>run\n<arg_key>command</arg_key>\n<arg_value>git status</arg_value>\n<arg_key>timeout</arg_key>\n<arg_value>30</arg_value>\n</tool_call>"
    r = result(content)
    assert r.failure_modes == ["tool_call_tags_in_content", "foreign_call_syntax"]
    assert r.calls("lenient")[0].arguments == {"command": "git status", "timeout": 30}
    assert result("<arg_key>path</arg_key><arg_value>docs</arg_value>").calls("lenient") == []  # no name: not a call


def test_a_name_with_a_colon_before_json_arguments_is_a_call():
    # families-functionary53: "get_car_price:\n{"car_name": "Tang"}"
    r = result('list_files:\n{"path": "docs"}')
    assert r.failure_modes == ["foreign_call_syntax"]
    assert r.calls("lenient")[0].arguments == {"path": "docs"}


def test_internlm_action_markers_are_a_vendor_wrapper():
    # families-ollama5761: <|action_start|><|plugin|>{...}<|action_end|>
    r = result(
        'I need to list them.<|action_start|><|plugin|>\n{"name": "list_files", "parameters": {"path": "."}}<|action_end|>'
    )
    assert set(r.failure_modes) == {"wrong_wrapper_tag", "mixed_prose", "nonstandard_keys"}


def test_a_vendor_marker_in_the_reasoning_is_a_wrong_wrapper_too():
    # rare-llxprt749: Kimi's call markers written in reasoning_content
    reasoning = (
        'Let me look. <|tool_call_begin|> functions.list_files:0 <|tool_call_argument_begin|> {"path": "docs"} <|tool_call_end|>'
    )
    r = result(None, reasoning=reasoning)
    assert set(r.failure_modes) == {"call_in_reasoning", "wrong_wrapper_tag"}


def test_a_fence_around_a_wrapper_tag_is_a_code_fence():
    # vllm-17821: ```xml <function_call> {...} </function_call> ```
    r = result('```xml\n<function_call>\n  {"name": "list_files", "arguments": {"path": "."}}\n</function_call>\n```')
    assert set(r.failure_modes) == {"code_fence", "wrong_wrapper_tag"}
    assert r.details["evidence"]["code_fence"]["span"].startswith('{"name": "list_files"')
    assert (
        "code_fence"
        not in result('<function_call>{"name": "list_files", "arguments": {"path": "."}}</function_call>').failure_modes
    )


def test_a_broken_call_object_is_judged_by_the_keys_it_shows():
    # rare-ollama8517: {"name": "date_ difference", "parameters": {"first Date": get_current_date (), ...}}
    assert "nonstandard_keys" in result('{"name": "list_files", "parameters": {"path": get_cwd()}}').failure_modes
    assert "nonstandard_keys" not in result('{"name": "list_files", "arguments": {"path": get_cwd()}}').failure_modes


def test_a_call_cut_before_its_arguments_is_invalid_not_repaired():
    # families-vllm13530: ... The function call is {"name": "get_weather", "   (finish_reason length)
    r = result('The call is {"name": "list_files", "', finish_reason="length")
    assert {"invalid_json", "truncated_by_length"} <= set(r.failure_modes)
    assert not {"repaired_json", "schema_violation"} & set(r.failure_modes)
    assert "repaired_json" in result('{"name": "list_files", "arguments": {"path": "docs"', finish_reason="length").failure_modes


def test_a_code_argument_keeps_its_shape_for_the_schema():
    # embedded-read_and_summarize-t07-s0: write_file(file_path, {"name": file_path, ...})
    r = result('write_file(file_path, {"name": file_path, "type": "json"})')
    assert {"foreign_call_syntax", "pseudo_code_in_arguments", "schema_violation"} <= set(r.failure_modes)
    assert r.calls("lenient")[0].arguments == {"path": "file_path", "content": {"name": "file_path", "type": "json"}}
    assert "is not of type 'string'" in r.details["schema_violation"][0]["message"]


def test_an_announcement_in_chinese_is_narration():
    # families-lagent170: "好的，我将使用一个API来获取北京市今天的天气信息。"
    assert "narration_without_call" in result("好的，我将使用工具来获取文件列表。请稍等片刻").failure_modes
    assert "narration_without_call" not in result("这是文件列表的说明。").failure_modes


def test_output_shown_as_something_like_is_an_illustration():
    # embedded-extract_fields-t07-s11: "This will output something like: `{...}`"
    code = "```python\nprint(data)\n```\n"
    assert "fabricated_tool_result" not in result(code + "This will output something like: `{'a': 1}`").failure_modes
    assert "fabricated_tool_result" in result(code + "This will output: `{'a': 1}`").failure_modes


def test_a_file_count_before_any_listing_is_fabricated():
    # embedded-list_and_report-t07-s10: "lists the number of files (10)"
    history = [{"role": "user", "content": "List the files, then write report.txt with how many there are."}]
    assert "fabricated_tool_result" in result("The report lists the number of files (10).", history=history).failure_modes
    assert "fabricated_tool_result" in result("There are 4 files in the directory.", history=history).failure_modes
    asked = [{"role": "user", "content": "Write 3 files: a.txt, b.txt, c.txt."}]
    assert "fabricated_tool_result" not in result("I will write the 3 files now.", history=asked).failure_modes


@pytest.mark.parametrize(
    "content",
    ["<arg_key>" * 100_000, "x<arg_key>k</arg_key><arg_value>" * 25_000, "Action: " + "f(" * 30_000],
    ids=["arg_key openers", "unclosed values", "nested call expression"],
)
def test_the_new_notations_finish_on_hostile_input(content):
    assert isinstance(result(content).failure_modes, list)  # benchmarks/classifier_speed.py --adversarial times them
