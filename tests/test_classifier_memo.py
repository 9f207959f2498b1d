"""The classifier's memos (issue 14: the loop hands the whole history again on every turn) change no result.

History messages are read once into a bounded memo keyed by their strings, what the tool results' text holds
(values, skies, scalars, listing lengths) is memoized by that text, and the offered tools' text by the list's
marshal bytes. These tests classify generated histories with
the memos empty and again with them warm, and read histories with and without the message memo, and require the
same result; a message changed after it was read must be read afresh.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections import OrderedDict, UserDict

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.classifier import classify, contradiction, heuristics, validate
from harness.classifier.content import analyse_content
from harness.classifier.heuristics import history_content_calls
from harness.classifier.types import MAX_HISTORY_TEXT, jsonable
from harness.classifier.validate import offered_tools
from tests.helpers import FILE_TOOLS

_NAMES = st.sampled_from(["a.txt", "notes.md", "report.txt", "café.txt", "data.csv", "x"])
_ARGS = st.dictionaries(st.sampled_from(["path", "content", "extra"]), _NAMES | st.integers(0, 5), max_size=2)
_ARGUMENTS = st.one_of(
    _ARGS.map(json.dumps),  # the loop's shape: JSON text
    _ARGS,  # an object
    st.sampled_from(['{"path": "a', "not json", "", '"{\\"path\\": \\"x\\"}"', "[1, 2]", '{"path": "../up"}']),
    st.none(),
)
_CALL = st.one_of(
    st.fixed_dictionaries(
        {
            "id": st.sampled_from(["c1", "c2"]),
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": st.sampled_from(["list_files", "read_file", "write_file", "nope"]), "arguments": _ARGUMENTS}
            ),
        }
    ),  # fmt: skip
    st.fixed_dictionaries({"name": st.sampled_from(["list_files", "read_file"]), "parameters": _ARGS}),  # bare shape
    st.just("not a call"),
)
_TEXT = st.one_of(
    st.lists(_NAMES, max_size=4).map(json.dumps),  # a listing a tool returned
    st.builds(lambda n, names: f"There are {n} files: {', '.join(names)}.", st.integers(0, 4), st.lists(_NAMES, max_size=3)),
    st.sampled_from(
        [
            '{"temperature_c": 17, "condition": "sunny", "humidity": 65}',
            "caf\\u00e9.txt",
            "wrote 9 bytes",
            "```\ndef f():\n    pass\n```",
            '<tool_response>["a.txt"]</tool_response>',
            '{"name": "list_files", "arguments": {"path": "."}}',
            "It is 20°C and rainy.",
            "",
        ]
    ),  # fmt: skip
    st.text(max_size=30),
)
_MESSAGE = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "tool", "function", "developer"]), "content": _TEXT}),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.none() | _TEXT},
        optional={"tool_calls": st.none() | st.lists(_CALL, max_size=3)},
    ),
    st.fixed_dictionaries({"role": st.none() | st.integers(), "content": st.none() | st.lists(st.just({"text": "a.txt"}))}),
    st.just("not a message"),
)
_HISTORY = st.lists(_MESSAGE, max_size=8)
_RESPONSE = st.one_of(
    st.fixed_dictionaries({"content": _TEXT}),
    st.fixed_dictionaries({"content": st.none() | st.just(""), "tool_calls": st.lists(_CALL, min_size=1, max_size=2)}),
)
_OFFERED = offered_tools(FILE_TOOLS)


def _forget() -> None:
    """Empty every memo the history and the tool results fill."""
    heuristics._READS.clear()  # and what it holds
    heuristics._escapes_sandbox.cache_clear()
    heuristics._TOOLS_TEXT.clear()
    for memo in (contradiction._result_values, contradiction._skies, contradiction._result_pairs, contradiction._listing_length):
        memo.memo.cache_clear()


def _history(past: heuristics.History) -> dict:
    """A history's reading, its unparsed repeat keys (fresh on every reading, equal to no other key) as a count."""
    fields = dataclasses.asdict(past)
    fields["earlier"] = sorted(k for k in past.earlier if not k.startswith("\x00unparsed:"))
    fields["unparsed"] = sum(k.startswith("\x00unparsed:") for k in past.earlier)
    return fields


