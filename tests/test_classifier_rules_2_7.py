"""The rule classes fixed after batch 3 was opened (docs/failure-modes.md, "Heuristics and their rationale").

Each rule is tested on constructed replies written for it (not the corpus reply that showed the gap), both ways
where the rule has a boundary; the tune-part corpus replies that showed each gap are checked at the end, by id.
The held-out batch (``b4-*``) is never read here.
"""

from __future__ import annotations

import json

import pytest

from harness.classifier import classify
from tests.helpers import CORPUS, function_tool

PATH = {"path": {"type": "string"}}
FILES = [
    function_tool("list_files", "List the names of the files in a directory of the working directory.", PATH),
    function_tool("read_file", "Read a text file from the working directory.", PATH, ["path"]),
    function_tool("write_file", "Write text to a file.", {**PATH, "content": {"type": "string"}}, ["path", "content"]),
]


def structured(name, arguments, tools=None):
    call = {"type": "function", "id": "c1", "function": {"name": name, "arguments": arguments}}
    response = {"content": None, "tool_calls": [call], "finish_reason": "tool_calls"}
    return set(classify(response, tools=tools).failure_modes)


def modes(content, tools=None, prompt="Do the task.", *, requires_tool=True):
    messages = [{"role": "user", "content": prompt}]
    return set(classify({"content": content}, tools=tools, history=messages, requires_tool=requires_tool).failure_modes)


# --- unknown_tool: a structured name holding chat-template special tokens, tools known or not


@pytest.mark.parametrize("name", ["assistant<|channel|>commentary", "to=functions.read_file<|constrain|>json"])
def test_special_token_name_is_unknown_even_with_tools_unknown(name):
    assert structured(name, '{"path": "a.txt"}') == {"unknown_tool"}
    assert structured(name, '{"path": "a.txt"}', FILES) == {"unknown_tool"}


def test_plain_name_with_tools_unknown_is_not_judged():
    assert structured("read_file", '{"path": "a.txt"}') == set()
    assert structured("exec|run", '{"path": "a.txt"}') == set()  # a bar alone is no special token


# --- a flat tool-definition echo with a garbled typed "parameters" is no call


def test_garbled_flat_definition_is_no_call():
    echo = json.dumps(
        {
            "type": "string",
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {"type": "json", "required": ["path"]},
        }
    )
    got = modes(echo, FILES)
    assert not got & {"raw_json_in_content", "schema_violation", "nonstandard_keys", "repaired_json"}
    assert "skipped_required_tool" in got


def test_call_with_described_arguments_is_still_a_call():
    call = json.dumps({"name": "write_file", "parameters": {"path": "a.txt", "content": "x"}})
    assert "raw_json_in_content" in modes(call, FILES)


# --- sandbox_escape_attempt reads the complete pairs of arguments that no repair parsed


def test_broken_arguments_show_an_absolute_path():
    got = structured("read_file", '{"path": "/etc/passwd", "limit": \\n5\\n}', FILES)
    assert got == {"invalid_json", "sandbox_escape_attempt"}


def test_broken_arguments_with_relative_path_do_not_escape():
    assert structured("read_file", '{"path": "docs/a.txt", "limit": \\n5\\n}', FILES) == {"invalid_json"}
    assert structured("read_file", '{"note": "/etc/passwd", "limit": \\n5\\n}', FILES) == {"invalid_json"}  # not a path key


