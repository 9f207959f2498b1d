"""The classifier's fast paths (issue 14) give what the full analysis gives.

Plain prose (letters, digits, spaces, newlines and ``.,;!?'%*&+-`` only) skips the content analysis: these tests
generate such texts, with the words the call finders, ReAct keywords, shell lines and vendor markers are built from,
and require the full analysis to find exactly what the fast path returns; the corpus replies that are plain prose
are checked too. The rule-3 checks' guards (a zero-width start for the file-count pattern, a digit for a value, a
key's letters for a keyed value) are held to the patterns without them, and the offered tools' memo to a fresh read.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.classifier import content, contradiction
from harness.classifier.validate import offered_tools
from harness.corpus import load_corpus
from tests.helpers import FILE_TOOLS, function_tool

_WORDS = st.sampled_from(
    ["Action", "Action Input", "Thought", "Observation", "Final Answer", "Answer", "Output", "Result", "call", "use",
     "search", "get", "ls", "cat", "echo", "python", "git", "think", "reasoning", "json", "to", "functions",
     "commentary", "analysis", "TOOL", "CALLS", "ARGS", "name", "arguments", "tool", "list", "files", "True", "None",
     "def", "import", "return", "I", "wrote", "report.txt", "café", "3", "-1", "4,250.00", "20%", "ﬁle", "日本"]
)  # fmt: skip
_SAFE = st.sampled_from(list(" \n.,;!?'%*&+-") + ["  ", "\n\n", " - ", "* ", "1. "])
_PROSE = st.lists(_WORDS | _SAFE | st.text(st.characters(categories=["L", "N"]), max_size=6), max_size=40).map("".join)
_TOOLS = [*FILE_TOOLS, *(function_tool(n, f"The {n} tool.") for n in ("search", "get", "ls", "cat", "Action", "think"))]
_OFFERED = offered_tools(_TOOLS)


def _full(text: str, tools_known: bool) -> content.ContentResult:
    return content._analyse(text, _OFFERED if tools_known else {}, tools_known=tools_known)


@settings(max_examples=400, deadline=None)
@given(_PROSE, st.booleans())
def test_plain_prose_fast_path_equals_the_full_analysis(text: str, tools_known: bool) -> None:
    offered = _OFFERED if tools_known else {}
    fast = content.analyse_content(text, offered, tools_known=tools_known)
    assert fast == _full(text, tools_known)
    if text and content._PLAIN_PROSE.search(text) is None:
        assert fast.visible == text and not fast.calls and not fast.modes


def test_fast_path_is_taken_for_plain_prose_only() -> None:
    assert content._PLAIN_PROSE.search("I wrote report.txt.") is None
    assert content._PLAIN_PROSE.search("Done, 3 files, 20% left; café & co.\nThanks!") is None
    for text in ("list_files", "read(x)", "{", "[TOOL_CALLS]", "<think>", "Action: x", "to=x", "```", "~~~", "$ ls", "a|b"):
        assert content._PLAIN_PROSE.search(text) is not None, text


def test_corpus_replies_of_plain_prose_read_as_the_full_analysis() -> None:
    checked = 0
    for entry in load_corpus(Path(__file__).parent / "corpus" / "entries"):
        reply = entry.document().get("response") or {}
        text = reply.get("content") if isinstance(reply, dict) else None
        if isinstance(text, str) and text and content._PLAIN_PROSE.search(text) is None:
            checked += 1
            for known in (True, False):
                assert content.analyse_content(text, _OFFERED if known else {}, tools_known=known) == _full(text, known)
    assert checked > 0


_COUNTS = st.lists(
    _WORDS | _SAFE | st.sampled_from(["file", "files", "Files", "There are", "there's", "in total", "total:", "only",
                                      "exactly", "twelve", "Eleven", "all", "were found", ":", "  ", "\t", "ſ", "İ", "٣"]),
    max_size=30,
).map(" ".join)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(_COUNTS | st.text(max_size=40))
def test_count_start_guard_changes_no_match(text: str) -> None:
    unguarded = re.compile(contradiction._COUNT_SOURCE, re.I | re.M)
    got = [(m.span(), m.groups()) for m in contradiction.COUNT.finditer(text)]
    assert got == [(m.span(), m.groups()) for m in unguarded.finditer(text)]


@settings(max_examples=300, deadline=None)
@given(_COUNTS | st.text(max_size=40))
def test_a_value_needs_a_digit(text: str) -> None:
    if contradiction._DIGIT.search(text) is None:
        assert contradiction._VALUE.search(text) is None


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(max_codepoint=127), max_size=30), st.sampled_from(["humidity", "temperature c", "wind", "Sky"]))
def test_an_ascii_key_matches_an_ascii_text_only_where_lowered(text: str, key: str) -> None:
    if key.lower() not in text.lower():
        assert re.search(rf"\b{re.escape(key)}\b", text, re.I) is None


def test_offered_tools_follow_a_list_edited_in_place() -> None:
    tools = [dict(t) for t in _TOOLS]
    assert set(offered_tools(tools)) == {t["function"]["name"] for t in tools}
    tools.append(function_tool("added", "A new tool."))
    assert "added" in offered_tools(tools)
    tools[0] = function_tool("replaced", "Another tool.")
    assert "replaced" in offered_tools(tools)
    tools[0]["function"]["name"] = "renamed"  # one tool edited in place: no stale name
    assert "renamed" in offered_tools(tools) and "replaced" not in offered_tools(tools)
