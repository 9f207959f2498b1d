"""Classifier 2.11.0's four behaviour rules from batches 5 and 6: each gains on the batch or batches whose replies
suggested it and loses on no tuning batch (``benchmarks/batch_agreement.py``), short of the leave-one-batch-out bar
(gains on two batches other than the one that suggested it); they were merged after batch 7, measured blind, gained
one reply with them (README). Constructed replies, both ways, for the general rule each states
(docs/failure-modes.md, ``fabricated_tool_result`` and ``narration_without_call``), and the real recordings that
raised them.
"""

from __future__ import annotations

import pytest

from harness.classifier import classify_document
from harness.corpus import load_corpus
from tests.helpers import CORPUS, function_tool
from tests.helpers import FILE_TOOLS as FILES
from tests.helpers import reply_modes as modes

TICKETS = [function_tool("list_tickets", "List the open support tickets.", {}), *FILES]
LIST_TASK = "List the files in the current working directory. Then write report.txt with how many there are."
FAB = "fabricated_tool_result"
NARR = "narration_without_call"


# --- a step of a plan names no existing file and is no entry of a listing (the steps' verbs are the announcement's)


def test_a_file_named_in_a_step_is_no_invented_file():
    reply = "1. List the files in the current working directory.\n2. Write a list of the files to a CSV file named report.csv."
    assert FAB not in modes(reply, FILES, LIST_TASK)


def test_a_file_named_in_a_listing_item_is_still_invented():
    reply = "1. notes.md\n2. budget.csv\n3. todo.txt"
    assert FAB in modes(reply, FILES, LIST_TASK)


def test_steps_with_a_purpose_are_no_listing_of_tickets():
    reply = "1. To fetch the tickets:\n\nYou can call the function.\n\n2. To write triage.csv:\n\nUse the write tool."
    assert FAB not in modes(reply, TICKETS, "Get the open support tickets with list_tickets.")


# --- a block that opens the reply with nothing framing it answers the prompt: its values are presented as the tool's


def test_an_unframed_opening_block_of_file_names_is_an_invented_listing():
    assert FAB in modes("```\nnotes.md\nbudget.csv\n```\n\nThose are the files.", FILES, LIST_TASK)


def test_an_unframed_opening_block_of_numbered_values_is_invented():
    assert FAB in modes("```\n1. 2003\n2. 2017\n```\n\nDone.", FILES, "Read a.txt and b.txt and give each file's year.")


def test_an_opening_block_with_a_bare_number_or_headings_and_assignments_says_nothing():
    assert FAB not in modes("```\n10\n```", FILES, LIST_TASK)
    assert FAB not in modes("```\n<report>\n# Current working directory\ncwd = /home/user/project\n```", FILES, LIST_TASK)


def test_an_opening_block_of_code_is_no_fact():
    assert FAB not in modes("```\nimport os\nprint(os.listdir('.'))\n```", FILES, LIST_TASK)


# --- a sentence ending in a stop states something: it presents no block as an output


CODE = "```javascript\nfunction countFiles() {\n  let files = [];\n  return files.length;\n}\n```"


def test_code_after_a_sentence_naming_an_output_is_handed_over():
    reply = "To list the files, write a function and use the output of the function to create a new report.\n\n" + CODE
    assert NARR in modes(reply, FILES, LIST_TASK)


def test_code_after_a_frame_presenting_an_output_is_no_means():
    assert NARR not in modes("The output of the function is:\n\n" + CODE, FILES, LIST_TASK)


# --- file I/O in any language is a tool's action


def test_code_reading_a_file_in_javascript_is_handed_over():
    reply = "You can use the following to get started:\n\n```javascript\nconst text = reader.readFileSync(name);\n```"
    assert NARR in modes(reply, FILES, "Read memo.txt, then write fields.json.")


def test_code_doing_no_file_io_under_the_same_frame_is_not():
    reply = "You can use the following to get started:\n\n```javascript\nconst total = values.reduce((a, b) => a + b, 0);\n```"
    assert NARR not in modes(reply, FILES, "Read memo.txt, then write fields.json.")


# the recordings each rule was written from: 2.10.0 labelled all seven differently from the annotators
RAISED_BY = [
    "b5-embedded-long_context-t07-s50-prompt-turn1",  # an unframed opening block of invented values
    "b5-embedded-long_context-t1-s50-prompt-turn1",  # the same, paths and counts
    "b5-embedded-read_and_summarize-t07-s50-prompt-turn1",  # JavaScript readFileSync handed over
    "b6-embedded-read_and_summarize-t07-s61-native-turn1",  # ```1. 2003 2. 2017``` opening the reply
    "b6-embedded-list_and_report-t07-s61-prompt-turn1",  # a plan step naming report.csv, no listing entry
    "b6-embedded-extract_fields-t07-s60-native-turn1",  # steps naming memo.txt
    "b6-embedded-long_context-t1-s61-prompt-turn1",  # a sentence ending in a stop, then JavaScript counting files
]


@pytest.mark.parametrize("entry_id", RAISED_BY)
def test_the_recordings_that_raised_the_rules_get_their_labels(entry_id):
    [entry] = [e for e in load_corpus(CORPUS) if e.id == entry_id]
    assert not entry.held_out
    assert set(classify_document(entry.document())["failure_modes"]) == set(entry.labels)