TUNE = [
    "b3-ollama11704-gptoss120b-channel-in-tool-name",  # harmony header as the call's name
    "b3-embedded-extract_fields-t07-s30-prompt-turn1",  # garbled flat definition inside a fake result
    "b3-openhandssdk2488-qwen35flash-backslash-n-args",  # absolute path in unparsed arguments
    "b3-ohmypi92-gemini3pro-call-record-xml",  # <call_record tool=...><parameter name=...>
    "b3-embedded-list_and_report-t07-s30-prompt-turn1",  # a <tools> echo in a fence is no code
    "b3-embedded-long_context-t07-s31-prompt-turn1",  # a JSON block is data
    "b3-embedded-extract_fields-t07-s30-native-turn1",  # "Writing to file." as the whole reply
    "b3-embedded-weather_probe-t1-s30-native-turn1",  # "It's a bit hot outside now."
    "b3-embedded-list_and_report-t1-s30-native-turn1",  # "Creating a report.txt file using a for loop:" then code
    "b3-embedded-long_context-t07-s31-native-turn1",  # a fenced JSON array of names as the whole answer
    "b3-easyllmcli57-bracket-toolcall-read-file",  # [tool_call: read_file for absolute_path '...']
    "b3-adk81-mistralsmall31-asks-city-for-time",  # asks for the city the request does not give
    # b3-embedded-list_and_report-t1-s30-prompt-turn1 lost its tag labels (`<tool_call>` named in prose); its
    # fabricated_tool_result (a "# Listing files" comment) remains
]


@pytest.mark.parametrize("entry_id", TUNE)
def test_tune_replies(entry_id):
    assert not entry_id.startswith("b4-"), "the held-out batch is never read here"
    data = json.loads((CORPUS / f"{entry_id}.json").read_text(encoding="utf-8"))
    assert data["held_out"] is False
    result = classify(data["response"], tools=data["tools"], history=data["messages"], requires_tool=data["requires_tool"])
    assert set(result.failure_modes) == set(data["labels"])


# --- an element that names the tool by an attribute and holds <parameter> children is the call (foreign syntax only)


def test_named_element_with_parameters_is_a_foreign_call():
    content = 'I will read it.\n<tool_use tool="read_file">\n<parameter name="path">a.txt</parameter>\n</tool_use>'
    result = classify({"content": content}, tools=FILES, history=[{"role": "user", "content": "Read a.txt"}], requires_tool=True)
    assert set(result.failure_modes) == {"foreign_call_syntax", "mixed_prose"}
    assert [(c.name, c.arguments) for c in result.recovered_calls] == [("read_file", {"path": "a.txt"})]


def test_named_element_without_parameters_is_no_call():
    content = 'See <section name="read_file">the reader</section> for details.'
    assert "foreign_call_syntax" not in modes(content, FILES)


# --- a JSON block (data, or an echo of definitions) in a reply with no call is not code handed over


@pytest.mark.parametrize(
    "content",
    [
        'You can use the following to list the files:\n\n```json\n{"files": ["a.txt", "b.txt"], "count": 2}\n```',
        'Here is how to write report.txt:\n\n```\n<tools>\n{"type": "function", "function": {"name": "write_file"}}\n</tools>\n```',
        'Use this code to list the files:\n\n```\n[\n  "a.txt",\n  "b.txt"\n]\n```',
    ],
)
def test_json_block_is_not_handed_over_code(content):
    assert "narration_without_call" not in modes(content, FILES, "List the files.")


def test_code_block_with_file_action_is_still_handed_over():
    content = "You can use the following code to list the files:\n\n```python\nimport os\nprint(os.listdir('.'))\n```"
    assert "narration_without_call" in modes(content, FILES, "List the files.")


# --- a wrapper or result tag named alone in an inline code span is a mention, not markup


def test_tag_mentioned_in_inline_code_is_no_markup():
    content = "Put the call between `<tool_call>` and `</tool_call>`; the answer comes back in a `<tool_response>` block."
    got = modes(content, FILES, requires_tool=False)
    assert not got & {"tool_call_tags_in_content", "wrong_wrapper_tag", "fabricated_tool_result"}


def test_tagged_call_in_inline_code_still_counts():
    content = 'Calling it: `<tool_call>{"name": "read_file", "arguments": {"path": "a.txt"}}</tool_call>`'
    assert "tool_call_tags_in_content" in modes(content, FILES)


def test_bare_tag_markup_still_counts():
    assert "fabricated_tool_result" in modes("<tool_response>\nreport.txt: 3 files\n</tool_response>", FILES)


# --- narration_without_call: a bare progressive standing as its own sentence announces the reply's own act


