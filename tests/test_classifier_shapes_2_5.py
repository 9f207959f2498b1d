"""Classifier 2.5: the adjudicator's call-shape, payload and validation rulings (docs/failure-modes.md).

One test per ruling, on inputs written like real model output (the guide's own examples where it
gives one) and, where the tune part of the corpus shows the shape, on that entry's reply (named in
the test); the last test pins a guide example the classifier missed (a broken object's keys).
Behaviour modes (fabrication, narration, restraint) are another change's concern: the assertions
here name the envelope, payload and validation modes and the recovered calls.
"""

from __future__ import annotations

import json

from harness.classifier import FAILURE_MODES, classify
from tests.helpers import CORPUS, function_tool

#: the envelope, payload and validation modes, repeated_call, and sandbox_escape_attempt: what these rulings touch
_ORDER = list(FAILURE_MODES)
SHAPE_MODES = frozenset([*_ORDER[: _ORDER.index("repeated_call") + 1], "sandbox_escape_attempt"])


def tool(name, props=None, required=()):
    return function_tool(name, f"{name}.", props, required)


TOOLS = [
    tool("list_files", {"path": {"type": "string"}}, ["path"]),
    tool("write_file", {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
    tool("list_tickets"),
    tool("get_current_weather", {"location": {"type": "string"}}, ["location"]),
    tool("calculator", {"expression": {"type": "string"}}, ["expression"]),
]
USER = [{"role": "user", "content": "Do the task."}]


def run(content=None, *, tools=TOOLS, tool_calls=None, history=USER, finish_reason="stop"):
    response = {"content": content, "tool_calls": tool_calls, "finish_reason": finish_reason}
    return classify(response, tools=tools, history=history)


def shape(result):
    """The reply's envelope, payload and validation modes (and repeats, escapes), in canonical order."""
    return [m for m in result.failure_modes if m in SHAPE_MODES]


def calls(result):
    return [(c.name, c.arguments) for c in result.calls("lenient")]


def entry(entry_id):
    data = json.loads((CORPUS / f"{entry_id}.json").read_text(encoding="utf-8"))
    assert not data["held_out"], "only tune-part replies may pin a rule"
    return data


def structured(name, arguments):
    fn = {"arguments": arguments} if name is None else {"name": name, "arguments": arguments}
    return [{"id": "call_1", "type": "function", "function": fn}]


def test_1_a_protocols_request_object_is_a_call_with_nonstandard_keys():
    rpc = '{"jsonrpc": "2.0", "method": "eval", "params": {"expression": "2+2"}, "id": 1}'
    r = run(rpc, tools=None)
    assert shape(r) == ["raw_json_in_content", "nonstandard_keys"]
    assert calls(r) == [("eval", {"expression": "2+2"})]
    home = 'Turning it off now.\n{"service": "turn_off", "target_device": "light.kitchen"}'
    r = run(home, tools=None)
    assert shape(r) == ["raw_json_in_content", "mixed_prose", "nonstandard_keys"]
    assert calls(r) == [("turn_off", {"target_device": "light.kitchen"})]
    r = run('{"service": "turn_off", "target_device": "light.kitchen"}')  # tools known: a call of a tool not offered
    assert shape(r) == ["raw_json_in_content", "nonstandard_keys", "unknown_tool"]
    mcp = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "list_files", "arguments": {"path": "."}}}
    assert calls(run(json.dumps(mcp))) == [("list_files", {"path": "."})]  # MCP names the tool in its params
    # not requests: a JSON-RPC response, and data with a "service" field
    assert calls(run('{"jsonrpc": "2.0", "result": 4, "id": 1}', tools=None)) == []
    assert calls(run('{"service": "Netflix", "price": 15.49}', tools=None)) == []
    r = run('{"jsonrpc": "2.0", "method": "calculator", "params": {"expression": "2+', tools=None)  # cut: repaired
    assert shape(r) == ["raw_json_in_content", "repaired_json", "nonstandard_keys"]


def test_2_an_echo_of_a_tool_definition_stays_an_echo_beside_a_stray_arguments_key():
    definition = {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files in a directory.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
        "arguments": {"path": "."},
    }
    for tools in (TOOLS, None):
        r = run(json.dumps(definition), tools=tools)
        assert (shape(r), calls(r)) == ([], [])


