"""Structured calls past the classifier's cap are answered as refused, and the cap is recorded.

Red-team finding (issue 11): a reply with more than 128 structured tool calls lost every call
after the 128th silently: no tool message answered it, no label or detail said so.
"""

from __future__ import annotations

from harness.classifier import classify
from harness.classifier.validate import MAX_STRUCTURED_CALLS
from harness.ledger import Ledger
from harness.loop import REFUSED_CALL
from harness.rescore import rescore
from tests.helpers import run_replay, structured_writes, text_line

TOTAL = MAX_STRUCTURED_CALLS + 3


def _many_writes(count: int) -> dict:
    return structured_writes({f"f{i:03d}.txt": str(i) for i in range(count)})


def test_the_classifier_records_the_cap_as_a_detail_of_multiple_calls():
    result = classify(_many_writes(TOTAL), tools=None)
    assert "multiple_calls" in result.failure_modes
    assert result.details["multiple_calls"] == {"structured_calls": TOTAL, "acted_on": MAX_STRUCTURED_CALLS, "refused": 3}
    assert len(result.structured_calls) == MAX_STRUCTURED_CALLS


def test_a_reply_at_the_cap_has_no_cap_detail():
    result = classify(_many_writes(MAX_STRUCTURED_CALLS), tools=None)
    assert "multiple_calls" in result.failure_modes and "multiple_calls" not in result.details


def test_each_call_past_the_cap_is_answered_as_refused_and_never_run(tmp_path, scenario):
    summary, facts = run_replay(tmp_path, scenario, [_many_writes(TOTAL), text_line("done")], tool_mode="native")
    assert facts["verify"].ok and facts["run_ends"] == 1
    first = facts["turn_rows"][0].record
    executed = first.executed_calls
    assert [c["id"] for c in executed] == [f"c{i}" for i in range(TOTAL)]  # every call has its answer
    assert [c["output"] for c in executed[MAX_STRUCTURED_CALLS:]] == [f"ERROR: {REFUSED_CALL}"] * 3
    assert all(c["error"] for c in executed[MAX_STRUCTURED_CALLS:])
    assert not any(c["error"] for c in executed[:MAX_STRUCTURED_CALLS])
    assert first.details["multiple_calls"]["refused"] == 3
    written = sorted(p.name for p in summary.sandbox.iterdir() if p.name.startswith("f"))
    assert written == [f"f{i:03d}.txt" for i in range(MAX_STRUCTURED_CALLS)]  # the refused calls wrote nothing
    with Ledger(tmp_path / "ledger.sqlite") as ledger:  # the recorded messages rebuild exactly, refusals included
        assert rescore(ledger, force=True).history_mismatch == 0