@pytest.mark.parametrize("content", ["Reading the file now.", "Sure.\n\nCreating report.txt...", "Listing the files!"])
def test_bare_progressive_sentence_is_narration(content):
    assert "narration_without_call" in modes(content, FILES, "List the files and write report.txt.")


@pytest.mark.parametrize(
    "content",
    [
        "Listing the files is the first step of this task.",  # a gerund used as a noun
        "I can help you with:\n\nReading files.\nWriting reports.",  # items of a list under a colon
        "Creating report.txt:\n\nreport.txt holds the names.",  # a heading framing a block
    ],
)
def test_gerund_noun_heading_or_list_item_is_not_narration(content):
    assert "narration_without_call" not in modes(content, FILES, "List the files and write report.txt.")


# --- weather for now stated with a contraction ("It's ... warm") is a tool-only fact

WEATHER = [function_tool("get_weather", "Get the current weather for a city.", {"city": {"type": "string"}}, ["city"])]


@pytest.mark.parametrize("content", ["It's really warm in Oslo.", "It’s quite chilly out there."])
def test_weather_sentence_with_contraction_is_fabricated(content):
    assert "fabricated_tool_result" in modes(content, WEATHER, "What is the weather in Oslo?")


def test_contraction_without_weather_word_is_not():
    assert "fabricated_tool_result" not in modes("It's a good question.", WEATHER, "What is the weather in Oslo?")


# --- a gerund heading of a tool act frames the code after it as the means; a listing after it is data


def test_gerund_heading_then_code_is_handed_over():
    content = "Writing the names to report.txt with a loop:\n\n```\nfor name in names:\n    out.write(name)\n```"
    assert "narration_without_call" in modes(content, FILES, "List the files and write report.txt.")


def test_gerund_heading_then_listing_is_not_code():
    content = "Listing files:\n\n```\na.txt\nb.txt\n```"
    assert "narration_without_call" not in modes(content, FILES, "List the files and write report.txt.")


# --- a JSON array of file names given as the whole answer to "List the files" is a bare listing


def test_json_array_of_names_as_whole_answer_is_a_listing():
    content = '```\n[\n  "notes.md",\n  "data.csv",\n  "main.py"\n]\n```'
    assert "fabricated_tool_result" in modes(content, FILES, "List the files in the working directory.")


def test_json_array_of_names_when_not_asked_to_list_is_not():
    content = '```\n[\n  "notes.md",\n  "data.csv"\n]\n```'
    assert "fabricated_tool_result" not in modes(content, FILES, "Summarize notes.md.", requires_tool=False)


# --- a bracketed log-line call ([tool_call: name for key 'value']) is the call itself: foreign_call_syntax only


def test_bracket_log_line_call_is_foreign_syntax():
    content = 'Let me look at the notes first.\n\n[tool_call: read_file for path "notes/todo.md"]'
    result = classify({"content": content}, tools=FILES, history=[{"role": "user", "content": "Read it."}], requires_tool=True)
    assert set(result.failure_modes) == {"foreign_call_syntax", "mixed_prose"}
    assert [(c.name, c.arguments) for c in result.recovered_calls] == [("read_file", {"path": "notes/todo.md"})]


def test_bracket_without_arguments_is_no_call():
    assert "foreign_call_syntax" not in modes("[tool_call: read_file for the notes]", FILES)


# --- asking for a required argument the request does not give is the correct turn, not a skipped tool

CLOCK = [function_tool("get_local_time", "Get the local time in a city.", {"city": {"type": "string"}}, ["city"])]


def test_asking_for_a_missing_required_argument_is_not_skipped():
    assert modes("Sure - which city do you mean?", CLOCK, "What time is it?") == set()


@pytest.mark.parametrize(
    "content,prompt",
    [
        ("Sure - which city do you mean?", "What time is it in Lisbon?"),  # the request names one
        ("Which format do you want?", "What time is it?"),  # not a required argument
        ("It is noon.", "What time is it?"),  # no question
    ],
)
def test_other_replies_without_call_still_skip(content, prompt):
    assert "skipped_required_tool" in modes(content, CLOCK, prompt)