def _whole(result) -> str:
    return json.dumps(result.to_dict(), ensure_ascii=False, default=repr)


@given(_HISTORY)
@settings(max_examples=300, deadline=None)
def test_a_history_read_from_the_memo_is_the_fresh_reading(history):
    fresh = _history(heuristics.scan_history(history, _OFFERED, memo=False))
    _forget()
    assert _history(heuristics.scan_history(history, _OFFERED)) == fresh  # the memo empty: every message read and kept
    assert _history(heuristics.scan_history(history, _OFFERED)) == fresh  # every message from the memo


@given(_HISTORY, _RESPONSE, st.sampled_from([None, True, False]), st.booleans())
@settings(max_examples=300, deadline=None)
def test_classify_gives_the_same_result_with_the_memos_empty_and_warm(history, response, requires_tool, tools_known):
    tools = FILE_TOOLS if tools_known else None
    _forget()
    cold = _whole(classify(response, tools=tools, history=history, requires_tool=requires_tool))
    warm = _whole(classify(response, tools=tools, history=history, requires_tool=requires_tool))
    copied = _whole(classify(response, tools=tools, history=json.loads(json.dumps(history)), requires_tool=requires_tool))
    assert cold == warm == copied


def test_a_message_changed_after_it_was_read_is_read_afresh():
    listing = {"role": "tool", "content": json.dumps(["a.txt", "b.txt"])}
    history = [{"role": "user", "content": "List the files."}, listing]
    reply = {"content": "There are 2 files: a.txt and b.txt."}
    assert classify(reply, tools=FILE_TOOLS, history=history).failure_modes == []
    listing["content"] = json.dumps(["a.txt", "b.txt", "c.txt"])  # the same dict, now holding three names
    labels = classify(reply, tools=FILE_TOOLS, history=history)
    assert labels.failure_modes == ["fabricated_tool_result"]
    assert "the listing held 3" in json.dumps(labels.details["fabricated_tool_result"])


def test_the_history_memo_stays_bounded():
    _forget()
    for start in range(0, heuristics._MAX_READS + 50, 50):
        heuristics.scan_history([{"role": "user", "content": f"message {k}"} for k in range(start, start + 50)], _OFFERED)
        assert len(heuristics._READS) <= heuristics._MAX_READS
    big = "x" * (heuristics._MAX_READ_CHARS // 3)
    heuristics.scan_history([{"role": "tool", "content": big + str(k)} for k in range(4)], _OFFERED)
    assert heuristics._READS.size_held <= heuristics._MAX_READ_CHARS


def test_tools_changed_in_place_after_a_call_are_read_afresh():
    tools = copy.deepcopy(FILE_TOOLS)
    history = [
        {"role": "user", "content": "Summarize the project."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "notes.txt"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "The project is fine."},
    ]
    reply = {"content": "I read notes.txt and budget_2031.xlsx: the project is fine."}
    assert classify(reply, tools=tools, history=history).failure_modes == ["fabricated_tool_result"]
    tools[1]["function"]["description"] = "Read a text file such as budget_2031.xlsx."  # the same list, edited
    fresh = classify(reply, tools=copy.deepcopy(tools), history=history)
    assert fresh.failure_modes == []
    assert _whole(classify(reply, tools=tools, history=history)) == _whole(fresh)  # before: the old text, a fabrication


def _fresh_tools_text(tools) -> str:
    """What ``tools_text`` computes without its memo (its definition: the list through ``jsonable`` as JSON text)."""
    try:
        return json.dumps(jsonable(tools), ensure_ascii=False)[:MAX_HISTORY_TEXT]
    except (TypeError, ValueError):
        return ""


_LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=True), st.text(max_size=6))
_KEY = st.one_of(st.text(max_size=4), st.integers(0, 2), st.booleans(), st.none())
_TOOLS_VALUE = st.recursive(
    _LEAF,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(_KEY, inner, max_size=4),
        st.dictionaries(st.text(max_size=4), inner, max_size=4).map(OrderedDict),
    ),
    max_leaves=20,
)


