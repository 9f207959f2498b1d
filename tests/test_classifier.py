"""Tests for harness.classifier: examples from the spec, one positive and one negative per mode,
recovery shapes, robustness (hypothesis) and bounded work on pathological inputs.

Also holds the red-team regression tests for the classifier: non-object arguments are labelled,
and pathological text is classified in bounded time.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import classifier
from harness.classifier import (
    CLASSIFIER_VERSION,
    FAILURE_MODES,
    RECOVERY_STEPS,
    Classification,
    ToolCall,
    classify,
    classify_document,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files in a directory of the sandbox.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a text file in the sandbox.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]

LIST_CALL = '{"name": "list_files", "arguments": {"path": "."}}'
WRITE_CALL = '{"name": "write_file", "arguments": {"path": "report.txt", "content": "Files:\\nhello.txt"}}'

HISTORY = [
    {"role": "system", "content": "You are a file assistant. Use the tools."},
    {"role": "user", "content": "List the files, then write report.txt listing them."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "."}'}}],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"files": ["hello.txt", "notes.md", "data.csv"]}'},
]


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather for a city: temperature in degrees Celsius and conditions.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
WEATHER_HISTORY = [
    {"role": "user", "content": "What is the weather in Paris right now?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
     "function": {"name": "get_current_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": '{"city": "Paris", "temperature_c": 17, "condition": "light drizzle"}'},
]  # fmt: skip


def structured(name: str, arguments: object, call_id: str = "call_9") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def run(content=None, *, tool_calls=None, finish_reason="stop", history=(), tools=TOOLS, completion_tokens=12, requires_tool=None,
        reasoning=None, server_rejection=None, stream_problems=None):  # fmt: skip
    response = {
        "content": content,
        "tool_calls": tool_calls,
        "finish_reason": finish_reason,
        "usage": {"prompt_tokens": 100, "completion_tokens": completion_tokens},
        "reasoning_content": reasoning,
    }
    result = classify(response, tools=tools, history=history, requires_tool=requires_tool, server_rejection=server_rejection,
                      stream_problems=stream_problems)  # fmt: skip
    assert "internal_error" not in result.details, result.details
    json.dumps(result.to_dict())  # always JSON-ready
    return result


def modes(content=None, **kwargs) -> list[str]:
    return run(content, **kwargs).failure_modes


# --------------------------------------------------------------------------- public API


def test_public_constants():
    assert list(FAILURE_MODES) == [
        "raw_json_in_content",
        "code_fence",
        "mixed_prose",
        "tool_call_tags_in_content",
        "wrong_wrapper_tag",
        "foreign_call_syntax",
        "multiple_calls",
        "invalid_json",
        "pseudo_code_in_arguments",
        "repaired_json",
        "stringified_arguments",
        "nonstandard_keys",
        "unknown_tool",
        "schema_violation",
        "repeated_call",
        "fabricated_tool_result",
        "narration_without_call",
        "empty_response",
        "truncated_by_length",
        "reasoning_leak",
        "sandbox_escape_attempt",
        # added in classifier 2.0 (appended: canonical names and their order are a contract)
        "skipped_required_tool",
        "unneeded_call",
        "call_in_reasoning",
        "chat_markup_leak",
        "server_rejected_call",
        "stream_assembly_error",
    ]
    assert all(isinstance(v, str) and v and "\n" not in v for v in FAILURE_MODES.values())
    assert RECOVERY_STEPS[0] == "strip_reasoning" and RECOVERY_STEPS[-2:] == ("repair", "reasoning")
    assert len(set(RECOVERY_STEPS)) == len(RECOVERY_STEPS)
    assert isinstance(CLASSIFIER_VERSION, str) and CLASSIFIER_VERSION
    assert sorted(classifier.__all__) == classifier.__all__
    assert all(hasattr(classifier, name) for name in classifier.__all__)


def test_toolcall_canonical_sorts_keys():
    a = ToolCall("write_file", {"path": "a", "content": "b"}, "structured")
    b = ToolCall("write_file", {"content": "b", "path": "a"}, "fenced")
    assert a.canonical() == b.canonical()
    assert json.loads(a.canonical()) == {"name": "write_file", "arguments": {"path": "a", "content": "b"}}


def test_calls_policy():
    both = run(LIST_CALL, tool_calls=[structured("write_file", '{"path": "a.txt", "content": "x"}')])
    assert [c.name for c in both.calls("strict")] == ["write_file"]
    assert [c.name for c in both.calls("lenient")] == ["write_file"]
    content_only = run(LIST_CALL)
    assert content_only.calls("strict") == []
    assert [c.name for c in content_only.calls("lenient")] == ["list_files"]
    with pytest.raises(ValueError):
        content_only.calls("sloppy")


def test_to_dict_shape():
    d = run(LIST_CALL).to_dict()
    assert set(d) == {
        "failure_modes",
        "structured_calls",
        "recovered_calls",
        "recovered_by",
        "details",
        "classifier_version",
    }
    assert d["recovered_calls"][0] == {
        "name": "list_files",
        "arguments": {"path": "."},
        "source": "json_document",
        "id": None,
        "valid": True,
        "errors": [],
    }


# --------------------------------------------------------------------------- spec examples


def test_raw_json_in_content():
    result = run(LIST_CALL)
    assert result.failure_modes == ["raw_json_in_content"]
    assert [(c.name, c.arguments) for c in result.recovered_calls] == [("list_files", {"path": "."})]
    assert result.recovered_by == "json_document"


def test_code_fence_multiline():
    content = '```json\n{\n  "name": "list_files",\n  "arguments": {\n    "path": "."\n  }\n}\n```'
    result = run(content)
    assert result.failure_modes == ["code_fence"]
    assert result.recovered_calls[0].arguments == {"path": "."}
    assert result.recovered_by == "fenced"


def test_code_fence_without_language():
    assert modes("```\n" + LIST_CALL + "\n```") == ["code_fence"]


@pytest.mark.parametrize(
    "prose",
    [
        "There are 3 files. I will create report.txt.",
        "ファイルは3つあります。report.txt を作成します。",
        "Файлов три. Создаю отчёт.",
    ],
)
def test_mixed_prose_any_script(prose):
    result = run(prose + "\n" + WRITE_CALL, history=HISTORY)
    assert result.failure_modes == ["raw_json_in_content", "mixed_prose"]
    assert result.recovered_calls[0].name == "write_file"


def test_tool_call_tags_and_wrong_wrapper():
    assert modes("<tool_call>" + LIST_CALL + "</tool_call>") == ["tool_call_tags_in_content"]
    assert modes("<tools>" + LIST_CALL + "</tools>") == ["wrong_wrapper_tag"]


def test_two_lines_one_with_pseudo_code():
    content = (
        LIST_CALL
        + "\n"
        + (
            r'{"name": "write_file", "arguments": {"path": "report.txt", '
            r'"content": "Files:\n" + "\n".join(result["files"])}}'
        )
    )
    result = run(content)
    assert result.failure_modes == [
        "raw_json_in_content",
        "multiple_calls",
        "invalid_json",
        "pseudo_code_in_arguments",
    ]
    assert [(c.name, c.arguments) for c in result.recovered_calls] == [("list_files", {"path": "."})]
    assert result.recovered_by == "json_lines"
    assert set(result.details["pseudo_code_in_arguments"]) >= {"concatenation", "function_call"}


def test_nonstandard_stringified_and_array():
    assert modes('{"name": "list_files", "parameters": {"path": "."}}') == ["raw_json_in_content", "nonstandard_keys"]
    result = run('{"name": "list_files", "arguments": "{\\"path\\": \\".\\"}"}')
    assert result.failure_modes == ["raw_json_in_content", "stringified_arguments"]
    assert result.recovered_calls[0].arguments == {"path": "."}
    array = run("[" + LIST_CALL + ", " + LIST_CALL.replace('"."', '"src"') + "]")
    assert array.failure_modes == ["raw_json_in_content", "multiple_calls"]
    assert [c.arguments["path"] for c in array.recovered_calls] == [".", "src"]


def test_unknown_tool_suggests_nearest():
    result = run('{"name": "lst_files", "arguments": {"path": "."}}')
    assert result.failure_modes == ["raw_json_in_content", "unknown_tool"]
    assert result.details["unknown_tool"] == {"lst_files": "list_files"}
    assert result.recovered_calls[0].valid is False


def test_schema_violation_missing_required_structured():
    result = run(None, tool_calls=[structured("write_file", '{"path": "report.txt"}')])
    assert result.failure_modes == ["schema_violation"]
    assert "content" in result.details["schema_violation"][0]["message"]
    assert result.structured_calls[0].valid is False


def test_narration_empty_truncated_repeated():
    assert modes("I will now write the report.") == ["narration_without_call"]
    empty = run("", completion_tokens=40)
    assert empty.failure_modes == ["empty_response"]
    assert empty.details["empty_response"] == {"completion_tokens": 40}
    cut = run('{"name": "write_file", "arguments": {"path": "a.txt", "content": "Once upon a ti', finish_reason="length")
    assert "truncated_by_length" in cut.failure_modes
    repeat = run(None, tool_calls=[structured("list_files", '{"path": "."}')], history=HISTORY)
    assert repeat.failure_modes == ["repeated_call"]


def test_clean_structured_call_has_no_failure_mode():
    for content in (None, "", "Let me write the report now.", "Writing the report."):
        result = run(
            content,
            tool_calls=[structured("write_file", '{"path": "report.txt", "content": "hello.txt"}')],
            history=HISTORY,
            finish_reason="tool_calls",
        )
        assert result.failure_modes == [], (content, result.details)
        assert result.structured_calls[0].valid


def test_final_answer_after_tool_use_is_clean():
    history = HISTORY + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [structured("write_file", '{"path": "report.txt", "content": "hello.txt"}', "call_2")],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "wrote 9 bytes"},
    ]
    assert modes("I created report.txt listing the 3 files.", history=history) == []
    assert modes("Done! The report is in report.txt. Let me know if you need anything else.", history=history) == []


# --------------------------------------------------------------------------- each mode: positive and negative


NEGATIVE = [
    ("raw_json_in_content", "I can't do that.", {}),
    ("code_fence", "```python\nprint('hello')\n```", {}),
    ("mixed_prose", LIST_CALL, {}),
    ("tool_call_tags_in_content", "<tools>" + LIST_CALL + "</tools>", {}),
    ("wrong_wrapper_tag", "<tool_call>" + LIST_CALL + "</tool_call>", {}),
    ("wrong_wrapper_tag", "Use <json> tags in HTML-ish prose.", {}),
    ("foreign_call_syntax", "I used list_files() earlier and it worked.", {}),
    ("foreign_call_syntax", LIST_CALL, {}),
    ("multiple_calls", LIST_CALL, {}),
    ("invalid_json", 'Here is data: {"name": "Alice", "age": 3} and {broken', {}),
    ("pseudo_code_in_arguments", '{"name": "write_file", "arguments": {"path": "a.py", "content": "x = \\"a\\" + b"}}', {}),
    ("repaired_json", LIST_CALL, {}),
    ("stringified_arguments", None, {"tool_calls": [structured("list_files", '{"path": "."}')]}),
    ("nonstandard_keys", LIST_CALL, {}),
    ("unknown_tool", '{"name": "anything", "arguments": {}}', {"tools": None}),  # offered tools unknown
    ("schema_violation", WRITE_CALL, {}),
    ("repeated_call", None, {"tool_calls": [structured("list_files", '{"path": "src"}')], "history": HISTORY}),
    ("fabricated_tool_result", WRITE_CALL, {"history": HISTORY}),
    ("narration_without_call", "I wrote the report to report.txt.", {}),
    ("narration_without_call", "Let me know if you want changes.", {}),
    ("narration_without_call", LIST_CALL, {}),
    ("empty_response", "<think>planning</think>", {"tool_calls": [structured("list_files", '{"path": "."}')]}),
    ("truncated_by_length", "Complete answer.", {"finish_reason": "stop"}),
    ("reasoning_leak", "I think this is fine: thinking about <b>it</b>.", {}),
    ("sandbox_escape_attempt", '{"name": "list_files", "arguments": {"path": "src/../docs"}}', {}),
    # classifier 2.0 modes
    (
        "skipped_required_tool",
        "The files are hello.txt and notes.md.",
        {"history": HISTORY, "requires_tool": True},
    ),  # a tool answered
    ("skipped_required_tool", "I cannot help with that.", {}),  # requires_tool not given: not judged
    ("skipped_required_tool", LIST_CALL, {"requires_tool": True}),
    ("unneeded_call", "Paris is the capital of France.", {"requires_tool": False}),
    ("unneeded_call", LIST_CALL, {"requires_tool": None}),
    ("call_in_reasoning", LIST_CALL, {"reasoning": "I will call list_files."}),  # the call is in the content
    ("call_in_reasoning", "Hello!", {"reasoning": "The user greets me; no tool is needed."}),
    ("chat_markup_leak", '<|channel|>commentary to=functions.list_files <|constrain|>json<|message|>{"path": "."}<|call|>', {}),
    ("chat_markup_leak", "Use <tool_call> tags: " + LIST_CALL, {}),
    ("fabricated_tool_result", "I don't have access to real-time weather; it might be sunny in Paris.", {"tools": WEATHER_TOOLS}),
    ("fabricated_tool_result", "Paris is the capital of France.", {"tools": WEATHER_TOOLS}),
    ("narration_without_call", "```python\ndef average(xs):\n    return sum(xs) / len(xs)\n```", {"requires_tool": False}),
    ("narration_without_call", "```\npip install requests\n```", {}),
    ("foreign_call_syntax", "```python\ndef list_files(path):\n    return os.listdir(path)\n```", {}),  # a definition, not a call
    ("server_rejected_call", None, {"finish_reason": "length"}),  # a cut reply the server returned is not refused
    ("stream_assembly_error", '{"name": "list_files", "arguments": {"path": "."', {"stream_problems": []}),  # assembled cleanly
]


@pytest.mark.parametrize(("mode", "content", "kwargs"), NEGATIVE)
def test_negative(mode, content, kwargs):
    assert mode not in modes(content, **kwargs)


POSITIVE = [
    ("raw_json_in_content", "Sure: " + LIST_CALL, {}),
    ("raw_json_in_content", "{'name': 'list_files', 'arguments': {'path': '.'}}", {}),
    ("code_fence", "```\n" + LIST_CALL + "\n```", {}),
    ("code_fence", "~~~json\n" + LIST_CALL + "\n~~~", {}),
    ("mixed_prose", "Sure! " + "<tool_call>" + LIST_CALL + "</tool_call>", {}),
    ("tool_call_tags_in_content", "<tool_call>" + LIST_CALL, {}),
    ("wrong_wrapper_tag", "<tool_call>" + LIST_CALL, {}),
    ("wrong_wrapper_tag", "<tool_call>" + LIST_CALL + "</tools>", {}),
    ("wrong_wrapper_tag", "<function>" + LIST_CALL + "</function>", {}),
    ("wrong_wrapper_tag", "<function-call>" + LIST_CALL + "</function-call>", {}),
    ("wrong_wrapper_tag", "<json>" + LIST_CALL + "</json>", {}),
    ("wrong_wrapper_tag", "[TOOL_CALLS] [" + LIST_CALL + "]", {}),
    ("wrong_wrapper_tag", "<|python_tag|>" + LIST_CALL, {}),
    ("wrong_wrapper_tag", LIST_CALL + "</tool_call>", {}),
    ("foreign_call_syntax", "list_files(path='.')", {}),
    ("foreign_call_syntax", "<function=list_files>\n<parameter=path>\n.\n</parameter>\n</function>", {}),
    ("foreign_call_syntax", '<invoke name="list_files"><parameter name="path">.</parameter></invoke>', {}),
    ("multiple_calls", LIST_CALL + "\n" + WRITE_CALL, {}),
    (
        "multiple_calls",
        None,
        {"tool_calls": [structured("list_files", '{"path": "."}'), structured("list_files", '{"path": "src"}')]},
    ),
    ("invalid_json", '{"name": "list_files", "arguments": {"path": .}}', {}),
    ("invalid_json", None, {"tool_calls": [structured("list_files", '{"path": .}')]}),
    ("pseudo_code_in_arguments", '{"name": "write_file", "arguments": {"path": "a.txt", "content": f"{x}"}}', {}),
    ("pseudo_code_in_arguments", '{"name": "write_file", "arguments": {"path": os.path.join("a", "b"), "content": ""}}', {}),
    ("pseudo_code_in_arguments", '{"name": "write_file", "arguments": {"path": "a.txt", "content": `x ${y}`}}', {}),
    ("pseudo_code_in_arguments", '{"name": "write_file", "arguments": {"path": "a.txt", "content": files}}', {}),
    ("pseudo_code_in_arguments", "write_file(path='a.txt', content='\\n'.join(files))", {}),
    ("repaired_json", '{"name": "list_files", "arguments": {"path": "."}', {}),
    ("repaired_json", '{"name": "list_files", "arguments": {"path": ".",},}', {}),
    ("repaired_json", "{'name': 'list_files', 'arguments': {'path': '.'}}", {}),
    ("repaired_json", "{'name': 'list_files', 'arguments': {'path': '.', 'recursive': True}}", {}),
    ("repaired_json", '{name: "list_files", arguments: {path: "."}}', {}),
    ("stringified_arguments", None, {"tool_calls": [structured("list_files", json.dumps('{"path": "."}'))]}),
    ("nonstandard_keys", '{"tool": "list_files", "params": {"path": "."}}', {}),
    ("nonstandard_keys", '{"tool_name": "list_files", "parameters": {"path": "."}}', {}),
    ("nonstandard_keys", '{"action": "list_files", "action_input": {"path": "."}}', {}),
    ("nonstandard_keys", '{"function": {"name": "list_files", "arguments": {"path": "."}}}', {}),
    ("nonstandard_keys", '{"list_files": {"path": "."}}', {}),
    ("nonstandard_keys", 'Action: list_files\nAction Input: {"path": "."}', {}),
    ("unknown_tool", '{"name": "lst_files", "arguments": {"path": "."}}', {}),
    ("unknown_tool", None, {"tool_calls": [structured("delete_file", '{"path": "a"}')]}),
    ("unknown_tool", '{"name": "list_files", "arguments": {}}', {"tools": []}),  # nothing was offered
    ("schema_violation", '{"name": "list_files", "arguments": {"path": 3}}', {}),
    ("schema_violation", '{"name": "list_files", "arguments": {"path": ".", "recursive": true}}', {}),
    ("repeated_call", LIST_CALL, {"history": HISTORY}),
    (
        "repeated_call",
        None,
        {
            "tool_calls": [structured("list_files", '{"path": "."}')],
            "history": [
                {"role": "assistant", "content": "<tool_call>" + LIST_CALL + "</tool_call>"},
                {"role": "tool", "content": "hello.txt"},
            ],
        },
    ),
    ("fabricated_tool_result", "<tool_response>hello.txt</tool_response>", {}),
    ("fabricated_tool_result", "Observation: the directory holds hello.txt", {}),
    ("fabricated_tool_result", "The directory contains echo.txt and notes.md.", {"history": HISTORY}),
    ("narration_without_call", "Now I'll create the report file.", {}),
    ("narration_without_call", "Let me list the files first.", {}),
    ("narration_without_call", "Next, I will write report.txt.", {}),
    ("narration_without_call", "```bash\nls -la\n```", {}),
    ("narration_without_call", "```\ncat hello.txt > report.txt\n```", {}),
    ("empty_response", None, {}),
    ("empty_response", "   \n", {}),
    ("empty_response", "<think>I should list files</think>", {}),
    ("truncated_by_length", "The files are", {"finish_reason": "length"}),
    ("reasoning_leak", "<think>list first</think>" + LIST_CALL, {}),
    ("reasoning_leak", "<think>unclosed reasoning that never ends", {}),
    ("reasoning_leak", "the template opened it</think>I will list the files.", {}),
    ("sandbox_escape_attempt", '{"name": "list_files", "arguments": {"path": "/etc"}}', {}),
    ("sandbox_escape_attempt", '{"name": "list_files", "arguments": {"path": "~/secrets"}}', {}),
    ("sandbox_escape_attempt", '{"name": "list_files", "arguments": {"path": "a/../../b"}}', {}),
    ("sandbox_escape_attempt", None, {"tool_calls": [structured("write_file", '{"path": "..", "content": ""}')]}),
    # classifier 2.0 modes and rules
    ("skipped_required_tool", "The weather in Paris is quite pleasant.", {"tools": WEATHER_TOOLS, "requires_tool": True}),
    ("skipped_required_tool", "Which unit would you like?", {"requires_tool": True}),
    ("unneeded_call", LIST_CALL, {"requires_tool": False}),
    ("unneeded_call", None, {"tool_calls": [structured("list_files", '{"path": "."}')], "requires_tool": False}),
    ("call_in_reasoning", "", {"reasoning": "I should call " + LIST_CALL}),
    ("call_in_reasoning", "<think>I'll call <tool_call>" + LIST_CALL + "</tool_call></think>", {}),
    ("chat_markup_leak", "Hello!<|im_end|>", {}),
    ("chat_markup_leak", "<start_of_turn>model\nHi there", {}),
    ("chat_markup_leak", "analysisThe user greets me.assistantfinalHello!", {}),
    ("fabricated_tool_result", "The weather in Paris is quite pleasant.", {"tools": WEATHER_TOOLS}),
    ("fabricated_tool_result", "It is 21°C and sunny in Paris.", {"tools": WEATHER_TOOLS, "history": WEATHER_HISTORY}),
    ("fabricated_tool_result", "Here is the list of files:\n- hello.txt\n- notes.md", {}),
    ("fabricated_tool_result", "File report.txt created successfully.", {}),
    ("fabricated_tool_result", "There are 4 files: hello.txt, notes.md and data.csv.", {"history": HISTORY}),
    (
        "narration_without_call",
        "You can use the following code:\n```python\nwith open('report.txt', 'w') as f:\n    f.write('x')\n```",
        {},
    ),
    ("narration_without_call", "```python\nimport os\nprint(os.listdir('.'))\n```", {}),
    ("narration_without_call", "ls -la", {}),
    ("narration_without_call", "I'll get your task done.", {}),
    ("wrong_wrapper_tag", '<function=list_files>{"path": "."}</function>', {}),
    ("wrong_wrapper_tag", '[TOOL_CALLS]list_files[ARGS]{"path": "."}', {}),
    ("wrong_wrapper_tag", '<|channel|>commentary to=functions.list_files <|constrain|>json<|message|>{"path": "."}<|call|>', {}),
    ("wrong_wrapper_tag", 'commentary to=functions.list_files json{"path": "."}', {}),
    (
        "wrong_wrapper_tag",
        '<|tool_calls_section_begin|><|tool_call_begin|>functions.list_files:0<|tool_call_argument_begin|>{"path": "."}<|tool_call_end|>',
        {},
    ),
    ("foreign_call_syntax", 'list_files\n{"path": "."}', {}),
    ("foreign_call_syntax", 'write_file path="a.txt" content="x"', {}),
    ("foreign_call_syntax", "```tool_code\n[search(query='x')]\n```", {"tools": None}),
    ("invalid_json", '{"name": "read_file", "arguments": {"path": "dir C:\\Pictures\\x"}}'.replace("\\\\", "\\"), {}),
    ("server_rejected_call", None, {"server_rejection": "Failed to parse tool call arguments as JSON: parse error"}),
    ("stream_assembly_error", None, {"stream_problems": ["chunk 4 carries content after the final chunk"]}),
]


@pytest.mark.parametrize(("mode", "content", "kwargs"), POSITIVE)
def test_positive(mode, content, kwargs):
    assert mode in modes(content, **kwargs)


def test_positive_and_negative_cover_every_mode():
    assert {mode for mode, _, _ in POSITIVE} == set(FAILURE_MODES)
    assert {mode for mode, _, _ in NEGATIVE} == set(FAILURE_MODES)


def test_reference_fabrication_case():
    good = run(
        None,
        tool_calls=[
            structured("write_file", json.dumps({"path": "report.txt", "content": "Files:\nhello.txt\nnotes.md\ndata.csv"}))
        ],
        history=HISTORY,
    )
    assert good.failure_modes == []
    bad = run(
        None,
        tool_calls=[
            structured("write_file", json.dumps({"path": "report.txt", "content": "Files:\necho.txt\nnotes.md\ndata.csv"}))
        ],
        history=HISTORY,
    )
    assert bad.failure_modes == ["fabricated_tool_result"]
    assert bad.details["fabricated_tool_result"] == ["echo.txt"]


def test_fabrication_detected_in_prompt_tool_mode_history():
    # prompt tool mode: calls are text, results come back as <tool_response> user messages
    history = [
        {"role": "system", "content": "You list files."},
        {"role": "user", "content": "List the files and write report.txt."},
        {"role": "assistant", "content": '<tool_call>{"name": "list_files", "arguments": {"path": "."}}</tool_call>'},
        {"role": "user", "content": '<tool_response>\n["hello.txt", "notes.md"]\n</tool_response>'},
    ]
    bad = run(
        '<tool_call>{"name": "write_file", "arguments": {"path": "report.txt", "content": "echo.txt, notes.md"}}</tool_call>',
        history=history,
    )
    assert "fabricated_tool_result" in bad.failure_modes and bad.details["fabricated_tool_result"] == ["echo.txt"]
    good = run(
        '<tool_call>{"name": "write_file", "arguments": {"path": "report.txt", "content": "hello.txt, notes.md"}}</tool_call>',
        history=history,
    )
    assert "fabricated_tool_result" not in good.failure_modes


def test_an_echoed_tool_definition_is_not_a_call():
    # small models often repeat the prompt's <tools> block; its schemas must not be executed as calls
    echoed = "Here are the tools:\n" + json.dumps(
        {"type": "function", "function": {"name": "list_files", "description": "List files.",
         "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []}}})  # fmt: skip
    result = run(echoed)
    assert result.recovered_calls == [] and result.calls("lenient") == []
    bare = json.dumps(
        {
            "name": "write_file",
            "description": "Write.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
    )
    assert run(bare).recovered_calls == []
    # a real call that happens to use "parameters" for its arguments is still recovered
    assert [c.name for c in run(json.dumps({"name": "list_files", "parameters": {"path": "."}})).recovered_calls] == [
        "list_files"
    ]


def test_nothing_fabricated_before_any_tool_answered():
    assert "fabricated_tool_result" not in modes(WRITE_CALL.replace("hello.txt", "poem.txt"))


# --------------------------------------------------------------------------- recovery details


@pytest.mark.parametrize(
    ("content", "source"),
    [
        ("<tool_call>\n" + LIST_CALL + "\n</tool_call>", "tagged"),
        ("```json\n" + LIST_CALL + "\n```", "fenced"),
        (LIST_CALL, "json_document"),
        ("First:\n" + LIST_CALL + "\nthen more", "json_lines"),
        ("I call " + LIST_CALL + " now", "brace_scan"),
        ("{'name': 'list_files', 'arguments': {'path': '.'}}", "python_literal"),
        ("list_files(path='.')", "pythonic"),
        ("<function=list_files><parameter=path>.</parameter></function>", "xml_parameters"),
        ('{"name": "list_files", "arguments": {"path": "."', "repair"),
    ],
)
def test_recovery_sources(content, source):
    result = run(content)
    assert [(c.name, c.arguments, c.source) for c in result.recovered_calls] == [("list_files", {"path": "."}, source)]
    assert result.recovered_by == source


def test_recovered_by_is_first_step_in_order():
    result = run("list_files(path='src')\n```json\n" + LIST_CALL + "\n```")
    assert {c.source for c in result.recovered_calls} == {"fenced", "pythonic"}
    assert result.recovered_by == "fenced"


def test_structured_server_shapes_normalized():
    shapes = [
        {"id": "a", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "."}'}},
        {"function": {"name": "list_files", "arguments": {"path": "."}}},
        {"name": "list_files", "arguments": {"path": "."}},
    ]
    for shape in shapes:
        result = run(None, tool_calls=[shape])
        assert result.failure_modes == []
        assert result.structured_calls[0].arguments == {"path": "."}
        assert result.structured_calls[0].source == "structured"
    assert run(None, tool_calls=[shapes[0]]).structured_calls[0].id == "a"


def test_truncated_structured_arguments_are_repaired():
    result = run(None, tool_calls=[structured("list_files", '{"path": "."')])
    assert result.failure_modes == ["repaired_json"]
    assert result.structured_calls[0].arguments == {"path": "."}


def test_react_action_lines():
    # the JSON Action Input holds the arguments: it is not a call object of its own (docs/failure-modes.md, ReAct)
    result = run('Thought: I need the files.\nAction: list_files\nAction Input: {"path": "."}')
    assert [(c.name, c.arguments) for c in result.recovered_calls] == [("list_files", {"path": "."})]
    assert result.failure_modes == ["mixed_prose", "nonstandard_keys"]
    bare = run("Action: list_files\nAction Input: .\nObservation: hello.txt")
    assert [(c.name, c.arguments) for c in bare.recovered_calls] == [("list_files", {"input": "."})]
    assert bare.failure_modes == ["nonstandard_keys", "schema_violation", "fabricated_tool_result"]


def test_tool_calls_wrapper_and_pythonic_positional():
    result = run('{"tool_calls": [' + LIST_CALL + "]}")
    assert result.recovered_calls[0].arguments == {"path": "."}
    result = run("write_file('a.txt', 'hi')")
    assert result.recovered_calls[0].arguments == {"path": "a.txt", "content": "hi"}


def test_prose_mentions_are_not_calls():
    for text in (
        "Call print(x) to debug.",
        "See f(a, b) in the paper.",
        "Use os.path.join(a, b) here.",
        "The set {1, 2, 3} is small.",
        'The JSON {"name": "Alice"} describes a person.',
    ):
        result = run(text)
        assert result.recovered_calls == [], text
        assert result.failure_modes == [], (text, result.failure_modes)


def test_unknown_pythonic_name_only_as_the_whole_payload():
    result = run("lst_files(path='.')")
    assert result.failure_modes == ["foreign_call_syntax", "unknown_tool"]
    sample = run("Run it like this:\n```python\nmain(debug=True)\nprint('done')\n```")
    assert sample.recovered_calls == [] and sample.failure_modes == []


def test_code_inside_a_json_string_is_not_pseudo_code():
    content = '{"name": "write_file", "arguments": {"path": "a.py", "content": "print(\\"a\\" + os.path.join(x))"}}'
    assert modes(content) == ["raw_json_in_content"]


def test_unexpected_argument_only_flagged_against_properties():
    tools = [{"type": "function", "function": {"name": "free", "parameters": {"type": "object"}}}]
    assert modes('{"name": "free", "arguments": {"anything": 1}}', tools=tools) == ["raw_json_in_content"]


def test_broken_tool_schema_disables_validation_only():
    tools = [{"type": "function", "function": {"name": "odd", "parameters": {"type": "no-such-type"}}}]
    assert modes(None, tool_calls=[structured("odd", "{}")], tools=tools) == []


# --------------------------------------------------------------------------- robustness

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=50),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
CALL_TEXTS = [
    LIST_CALL,
    WRITE_CALL,
    "<tool_call>" + LIST_CALL + "</tool_call>",
    "```json\n" + WRITE_CALL + "\n```",
    "list_files(path='.')",
    "<function=write_file><parameter=path>a</parameter></function>",
]


def _mutate(text: str, data: st.DataObject) -> str:
    for _ in range(data.draw(st.integers(0, 4))):
        pos = data.draw(st.integers(0, len(text)))
        op = data.draw(st.sampled_from(["cut", "insert", "delete"]))
        if op == "cut":
            text = text[:pos]
        elif op == "insert":
            text = text[:pos] + data.draw(st.sampled_from(list("{}[]\"',:\\()<>`+\n") + ["null", "</"])) + text[pos:]
        else:
            text = text[:pos] + text[pos + 1 :]
    return text


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.text(max_size=300))
def test_never_raises_on_text(text):
    run(text)


@FAST
@given(JSON)
def test_never_raises_on_json(value):
    run(json.dumps(value))
    run(None, tool_calls=[{"function": {"name": "list_files", "arguments": value}}])
    classify_document(value)


@FAST
@given(st.data())
def test_never_raises_on_mutated_calls(data):
    text = _mutate(data.draw(st.sampled_from(CALL_TEXTS)), data)
    run(text, history=HISTORY)
    run(None, tool_calls=[structured("write_file", text)], history=HISTORY)


@FAST
@given(JUNK, JUNK, JUNK, JUNK, JUNK, JUNK)
def test_never_raises_on_junk_fields(content, tool_calls, finish, usage, tools, history):
    for response in (
        {"content": content, "tool_calls": tool_calls, "finish_reason": finish, "usage": usage},
        content,
        tool_calls,
    ):
        result = classify(response, tools=tools, history=history)
        assert isinstance(result, Classification)
        assert "internal_error" not in result.details
        json.dumps(result.to_dict())
    classify(
        {"tool_calls": [tool_calls, {"function": content}]},
        tools=[tools, {"function": tools}],
        history=[history, {"role": "assistant", "content": content, "tool_calls": tool_calls}],
    )


@FAST
@given(JSON, JSON, JSON)
def test_classify_document_never_raises(tools, messages, response):
    out = classify_document({"tools": tools, "messages": messages, "response": response, "extra": 1})
    assert set(out) == {"failure_modes", "calls", "recovered_by", "classifier_version", "details"}
    json.dumps(out)


def test_failure_modes_canonical_and_unique():
    content = "<think>x</think>Sure. " + LIST_CALL + "\n" + "{'name': 'lst_files', 'arguments': {'path': '/'}}"
    result = run(content, finish_reason="length")
    order = list(FAILURE_MODES)
    assert result.failure_modes == sorted(set(result.failure_modes), key=order.index)


@pytest.mark.parametrize(
    "content",
    [
        "x" * 1_000_000,
        "{" * 10_000 + "}" * 10_000,
        "{" * 10_000,
        "[" * 10_000,
        '{"name": "list_files", "arguments": ' + "[" * 10_000 + "]" * 10_000 + "}",
        "list_files(" + "(" * 10_000 + ")" * 10_001,
        ("word " * 20 + "\n") * 10_000,
        '{"name": "write_file", "arguments": {"path": "a", "content": "' + "x" * 1_000_000,
        "{'" * 500_000,
        "<tool_call>" * 50_000,
        "<think>" * 50_000,
        LIST_CALL * 20_000,
        "\\" * 1_000_000,
    ],
)
def test_pathological_inputs_complete(content):
    result = run(content, history=HISTORY)
    assert isinstance(result.failure_modes, list)


def test_deep_structured_arguments_complete():
    deep: dict = {}
    node = deep
    for _ in range(10_000):
        node["a"] = {}
        node = node["a"]
    result = run(None, tool_calls=[{"function": {"name": "list_files", "arguments": deep}}])
    assert "schema_violation" in result.failure_modes
    cyclic: dict = {"path": "."}
    cyclic["self"] = cyclic
    run(None, tool_calls=[{"function": {"name": "list_files", "arguments": cyclic}}])


# --------------------------------------------------------------------------- red-team
# red-team finding: non-object arguments to an offered tool carried no label
@pytest.mark.parametrize("arguments", [[1, 2], None, 7])
def test_non_object_arguments_to_an_offered_tool_are_labelled(scenario, arguments):
    # the tool answers "ERROR: arguments must be a JSON object" but the turn carries no label
    reply = {"content": None, "tool_calls": [{"function": {"name": "list_files", "arguments": arguments}}],
             "finish_reason": "tool_calls"}  # fmt: skip
    verdict = classify(reply, tools=scenario.tool_schemas(), history=[])
    assert verdict.failure_modes, "a call whose arguments are not an object must carry a failure mode"


@pytest.mark.parametrize(
    "content",
    [
        "{" * 200_000,
        '{"a":' * 40_000,
        "list_files(" * 20_000,
        "<tool_call>" * 20_000,
        "```json\n{}\n```\n" * 10_000,
        '{"name": "list_files", "arguments": {"path": "' + "\\" * 200_000 + '"}}',
    ],
    ids=["braces", "open-objects", "open-calls", "tags", "fences", "backslashes"],
)
def test_guard_classifier_is_fast_on_pathological_text(scenario, content):
    import time

    start = time.perf_counter()
    classify({"content": content, "tool_calls": None, "finish_reason": "stop"}, tools=scenario.tool_schemas(), history=[])
    assert time.perf_counter() - start < 5


# --------------------------------------------------------------------------- classifier 2.0 regressions


def test_a_function_definition_in_a_fence_is_not_a_call():
    # issue: `def list_tickets():` inside a fenced Python block was recovered and executed as a call
    tools = [{"type": "function", "function": {"name": "list_tickets", "parameters": {"type": "object", "properties": {}}}}]
    defined = run("```python\ndef list_tickets():\n    return [{'id': 'T-101'}]\n```", tools=tools)
    assert defined.recovered_calls == [] and defined.calls("lenient") == []
    called = run("```python\ndef list_tickets():\n    return []\n\ntickets = list_tickets()\n```", tools=tools)
    assert [c.name for c in called.recovered_calls] == ["list_tickets"]  # an invocation of the offered tool is a call


def test_weather_answered_without_the_tool_is_labelled():
    # issue: weather_probe runs answering "the weather in Paris is quite pleasant" with no call got no label
    result = run("The weather in Paris right now is quite pleasant.", tools=WEATHER_TOOLS, requires_tool=True)
    assert result.failure_modes == ["fabricated_tool_result", "skipped_required_tool"]
    evidence = result.details["evidence"]
    assert set(evidence) == {"fabricated_tool_result", "skipped_required_tool"}
    assert evidence["fabricated_tool_result"]["rule"] and "pleasant" in evidence["fabricated_tool_result"]["span"]


def test_a_value_that_contradicts_the_tool_is_labelled_and_a_copied_one_is_not():
    wrong = run("It is 21°C in Paris with light drizzle.", tools=WEATHER_TOOLS, history=WEATHER_HISTORY)
    assert "fabricated_tool_result" in wrong.failure_modes and "value: 21°C" in wrong.details["fabricated_tool_result"]
    right = run("It is 17°C (62.6°F) in Paris with light drizzle.", tools=WEATHER_TOOLS, history=WEATHER_HISTORY)
    assert right.failure_modes == []


def test_a_call_only_in_the_reasoning_field_is_recovered_for_the_lenient_parser():
    result = run("", reasoning='I will call it: <tool_call>{"name": "list_files", "arguments": {"path": "."}}</tool_call>')
    assert result.failure_modes == ["call_in_reasoning"]
    assert [c.source for c in result.calls("lenient")] == ["reasoning"] and result.calls("strict") == []
    assert result.recovered_by == "reasoning"


def test_every_label_carries_its_evidence():
    result = run("Sure! ```json\n" + LIST_CALL + "\n```", requires_tool=False)
    assert set(result.details["evidence"]) == set(result.failure_modes) == {"code_fence", "mixed_prose", "unneeded_call"}
    assert all(e["rule"] and isinstance(e["span"], str) for e in result.details["evidence"].values())


@pytest.mark.parametrize("n", [4_000, 16_000, 64_000])
def test_escaped_quotes_in_an_unclosed_string_are_linear(n):
    # issue: `{"name": "list_files", "arguments": {"path": '` + n x `\'` took 71 s at 16 KB (the scan restarted at every quote)
    content = '{"name": "list_files", "arguments": {"path": \'' + "\\'" * n
    assert isinstance(run(content).failure_modes, list)  # the benchmark shows the time; here it must simply finish


@pytest.mark.parametrize(
    ("pattern", "value", "message"),
    [("^(a+)+$", "a" * 40 + "!", "does not match"), ("^(a|aa)+$", "a" * 60 + "!", "timed out")],
)
def test_a_pathological_schema_pattern_times_out_as_a_schema_violation(pattern, value, message):
    # issue: a schema pattern such as ^(a+)+$ hung classify on a 40-character argument (the regex module
    # answers that one at once; ^(a|aa)+$ still backtracks and hits the budget)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "string", "pattern": pattern}}}}}]  # fmt: skip
    result = run(None, tool_calls=[structured("f", json.dumps({"x": value}))], tools=tools)
    assert result.failure_modes == ["schema_violation"]
    assert message in result.details["schema_violation"][0]["message"]


# --------------------------------------------------------------------------- calls a server's parser mangled

WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@pytest.mark.parametrize("name", ["get_weatherget_weather", "get_weather.get_weather", "functions.get_weather"])
def test_a_name_the_server_repeated_or_prefixed_is_unknown_but_lenient_calls_the_offered_tool(name):
    result = classify({"content": None, "tool_calls": [structured(name, '{"city": "Paris"}')]}, tools=WEATHER_TOOLS)
    assert result.failure_modes == ["unknown_tool"]
    assert result.details["unknown_tool"] == {name: "get_weather"}
    assert [(c.name, c.valid) for c in result.calls("strict")] == [(name, False)]  # strict acts on what was sent
    assert [(c.name, c.arguments, c.valid) for c in result.calls("lenient")] == [("get_weather", {"city": "Paris"}, True)]


def test_a_different_unknown_name_is_not_mended():
    result = classify({"content": None, "tool_calls": [structured("get_weathers", '{"city": "Paris"}')]}, tools=WEATHER_TOOLS)
    assert result.failure_modes == ["unknown_tool"] and "mended_names" not in result.details
    assert [c.name for c in result.calls("lenient")] == ["get_weathers"]


@pytest.mark.parametrize("raw", ['<|python_tag|>{"city": "Paris"}', 'functions.get_weather:0 {"city": "Paris"}'])
def test_an_argument_string_with_a_junk_prefix_is_repaired(raw):
    result = classify({"content": None, "tool_calls": [structured("get_weather", raw)]}, tools=WEATHER_TOOLS)
    assert result.failure_modes == ["repaired_json"]
    assert [(c.arguments, c.valid) for c in result.calls("strict")] == [({"city": "Paris"}, True)]


def test_an_argument_string_that_is_only_junk_stays_invalid():
    result = classify({"content": None, "tool_calls": [structured("get_weather", "city=Paris")]}, tools=WEATHER_TOOLS)
    assert "invalid_json" in result.failure_modes and result.calls("strict")[0].arguments == {}


def test_recovered_argument_values_keep_their_exact_text():
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"}}}}}]  # fmt: skip
    cases = {
        "<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\n  two  spaces \n\nline2\n"
        "</parameter>\n</function>": "  two  spaces \n\nline2",
        "write_file(path='a.txt', content='  x  \\n')": "  x  \n",
        '<function=write_file>{"path": "a.txt", "content": "  y  "}</function>': "  y  ",
        'Action: write_file\nAction Input: {"path": "a.txt", "content": " z "}': " z ",
    }
    for content, expected in cases.items():
        [call] = classify({"content": content}, tools=tools).calls("lenient")
        assert call.arguments == {"path": "a.txt", "content": expected}, content


def test_an_equal_copy_of_a_text_gets_its_own_quote_index():
    # newcomer finding: an equality-keyed cache compared a 256 KB text in full on every string lookup once an equal
    # copy had been cached (4x slower past 256 KB in the adversarial benchmark); the cache now matches by identity
    from harness.classifier import jsonscan

    first = "{'" + "\\'" * 1000
    copy = "".join(list(first))
    assert copy == first and copy is not first
    assert jsonscan.string_end(first, 1, "'") == jsonscan.string_end(copy, 1, "'") == -1
    assert jsonscan._quote_index(copy) is not jsonscan._quote_index(first)
    assert jsonscan._quote_index(copy) is jsonscan._quote_index(copy)


# --------------------------------------------------------------------------- red-team: bounded work on any input

HANGS = {
    "key=value backtracking": "x" + ' a="' * 36 + " !",  # was exponential: 12.5 s at 148 characters
    "blank lines to the token limit": "Sure! Here are the files:" + "\n" * 64_000,  # was 147 s (^\s* under re.M)
    "arrow calls": '{tool => "x" ' * 20_000,  # was quadratic: 293 s at 256 KB
    "harmony headers": "to=functions.a " * 4_400,  # was 30 s at 64 KB
    "commentary headers": "commentary to=x " * 4_000,
    "one long file-like token": "See " + "a.py" * 16_000 + "a",  # was quadratic within the token
}


@pytest.mark.parametrize("content", list(HANGS.values()), ids=list(HANGS))
def test_inputs_that_made_a_scan_super_linear_finish(content):
    # the benchmark (classifier_speed.py --adversarial) shows the times; here each must simply finish and be labelled
    result = run(content, history=HISTORY, reasoning=content if "\n" in content else None)
    assert isinstance(result.failure_modes, list) and "internal_error" not in result.details


def _validate(schema: dict, arguments: dict) -> list[str]:
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    result = run(None, tool_calls=[structured("f", json.dumps(arguments))], tools=tools)
    return result.details.get("schema_violation", [])


def test_many_keys_or_items_cost_at_most_one_pattern_budget():
    evil = {"type": "object", "properties": {"x": {"type": "string"}}, "patternProperties": {"^(a|a)*$": {"type": "string"}}}
    errors = _validate(evil, {"a" * 30 + "!" + str(i): "v" for i in range(160)})  # was 8.6 s: 0.05 s per key
    assert errors and all("timed out" in e["message"] or "unexpected" in e["message"] for e in errors)
    contains = {"type": "object", "properties": {"xs": {"type": "array", "contains": {"type": "string", "pattern": "^(a|a)*$"}}}}
    assert _validate(contains, {"xs": ["a" * 30 + "!"] * 160})  # was 8 s


def test_unique_items_and_enum_keep_json_schema_equality_in_linear_time():
    unique = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    assert _validate(unique, {"xs": [{"a": [i]} for i in range(10_000)]}) == []  # was 152 s (pairwise)
    assert _validate(unique, {"xs": [{"a": 1, "b": 2}, {"b": 2, "a": 1.0}]})  # equal objects: key order and 1 == 1.0
    assert _validate(unique, {"xs": [1, True]}) == []  # true is not 1 in JSON Schema
    enum = {"type": "object", "properties": {"xs": {"type": "array", "items": {"enum": [f"s{i}" for i in range(20_000)] + [1]}}}}
    assert _validate(enum, {"xs": [f"s{i}" for i in range(4_000)] + [1.0]}) == []  # was 6 s
    assert _validate(enum, {"xs": ["s1", True]})


def test_a_schema_that_allows_other_arguments_is_the_only_judge_of_them():
    base = {"type": "object", "properties": {"x": {"type": "string"}}}
    assert _validate(base, {"x": "a", "y": 1})  # not stated: an argument outside properties is unexpected
    for allowing in ({"additionalProperties": True}, {"additionalProperties": {"type": "integer"}},
                     {"allOf": [{"properties": {"y": {"type": "integer"}}}]}):  # fmt: skip
        assert _validate({**base, **allowing}, {"x": "a", "y": 1}) == [], allowing


def test_a_tool_schema_that_cannot_be_applied_is_not_the_models_fault():
    broken = {"type": "object", "properties": {"x": {"$ref": "#/$defs/Missing"}}}
    assert _validate(broken, {"x": "a"}) == []


def test_near_miss_names_among_a_thousand_tools_are_judged_quickly():
    tools = [{"type": "function", "function": {"name": f"tool_{i}_name", "parameters": {}}} for i in range(1000)]
    calls = [structured(f"tool_{i}_nam", "{}", f"c{i}") for i in range(128)]  # was 3.8 s in difflib
    result = run(None, tool_calls=calls, tools=tools)
    assert "unknown_tool" in result.failure_modes and len(result.details["unknown_tool"]) == 128


# --------------------------------------------------------------------------- red-team: labels on plausible output

WEATHER_TOOL = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip


def _answered(result: str) -> list[dict]:
    return [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [structured("get_weather", '{"city": "Paris"}', "w1")]},
        {"role": "tool", "tool_call_id": "w1", "content": result},
    ]


@pytest.mark.parametrize(
    ("result", "answer"),
    [
        ('{"temperature_c": 21.4, "condition": "partly cloudy"}', "It's about 21°C in Paris right now, partly cloudy."),
        ('{"temperature_f": 62}', "It is 62°F, about 17°C."),
        ("Paris: rain, 12°C", "It's rainy in Paris today, 12°C."),
        ("Paris: 17°C, sunny, humidity 65, wind 12 km/h", "It's 17°C and sunny with 65% humidity."),
        ('{"temperature_c": 17, "condition": "light drizzle", "humidity_pct": 82}', "17°C, light drizzle and a humidity of 82%."),
    ],
)
def test_a_faithful_weather_answer_is_not_fabricated(result, answer):
    assert run(answer, history=_answered(result), tools=WEATHER_TOOL).failure_modes == []


def test_a_contradicting_weather_answer_still_is():
    history = _answered('{"temperature_c": 17, "condition": "light drizzle"}')
    assert run("It is 21°C and sunny in Paris.", history=history, tools=WEATHER_TOOL).failure_modes == ["fabricated_tool_result"]


def test_non_ascii_names_from_a_json_tool_result_are_known():
    history = HISTORY[:2] + [
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"files": ["café.txt", "notes.md"]})}
    ]
    assert modes("The directory holds two files: café.txt and notes.md.", history=history) == []


def test_a_part_of_the_listing_is_not_a_miscount():
    history = HISTORY[:2] + [{"role": "tool", "tool_call_id": "call_1", "content": '{"files": ["a.md", "b.md", "c.txt"]}'}]
    assert modes("There are 3 files; 2 files are Markdown: a.md and b.md.", history=history) == []
    assert modes("There are 4 files: a.md, b.md and c.txt.", history=history) == ["fabricated_tool_result"]


@pytest.mark.parametrize(
    ("prompt", "answer", "tools"),
    [
        ("Convert 20°C to Fahrenheit.", "20°C is 68°F.", "weather"),
        (
            "Why does this fail?\n```python\nfor i in range(len(xs) + 1): print(xs[i])\n```",
            "The bug is that range goes one past the end.",
            "files",
        ),
        ("List the files.", "Sure! Here are the files:", "files"),
    ],
)
def test_what_the_prompt_gives_or_no_fact_at_all_is_not_fabricated(prompt, answer, tools):
    result = run(answer, history=[{"role": "user", "content": prompt}], tools=WEATHER_TOOL if tools == "weather" else TOOLS)
    assert "fabricated_tool_result" not in result.failure_modes


def test_a_past_tense_report_is_not_narration():
    history = HISTORY + [{"role": "assistant", "content": None, "tool_calls": [structured("read_file", '{"path": "notes.md"}', "r")]},
                         {"role": "tool", "tool_call_id": "r", "content": "notes"}]  # fmt: skip
    assert "narration_without_call" not in modes("First, I read notes.md, then I wrote its summary. Done.", history=history)


@pytest.mark.parametrize(
    "content",
    [
        '```json\n{"name": "Python: Current File", "type": "python", "request": "launch", "args": ["--verbose"]}\n```',
        '{"name": "web", "image": "nginx:1.25", "args": ["--port", "80"]}',
    ],
)
def test_a_json_document_that_is_data_is_not_a_call(content):
    result = run(content, tools=[])
    assert result.calls("lenient") == [] and result.failure_modes == []


def test_markup_mentions_are_not_leaks_or_fake_observations():
    assert modes("<s>$20</s> $15 this week") == []
    assert modes("Hypothesis: x rises.\nObservation: it did.\nConclusion: yes.", tools=[]) == []


def test_a_broken_call_whose_arguments_hold_a_description_is_still_a_call():
    tools = [{"type": "function", "function": {"name": "create_ticket", "parameters": {"type": "object", "properties": {
        "title": {"type": "string"}, "description": {"type": "string"}}}}}]  # fmt: skip
    content = '{"name": "create_ticket", "arguments": {"title": "Login fails", "description": "Clicking "Login" does nothing"}}'
    assert modes(content, tools=tools) == ["raw_json_in_content", "invalid_json"]


@pytest.mark.parametrize(
    "content",
    [
        "functions.list_files(path='docs')",
        "```tool_code\nprint(default_api.list_files(path='docs'))\n```",
        'list_files({"path": "docs"})',
    ],
)
def test_dotted_and_dict_argument_call_forms_are_recovered(content):
    [call] = run(content).calls("lenient")
    assert (call.name, call.arguments) == ("list_files", {"path": "docs"})


def test_llamas_builtin_call_form_is_recovered():
    [call] = run('<|python_tag|>get_weather.call(city="Paris")', tools=WEATHER_TOOL).calls("lenient")
    assert (call.name, call.arguments) == ("get_weather", {"city": "Paris"})


@pytest.mark.parametrize(
    "content",
    [
        "I did not call write_file(path='report.txt', content='') because the list was empty.",
        "If you'd like, I can run list_files(path='docs') next. Shall I?",
        "You can call list_files(path='docs') or write_file(path='a.txt', content='x') yourself.",
        "The `list_files(path)` tool returns the names.",
        "The model replied \"write_file(path='a.txt', content='x')\" last time.",
        "```python\ndef read_file(path):\n    \"\"\"Usage: list_files(path='docs')\"\"\"\n    # usage: write_file(path='x', content='y')\n"
        "    hint = \"Try list_files(path='/etc') to browse\"\n```",
    ],
)
def test_a_call_that_is_only_mentioned_is_not_acted_on(content):
    assert run(content).calls("lenient") == []


def test_a_call_the_reasoning_rejects_is_not_acted_on():
    result = run("The answer is 4.", reasoning="I don't need list_files(path='x') for this. Answer 4.")
    assert result.calls("lenient") == [] and "call_in_reasoning" not in result.failure_modes


def test_evidence_spans_are_the_replys_own_text():
    content = '<tool_call>{"name": "list_files", "arguments": {"path": "."}}</tool_call>\n{"name": "read_file", "parameters": {"path": "a.txt"}}'
    evidence = run(content).details["evidence"]
    assert (
        evidence["nonstandard_keys"]["span"]
        == evidence["raw_json_in_content"]["span"]
        == '{"name": "read_file", "parameters": {"path": "a.txt"}}'
    )
    structured_too = run(
        '{"name": "list_files", "arguments": {"path": "."}}', tool_calls=[structured("read_file", '{"path": "a"}')]
    )
    assert (
        structured_too.details["evidence"]["raw_json_in_content"]["span"] == '{"name": "list_files", "arguments": {"path": "."}}'
    )


def test_a_react_input_in_a_fence_is_the_calls_arguments():
    [call] = run('Action: list_files\nAction Input: ```json\n{"path": "docs"}\n```').calls("lenient")
    assert (call.name, call.arguments) == ("list_files", {"path": "docs"})


# --------------------------------------------------------------------------- red-team, second pass: regressions of 2.2

SEARCH_TOOLS = TOOLS + [{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("search", "get", "join")]


@pytest.mark.parametrize(
    "content",
    [
        "Since I can't see the directory, I'll run list_files(path='.')",
        "Okay, I don't know the files yet so list_files(path='.')",
        "To do this I should call list_files(path='.')",
        "To find out what it holds, I would like to run list_files(path='.')",
        "Let me see if the folder exists by calling list_files(path='.')",
        "I'll invoke the tool list_files(path='.')",
        "Rather than guess, list_files(path='.')",
        "Now I can call list_files(path='.')",
        "Let me check: `list_files(path='.')`",
        "```\nI'll run: list_files(path='.')\n```",
    ],
)
def test_a_call_in_prose_with_a_negation_or_modal_elsewhere_is_still_a_call(content):
    assert [c.name for c in run(content).calls("lenient")] == ["list_files"]


def test_a_call_offered_as_an_example_is_a_mention():
    assert run("You could use a tool, e.g. list_files(path='docs'), to see it.").calls("lenient") == []


@pytest.mark.parametrize("line", ["m = re.search(r'\\d+', text)", "r = requests.get(url)", "p = os.path.join(a, b)"])
def test_a_method_that_shares_a_tools_name_is_not_the_tool(line):
    assert run(f"```python\n{line}\n```", tools=SEARCH_TOOLS).calls("lenient") == []


@pytest.mark.parametrize(
    "content",
    [
        '{"name": "fs:read_file", "arguments": {"path": "a.txt"}}',
        '{"name": "filesystem/read_file", "arguments": {"path": "a.txt"}}',
        '{"name": "web_search", "arguments": ["cats"]}',
    ],
)
def test_a_json_call_to_a_tool_not_offered_is_still_a_call(content):
    assert modes(content) == ["raw_json_in_content", "unknown_tool"]


ORDER = "Order A7 (customer #1042): 3 items, total $59.99, 10% discount applied, shipped 2024-05-02."


@pytest.mark.parametrize("answer", ["Order A7 cost $1042.", "It cost $3.", "It had a 3% discount.", "It had a 59.99% discount."])
def test_a_number_from_another_field_does_not_explain_a_value(answer):
    history = HISTORY[:2] + [{"role": "tool", "tool_call_id": "call_1", "content": ORDER}]
    assert "fabricated_tool_result" in modes(answer, history=history)


@pytest.mark.parametrize("answer", ["It is 17.9°C.", "It is 16.1°C.", "It is 3°C in Paris.", "It is 49°F."])
def test_a_temperature_the_tool_did_not_give_is_fabricated(answer):
    history = _answered('{"temperature": 17.0, "lat": 48.85, "lon": 2.35, "humidity": 82, "wind_kph": 12}')
    assert run(answer, history=history, tools=WEATHER_TOOL).failure_modes == ["fabricated_tool_result"]


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [("What's the weather in Paris on May 21?", "It is currently 21°C in Paris."), ("Reply in under 50 words.", "It is 50°F.")],
)
def test_a_number_in_the_prompt_that_is_not_a_temperature_does_not_explain_one(prompt, answer):
    assert (
        "fabricated_tool_result" in run(answer, history=[{"role": "user", "content": prompt}], tools=WEATHER_TOOL).failure_modes
    )


def test_a_code_fence_in_the_system_prompt_does_not_excuse_the_bug_claim():
    history = [{"role": "system", "content": 'Call tools like ```json\n{"name": "x"}\n```'},
               {"role": "user", "content": "Why does stats.py crash?"}]  # fmt: skip
    assert "fabricated_tool_result" in modes("The bug is in the mean function: it divides by zero.", history=history)


LISTING = HISTORY[:2] + [{"role": "tool", "tool_call_id": "call_1", "content": '["a.txt", "b.md", "c.py"]'}]


@pytest.mark.parametrize(
    "answer",
    [
        "5 files: a.txt, b.md and c.py.",
        "Total: 5 files.",
        "In total, 5 files are present.",
        "There's 5 files here.",
        "5 files were listed.",
        "The listing shows 5 files.",
    ],  # fmt: skip
)
def test_a_wrong_total_of_files_is_fabricated(answer):
    assert modes(answer, history=LISTING) == ["fabricated_tool_result"]


def test_a_listing_with_a_non_ascii_name_is_still_counted():
    history = HISTORY[:2] + [{"role": "tool", "tool_call_id": "call_1", "content": json.dumps(["café.txt", "b.md", "c.py"])}]
    assert modes("There are 5 files in the current directory.", history=history) == ["fabricated_tool_result"]


@pytest.mark.parametrize(
    "answer", ["Here are the files: Makefile, README, LICENSE, src, docs", "Here are the files:\n\nMakefile\nREADME"]
)
def test_a_listing_of_names_without_extensions_is_fabricated(answer):
    assert "fabricated_tool_result" in modes(answer, history=[{"role": "user", "content": "List the files."}])


def test_bos_and_eos_around_the_reply_are_a_leak():
    assert modes("<s>The answer is 4.</s>") == ["chat_markup_leak"]


def test_a_fenced_react_input_that_is_not_json_is_unwrapped_and_fast():
    [call] = run("Action: list_files\nAction Input:\n```\ndocs\n```").calls("lenient")
    assert call.arguments == {"input": "docs"}
    assert isinstance(modes("Action: list_files\nAction Input: ```" + " " * 4000 + "x"), list)  # was cubic: 91 s


def test_a_javascript_object_argument_is_repaired():
    [call] = run("list_files({path: 'docs'})").calls("lenient")
    assert call.arguments == {"path": "docs"}


def test_a_tool_call_after_many_other_calls_in_code_is_found():
    content = "```python\n" + "print(1)\n" * 130 + "list_files(path='docs')\n```"
    assert [c.name for c in run(content).calls("lenient")] == ["list_files"]


@pytest.mark.parametrize(
    ("content", "tools"),
    [
        ("It is " + "1" * 80_000, "weather"),  # _TEMPERATURE started at every digit: 295 s at 80 KB
        ("temp" + "a" * 80_000, "weather"),
        ("```python\n" + "a" * 80_000 + "\n```", "files"),  # `\w+ = [{` started at every letter
        ("Action: list_files" + " " * 80_000 + "\nAction Input: {}", "files"),  # [ \t]*\n?[ \t]* backtracked
        ("x a=" + "b" * 80_000, "files"),
    ],
    ids=["digits", "long word", "long code word", "spaces before Action Input", "long key=value"],
)
def test_long_runs_of_one_character_are_read_in_linear_time(content, tools):
    assert isinstance(modes(content, tools=WEATHER_TOOL if tools == "weather" else TOOLS), list)