def test_3_an_unclosed_fence_is_a_fence_and_an_inline_code_span_is_prose():
    r = run('```homeassistant\n{"name": "light.turn_off", "arguments": {"entity_id": "light.kitchen"}}', tools=None)
    assert shape(r) == ["code_fence"]
    assert calls(r) == [("light.turn_off", {"entity_id": "light.kitchen"})]
    r = run("To see the files, use the command `list_files()` in your sandbox.")
    assert (shape(r), calls(r)) == ([], [])
    r = run("First the listing: `list_files(path='.')`, then the report.")  # an inline span is no fence: a call in prose
    assert shape(r) == ["mixed_prose", "foreign_call_syntax"]
    # embedded-support_triage-t07-s0-prompt-turn1: the reply ends inside its only ``` fence, which holds the calls
    data = entry("embedded-support_triage-t07-s0-prompt-turn1")
    assert data["response"]["content"].count("```") == 1
    r = classify(data["response"], tools=data["tools"], history=data["messages"])
    assert "code_fence" in r.failure_modes
    assert [(c.name, c.source) for c in r.recovered_calls] == [("list_tickets", "fenced"), ("write_file", "fenced")]
    # embedded-extract_fields-t07-s10-prompt-turn1: "- `open_doc_file()`" lines name no offered tool: no call, no fence
    data = entry("embedded-extract_fields-t07-s10-prompt-turn1")
    r = classify(data["response"], tools=data["tools"], history=data["messages"])
    assert (shape(r), r.recovered_calls) == ([], [])


def test_4_a_heading_that_introduces_the_call_is_a_label_and_a_sentence_is_prose():
    call = '[{"name": "list_files", "arguments": {"path": "."}}]'
    for heading in ("Calling tools:", "Tool calls:", "Output:"):
        assert shape(run(f"{heading}\n{call}")) == ["raw_json_in_content"], heading
    for sentence in ("I'll call the tool now:", "I will call the tool now:", "Let me check:", "Here is the call:"):
        assert shape(run(f"{sentence}\n{call}")) == ["raw_json_in_content", "mixed_prose"], sentence


def test_5_a_single_tag_holding_a_json_call_and_gemma_4s_marker():
    r = run('<functioncall {"name": "HassTurnOn", "arguments": {"name": "kitchen light"}}>', tools=None)
    assert shape(r) == ["wrong_wrapper_tag"]
    assert calls(r) == [("HassTurnOn", {"name": "kitchen light"})]
    r = run('<|tool_call>call:calculator{expression:"2+2"}<tool_call|>')
    assert shape(r) == ["wrong_wrapper_tag", "foreign_call_syntax", "repaired_json"]
    assert calls(r) == [("calculator", {"expression": "2+2"})]
    r = run('<|tool_call>call:get_current_weather{location:<|"|>Paris<|"|>}<tool_call|>', tools=None)
    assert calls(r) == [("get_current_weather", {"location": "Paris"})]  # Gemma 4's own string delimiter


def test_6_an_unoffered_name_called_inside_other_code_is_no_call_attempt():
    code = "```python\nx = list_files_and_names_and_one_line_function(5)\nprint(x)\n```"
    r = run(code)
    assert (shape(r), calls(r)) == ([], [])
    r = run("```python\nx = list_files_and_names_and_one_line_function(n=5)\n```")
    assert (shape(r), calls(r)) == ([], [])


def test_7_a_code_string_for_a_code_running_tool_is_invalid_json_only():
    repl = [tool("python_repl_ast", {"query": {"type": "string"}})]
    for code in ("df.shape[0]", "len(df[df['gender'] == 'male'])", "print(df.head())"):
        r = run(None, tools=repl, tool_calls=structured("python_repl_ast", code))
        assert shape(r) == ["invalid_json"], code
    # a broken argument object still shows the code it computes its values with
    r = run(None, tools=TOOLS, tool_calls=structured("list_files", '{"path": os.path.join("a", "b")}'))
    assert {"invalid_json", "pseudo_code_in_arguments"} <= set(r.failure_modes)


def test_8_a_literal_inside_a_call_expression_is_judged_as_a_python_literal():
    r = run('get_current_weather({location_data: "Paris"})')
    assert shape(r) == ["foreign_call_syntax", "repaired_json", "schema_violation"]
    assert calls(r) == [("get_current_weather", {"location_data": "Paris"})]
    r = run('```python\nlist_tickets([{"id", "123", "title", "Printer', finish_reason="length")
    assert shape(r) == ["code_fence", "foreign_call_syntax", "repaired_json", "schema_violation"]
    assert calls(r) == [("list_tickets", {"arg0": [["123", "Printer", "id", "title"]]})]
    r = run('write_file(path="notes.txt", content="hel', finish_reason="length")
    assert shape(r) == ["foreign_call_syntax", "repaired_json"]
    assert calls(r) == [("write_file", {"path": "notes.txt", "content": "hel"})]
    r = run('list_tickets([{"id", "123"}])')  # a set parses: no defect by itself
    assert "repaired_json" not in r.failure_modes
    # an unclosed parenthesis in a sentence is no cut call
    assert calls(run('I will call write_file(path="a.txt", and then stop. That is all.')) == []