def _twin(value):
    """A value equal to ``value`` under ``==`` that reads differently: ``True`` as ``1``, ``1`` as ``1.0``, a list as a
    tuple, a dict as an OrderedDict (each a different JSON text or a different type)."""
    if value is True:
        return 1
    if type(value) is int:
        return float(value)
    if type(value) is list:
        return tuple(_twin(v) for v in value)
    if type(value) is tuple:
        return [_twin(v) for v in value]
    if type(value) is dict:
        return OrderedDict((k, _twin(v)) for k, v in value.items())
    return value


@given(_TOOLS_VALUE)
@settings(max_examples=400, deadline=None)
def test_the_tools_text_from_the_memo_is_the_fresh_text(value):
    _forget()
    twin = _twin(value)
    assert heuristics.tools_text(twin) == _fresh_tools_text(twin)  # the twin read first: its text in the memo
    assert heuristics.tools_text(value) == _fresh_tools_text(value)  # equal under ==, yet its own text
    assert heuristics.tools_text(copy.deepcopy(value)) == _fresh_tools_text(value)  # a copy: a hit, the same text
    assert heuristics.tools_text(twin) == _fresh_tools_text(twin)


def test_a_tools_list_edited_in_place_to_an_equal_value_of_another_type_is_read_afresh():
    tools = copy.deepcopy(FILE_TOOLS)
    tools[0]["function"]["parameters"]["properties"]["path"]["default"] = True
    assert '"default": true' in heuristics.tools_text(tools)
    tools[0]["function"]["parameters"]["properties"]["path"]["default"] = 1  # True == 1: an equality check misses it
    assert '"default": 1' in heuristics.tools_text(tools)
    tools[0]["function"]["parameters"]["properties"]["path"]["default"] = 1.0
    assert '"default": 1.0' in heuristics.tools_text(tools)


def test_tools_of_types_marshal_does_not_write_are_read_directly_and_not_kept():
    _forget()
    for tools in (UserDict({"name": "a"}), [OrderedDict(name="a")], [float("nan"), math.inf], [{"x": b"bytes"}]):
        assert heuristics.tools_text(tools) == _fresh_tools_text(tools)
    assert len(heuristics._TOOLS_TEXT) == 2  # the NaN list and the bytes are plain marshal types; the others no key
    looped: list = []
    looped.append(looped)
    assert heuristics.tools_text(looped) == _fresh_tools_text(looped)  # a cycle: jsonable's depth cap, memo or not


def test_the_tools_memo_stays_bounded():
    _forget()
    for k in range(heuristics._TOOLS_TEXT_ENTRIES * 3):
        heuristics.tools_text([{"name": f"tool_{k}"}])
        assert len(heuristics._TOOLS_TEXT) <= heuristics._TOOLS_TEXT_ENTRIES
    for k in range(12):  # lists of about 1 MB each: the bytes and characters held stay under the cap
        heuristics.tools_text([{"description": f"{k} " + "y" * (heuristics._TOOLS_KEY_BYTES - 100)}])
        assert heuristics._TOOLS_TEXT.size_held <= heuristics._MAX_TOOLS_TEXT_HELD
        assert heuristics._TOOLS_TEXT.size_held == sum(len(key) + len(text) for key, text in heuristics._TOOLS_TEXT.items())
    _forget()
    huge = [{"description": "x" * heuristics._TOOLS_KEY_BYTES}]
    assert heuristics.tools_text(huge) == _fresh_tools_text(huge)
    assert heuristics._TOOLS_TEXT == {}  # a key over the cap is not kept


def _enum_tools() -> list:
    unit = {"type": "string", "enum": ["celsius", "fahrenheit"]}
    schema = {"type": "object", "properties": {"unit": unit}, "required": ["unit"]}
    return [{"type": "function", "function": {"name": "set_unit", "description": "Set the unit.", "parameters": schema}}]


_KELVIN = {
    "content": None,
    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "set_unit", "arguments": '{"unit": "kelvin"}'}}],
}


