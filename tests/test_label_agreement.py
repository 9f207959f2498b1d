"""The recorded label agreement holds: a change that breaks real labels fails here.

The figures are the ones the README's "Failure modes" section quotes (measured with
``python benchmarks/label_agreement.py``). Raise them when the classifier improves; a corpus
entry added or relabelled changes them too, so record the new figures in the same commit.
"""

from __future__ import annotations

import re

import pytest

from harness.corpus import agreement, load_corpus
from tests.helpers import CORPUS, REPO

ENTRIES = load_corpus(CORPUS)

#: exact-set agreement recorded per part: (replies labelled exactly as the corpus, replies)
EXACT = {"all": (767, 802), "tune": (700, 721), "held-out": (67, 81)}

#: per-mode (precision, recall) floors on the whole corpus, for modes with at least 5 positives
MODE_FLOORS = {
    "raw_json_in_content": (1.00, 1.00),
    "code_fence": (1.00, 1.00),
    "mixed_prose": (1.00, 1.00),
    "tool_call_tags_in_content": (1.00, 1.00),
    "wrong_wrapper_tag": (1.00, 0.98),
    "foreign_call_syntax": (1.00, 0.98),
    "multiple_calls": (1.00, 1.00),
    "invalid_json": (1.00, 1.00),
    "pseudo_code_in_arguments": (1.00, 0.92),
    "repaired_json": (1.00, 1.00),
    "stringified_arguments": (1.00, 1.00),
    "nonstandard_keys": (1.00, 0.98),
    "unknown_tool": (1.00, 1.00),
    "schema_violation": (0.96, 0.96),
    "repeated_call": (1.00, 1.00),
    "fabricated_tool_result": (0.93, 0.93),
    "narration_without_call": (0.95, 0.93),
    "empty_response": (1.00, 1.00),
    "truncated_by_length": (1.00, 1.00),
    "reasoning_leak": (1.00, 1.00),
    "sandbox_escape_attempt": (1.00, 1.00),
    "skipped_required_tool": (0.99, 1.00),
    "unneeded_call": (1.00, 1.00),
    "chat_markup_leak": (1.00, 1.00),
}

PARTS = {
    "all": ENTRIES,
    "tune": [e for e in ENTRIES if not e.held_out],
    "held-out": [e for e in ENTRIES if e.held_out],
}


@pytest.mark.parametrize("part", list(EXACT))
def test_exact_set_agreement_does_not_fall(part):
    result = agreement(PARTS[part])
    exact, replies = EXACT[part]
    assert result.replies == replies, "the corpus changed: re-measure and record the new figures here and in the README"
    assert result.exact >= exact, [(e.id, sorted(c), sorted(p)) for e, c, p in result.disagreements]


def test_per_mode_precision_and_recall_do_not_fall():
    scores = {m.mode: m for m in agreement(ENTRIES).modes}
    assert {mode for mode, m in scores.items() if m.support >= 5} == set(MODE_FLOORS)
    for mode, (precision, recall) in MODE_FLOORS.items():
        assert scores[mode].precision >= precision, (mode, scores[mode])
        assert scores[mode].recall >= recall, (mode, scores[mode])


def test_the_readme_quotes_the_recorded_figures():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for part, (exact, replies) in EXACT.items():
        assert re.search(rf"\| {part} \| {replies} \| {exact} \| {exact / replies:.3f} \|", readme), part
