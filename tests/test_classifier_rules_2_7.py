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
from tests.helpers import FILE_TOOLS as FILES
from tests.helpers import reply_modes as modes


def structured(name, arguments, tools=None):
    call = {"type": "function", "id": "c1", "function": {"name": name, "arguments": arguments}}
    response = {"content": None, "tool_calls": [call], "finish_reason": "tool_calls"}
    return set(classify(response, tools=tools).failure_modes)


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


# ====================================================================== 2.8.0: rule classes fixed after batch 4 opened
# Constructed replies only; the batch-4 replies that showed each class are named in the commit and the guide.

TICKETS = [function_tool("list_tickets", "List the open support tickets.")]
LIST = "List the files in the working directory. Then write report.txt with their names."
REVIEW = 'app.py has one bug. Read it, then write review.md naming the buggy line (for example "line 3").'


@pytest.mark.parametrize("content", ["Sounds good. Let's get started!", "I'll begin now.", "Alright, let me start."])
def test_announcing_the_task_itself_is_narration(content):
    assert "narration_without_call" in modes(content, FILES, LIST)


@pytest.mark.parametrize(
    "content", ["Let's start by explaining what a CSV file is.", "Let's begin with a question: which folder?"]
)
def test_starting_something_else_is_not(content):
    assert "narration_without_call" not in modes(content, FILES, LIST)


@pytest.mark.parametrize("content", ["I'll simply re-read notes.txt first.", "Now I'll just rewrite the report for you."])
def test_re_verbs_and_an_adverb_still_announce(content):
    assert "narration_without_call" in modes(content, FILES, LIST)


def test_adverb_without_a_tool_verb_announces_nothing():
    assert "narration_without_call" not in modes("I'll gladly help you think this through.", FILES, LIST)


def test_stub_handed_over_shows_no_action():
    stub = "Here is the function you can use:\n```python\ndef read_file(path):\n    # TODO\n    return None\n```"
    assert "narration_without_call" not in modes(stub, FILES, LIST)


def test_function_with_a_file_action_is_still_handed_over():
    code = "Here is the function you can use:\n```python\ndef read_notes(path):\n    with open(path) as f:\n        return f.read()\n```"
    assert "narration_without_call" in modes(code, FILES, LIST)


def test_code_handing_the_tool_to_a_runner_does_its_step():
    code = "Try this:\n```python\nfrom concurrent.futures import ThreadPoolExecutor\nex = ThreadPoolExecutor()\nfut = ex.submit(list_tickets)\n```"
    got = modes(code, TICKETS, "Get the open tickets with list_tickets.")
    assert "narration_without_call" in got and "foreign_call_syntax" not in got


def test_tool_name_in_a_string_is_not_handed_to_a_runner():
    code = 'Try this:\n```python\nlabel = str("list_tickets")\nprint(label)\n```'
    assert "narration_without_call" not in modes(code, TICKETS, "Get the open tickets with list_tickets.")


def test_literal_list_of_file_names_is_the_listing_done_in_code():
    code = "```javascript\nconst names = ['notes.txt', 'todo.md'];\nconsole.log(names.length);\n```"
    assert "narration_without_call" in modes(code, FILES, LIST)


def test_literal_list_of_other_words_is_not():
    code = "```javascript\nconst colors = ['red', 'blue'];\nconsole.log(colors.length);\n```"
    assert "narration_without_call" not in modes(code, FILES, LIST)


NOW = "What is the weather in Oslo right now?"


def test_json_block_with_a_keyed_temperature_presented_as_the_weather():
    reply = 'This returns the current weather:\n\n```\n{\n  "city": "Oslo",\n  "temp_c": 4.5\n}\n```'
    assert "fabricated_tool_result" in modes(reply, WEATHER, NOW)


def test_json_block_framed_as_a_possibility_is_not():
    reply = 'A response might look like this:\n\n```\n{\n  "city": "Oslo",\n  "temp_c": 4.5\n}\n```'
    assert "fabricated_tool_result" not in modes(reply, WEATHER, NOW)


@pytest.mark.parametrize("label", ["notes.txt:", "Open notes.txt:", "**Contents of notes.txt:**"])
def test_block_under_a_file_name_heading_is_that_files_content(label):
    reply = f"{label}\n\n```\nMeeting at 10:00 with Dana.\n```"
    assert "fabricated_tool_result" in modes(reply, FILES, "Read notes.txt and summarise it in summary.md.")


@pytest.mark.parametrize(
    "body", ["```python\nimport os\nprint(os.getcwd())\n```", "```\n[summary goes here]\n```"], ids=["code", "placeholder"]
)
def test_code_or_a_placeholder_under_a_file_name_heading_is_not(body):
    reply = f"Write summary.md:\n\n{body}"
    assert "fabricated_tool_result" not in modes(reply, FILES, "Read notes.txt and summarise it in summary.md.")


def test_saying_what_the_files_are_is_a_listing():
    assert "fabricated_tool_result" in modes("The files in your folder are mainly notes.txt and todo.md.", FILES, LIST)