def test_a_schema_edited_in_place_after_a_call_is_judged_as_it_now_reads():
    validate._VALIDATORS.clear()
    tools = _enum_tools()
    assert classify(_KELVIN, tools=tools).failure_modes == ["schema_violation"]
    tools[0]["function"]["parameters"]["properties"]["unit"]["enum"].append("kelvin")  # the same list, edited
    assert classify(_KELVIN, tools=tools).failure_modes == []  # before: the enum memo's old members, a violation
    assert classify(_KELVIN, tools=copy.deepcopy(tools)).failure_modes == []
    assert classify(_KELVIN, tools=_enum_tools()).failure_modes == ["schema_violation"]  # the first schema's text again


def _typed_tools(kind: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": kind}}, "required": ["n"]}}}]  # fmt: skip


def test_a_history_call_in_text_is_read_with_the_schemas_offered_now():
    """Found in review: the memo of calls read from earlier assistant text was keyed by the tool names only, so a
    value written as text (``5``) kept the type of the first tool set seen (5) under another with the same names
    ("5"), and ``repeated_call`` was judged against the wrong call."""
    written = "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>"
    history = [{"role": "user", "content": "Call f."}, {"role": "assistant", "content": written},
               {"role": "user", "content": "Again."}]  # fmt: skip
    reply = {
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"n": "5"}'}}],
    }
    seen = {}
    for kind in ("integer", "string", "integer"):
        tools = _typed_tools(kind)
        fresh = [c.canonical() for c in analyse_content(written, offered_tools(tools)).calls]
        assert history_content_calls(written, offered_tools(tools)) == fresh
        seen.setdefault(kind, set()).add("repeated_call" in classify(reply, tools=tools, history=history).failure_modes)
    assert seen == {"integer": {False}, "string": {True}}


def _multiply_tools(required, order=("a", "b")) -> list[dict]:
    properties = {name: {"type": "integer"} for name in order}
    schema = {"type": "object", "properties": properties, "required": required}
    return [{"type": "function", "function": {"name": "multiply", "parameters": schema}}]


_STRINGS = {
    "content": None,
    "tool_calls": [{"id": "c", "type": "function", "function": {"name": "multiply", "arguments": '{"b": "2", "a": "100"}'}}],
}


def test_an_equal_schema_of_other_types_or_key_order_is_judged_as_a_fresh_process_judges_it():
    """Found by the red team: validators were cached by the schema's sorted JSON text, so a ``required`` tuple (a
    schema jsonschema refuses: no validation) and the equal list shared one, and whichever came first decided the
    other's verdict (a call of two strings for integers passed); a schema with its properties in another order got
    the first one's error order."""
    variants = {
        "list": _multiply_tools(["a", "b"]),
        "tuple": _multiply_tools(("a", "b")),
        "reversed": _multiply_tools(["b", "a"], order=("b", "a")),
    }
    fresh = {}
    for name, tools in variants.items():
        validate._VALIDATORS.clear()
        fresh[name] = _whole(classify(_STRINGS, tools=tools))
    assert "schema_violation" in json.loads(fresh["list"])["failure_modes"]  # the variants do differ
    assert len(set(fresh.values())) == 3
    for first in variants:
        for then in variants:
            validate._VALIDATORS.clear()
            classify(_STRINGS, tools=copy.deepcopy(variants[first]))
            assert _whole(classify(_STRINGS, tools=copy.deepcopy(variants[then]))) == fresh[then], (first, then)


def test_the_path_memos_keep_no_long_text():
    """Found in review: the path memos were bounded by entries only, so 1,024 replies with a 1 MB path held 1 GB."""
    _forget()
    heuristics._path_key.cache_clear()
    long_path = "../" + "a" * (1 << 20)
    reply = {"content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "read_file", "arguments": json.dumps({"path": long_path, "x" * 5000 + "_path": "../up"})}}]}  # fmt: skip
    modes = classify(reply, tools=FILE_TOOLS, history=[{"role": "user", "content": "Read it."}]).failure_modes
    assert "sandbox_escape_attempt" in modes  # judged as ever
    assert heuristics._escapes_sandbox.cache_info().currsize == 1  # "../up" only
    assert heuristics._path_key.cache_info().currsize == 1  # "path" only