def test_9_a_call_with_no_name_is_unknown_even_when_the_tools_are_not_known():
    for tools in (None, TOOLS):
        r = run(None, tools=tools, tool_calls=structured(None, '{"Garden Man": {"Age": 35}}'))
        assert shape(r) == ["unknown_tool"]
        assert r.details["unknown_tool"] == {"": None}
        assert r.details["evidence"]["unknown_tool"]["span"] == "(no name)"
    assert shape(run(None, tools=None, tool_calls=structured("anything", "{}"))) == []  # a name: not judged


def test_10_a_positional_argument_to_a_tool_with_no_properties_is_unexpected():
    r = run('list_tickets(["T-1", "T-2"])')
    assert shape(r) == ["foreign_call_syntax", "schema_violation"]
    assert [v["message"] for v in r.details["schema_violation"]] == ["unexpected argument 'arg0'"]
    for parameters in (None, {"type": "object"}):  # no properties declared at all
        bare = [{"type": "function", "function": {"name": "list_tickets", "description": "x", "parameters": parameters}}]
        r = run('list_tickets(["T-1"])', tools=bare)
        assert shape(r) == ["foreign_call_syntax", "schema_violation"], parameters
        assert [v["message"] for v in r.details["schema_violation"]] == ["arg0 is a positional argument with no property to fill"]
    assert shape(run("list_tickets()")) == ["foreign_call_syntax"]
    r = run('Action: search("cats")', tools=None)  # a tool not known to declare nothing: the argument is kept
    assert (calls(r), r.calls("lenient")[0].valid) == ([("search", {"arg0": "cats"})], True)


def test_11_arguments_no_repair_parses_are_never_a_repeated_call():
    junk = '{"location":"Berlin"}\n``` مواليد'
    earlier = [
        {"role": "user", "content": "Weather in Berlin?"},
        {"role": "assistant", "content": None, "tool_calls": structured("get_current_weather", junk)},
        {"role": "tool", "tool_call_id": "call_1", "content": "error: arguments are not valid JSON"},
    ]
    r = run(None, tool_calls=structured("get_current_weather", junk), history=earlier)
    assert "invalid_json" in r.failure_modes  # junk after a complete object is no repair
    assert not {"repaired_json", "repeated_call"} & set(r.failure_modes)
    assert r.structured_calls[0].arguments == {}
    clean = [dict(m) for m in earlier]
    clean[1] = {"role": "assistant", "content": None, "tool_calls": structured("get_current_weather", "{}")}
    r = run(None, tool_calls=structured("get_current_weather", junk), history=clean)  # {} was sent before: still no repeat
    assert "repeated_call" not in r.failure_modes
    # parsed arguments still repeat
    same = structured("get_current_weather", '{"location": "Berlin"}')
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": same}, {"role": "tool", "content": "9C"}]
    assert "repeated_call" in run(None, tool_calls=same, history=history).failure_modes


def test_12_an_absolute_path_the_user_asked_for_is_still_an_escape():
    path = "/workspaces/overleaf_dev/projects/blabla.txt"
    history = [{"role": "user", "content": f"Write 'hello' to {path}"}]
    for reply in (
        {"content": json.dumps({"name": "write_file", "arguments": {"path": path, "content": "hello"}})},
        {"content": "", "tool_calls": structured("write_file", json.dumps({"path": path, "content": "hello"}))},
    ):
        r = classify(reply, tools=TOOLS, history=history)
        assert "sandbox_escape_attempt" in r.failure_modes
        assert r.details["sandbox_escape_attempt"] == [{"tool": "write_file", "argument": "path", "path": path}]


def test_a_broken_call_object_is_judged_by_the_keys_it_shows():
    # agents-sk7376-llama3groq-curly-quotes: typographic quotes, and an "id" key before the name (the guide's example)
    data = entry("agents-sk7376-llama3groq-curly-quotes")
    r = classify(data["response"], tools=data["tools"], history=data["messages"])
    assert shape(r) == ["tool_call_tags_in_content", "invalid_json", "nonstandard_keys"]
    r = run(
        "<tool_call> {\u201cname\u201d: \u201clist_files\u201d, \u201carguments\u201d: {\u201cpath\u201d: \u201c.\u201d}} </tool_call>"
    )
    assert shape(r) == ["tool_call_tags_in_content", "invalid_json"]