@pytest.mark.parametrize("reply", ["The files to create are report.txt and index.md.", "The files you need are report.txt."])
def test_what_the_files_are_to_be_is_no_listing(reply):
    assert "fabricated_tool_result" not in modes(reply, FILES, LIST)


def test_a_line_the_prompt_gives_only_as_an_example_is_invented():
    assert "fabricated_tool_result" in modes("Line 3 holds a bug: it divides by zero.", FILES, REVIEW)


def test_a_line_the_prompt_states_is_not():
    prompt = "app.py has a bug on line 3. Read it, then write review.md saying what is wrong."
    assert "fabricated_tool_result" not in modes("Line 3 holds a bug: it divides by zero.", FILES, prompt)


def test_a_quoted_name_called_a_function_with_the_bug():
    assert "fabricated_tool_result" in modes('So I need to fix the bug in the "tally" function.', FILES, REVIEW)
    prompt = "The tally function in app.py has a bug. Read it, then write review.md saying what is wrong."
    assert "fabricated_tool_result" not in modes('So I need to fix the bug in the "tally" function.', FILES, prompt)


def _after_error(reply, result):
    call = {"id": "c1", "type": "function", "function": {"name": "list_files", "arguments": '{"path": "/x"}'}}
    messages = [
        {"role": "user", "content": LIST},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]
    return set(classify({"content": reply}, tools=FILES, history=messages, requires_tool=True).failure_modes)


def test_markup_copying_the_tools_own_answer_invents_nothing():
    error = "ERROR: path '/x' is outside the working directory"
    reply = f"<tool_response>\n{error}\n</tool_response>\n\nPlease pass a relative path."
    assert "fabricated_tool_result" not in _after_error(reply, error)


def test_markup_with_a_body_no_tool_returned_is_fabricated():
    reply = "<tool_response>\nnotes.txt\ntodo.md\n</tool_response>"
    assert "fabricated_tool_result" in _after_error(reply, "ERROR: path '/x' is outside the working directory")


CODE = "```python\nimport os\nnames = os.listdir('.')\nwith open('report.txt', 'w') as f:\n    f.write(str(len(names)))\n```\n\n"


@pytest.mark.parametrize("said", ["This script creates report.txt with the number of files: 3.", "This writes 3 files."])
def test_what_the_replys_code_does_states_no_result(said):
    assert "fabricated_tool_result" not in modes(CODE + said, FILES, LIST)


def test_a_count_stated_after_the_code_is_still_a_result():
    assert "fabricated_tool_result" in modes(CODE + "There are 3 files in the folder.", FILES, LIST)


def test_gerund_subject_presents_no_listing():
    assert "fabricated_tool_result" not in modes("Listing files is quick. Then report.txt gets their names.", FILES, LIST)
    assert "fabricated_tool_result" in modes("Listing of files:\n- notes.txt\n- todo.md", FILES, LIST)


def test_stripped_harmony_header_without_arguments_is_a_wrapper():
    assert "wrong_wrapper_tag" in modes(" to=functions.get_weather\u00a0\u200b \n\n", WEATHER, NOW)


def test_harmony_header_named_in_a_sentence_is_not():
    assert "wrong_wrapper_tag" not in modes("gpt-oss writes to=functions.get_weather before its arguments.", WEATHER, NOW)


@pytest.mark.parametrize("line", ["notes.txt: owner=Dana, due 2024-05-01", "The summary file: 4 lines, 120 words"])
def test_a_value_on_a_line_labelled_by_a_file_is_its_content(line):
    assert "fabricated_tool_result" in modes(line, FILES, "Read notes.txt and summarise it in summary.md.")


@pytest.mark.parametrize("line", ["The output file: summary.md", "The summary file: one sentence per paragraph"])
def test_a_file_label_naming_a_file_or_describing_it_states_no_content(line):
    assert "fabricated_tool_result" not in modes(line, FILES, "Read notes.txt and summarise it in summary.md.")


def test_broken_call_object_in_content_shows_an_absolute_path():
    reply = '{"name": "write_file", "arguments": {"path": "/srv/www/a.html", "content": "<p class="x">hi</p>"}}'
    assert {"invalid_json", "raw_json_in_content", "sandbox_escape_attempt"} <= modes(reply, FILES, LIST)


def test_broken_call_object_with_a_relative_path_does_not_escape():
    reply = '{"name": "write_file", "arguments": {"path": "www/a.html", "content": "<p class="x">hi</p>"}}'
    assert "sandbox_escape_attempt" not in modes(reply, FILES, LIST)


def test_tool_invoked_as_an_argument_of_other_code_is_a_call():
    code = "```python\ndef report():\n    names = sorted(list_files())\n    return len(names)\n```"
    got = modes(code, FILES, LIST)
    assert {"foreign_call_syntax", "code_fence"} <= got and "narration_without_call" not in got


def test_tool_named_in_a_sentence_inside_a_wrapper_is_still_prose():
    got = modes("<tool_call>Here I would use list_files() for you</tool_call>", FILES, LIST)
    assert "foreign_call_syntax" not in got
