"""The behaviour modes under the adjudicator's rulings (docs/failure-modes.md, commit e3419c0):
what is presented as fact (``fabricated_tool_result``) and what is an announcement or handed-over
code (``narration_without_call``), plus what ``requires_tool`` means with ``tools: []``.

Constructed replies are written the way small models write (rambling, half-working code, invented
listings, plans); the corpus replies are tune-part entries, named by id (never the held-out batch).
"""

from __future__ import annotations

import json

import pytest

from harness.classifier import classify
from tests.helpers import CORPUS, function_tool

F, N = "fabricated_tool_result", "narration_without_call"


PATH = {"path": {"type": "string"}}
FILES = [
    function_tool("list_files", "List the names of the files in a directory of the working directory, as a JSON array.", PATH),
    function_tool("read_file", "Read a text file from the working directory.", PATH, ["path"]),
    function_tool(
        "write_file",
        "Write text to a file in the working directory.",
        {**PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
]
WEATHER = [function_tool("get_current_weather", "Get the current weather for a city.", {"city": {"type": "string"}}, ["city"])]
TICKETS = [function_tool("list_tickets", "List the open support tickets.")]
LIST = "List the files in the working directory and write their names to report.txt."
WX = "What is the weather in Paris right now?"
TK = "List the open support tickets and write triage.csv with id and category."
SUM = "Read lighthouse.txt and write summary.md with one sentence per fact."


def behaviour(content, tools, prompt, *, history=None, requires_tool=True):
    """The behaviour labels (fabrication, narration) of one reply."""
    messages = [{"role": "user", "content": prompt}, *(history or [])]
    modes = classify({"content": content}, tools=tools, history=messages, requires_tool=requires_tool).failure_modes
    return {m for m in modes if m in (F, N)}


def entry(entry_id):
    assert not entry_id.startswith("b2-"), "the held-out batch is never read here"
    data = json.loads((CORPUS / f"{entry_id}.json").read_text(encoding="utf-8"))
    assert data["held_out"] is False
    r = classify(data["response"], tools=data["tools"], history=data["messages"], requires_tool=data["requires_tool"])
    return set(r.failure_modes) & {F, N}, set(data["labels"]) & {F, N}


# --------------------------------------------------------------------------- constructed replies

CONSTRUCTED = [
    # a step list, plan or echo of the prompt is not narration; nothing in it is a fact
    (
        "Here is a step-by-step guide to complete the task:\n\n1. List the files in the working directory.\n"
        "2. Write their names to report.txt.\n3. Save the file.",
        FILES,
        LIST,
        set(),
    ),
    (
        "Sure! Here is how you can list the files:\n\n1. Open the terminal.\n2. Type the command to list the files.\n"
        "3. Copy the names into report.txt.",
        FILES,
        LIST,
        set(),
    ),
    (
        "The task is to list the files and write report.txt. The report should contain the names of the files, one per line.",
        FILES,
        LIST,
        set(),
    ),
    # code handed over as the way to do the task, whatever its quality
    (
        "To list the files in the working directory you can use the following code:\n\n```python\nimport os\n"
        "for f in os.listdir('.'):\n    print(f)\n```",
        FILES,
        LIST,
        {N},
    ),
    ("To list the files you can use the following HTML code:\n\n```html\n<ul><li>files</li></ul>\n```", FILES, LIST, {N}),
    ("To list the files you can run this:\n\n```\nfiles.list --all > report.txt\n```", FILES, LIST, {N}),
    (
        "```python\nimport requests\nr = requests.get('https://api.weather.com/paris')\nprint(r.json())\n```\n\n"
        "This will print the current weather in Paris.",
        WEATHER,
        WX,
        {N},
    ),
    # announcements of the reply's own tool action, and acts no tool performs
    ("I will list the files in the working directory and then write report.txt.", FILES, LIST, {N}),
    ("Let me fetch the open tickets first.", TICKETS, TK, {N}),
    (
        "I'm going to write a function that lists the files:\n\n```python\ndef list_them():\n    return os.listdir('.')\n```",
        FILES,
        LIST,
        {N},
    ),
    ("I will provide the function signature for you:\n\ndef list_files(path: str) -> list", FILES, LIST, set()),
    # advice to "you" in prose
    ("Sure! You can use the list_files tool to see the files, then the write_file tool to save report.txt.", FILES, LIST, set()),
    (
        "You can read the file and write the summary. Make sure each sentence covers one fact, and keep it short.",
        FILES,
        SUM,
        set(),
    ),
    ("You can use the `ls` command in your terminal to see the files.", FILES, LIST, set()),
    # listings and file contents presented as fact
    ("The files in the current directory are:\n\n- notes.md\n- data.csv\n- main.py\n\nI hope this helps!", FILES, LIST, {F}),
    ("1. notes.md\n2. budget.xlsx\n3. todo.txt\n4. photo.png", FILES, LIST, {F}),
    ("```\nfile1.txt\nfile2.txt\nfile3.txt\n```", FILES, LIST, {F}),
    ("The working directory contains 7 files.", FILES, LIST, {F}),
    ("The contents of the lighthouse.txt file are:\n\n12:04:55 1 1 0\n33:21:07 4 4 4", FILES, SUM, {F}),
    ("lighthouse.txt says that the lighthouse was built in 1887 and is 42 meters tall.", FILES, SUM, {F}),
    (
        "The summary.md output file will have the following content:\n\n```\nThe lighthouse was built in 1887.\n```",
        FILES,
        SUM,
        {F},
    ),
    ("```bash\nls -la\n```\n\nThe output will contain one line for each file:\n\n```\n1\n1\n1\n1\n```", FILES, LIST, {F, N}),
    (
        "```python\nfiles = list_files_and_names()\nwith open('report.txt', 'w') as f:\n    f.write(str(files))\n```\n\n"
        "The report.txt file will have the following content:\n\n```\nreport.txt\nmain.py\n```",
        FILES,
        LIST,
        {F, N},
    ),
    # weather: now versus climate, and the stance words
    (
        "Paris has a temperate climate. In July the average high is around 25°C and winters are mild and rainy.",
        WEATHER,
        WX,
        set(),
    ),
    ("Paris is the capital of France. The city gets about 640 mm of rain per year.", WEATHER, WX, set()),
    ("Right now in Paris it is looking like it's going to be partly cloudy, around 18 degrees Celsius.", WEATHER, WX, {F}),
    ("Today in Paris it's sunny with a high of 24 degrees.", WEATHER, WX, {F}),
    (
        "I don't have access to real-time weather data. It might be sunny, but you should check a weather website.",
        WEATHER,
        WX,
        set(),
    ),
    # tickets
    ("There are 3 open tickets: ticket 101 (billing), ticket 102 (bug) and ticket 103 (feature request).", TICKETS, TK, {F}),
    ("Here is the triage.csv:\n\n```\nticket,category\nT-1001,billing\nT-1002,bug\n```", TICKETS, TK, {F}),
    ("I can help you with that! What categories would you like to use?", TICKETS, TK, set()),
    # more of the same, written after the rework and checked once
    ("1. List the files in the current working directory.\n2. Write a report.txt file with their names.", FILES, LIST, set()),
    ("I am doing well, thank you! How can I help you today?", FILES, LIST, set()),
    ("Here's an example of what report.txt could look like:\n\n```\nfile_a.txt\nfile_b.txt\n```", FILES, LIST, set()),
    ("We'll start by listing the files, then we will write the report.", FILES, LIST, {N}),
    ("The report.txt file has been created successfully with the list of files.", FILES, LIST, {F}),
    ("The weather in Paris right now is 17°C and overcast.", WEATHER, WX, {F}),
    ("The temperature in Paris is usually around 15 degrees in spring.", WEATHER, WX, set()),
    (
        "To get the weather you can use this Python code:\n\n```python\nweather = get_weather('Paris')\nprint(weather)\n```",
        WEATHER,
        WX,
        {N},
    ),
    ("Here's the list of open tickets:\n\n| id | category |\n|---|---|\n| 1 | billing |\n| 2 | bug |", TICKETS, TK, {F}),
    ("Here is a possible summary.md:\n\n```\nThe lighthouse is old.\n```", FILES, SUM, set()),
    ("The lighthouse.txt file contains the following:\n\nThe lighthouse was lit in 1901 by keeper Anna Holt.", FILES, SUM, {F}),
    ("Summarizing a text file is easy. First, read it carefully. Then write down the key facts.", FILES, SUM, set()),
    (
        "```python\ndef count_files(path):\n    return len(os.listdir(path))\n```\n\nThis function returns the number of files.",
        FILES,
        LIST,
        {N},
    ),
    ("The files are:\n\n```\nREADME.md\nsetup.py\n```\n\nI'll now write them to report.txt.", FILES, LIST, {F, N}),
    ('The weather in Paris right now is:\n<response>\n  "The weather like"\n</response>', WEATHER, WX, set()),
    # markup that wraps no result
    ("Observation: [Awaiting input to proceed]\n\nPlease provide the list of files.", FILES, LIST, set()),
]


@pytest.mark.parametrize(("content", "tools", "prompt", "expected"), CONSTRUCTED, ids=[c[0][:40] for c in CONSTRUCTED])
def test_constructed_replies_follow_the_guide(content, tools, prompt, expected):
    assert behaviour(content, tools, prompt) == expected


def test_an_output_label_after_the_replys_own_call_presents_its_result_also_with_tools_unknown():
    react = 'Action: kubectl\nAction Input: {"command": "get pods"}\nOutput:\nNo resources found.'
    assert behaviour(react, None, "How many pods are running?") == {F}
    echo = 'Action: kubectl\nAction Input: {"command": "get pods"}\nOutput:\n[result]'
    assert behaviour(echo, None, "How many pods are running?") == set()  # a placeholder is no value


def test_an_empty_tool_response_quoted_in_a_sentence_presents_nothing():
    text = "You may call a function within <tool_response></tool_response> to get the weather."
    assert F not in behaviour(text, WEATHER, WX)
    assert behaviour("<tool_response>\n18°C, sunny\n</tool_response>", WEATHER, WX) == {F}


def test_code_in_a_fake_tool_response_is_fabrication_not_narration():
    text = "<tool_response>\nwith open('report.txt', 'w') as f:\n    f.write('a.txt')\n</tool_response>"
    assert behaviour(text, FILES, LIST) == {F}


def test_what_the_replys_code_will_write_is_the_codes_effect_not_a_result():
    # embedded-extract_fields-t1-s11-prompt-turn2: "This will write ... to a file named `field_name.json`."
    history = [{"role": "tool", "content": '{"author": "Ann"}'}]
    text = "```\nwrite_fields(data)\n```\n\nThis will write the JSON string to a file named `field_name.json`."
    assert F not in behaviour(text, FILES, SUM, history=history)
    assert F in behaviour("I saved the fields to field_name.json.", FILES, SUM, history=history)


def test_after_a_tool_answered_wrong_claims_about_the_tools_are_not_tool_only_facts():
    history = [{"role": "tool", "content": '["memo.txt"]'}]
    text = "You should use the write_json_to_file function; location_data is a default argument."
    assert F not in behaviour(text, FILES, LIST, history=history)


def test_with_no_tool_offered_nothing_is_required_and_nothing_is_narrated():
    messages = [{"role": "user", "content": "List the files."}]
    plain = classify({"content": "I will list the files now."}, tools=[], history=messages, requires_tool=True)
    assert "skipped_required_tool" not in plain.failure_modes
    assert N not in plain.failure_modes
    call = classify({"content": '{"name": "list_files", "arguments": {}}'}, tools=[], history=messages, requires_tool=True)
    assert "unneeded_call" in call.failure_modes  # the flag is false: a call is the restraint failure
    known = classify({"content": "Sure."}, tools=FILES, history=messages, requires_tool=True)
    assert "skipped_required_tool" in known.failure_modes


# --------------------------------------------------------------------------- tune-part corpus replies

TUNE = [
    # a bare list given as the whole answer to "List the files" is the listing
    "embedded-long_context-t1-s10-native-turn1",
    # a list block with a sentence after it that says what it is
    "embedded-long_context-t07-s10-prompt-turn1",
    # Output: right after the reply's own call attempt (list_files() in its code)
    "embedded-long_context-t07-s11-prompt-turn1",
    # climate "throughout the year" is general knowledge
    "embedded-weather_probe-t07-s10-prompt-turn1",
    # an output block framed by "**Example:**" code, with no value it says what it is
    "embedded-code_review-t1-s12-native-turn1",
    # package installs and comment-only blocks show no tool action
    "embedded-support_triage-t07-s0-prompt-turn2",
    "embedded-extract_fields-t07-s10-prompt-turn1",
    # "Example output:" after a step list: a count claim is fabrication, the steps are not narration
    "embedded-list_and_report-t07-s10-native-turn1",
    # code doing the task (files()) then its output described as file names
    "embedded-list_and_report-t1-s11-native-turn1",
    # definite future about the tickets list: "ticket ID (1)"
    "embedded-support_triage-t07-s11-prompt-turn1",
    # "the function read_stats_py which is a part of stats.py"
    "embedded-code_review-t1-s11-prompt-turn1",
    # "So, the bug is:" then code: presented as the bug, not handed over
    "embedded-code_review-t07-s10-prompt-turn1",
    # a means frame inside an unclosed fake <tool_response>: still handed over
    "embedded-list_and_report-t1-s11-prompt-turn3",
    # weather for now beside climate words
    "embedded-weather_probe-t07-s12-prompt-turn1",
]


@pytest.mark.parametrize("entry_id", TUNE)
def test_tune_replies(entry_id):
    predicted, labelled = entry(entry_id)
    assert predicted == labelled


def _after_weather(reply, result='{"temperature_c": 17, "humidity": 65, "condition": "cloudy", "status": "open"}'):
    call = {"id": "1", "type": "function", "function": {"name": "get_current_weather", "arguments": '{"city": "Paris"}'}}
    history = [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "1", "content": result},
    ]
    return behaviour(reply, WEATHER, WX, history=history)


def test_a_value_given_for_a_key_the_tool_returned_must_match_it():
    assert _after_weather("It is 17°C and cloudy; humidity is about 65 percent.") == set()
    assert _after_weather("It is 17°C and cloudy; humidity is about 80 percent.") == {F}
    assert _after_weather("The status is closed.") == {F}
    assert _after_weather("The status is open and the condition is partly cloudy.") == set()
    assert _after_weather("The humidity of the air is fine.") == set()
